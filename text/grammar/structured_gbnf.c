// text/grammar/structured_gbnf.c - GBNF text (llama.cpp's grammar format) into the
// rule IR of structured_int.h.
//
// Syntax: `name ::= alternatives`, one rule per line (a rule may continue
// over lines inside parentheses or after '|'); "literals" and [classes]
// with \x \u \U \n \r \t escapes, '.', groups, and the quantifiers * + ?
// {m} {m,} {m,n}; '#' comments. Quantifiers become helper rules (x* is
// `h ::= x h |`, a tail call, so repetition never grows parser stacks).
// Character classes are over code points and are split into UTF-8 byte
// sequences here, so the matcher works on bytes only.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_int.h"

// --- text buffer ---------------------------------------------------------------

static void buf_grow(sg_buf *b, size_t add) {
    if (b->limit && b->len + add > b->limit) {
        b->overflow = true;
        return;
    }
    if (b->len + add + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->len + add + 1) cap *= 2;
    b->p = pg_xrealloc(b->p, cap);
    b->cap = cap;
}

void sg_putn(sg_buf *b, const char *s, size_t n) {
    if (b->overflow || n == 0) return;
    buf_grow(b, n);
    if (b->overflow) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void sg_puts(sg_buf *b, const char *s) { sg_putn(b, s, strlen(s)); }

void sg_printf(sg_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        sg_putn(b, small, (size_t)n);
        return;
    }
    char *big = pg_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sg_putn(b, big, (size_t)n);
    free(big);
}

void sg_put_literal(sg_buf *b, const char *s, size_t n) {
    sg_putn(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sg_putn(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            sg_printf(b, "\\x%02X", c);
        } else {
            sg_putn(b, (const char *)&c, 1);
        }
    }
    sg_putn(b, "\"", 1);
}

void sg_free(sg_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void sg_ir_free(sg_ir *ir) {
    free(ir->el);
    free(ir->alts);
    free(ir->rules);
    free(ir->sets);
    free(ir->names);
    memset(ir, 0, sizeof *ir);
}

// --- parser state ----------------------------------------------------------------

// An alternative while it is parsed: its elements without the final END.
typedef struct seq {
    sg_elem *el;
    int32_t n, cap;
} seq;

// A rule while it is parsed: its alternatives.
typedef struct prule {
    seq *alts;
    int32_t n_alts, cap_alts;
    char *name;
    bool defined;
    bool referenced;
} prule;

typedef struct parser {
    const char *s, *end, *p;
    const pg_grammar_limits *lim;
    prule *rules;
    int32_t n_rules, cap_rules;
    int32_t *hash;          // open addressing over rule names, -1 = empty
    int32_t hash_cap;
    uint32_t (*sets)[8];
    int32_t n_sets, cap_sets;
    int64_t n_elems;        // elements so far, against lim->max_elements
    int depth;
    int32_t n_helpers;
    char *err;
    size_t err_cap;
    int rc;
} parser;

static int fail(parser *ps, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parser *ps, int code, const char *fmt, ...) {
    if (ps->rc) return ps->rc;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = 1;
    for (const char *q = ps->s; q < ps->p && q < ps->end; q++) line += *q == '\n';
    if (ps->err_cap) snprintf(ps->err, ps->err_cap, "grammar line %d: %s", line, msg);
    ps->rc = code;
    return code;
}

static uint32_t hash_name(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static void hash_insert(parser *ps, int32_t id);

static void hash_rebuild(parser *ps) {
    free(ps->hash);
    ps->hash_cap = ps->hash_cap ? ps->hash_cap * 2 : 256;
    ps->hash = pg_xmalloc(sizeof(int32_t) * (size_t)ps->hash_cap);
    for (int32_t i = 0; i < ps->hash_cap; i++) ps->hash[i] = -1;
    for (int32_t i = 0; i < ps->n_rules; i++) hash_insert(ps, i);
}

static void hash_insert(parser *ps, int32_t id) {
    const char *nm = ps->rules[id].name;
    uint32_t h = hash_name(nm, strlen(nm)) & (uint32_t)(ps->hash_cap - 1);
    while (ps->hash[h] >= 0) h = (h + 1) & (uint32_t)(ps->hash_cap - 1);
    ps->hash[h] = id;
}

static int32_t rule_new(parser *ps, const char *name, size_t n) {
    if (ps->n_rules == ps->cap_rules) {
        ps->cap_rules = ps->cap_rules ? ps->cap_rules * 2 : 64;
        ps->rules = pg_xrealloc(ps->rules, sizeof(prule) * (size_t)ps->cap_rules);
    }
    prule *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof *r);
    r->name = pg_xmalloc(n + 1);
    memcpy(r->name, name, n);
    r->name[n] = 0;
    int32_t id = ps->n_rules++;
    if ((int64_t)ps->n_rules * 2 > ps->hash_cap)
        hash_rebuild(ps);
    else
        hash_insert(ps, id);
    return id;
}

static int32_t rule_find_or_add(parser *ps, const char *name, size_t n) {
    if (ps->hash_cap) {
        uint32_t h = hash_name(name, n) & (uint32_t)(ps->hash_cap - 1);
        for (; ps->hash[h] >= 0; h = (h + 1) & (uint32_t)(ps->hash_cap - 1)) {
            const char *nm = ps->rules[ps->hash[h]].name;
            if (strlen(nm) == n && !memcmp(nm, name, n)) return ps->hash[h];
        }
    }
    return rule_new(ps, name, n);
}

static int32_t helper_rule(parser *ps) {
    char nm[32];
    int n = snprintf(nm, sizeof nm, "_h%d", ps->n_helpers++);
    int32_t id = rule_new(ps, nm, (size_t)n);
    ps->rules[id].defined = true;
    return id;
}

static int seq_push(parser *ps, seq *q, uint8_t kind, int32_t arg) {
    if (++ps->n_elems > ps->lim->max_elements)
        return fail(ps, PG_EUNSUPP, "the grammar expands to more than %d elements",
                    ps->lim->max_elements);
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 8;
        q->el = pg_xrealloc(q->el, sizeof(sg_elem) * (size_t)q->cap);
    }
    q->el[q->n++] = (sg_elem){kind, arg};
    return 0;
}

