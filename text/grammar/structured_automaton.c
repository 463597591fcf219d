// text/grammar/structured_automaton.c - the lazily determinized pushdown
// automaton of a grammar.
//
// A parser stack is a list of rule-element positions (structured_int.h);
// the top is the next byte set to match. A set of stacks (the grammar is
// allowed to be ambiguous) is interned as a state; a state's transitions
// on each byte are computed the first time they are needed and kept, for
// a whole byte class at once. Token masks over these states are
// structured_mask.c's; the matcher and the public API, structured_match.c.
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_state.h"

// The stacks a step or a closure produces, before interning.
typedef struct builder {
    int32_t *data;        // stacks back to back
    size_t len, cap;
    size_t *start;        // [n] offset of each stack
    int32_t *slen;
    int32_t n, cap_n;
    int64_t work;
    int recursion;
    bool overflow;
} builder;

static void builder_add(builder *B, const int32_t *stk, int32_t n) {
    if (B->n == B->cap_n) {
        B->cap_n = B->cap_n ? B->cap_n * 2 : 16;
        B->start = pg_xrealloc(B->start, sizeof(size_t) * (size_t)B->cap_n);
        B->slen = pg_xrealloc(B->slen, sizeof(int32_t) * (size_t)B->cap_n);
    }
    if (B->len + (size_t)n > B->cap) {
        B->cap = (B->cap + (size_t)n) * 2;
        B->data = pg_xrealloc(B->data, sizeof(int32_t) * B->cap);
    }
    if (n) memcpy(B->data + B->len, stk, sizeof(int32_t) * (size_t)n);
    B->start[B->n] = B->len;
    B->slen[B->n++] = n;
    B->len += (size_t)n;
}

static void builder_free(builder *B) {
    free(B->data);
    free(B->start);
    free(B->slen);
}

// Adds every stack reachable from stk[0..n) without consuming a byte: pops
// finished alternatives, expands rule references (a reference that ends
// its alternative is a tail call: its frame is dropped first).
static void closure(pg_grammar *g, builder *B, int32_t *stk, int32_t n) {
    const sg_elem *el = g->ir.el;
    for (;;) {
        if (B->overflow) return;
        if (++B->work > CLOSURE_WORK || n > g->lim.max_stack_depth) {
            B->overflow = true;
            return;
        }
        if (n == 0) {
            builder_add(B, stk, 0);
            return;
        }
        int32_t p = stk[n - 1];
        if (el[p].kind == SG_END) {
            n--;
            continue;
        }
        if (el[p].kind == SG_BYTES) {
            if (B->n >= g->lim.max_stacks * 4) {
                B->overflow = true;
                return;
            }
            builder_add(B, stk, n);
            return;
        }
        break;  // SG_REF
    }
    if (++B->recursion > CLOSURE_RECURSION) {
        B->overflow = true;
        return;
    }
    int32_t p = stk[n - 1];
    const sg_rule *r = &g->ir.rules[el[p].arg];
    int32_t *buf = pg_xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    memcpy(buf, stk, sizeof(int32_t) * (size_t)(n - 1));
    int32_t m = n - 1;
    if (el[p + 1].kind != SG_END) buf[m++] = p + 1;
    for (int32_t a = 0; a < r->n_alts && !B->overflow; a++) {
        buf[m] = g->ir.alts[r->first_alt + a];
        closure(g, B, buf, m + 1);
    }
    free(buf);
    B->recursion--;
}

// qsort_r's comparison (no shared context: the loop thread compiles
// grammars while the engine thread builds states of others).
static int cmp_stack(const void *a, const void *b, void *ctx) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const builder *B = ctx;
    if (B->slen[i] != B->slen[j]) return B->slen[i] < B->slen[j] ? -1 : 1;
    if (B->slen[i] == 0) return 0;
    return memcmp(B->data + B->start[i], B->data + B->start[j], sizeof(int32_t) * (size_t)B->slen[i]);
}

