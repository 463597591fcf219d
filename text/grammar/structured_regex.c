// text/grammar/structured_regex.c - regular expressions (vLLM's guided_regex, JSON
// schema "pattern") into GBNF expressions.
//
// Supported: literals and escapes (\d \w \s and their negations, \n \t \r
// \f \v \xHH \uHHHH, escaped punctuation), classes with ranges and
// negation, '.', groups (capturing, (?:...), named), alternation, and the
// quantifiers * + ? {m} {m,} {m,n} (lazy and possessive suffixes accepted:
// they change which match a search finds, not what matches). Classes are
// resolved to explicit code point ranges here, so the GBNF side only sees
// positive classes. Not supported: backreferences, lookaround, \b.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_int.h"

typedef struct {
    uint32_t lo, hi;
} rrange;

typedef struct rx {
    const char *p, *end, *start;
    bool json;
    const pg_grammar_limits *lim;
    sg_buf *out;
    char *err;
    size_t err_cap;
    int rc;
    int depth;
} rx;

static int rx_fail(rx *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rx_fail(rx *r, int code, const char *fmt, ...) {
    if (r->rc) return r->rc;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->err_cap) snprintf(r->err, r->err_cap, "regex at offset %d: %s", (int)(r->p - r->start), msg);
    r->rc = code;
    return code;
}

// A growable list of code point ranges.
typedef struct {
    rrange *r;
    int n, cap;
} rset;

static void rset_add(rset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->r = pg_xrealloc(s->r, sizeof(rrange) * (size_t)s->cap);
    }
    s->r[s->n++] = (rrange){lo, hi};
}

static int cmp_rr(const void *a, const void *b) {
    const rrange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void rset_normalize(rset *s) {
    if (!s->n) return;
    qsort(s->r, (size_t)s->n, sizeof(rrange), cmp_rr);
    int m = 0;
    for (int i = 0; i < s->n; i++) {
        if (m && s->r[i].lo <= s->r[m - 1].hi + 1) {
            if (s->r[i].hi > s->r[m - 1].hi) s->r[m - 1].hi = s->r[i].hi;
        } else {
            s->r[m++] = s->r[i];
        }
    }
    s->n = m;
}

static void rset_negate(rset *s) {
    rset_normalize(s);
    rset o = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next) rset_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= 0x10FFFF) rset_add(&o, next, 0x10FFFF);
    free(s->r);
    *s = o;
}

// Removes [lo, hi] from the set; returns whether anything was removed.
static bool rset_remove(rset *s, uint32_t lo, uint32_t hi) {
    rset o = {0};
    bool hit = false;
    for (int i = 0; i < s->n; i++) {
        rrange x = s->r[i];
        if (x.hi < lo || x.lo > hi) {
            rset_add(&o, x.lo, x.hi);
            continue;
        }
        hit = true;
        if (x.lo < lo) rset_add(&o, x.lo, lo - 1);
        if (x.hi > hi) rset_add(&o, hi + 1, x.hi);
    }
    free(s->r);
    *s = o;
    return hit;
}

static void put_cp_class(sg_buf *b, uint32_t c) {
    if (c < 0x100)
        sg_printf(b, "\\x%02X", c);
    else if (c < 0x10000)
        sg_printf(b, "\\u%04X", c);
    else
        sg_printf(b, "\\U%08X", c);
}

// Emits one character out of the set; in JSON mode '"' and '\' as their
// escapes and control characters left out. Fails when nothing is left.
static int emit_set(rx *r, rset *s) {
    rset_normalize(s);
    bool quote = false, bslash = false;
    if (r->json) {
        quote = rset_remove(s, '"', '"');
        bslash = rset_remove(s, '\\', '\\');
        rset_remove(s, 0, 0x1F);
    }
    rset_remove(s, 0xD800, 0xDFFF);
    int alts = (s->n > 0) + quote + bslash;
    if (!alts) return rx_fail(r, PG_EINVAL, "a character class matches nothing");
    if (alts > 1) sg_puts(r->out, "(");
    int k = 0;
    if (s->n) {
        sg_puts(r->out, "[");
        for (int i = 0; i < s->n; i++) {
            put_cp_class(r->out, s->r[i].lo);
            if (s->r[i].hi != s->r[i].lo) {
                sg_puts(r->out, "-");
                put_cp_class(r->out, s->r[i].hi);
            }
        }
        sg_puts(r->out, "]");
        k++;
    }
    if (quote) sg_puts(r->out, k++ ? " | \"\\\\\\\"\"" : "\"\\\\\\\"\"");
    if (bslash) sg_puts(r->out, k++ ? " | \"\\\\\\\\\"" : "\"\\\\\\\\\"");
    if (alts > 1) sg_puts(r->out, ")");
    return 0;
}

static uint32_t rx_cp(rx *r) {
    return sg_next_cp(&r->p, r->end);
}

