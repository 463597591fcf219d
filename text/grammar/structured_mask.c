// text/grammar/structured_mask.c - a state's token mask: one pre-order walk of
// the vocabulary trie (structured_vocab.c) that follows the automaton's
// transitions (structured_automaton.c) and skips every subtree whose prefix
// is rejected, taking a plain subtree whole where the state is sure to
// accept all of it. The matcher (structured_match.c) caches the result per
// state; the background precomputation (structured_warm.c) runs it ahead.
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "common/err.h"
#include "text/grammar/structured_state.h"

// How many plain bytes in a row (structured_state.h) state t is sure to
// take: t_0 = t, and while every plain byte leads from t_j to one same
// live state t_{j+1}, one more. CHAIN_LOOP when that goes round a cycle
// (a JSON string body: every plain byte leads back to t); a string with a
// maxLength counts down. Then every token below a plain trie node whose
// subtree is no deeper than the chain is accepted, and the walk takes the
// subtree whole instead of node by node. Exact: it is what stepping each
// byte finds. Computed once per state (94 transitions, most shared by
// byte class).

static int32_t plain_next(pg_grammar *g, int32_t t) {
    int32_t u = -1;
    for (int b = 0x20; b <= 0x7E; b++) {
        if (!sg_plain_byte((uint8_t)b)) continue;
        int32_t x = sg_step(g, t, (uint8_t)b);
        if (x < 0 || (u >= 0 && x != u)) return -1;
        u = x;
    }
    return u;
}

static uint32_t plain_chain(pg_grammar *g, int32_t t) {
    if (g->states[t].chain != CHAIN_UNKNOWN) return g->states[t].chain;
    int32_t path[CHAIN_MAX + 1];
    int32_t n = 0, cur = t;
    uint32_t tail = 0;  // the chain of the state after the path's last
    for (;;) {
        if (g->states[cur].chain != CHAIN_UNKNOWN) {
            tail = g->states[cur].chain;
            break;
        }
        bool seen = false;
        for (int32_t k = 0; k < n && !seen; k++) seen = path[k] == cur;
        if (seen) {  // a cycle: the chain never ends
            tail = CHAIN_LOOP;
            break;
        }
        if (n == CHAIN_MAX) {  // cur not checked: a lower bound for the path
            tail = 0;
            break;
        }
        path[n++] = cur;
        int32_t nx = plain_next(g, cur);
        if (nx < 0) {
            g->states[cur].chain = 0;
            n--;
            tail = 0;
            break;
        }
        cur = nx;
    }
    for (int32_t k = n - 1; k >= 0; k--) {
        if (tail != CHAIN_LOOP) tail = tail + 1 > CHAIN_MAX ? CHAIN_MAX : tail + 1;
        g->states[path[k]].chain = (uint16_t)tail;
    }
    return g->states[t].chain;
}

// Whether the whole subtree below node i is taken from state t.
static bool take_subtree(pg_grammar *g, int32_t i, int32_t t) {
    const pg_struct_vocab *v = g->v;
    if (g->reference || !v->nplain[i] || v->nskip[i] == i + 1) return false;
    uint32_t c = plain_chain(g, t);
    uint8_t d = v->nsdepth[i];
    return c == CHAIN_LOOP || (d < 255 && c >= d);
}

// The transition, from the row when it is known (the walk's inner loop).
static inline int32_t step_fast(pg_grammar *g, int32_t s, uint8_t b) {
    const st_state *st = &g->states[s];
    if (!(st->first[b >> 5] >> (b & 31) & 1)) return DEAD;
    if (st->row && st->row[b] != ROW_UNKNOWN) return st->row[b];
    return sg_step(g, s, b);
}

// The precomputing copy's poll: dropped, or past its deadline.
static bool copy_should_stop(const pg_grammar *g) {
    if (atomic_load_explicit(g->cancel, memory_order_relaxed)) return true;
    if (g->deadline_ms <= 0) return false;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6 > g->deadline_ms;
}

// Walks the vocabulary trie from state s.
uint32_t *sg_compute_mask(pg_grammar *g, int32_t s) {
    const pg_struct_vocab *v = g->v;
    uint32_t *words = pg_xcalloc((size_t)g->nw, sizeof(uint32_t));
    int32_t *walk = g->walk;
    walk[0] = s;
    int32_t poll = 0;
    for (int32_t i = 0; i < v->n_nodes;) {
        // A dropped grammar's copy stops within microseconds (the result
        // is then thrown away): sg_warm_release waits for it.
        if (g->cancel && ++poll % 4096 == 0 && copy_should_stop(g)) {
            g->cut = true;
            break;
        }
        int32_t d = v->ndepth[i];
        int32_t t = step_fast(g, walk[d - 1], v->nbyte[i]);
        if (t < 0) {
            i = v->nskip[i];
            continue;
        }
        walk[d] = t;
        // A plain subtree from a state that loops on plain bytes: all of it.
        bool whole = take_subtree(g, i, t);
        int32_t end = whole ? v->ntok[v->nskip[i]] : v->ntok[i + 1];
        for (int32_t k = v->ntok[i]; k < end; k++) {
            int32_t id = v->toks[k];
            words[id >> 5] |= 1u << (id & 31);
        }
        i = whole ? v->nskip[i] : i + 1;
    }
    bool any = false;
    for (int32_t w = 0; w < g->nw && !any; w++) any = words[w] != 0;
    if (v->eos >= 0 && (g->states[s].accepting || !any)) words[v->eos >> 5] |= 1u << (v->eos & 31);
    return words;
}
