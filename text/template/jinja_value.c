// text/template/jinja_value.c - the arena, values, and Python's str(), repr() and
// json.dumps() of them (chat templates print lists and dicts with str() and
// tools with tojson, so both must match Python byte for byte).
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/template/jinja_int.h"

// --- render errors and limits ------------------------------------------------------
//
// Here rather than in jinja_eval.c: everything that builds a value (the
// buffers, json.dumps) fails or counts steps through them, so they sit at
// the bottom with the values.

_Noreturn void jr_fail(jrender *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(r->err, sizeof r->err, "jinja line %d: ", r->line);
    vsnprintf(r->err + k, sizeof r->err - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(r->jb, 1);
}

_Noreturn void jr_raise(jrender *r, const char *msg, size_t n) {
    snprintf(r->err, sizeof r->err, "%.*s", (int)n, msg);
    if (!r->err[0]) snprintf(r->err, sizeof r->err, "raise_exception called with an empty message");
    longjmp(r->jb, 1);
}

void jr_step(jrender *r) {
    if (++r->steps > r->max_steps)
        jr_fail(r, "template exceeded %zu evaluation steps (a loop that does not end?)", r->max_steps);
}

// --- arena ----------------------------------------------------------------------

struct jchunk {
    jchunk *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->cap && a->total + n > a->cap) {
        if (a->err) snprintf(a->err, a->err_cap, "template used more than %zu bytes of memory", a->cap);
        longjmp(*a->on_full, 1);
    }
    jchunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > 60000 ? n : 65536 - sizeof *c;
        c = pg_xmalloc(sizeof *c + sz);
        c->size = sz;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

char *ja_strndup(jarena *a, const char *s, size_t n) {
    char *d = ja_alloc(a, n + 1);
    memcpy(d, s, n);
    return d;
}

void ja_free_all(jarena *a) {
    for (jchunk *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

// --- buffers ----------------------------------------------------------------------

void jb_add(jrender *r, jbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (b->limit && b->len + n > b->limit) jr_fail(r, "template output exceeds %zu bytes", b->limit);
    if (b->len + n + 1 > b->cap) {
        // Buffers live in the render arena too, so a failure that unwinds
        // mid-string leaks nothing; doubling bounds the waste to 2x.
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->len + n + 1) nc *= 2;
        char *np = ja_alloc(&r->ar, nc);
        if (b->len) memcpy(np, b->p, b->len);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void jb_addc(jrender *r, jbuf *b, char c) { jb_add(r, b, &c, 1); }
void jb_addz(jrender *r, jbuf *b, const char *s) { jb_add(r, b, s, strlen(s)); }

jval jb_to_str(jrender *r, jbuf *b) {
    jval v = jv_str(b->p ? b->p : "", b->len);
    memset(b, 0, sizeof *b);
    return v;
}

// --- constructors -------------------------------------------------------------------

jval jv_strz(jrender *r, const char *s) {
    size_t n = strlen(s);
    return jv_str(ja_strndup(&r->ar, s, n), n);
}

jval jv_list(jrender *r, size_t n) {
    jval v = {.t = JT_LIST};
    v.u.l = ja_alloc(&r->ar, sizeof(jlist));
    v.u.l->n = n;
    v.u.l->v = n ? ja_alloc(&r->ar, sizeof(jval) * n) : NULL;
    return v;
}

// Appends v to the list l, growing its storage (capacity *cap) by doubling
// in the render arena; the builtins build lists item by item with it.
void jl_push(jrender *r, jval *l, size_t *cap, jval v) {
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

jval jv_dict(jrender *r) {
    jval v = {.t = JT_DICT};
    v.u.d = ja_alloc(&r->ar, sizeof(jdict));
    return v;
}

static bool key_eq(jval k, const char *s, size_t n) {
    return k.t == JT_STR && k.u.s.n == n && !memcmp(k.u.s.s, s, n);
}

void jd_set(jrender *r, jdict *d, jval k, jval v) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], k)) {
            d->v[i] = v;
            return;
        }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        jval *nk = ja_alloc(&r->ar, sizeof(jval) * nc), *nv = ja_alloc(&r->ar, sizeof(jval) * nc);
        if (d->n) {
            memcpy(nk, d->k, sizeof(jval) * d->n);
            memcpy(nv, d->v, sizeof(jval) * d->n);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

jval jd_get(const jdict *d, const char *k, size_t n, bool *found) {
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k, n)) {
            if (found) *found = true;
            return d->v[i];
        }
    if (found) *found = false;
    return jv_undef(NULL);
}

jval jv_from_json(jrender *r, const void *p) {
    const cJSON *j = p;
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        // JSON has one number type; Python's json.loads makes integers of
        // those written without a fraction or exponent. cJSON keeps no
        // spelling, so integral values within 2^53 become ints.
        if (d == floor(d) && fabs(d) < 9007199254740992.0) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j)) return jv_strz(r, j->valuestring);
    if (cJSON_IsArray(j)) {
        jval v = jv_list(r, (size_t)cJSON_GetArraySize(j));
        size_t i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, j) v.u.l->v[i++] = jv_from_json(r, it);
        return v;
    }
    if (cJSON_IsObject(j)) {
        jval v = jv_dict(r);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) jd_set(r, v.u.d, jv_strz(r, it->string), jv_from_json(r, it));
        return v;
    }
    return jv_none();
}

