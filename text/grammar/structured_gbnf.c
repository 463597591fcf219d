// text/grammar/structured_gbnf.c - GBNF text (llama.cpp's grammar format) into the
// rule IR of structured_int.h.
//
// Syntax: `name ::= alternatives`, one rule per line (a rule may continue
// over lines inside parentheses or after '|'); "literals" and [classes]
// with \x \u \U \n \r \t escapes, '.', groups, and the quantifiers * + ?
// {m} {m,} {m,n}; '#' comments. Quantifiers become helper rules (x* is
// `h ::= x h |`, a tail call, so repetition never grows parser stacks).
// Character classes are over code points and are split into UTF-8 byte
// sequences (structured_gbnf_ir.c, which also builds the rules, checks and
// flattens them), so the matcher works on bytes only. This file reads the
// text: lexing and parsing.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_gbnf_int.h"

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
        if (ps->p >= ps->end) return sg_gbnf_fail(ps, PG_EINVAL, "unterminated escape");
        char c = *ps->p++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return sg_gbnf_fail(ps, PG_EINVAL, "bad hex digit '%c' in an escape", c);
        v = v * 16 + (uint32_t)d;
    }
    if (v > 0x10FFFF) return sg_gbnf_fail(ps, PG_EINVAL, "code point U+%X is out of range", v);
    *out = v;
    return 0;
}

// One character of a literal or class, escapes decoded.
static int parse_char(parser *ps, uint32_t *out) {
    if (ps->p >= ps->end) return sg_gbnf_fail(ps, PG_EINVAL, "unexpected end of grammar");
    if (*ps->p != '\\') {
        *out = next_cp(ps);
        return 0;
    }
    ps->p++;
    if (ps->p >= ps->end) return sg_gbnf_fail(ps, PG_EINVAL, "unterminated escape");
    char c = *ps->p++;
    switch (c) {
    case 'x': return hex_escape(ps, 2, out);
    case 'u': return hex_escape(ps, 4, out);
    case 'U': return hex_escape(ps, 8, out);
    case 't': *out = '\t'; return 0;
    case 'r': *out = '\r'; return 0;
    case 'n': *out = '\n'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *out = (uint32_t)c; return 0;
    default: return sg_gbnf_fail(ps, PG_EINVAL, "unknown escape '\\%c'", c);
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
            return sg_gbnf_fail(ps, PG_EUNSUPP, "a repetition count exceeds %d", ps->lim->max_repeat);
    }
    if (ps->p == st) return sg_gbnf_fail(ps, PG_EINVAL, "expected a number in {m,n}");
    *out = (int32_t)v;
    return 0;
}

