// text/template/jinja_filters.c - the filter and method entry points of the
// builtins (jinja_int.h), with the filters over lists, dicts and numbers
// (join, map, selectattr, sort, dictsort, tojson, int, round, ...) and the
// methods of dict and list, as jinja2 3.x and Python define them. String
// filters and str methods are in jinja_strings.c, tried first.
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "text/template/jinja_builtins_int.h"

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

static jval select_items(jrender *r, jval seq, const jargv *a, bool by_attr, bool keep) {
    // jinja2 iterates only `if value`: None selects nothing.
    jval items = jv_truthy(seq) ? jiter_list(r, seq) : jv_list(r, 0);
    jval out = jv_list(r, 0);
    size_t cap = 0;
    int first_test = by_attr ? 1 : 0;
    jval attr = by_attr ? jarg(a, 0, NULL, jv_undef(NULL)) : jv_undef(NULL);
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
        if (ok == keep) jl_push(r, &out, &cap, x);
    }
    return out;
}

static jval lower_key(jrender *r, jval k, bool case_sensitive) {
    return !case_sensitive && k.t == JT_STR ? jstr_map_case(r, k, 0) : k;
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
        while (*end && jis_space((unsigned char)*end)) end++;
        if (end != buf && !*end) return jv_int(x);
        double d = strtod(buf, &end);
        while (*end && jis_space((unsigned char)*end)) end++;
        if (end != buf && !*end) return jv_int((int64_t)d);
    }
    return def;
}

jval jfilter(jrender *r, const char *name, jval v, const jval *args, int nargs, const char **kw,
             const jval *kwv, int nkw, int line) {
    jargv a = {r, name, args, nargs, kw, kwv, nkw};
    (void)line;
    jval sv;
    if (jfilter_str(r, name, v, args, nargs, kw, kwv, nkw, &sv)) return sv;
#define F(s) (!strcmp(name, s))
    if (F("tojson")) {
        // HF: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
        if (jarg_bool(&a, 0, "ensure_ascii", false)) jr_fail(r, "tojson: ensure_ascii=True is not supported");
        jval ind = jarg(&a, 1, "indent", jv_none());
        const char *indent_s = NULL;
        if (ind.t == JT_INT) {
            if (ind.u.i < 0 || ind.u.i > 64) jr_fail(r, "tojson: indent out of range");
            char *sp = ja_alloc(&r->ar, (size_t)ind.u.i + 1);
            memset(sp, ' ', (size_t)ind.u.i);
            indent_s = sp;
        } else if (ind.t == JT_STR) {
            indent_s = ja_strndup(&r->ar, ind.u.s.s, ind.u.s.n);
        }
        jval seps = jarg(&a, 2, "separators", jv_none());
        const char *is = NULL, *ks = NULL;
        if (seps.t == JT_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JT_STR && seps.u.l->v[1].t == JT_STR) {
            is = ja_strndup(&r->ar, seps.u.l->v[0].u.s.s, seps.u.l->v[0].u.s.n);
            ks = ja_strndup(&r->ar, seps.u.l->v[1].u.s.s, seps.u.l->v[1].u.s.n);
        } else if (seps.t != JT_NONE) {
            jr_fail(r, "tojson: separators must be a pair of strings");
        }
        jbuf b = {0};
        jv_json_into(r, &b, v, indent_s, is, ks, jarg_bool(&a, 3, "sort_keys", false), 0);
        return jb_to_str(r, &b);
    }
    if (F("length") || F("count")) return length_of(r, v);
    if (F("join")) {
        jval items = jiter_list(r, v);
        jval sep = jarg(&a, 0, "d", jv_str("", 0));
        sep = jv_to_string(r, sep);
        jval attr = jarg(&a, 1, "attribute", jv_undef(NULL));
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
        bool boolean = jarg_bool(&a, 1, "boolean", false);
        if (v.t == JT_UNDEF || (boolean && !jv_truthy(v))) return jarg(&a, 0, "default_value", jv_str("", 0));
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
        jval attr = jarg(&a, -1, "attribute", jv_undef(NULL));
        jval def = jarg(&a, -1, "default", jv_undef(NULL));
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
    if (F("int")) return to_int(r, v, jarg(&a, 0, "default", jv_int(0)));
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
        return jarg(&a, 0, "default", jv_float(0));
    }
    if (F("abs")) {
        if (v.t == JT_INT) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JT_FLOAT) return jv_float(v.u.f < 0 ? -v.u.f : v.u.f);
        jr_fail(r, "abs: bad operand type '%s'", jv_type_name(v));
    }
    if (F("dictsort")) {
        if (v.t != JT_DICT) jr_fail(r, "dictsort: a mapping is required");
        bool cs = jarg_bool(&a, 0, "case_sensitive", false);
        jval by = jarg(&a, 1, "by", jv_str("key", 3));
        bool by_value = by.t == JT_STR && by.u.s.n == 5 && !memcmp(by.u.s.s, "value", 5);
        bool rev = jarg_bool(&a, 2, "reverse", false);
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
        bool rev = jarg_bool(&a, 0, "reverse", false), cs = jarg_bool(&a, 1, "case_sensitive", false);
        jval attr = jarg(&a, 2, "attribute", jv_undef(NULL));
        jval *keys = ja_alloc(&r->ar, sizeof(jval) * (n ? n : 1));
        for (size_t i = 0; i < n; i++)
            keys[i] = lower_key(r, attr.t != JT_UNDEF ? attr_path(r, l.u.l->v[i], attr) : l.u.l->v[i], cs);
        sort_by(r, l.u.l->v, keys, n, rev);
        return l;
    }
    if (F("unique")) {
        jval src = jiter_list(r, v);
        bool cs = jarg_bool(&a, 0, "case_sensitive", false);
        jval attr = jarg(&a, 1, "attribute", jv_undef(NULL));
        jval out = jv_list(r, 0), seen = jv_list(r, 0);
        size_t cap = 0, scap = 0;
        for (size_t i = 0; i < src.u.l->n; i++) {
            jval x = src.u.l->v[i];
            jval k = lower_key(r, attr.t != JT_UNDEF ? attr_path(r, x, attr) : x, cs);
            if (jcontains(r, seen, k)) continue;
            jl_push(r, &seen, &scap, k);
            jl_push(r, &out, &cap, x);
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
        jval attr = jarg(&a, -1, "attribute", jv_undef(NULL));
        jval acc = jarg(&a, 1, "start", jv_int(0));
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
    if (F("round")) {
        int64_t prec = jarg_int(&a, 0, "precision", 0);
        double x = jv_num(v), m = 1;
        for (int64_t i = 0; i < prec && i < 15; i++) m *= 10;
        jval method = jarg(&a, 1, "method", jv_str("common", 6));
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
    jargv a = {r, name, args, nargs, kw, kwv, nkw};
#define M(s) (!strcmp(name, s))
    if (self.t == JT_STR) return jmethod_str(r, self, name, args, nargs, kw, kwv, nkw, out);
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
            jval k = jarg(&a, 0, "key", jv_undef(NULL));
            for (size_t i = 0; i < self.u.d->n; i++)
                if (jv_equal(self.u.d->k[i], k)) {
                    *out = self.u.d->v[i];
                    return true;
                }
            *out = jarg(&a, 1, "default", jv_none());
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
            jval x = jarg(&a, 0, "value", jv_undef(NULL));
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