static uint32_t hash_key(const int32_t *k, int32_t n) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)k[i]) * 16777619u;
    return h ^ (uint32_t)n;
}

// Drops every mask the grammar computed (and forgets borrowed ones) to make
// room under lim.max_state_bytes; marks the grammar spent (structured_state.h).
void sg_evict_masks(pg_grammar *g) {
    g->spent = true;
    for (int32_t s = 0; s < g->n_states; s++) {
        st_state *st = &g->states[s];
        if (st->mask && !st->borrowed) {
            free(st->mask);
            g->bytes -= sizeof(uint32_t) * (size_t)g->nw;
        }
        st->mask = NULL;
        st->borrowed = false;
    }
}

static void hash_put(pg_grammar *g, int32_t s) {
    uint32_t h = g->states[s].hash & (uint32_t)(g->hash_cap - 1);
    while (g->hash[h] >= 0) h = (h + 1) & (uint32_t)(g->hash_cap - 1);
    g->hash[h] = s;
}

// Interns B's stacks (deduplicated, in a canonical order) as a state.
// Returns its id, or DEAD when there are none, too many, or the grammar's
// state memory is spent.
static int32_t intern(pg_grammar *g, builder *B) {
    if (B->overflow || B->n == 0) return DEAD;
    int32_t *order = pg_xmalloc(sizeof(int32_t) * (size_t)B->n);
    for (int32_t i = 0; i < B->n; i++) order[i] = i;
    qsort_r(order, (size_t)B->n, sizeof(int32_t), cmp_stack, B);
    int32_t u = 0;
    for (int32_t i = 0; i < B->n; i++)
        if (!u || cmp_stack(&order[u - 1], &order[i], B)) order[u++] = order[i];
    if (u > g->lim.max_stacks) {
        free(order);
        return DEAD;
    }
    size_t klen = 0;
    for (int32_t i = 0; i < u; i++) klen += 1 + (size_t)B->slen[order[i]];
    int32_t *key = pg_xmalloc(sizeof(int32_t) * klen);
    size_t o = 0;
    for (int32_t i = 0; i < u; i++) {
        key[o++] = B->slen[order[i]];
        if (B->slen[order[i]]) memcpy(key + o, B->data + B->start[order[i]], sizeof(int32_t) * (size_t)B->slen[order[i]]);
        o += (size_t)B->slen[order[i]];
    }
    free(order);
    uint32_t h = hash_key(key, (int32_t)klen);
    int32_t found = sg_find_state(g, key, (int32_t)klen, h);
    if (found >= 0) {
        free(key);
        return found;
    }
    size_t need = sizeof(st_state) + sizeof(int32_t) * klen + 8;
    if (g->bytes + need > g->lim.max_state_bytes) sg_evict_masks(g);
    if (g->bytes + need > g->lim.max_state_bytes) {
        g->spent = true;
        free(key);
        return DEAD;
    }
    if (g->n_states == g->cap_states) {
        g->cap_states = g->cap_states ? g->cap_states * 2 : 64;
        g->states = pg_xrealloc(g->states, sizeof(st_state) * (size_t)g->cap_states);
    }
    if (g->keys_len + klen > g->keys_cap) {
        g->keys_cap = (g->keys_cap + klen) * 2;
        g->keys = pg_xrealloc(g->keys, sizeof(int32_t) * g->keys_cap);
    }
    int32_t id = g->n_states++;
    st_state *s = &g->states[id];
    memset(s, 0, sizeof *s);
    s->chain = CHAIN_UNKNOWN;
    s->key_off = g->keys_len;
    s->key_len = (int32_t)klen;
    s->hash = h;
    memcpy(g->keys + g->keys_len, key, sizeof(int32_t) * klen);
    g->keys_len += klen;
    g->bytes += need;
    for (size_t k = 0; k < klen; k += 1 + (size_t)key[k]) {
        int32_t n = key[k];
        if (n == 0) {
            s->accepting = true;
            continue;
        }
        const uint32_t *set = g->ir.sets[g->ir.el[key[k + (size_t)n]].arg];
        for (int w = 0; w < 8; w++) s->first[w] |= set[w];
    }
    free(key);
    if ((int64_t)g->n_states * 2 > g->hash_cap) {
        free(g->hash);
        g->hash_cap *= 2;
        g->hash = pg_xmalloc(sizeof(int32_t) * (size_t)g->hash_cap);
        for (int32_t i = 0; i < g->hash_cap; i++) g->hash[i] = -1;
        for (int32_t i = 0; i < g->n_states; i++) hash_put(g, i);
    } else {
        hash_put(g, id);
    }
    return id;
}

