// text/grammar/structured.h - structured outputs: grammars, their compilers, and
// the per-sequence matcher that masks the vocabulary.
//
// A request's constraint (a JSON schema, "any JSON", a regex, a list of
// choices, or a GBNF grammar as llama.cpp writes it) is compiled to one
// grammar form (GBNF rules over bytes). A grammar is bound to a vocabulary
// (the model's tokens as bytes, in a trie) when compiled. Matching is a
// pushdown automaton over bytes whose stack sets are determinized lazily:
// each distinct set of parser stacks becomes a state with a 256-entry
// transition row and, once asked for, its allowed-token bitmask, so a state
// seen before costs one copy of its mask. Design, costs and the comparison
// with xgrammar: docs/structured_outputs.md.
//
// Threads: compiling (pg_grammar_compile) touches only the new grammar and
// the immutable vocabulary, so it may run on any thread; it starts the
// grammar's background precomputation of masks (a thread working on a
// private copy, published when done; structured_warm.c). After that the
// lazily built states belong to one thread (the engine thread): matchers
// of one grammar must not be used from two threads at once. Reference
// counts (pg_grammar_ref/unref) are atomic; the last unref waits (for
// microseconds) until the precomputation has stopped, so the vocabulary
// may be freed right after it.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pg_tokenizer;

// --- vocabulary ------------------------------------------------------------------

typedef struct pg_struct_vocab pg_struct_vocab;

// A vocabulary of `n` tokens given as bytes (tok[i][0..len[i])). Tokens with
// special[i] set, and empty tokens, are never allowed by a grammar, except
// `eos` (may be -1), which is allowed exactly where the grammar may end.
// Copies everything. Returns 0, or PG_EINVAL for bad arguments.
int pg_struct_vocab_create(int32_t n, const char *const *tok, const int32_t *len,
                           const bool *special, int32_t eos, pg_struct_vocab **out);
// The same from a loaded tokenizer (token bytes, its special tokens and EOS).
int pg_struct_vocab_from_tokenizer(const struct pg_tokenizer *t, pg_struct_vocab **out);
void pg_struct_vocab_free(pg_struct_vocab *v);  // NULL is a no-op
int32_t pg_struct_vocab_size(const pg_struct_vocab *v);

// --- grammars --------------------------------------------------------------------

typedef enum {
    PG_GRAMMAR_GBNF = 0,        // llama.cpp GBNF text; the start rule is "root"
    PG_GRAMMAR_JSON_SCHEMA = 1, // a JSON Schema text (response_format json_schema, guided_json)
    PG_GRAMMAR_JSON_OBJECT = 2, // any JSON object (response_format json_object); text unused
    PG_GRAMMAR_REGEX = 3,       // a regular expression the whole output must match
    PG_GRAMMAR_CHOICE = 4,      // a JSON array of strings: the output is one of them
} pg_grammar_kind;

typedef struct pg_grammar pg_grammar;

// Hard caps on what a compilation may build, so that no schema or grammar
// can stall the caller or exhaust memory: input bytes, generated rule
// elements, nesting depth, repetition counts; and, at match time, parser
// stacks per state, stack depth and the bytes of lazily built states.
typedef struct pg_grammar_limits {
    size_t max_input;           // bytes of schema / grammar / regex text
    int32_t max_elements;       // rule elements after expansion
    int32_t max_depth;          // nesting of schemas, groups, $ref chains
    int32_t max_repeat;         // m and n of {m,n}, minItems, maxItems, maxLength
    int32_t max_stacks;         // parser stacks in one state (ambiguity)
    int32_t max_stack_depth;    // frames in one stack (nesting of the output)
    size_t max_state_bytes;     // transition rows, keys and masks of one grammar
    // Background precomputation after compile (docs/structured_outputs.md):
    // the masks of up to this many states, breadth first from the start,
    // built on a thread of its own so the first request finds them ready
    // (0: none, every mask is built on first use).
    int32_t precompute_states;
    size_t precompute_bytes;    // memory the precomputed states and masks may hold
    int32_t precompute_ms;      // wall time it may take
} pg_grammar_limits;

void pg_grammar_limits_default(pg_grammar_limits *l);

// Compiles `text[0..len)` of `kind` against `v` (which must outlive the
// grammar). `lim` may be NULL for the defaults. On failure returns
// PG_EINVAL (the input is wrong: a syntax error, an undefined rule, left
// recursion, a schema keyword with a bad value) or PG_EUNSUPP (valid but not
// supported: a keyword this compiler does not implement, a cap exceeded),
// with a one-line reason in err[0..err_cap) naming the problem, and *out NULL.
// The new grammar has one reference.
int pg_grammar_compile(pg_grammar_kind kind, const char *text, size_t len,
                       const pg_struct_vocab *v, const pg_grammar_limits *lim, pg_grammar **out,
                       char *err, size_t err_cap);
