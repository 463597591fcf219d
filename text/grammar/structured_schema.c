// text/grammar/structured_schema.c - JSON Schema, "any JSON object" and choice
// lists into GBNF.
//
// Output is compact JSON: one optional space after ':' and ',' (and inside
// brackets), never newlines, so a model cannot stall in whitespace.
// Properties come in the schema's order; optional ones may be left out.
// Numbers are at most 16 integer and 16 fraction digits. Ranges
// (minimum/maximum, exclusive forms) are met exactly for integers; for
// numbers the bounds are rounded inward to integers and fractions are kept
// strictly inside, so every output validates (some valid values near a
// non-integral bound cannot be produced). Supported keywords: type (also
// lists), properties, required, additionalProperties (absent = false, as
// OpenAI's strict mode), items, minItems, maxItems, enum, const, anyOf,
// oneOf (as anyOf), allOf of one schema, $ref into the same document
// ($defs, definitions, "#"), pattern, minLength, maxLength, format (date,
// time, date-time, uuid, email), minimum, maximum, exclusiveMinimum,
// exclusiveMaximum, nullable; annotations are ignored. Anything else that
// constrains values is refused by name (PG_EUNSUPP).
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_int.h"

// --- shared JSON rules -----------------------------------------------------------

void sg_json_value_rules(sg_buf *o) {
    sg_puts(o,
            "json-ws ::= [ ]?\n"
            "json-sep ::= \",\" json-ws\n"
            "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" json-hex4)\n"
            // \\u escapes of lone surrogates are refused by strict parsers
            "json-hex4 ::= [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}\n"
            "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
            "json-uint ::= \"0\" | [1-9] [0-9]{0,15}\n"
            "json-int ::= \"-\"? json-uint\n"
            "json-frac ::= \".\" [0-9]{1,16}\n"
            "json-number ::= json-int json-frac? ([eE] [-+]? [0-9]{1,3})?\n"
            "json-bool ::= \"true\" | \"false\"\n"
            "json-null ::= \"null\"\n"
            "json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null\n"
            "json-member ::= json-string json-ws \":\" json-ws json-value\n"
            "json-object ::= \"{\" json-ws (json-member (json-ws json-sep json-member)*)? json-ws \"}\"\n"
            "json-array ::= \"[\" json-ws (json-value (json-ws json-sep json-value)*)? json-ws \"]\"\n");
}

void sg_json_object_gbnf(sg_buf *o) {
    sg_puts(o, "root ::= json-object\n");
    sg_json_value_rules(o);
}

int sg_choice_to_gbnf(const char *json, size_t len, sg_buf *o, char *err, size_t err_cap) {
    cJSON *a = cJSON_ParseWithLength(json, len);
    int rc = 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0) {
        snprintf(err, err_cap, "the choices must be a non-empty list of strings");
        rc = PG_EINVAL;
        goto out;
    }
    sg_puts(o, "root ::= ");
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsString(it)) {
            snprintf(err, err_cap, "choice %d is not a string", i);
            rc = PG_EINVAL;
            goto out;
        }
        if (i++) sg_puts(o, " | ");
        sg_put_literal(o, it->valuestring, strlen(it->valuestring));
    }
    sg_puts(o, "\n");
out:
    cJSON_Delete(a);
    return rc;
}

// --- schema compiler state -------------------------------------------------------

typedef struct sc {
    sg_buf *rules;           // rules emitted so far
    const cJSON *doc;        // the whole schema, for $ref
    const pg_grammar_limits *lim;
    char *err;
    size_t err_cap;
    int rc;
    int depth;
    int n_rules;
    // $ref targets compiled so far: pointer -> rule number
    const char **ref_ptr;
    int *ref_rule;
    int n_refs, cap_refs;
} sc;

