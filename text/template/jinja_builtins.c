// text/template/jinja_builtins.c - filters, tests, methods of str/dict/list and
// the global functions, as jinja2 3.x and Python define them (chat
// templates rely on their exact output: `trim`, `tojson`, `indent`,
// `title`, str.split, ...). Case mapping is ASCII-only; everything else
// follows Python.
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/template/jinja_int.h"

const char *const jfunc_names[JF_COUNT] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};

// --- argument helpers -----------------------------------------------------------------

typedef struct {
    jrender *r;
    const char *fn;
    const jval *args;
    int nargs;
    const char **kw;
    const jval *kwv;
    int nkw;
} argv_t;

// Argument `pos` (positional index) or keyword `name`; `def` when absent.
static jval arg(const argv_t *a, int pos, const char *name, jval def) {
    if (pos >= 0 && pos < a->nargs) return a->args[pos];
    for (int i = 0; name && i < a->nkw; i++)
        if (!strcmp(a->kw[i], name)) return a->kwv[i];
    return def;
}

static jval str_arg(const argv_t *a, int pos, const char *name) {
    jval v = arg(a, pos, name, jv_undef(name));
    if (v.t == JT_UNDEF) jr_fail(a->r, "%s: missing argument '%s'", a->fn, name);
    return jv_to_string(a->r, v);
}

static int64_t int_arg(const argv_t *a, int pos, const char *name, int64_t def) {
    jval v = arg(a, pos, name, jv_undef(NULL));
    if (v.t == JT_UNDEF || v.t == JT_NONE) return def;
    if (v.t == JT_INT) return v.u.i;
    if (v.t == JT_BOOL) return v.u.b;
    jr_fail(a->r, "%s: '%s' must be an integer", a->fn, name ? name : "argument");
}

static bool bool_arg(const argv_t *a, int pos, const char *name, bool def) {
    jval v = arg(a, pos, name, jv_undef(NULL));
    return v.t == JT_UNDEF ? def : jv_truthy(v);
}

static bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }
static bool in_set(unsigned char c, jval chars) {
    return chars.t == JT_STR ? memchr(chars.u.s.s, c, chars.u.s.n) != NULL : is_space(c);
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

static jval map_case(jrender *r, jval s, int mode) {  // 0 lower, 1 upper, 2 capitalize
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
        bool sep = c == '-' || is_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
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

static void list_push(jrender *r, jval *l, size_t *cap, jval v) {
    jlist *x = l->u.l;
    if (x->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        jval *nv = ja_alloc(&r->ar, sizeof(jval) * nc);
        if (x->n) memcpy(nv, x->v, sizeof(jval) * x->n);
        x->v = nv;
        *cap = nc;
    }
    x->v[x->n++] = v;
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
                while (e > 0 && is_space((unsigned char)p[e - 1])) e--;
                if (!e) break;
                size_t b = e;
                if (maxsplit >= 0 && k >= maxsplit) {
                    list_push(r, &tmp, &tc, strip(jv_str(p, e), jv_none(), true, false));
                    break;
                }
                while (b > 0 && !is_space((unsigned char)p[b - 1])) b--;
                list_push(r, &tmp, &tc, jv_str(p + b, e - b));
                k++;
                e = b;
            }
            for (size_t i = tmp.u.l->n; i-- > 0;) list_push(r, &out, &cap, tmp.u.l->v[i]);
            return out;
        }
        size_t i = 0;
        int64_t k = 0;
        while (i < n) {
            while (i < n && is_space((unsigned char)p[i])) i++;
            if (i >= n) break;
            if (maxsplit >= 0 && k >= maxsplit) {
                list_push(r, &out, &cap, strip(jv_str(p + i, n - i), jv_none(), false, true));
                break;
            }
            size_t b = i;
            while (i < n && !is_space((unsigned char)p[i])) i++;
            list_push(r, &out, &cap, jv_str(p + b, i - b));
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
                list_push(r, &tmp, &tc, jv_str(p, e));
                break;
            }
            size_t at = (size_t)(hit - p);
            list_push(r, &tmp, &tc, jv_str(hit + sep.u.s.n, e - at - sep.u.s.n));
            e = at;
            k++;
        }
        for (size_t i = tmp.u.l->n; i-- > 0;) list_push(r, &out, &cap, tmp.u.l->v[i]);
        return out;
    }
    int64_t k = 0;
    for (;;) {
        const char *hit = maxsplit < 0 || k < maxsplit ? memmem(p, n, sep.u.s.s, sep.u.s.n) : NULL;
        if (!hit) {
            list_push(r, &out, &cap, jv_str(p, n));
            return out;
        }
        list_push(r, &out, &cap, jv_str(p, (size_t)(hit - p)));
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

// --- tests -----------------------------------------------------------------------------------

bool jtest(jrender *r, const char *name, jval v, const jval *args, int nargs, int line) {
    jval a0 = nargs > 0 ? args[0] : jv_undef(NULL);
#define T(s) (!strcmp(name, s))
    if (T("defined")) return v.t != JT_UNDEF;
    if (T("undefined")) return v.t == JT_UNDEF;
    if (T("none")) return v.t == JT_NONE;
    if (T("boolean")) return v.t == JT_BOOL;
    if (T("true")) return v.t == JT_BOOL && v.u.b;
    if (T("false")) return v.t == JT_BOOL && !v.u.b;
    if (T("integer")) return v.t == JT_INT;
    if (T("float")) return v.t == JT_FLOAT;
    if (T("number")) return jv_is_num(v);
    if (T("string")) return v.t == JT_STR;
    if (T("mapping")) return v.t == JT_DICT;
    if (T("iterable")) return v.t == JT_STR || v.t == JT_LIST || v.t == JT_DICT || v.t == JT_UNDEF;
    if (T("sequence")) return v.t == JT_STR || v.t == JT_LIST || v.t == JT_DICT;
    if (T("callable")) return v.t == JT_MACRO || v.t == JT_FUNC;
    if (T("sameas")) return v.t == a0.t && (jv_is_num(v) || v.t == JT_NONE ? jv_equal(v, a0) : jv_equal(v, a0));
    if (T("equalto") || T("eq") || T("==")) return jv_equal(v, a0);
    if (T("ne") || T("!=")) return !jv_equal(v, a0);
    if (T("in")) return jcontains(r, a0, v);
    if (T("lower") || T("upper")) {
        if (v.t != JT_STR) return false;
        bool any = false;
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char c = (unsigned char)v.u.s.s[i];
            if (isalpha(c)) {
                any = true;
                if (T("lower") ? isupper(c) : islower(c)) return false;
            }
        }
        return any;
    }
    if (T("odd") || T("even") || T("divisibleby")) {
        if (v.t != JT_INT) jr_fail(r, "test '%s' needs an integer", name);
        if (T("odd")) return v.u.i % 2 != 0;
        if (T("even")) return v.u.i % 2 == 0;
        if (a0.t != JT_INT || a0.u.i == 0) jr_fail(r, "divisibleby needs a non-zero integer");
        return v.u.i % a0.u.i == 0;
    }
    if (T("lt") || T("<") || T("le") || T("<=") || T("gt") || T(">") || T("ge") || T(">=")) {
        if (!jv_is_num(v) || !jv_is_num(a0)) {
            if (v.t == JT_STR && a0.t == JT_STR) {
                size_t n = v.u.s.n < a0.u.s.n ? v.u.s.n : a0.u.s.n;
                int c = memcmp(v.u.s.s, a0.u.s.s, n);
                if (!c) c = (v.u.s.n > a0.u.s.n) - (v.u.s.n < a0.u.s.n);
                return name[0] == 'l' || name[0] == '<' ? (name[1] ? c <= 0 : c < 0) : (name[1] ? c >= 0 : c > 0);
            }
            jr_fail(r, "test '%s' cannot compare %s and %s", name, jv_type_name(v), jv_type_name(a0));
        }
        double x = jv_num(v), y = jv_num(a0);
        if (T("lt") || T("<")) return x < y;
        if (T("le") || T("<=")) return x <= y;
        if (T("gt") || T(">")) return x > y;
        return x >= y;
    }
#undef T
    (void)line;
    jr_fail(r, "no test named '%s'", name);
}

// --- filters ---------------------------------------------------------------------------------

