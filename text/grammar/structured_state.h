// text/grammar/structured_state.h - the automaton's data, shared by the
// vocabulary (structured_vocab.c), the automaton (structured_automaton.c),
// the mask walk (structured_mask.c), the matcher (structured_match.c) and
// the background precomputation of masks (structured_warm.c). Not a public
// header.
#pragma once
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "text/grammar/structured_int.h"

struct pg_struct_vocab {
    int32_t n;
    int32_t eos;
    int32_t *off;      // [n + 1] token bytes are bytes[off[i]..off[i+1])
    uint8_t *bytes;
    uint8_t *text;     // [n] 1 when the token can be matched as text
    // The trie of text tokens in pre-order: node i has byte nbyte[i] at
    // depth ndepth[i] (1 = first byte), its subtree ends before nskip[i],
    // and tokens toks[ntok[i]..ntok[i+1]) end exactly there.
    int32_t n_nodes;
    uint8_t *nbyte;
    uint16_t *ndepth;
    int32_t *nskip;
    int32_t *ntok;     // [n_nodes + 1]
    int32_t *toks;
    int32_t max_depth;
    // [n_nodes] 1 when every byte below node i (its descendants, not i
    // itself) is plain: printable ASCII other than '"' and '\\', the bytes
    // a JSON string body takes one by one (see plain_chain in
    // structured_mask.c); nsdepth[i]: how deep the subtree below i goes
    // (0: a leaf), 255 meaning 255 or more.
    uint8_t *nplain;
    uint8_t *nsdepth;
};

// Bytes 0x20-0x7E except '"' and '\\'.
static inline bool sg_plain_byte(uint8_t b) { return b >= 0x20 && b <= 0x7E && b != '"' && b != '\\'; }

#define ROW_UNKNOWN (-2)
// st_state.chain (structured_mask.c, plain_chain): not yet known; a cycle;
// the longest chain followed (a lower bound beyond it).
#define CHAIN_UNKNOWN 0xFFFF
#define CHAIN_LOOP 0xFFFE
#define CHAIN_MAX 256
#define DEAD (-1)
// Closure work per state (stack visits): beyond it the state is cut short.
#define CLOSURE_WORK 200000
#define CLOSURE_RECURSION 4000

typedef struct st_state {
    size_t key_off;       // stacks, serialized: [len, positions...] per stack, sorted
    int32_t key_len;
    uint32_t hash;
    int32_t *row;         // [256] next state per byte, ROW_UNKNOWN until computed
    uint32_t *mask;       // [nw] allowed tokens, NULL until computed
    uint32_t first[8];    // bytes some stack can take
    bool accepting;       // holds an empty stack: the output may end here
    bool borrowed;        // mask belongs to the precomputed grammar (structured_warm.c)
    uint16_t chain;       // plain_chain's answer, CHAIN_UNKNOWN until asked
} st_state;

struct pg_grammar {
    atomic_int refs;
    sg_ir ir;
    const pg_struct_vocab *v;
    pg_grammar_limits lim;
    int32_t nw;           // mask words
    int32_t start;
    st_state *states;
    int32_t n_states, cap_states;
    int32_t *keys;
    size_t keys_len, keys_cap;
    int32_t *hash;        // open addressing over states, -1 = empty
    int32_t hash_cap;
    size_t bytes;         // rows + keys + masks
    int32_t *walk;        // [max_depth + 1] state per trie depth
    // Bytes of one class are in every byte set of the grammar or in none,
    // so every state treats them alike: a computed transition is stored
    // for the whole class. cls_next links a class's bytes in a ring;
    // reps[0..n_reps) holds one byte per class.
    uint8_t cls_next[256];
    uint8_t reps[256];
    int32_t n_reps;
    // A cap on state memory changed a result (a state came out DEAD or
    // masks were dropped): the precomputing copy then publishes nothing.
    bool spent;
    bool reference;       // the slow exact form for tests: no classes, no shortcuts
    atomic_bool *cancel;  // the precomputing copy's stop flag (sg_compute_mask polls it)
    double deadline_ms;   // and its deadline (CLOCK_MONOTONIC ms; 0: none)
    bool cut;             // sg_compute_mask stopped early for either: its mask is partial
    struct sg_warm *warm; // the background precomputation, NULL if none
};

// --- what structured_automaton.c provides ---------------------------------------

// Binds a parsed IR (taken over; freed on failure) to v as a new grammar
// with one reference and its start state, without background work;
// `reference` builds the slow exact form (no byte classes, no shortcuts).
int sg_grammar_new(sg_ir *ir, const pg_struct_vocab *v, const pg_grammar_limits *lim, bool reference,
                   pg_grammar **out, char *err, size_t err_cap);
// Frees a grammar (NULL: nothing) regardless of its count, leaving g->warm
// alone: pg_grammar_unref releases that before calling it.
void sg_grammar_free(pg_grammar *g);
// The state after byte b from s (DEAD when refused); builds it if new.
int32_t sg_step(pg_grammar *g, int32_t s, uint8_t b);
// The id of the state whose key is key[0..klen) (hash as interned), or -1.
int32_t sg_find_state(const pg_grammar *g, const int32_t *key, int32_t klen, uint32_t hash);
// Drops the masks the grammar computed, to stay under lim.max_state_bytes.
void sg_evict_masks(pg_grammar *g);

// --- what structured_mask.c provides --------------------------------------------

// A new mask (malloc'd, nw words) for s by the exact trie walk.
uint32_t *sg_compute_mask(pg_grammar *g, int32_t s);

// --- what structured_match.c provides -------------------------------------------

// For tests: the grammar in its slow exact form (one byte per class, the
// trie walked node by node, nothing precomputed), and a mask computed
// token by token, each token's bytes stepped one at a time from the
// matcher's state, with the EOS rule of pg_matcher_fill_mask.
int sg_grammar_compile_reference(pg_grammar_kind kind, const char *text, size_t len,
                                 const pg_struct_vocab *v, pg_grammar **out, char *err, size_t err_cap);
void sg_matcher_reference_mask(pg_matcher *m, uint32_t *words);

// --- what structured_warm.c provides --------------------------------------------

typedef struct sg_warm sg_warm;

// Starts precomputing, on a thread of its own, the masks of the states a
// grammar reaches (a breadth-first walk of its automaton over byte
// classes), on a private copy compiled from `gbnf`. Returns NULL when
// switched off by lim->precompute_states or when enough others run.
sg_warm *sg_warm_start(const char *gbnf, const pg_struct_vocab *v, const pg_grammar_limits *lim);
// The finished copy (read-only, its masks final), or NULL while running
// or when it gave up. Safe from any thread.
const pg_grammar *sg_warm_result(sg_warm *w);
// Stops it (if still running), waits until it has (microseconds: it polls
// a flag), and drops the caller's hold.
void sg_warm_release(sg_warm *w);
// Waits up to timeout_ms for the thread to finish; true when a result is
// published. Fills the stats for pg_grammar_precompute_stats.
bool sg_warm_wait(sg_warm *w, int timeout_ms);
void sg_warm_stats(sg_warm *w, pg_grammar_precompute *st);
// Calls fn(arg) once when the thread has finished (at once when it has):
// replaces an earlier hook; fn NULL clears it. fn runs on the thread with
// w's lock held, so once a clear has returned no call is in flight; it
// must only signal (it must not call back into w).
void sg_warm_notify(sg_warm *w, void (*fn)(void *), void *arg);