static int sc_fail(sc *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sc_fail(sc *c, int code, const char *fmt, ...) {
    if (c->rc) return c->rc;
    va_list ap;
    va_start(ap, fmt);
    if (c->err_cap) vsnprintf(c->err, c->err_cap, fmt, ap);
    va_end(ap);
    c->rc = code;
    return code;
}

static int gen(sc *c, const cJSON *s, sg_buf *e);

// A new rule "sN ::= <body>" (body produced by the caller into `body`).
static int new_rule(sc *c) { return c->n_rules++; }

static void put_rule(sc *c, int id, const sg_buf *body) {
    sg_printf(c->rules, "s%d ::= ", id);
    sg_putn(c->rules, body->p ? body->p : "\"\"", body->p ? body->len : 2);
    sg_puts(c->rules, "\n");
}

static const cJSON *kw(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k); }

// A JSON value's compact text as a GBNF literal.
static void put_json_literal(sg_buf *e, const cJSON *v) {
    char *t = cJSON_PrintUnformatted(v);
    sg_put_literal(e, t, strlen(t));
    free(t);
}

// --- integers --------------------------------------------------------------------

#define DIGITS_MAX 16
#define UNBOUNDED INT64_MAX

// Digits of lo..hi (same length n, lo <= hi), as a GBNF expression.
static void range_same_len(sg_buf *e, const char *lo, const char *hi, int n) {
    if (n == 0) {
        sg_puts(e, "\"\"");
        return;
    }
    if (lo[0] == hi[0]) {
        sg_printf(e, "\"%c\" ", lo[0]);
        range_same_len(e, lo + 1, hi + 1, n - 1);
        return;
    }
    bool lo0 = true, hi9 = true;
    for (int i = 1; i < n; i++) {
        lo0 &= lo[i] == '0';
        hi9 &= hi[i] == '9';
    }
    char nines[DIGITS_MAX + 2], zeros[DIGITS_MAX + 2];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    char a = lo[0], b = hi[0];
    int k = 0;
    sg_puts(e, "(");
    if (!lo0) {
        sg_printf(e, "\"%c\" (", lo[0]);
        range_same_len(e, lo + 1, nines, n - 1);
        sg_puts(e, ")");
        a++;
        k++;
    }
    if (a <= (hi9 ? b : b - 1)) {
        if (k++) sg_puts(e, " | ");
        sg_printf(e, "[%c-%c]", a, hi9 ? b : b - 1);
        if (n > 1) sg_printf(e, " [0-9]{%d}", n - 1);
    }
    if (!hi9) {
        if (k++) sg_puts(e, " | ");
        sg_printf(e, "\"%c\" (", hi[0]);
        range_same_len(e, zeros, hi + 1, n - 1);
        sg_puts(e, ")");
    }
    sg_puts(e, ")");
}

// A non-negative integer in [lo, hi] (hi may be UNBOUNDED: up to 16 digits).
static void uint_range(sg_buf *e, int64_t lo, int64_t hi) {
    char los[24], his[24];
    int nlo = snprintf(los, sizeof los, "%lld", (long long)lo);
    int nhi = hi == UNBOUNDED ? DIGITS_MAX : snprintf(his, sizeof his, "%lld", (long long)hi);
    sg_puts(e, "(");
    for (int L = nlo; L <= nhi; L++) {
        char a[24], b[24];
        if (L == nlo)
            memcpy(a, los, (size_t)L + 1);
        else {
            a[0] = '1';
            memset(a + 1, '0', (size_t)L - 1);
            a[L] = 0;
        }
        if (L == nhi && hi != UNBOUNDED)
            memcpy(b, his, (size_t)L + 1);
        else {
            memset(b, '9', (size_t)L);
            b[L] = 0;
        }
        if (L > nlo) sg_puts(e, " | ");
        range_same_len(e, a, b, L);
    }
    sg_puts(e, ")");
}