static jval length_of(jrender *r, jval v) {
    switch (v.t) {
    case JT_STR: return jv_int((int64_t)utf8_len(v.u.s.s, v.u.s.n));
    case JT_LIST: return jv_int((int64_t)v.u.l->n);
    case JT_DICT: case JT_NS: return jv_int((int64_t)v.u.d->n);
    case JT_UNDEF: return jv_int(0);
    default: jr_fail(r, "object of type '%s' has no len()", jv_type_name(v));
    }
}

// `item.a.b` for map/selectattr/join/sort attribute= (dotted paths, ints
// as indexes).
static jval attr_path(jrender *r, jval v, jval path) {
    if (path.t != JT_STR) return jgetitem(r, v, path);
    const char *p = path.u.s.s, *end = p + path.u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        if (v.t == JT_UNDEF) return v;
        bool digits = dot > p;
        for (const char *q = p; q < dot; q++) digits &= isdigit((unsigned char)*q) != 0;
        if (digits) v = jgetitem(r, v, jv_int(strtoll(p, NULL, 10)));
        else v = jgetitem(r, v, jv_str(p, (size_t)(dot - p)));
        p = dot + 1;
    }
    return v;
}

static jval select_items(jrender *r, jval seq, const argv_t *a, bool by_attr, bool keep) {
    // jinja2 iterates only `if value`: None selects nothing.
    jval items = jv_truthy(seq) ? jiter_list(r, seq) : jv_list(r, 0);
    jval out = jv_list(r, 0);
    size_t cap = 0;
    int first_test = by_attr ? 1 : 0;
    jval attr = by_attr ? arg(a, 0, NULL, jv_undef(NULL)) : jv_undef(NULL);
    const char *test = NULL;
    if (a->nargs > first_test) {
        jval t = a->args[first_test];
        if (t.t != JT_STR) jr_fail(r, "%s: the test name must be a string", a->fn);
        test = ja_strndup(&r->ar, t.u.s.s, t.u.s.n);
    }
    int nt = a->nargs - first_test - 1;
    const jval *targs = nt > 0 ? a->args + first_test + 1 : NULL;
    for (size_t i = 0; i < items.u.l->n; i++) {
        jval x = items.u.l->v[i];
        jval subject = by_attr ? attr_path(r, x, attr) : x;
        bool ok = test ? jtest(r, test, subject, targs, nt > 0 ? nt : 0, 0) : jv_truthy(subject);
        if (ok == keep) list_push(r, &out, &cap, x);
    }
    return out;
}