// --- predicates ---------------------------------------------------------------------

bool jv_truthy(jval v) {
    switch (v.t) {
    case JT_UNDEF: case JT_NONE: return false;
    case JT_BOOL: return v.u.b;
    case JT_INT: return v.u.i != 0;
    case JT_FLOAT: return v.u.f != 0;
    case JT_STR: return v.u.s.n > 0;
    case JT_LIST: return v.u.l->n > 0;
    case JT_DICT: return v.u.d->n > 0;
    default: return true;
    }
}

bool jv_is_num(jval v) { return v.t == JT_INT || v.t == JT_FLOAT || v.t == JT_BOOL; }

double jv_num(jval v) {
    if (v.t == JT_INT) return (double)v.u.i;
    if (v.t == JT_FLOAT) return v.u.f;
    if (v.t == JT_BOOL) return v.u.b;
    return 0;
}

bool jv_equal(jval a, jval b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) {
            int64_t x = a.t == JT_BOOL ? a.u.b : a.u.i, y = b.t == JT_BOOL ? b.u.b : b.u.i;
            return x == y;
        }
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JT_UNDEF: case JT_NONE: return true;
    case JT_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.s, b.u.s.s, a.u.s.n);
    case JT_LIST:
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case JT_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            bool found = false;
            for (size_t k = 0; k < b.u.d->n && !found; k++)
                if (jv_equal(a.u.d->k[i], b.u.d->k[k])) {
                    if (!jv_equal(a.u.d->v[i], b.u.d->v[k])) return false;
                    found = true;
                }
            if (!found) return false;
        }
        return true;
    case JT_NS: return a.u.d == b.u.d;
    case JT_MACRO: return a.u.macro == b.u.macro;
    case JT_FUNC: return a.u.func == b.u.func;
    case JT_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

const char *jv_type_name(jval v) {
    switch (v.t) {
    case JT_UNDEF: return "undefined";
    case JT_NONE: return "none";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "string";
    case JT_LIST: return "list";
    case JT_DICT: return "dict";
    case JT_NS: return "namespace";
    case JT_MACRO: return "macro";
    case JT_FUNC: return "function";
    case JT_LOOP: return "loop";
    }
    return "?";
}

// --- UTF-8 --------------------------------------------------------------------------

size_t utf8_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t utf8_offset(const char *s, size_t n, size_t cp) {
    size_t c = 0, i = 0;
    for (; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == cp) return i;
            c++;
        }
    }
    return n;
}

// --- str / repr -----------------------------------------------------------------------

