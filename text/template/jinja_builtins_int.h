// text/template/jinja_builtins_int.h - what the files of the builtins share
// (jinja_strings.c, jinja_filters.c, jinja_tests.c): reading the arguments
// of a filter, method or function call, and the string pieces the list
// filters reuse. Not public; includes jinja_int.h.
#pragma once
#include <string.h>

#include "text/template/jinja_int.h"

// --- argument helpers -----------------------------------------------------------------

typedef struct {
    jrender *r;
    const char *fn;
    const jval *args;
    int nargs;
    const char **kw;
    const jval *kwv;
    int nkw;
} jargv;

// Argument `pos` (positional index) or keyword `name`; `def` when absent.
static inline jval jarg(const jargv *a, int pos, const char *name, jval def) {
    if (pos >= 0 && pos < a->nargs) return a->args[pos];
    for (int i = 0; name && i < a->nkw; i++)
        if (!strcmp(a->kw[i], name)) return a->kwv[i];
    return def;
}

static inline jval jarg_str(const jargv *a, int pos, const char *name) {
    jval v = jarg(a, pos, name, jv_undef(name));
    if (v.t == JT_UNDEF) jr_fail(a->r, "%s: missing argument '%s'", a->fn, name);
    return jv_to_string(a->r, v);
}

static inline int64_t jarg_int(const jargv *a, int pos, const char *name, int64_t def) {
    jval v = jarg(a, pos, name, jv_undef(NULL));
    if (v.t == JT_UNDEF || v.t == JT_NONE) return def;
    if (v.t == JT_INT) return v.u.i;
    if (v.t == JT_BOOL) return v.u.b;
    jr_fail(a->r, "%s: '%s' must be an integer", a->fn, name ? name : "argument");
}

static inline bool jarg_bool(const jargv *a, int pos, const char *name, bool def) {
    jval v = jarg(a, pos, name, jv_undef(NULL));
    return v.t == JT_UNDEF ? def : jv_truthy(v);
}

// Python's str.isspace() over one byte (ASCII whitespace and \x1c-\x1f).
static inline bool jis_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

// --- jinja_strings.c ---------------------------------------------------------------------

// ASCII case mapping of a string: mode 0 lower, 1 upper, 2 capitalize.
jval jstr_map_case(jrender *r, jval s, int mode);
// The string filters (jfilter's first try) and the methods of str (jmethod's
// for a string): false when `name` is none of them.
bool jfilter_str(jrender *r, const char *name, jval v, const jval *args, int nargs, const char **kw,
                 const jval *kwv, int nkw, jval *out);
bool jmethod_str(jrender *r, jval self, const char *name, const jval *args, int nargs,
                 const char **kw, const jval *kwv, int nkw, jval *out);