int32_t sg_find_state(const pg_grammar *g, const int32_t *key, int32_t klen, uint32_t h) {
    for (uint32_t i = h & (uint32_t)(g->hash_cap - 1); g->hash[i] >= 0;
         i = (i + 1) & (uint32_t)(g->hash_cap - 1)) {
        const st_state *s = &g->states[g->hash[i]];
        if (s->hash == h && s->key_len == klen &&
            !memcmp(g->keys + s->key_off, key, sizeof(int32_t) * (size_t)klen))
            return g->hash[i];
    }
    return -1;
}

// The state after byte b from state s (DEAD when no stack takes b).
static int32_t step(pg_grammar *g, int32_t s, uint8_t b) {
    st_state *st = &g->states[s];
    if (!(st->first[b >> 5] >> (b & 31) & 1)) return DEAD;
    if (st->row && st->row[b] != ROW_UNKNOWN) return st->row[b];
    if (!st->row) {
        if (g->bytes + 1024 > g->lim.max_state_bytes) sg_evict_masks(g);
        st->row = pg_xmalloc(sizeof(int32_t) * 256);
        for (int i = 0; i < 256; i++) st->row[i] = ROW_UNKNOWN;
        g->bytes += sizeof(int32_t) * 256;
    }
    builder B = {0};
    // Copy the key: interning may move the key arena.
    size_t klen = (size_t)st->key_len;
    int32_t *key = pg_xmalloc(sizeof(int32_t) * (klen + 1));
    memcpy(key, g->keys + st->key_off, sizeof(int32_t) * klen);
    for (size_t k = 0; k < klen; k += 1 + (size_t)key[k]) {
        int32_t n = key[k];
        if (n == 0) continue;
        int32_t *stk = key + k + 1;
        int32_t top = stk[n - 1];
        const uint32_t *set = g->ir.sets[g->ir.el[top].arg];
        if (!(set[b >> 5] >> (b & 31) & 1)) continue;
        int32_t *copy = pg_xmalloc(sizeof(int32_t) * (size_t)n);
        memcpy(copy, stk, sizeof(int32_t) * (size_t)n);
        copy[n - 1] = top + 1;
        closure(g, &B, copy, n);
        free(copy);
    }
    free(key);
    int32_t t = intern(g, &B);
    builder_free(&B);
    // The whole byte class goes where b goes (structured_state.h).
    int32_t *row = g->states[s].row;
    row[b] = t;
    for (uint8_t c = g->cls_next[b]; c != b; c = g->cls_next[c]) row[c] = t;
    return t;
}

int32_t sg_step(pg_grammar *g, int32_t s, uint8_t b) { return step(g, s, b); }