// An integer in [lo, hi]; -UNBOUNDED / UNBOUNDED for open ends.
static void int_range(sg_buf *e, int64_t lo, int64_t hi) {
    if (lo >= 0) {
        uint_range(e, lo, hi);
    } else if (hi != UNBOUNDED && hi < 0) {
        sg_puts(e, "\"-\" ");
        uint_range(e, -hi, lo == -UNBOUNDED ? UNBOUNDED : -lo);
    } else {
        sg_puts(e, "(");
        uint_range(e, 0, hi);
        sg_puts(e, " | \"-\" ");
        uint_range(e, 1, lo == -UNBOUNDED ? UNBOUNDED : -lo);
        sg_puts(e, ")");
    }
}

// Reads minimum/maximum and the exclusive forms (draft 4 booleans or
// draft 6+ numbers) as integer bounds rounded inward.
static int read_bounds(sc *c, const cJSON *s, int64_t *lo, int64_t *hi) {
    const double LIM = 1e15;
    double l = -INFINITY, h = INFINITY;
    const cJSON *mn = kw(s, "minimum"), *mx = kw(s, "maximum");
    const cJSON *xmn = kw(s, "exclusiveMinimum"), *xmx = kw(s, "exclusiveMaximum");
    bool xl = false, xh = false;
    if (mn) {
        if (!cJSON_IsNumber(mn)) return sc_fail(c, PG_EINVAL, "minimum must be a number");
        l = mn->valuedouble;
    }
    if (mx) {
        if (!cJSON_IsNumber(mx)) return sc_fail(c, PG_EINVAL, "maximum must be a number");
        h = mx->valuedouble;
    }
    if (cJSON_IsBool(xmn)) xl = cJSON_IsTrue(xmn);
    else if (cJSON_IsNumber(xmn)) { if (xmn->valuedouble >= l) { l = xmn->valuedouble; xl = true; } }
    else if (xmn) return sc_fail(c, PG_EINVAL, "exclusiveMinimum must be a number");
    if (cJSON_IsBool(xmx)) xh = cJSON_IsTrue(xmx);
    else if (cJSON_IsNumber(xmx)) { if (xmx->valuedouble <= h) { h = xmx->valuedouble; xh = true; } }
    else if (xmx) return sc_fail(c, PG_EINVAL, "exclusiveMaximum must be a number");
    double il = isinf(l) ? l : (xl ? floor(l) + 1 : ceil(l));
    double ih = isinf(h) ? h : (xh ? ceil(h) - 1 : floor(h));
    if (il > ih) return sc_fail(c, PG_EUNSUPP, "the range [%g, %g] holds no integer this compiler can produce", l, h);
    // An end past +-1e15 on the wrong side (a minimum above it, a maximum
    // below minus it) has no int64 to stand for it (the fuzzer's maximum of
    // -1e300 became INT64_MIN, whose negation overflows in gen_number).
    if (il > LIM || ih < -LIM)
        return sc_fail(c, PG_EUNSUPP, "the range [%g, %g] lies beyond the +-1e15 this compiler produces", l, h);
    *lo = il < -LIM ? -UNBOUNDED : (int64_t)il;
    *hi = ih > LIM ? UNBOUNDED : (int64_t)ih;
    return 0;
}

static int gen_integer(sc *c, const cJSON *s, sg_buf *e) {
    int64_t lo, hi;
    PG_TRY(read_bounds(c, s, &lo, &hi));
    if (lo == -UNBOUNDED && hi == UNBOUNDED) {
        sg_puts(e, "json-int");
        return 0;
    }
    int_range(e, lo, hi);
    return 0;
}

