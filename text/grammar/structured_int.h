// text/grammar/structured_int.h - what the structured-output files share: the
// rule IR every grammar compiles to, a growable text buffer, and the
// converters to GBNF. Not a public header: only text/grammar/structured_*.c
// include it.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/grammar/structured.h"

// --- text buffer ---------------------------------------------------------------

typedef struct sg_buf {
    char *p;
    size_t len, cap;
    bool overflow;   // a cap was passed: the text is incomplete
    size_t limit;    // 0 = none
} sg_buf;

void sg_puts(sg_buf *b, const char *s);
void sg_putn(sg_buf *b, const char *s, size_t n);
void sg_printf(sg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Appends s[0..n) as a GBNF string literal ("..." with escapes).
void sg_put_literal(sg_buf *b, const char *s, size_t n);
void sg_free(sg_buf *b);

// --- rule IR -----------------------------------------------------------------------
//
// A grammar is rules; a rule is alternatives; an alternative is a run of
// elements ending in SG_END. Positions (element indexes) are what parser
// stacks hold: a position names "what to match next" inside an alternative.
// Every terminal is a set of bytes: Unicode classes are split into UTF-8
// byte sequences when parsed, so matching never decodes characters.

typedef enum { SG_END = 0, SG_BYTES = 1, SG_REF = 2 } sg_kind;

typedef struct sg_elem {
    uint8_t kind;      // sg_kind
    int32_t arg;       // SG_BYTES: byte-set index; SG_REF: rule id
} sg_elem;

typedef struct sg_rule {
    int32_t first_alt; // index into alts
    int32_t n_alts;
    int32_t name;      // offset into names
} sg_rule;

typedef struct sg_ir {
    sg_elem *el;
    int32_t n_el, cap_el;
    int32_t *alts;     // alternative start positions, rule by rule
    int32_t n_alts, cap_alts;
    sg_rule *rules;
    int32_t n_rules, cap_rules;
    uint32_t (*sets)[8];  // 256-bit byte sets
    int32_t n_sets, cap_sets;
    char *names;       // NUL-separated rule names
    size_t names_len, names_cap;
    int32_t root;      // start rule
} sg_ir;

void sg_ir_free(sg_ir *ir);

// Parses GBNF text into `ir` (start rule "root"): expands repetitions,
// splits character classes into UTF-8 byte sequences, checks undefined
// rules and left recursion, and caps elements and nesting by `lim`.
// Returns 0 or PG_EINVAL / PG_EUNSUPP with the reason in err.
int sg_parse_gbnf(const char *text, size_t len, const pg_grammar_limits *lim, sg_ir *ir,
                  char *err, size_t err_cap);

// JSON schema -> GBNF (root rule "root"). PG_EINVAL for a malformed schema,
// PG_EUNSUPP for a keyword that is not implemented.
int sg_schema_to_gbnf(const char *json, size_t len, const pg_grammar_limits *lim, sg_buf *out,
                      char *err, size_t err_cap);
// Any JSON object (json_object mode).
void sg_json_object_gbnf(sg_buf *out);
// The rules for a JSON value used by both of the above (names json-*).
void sg_json_value_rules(sg_buf *out);
// A JSON array of strings -> root ::= "a" | "b" ...
int sg_choice_to_gbnf(const char *json, size_t len, sg_buf *out, char *err, size_t err_cap);

// Regex -> a GBNF expression (no rule name), appended to out. The whole
// output must match (^ and $ at the ends are accepted and ignored). With
// json_string the expression matches the JSON-escaped form of strings the
// regex matches, as they appear between the quotes: '"' and '\' come out
// escaped and control characters are left out. PG_EINVAL with the reason
// for a malformed pattern, PG_EUNSUPP for backreferences, lookaround and
// word boundaries.
int sg_regex_to_gbnf(const char *re, size_t len, bool json_string, const pg_grammar_limits *lim,
                     sg_buf *out, char *err, size_t err_cap);

// Decodes one UTF-8 code point at *p (< end) and advances past it; an
// invalid or truncated sequence passes its first byte as itself (Latin-1).
// The GBNF and regex compilers share it.
static inline uint32_t sg_next_cp(const char **p, const char *end) {
    const unsigned char *s = (const unsigned char *)*p;
    size_t left = (size_t)(end - *p);
    unsigned char c = s[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if ((size_t)n > left) n = 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            (*p)++;
            return c;
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *p += n;
    return cp;
}