pg_grammar *pg_grammar_ref(pg_grammar *g);
void pg_grammar_unref(pg_grammar *g);  // frees at zero; NULL is a no-op

// Converts a JSON schema / regex / choice list to GBNF text without binding
// it to a vocabulary (malloc'd, caller frees; *out NULL on error, with the
// reason in err). For tests, the fuzz target and debugging.
int pg_grammar_to_gbnf(pg_grammar_kind kind, const char *text, size_t len,
                       const pg_grammar_limits *lim, char **out, char *err, size_t err_cap);

// Bytes held by the grammar's lazily built states (rows, keys, masks), and
// their count: for metrics and the benchmarks.
size_t pg_grammar_state_bytes(const pg_grammar *g);
int32_t pg_grammar_state_count(const pg_grammar *g);

// The background precomputation of a grammar's masks.
typedef struct pg_grammar_precompute {
    bool started;               // false: switched off, or too many were running
    bool done;                  // the thread has finished
    bool published;             // its masks are in use (false: gave up on a cap)
    int32_t states;             // states it built
    int32_t masks;              // distinct masks among them (equal ones are shared)
    size_t bytes;               // its distinct masks (its states and rows: pg_grammar_state_bytes)
    double ms;                  // wall time it took
} pg_grammar_precompute;

// Waits up to timeout_ms for the precomputation; true when its masks are
// in use. For the benchmark and tests; the engine never waits (a mask not
// yet precomputed is built on first use, as without it).
bool pg_grammar_precompute_wait(pg_grammar *g, int timeout_ms);
void pg_grammar_precompute_stats(pg_grammar *g, pg_grammar_precompute *out);
// Calls fn(arg) once when g's precomputation has finished (at once when it
// has, or when there is none): how the engine learns that a request it
// holds can go in, without polling. Replaces an earlier hook on g; fn
// NULL clears it, and once that returns no call is in flight. fn runs on
// the precomputing thread under its lock: it must only signal (and the
// caller must not hold a lock fn takes while setting or clearing it).
void pg_grammar_precompute_notify(pg_grammar *g, void (*fn)(void *), void *arg);

// --- matcher ---------------------------------------------------------------------

typedef struct pg_matcher pg_matcher;

// A matcher at the start of `g` (takes a reference on g).
pg_matcher *pg_matcher_create(pg_grammar *g);
void pg_matcher_free(pg_matcher *m);  // NULL is a no-op

// Consumes one token. Returns 0, or PG_EINVAL when the grammar does not
// allow it (the matcher is then unchanged). EOS is accepted where the
// grammar may end and terminates the matcher.
int pg_matcher_advance(pg_matcher *m, int32_t token);

// Writes the allowed tokens as a bitmask: bit (t & 31) of words[t >> 5],
// (vocab + 31) / 32 words. EOS is set where the grammar may end. Never
// all-zero: when no token can continue (a cap was hit while building the
// state), only EOS is set, so the sequence ends rather than stalls.
void pg_matcher_fill_mask(pg_matcher *m, uint32_t *words);

// True once the grammar cannot continue: EOS was consumed, or the output
// is complete and no further byte is allowed. The sequence then stops with
// finish_reason "stop".
bool pg_matcher_is_terminated(const pg_matcher *m);

// True where the output so far is a complete match (EOS would be allowed).
bool pg_matcher_can_end(const pg_matcher *m);

// Returns the matcher to the grammar's start (for a preempted sequence
// that is recomputed).
void pg_matcher_reset(pg_matcher *m);

// Where a matcher is, to come back to (speculative decoding advances a
// matcher through a draft's tokens for their masks, then returns).
typedef struct pg_matcher_pos {
    const void *cur;
    int32_t state;
    bool terminated;
} pg_matcher_pos;
void pg_matcher_save(const pg_matcher *m, pg_matcher_pos *pos);
void pg_matcher_restore(pg_matcher *m, const pg_matcher_pos *pos);

// --- compiled-grammar cache ------------------------------------------------------
//
// Requests that repeat a schema (the common case: one application, one
// schema) share one compiled grammar, and so its lazily built states and
// masks: the second request runs warm. Keyed by (kind, exact text).

typedef struct pg_grammar_cache pg_grammar_cache;

// A cache of at most `capacity` grammars for vocabulary `v` (which must
// outlive it), compiled with `lim` (NULL: the defaults).
pg_grammar_cache *pg_grammar_cache_create(const pg_struct_vocab *v, const pg_grammar_limits *lim,
                                          int capacity);
void pg_grammar_cache_free(pg_grammar_cache *c);  // drops its references; NULL is a no-op

// A new reference (the caller unrefs it) to the grammar for (kind, text),
// compiled on a miss; when full the least recently used entry is dropped
// (sequences using it keep their references). Errors are as
// pg_grammar_compile and are not cached. Thread-safe.
int pg_grammar_cache_get(pg_grammar_cache *c, pg_grammar_kind kind, const char *text, size_t len,
                         pg_grammar **out, char *err, size_t err_cap);