// A number in [lo, hi] (integers, open ends allowed): integer part and an
// optional fraction, kept strictly inside the bounds.
static int gen_number(sc *c, const cJSON *s, sg_buf *e) {
    int64_t lo, hi;
    PG_TRY(read_bounds(c, s, &lo, &hi));
    if (lo == -UNBOUNDED && hi == UNBOUNDED) {
        sg_puts(e, "json-number");
        return 0;
    }
    sg_puts(e, "(");
    int k = 0;
    if (hi == UNBOUNDED || hi >= 0) {  // the non-negative part [a, hi]
        int64_t a = lo < 0 ? 0 : lo;
        if (hi == UNBOUNDED) {
            uint_range(e, a, UNBOUNDED);
            sg_puts(e, " json-frac?");
        } else {
            if (a < hi) {
                uint_range(e, a, hi - 1);
                sg_puts(e, " json-frac? | ");
            }
            uint_range(e, hi, hi);
        }
        k++;
    }
    if (lo < 0) {  // the negative part [lo, min(hi, 0)]
        int64_t cmax = hi == UNBOUNDED || hi > 0 ? 0 : hi;  // magnitudes >= -cmax
        if (k++) sg_puts(e, " | ");
        if (lo == -UNBOUNDED) {
            sg_puts(e, "\"-\" ");
            uint_range(e, -cmax, UNBOUNDED);
            sg_puts(e, " json-frac?");
        } else {
            if (-cmax <= -lo - 1) {
                sg_puts(e, "\"-\" ");
                uint_range(e, -cmax, -lo - 1);
                sg_puts(e, " json-frac? | ");
            }
            sg_puts(e, "\"-\" ");
            uint_range(e, -lo, -lo);
        }
    }
    sg_puts(e, ")");
    return 0;
}

// --- strings -----------------------------------------------------------------------

// minLength / maxLength / minItems / maxItems: a non-negative integer up to
// the repetition cap (checked as a double, before any conversion).
static int get_count(sc *c, const cJSON *v, const char *name, int64_t *out) {
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble != floor(v->valuedouble))
        return sc_fail(c, PG_EINVAL, "%s must be a non-negative integer", name);
    if (v->valuedouble > c->lim->max_repeat)
        return sc_fail(c, PG_EUNSUPP, "%s above %d is not supported", name, c->lim->max_repeat);
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int gen_string(sc *c, const cJSON *s, sg_buf *e) {
    const cJSON *pat = kw(s, "pattern"), *fmt = kw(s, "format");
    const cJSON *mnl = kw(s, "minLength"), *mxl = kw(s, "maxLength");
    if (pat) {
        if (!cJSON_IsString(pat)) return sc_fail(c, PG_EINVAL, "pattern must be a string");
        if (mnl || mxl) return sc_fail(c, PG_EUNSUPP, "pattern with minLength/maxLength is not supported");
        sg_puts(e, "\"\\\"\" ");
        char msg[200];
        int rc = sg_regex_to_gbnf(pat->valuestring, strlen(pat->valuestring), true, c->lim, e, msg,
                                  sizeof msg);
        if (rc < 0) return sc_fail(c, rc, "pattern '%.80s': %s", pat->valuestring, msg);
        sg_puts(e, " \"\\\"\"");
        return 0;
    }
    if (fmt && cJSON_IsString(fmt)) {
        static const char *date = "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])";
        static const char *time = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
        const char *f = fmt->valuestring;
        if (!strcmp(f, "date")) {
            sg_printf(e, "\"\\\"\" %s \"\\\"\"", date);
            return 0;
        }
        if (!strcmp(f, "time")) {
            sg_printf(e, "\"\\\"\" %s \"\\\"\"", time);
            return 0;
        }
        if (!strcmp(f, "date-time")) {
            sg_printf(e, "\"\\\"\" %s \"T\" %s \"\\\"\"", date, time);
            return 0;
        }
        if (!strcmp(f, "uuid")) {
            sg_puts(e, "\"\\\"\" [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12} \"\\\"\"");
            return 0;
        }
        if (!strcmp(f, "email")) {
            sg_puts(e, "\"\\\"\" [a-zA-Z0-9._%+-]{1,64} \"@\" [a-zA-Z0-9-]{1,63} (\".\" [a-zA-Z0-9-]{1,63}){1,4} \"\\\"\"");
            return 0;
        }
        // Other formats are annotations unless a validator opts in.
    }
    int64_t mn = 0, mx = -1;
    PG_TRY(get_count(c, mnl, "minLength", &mn));
    PG_TRY(get_count(c, mxl, "maxLength", &mx));
    if (mx >= 0 && mx < mn) return sc_fail(c, PG_EINVAL, "maxLength is below minLength");
    if (!mnl && !mxl) {
        sg_puts(e, "json-string");
    } else if (mx < 0) {
        sg_printf(e, "\"\\\"\" json-char{%lld,} \"\\\"\"", (long long)mn);
    } else {
        sg_printf(e, "\"\\\"\" json-char{%lld,%lld} \"\\\"\"", (long long)mn, (long long)mx);
    }
    return 0;
}