// Partitions the bytes into classes by their membership in every byte set
// an element uses (structured_state.h; the IR keeps all 256 one-byte sets
// whether used or not). Past 1024 distinct sets the partition is left at
// one byte per class: exact, only without the sharing, and it bounds the
// work (256 steps per set) to well under a millisecond.
static void byte_classes(pg_grammar *g) {
    uint8_t cls[256] = {0};
    int32_t n = 1;
    int32_t *used = pg_xmalloc(sizeof(int32_t) * (size_t)(g->ir.n_sets + 1));
    uint8_t *seen = pg_xcalloc((size_t)g->ir.n_sets + 1, 1);
    int32_t n_used = 0;
    for (int32_t e = 0; e < g->ir.n_el && n_used <= 1024; e++)
        if (g->ir.el[e].kind == SG_BYTES && !seen[g->ir.el[e].arg]) {
            seen[g->ir.el[e].arg] = 1;
            used[n_used++] = g->ir.el[e].arg;
        }
    free(seen);
    if (n_used <= 1024 && !g->reference) {
        for (int32_t k = 0; k < n_used && n < 256; k++) {
            const uint32_t *set = g->ir.sets[used[k]];
            int16_t split[256];  // class -> new class for members of set k
            for (int i = 0; i < 256; i++) split[i] = -1;
            uint8_t has_out[256] = {0};
            for (int b = 0; b < 256; b++)
                if (!(set[b >> 5] >> (b & 31) & 1)) has_out[cls[b]] = 1;
            int32_t m = n;
            for (int b = 0; b < 256; b++) {
                if (!(set[b >> 5] >> (b & 31) & 1) || !has_out[cls[b]]) continue;
                if (split[cls[b]] < 0) split[cls[b]] = (int16_t)m++;
                cls[b] = (uint8_t)split[cls[b]];
            }
            n = m;
        }
    } else {
        for (int b = 0; b < 256; b++) cls[b] = (uint8_t)b;
        n = 256;
    }
    free(used);
    int16_t last[256];
    for (int i = 0; i < 256; i++) last[i] = -1;
    int16_t first[256];
    g->n_reps = 0;
    for (int b = 0; b < 256; b++) {
        if (last[cls[b]] < 0) {
            first[cls[b]] = (int16_t)b;
            g->reps[g->n_reps++] = (uint8_t)b;
        } else {
            g->cls_next[last[cls[b]]] = (uint8_t)b;
        }
        last[cls[b]] = (int16_t)b;
    }
    for (int c = 0; c < 256; c++)
        if (last[c] >= 0) g->cls_next[last[c]] = (uint8_t)first[c];
}

int sg_grammar_new(sg_ir *ir, const pg_struct_vocab *v, const pg_grammar_limits *lim, bool reference,
                   pg_grammar **out, char *err, size_t err_cap) {
    *out = NULL;
    pg_grammar *g = pg_xcalloc(1, sizeof *g);
    g->reference = reference;
    g->ir = *ir;
    memset(ir, 0, sizeof *ir);
    atomic_init(&g->refs, 1);
    g->v = v;
    g->lim = *lim;
    g->nw = (v->n + 31) / 32;
    g->hash_cap = 256;
    g->hash = pg_xmalloc(sizeof(int32_t) * (size_t)g->hash_cap);
    for (int32_t i = 0; i < g->hash_cap; i++) g->hash[i] = -1;
    g->walk = pg_xmalloc(sizeof(int32_t) * (size_t)(v->max_depth + 2));
    byte_classes(g);
    builder B = {0};
    const sg_rule *root = &g->ir.rules[g->ir.root];
    for (int32_t a = 0; a < root->n_alts && !B.overflow; a++) {
        int32_t p = g->ir.alts[root->first_alt + a];
        closure(g, &B, &p, 1);
    }
    g->start = intern(g, &B);
    bool overflow = B.overflow;
    builder_free(&B);
    if (g->start < 0) {
        if (err_cap)
            snprintf(err, err_cap, overflow ? "the grammar is too ambiguous at its start"
                                            : "the grammar matches nothing");
        sg_grammar_free(g);
        return overflow ? PG_EUNSUPP : PG_EINVAL;
    }
    *out = g;
    return 0;
}

// Frees g whatever its count (the caller holds the only reference) and
// without touching g->warm: pg_grammar_unref releases that first.
void sg_grammar_free(pg_grammar *g) {
    if (!g) return;
    for (int32_t s = 0; s < g->n_states; s++) {
        free(g->states[s].row);
        if (!g->states[s].borrowed) free(g->states[s].mask);
    }
    free(g->states);
    free(g->keys);
    free(g->hash);
    free(g->walk);
    sg_ir_free(&g->ir);
    free(g);
}