static int rx_hex(rx *r, int digits, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        if (r->p >= r->end) return rx_fail(r, PG_EINVAL, "unterminated escape");
        char c = *r->p++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return rx_fail(r, PG_EINVAL, "bad hex digit in an escape");
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

static void add_class_escape(rset *s, char c) {
    switch (c) {
    case 'd': rset_add(s, '0', '9'); break;
    case 'w':
        rset_add(s, '0', '9');
        rset_add(s, 'A', 'Z');
        rset_add(s, 'a', 'z');
        rset_add(s, '_', '_');
        break;
    case 's':
        rset_add(s, '\t', '\r');
        rset_add(s, ' ', ' ');
        break;
    }
}

// After a backslash: a class escape into `s` (returns 1), or a single
// character into *cp (returns 0).
static int rx_escape(rx *r, rset *s, uint32_t *cp) {
    if (r->p >= r->end) return rx_fail(r, PG_EINVAL, "a pattern ends with '\\'");
    char c = *r->p++;
    switch (c) {
    case 'd': case 'w': case 's':
        add_class_escape(s, c);
        return 1;
    case 'D': case 'W': case 'S': {
        rset t = {0};
        add_class_escape(&t, (char)(c + 32));
        rset_negate(&t);
        for (int i = 0; i < t.n; i++) rset_add(s, t.r[i].lo, t.r[i].hi);
        free(t.r);
        return 1;
    }
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': PG_TRY(rx_hex(r, 2, cp)); return 0;
    case 'u': PG_TRY(rx_hex(r, 4, cp)); return 0;
    case 'b': case 'B': return rx_fail(r, PG_EUNSUPP, "word boundaries (\\%c) are not supported", c);
    default:
        if (c >= '1' && c <= '9') return rx_fail(r, PG_EUNSUPP, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rx_fail(r, PG_EUNSUPP, "the escape \\%c is not supported", c);
        *cp = (uint32_t)(unsigned char)c;
        return 0;
    }
}

static int rx_class(rx *r) {
    r->p++;  // '['
    rset s = {0};
    bool neg = r->p < r->end && *r->p == '^';
    if (neg) r->p++;
    bool first = true;
    int rc = 0;
    while (r->p < r->end && (*r->p != ']' || first)) {
        first = false;
        uint32_t lo;
        if (*r->p == '\\') {
            r->p++;
            int k = rx_escape(r, &s, &lo);
            if (k < 0) {
                rc = k;
                goto out;
            }
            if (k == 1) continue;
        } else if (*r->p == '[' && r->p + 1 < r->end && r->p[1] == ':') {
            rc = rx_fail(r, PG_EUNSUPP, "POSIX classes ([:alpha:]) are not supported");
            goto out;
        } else {
            lo = rx_cp(r);
        }
        uint32_t hi = lo;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                rset dummy = {0};
                int k = rx_escape(r, &dummy, &hi);
                free(dummy.r);
                if (k < 0) {
                    rc = k;
                    goto out;
                }
                if (k == 1) {
                    rc = rx_fail(r, PG_EINVAL, "a class escape cannot end a range");
                    goto out;
                }
            } else {
                hi = rx_cp(r);
            }
            if (hi < lo) {
                rc = rx_fail(r, PG_EINVAL, "a class range runs backwards");
                goto out;
            }
        }
        rset_add(&s, lo, hi);
    }
    if (r->p >= r->end) {
        rc = rx_fail(r, PG_EINVAL, "unterminated character class");
        goto out;
    }
    r->p++;
    if (neg) rset_negate(&s);
    rc = emit_set(r, &s);
out:
    free(s.r);
    return rc;
}

static int rx_alt(rx *r);

static int rx_int(rx *r, int32_t *out) {
    const char *st = r->p;
    int64_t v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        v = v * 10 + (*r->p++ - '0');
        if (v > r->lim->max_repeat)
            return rx_fail(r, PG_EUNSUPP, "a repetition count exceeds %d", r->lim->max_repeat);
    }
    if (r->p == st) return rx_fail(r, PG_EINVAL, "expected a number");
    *out = (int32_t)v;
    return 0;
}

// Quantifier after an atom, copied into GBNF syntax.
static int rx_quant(rx *r) {
    if (r->p >= r->end) return 0;
    char c = *r->p;
    if (c == '*' || c == '+' || c == '?') {
        r->p++;
        sg_putn(r->out, &c, 1);
    } else if (c == '{') {
        // "{" not followed by a valid count is a literal in most engines;
        // refuse it instead of guessing.
        r->p++;
        int32_t m, n = -2;
        PG_TRY(rx_int(r, &m));
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            if (r->p < r->end && *r->p == '}')
                n = -1;
            else
                PG_TRY(rx_int(r, &n));
        }
        if (r->p >= r->end || *r->p != '}') return rx_fail(r, PG_EINVAL, "expected '}'");
        r->p++;
        if (n >= 0 && n < m) return rx_fail(r, PG_EINVAL, "{%d,%d}: the maximum is below the minimum", m, n);
        if (n == -2)
            sg_printf(r->out, "{%d}", m);
        else if (n == -1)
            sg_printf(r->out, "{%d,}", m);
        else
            sg_printf(r->out, "{%d,%d}", m, n);
    } else {
        return 0;
    }
    if (r->p < r->end && (*r->p == '?' || *r->p == '+')) r->p++;  // lazy / possessive
    if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?' || *r->p == '{'))
        return rx_fail(r, PG_EINVAL, "a quantifier follows a quantifier");
    return 0;
}