// --- arrays and objects ------------------------------------------------------------

static int gen_array(sc *c, const cJSON *s, sg_buf *e) {
    const cJSON *items = kw(s, "items");
    const cJSON *mni = kw(s, "minItems"), *mxi = kw(s, "maxItems");
    if (kw(s, "prefixItems")) return sc_fail(c, PG_EUNSUPP, "prefixItems is not supported");
    if (kw(s, "contains")) return sc_fail(c, PG_EUNSUPP, "contains is not supported");
    int64_t mn = 0, mx = -1;
    PG_TRY(get_count(c, mni, "minItems", &mn));
    PG_TRY(get_count(c, mxi, "maxItems", &mx));
    if (mx >= 0 && mx < mn) return sc_fail(c, PG_EINVAL, "maxItems is below minItems");
    sg_buf item = {0};
    int id = new_rule(c);
    if (items && !(cJSON_IsBool(items) && cJSON_IsTrue(items))) {
        if (gen(c, items, &item) < 0) {
            sg_free(&item);
            return c->rc;
        }
    } else {
        sg_puts(&item, "json-value");
    }
    // sN-i ::= item
    sg_printf(c->rules, "s%d-i ::= ", id);
    sg_putn(c->rules, item.p, item.len);
    sg_puts(c->rules, "\n");
    sg_free(&item);
    sg_buf body = {0};
    sg_puts(&body, "\"[\" json-ws ");
    if (mx == 0) {
        // empty only
    } else if (mn == 0) {
        sg_printf(&body, "(s%d-i (json-ws json-sep s%d-i)", id, id);
        if (mx < 0) sg_puts(&body, "*");
        else sg_printf(&body, "{0,%lld}", (long long)mx - 1);
        sg_puts(&body, ")?");
    } else {
        sg_printf(&body, "s%d-i (json-ws json-sep s%d-i)", id, id);
        if (mx < 0) sg_printf(&body, "{%lld,}", (long long)mn - 1);
        else sg_printf(&body, "{%lld,%lld}", (long long)mn - 1, (long long)mx - 1);
    }
    sg_puts(&body, " json-ws \"]\"");
    put_rule(c, id, &body);
    sg_free(&body);
    sg_printf(e, "s%d", id);
    return 0;
}