// Replaces q->el[start..) (the last item, X) with X{m,n} (n < 0: no bound).
static int apply_repeat(parser *ps, seq *q, int32_t start, int32_t m, int32_t n) {
    if (n >= 0 && n < m) return sg_gbnf_fail(ps, PG_EINVAL, "{%d,%d}: the maximum is below the minimum", m, n);
    int32_t len = q->n - start;
    if (len <= 0) return sg_gbnf_fail(ps, PG_EINVAL, "a quantifier follows nothing");
    sg_elem x;
    if (len == 1) {
        x = q->el[start];
    } else {  // wrap a multi-element item in a rule so copies are one REF each
        int32_t w = sg_gbnf_helper_rule(ps);
        seq a = {0};
        for (int32_t i = start; i < q->n; i++)
            if (sg_gbnf_seq_push(ps, &a, q->el[i].kind, q->el[i].arg) < 0) {
                free(a.el);
                return ps->rc;
            }
        sg_gbnf_rule_add_alt(ps, w, &a);
        x = (sg_elem){SG_REF, w};
    }
    q->n = start;
    if ((int64_t)m + (n < 0 ? 1 : n - m) > ps->lim->max_repeat * 2LL)
        return sg_gbnf_fail(ps, PG_EUNSUPP, "a repetition count exceeds %d", ps->lim->max_repeat);
    for (int32_t i = 0; i < m; i++) PG_TRY(sg_gbnf_seq_push(ps, q, x.kind, x.arg));
    if (n < 0) {  // h ::= x h |
        int32_t h = sg_gbnf_helper_rule(ps);
        seq a = {0}, e = {0};
        if (sg_gbnf_seq_push(ps, &a, x.kind, x.arg) < 0 || sg_gbnf_seq_push(ps, &a, SG_REF, h) < 0) {
            free(a.el);
            return ps->rc;
        }
        sg_gbnf_rule_add_alt(ps, h, &a);
        sg_gbnf_rule_add_alt(ps, h, &e);
        return sg_gbnf_seq_push(ps, q, SG_REF, h);
    }
    // n - m optional copies, nested: h1 ::= x |, hk ::= x h(k-1) |
    int32_t inner = -1;
    for (int32_t k = 0; k < n - m; k++) {
        int32_t h = sg_gbnf_helper_rule(ps);
        seq a = {0}, e = {0};
        if (sg_gbnf_seq_push(ps, &a, x.kind, x.arg) < 0 || (inner >= 0 && sg_gbnf_seq_push(ps, &a, SG_REF, inner) < 0)) {
            free(a.el);
            return ps->rc;
        }
        sg_gbnf_rule_add_alt(ps, h, &a);
        sg_gbnf_rule_add_alt(ps, h, &e);
        inner = h;
    }
    if (inner >= 0) return sg_gbnf_seq_push(ps, q, SG_REF, inner);
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
                rc = sg_gbnf_fail(ps, PG_EINVAL, "a class range runs backwards (U+%X-U+%X)", lo, hi);
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
        rc = sg_gbnf_fail(ps, PG_EINVAL, "unterminated character class");
        goto out;
    }
    ps->p++;  // ']'
    cp_range *norm = pg_xmalloc(sizeof *norm * (size_t)(2 * n + 4));
    int m = sg_gbnf_normalize_ranges(r, n, negate, norm);
    rc = m ? sg_gbnf_emit_class(ps, q, norm, m) : sg_gbnf_fail(ps, PG_EINVAL, "a character class matches nothing");
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
        if (c >= 0xD800 && c <= 0xDFFF) return sg_gbnf_fail(ps, PG_EINVAL, "a literal holds a surrogate");
        uint8_t b[4];
        int n = sg_utf8_encode(c, b);
        for (int i = 0; i < n; i++) PG_TRY(sg_gbnf_seq_push(ps, q, SG_BYTES, b[i]));
    }
    if (ps->p >= ps->end) return sg_gbnf_fail(ps, PG_EINVAL, "unterminated string literal");
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
            int m = sg_gbnf_normalize_ranges(&any, 1, false, norm);
            PG_TRY(sg_gbnf_emit_class(ps, q, norm, m));
        } else if (c == '(') {
            ps->p++;
            if (++ps->depth > ps->lim->max_depth)
                return sg_gbnf_fail(ps, PG_EUNSUPP, "groups nest deeper than %d", ps->lim->max_depth);
            int32_t h = sg_gbnf_helper_rule(ps);
            PG_TRY(parse_alternates(ps, h, true));
            skip_space(ps, true);
            if (ps->p >= ps->end || *ps->p != ')') return sg_gbnf_fail(ps, PG_EINVAL, "expected ')'");
            ps->p++;
            ps->depth--;
            PG_TRY(sg_gbnf_seq_push(ps, q, SG_REF, h));
        } else if (is_word(c)) {
            const char *st = ps->p;
            while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
            const char *en = ps->p;
            skip_space(ps, false);
            if (ps->end - ps->p >= 3 && !strncmp(ps->p, "::=", 3)) {
                ps->p = st;  // the next rule starts here
                return 0;
            }
            int32_t id = sg_gbnf_rule_find_or_add(ps, st, (size_t)(en - st));
            ps->rules[id].referenced = true;
            PG_TRY(sg_gbnf_seq_push(ps, q, SG_REF, id));
            // quantifiers may follow after spaces skipped above
        } else if (c == '<') {
            return sg_gbnf_fail(ps, PG_EUNSUPP, "token references (<...>) are not supported");
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
            if (ps->p >= ps->end || *ps->p != '}') return sg_gbnf_fail(ps, PG_EINVAL, "expected '}'");
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
        sg_gbnf_rule_add_alt(ps, rule, &q);
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
    if (ps->p == st) return sg_gbnf_fail(ps, PG_EINVAL, "expected a rule name, got '%c'", *ps->p);
    int32_t id = sg_gbnf_rule_find_or_add(ps, st, (size_t)(ps->p - st));
    if (ps->rules[id].defined) return sg_gbnf_fail(ps, PG_EINVAL, "rule '%s' is defined twice", ps->rules[id].name);
    ps->rules[id].defined = true;
    skip_space(ps, false);
    if (ps->end - ps->p < 3 || strncmp(ps->p, "::=", 3))
        return sg_gbnf_fail(ps, PG_EINVAL, "expected '::=' after '%s'", ps->rules[id].name);
    ps->p += 3;
    skip_space(ps, true);
    PG_TRY(parse_alternates(ps, id, false));
    skip_space(ps, false);
    if (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r' && !is_word(*ps->p))
        return sg_gbnf_fail(ps, PG_EINVAL, "unexpected '%c'", *ps->p);
    return 0;
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
            rc = sg_gbnf_fail(&ps, PG_EINVAL, "undefined rule '%s'", ps.rules[r].name);
            goto out;
        }
        if (!strcmp(ps.rules[r].name, "root")) root = r;
    }
    if (root < 0) {
        ps.p = ps.s;
        rc = sg_gbnf_fail(&ps, PG_EINVAL, "no 'root' rule");
        goto out;
    }
    sg_gbnf_flatten(&ps, ir);
    ir->root = root;
    if ((rc = sg_gbnf_check_left_recursion(&ps, ir)) < 0) sg_ir_free(ir);
out:
    sg_gbnf_parser_free(&ps);
    if (rc < 0) sg_ir_free(ir);
    return rc;
}