// Adds an alternative (taking q's storage) to rule r.
static void rule_add_alt(parser *ps, int32_t r, seq *q) {
    prule *pr = &ps->rules[r];
    if (pr->n_alts == pr->cap_alts) {
        pr->cap_alts = pr->cap_alts ? pr->cap_alts * 2 : 2;
        pr->alts = pg_xrealloc(pr->alts, sizeof(seq) * (size_t)pr->cap_alts);
    }
    pr->alts[pr->n_alts++] = *q;
    memset(q, 0, sizeof *q);
    ps->n_elems++;  // its END
}

static int32_t set_new(parser *ps, const uint32_t bits[8]) {
    // Single bytes share the first 256 sets.
    int pop = 0, one = -1;
    for (int w = 0; w < 8; w++) {
        pop += __builtin_popcount(bits[w]);
        if (bits[w] && one < 0) one = w * 32 + __builtin_ctz(bits[w]);
    }
    if (pop == 1) return one;
    if (ps->n_sets == ps->cap_sets) {
        ps->cap_sets *= 2;
        ps->sets = pg_xrealloc(ps->sets, sizeof *ps->sets * (size_t)ps->cap_sets);
    }
    memcpy(ps->sets[ps->n_sets], bits, 32);
    return ps->n_sets++;
}

// --- UTF-8 splitting -------------------------------------------------------------

typedef struct {
    uint32_t lo, hi;
} cp_range;

static int utf8_encode(uint32_t c, uint8_t *o) {
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

// Byte-range sequences of a code point class: single bytes gathered into
// one set, longer sequences one alternative each.
typedef struct {
    uint32_t ascii[8];
    bool any_ascii;
    uint8_t (*lo)[4], (*hi)[4];
    int *len;
    int n, cap;
} utf8_split;

static void split_emit(utf8_split *u, uint32_t lo, uint32_t hi) {
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    if (n == 1) {
        for (uint32_t c = lo; c <= hi; c++) u->ascii[c >> 5] |= 1u << (c & 31);
        u->any_ascii = true;
        return;
    }
    if (u->n == u->cap) {
        u->cap = u->cap ? u->cap * 2 : 8;
        u->lo = pg_xrealloc(u->lo, 4 * (size_t)u->cap);
        u->hi = pg_xrealloc(u->hi, 4 * (size_t)u->cap);
        u->len = pg_xrealloc(u->len, sizeof(int) * (size_t)u->cap);
    }
    memcpy(u->lo[u->n], a, 4);
    memcpy(u->hi[u->n], b, 4);
    u->len[u->n++] = n;
}

// The UTF-8 range split of [lo, hi] (no surrogates inside), as in the
// classic regex-engine construction: cut at encoding-length boundaries,
// then until every continuation byte spans a full or aligned range.
static void split_range(utf8_split *u, uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    static const uint32_t maxes[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= maxes[i] && maxes[i] < hi) {
            split_range(u, lo, maxes[i]);
            split_range(u, maxes[i] + 1, hi);
            return;
        }
    if (hi < 0x80) {
        split_emit(u, lo, hi);
        return;
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                split_range(u, lo, lo | m);
                split_range(u, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                split_range(u, lo, (hi & ~m) - 1);
                split_range(u, hi & ~m, hi);
                return;
            }
        }
    }
    split_emit(u, lo, hi);
}