static jval indent(jrender *r, jval s, const argv_t *a) {
    jval w = arg(a, 0, "width", jv_int(4));
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
    bool first = bool_arg(a, 1, "first", false), blank = bool_arg(a, 2, "blank", false);
    // s + "\n", then splitlines(): lines end at \n, \r\n, \r, \v, \f, \x1c-\x1e.
    jval lines = jv_list(r, 0);
    size_t cap = 0;
    const char *p = s.u.s.s, *e = p + s.u.s.n;
    const char *ls = p;
    for (const char *q = p; q <= e; q++) {
        bool at_end = q == e;
        unsigned char c = at_end ? '\n' : (unsigned char)*q;
        if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
            list_push(r, &lines, &cap, jv_str(ls, (size_t)(q - ls)));
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

static jval lower_key(jrender *r, jval k, bool case_sensitive) {
    return !case_sensitive && k.t == JT_STR ? map_case(r, k, 0) : k;
}

static int cmp_vals(jrender *r, jval a, jval b) {
    if (jv_is_num(a) && jv_is_num(b)) return (jv_num(a) > jv_num(b)) - (jv_num(a) < jv_num(b));
    if (a.t == JT_STR && b.t == JT_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.s, b.u.s.s, n);
        return c ? (c > 0) - (c < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    jr_fail(r, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

// A stable insertion sort of items by keys (n is small in templates; the
// step counter bounds it).
static void sort_by(jrender *r, jval *items, jval *keys, size_t n, bool reverse) {
    for (size_t i = 1; i < n; i++) {
        jval it = items[i], k = keys[i];
        size_t j = i;
        while (j > 0) {
            jr_step(r);
            int c = cmp_vals(r, keys[j - 1], k);
            if (reverse ? c >= 0 : c <= 0) break;
            items[j] = items[j - 1];
            keys[j] = keys[j - 1];
            j--;
        }
        items[j] = it;
        keys[j] = k;
    }
}

static jval to_int(jrender *r, jval v, jval def) {
    if (v.t == JT_INT) return v;
    if (v.t == JT_BOOL) return jv_int(v.u.b);
    if (v.t == JT_FLOAT) return jv_int((int64_t)v.u.f);
    if (v.t == JT_STR) {
        char buf[64];
        size_t n = v.u.s.n < sizeof buf - 1 ? v.u.s.n : sizeof buf - 1;
        memcpy(buf, v.u.s.s, n);
        buf[n] = 0;
        char *end;
        long long x = strtoll(buf, &end, 10);
        while (*end && is_space((unsigned char)*end)) end++;
        if (end != buf && !*end) return jv_int(x);
        double d = strtod(buf, &end);
        while (*end && is_space((unsigned char)*end)) end++;
        if (end != buf && !*end) return jv_int((int64_t)d);
    }
    return def;
}

jval jfilter(jrender *r, const char *name, jval v, const jval *args, int nargs, const char **kw,
             const jval *kwv, int nkw, int line) {
    argv_t a = {r, name, args, nargs, kw, kwv, nkw};
    (void)line;
#define F(s) (!strcmp(name, s))
    if (F("safe")) {
        jval s = jv_to_string(r, v);
        s.markup = true;
        return s;
    }
    if (F("string") && v.t == JT_STR) return v;
    if (F("string")) return jv_to_string(r, v);
    if (F("trim")) {
        jval chars = arg(&a, 0, "chars", jv_none());
        return strip(jv_to_string(r, v), chars.t == JT_STR ? chars : jv_none(), true, true);
    }
    if (F("tojson")) {
        // HF: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
        if (bool_arg(&a, 0, "ensure_ascii", false)) jr_fail(r, "tojson: ensure_ascii=True is not supported");
        jval ind = arg(&a, 1, "indent", jv_none());
        const char *indent_s = NULL;
        if (ind.t == JT_INT) {
            if (ind.u.i < 0 || ind.u.i > 64) jr_fail(r, "tojson: indent out of range");
            char *sp = ja_alloc(&r->ar, (size_t)ind.u.i + 1);
            memset(sp, ' ', (size_t)ind.u.i);
            indent_s = sp;
        } else if (ind.t == JT_STR) {
            indent_s = ja_strndup(&r->ar, ind.u.s.s, ind.u.s.n);
        }
        jval seps = arg(&a, 2, "separators", jv_none());
        const char *is = NULL, *ks = NULL;
        if (seps.t == JT_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JT_STR && seps.u.l->v[1].t == JT_STR) {
            is = ja_strndup(&r->ar, seps.u.l->v[0].u.s.s, seps.u.l->v[0].u.s.n);
            ks = ja_strndup(&r->ar, seps.u.l->v[1].u.s.s, seps.u.l->v[1].u.s.n);
        } else if (seps.t != JT_NONE) {
            jr_fail(r, "tojson: separators must be a pair of strings");
        }
        jbuf b = {0};
        jv_json_into(r, &b, v, indent_s, is, ks, bool_arg(&a, 3, "sort_keys", false), 0);
        return jb_to_str(r, &b);
    }
    if (F("length") || F("count")) return length_of(r, v);
    if (F("upper")) return map_case(r, jv_to_string(r, v), 1);
    if (F("lower")) return map_case(r, jv_to_string(r, v), 0);
    if (F("capitalize")) return map_case(r, jv_to_string(r, v), 2);
    if (F("title")) return jinja_title(r, jv_to_string(r, v));
    if (F("replace")) {
        jval s = jv_to_string(r, v);
        return replace(r, s, str_arg(&a, 0, "old"), str_arg(&a, 1, "new"), int_arg(&a, 2, "count", -1));
    }
    if (F("join")) {
        jval items = jiter_list(r, v);
        jval sep = arg(&a, 0, "d", jv_str("", 0));
        sep = jv_to_string(r, sep);
        jval attr = arg(&a, 1, "attribute", jv_undef(NULL));
        jbuf b = {0};
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (i) jb_add(r, &b, sep.u.s.s, sep.u.s.n);
            jval x = items.u.l->v[i];
            jv_str_into(r, &b, attr.t != JT_UNDEF ? attr_path(r, x, attr) : x);
        }
        return b.p ? jb_to_str(r, &b) : jv_str("", 0);
    }
    if (F("first") || F("last")) {
        jval items = jiter_list(r, v);
        if (!items.u.l->n) return jv_undef(NULL);
        return items.u.l->v[F("first") ? 0 : items.u.l->n - 1];
    }
    if (F("default") || F("d")) {
        bool boolean = bool_arg(&a, 1, "boolean", false);
        if (v.t == JT_UNDEF || (boolean && !jv_truthy(v))) return arg(&a, 0, "default_value", jv_str("", 0));
        return v;
    }
    if (F("items")) {
        if (v.t == JT_UNDEF) return jv_list(r, 0);
        if (v.t != JT_DICT && v.t != JT_NS) jr_fail(r, "items: can only get item pairs from a mapping");
        jval l = jv_list(r, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jval p = jv_list(r, 2);
            p.u.l->tuple = true;
            p.u.l->v[0] = v.u.d->k[i];
            p.u.l->v[1] = v.u.d->v[i];
            l.u.l->v[i] = p;
        }
        return l;
    }
    if (F("list")) {
        jval src = jiter_list(r, v);
        jval l = jv_list(r, src.u.l->n);
        if (src.u.l->n) memcpy(l.u.l->v, src.u.l->v, sizeof(jval) * src.u.l->n);
        return l;
    }
    if (F("selectattr")) return select_items(r, v, &a, true, true);
    if (F("rejectattr")) return select_items(r, v, &a, true, false);
    if (F("select")) return select_items(r, v, &a, false, true);
    if (F("reject")) return select_items(r, v, &a, false, false);
    if (F("map")) {
        jval items = jv_truthy(v) ? jiter_list(r, v) : jv_list(r, 0);
        jval out = jv_list(r, items.u.l->n);
        jval attr = arg(&a, -1, "attribute", jv_undef(NULL));
        jval def = arg(&a, -1, "default", jv_undef(NULL));
        if (attr.t == JT_UNDEF && (nargs < 1 || args[0].t != JT_STR)) jr_fail(r, "map: needs a filter name or attribute=");
        for (size_t i = 0; i < items.u.l->n; i++) {
            jval x = items.u.l->v[i];
            if (attr.t != JT_UNDEF) {
                jval y = attr_path(r, x, attr);
                out.u.l->v[i] = y.t == JT_UNDEF && def.t != JT_UNDEF ? def : y;
            } else {
                const char *fname = ja_strndup(&r->ar, args[0].u.s.s, args[0].u.s.n);
                out.u.l->v[i] = jfilter(r, fname, x, args + 1, nargs - 1, kw, kwv, nkw, line);
            }
        }
        return out;
    }
    if (F("int")) return to_int(r, v, arg(&a, 0, "default", jv_int(0)));
    if (F("float")) {
        if (v.t == JT_FLOAT) return v;
        if (v.t == JT_INT || v.t == JT_BOOL) return jv_float(jv_num(v));
        if (v.t == JT_STR) {
            char buf[64];
            size_t n = v.u.s.n < sizeof buf - 1 ? v.u.s.n : sizeof buf - 1;
            memcpy(buf, v.u.s.s, n);
            buf[n] = 0;
            char *end;
            double d = strtod(buf, &end);
            if (end != buf && !*end) return jv_float(d);
        }
        return arg(&a, 0, "default", jv_float(0));
    }
    if (F("abs")) {
        if (v.t == JT_INT) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JT_FLOAT) return jv_float(v.u.f < 0 ? -v.u.f : v.u.f);
        jr_fail(r, "abs: bad operand type '%s'", jv_type_name(v));
    }
    if (F("escape") || F("e")) return v.t == JT_STR && v.markup ? v : jhtml_escape(r, jv_to_string(r, v));
    if (F("indent")) return indent(r, jv_to_string(r, v), &a);
    if (F("dictsort")) {
        if (v.t != JT_DICT) jr_fail(r, "dictsort: a mapping is required");
        bool cs = bool_arg(&a, 0, "case_sensitive", false);
        jval by = arg(&a, 1, "by", jv_str("key", 3));
        bool by_value = by.t == JT_STR && by.u.s.n == 5 && !memcmp(by.u.s.s, "value", 5);
        bool rev = bool_arg(&a, 2, "reverse", false);
        size_t n = v.u.d->n;
        jval l = jfilter(r, "items", v, NULL, 0, NULL, NULL, 0, line);
        jval *keys = ja_alloc(&r->ar, sizeof(jval) * (n ? n : 1));
        for (size_t i = 0; i < n; i++) keys[i] = lower_key(r, by_value ? v.u.d->v[i] : v.u.d->k[i], cs);
        sort_by(r, l.u.l->v, keys, n, rev);
        return l;
    }
    if (F("sort")) {
        jval src = jiter_list(r, v);
        size_t n = src.u.l->n;
        jval l = jv_list(r, n);
        if (n) memcpy(l.u.l->v, src.u.l->v, sizeof(jval) * n);
        bool rev = bool_arg(&a, 0, "reverse", false), cs = bool_arg(&a, 1, "case_sensitive", false);
        jval attr = arg(&a, 2, "attribute", jv_undef(NULL));
        jval *keys = ja_alloc(&r->ar, sizeof(jval) * (n ? n : 1));
        for (size_t i = 0; i < n; i++)
            keys[i] = lower_key(r, attr.t != JT_UNDEF ? attr_path(r, l.u.l->v[i], attr) : l.u.l->v[i], cs);
        sort_by(r, l.u.l->v, keys, n, rev);
        return l;
    }
    if (F("unique")) {
        jval src = jiter_list(r, v);
        bool cs = bool_arg(&a, 0, "case_sensitive", false);
        jval attr = arg(&a, 1, "attribute", jv_undef(NULL));
        jval out = jv_list(r, 0), seen = jv_list(r, 0);
        size_t cap = 0, scap = 0;
        for (size_t i = 0; i < src.u.l->n; i++) {
            jval x = src.u.l->v[i];
            jval k = lower_key(r, attr.t != JT_UNDEF ? attr_path(r, x, attr) : x, cs);
            if (jcontains(r, seen, k)) continue;
            list_push(r, &seen, &scap, k);
            list_push(r, &out, &cap, x);
        }
        return out;
    }
    if (F("reverse")) {
        if (v.t == JT_STR) {
            jval chars = jiter_list(r, v);
            jbuf b = {0};
            for (size_t i = chars.u.l->n; i-- > 0;) jb_add(r, &b, chars.u.l->v[i].u.s.s, chars.u.l->v[i].u.s.n);
            return b.p ? jb_to_str(r, &b) : jv_str("", 0);
        }
        jval src = jiter_list(r, v);
        jval l = jv_list(r, src.u.l->n);
        for (size_t i = 0; i < src.u.l->n; i++) l.u.l->v[i] = src.u.l->v[src.u.l->n - 1 - i];
        return l;
    }
    if (F("sum")) {
        jval src = jiter_list(r, v);
        jval attr = arg(&a, -1, "attribute", jv_undef(NULL));
        jval acc = arg(&a, 1, "start", jv_int(0));
        if (nargs > 0 && attr.t == JT_UNDEF) attr = args[0];
        for (size_t i = 0; i < src.u.l->n; i++) {
            jval x = attr.t != JT_UNDEF ? attr_path(r, src.u.l->v[i], attr) : src.u.l->v[i];
            if (!jv_is_num(x) || !jv_is_num(acc)) jr_fail(r, "sum: the items must be numbers");
            acc = acc.t == JT_FLOAT || x.t == JT_FLOAT ? jv_float(jv_num(acc) + jv_num(x))
                                                        : jv_int((int64_t)jv_num(acc) + (int64_t)jv_num(x));
        }
        return acc;
    }
    if (F("min") || F("max")) {
        jval src = jiter_list(r, v);
        if (!src.u.l->n) return jv_undef(NULL);
        jval best = src.u.l->v[0];
        for (size_t i = 1; i < src.u.l->n; i++) {
            int c = cmp_vals(r, src.u.l->v[i], best);
            if (F("min") ? c < 0 : c > 0) best = src.u.l->v[i];
        }
        return best;
    }
    if (F("wordcount")) {
        jval words = split(r, jv_to_string(r, v), jv_none(), -1, false);
        return jv_int((int64_t)words.u.l->n);
    }
    if (F("round")) {
        int64_t prec = int_arg(&a, 0, "precision", 0);
        double x = jv_num(v), m = 1;
        for (int64_t i = 0; i < prec && i < 15; i++) m *= 10;
        jval method = arg(&a, 1, "method", jv_str("common", 6));
        double y = x * m;
        if (method.t == JT_STR && method.u.s.n == 4 && !memcmp(method.u.s.s, "ceil", 4)) y = __builtin_ceil(y);
        else if (method.t == JT_STR && method.u.s.n == 5 && !memcmp(method.u.s.s, "floor", 5)) y = __builtin_floor(y);
        else y = __builtin_round(y);
        return jv_float(y / m);
    }
#undef F
    jr_fail(r, "no filter named '%s'", name);
}

// --- methods ---------------------------------------------------------------------------------

bool jmethod(jrender *r, jval self, const char *name, const jval *args, int nargs,
             const char **kw, const jval *kwv, int nkw, jval *out) {
    argv_t a = {r, name, args, nargs, kw, kwv, nkw};
#define M(s) (!strcmp(name, s))
    if (self.t == JT_STR) {
        if (M("strip") || M("lstrip") || M("rstrip")) {
            jval chars = arg(&a, 0, "chars", jv_none());
            *out = strip(self, chars, !M("rstrip"), !M("lstrip"));
            return true;
        }
        if (M("upper") || M("lower") || M("capitalize")) {
            *out = map_case(r, self, M("lower") ? 0 : M("upper") ? 1 : 2);
            return true;
        }
        if (M("title")) { *out = py_title(r, self); return true; }
        if (M("startswith") || M("endswith")) {
            jval pre = arg(&a, 0, "prefix", jv_undef(NULL));
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
            jval sep = arg(&a, 0, "sep", jv_none());
            if (sep.t != JT_NONE && sep.t != JT_STR) jr_fail(r, "%s: sep must be a string or None", name);
            *out = split(r, self, sep, int_arg(&a, 1, "maxsplit", -1), M("rsplit"));
            return true;
        }
        if (M("replace")) {
            *out = replace(r, self, str_arg(&a, 0, "old"), str_arg(&a, 1, "new"), int_arg(&a, 2, "count", -1));
            return true;
        }
        if (M("find") || M("rfind") || M("count") || M("index")) {
            jval sub = str_arg(&a, 0, "sub");
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
            jval items = jiter_list(r, arg(&a, 0, "iterable", jv_undef(NULL)));
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
                    list_push(r, &l, &cap, jv_str(ls, (size_t)(q - ls)));
                    if (*q == '\r' && q + 1 < e && q[1] == '\n') q++;
                    ls = q + 1;
                }
            if (ls < e) list_push(r, &l, &cap, jv_str(ls, (size_t)(e - ls)));
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
                ok = M("isdigit") ? isdigit(c) : M("isalpha") ? isalpha(c) : M("isspace") ? is_space(c) : isalnum(c);
            }
            *out = jv_bool(ok);
            return true;
        }
        return false;
    }
    if (self.t == JT_DICT || self.t == JT_NS) {
        if (M("items")) { *out = jfilter(r, "items", self, NULL, 0, NULL, NULL, 0, 0); return true; }
        if (M("keys")) { *out = jiter_list(r, self); return true; }
        if (M("values")) {
            jval l = jv_list(r, self.u.d->n);
            for (size_t i = 0; i < self.u.d->n; i++) l.u.l->v[i] = self.u.d->v[i];
            *out = l;
            return true;
        }
        if (M("get")) {
            jval k = arg(&a, 0, "key", jv_undef(NULL));
            for (size_t i = 0; i < self.u.d->n; i++)
                if (jv_equal(self.u.d->k[i], k)) {
                    *out = self.u.d->v[i];
                    return true;
                }
            *out = arg(&a, 1, "default", jv_none());
            return true;
        }
        if (M("copy")) {
            jval d = jv_dict(r);
            for (size_t i = 0; i < self.u.d->n; i++) jd_set(r, d.u.d, self.u.d->k[i], self.u.d->v[i]);
            *out = d;
            return true;
        }
        if (self.t == JT_DICT && (M("update") || M("pop") || M("setdefault") || M("clear") || M("popitem")))
            jr_fail(r, "access to attribute '%s' of 'dict' object is unsafe", name);
        return false;
    }
    if (self.t == JT_LIST) {
        if (M("index") || M("count")) {
            jval x = arg(&a, 0, "value", jv_undef(NULL));
            int64_t hits = 0, first = -1;
            for (size_t i = 0; i < self.u.l->n; i++)
                if (jv_equal(self.u.l->v[i], x)) {
                    if (first < 0) first = (int64_t)i;
                    hits++;
                }
            if (M("index") && first < 0) jr_fail(r, "list.index(x): x not in list");
            *out = jv_int(M("count") ? hits : first);
            return true;
        }
        // The immutable sandbox HF renders in refuses every mutation.
        if (M("append") || M("extend") || M("pop") || M("insert") || M("remove") || M("sort") ||
            M("reverse") || M("clear"))
            jr_fail(r, "access to attribute '%s' of 'list' object is unsafe", name);
        return false;
    }
    if (self.t == JT_LOOP && M("cycle")) {
        if (!nargs) jr_fail(r, "no items for cycling given");
        *out = args[self.u.loop->i % (size_t)nargs];
        return true;
    }
#undef M
    return false;
}

// --- globals ---------------------------------------------------------------------------------

jval jcall_func(jrender *r, int func, const jval *args, int nargs, const char **kw,
                const jval *kwv, int nkw) {
    argv_t a = {r, jfunc_names[func], args, nargs, kw, kwv, nkw};
    switch (func) {
    case JF_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (nargs == 1) stop = int_arg(&a, 0, NULL, 0);
        else if (nargs == 2 || nargs == 3) {
            start = int_arg(&a, 0, NULL, 0);
            stop = int_arg(&a, 1, NULL, 0);
            if (nargs == 3) step = int_arg(&a, 2, NULL, 1);
        } else jr_fail(r, "range expected 1 to 3 arguments, got %d", nargs);
        if (step == 0) jr_fail(r, "range() arg 3 must not be zero");
        int64_t cnt = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                               : (start > stop ? (start - stop - step - 1) / -step : 0);
        // jinja2's sandbox refuses ranges over MAX_RANGE (100000) too.
        if (cnt > 100000) jr_fail(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jval l = jv_list(r, (size_t)cnt);
        for (int64_t i = 0; i < cnt; i++) l.u.l->v[i] = jv_int(start + i * step);
        return l;
    }
    case JF_NAMESPACE: case JF_DICT: {
        jval d = jv_dict(r);
        d.t = func == JF_NAMESPACE ? JT_NS : JT_DICT;
        for (int i = 0; i < nargs; i++) {
            if (args[i].t != JT_DICT && args[i].t != JT_NS) jr_fail(r, "%s: positional arguments must be mappings", a.fn);
            for (size_t k = 0; k < args[i].u.d->n; k++) jd_set(r, d.u.d, args[i].u.d->k[k], args[i].u.d->v[k]);
        }
        for (int i = 0; i < nkw; i++) jd_set(r, d.u.d, jv_strz(r, kw[i]), kwv[i]);
        return d;
    }
    case JF_RAISE: {
        jval m = nargs ? jv_to_string(r, args[0]) : jv_str("raise_exception", 15);
        jr_raise(r, m.u.s.s, m.u.s.n);
    }
    case JF_STRFTIME: {
        jval f = str_arg(&a, 0, "format");
        char fmt[256], out[512];
        size_t n = f.u.s.n < sizeof fmt - 1 ? f.u.s.n : sizeof fmt - 1;
        memcpy(fmt, f.u.s.s, n);
        fmt[n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(out, sizeof out, fmt, &tm);
        return jv_str(ja_strndup(&r->ar, out, k), k);
    }
    }
    jr_fail(r, "bad function");
}