static void emit_char(rx *r, uint32_t cp) {
    if (r->json && (cp == '"' || cp == '\\')) {
        sg_puts(r->out, cp == '"' ? "\"\\\\\\\"\"" : "\"\\\\\\\\\"");
        return;
    }
    if (r->json && cp < 0x20) {
        static const char *esc[] = {[8] = "b", [9] = "t", [10] = "n", [12] = "f", [13] = "r"};
        if (cp < 14 && esc[cp])
            sg_printf(r->out, "\"\\\\%s\"", esc[cp]);
        else
            sg_printf(r->out, "\"\\\\u%04x\"", cp);
        return;
    }
    sg_puts(r->out, "[");
    put_cp_class(r->out, cp);
    sg_puts(r->out, "]");
}

static int rx_concat(rx *r) {
    bool any = false;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        char c = *r->p;
        if (any) sg_puts(r->out, " ");
        if (c == '(') {
            r->p++;
            if (r->p < r->end && *r->p == '?') {
                r->p++;
                if (r->p < r->end && *r->p == ':') {
                    r->p++;
                } else if (r->p < r->end && (*r->p == 'P' || *r->p == '<') &&
                           !(r->p + 1 < r->end && (r->p[1] == '=' || r->p[1] == '!'))) {
                    if (*r->p == 'P') r->p++;
                    if (r->p >= r->end || *r->p != '<') return rx_fail(r, PG_EUNSUPP, "unsupported group syntax");
                    while (r->p < r->end && *r->p != '>') r->p++;
                    if (r->p >= r->end) return rx_fail(r, PG_EINVAL, "unterminated group name");
                    r->p++;
                } else {
                    return rx_fail(r, PG_EUNSUPP, "lookaround and inline flags are not supported");
                }
            }
            if (++r->depth > r->lim->max_depth)
                return rx_fail(r, PG_EUNSUPP, "groups nest deeper than %d", r->lim->max_depth);
            sg_puts(r->out, "(");
            PG_TRY(rx_alt(r));
            if (r->p >= r->end || *r->p != ')') return rx_fail(r, PG_EINVAL, "missing ')'");
            r->p++;
            r->depth--;
            sg_puts(r->out, ")");
        } else if (c == '[') {
            PG_TRY(rx_class(r));
        } else if (c == '.') {
            r->p++;
            rset s = {0};
            rset_add(&s, '\n', '\n');
            rset_negate(&s);
            int rc = emit_set(r, &s);
            free(s.r);
            PG_TRY(rc);
        } else if (c == '^' || c == '$') {
            // Anchors: the whole output is matched anyway; only at the ends.
            bool at_start = c == '^' && r->p == r->start;
            bool at_end = c == '$' && r->p + 1 == r->end;
            r->p++;
            if (!at_start && !at_end) {
                // Allowed at the ends of a top-level alternative too.
                if (r->depth > 0 || !(r->p >= r->end || *r->p == '|' || (c == '^' && !any)))
                    return rx_fail(r, PG_EUNSUPP, "anchors inside a pattern are not supported");
            }
            sg_puts(r->out, "\"\"");
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            return rx_fail(r, PG_EINVAL, "a quantifier follows nothing");
        } else if (c == '\\') {
            r->p++;
            rset s = {0};
            uint32_t cp = 0;
            int k = rx_escape(r, &s, &cp);
            if (k == 1) k = emit_set(r, &s);
            else if (k == 0) emit_char(r, cp);
            free(s.r);
            PG_TRY(k);
        } else {
            emit_char(r, rx_cp(r));
        }
        PG_TRY(rx_quant(r));
        any = true;
    }
    if (!any) sg_puts(r->out, "\"\"");
    return 0;
}

static int rx_alt(rx *r) {
    PG_TRY(rx_concat(r));
    while (r->p < r->end && *r->p == '|') {
        r->p++;
        sg_puts(r->out, " | ");
        PG_TRY(rx_concat(r));
    }
    return 0;
}

int sg_regex_to_gbnf(const char *re, size_t len, bool json_string, const pg_grammar_limits *lim,
                     sg_buf *out, char *err, size_t err_cap) {
    rx r = {.p = re, .end = re + len, .start = re, .json = json_string, .lim = lim, .out = out,
            .err = err, .err_cap = err_cap};
    sg_puts(out, "(");
    if (rx_alt(&r) < 0) return r.rc;
    if (r.p < r.end) return rx_fail(&r, PG_EINVAL, "unmatched ')'");
    sg_puts(out, ")");
    return 0;
}