// Python's float repr: the shortest digits that read back the same, in
// fixed notation for exponents in [-4, 16), else d.ddde+XX.
void jfloat_repr(double f, char *out, size_t cap) {
    if (isnan(f)) { snprintf(out, cap, "nan"); return; }
    if (isinf(f)) { snprintf(out, cap, f > 0 ? "inf" : "-inf"); return; }
    char buf[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    // buf: [-]d[.ddd]e[+-]XX
    char digits[24];
    int nd = 0, exp10;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char *w = out;
    size_t left = cap;
#define PUT(c) do { if (left > 1) { *w++ = (c); left--; } } while (0)
    if (neg) PUT('-');
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            PUT('0');
            PUT('.');
            for (int i = 0; i < -exp10 - 1; i++) PUT('0');
            for (int i = 0; i < nd; i++) PUT(digits[i]);
        } else {
            for (int i = 0; i <= exp10; i++) PUT(i < nd ? digits[i] : '0');
            PUT('.');
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++) PUT(digits[i]);
            else
                PUT('0');
        }
        *w = 0;
    } else {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (int i = 1; i < nd; i++) PUT(digits[i]);
        }
        *w = 0;
        size_t used = (size_t)(w - out);
        snprintf(w, cap - used, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
#undef PUT
}

static void repr_str(jrender *r, jbuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jb_addc(r, b, q);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char hex[8];
        if (c == '\\') esc = "\\\\";
        else if (c == (unsigned char)q) esc = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(hex, sizeof hex, "\\x%02x", c);
            esc = hex;
        }
        if (!esc) continue;
        jb_add(r, b, s + run, i - run);
        jb_addz(r, b, esc);
        run = i + 1;
    }
    jb_add(r, b, s + run, n - run);
    jb_addc(r, b, q);
}

void jv_repr_into(jrender *r, jbuf *b, jval v) {
    if (v.t == JT_STR) repr_str(r, b, v.u.s.s, v.u.s.n);
    else jv_str_into(r, b, v);
}

void jv_str_into(jrender *r, jbuf *b, jval v) {
    char num[48];
    jr_step(r);
    switch (v.t) {
    case JT_UNDEF: return;
    case JT_NONE: jb_addz(r, b, "None"); return;
    case JT_BOOL: jb_addz(r, b, v.u.b ? "True" : "False"); return;
    case JT_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); jb_addz(r, b, num); return;
    case JT_FLOAT: jfloat_repr(v.u.f, num, sizeof num); jb_addz(r, b, num); return;
    case JT_STR: jb_add(r, b, v.u.s.s, v.u.s.n); return;
    case JT_LIST:
        jb_addc(r, b, v.u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jb_addz(r, b, ", ");
            jv_repr_into(r, b, v.u.l->v[i]);
        }
        if (v.u.l->tuple && v.u.l->n == 1) jb_addc(r, b, ',');
        jb_addc(r, b, v.u.l->tuple ? ')' : ']');
        return;
    case JT_DICT: case JT_NS:
        if (v.t == JT_NS) jb_addz(r, b, "<Namespace ");
        jb_addc(r, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) jb_addz(r, b, ", ");
            jv_repr_into(r, b, v.u.d->k[i]);
            jb_addz(r, b, ": ");
            jv_repr_into(r, b, v.u.d->v[i]);
        }
        jb_addc(r, b, '}');
        if (v.t == JT_NS) jb_addc(r, b, '>');
        return;
    case JT_MACRO: jb_addz(r, b, "<Macro>"); return;
    case JT_FUNC: jb_addz(r, b, "<function>"); return;
    case JT_LOOP: jb_addz(r, b, "<LoopContext>"); return;
    }
}

jval jv_to_string(jrender *r, jval v) {
    if (v.t == JT_STR) return v;
    jbuf b = {0};
    jv_str_into(r, &b, v);
    return jb_to_str(r, &b);
}

// --- json.dumps -----------------------------------------------------------------------

static void json_str(jrender *r, jbuf *b, const char *s, size_t n) {
    jb_addc(r, b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"') strcpy(esc, "\\\"");
        else if (c == '\\') strcpy(esc, "\\\\");
        else if (c == '\n') strcpy(esc, "\\n");
        else if (c == '\r') strcpy(esc, "\\r");
        else if (c == '\t') strcpy(esc, "\\t");
        else if (c == '\b') strcpy(esc, "\\b");
        else if (c == '\f') strcpy(esc, "\\f");
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        else continue;
        jb_add(r, b, s + run, i - run);
        jb_addz(r, b, esc);
        run = i + 1;
    }
    jb_add(r, b, s + run, n - run);
    jb_addc(r, b, '"');
}