// Appends to q the elements matching one code point of `ranges` (sorted,
// merged, surrogates excluded): one byte set when all are ASCII, else a
// helper rule with one alternative per byte-sequence shape.
static int emit_class(parser *ps, seq *q, const cp_range *ranges, int n) {
    utf8_split u = {0};
    for (int i = 0; i < n; i++) split_range(&u, ranges[i].lo, ranges[i].hi);
    int rc = 0;
    if (u.n == 0) {
        if (!u.any_ascii) {
            rc = fail(ps, PG_EINVAL, "a character class matches nothing");
        } else {
            rc = seq_push(ps, q, SG_BYTES, set_new(ps, u.ascii));
        }
        goto out;
    }
    int32_t h = helper_rule(ps);
    if (u.any_ascii) {
        seq a = {0};
        if ((rc = seq_push(ps, &a, SG_BYTES, set_new(ps, u.ascii))) < 0) goto out;
        rule_add_alt(ps, h, &a);
    }
    for (int i = 0; i < u.n; i++) {
        seq a = {0};
        for (int k = 0; k < u.len[i]; k++) {
            uint32_t bits[8] = {0};
            for (unsigned c = u.lo[i][k]; c <= u.hi[i][k]; c++) bits[c >> 5] |= 1u << (c & 31);
            if ((rc = seq_push(ps, &a, SG_BYTES, set_new(ps, bits))) < 0) {
                free(a.el);
                goto out;
            }
        }
        rule_add_alt(ps, h, &a);
    }
    rc = seq_push(ps, q, SG_REF, h);
out:
    free(u.lo);
    free(u.hi);
    free(u.len);
    return rc;
}

static int cmp_range(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

// Sorts and merges ranges in place, optionally complements them over
// [0, 0x10FFFF], and removes surrogates. Returns the new count; `out` must
// hold n + 2 ranges.
static int normalize_ranges(cp_range *r, int n, bool negate, cp_range *out) {
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    int k = 0;
    cp_range *src = r;
    cp_range *comp = NULL;
    if (negate) {
        comp = pg_xmalloc(sizeof(cp_range) * (size_t)(m + 1));
        uint32_t next = 0;
        int c = 0;
        for (int i = 0; i < m; i++) {
            if (r[i].lo > next) comp[c++] = (cp_range){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= 0x10FFFF) comp[c++] = (cp_range){next, 0x10FFFF};
        src = comp;
        m = c;
    }
    for (int i = 0; i < m; i++) {
        uint32_t lo = src[i].lo, hi = src[i].hi > 0x10FFFF ? 0x10FFFF : src[i].hi;
        if (lo > hi) continue;
        if (lo < 0xD800 && hi > 0xDFFF) {
            out[k++] = (cp_range){lo, 0xD7FF};
            out[k++] = (cp_range){0xE000, hi};
        } else if (lo >= 0xD800 && hi <= 0xDFFF) {
            continue;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            out[k++] = (cp_range){0xE000, hi};
        } else if (hi >= 0xD800 && hi <= 0xDFFF) {
            out[k++] = (cp_range){lo, 0xD7FF};
        } else {
            out[k++] = (cp_range){lo, hi};
        }
    }
    free(comp);
    return k;
}

// --- lexing ----------------------------------------------------------------------

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

// Skips spaces, tabs and comments; newlines too when `newlines`.
static void skip_space(parser *ps, bool newlines) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
            ps->p++;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n') ps->p++;
        } else if (c == '\\' && ps->p + 1 < ps->end && (ps->p[1] == '\n' || ps->p[1] == '\r')) {
            ps->p += 2;  // a line continuation
        } else {
            break;
        }
    }
}

