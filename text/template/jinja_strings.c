// text/template/jinja_strings.c - the string side of the builtins: the string
// filters (trim, replace, title, indent, ...), the methods of str (strip,
// split, startswith, format, ...), Python's `%` formatting and HTML
// escaping, as jinja2 3.x and Python define them (chat templates rely on
// their exact output). Case mapping is ASCII-only; everything else follows
// Python.
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/template/jinja_builtins_int.h"

static bool in_set(unsigned char c, jval chars) {
    return chars.t == JT_STR ? memchr(chars.u.s.s, c, chars.u.s.n) != NULL : jis_space(c);
}

// Python's str.strip/lstrip/rstrip; chars NONE/UNDEF = whitespace. ASCII
// chars only in `chars` (multi-byte strip sets are not needed by templates).
static jval strip(jval s, jval chars, bool left, bool right) {
    const char *p = s.u.s.s;
    size_t n = s.u.s.n;
    if (left) while (n && in_set((unsigned char)*p, chars)) p++, n--;
    if (right) while (n && in_set((unsigned char)p[n - 1], chars)) n--;
    return jv_str(p, n);
}

jval jstr_map_case(jrender *r, jval s, int mode) {
    char *o = ja_alloc(&r->ar, s.u.s.n + 1);
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)s.u.s.s[i];
        o[i] = (char)(mode == 1 || (mode == 2 && i == 0) ? toupper(c) : tolower(c));
    }
    return jv_str(o, s.u.s.n);
}

// Python's str.title(): a cased letter after an uncased char is upper.
static jval py_title(jrender *r, jval s) {
    char *o = ja_alloc(&r->ar, s.u.s.n + 1);
    bool prev = false;
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)s.u.s.s[i];
        bool cased = isalpha(c);
        o[i] = (char)(cased ? (prev ? tolower(c) : toupper(c)) : c);
        prev = cased;
    }
    return jv_str(o, s.u.s.n);
}

// jinja2's title filter: words start after [-\s({[<].
static jval jinja_title(jrender *r, jval s) {
    char *o = ja_alloc(&r->ar, s.u.s.n + 1);
    bool start = true;
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)s.u.s.s[i];
        bool sep = c == '-' || jis_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
        o[i] = (char)(sep ? c : start ? toupper(c) : tolower(c));
        start = sep;
    }
    return jv_str(o, s.u.s.n);
}

static jval replace(jrender *r, jval s, jval old, jval nw, int64_t count) {
    jbuf b = {0};
    const char *p = s.u.s.s, *end = s.u.s.s + s.u.s.n;
    int64_t done = 0;
    if (!old.u.s.n) {  // Python inserts `new` around every character
        jval chars = jiter_list(r, s);
        for (size_t i = 0; i <= chars.u.l->n; i++) {
            if (count < 0 || done < count) {
                jb_add(r, &b, nw.u.s.s, nw.u.s.n);
                done++;
            }
            if (i < chars.u.l->n) jb_add(r, &b, chars.u.l->v[i].u.s.s, chars.u.l->v[i].u.s.n);
        }
        return b.p ? jb_to_str(r, &b) : jv_str("", 0);
    }
    while (p < end && (count < 0 || done < count)) {
        const char *q = memmem(p, (size_t)(end - p), old.u.s.s, old.u.s.n);
        if (!q) break;
        jb_add(r, &b, p, (size_t)(q - p));
        jb_add(r, &b, nw.u.s.s, nw.u.s.n);
        p = q + old.u.s.n;
        done++;
    }
    if (!done) return s;
    jb_add(r, &b, p, (size_t)(end - p));
    return b.p ? jb_to_str(r, &b) : jv_str("", 0);
}