static int gen_object(sc *c, const cJSON *s, sg_buf *e) {
    static const char *unsupported[] = {"patternProperties", "propertyNames", "minProperties",
                                        "maxProperties", "dependentRequired", "dependentSchemas",
                                        "dependencies", "unevaluatedProperties", NULL};
    for (int i = 0; unsupported[i]; i++)
        if (kw(s, unsupported[i])) return sc_fail(c, PG_EUNSUPP, "%s is not supported", unsupported[i]);
    const cJSON *props = kw(s, "properties"), *req = kw(s, "required"), *add = kw(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return sc_fail(c, PG_EINVAL, "properties must be an object");
    if (req && !cJSON_IsArray(req)) return sc_fail(c, PG_EINVAL, "required must be a list");
    int n = props ? cJSON_GetArraySize(props) : 0;
    const cJSON *it;
    if (req) {
        cJSON_ArrayForEach(it, req) {
            if (!cJSON_IsString(it)) return sc_fail(c, PG_EINVAL, "required must list strings");
            if (!props || !kw(props, it->valuestring))
                return sc_fail(c, PG_EUNSUPP, "required property '%.64s' is not in properties",
                               it->valuestring);
        }
    }
    // additionalProperties: absent or false = none, true = any value, a schema = that.
    bool extra = false;
    int id = new_rule(c);
    if (add && !cJSON_IsBool(add)) {
        sg_buf v = {0};
        if (gen(c, add, &v) < 0) {
            sg_free(&v);
            return c->rc;
        }
        sg_printf(c->rules, "s%d-x ::= json-string json-ws \":\" json-ws ", id);
        sg_putn(c->rules, v.p, v.len);
        sg_puts(c->rules, "\n");
        sg_free(&v);
        extra = true;
    } else if (cJSON_IsTrue(add)) {
        sg_printf(c->rules, "s%d-x ::= json-member\n", id);
        extra = true;
    }
    // One rule per property: sN-kI ::= "\"name\"" ws ":" ws value
    bool *required = pg_xcalloc((size_t)n + 1, 1);
    int i = 0, first_req = -1;
    cJSON_ArrayForEach(it, props) {
        if (req) {
            const cJSON *r;
            cJSON_ArrayForEach(r, req) if (!strcmp(r->valuestring, it->string)) required[i] = true;
        }
        if (required[i] && first_req < 0) first_req = i;
        sg_buf v = {0};
        if (gen(c, it, &v) < 0) {
            sg_free(&v);
            free(required);
            return c->rc;
        }
        cJSON *name = cJSON_CreateString(it->string);
        sg_printf(c->rules, "s%d-k%d ::= ", id, i);
        put_json_literal(c->rules, name);
        cJSON_Delete(name);
        sg_puts(c->rules, " json-ws \":\" json-ws ");
        sg_putn(c->rules, v.p, v.len);
        sg_puts(c->rules, "\n");
        sg_free(&v);
        i++;
    }
    // sN-aK: what may follow once property K (or an earlier one) was written.
    for (int k = 0; k < n; k++) {
        sg_printf(c->rules, "s%d-a%d ::= ", id, k);
        if (k + 1 < n) {
            if (required[k + 1])
                sg_printf(c->rules, "json-ws json-sep s%d-k%d s%d-a%d\n", id, k + 1, id, k + 1);
            else
                sg_printf(c->rules, "(json-ws json-sep s%d-k%d)? s%d-a%d\n", id, k + 1, id, k + 1);
        } else if (extra) {
            sg_printf(c->rules, "(json-ws json-sep s%d-x)*\n", id);
        } else {
            sg_puts(c->rules, "\"\"\n");
        }
    }
    sg_buf body = {0};
    sg_puts(&body, "\"{\" json-ws (");
    int last = first_req >= 0 ? first_req : n - 1, alts = 0;
    for (int j = 0; j <= last; j++) sg_printf(&body, "%ss%d-k%d s%d-a%d", alts++ ? " | " : "", id, j, id, j);
    if (first_req < 0) {
        if (extra) sg_printf(&body, "%ss%d-x (json-ws json-sep s%d-x)*", alts++ ? " | " : "", id, id);
        sg_printf(&body, "%s\"\"", alts++ ? " | " : "");
    }
    sg_puts(&body, ") json-ws \"}\"");
    put_rule(c, id, &body);
    sg_free(&body);
    free(required);
    sg_printf(e, "s%d", id);
    return 0;
}

// --- references --------------------------------------------------------------------

static const cJSON *resolve_ref(const cJSON *doc, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *cur = doc;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') {
                tok[n++] = '~';
                p += 2;
            } else if (p[0] == '~' && p[1] == '1') {
                tok[n++] = '/';
                p += 2;
            } else {
                tok[n++] = *p++;
            }
        }
        tok[n] = 0;
        if (cJSON_IsArray(cur)) {
            char *endp;
            long idx = strtol(tok, &endp, 10);
            cur = *endp ? NULL : cJSON_GetArrayItem(cur, (int)idx);
        } else {
            cur = cJSON_IsObject(cur) ? cJSON_GetObjectItemCaseSensitive(cur, tok) : NULL;
        }
        if (!cur) return NULL;
    }
    return *p ? NULL : cur;
}