// Decodes one UTF-8 code point of the grammar text (invalid bytes pass as
// themselves, as Latin-1).
static uint32_t next_cp(parser *ps) {
    return sg_next_cp(&ps->p, ps->end);
}

static int hex_escape(parser *ps, int digits, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        if (ps->p >= ps->end) return fail(ps, PG_EINVAL, "unterminated escape");
        char c = *ps->p++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail(ps, PG_EINVAL, "bad hex digit '%c' in an escape", c);
        v = v * 16 + (uint32_t)d;
    }
    if (v > 0x10FFFF) return fail(ps, PG_EINVAL, "code point U+%X is out of range", v);
    *out = v;
    return 0;
}

// One character of a literal or class, escapes decoded.
static int parse_char(parser *ps, uint32_t *out) {
    if (ps->p >= ps->end) return fail(ps, PG_EINVAL, "unexpected end of grammar");
    if (*ps->p != '\\') {
        *out = next_cp(ps);
        return 0;
    }
    ps->p++;
    if (ps->p >= ps->end) return fail(ps, PG_EINVAL, "unterminated escape");
    char c = *ps->p++;
    switch (c) {
    case 'x': return hex_escape(ps, 2, out);
    case 'u': return hex_escape(ps, 4, out);
    case 'U': return hex_escape(ps, 8, out);
    case 't': *out = '\t'; return 0;
    case 'r': *out = '\r'; return 0;
    case 'n': *out = '\n'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *out = (uint32_t)c; return 0;
    default: return fail(ps, PG_EINVAL, "unknown escape '\\%c'", c);
    }
}

// --- parsing ---------------------------------------------------------------------

static int parse_alternates(parser *ps, int32_t rule, bool nested);

static int parse_int(parser *ps, int32_t *out) {
    const char *st = ps->p;
    int64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (*ps->p++ - '0');
        if (v > ps->lim->max_repeat)
            return fail(ps, PG_EUNSUPP, "a repetition count exceeds %d", ps->lim->max_repeat);
    }
    if (ps->p == st) return fail(ps, PG_EINVAL, "expected a number in {m,n}");
    *out = (int32_t)v;
    return 0;
}

// Replaces q->el[start..) (the last item, X) with X{m,n} (n < 0: no bound).
static int apply_repeat(parser *ps, seq *q, int32_t start, int32_t m, int32_t n) {
    if (n >= 0 && n < m) return fail(ps, PG_EINVAL, "{%d,%d}: the maximum is below the minimum", m, n);
    int32_t len = q->n - start;
    if (len <= 0) return fail(ps, PG_EINVAL, "a quantifier follows nothing");
    sg_elem x;
    if (len == 1) {
        x = q->el[start];
    } else {  // wrap a multi-element item in a rule so copies are one REF each
        int32_t w = helper_rule(ps);
        seq a = {0};
        for (int32_t i = start; i < q->n; i++)
            if (seq_push(ps, &a, q->el[i].kind, q->el[i].arg) < 0) {
                free(a.el);
                return ps->rc;
            }
        rule_add_alt(ps, w, &a);
        x = (sg_elem){SG_REF, w};
    }
    q->n = start;
    if ((int64_t)m + (n < 0 ? 1 : n - m) > ps->lim->max_repeat * 2LL)
        return fail(ps, PG_EUNSUPP, "a repetition count exceeds %d", ps->lim->max_repeat);
    for (int32_t i = 0; i < m; i++) PG_TRY(seq_push(ps, q, x.kind, x.arg));
    if (n < 0) {  // h ::= x h |
        int32_t h = helper_rule(ps);
        seq a = {0}, e = {0};
        if (seq_push(ps, &a, x.kind, x.arg) < 0 || seq_push(ps, &a, SG_REF, h) < 0) {
            free(a.el);
            return ps->rc;
        }
        rule_add_alt(ps, h, &a);
        rule_add_alt(ps, h, &e);
        return seq_push(ps, q, SG_REF, h);
    }
    // n - m optional copies, nested: h1 ::= x |, hk ::= x h(k-1) |
    int32_t inner = -1;
    for (int32_t k = 0; k < n - m; k++) {
        int32_t h = helper_rule(ps);
        seq a = {0}, e = {0};
        if (seq_push(ps, &a, x.kind, x.arg) < 0 || (inner >= 0 && seq_push(ps, &a, SG_REF, inner) < 0)) {
            free(a.el);
            return ps->rc;
        }
        rule_add_alt(ps, h, &a);
        rule_add_alt(ps, h, &e);
        inner = h;
    }
    if (inner >= 0) return seq_push(ps, q, SG_REF, inner);
    return 0;
}