// Python's str.split(sep=None, maxsplit=-1) (rsplit when `right`).
static jval split(jrender *r, jval s, jval sep, int64_t maxsplit, bool right) {
    jval out = jv_list(r, 0);
    size_t cap = 0;
    const char *p = s.u.s.s;
    size_t n = s.u.s.n;
    if (sep.t != JT_STR) {
        if (right) {  // rsplit on whitespace: split from the end
            jval tmp = jv_list(r, 0);
            size_t tc = 0, e = n;
            int64_t k = 0;
            while (e > 0) {
                while (e > 0 && jis_space((unsigned char)p[e - 1])) e--;
                if (!e) break;
                size_t b = e;
                if (maxsplit >= 0 && k >= maxsplit) {
                    jl_push(r, &tmp, &tc, strip(jv_str(p, e), jv_none(), true, false));
                    break;
                }
                while (b > 0 && !jis_space((unsigned char)p[b - 1])) b--;
                jl_push(r, &tmp, &tc, jv_str(p + b, e - b));
                k++;
                e = b;
            }
            for (size_t i = tmp.u.l->n; i-- > 0;) jl_push(r, &out, &cap, tmp.u.l->v[i]);
            return out;
        }
        size_t i = 0;
        int64_t k = 0;
        while (i < n) {
            while (i < n && jis_space((unsigned char)p[i])) i++;
            if (i >= n) break;
            if (maxsplit >= 0 && k >= maxsplit) {
                jl_push(r, &out, &cap, strip(jv_str(p + i, n - i), jv_none(), false, true));
                break;
            }
            size_t b = i;
            while (i < n && !jis_space((unsigned char)p[i])) i++;
            jl_push(r, &out, &cap, jv_str(p + b, i - b));
            k++;
        }
        return out;
    }
    if (!sep.u.s.n) jr_fail(r, "empty separator");
    if (right) {
        jval tmp = jv_list(r, 0);
        size_t tc = 0, e = n;
        int64_t k = 0;
        for (;;) {
            const char *hit = NULL;
            if (maxsplit < 0 || k < maxsplit)
                for (size_t b = e; b >= sep.u.s.n; b--)
                    if (!memcmp(p + b - sep.u.s.n, sep.u.s.s, sep.u.s.n)) {
                        hit = p + b - sep.u.s.n;
                        break;
                    }
            if (!hit) {
                jl_push(r, &tmp, &tc, jv_str(p, e));
                break;
            }
            size_t at = (size_t)(hit - p);
            jl_push(r, &tmp, &tc, jv_str(hit + sep.u.s.n, e - at - sep.u.s.n));
            e = at;
            k++;
        }
        for (size_t i = tmp.u.l->n; i-- > 0;) jl_push(r, &out, &cap, tmp.u.l->v[i]);
        return out;
    }
    int64_t k = 0;
    for (;;) {
        const char *hit = maxsplit < 0 || k < maxsplit ? memmem(p, n, sep.u.s.s, sep.u.s.n) : NULL;
        if (!hit) {
            jl_push(r, &out, &cap, jv_str(p, n));
            return out;
        }
        jl_push(r, &out, &cap, jv_str(p, (size_t)(hit - p)));
        n -= (size_t)(hit - p) + sep.u.s.n;
        p = hit + sep.u.s.n;
        k++;
    }
}

static bool starts_with(jval s, jval pre, bool end) {
    if (pre.t != JT_STR) return false;
    if (pre.u.s.n > s.u.s.n) return false;
    const char *at = end ? s.u.s.s + s.u.s.n - pre.u.s.n : s.u.s.s;
    return !memcmp(at, pre.u.s.s, pre.u.s.n);
}

// --- Python % formatting -------------------------------------------------------------------

