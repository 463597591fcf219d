// text/grammar/structured_gbnf_int.h - what the two halves of the GBNF compiler
// share: the parser's state with the rules as they are built. The front
// half (structured_gbnf.c) reads the text; the back half
// (structured_gbnf_ir.c) builds rules, splits classes into UTF-8 byte
// sequences, checks and flattens into the IR. Not a public header.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "text/grammar/structured_int.h"

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

// A code point range [lo, hi] of a character class.
typedef struct {
    uint32_t lo, hi;
} cp_range;

// Records the first error (with the line of ps->p) and returns its code;
// later calls return the first code unchanged.
int sg_gbnf_fail(parser *ps, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// --- rules while they are built ---------------------------------------------------

int32_t sg_gbnf_rule_find_or_add(parser *ps, const char *name, size_t n);
// A new defined rule named _hN (groups, repetitions, multi-byte classes).
int32_t sg_gbnf_helper_rule(parser *ps);
// Appends an element to q; fails past lim->max_elements.
int sg_gbnf_seq_push(parser *ps, seq *q, uint8_t kind, int32_t arg);
// Adds an alternative (taking q's storage) to rule r.
void sg_gbnf_rule_add_alt(parser *ps, int32_t r, seq *q);

// --- code points ------------------------------------------------------------------

int sg_utf8_encode(uint32_t c, uint8_t *o);   // bytes written (1-4)
// Appends to q the elements matching one code point of `ranges` (sorted,
// merged, surrogates excluded).
int sg_gbnf_emit_class(parser *ps, seq *q, const cp_range *ranges, int n);
// Sorts, merges, optionally complements and removes surrogates; `out` holds
// n + 2 ranges. Returns the new count.
int sg_gbnf_normalize_ranges(cp_range *r, int n, bool negate, cp_range *out);

// --- the end: IR ----------------------------------------------------------------------

// Refuses left recursion (the matcher's closure would loop forever).
int sg_gbnf_check_left_recursion(parser *ps, sg_ir *ir);
// Moves the rules into ir's flat arrays (the byte sets are taken over).
void sg_gbnf_flatten(parser *ps, sg_ir *ir);
void sg_gbnf_parser_free(parser *ps);