static int parse_class(parser *ps, seq *q) {
    ps->p++;  // '['
    bool negate = ps->p < ps->end && *ps->p == '^';
    if (negate) ps->p++;
    int n = 0, cap = 8;
    cp_range *r = pg_xmalloc(sizeof *r * (size_t)cap);
    int rc = 0;
    while (ps->p < ps->end && *ps->p != ']') {
        uint32_t lo, hi;
        if ((rc = parse_char(ps, &lo)) < 0) goto out;
        hi = lo;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            if ((rc = parse_char(ps, &hi)) < 0) goto out;
            if (hi < lo) {
                rc = fail(ps, PG_EINVAL, "a class range runs backwards (U+%X-U+%X)", lo, hi);
                goto out;
            }
        }
        if (n + 2 >= cap) {
            cap *= 2;
            r = pg_xrealloc(r, sizeof *r * (size_t)cap);
        }
        r[n++] = (cp_range){lo, hi};
    }
    if (ps->p >= ps->end) {
        rc = fail(ps, PG_EINVAL, "unterminated character class");
        goto out;
    }
    ps->p++;  // ']'
    cp_range *norm = pg_xmalloc(sizeof *norm * (size_t)(2 * n + 4));
    int m = normalize_ranges(r, n, negate, norm);
    rc = m ? emit_class(ps, q, norm, m) : fail(ps, PG_EINVAL, "a character class matches nothing");
    free(norm);
out:
    free(r);
    return rc;
}

static int parse_literal(parser *ps, seq *q) {
    ps->p++;  // '"'
    while (ps->p < ps->end && *ps->p != '"') {
        uint32_t c;
        PG_TRY(parse_char(ps, &c));
        if (c >= 0xD800 && c <= 0xDFFF) return fail(ps, PG_EINVAL, "a literal holds a surrogate");
        uint8_t b[4];
        int n = utf8_encode(c, b);
        for (int i = 0; i < n; i++) PG_TRY(seq_push(ps, q, SG_BYTES, b[i]));
    }
    if (ps->p >= ps->end) return fail(ps, PG_EINVAL, "unterminated string literal");
    ps->p++;
    return 0;
}

static int parse_sequence(parser *ps, seq *q, bool nested) {
    for (;;) {
        skip_space(ps, nested);
        if (ps->p >= ps->end) return 0;
        char c = *ps->p;
        int32_t start = q->n;
        if (c == '"') {
            PG_TRY(parse_literal(ps, q));
        } else if (c == '[') {
            PG_TRY(parse_class(ps, q));
        } else if (c == '.') {
            ps->p++;
            cp_range any = {0, 0x10FFFF}, norm[4];
            int m = normalize_ranges(&any, 1, false, norm);
            PG_TRY(emit_class(ps, q, norm, m));
        } else if (c == '(') {
            ps->p++;
            if (++ps->depth > ps->lim->max_depth)
                return fail(ps, PG_EUNSUPP, "groups nest deeper than %d", ps->lim->max_depth);
            int32_t h = helper_rule(ps);
            PG_TRY(parse_alternates(ps, h, true));
            skip_space(ps, true);
            if (ps->p >= ps->end || *ps->p != ')') return fail(ps, PG_EINVAL, "expected ')'");
            ps->p++;
            ps->depth--;
            PG_TRY(seq_push(ps, q, SG_REF, h));
        } else if (is_word(c)) {
            const char *st = ps->p;
            while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
            const char *en = ps->p;
            skip_space(ps, false);
            if (ps->end - ps->p >= 3 && !strncmp(ps->p, "::=", 3)) {
                ps->p = st;  // the next rule starts here
                return 0;
            }
            int32_t id = rule_find_or_add(ps, st, (size_t)(en - st));
            ps->rules[id].referenced = true;
            PG_TRY(seq_push(ps, q, SG_REF, id));
            // quantifiers may follow after spaces skipped above
        } else if (c == '<') {
            return fail(ps, PG_EUNSUPP, "token references (<...>) are not supported");
        } else {
            return 0;  // '|', ')', newline or something the caller judges
        }
        // quantifiers
        skip_space(ps, false);
        if (ps->p < ps->end && (*ps->p == '*' || *ps->p == '+' || *ps->p == '?')) {
            char k = *ps->p++;
            PG_TRY(apply_repeat(ps, q, start, k == '+' ? 1 : 0, k == '?' ? 1 : -1));
        } else if (ps->p < ps->end && *ps->p == '{') {
            ps->p++;
            skip_space(ps, false);
            int32_t m, n;
            PG_TRY(parse_int(ps, &m));
            skip_space(ps, false);
            n = m;
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                skip_space(ps, false);
                if (ps->p < ps->end && *ps->p == '}')
                    n = -1;
                else
                    PG_TRY(parse_int(ps, &n));
                skip_space(ps, false);
            }
            if (ps->p >= ps->end || *ps->p != '}') return fail(ps, PG_EINVAL, "expected '}'");
            ps->p++;
            PG_TRY(apply_repeat(ps, q, start, m, n));
        }
    }
}