jval jformat_percent(jrender *r, jval fmt, jval args) {
    int nspec = 0;
    for (size_t i = 0; i + 1 < fmt.u.s.n; i++)
        if (fmt.u.s.s[i] == '%') {
            if (fmt.u.s.s[i + 1] != '%') nspec++;
            else i++;
        }
    // A tuple spreads over the conversions; anything else is one argument.
    const jval *av = &args;
    int na = 1;
    (void)nspec;
    if (args.t == JT_LIST && args.u.l->tuple) {
        av = args.u.l->v;
        na = (int)args.u.l->n;
    }
    jbuf b = {0};
    int ai = 0;
    const char *s = fmt.u.s.s, *e = s + fmt.u.s.n;
    while (s < e) {
        if (*s != '%') {
            const char *q = memchr(s, '%', (size_t)(e - s));
            if (!q) q = e;
            jb_add(r, &b, s, (size_t)(q - s));
            s = q;
            continue;
        }
        s++;
        if (s < e && *s == '%') {
            jb_addc(r, &b, '%');
            s++;
            continue;
        }
        char spec[32] = "%";
        size_t k = 1;
        while (s < e && strchr("-+ #0123456789.", *s) && k < sizeof spec - 4) spec[k++] = *s++;
        if (s >= e) jr_fail(r, "incomplete format");
        char conv = *s++;
        if (ai >= na) jr_fail(r, "not enough arguments for format string");
        jval v = av[ai++];
        char out[128];
        if (conv == 's' || conv == 'r') {
            jbuf t = {0};
            if (conv == 's') jv_str_into(r, &t, v);
            else jv_repr_into(r, &t, v);
            spec[k++] = 's';
            spec[k] = 0;
            if (k == 2) jb_add(r, &b, t.p ? t.p : "", t.len);
            else {
                int m = snprintf(NULL, 0, spec, t.p ? t.p : "");
                char *tmp = ja_alloc(&r->ar, (size_t)m + 1);
                snprintf(tmp, (size_t)m + 1, spec, t.p ? t.p : "");
                jb_add(r, &b, tmp, (size_t)m);
            }
        } else if (strchr("dixXo", conv)) {
            if (!jv_is_num(v)) jr_fail(r, "%%%c format: a number is required, not %s", conv, jv_type_name(v));
            long long x = v.t == JT_FLOAT ? (long long)v.u.f : v.t == JT_BOOL ? v.u.b : (long long)v.u.i;
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            snprintf(out, sizeof out, spec, x);
            jb_addz(r, &b, out);
        } else if (strchr("feEgG", conv)) {
            if (!jv_is_num(v)) jr_fail(r, "%%%c format: a real number is required, not %s", conv, jv_type_name(v));
            spec[k++] = conv;
            spec[k] = 0;
            snprintf(out, sizeof out, spec, jv_num(v));
            jb_addz(r, &b, out);
        } else {
            jr_fail(r, "unsupported format character '%c'", conv);
        }
    }
    if (ai < na) jr_fail(r, "not all arguments converted during string formatting");
    return b.p ? jb_to_str(r, &b) : jv_str("", 0);
}

jval jhtml_escape(jrender *r, jval s) {
    jbuf b = {0};
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.s[i];
        if (c == '&') jb_addz(r, &b, "&amp;");
        else if (c == '<') jb_addz(r, &b, "&lt;");
        else if (c == '>') jb_addz(r, &b, "&gt;");
        else if (c == '"') jb_addz(r, &b, "&#34;");
        else if (c == '\'') jb_addz(r, &b, "&#39;");
        else jb_addc(r, &b, c);
    }
    jval out = b.p ? jb_to_str(r, &b) : jv_str("", 0);
    out.markup = true;
    return out;
}

// --- string filters ------------------------------------------------------------------------

static jval indent(jrender *r, jval s, const jargv *a) {
    jval w = jarg(a, 0, "width", jv_int(4));
    jval ind;
    if (w.t == JT_STR) ind = w;
    else {
        int64_t n = w.t == JT_INT ? w.u.i : 4;
        if (n < 0) n = 0;
        if (n > 4096) jr_fail(r, "indent width too large");
        char *sp = ja_alloc(&r->ar, (size_t)n + 1);
        memset(sp, ' ', (size_t)n);
        ind = jv_str(sp, (size_t)n);
    }
    bool first = jarg_bool(a, 1, "first", false), blank = jarg_bool(a, 2, "blank", false);
    // s + "\n", then splitlines(): lines end at \n, \r\n, \r, \v, \f, \x1c-\x1e.
    jval lines = jv_list(r, 0);
    size_t cap = 0;
    const char *p = s.u.s.s, *e = p + s.u.s.n;
    const char *ls = p;
    for (const char *q = p; q <= e; q++) {
        bool at_end = q == e;
        unsigned char c = at_end ? '\n' : (unsigned char)*q;
        if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
            jl_push(r, &lines, &cap, jv_str(ls, (size_t)(q - ls)));
            if (!at_end && c == '\r' && q + 1 < e && q[1] == '\n') q++;
            ls = q + 1;
        }
    }
    jbuf b = {0};
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jval ln = lines.u.l->v[i];
        if (i) {
            jb_addc(r, &b, '\n');
            if (blank || ln.u.s.n) jb_add(r, &b, ind.u.s.s, ind.u.s.n);
        }
        jb_add(r, &b, ln.u.s.s, ln.u.s.n);
    }
    jval body = b.p ? jb_to_str(r, &b) : jv_str("", 0);
    if (!first) return body;
    jbuf f = {0};
    jb_add(r, &f, ind.u.s.s, ind.u.s.n);
    jb_add(r, &f, body.u.s.s, body.u.s.n);
    return jb_to_str(r, &f);
}