static void newline_indent(jrender *r, jbuf *b, const char *indent, int level) {
    jb_addc(r, b, '\n');
    for (int i = 0; i < level; i++) jb_addz(r, b, indent);
}

static int key_cmp(const void *x, const void *y) {
    const jval *a = *(const jval *const *)x, *c = *(const jval *const *)y;
    if (a->t == JT_STR && c->t == JT_STR) {
        size_t n = a->u.s.n < c->u.s.n ? a->u.s.n : c->u.s.n;
        int k = memcmp(a->u.s.s, c->u.s.s, n);
        return k ? k : (a->u.s.n > c->u.s.n) - (a->u.s.n < c->u.s.n);
    }
    return jv_num(*a) < jv_num(*c) ? -1 : jv_num(*a) > jv_num(*c);
}

void jv_json_into(jrender *r, jbuf *b, jval v, const char *indent, const char *item_sep,
                  const char *key_sep, bool sort_keys, int level) {
    jr_step(r);
    if (level > 500) jr_fail(r, "tojson: value nested too deeply");
    if (!item_sep) item_sep = indent ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    char num[48];
    switch (v.t) {
    case JT_NONE: jb_addz(r, b, "null"); return;
    case JT_BOOL: jb_addz(r, b, v.u.b ? "true" : "false"); return;
    case JT_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); jb_addz(r, b, num); return;
    case JT_FLOAT:
        if (isnan(v.u.f)) jb_addz(r, b, "NaN");
        else if (isinf(v.u.f)) jb_addz(r, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        else { jfloat_repr(v.u.f, num, sizeof num); jb_addz(r, b, num); }
        return;
    case JT_STR: json_str(r, b, v.u.s.s, v.u.s.n); return;
    case JT_LIST:
        if (!v.u.l->n) { jb_addz(r, b, "[]"); return; }
        jb_addc(r, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jb_addz(r, b, item_sep);
            if (indent) newline_indent(r, b, indent, level + 1);
            jv_json_into(r, b, v.u.l->v[i], indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent) newline_indent(r, b, indent, level);
        jb_addc(r, b, ']');
        return;
    case JT_DICT: {
        jdict *d = v.u.d;
        if (!d->n) { jb_addz(r, b, "{}"); return; }
        size_t *order = ja_alloc(&r->ar, sizeof(size_t) * d->n);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (sort_keys) {
            const jval **ks = ja_alloc(&r->ar, sizeof(jval *) * d->n);
            for (size_t i = 0; i < d->n; i++) ks[i] = &d->k[i];
            qsort(ks, d->n, sizeof *ks, key_cmp);
            for (size_t i = 0; i < d->n; i++) order[i] = (size_t)(ks[i] - d->k);
        }
        jb_addc(r, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            jval k = d->k[order[i]];
            if (i) jb_addz(r, b, item_sep);
            if (indent) newline_indent(r, b, indent, level + 1);
            if (k.t == JT_STR) {
                json_str(r, b, k.u.s.s, k.u.s.n);
            } else {  // Python's json turns int, float, bool and None keys into strings
                jbuf kb = {0};
                if (k.t == JT_BOOL) jb_addz(r, &kb, k.u.b ? "true" : "false");
                else if (k.t == JT_NONE) jb_addz(r, &kb, "null");
                else jv_str_into(r, &kb, k);
                json_str(r, b, kb.p ? kb.p : "", kb.len);
            }
            jb_addz(r, b, key_sep);
            jv_json_into(r, b, d->v[order[i]], indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent) newline_indent(r, b, indent, level);
        jb_addc(r, b, '}');
        return;
    }
    default:
        jr_fail(r, "Object of type %s is not JSON serializable",
                v.t == JT_UNDEF ? "Undefined" : jv_type_name(v));
    }
}