static int parse_alternates(parser *ps, int32_t rule, bool nested) {
    for (;;) {
        seq q = {0};
        if (parse_sequence(ps, &q, nested) < 0) {
            free(q.el);
            return ps->rc;
        }
        rule_add_alt(ps, rule, &q);
        skip_space(ps, nested);
        if (!nested) {
            // A top-level rule may continue on the next line with '|'.
            const char *save = ps->p;
            skip_space(ps, true);
            if (ps->p >= ps->end || *ps->p != '|') ps->p = save;
        }
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            skip_space(ps, true);
            continue;
        }
        return 0;
    }
}

static int parse_rule(parser *ps) {
    const char *st = ps->p;
    while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
    if (ps->p == st) return fail(ps, PG_EINVAL, "expected a rule name, got '%c'", *ps->p);
    int32_t id = rule_find_or_add(ps, st, (size_t)(ps->p - st));
    if (ps->rules[id].defined) return fail(ps, PG_EINVAL, "rule '%s' is defined twice", ps->rules[id].name);
    ps->rules[id].defined = true;
    skip_space(ps, false);
    if (ps->end - ps->p < 3 || strncmp(ps->p, "::=", 3))
        return fail(ps, PG_EINVAL, "expected '::=' after '%s'", ps->rules[id].name);
    ps->p += 3;
    skip_space(ps, true);
    PG_TRY(parse_alternates(ps, id, false));
    skip_space(ps, false);
    if (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r' && !is_word(*ps->p))
        return fail(ps, PG_EINVAL, "unexpected '%c'", *ps->p);
    return 0;
}

// --- checks and flattening -------------------------------------------------------

// Left recursion (a rule reaching itself before consuming a byte) would
// make the matcher's closure loop forever: refused here.
static int check_left_recursion(parser *ps, sg_ir *ir) {
    int32_t nr = ir->n_rules;
    bool *nullable = pg_xcalloc((size_t)nr, 1);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < nr; r++) {
            if (nullable[r]) continue;
            for (int32_t a = 0; a < ir->rules[r].n_alts && !nullable[r]; a++) {
                int32_t p = ir->alts[ir->rules[r].first_alt + a];
                while (ir->el[p].kind == SG_REF && nullable[ir->el[p].arg]) p++;
                if (ir->el[p].kind == SG_END) nullable[r] = changed = true;
            }
        }
    }
    // Iterative DFS over "may start with" edges; colour 1 = on the path.
    uint8_t *colour = pg_xcalloc((size_t)nr, 1);
    int32_t *stack_r = pg_xmalloc(sizeof(int32_t) * (2 * (size_t)nr + 2));
    int32_t *stack_i = stack_r + nr + 1;
    int rc = 0;
    for (int32_t s = 0; s < nr && !rc; s++) {
        if (colour[s]) continue;
        int sp = 0;
        stack_r[0] = s;
        stack_i[0] = 0;
        colour[s] = 1;
        // stack_i counts edges visited: (alt, elem) flattened by walking.
        while (sp >= 0 && !rc) {
            int32_t r = stack_r[sp];
            // enumerate edges of r: the k-th left-reachable REF
            int32_t k = stack_i[sp]++, seen = 0, target = -1;
            for (int32_t a = 0; a < ir->rules[r].n_alts && target < 0; a++) {
                for (int32_t p = ir->alts[ir->rules[r].first_alt + a]; ir->el[p].kind == SG_REF; p++) {
                    if (seen++ == k) {
                        target = ir->el[p].arg;
                        break;
                    }
                    if (!nullable[ir->el[p].arg]) break;
                }
            }
            if (target < 0) {
                colour[r] = 2;
                sp--;
                continue;
            }
            if (colour[target] == 1) {
                ps->p = ps->s;
                rc = fail(ps, PG_EINVAL, "left recursion through rule '%s'",
                          ir->names + ir->rules[target].name);
            } else if (colour[target] == 0) {
                colour[target] = 1;
                sp++;
                stack_r[sp] = target;
                stack_i[sp] = 0;
            }
        }
    }
    free(stack_r);
    free(colour);
    free(nullable);
    return rc;
}