// The string filters; false when `name` is none of them (jfilter, which
// calls this first, then tries the others).
bool jfilter_str(jrender *r, const char *name, jval v, const jval *args, int nargs, const char **kw,
                 const jval *kwv, int nkw, jval *out) {
    jargv a = {r, name, args, nargs, kw, kwv, nkw};
#define F(s) (!strcmp(name, s))
#define RET(x) do { *out = (x); return true; } while (0)
    if (F("safe")) {
        jval s = jv_to_string(r, v);
        s.markup = true;
        RET(s);
    }
    if (F("string") && v.t == JT_STR) RET(v);
    if (F("string")) RET(jv_to_string(r, v));
    if (F("trim")) {
        jval chars = jarg(&a, 0, "chars", jv_none());
        RET(strip(jv_to_string(r, v), chars.t == JT_STR ? chars : jv_none(), true, true));
    }
    if (F("upper")) RET(jstr_map_case(r, jv_to_string(r, v), 1));
    if (F("lower")) RET(jstr_map_case(r, jv_to_string(r, v), 0));
    if (F("capitalize")) RET(jstr_map_case(r, jv_to_string(r, v), 2));
    if (F("title")) RET(jinja_title(r, jv_to_string(r, v)));
    if (F("replace")) {
        jval s = jv_to_string(r, v);
        RET(replace(r, s, jarg_str(&a, 0, "old"), jarg_str(&a, 1, "new"), jarg_int(&a, 2, "count", -1)));
    }
    if (F("escape") || F("e")) RET(v.t == JT_STR && v.markup ? v : jhtml_escape(r, jv_to_string(r, v)));
    if (F("indent")) RET(indent(r, jv_to_string(r, v), &a));
    if (F("wordcount")) {
        jval words = split(r, jv_to_string(r, v), jv_none(), -1, false);
        RET(jv_int((int64_t)words.u.l->n));
    }
#undef RET
#undef F
    return false;
}

// --- str methods ---------------------------------------------------------------------------

