// text/template/jinja_tests.c - the tests of `x is name` (defined, string,
// mapping, divisibleby, ...) and the global functions (range, namespace,
// dict, raise_exception, strftime_now), as jinja2 3.x defines them.
#include <ctype.h>
#include <string.h>
#include <time.h>

#include "text/template/jinja_builtins_int.h"

const char *const jfunc_names[JF_COUNT] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};

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

// --- globals ---------------------------------------------------------------------------------

jval jcall_func(jrender *r, int func, const jval *args, int nargs, const char **kw,
                const jval *kwv, int nkw) {
    jargv a = {r, jfunc_names[func], args, nargs, kw, kwv, nkw};
    switch (func) {
    case JF_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (nargs == 1) stop = jarg_int(&a, 0, NULL, 0);
        else if (nargs == 2 || nargs == 3) {
            start = jarg_int(&a, 0, NULL, 0);
            stop = jarg_int(&a, 1, NULL, 0);
            if (nargs == 3) step = jarg_int(&a, 2, NULL, 1);
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
        jval f = jarg_str(&a, 0, "format");
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