static int gen_ref(sc *c, const char *ref, sg_buf *e) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->ref_ptr[i], ref)) {
            sg_printf(e, "s%d", c->ref_rule[i]);
            return 0;
        }
    const cJSON *target = resolve_ref(c->doc, ref);
    if (!target) return sc_fail(c, PG_EINVAL, "$ref '%.100s' does not resolve in this schema", ref);
    int id = new_rule(c);
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? c->cap_refs * 2 : 8;
        c->ref_ptr = pg_xrealloc(c->ref_ptr, sizeof(char *) * (size_t)c->cap_refs);
        c->ref_rule = pg_xrealloc(c->ref_rule, sizeof(int) * (size_t)c->cap_refs);
    }
    c->ref_ptr[c->n_refs] = ref;  // points into c->doc, which outlives compilation
    c->ref_rule[c->n_refs++] = id;
    sg_buf body = {0};
    if (gen(c, target, &body) < 0) {
        sg_free(&body);
        return c->rc;
    }
    put_rule(c, id, &body);
    sg_free(&body);
    sg_printf(e, "s%d", id);
    return 0;
}

// --- dispatch ----------------------------------------------------------------------

static int gen_type(sc *c, const cJSON *s, const char *t, sg_buf *e) {
    if (!strcmp(t, "string")) return gen_string(c, s, e);
    if (!strcmp(t, "integer")) return gen_integer(c, s, e);
    if (!strcmp(t, "number")) return gen_number(c, s, e);
    if (!strcmp(t, "boolean")) {
        sg_puts(e, "json-bool");
        return 0;
    }
    if (!strcmp(t, "null")) {
        sg_puts(e, "json-null");
        return 0;
    }
    if (!strcmp(t, "object")) return gen_object(c, s, e);
    if (!strcmp(t, "array")) return gen_array(c, s, e);
    return sc_fail(c, PG_EINVAL, "unknown type '%.32s'", t);
}

static int gen_alts(sc *c, const cJSON *list, const char *name, sg_buf *e) {
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
        return sc_fail(c, PG_EINVAL, "%s must be a non-empty list of schemas", name);
    sg_puts(e, "(");
    const cJSON *it;
    int k = 0;
    cJSON_ArrayForEach(it, list) {
        if (k++) sg_puts(e, " | ");
        PG_TRY(gen(c, it, e));
    }
    sg_puts(e, ")");
    return 0;
}