// The methods of str (`s.strip()`, `s.split(',')`, ...); false when
// `name` is none of them.
bool jmethod_str(jrender *r, jval self, const char *name, const jval *args, int nargs,
                 const char **kw, const jval *kwv, int nkw, jval *out) {
    jargv a = {r, name, args, nargs, kw, kwv, nkw};
#define M(s) (!strcmp(name, s))
    if (M("strip") || M("lstrip") || M("rstrip")) {
        jval chars = jarg(&a, 0, "chars", jv_none());
        *out = strip(self, chars, !M("rstrip"), !M("lstrip"));
        return true;
    }
    if (M("upper") || M("lower") || M("capitalize")) {
        *out = jstr_map_case(r, self, M("lower") ? 0 : M("upper") ? 1 : 2);
        return true;
    }
    if (M("title")) { *out = py_title(r, self); return true; }
    if (M("startswith") || M("endswith")) {
        jval pre = jarg(&a, 0, "prefix", jv_undef(NULL));
        bool end = M("endswith"), hit = false;
        if (pre.t == JT_LIST) {
            for (size_t i = 0; i < pre.u.l->n && !hit; i++) hit = starts_with(self, pre.u.l->v[i], end);
        } else if (pre.t == JT_STR) {
            hit = starts_with(self, pre, end);
        } else {
            jr_fail(r, "%s: the argument must be a string or a tuple of strings", name);
        }
        *out = jv_bool(hit);
        return true;
    }
    if (M("split") || M("rsplit")) {
        jval sep = jarg(&a, 0, "sep", jv_none());
        if (sep.t != JT_NONE && sep.t != JT_STR) jr_fail(r, "%s: sep must be a string or None", name);
        *out = split(r, self, sep, jarg_int(&a, 1, "maxsplit", -1), M("rsplit"));
        return true;
    }
    if (M("replace")) {
        *out = replace(r, self, jarg_str(&a, 0, "old"), jarg_str(&a, 1, "new"), jarg_int(&a, 2, "count", -1));
        return true;
    }
    if (M("find") || M("rfind") || M("count") || M("index")) {
        jval sub = jarg_str(&a, 0, "sub");
        int64_t hits = 0, first = -1, last = -1;
        const char *p = self.u.s.s, *e = p + self.u.s.n;
        if (!sub.u.s.n) {
            hits = (int64_t)utf8_len(self.u.s.s, self.u.s.n) + 1;
            first = 0;
            last = (int64_t)utf8_len(self.u.s.s, self.u.s.n);
        }
        while (sub.u.s.n && p <= e) {
            const char *q = memmem(p, (size_t)(e - p), sub.u.s.s, sub.u.s.n);
            if (!q) break;
            int64_t cp = (int64_t)utf8_len(self.u.s.s, (size_t)(q - self.u.s.s));
            if (first < 0) first = cp;
            last = cp;
            hits++;
            p = q + sub.u.s.n;
        }
        if (M("index") && first < 0) jr_fail(r, "substring not found");
        *out = jv_int(M("count") ? hits : M("rfind") ? last : first);
        return true;
    }
    if (M("join")) {
        jval items = jiter_list(r, jarg(&a, 0, "iterable", jv_undef(NULL)));
        jbuf b = {0};
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (i) jb_add(r, &b, self.u.s.s, self.u.s.n);
            if (items.u.l->v[i].t != JT_STR) jr_fail(r, "join: sequence item %zu: expected str", i);
            jb_add(r, &b, items.u.l->v[i].u.s.s, items.u.l->v[i].u.s.n);
        }
        *out = b.p ? jb_to_str(r, &b) : jv_str("", 0);
        return true;
    }
    if (M("splitlines")) {
        jval l = jv_list(r, 0);
        size_t cap = 0;
        const char *p = self.u.s.s, *e = p + self.u.s.n, *ls = p;
        for (const char *q = p; q < e; q++)
            if (*q == '\n' || *q == '\r') {
                jl_push(r, &l, &cap, jv_str(ls, (size_t)(q - ls)));
                if (*q == '\r' && q + 1 < e && q[1] == '\n') q++;
                ls = q + 1;
            }
        if (ls < e) jl_push(r, &l, &cap, jv_str(ls, (size_t)(e - ls)));
        *out = l;
        return true;
    }
    if (M("format")) {  // positional {} and {N} only
        jbuf b = {0};
        int next = 0;
        const char *p = self.u.s.s, *e = p + self.u.s.n;
        while (p < e) {
            if (*p == '{' && p + 1 < e && p[1] == '{') { jb_addc(r, &b, '{'); p += 2; continue; }
            if (*p == '}' && p + 1 < e && p[1] == '}') { jb_addc(r, &b, '}'); p += 2; continue; }
            if (*p != '{') { jb_addc(r, &b, *p++); continue; }
            const char *q = memchr(p, '}', (size_t)(e - p));
            if (!q) jr_fail(r, "format: single '{' encountered");
            int idx = q == p + 1 ? next++ : atoi(p + 1);
            if (idx < 0 || idx >= nargs) jr_fail(r, "format: replacement index %d out of range", idx);
            jv_str_into(r, &b, args[idx]);
            p = q + 1;
        }
        *out = b.p ? jb_to_str(r, &b) : jv_str("", 0);
        return true;
    }
    if (M("isdigit") || M("isalpha") || M("isspace") || M("isalnum")) {
        bool ok = self.u.s.n > 0;
        for (size_t i = 0; i < self.u.s.n && ok; i++) {
            unsigned char c = (unsigned char)self.u.s.s[i];
            ok = M("isdigit") ? isdigit(c) : M("isalpha") ? isalpha(c) : M("isspace") ? jis_space(c) : isalnum(c);
        }
        *out = jv_bool(ok);
        return true;
    }
    return false;
#undef M
}