static void flatten(parser *ps, sg_ir *ir) {
    int64_t n_el = 0, n_alts = 0;
    size_t names = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        n_alts += ps->rules[r].n_alts;
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) n_el += ps->rules[r].alts[a].n + 1;
        names += strlen(ps->rules[r].name) + 1;
    }
    ir->el = pg_xmalloc(sizeof(sg_elem) * (size_t)(n_el + 1));
    ir->alts = pg_xmalloc(sizeof(int32_t) * (size_t)(n_alts + 1));
    ir->rules = pg_xmalloc(sizeof(sg_rule) * (size_t)ps->n_rules);
    ir->names = pg_xmalloc(names + 1);
    ir->n_rules = ps->n_rules;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        prule *pr = &ps->rules[r];
        ir->rules[r] = (sg_rule){ir->n_alts, pr->n_alts, (int32_t)ir->names_len};
        size_t nl = strlen(pr->name) + 1;
        memcpy(ir->names + ir->names_len, pr->name, nl);
        ir->names_len += nl;
        for (int32_t a = 0; a < pr->n_alts; a++) {
            ir->alts[ir->n_alts++] = ir->n_el;
            if (pr->alts[a].n)
                memcpy(ir->el + ir->n_el, pr->alts[a].el, sizeof(sg_elem) * (size_t)pr->alts[a].n);
            ir->n_el += pr->alts[a].n;
            ir->el[ir->n_el++] = (sg_elem){SG_END, 0};
        }
    }
    ir->sets = ps->sets;
    ir->n_sets = ps->n_sets;
    ps->sets = NULL;
}

static void parser_free(parser *ps) {
    for (int32_t r = 0; r < ps->n_rules; r++) {
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) free(ps->rules[r].alts[a].el);
        free(ps->rules[r].alts);
        free(ps->rules[r].name);
    }
    free(ps->rules);
    free(ps->hash);
    free(ps->sets);
}

int sg_parse_gbnf(const char *text, size_t len, const pg_grammar_limits *lim, sg_ir *ir,
                  char *err, size_t err_cap) {
    memset(ir, 0, sizeof *ir);
    if (err_cap) err[0] = 0;
    parser ps = {.s = text, .end = text + len, .p = text, .lim = lim, .err = err, .err_cap = err_cap};
    if (len > lim->max_input) {
        if (err_cap) snprintf(err, err_cap, "the grammar is longer than %zu bytes", lim->max_input);
        return PG_EUNSUPP;
    }
    ps.cap_sets = 512;
    ps.sets = pg_xcalloc((size_t)ps.cap_sets, sizeof *ps.sets);
    for (int b = 0; b < 256; b++) ps.sets[b][b >> 5] = 1u << (b & 31);
    ps.n_sets = 256;
    int rc = 0;
    for (;;) {
        skip_space(&ps, true);
        if (ps.p >= ps.end) break;
        if ((rc = parse_rule(&ps)) < 0) goto out;
    }
    int32_t root = -1;
    for (int32_t r = 0; r < ps.n_rules; r++) {
        if (!ps.rules[r].defined) {
            ps.p = ps.s;
            rc = fail(&ps, PG_EINVAL, "undefined rule '%s'", ps.rules[r].name);
            goto out;
        }
        if (!strcmp(ps.rules[r].name, "root")) root = r;
    }
    if (root < 0) {
        ps.p = ps.s;
        rc = fail(&ps, PG_EINVAL, "no 'root' rule");
        goto out;
    }
    flatten(&ps, ir);
    ir->root = root;
    if ((rc = check_left_recursion(&ps, ir)) < 0) sg_ir_free(ir);
out:
    parser_free(&ps);
    if (rc < 0) sg_ir_free(ir);
    return rc;
}