static int gen_inner(sc *c, const cJSON *s, sg_buf *e) {
    if (cJSON_IsBool(s)) {
        if (cJSON_IsFalse(s)) return sc_fail(c, PG_EINVAL, "the schema 'false' matches nothing");
        sg_puts(e, "json-value");
        return 0;
    }
    if (!cJSON_IsObject(s)) return sc_fail(c, PG_EINVAL, "a schema must be an object or a boolean");
    static const char *unsupported[] = {"not", "if", "then", "else", "multipleOf",
                                        "uniqueItems", "$dynamicRef", NULL};
    for (int i = 0; unsupported[i]; i++) {
        const cJSON *u = kw(s, unsupported[i]);
        if (u && !(cJSON_IsFalse(u)))
            return sc_fail(c, PG_EUNSUPP, "%s is not supported", unsupported[i]);
    }
    const cJSON *ref = kw(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return sc_fail(c, PG_EINVAL, "$ref must be a string");
        return gen_ref(c, ref->valuestring, e);
    }
    const cJSON *cst = kw(s, "const");
    if (cst) {
        put_json_literal(e, cst);
        return 0;
    }
    const cJSON *en = kw(s, "enum");
    if (en) {
        if (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0)
            return sc_fail(c, PG_EINVAL, "enum must be a non-empty list");
        sg_puts(e, "(");
        const cJSON *it;
        int k = 0;
        cJSON_ArrayForEach(it, en) {
            if (k++) sg_puts(e, " | ");
            put_json_literal(e, it);
        }
        sg_puts(e, ")");
        return 0;
    }
    const cJSON *any = kw(s, "anyOf");
    if (!any) any = kw(s, "oneOf");
    if (any) return gen_alts(c, any, "anyOf", e);
    const cJSON *all = kw(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1)
            return sc_fail(c, PG_EUNSUPP, "allOf is supported with exactly one schema");
        return gen(c, all->child, e);
    }
    const cJSON *type = kw(s, "type");
    bool nullable = cJSON_IsTrue(kw(s, "nullable"));
    if (cJSON_IsString(type)) {
        if (nullable) sg_puts(e, "(json-null | ");
        PG_TRY(gen_type(c, s, type->valuestring, e));
        if (nullable) sg_puts(e, ")");
        return 0;
    }
    if (cJSON_IsArray(type)) {
        if (cJSON_GetArraySize(type) == 0) return sc_fail(c, PG_EINVAL, "type must not be an empty list");
        sg_puts(e, "(");
        const cJSON *it;
        int k = 0;
        cJSON_ArrayForEach(it, type) {
            if (!cJSON_IsString(it)) return sc_fail(c, PG_EINVAL, "type must list strings");
            if (k++) sg_puts(e, " | ");
            PG_TRY(gen_type(c, s, it->valuestring, e));
        }
        sg_puts(e, ")");
        return 0;
    }
    if (type) return sc_fail(c, PG_EINVAL, "type must be a string or a list of strings");
    // No type: infer from the keywords present, else any value.
    if (kw(s, "properties") || kw(s, "required") || kw(s, "additionalProperties"))
        return gen_object(c, s, e);
    if (kw(s, "items") || kw(s, "minItems") || kw(s, "maxItems")) return gen_array(c, s, e);
    if (kw(s, "pattern") || kw(s, "minLength") || kw(s, "maxLength") || kw(s, "format"))
        return gen_string(c, s, e);
    if (kw(s, "minimum") || kw(s, "maximum") || kw(s, "exclusiveMinimum") || kw(s, "exclusiveMaximum"))
        return gen_number(c, s, e);
    sg_puts(e, "json-value");
    return 0;
}

static int gen(sc *c, const cJSON *s, sg_buf *e) {
    if (c->rc) return c->rc;
    if (++c->depth > c->lim->max_depth)
        return sc_fail(c, PG_EUNSUPP, "the schema nests deeper than %d", c->lim->max_depth);
    if (c->rules->overflow || e->overflow) return sc_fail(c, PG_EUNSUPP, "the schema's grammar is too large");
    int rc = gen_inner(c, s, e);
    c->depth--;
    return rc < 0 ? (c->rc ? c->rc : rc) : 0;
}

int sg_schema_to_gbnf(const char *json, size_t len, const pg_grammar_limits *lim, sg_buf *out,
                      char *err, size_t err_cap) {
    if (err_cap) err[0] = 0;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!doc) {
        snprintf(err, err_cap, "the schema is not valid JSON (near byte %d)",
                 end ? (int)(end - json) : 0);
        return PG_EINVAL;
    }
    sg_buf rules = {.limit = out->limit};
    sc c = {.rules = &rules, .doc = doc, .lim = lim, .err = err, .err_cap = err_cap};
    sg_buf root = {.limit = out->limit};
    int rc = gen(&c, doc, &root);
    if (!rc && (rules.overflow || root.overflow)) rc = sc_fail(&c, PG_EUNSUPP, "the schema's grammar is too large");
    if (!rc) {
        sg_puts(out, "root ::= ");
        sg_putn(out, root.p, root.len);
        sg_puts(out, "\n");
        if (rules.p) sg_putn(out, rules.p, rules.len);
        sg_json_value_rules(out);
    }
    sg_free(&rules);
    sg_free(&root);
    free(c.ref_ptr);
    free(c.ref_rule);
    cJSON_Delete(doc);
    return rc;
}
