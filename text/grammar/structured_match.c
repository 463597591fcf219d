// text/grammar/structured_match.c - the vocabulary trie, the lazily determinized
// pushdown automaton, token masks and the per-sequence matcher.
//
// A parser stack is a list of rule-element positions (structured_int.h);
// the top is the next byte set to match. A set of stacks (the grammar is
// allowed to be ambiguous) is interned as a state; a state's transitions
// on each byte, and its token mask, are computed the first time they are
// needed and kept, so a sequence that returns to a state it (or any other
// sequence of the same grammar) has seen pays one 4*ceil(vocab/32)-byte copy.
// A mask is computed by one pre-order walk of the vocabulary trie that
// follows transitions and skips every subtree whose prefix is rejected.
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "text/grammar/structured_state.h"
#include "text/tokenizer/tokenizer.h"

// --- vocabulary ------------------------------------------------------------------


static int cmp_tok(const void *a, const void *b, void *ctx) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const pg_struct_vocab *v = ctx;
    int32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void build_trie(pg_struct_vocab *v) {
    int32_t *order = pg_xmalloc(sizeof(int32_t) * (size_t)(v->n + 1));
    int32_t m = 0;
    for (int32_t i = 0; i < v->n; i++)
        if (v->text[i]) order[m++] = i;
    qsort_r(order, (size_t)m, sizeof(int32_t), cmp_tok, v);
    int64_t cap = 0;
    for (int32_t k = 0; k < m; k++) cap += v->off[order[k] + 1] - v->off[order[k]];
    v->nbyte = pg_xmalloc((size_t)cap + 1);
    v->ndepth = pg_xmalloc(sizeof(uint16_t) * (size_t)(cap + 1));
    v->nskip = pg_xmalloc(sizeof(int32_t) * (size_t)(cap + 1));
    v->ntok = pg_xmalloc(sizeof(int32_t) * (size_t)(cap + 2));
    v->toks = pg_xmalloc(sizeof(int32_t) * (size_t)(m + 1));
    int32_t path[65536 / 4];
    int32_t depth = 0, n_tok = 0, maxd = 0;
    const uint8_t *prev = NULL;
    int32_t prev_len = 0;
    for (int32_t k = 0; k < m; k++) {
        int32_t t = order[k];
        const uint8_t *b = v->bytes + v->off[t];
        int32_t len = v->off[t + 1] - v->off[t];
        if (len > (int32_t)(sizeof path / sizeof path[0]) - 1) continue;  // absurdly long token
        int32_t c = 0;
        while (c < len && c < prev_len && b[c] == prev[c]) c++;
        while (depth > c) v->nskip[path[--depth]] = v->n_nodes;  // close deeper nodes
        for (int32_t d = c; d < len; d++) {
            int32_t id = v->n_nodes++;
            v->nbyte[id] = b[d];
            v->ndepth[id] = (uint16_t)(d + 1);
            v->ntok[id] = n_tok;
            path[depth++] = id;
        }
        if (len > maxd) maxd = len;
        v->toks[n_tok++] = t;
        // tokens at a node are counted by the next node's ntok: keep the
        // start of every later node at the current count
        prev = b;
        prev_len = len;
    }
    while (depth > 0) v->nskip[path[--depth]] = v->n_nodes;
    v->ntok[v->n_nodes] = n_tok;
    // ntok[i] was the token count when node i was created; a node's own
    // tokens are those added before the next node was created.
    v->max_depth = maxd;
    // Children of i are i + 1, then each child's nskip, up to nskip[i];
    // going backwards every child is done before its parent.
    v->nplain = pg_xmalloc((size_t)v->n_nodes + 1);
    v->nsdepth = pg_xmalloc((size_t)v->n_nodes + 1);
    for (int32_t i = v->n_nodes - 1; i >= 0; i--) {
        uint8_t ok = 1;
        int sd = 0;
        for (int32_t c = i + 1; c < v->nskip[i]; c = v->nskip[c]) {
            ok = ok && v->nplain[c] && sg_plain_byte(v->nbyte[c]);
            if (v->nsdepth[c] + 1 > sd) sd = v->nsdepth[c] + 1;
        }
        v->nplain[i] = ok;
        v->nsdepth[i] = (uint8_t)(sd > 255 ? 255 : sd);
    }
    free(order);
}

int pg_struct_vocab_create(int32_t n, const char *const *tok, const int32_t *len,
                           const bool *special, int32_t eos, pg_struct_vocab **out) {
    *out = NULL;
    if (n <= 0 || !tok || !len || eos >= n)
        return pg_err_set(PG_EINVAL, "structured vocab: bad arguments (n %d, eos %d)", n, eos);
    pg_struct_vocab *v = pg_xcalloc(1, sizeof *v);
    v->n = n;
    v->eos = eos;
    v->off = pg_xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (len[i] < 0 || total + len[i] > INT32_MAX / 2) {
            free(v->off);
            free(v);
            return pg_err_set(PG_EINVAL, "structured vocab: bad token length at %d", i);
        }
        total += len[i];
    }
    v->bytes = pg_xmalloc((size_t)total + 1);
    v->text = pg_xcalloc((size_t)n, 1);
    int32_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = o;
        if (len[i]) memcpy(v->bytes + o, tok[i], (size_t)len[i]);
        o += len[i];
        v->text[i] = len[i] > 0 && !(special && special[i]) && i != eos;
    }
    v->off[n] = o;
    build_trie(v);
    *out = v;
    return 0;
}

int pg_struct_vocab_from_tokenizer(const pg_tokenizer *t, pg_struct_vocab **out) {
    int32_t n = pg_tokenizer_vocab_size(t);
    char **tok = pg_xcalloc((size_t)n, sizeof(char *));
    int32_t *len = pg_xcalloc((size_t)n, sizeof(int32_t));
    bool *special = pg_xcalloc((size_t)n, sizeof(bool));
    char buf[1024];
    for (int32_t i = 0; i < n; i++) {
        int k = pg_tokenizer_token_bytes(t, i, buf, sizeof buf);
        if (k < 0 || k > (int)sizeof buf) k = 0;  // never allowed as text
        tok[i] = pg_xmalloc((size_t)k + 1);
        memcpy(tok[i], buf, (size_t)k);
        len[i] = k;
        special[i] = pg_tokenizer_is_special(t, i);
    }
    int rc = pg_struct_vocab_create(n, (const char *const *)tok, len, special, pg_tokenizer_eos(t), out);
    for (int32_t i = 0; i < n; i++) free(tok[i]);
    free(tok);
    free(len);
    free(special);
    return rc;
}

void pg_struct_vocab_free(pg_struct_vocab *v) {
    if (!v) return;
    free(v->off);
    free(v->bytes);
    free(v->text);
    free(v->nbyte);
    free(v->ndepth);
    free(v->nskip);
    free(v->ntok);
    free(v->toks);
    free(v->nplain);
    free(v->nsdepth);
    free(v);
}

int32_t pg_struct_vocab_size(const pg_struct_vocab *v) { return v->n; }

// --- grammar and states ----------------------------------------------------------


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

static void evict_masks(pg_grammar *g) {
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
    if (g->bytes + need > g->lim.max_state_bytes) evict_masks(g);
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
        if (g->bytes + 1024 > g->lim.max_state_bytes) evict_masks(g);
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
        int32_t x = step(g, t, (uint8_t)b);
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
    return step(g, s, b);
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

// A state with the same stacks in the precomputed copy has the same mask
// (the automaton is deterministic in its stacks): borrow it.
static const uint32_t *borrow_mask(pg_grammar *g, int32_t s) {
    const pg_grammar *pre = g->warm ? sg_warm_result(g->warm) : NULL;
    if (!pre) return NULL;
    st_state *st = &g->states[s];
    int32_t id = sg_find_state(pre, g->keys + st->key_off, st->key_len, st->hash);
    if (id < 0 || !pre->states[id].mask) return NULL;
    st->mask = pre->states[id].mask;
    st->borrowed = true;
    return st->mask;
}

static const uint32_t *state_mask(pg_grammar *g, int32_t s) {
    if (g->states[s].mask) return g->states[s].mask;
    const uint32_t *b = borrow_mask(g, s);
    if (b) return b;
    size_t sz = sizeof(uint32_t) * (size_t)g->nw;
    if (g->bytes + sz > g->lim.max_state_bytes) evict_masks(g);
    uint32_t *m = sg_compute_mask(g, s);
    g->states[s].mask = m;  // compute_mask may have grown g->states: index again
    g->bytes += sz;
    return m;
}

void pg_grammar_limits_default(pg_grammar_limits *l) {
    l->max_input = 1 << 20;
    l->max_elements = 1 << 20;
    l->max_depth = 64;
    l->max_repeat = 4096;
    l->max_stacks = 256;
    l->max_stack_depth = 1024;
    l->max_state_bytes = (size_t)256 << 20;
    l->precompute_states = 8192;
    l->precompute_bytes = (size_t)32 << 20;
    l->precompute_ms = 2000;
}

int pg_grammar_to_gbnf(pg_grammar_kind kind, const char *text, size_t len,
                       const pg_grammar_limits *lim, char **out, char *err, size_t err_cap) {
    pg_grammar_limits dl;
    if (!lim) {
        pg_grammar_limits_default(&dl);
        lim = &dl;
    }
    *out = NULL;
    if (err_cap) err[0] = 0;
    if (len > lim->max_input) {
        if (err_cap) snprintf(err, err_cap, "the input is longer than %zu bytes", lim->max_input);
        return PG_EUNSUPP;
    }
    sg_buf b = {.limit = (size_t)lim->max_elements * 8};
    int rc = 0;
    switch (kind) {
    case PG_GRAMMAR_GBNF: sg_putn(&b, text, len); break;
    case PG_GRAMMAR_JSON_SCHEMA: rc = sg_schema_to_gbnf(text, len, lim, &b, err, err_cap); break;
    case PG_GRAMMAR_JSON_OBJECT: sg_json_object_gbnf(&b); break;
    case PG_GRAMMAR_CHOICE: rc = sg_choice_to_gbnf(text, len, &b, err, err_cap); break;
    case PG_GRAMMAR_REGEX:
        sg_puts(&b, "root ::= ");
        rc = sg_regex_to_gbnf(text, len, false, lim, &b, err, err_cap);
        sg_puts(&b, "\n");
        break;
    default:
        if (err_cap) snprintf(err, err_cap, "unknown grammar kind %d", (int)kind);
        rc = PG_EINVAL;
    }
    if (!rc && b.overflow) {
        if (err_cap) snprintf(err, err_cap, "the grammar generated from the input is too large");
        rc = PG_EUNSUPP;
    }
    if (rc < 0) {
        sg_free(&b);
        return rc;
    }
    *out = b.p ? b.p : pg_xstrdup("");
    return 0;
}

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

static int grammar_new(sg_ir *ir, const pg_struct_vocab *v, const pg_grammar_limits *lim,
                       bool reference, pg_grammar **out, char *err, size_t err_cap) {
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
        pg_grammar_unref(g);
        return overflow ? PG_EUNSUPP : PG_EINVAL;
    }
    *out = g;
    return 0;
}

int sg_grammar_new(sg_ir *ir, const pg_struct_vocab *v, const pg_grammar_limits *lim,
                   pg_grammar **out, char *err, size_t err_cap) {
    return grammar_new(ir, v, lim, false, out, err, err_cap);
}

int sg_grammar_compile_reference(pg_grammar_kind kind, const char *text, size_t len,
                                 const pg_struct_vocab *v, pg_grammar **out, char *err, size_t err_cap) {
    *out = NULL;
    pg_grammar_limits lim;
    pg_grammar_limits_default(&lim);
    lim.precompute_states = 0;
    char *gbnf = NULL;
    int rc = pg_grammar_to_gbnf(kind, text, len, &lim, &gbnf, err, err_cap);
    if (rc < 0) return rc;
    sg_ir ir = {0};
    rc = sg_parse_gbnf(gbnf, strlen(gbnf), &lim, &ir, err, err_cap);
    if (rc == 0) rc = grammar_new(&ir, v, &lim, true, out, err, err_cap);
    free(gbnf);
    return rc;
}

int pg_grammar_compile(pg_grammar_kind kind, const char *text, size_t len,
                       const pg_struct_vocab *v, const pg_grammar_limits *lim, pg_grammar **out,
                       char *err, size_t err_cap) {
    *out = NULL;
    pg_grammar_limits dl;
    if (!lim) {
        pg_grammar_limits_default(&dl);
        lim = &dl;
    }
    char *gbnf = NULL;
    int rc = pg_grammar_to_gbnf(kind, text, len, lim, &gbnf, err, err_cap);
    if (rc < 0) return rc;
    sg_ir ir = {0};
    rc = sg_parse_gbnf(gbnf, strlen(gbnf), lim, &ir, err, err_cap);
    if (rc == 0) rc = sg_grammar_new(&ir, v, lim, out, err, err_cap);
    // The copy is compiled again from the text on its own thread: parsing
    // costs about what copying the IR would, and shares nothing.
    if (rc == 0) (*out)->warm = sg_warm_start(gbnf, v, lim);
    free(gbnf);
    return rc;
}

bool pg_grammar_precompute_wait(pg_grammar *g, int timeout_ms) {
    return g->warm && sg_warm_wait(g->warm, timeout_ms);
}

void pg_grammar_precompute_notify(pg_grammar *g, void (*fn)(void *), void *arg) {
    if (g->warm)
        sg_warm_notify(g->warm, fn, arg);
    else if (fn)
        fn(arg); // nothing to wait for
}

void pg_grammar_precompute_stats(pg_grammar *g, pg_grammar_precompute *out) {
    memset(out, 0, sizeof *out);
    if (g->warm) sg_warm_stats(g->warm, out);
}

pg_grammar *pg_grammar_ref(pg_grammar *g) {
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void pg_grammar_unref(pg_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    sg_warm_release(g->warm);
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

// With a published copy its states count too (its pooled masks are in
// pg_grammar_precompute_stats' bytes, not here).
size_t pg_grammar_state_bytes(const pg_grammar *g) {
    const pg_grammar *pre = g->warm ? sg_warm_result(g->warm) : NULL;
    return g->bytes + (pre ? pre->bytes : 0);
}
int32_t pg_grammar_state_count(const pg_grammar *g) {
    const pg_grammar *pre = g->warm ? sg_warm_result(g->warm) : NULL;
    return g->n_states + (pre ? pre->n_states : 0);
}

// --- matcher ---------------------------------------------------------------------

struct pg_matcher {
    pg_grammar *g;
    pg_grammar *cur;  // whose state `state` is: g, or its precomputed copy
    int32_t state;
    bool terminated;
};

// Once the precomputed copy is published it becomes the grammar's state
// store (its rows and masks are all built, and only the engine thread
// touches it from then on): a matcher moves over to the same stacks there
// and finds every transition and mask already computed. A state the copy
// lacks (past its cut) keeps the matcher in g, where it builds as before.
static void move_to_copy(pg_matcher *m) {
    if (m->cur != m->g || !m->g->warm) return;
    pg_grammar *pre = (pg_grammar *)sg_warm_result(m->g->warm);
    if (!pre) return;
    const st_state *st = &m->g->states[m->state];
    int32_t id = sg_find_state(pre, m->g->keys + st->key_off, st->key_len, st->hash);
    if (id < 0) return;
    m->cur = pre;
    m->state = id;
}

pg_matcher *pg_matcher_create(pg_grammar *g) {
    pg_matcher *m = pg_xcalloc(1, sizeof *m);
    m->g = pg_grammar_ref(g);
    m->cur = g;
    m->state = g->start;
    move_to_copy(m);
    return m;
}

void pg_matcher_free(pg_matcher *m) {
    if (!m) return;
    pg_grammar_unref(m->g);
    free(m);
}

void pg_matcher_reset(pg_matcher *m) {
    m->cur = m->g;
    m->state = m->g->start;
    m->terminated = false;
    move_to_copy(m);
}

static bool state_final(const pg_grammar *g, int32_t s) {
    const st_state *st = &g->states[s];
    if (!st->accepting) return false;
    for (int w = 0; w < 8; w++)
        if (st->first[w]) return false;
    return true;
}

int pg_matcher_advance(pg_matcher *m, int32_t token) {
    move_to_copy(m);
    pg_grammar *g = m->cur;
    const pg_struct_vocab *v = g->v;
    if (m->terminated || token < 0 || token >= v->n)
        return pg_err_set(PG_EINVAL, "grammar: token %d after the end", token);
    if (token == v->eos) {
        // EOS is allowed where the output may end, and, as a way out, where
        // no text token can continue (the mask then holds only EOS).
        if (!g->states[m->state].accepting) {
            const uint32_t *mask = state_mask(g, m->state);
            bool other = false;
            for (int32_t w = 0; w < g->nw && !other; w++)
                other = (mask[w] & ~(w == (v->eos >> 5) ? 1u << (v->eos & 31) : 0u)) != 0;
            if (other) return pg_err_set(PG_EINVAL, "grammar: the output cannot end here");
        }
        m->terminated = true;
        return 0;
    }
    if (!v->text[token]) return pg_err_set(PG_EINVAL, "grammar: token %d is not text", token);
    int32_t s = m->state;
    for (int32_t i = v->off[token]; i < v->off[token + 1] && s >= 0; i++) s = step(g, s, v->bytes[i]);
    if (s < 0) return pg_err_set(PG_EINVAL, "grammar: token %d is not allowed here", token);
    m->state = s;
    if (state_final(g, s)) m->terminated = true;
    return 0;
}

void pg_matcher_fill_mask(pg_matcher *m, uint32_t *words) {
    move_to_copy(m);
    pg_grammar *g = m->cur;
    if (m->terminated) {
        memset(words, 0, sizeof(uint32_t) * (size_t)g->nw);
        if (g->v->eos >= 0) words[g->v->eos >> 5] |= 1u << (g->v->eos & 31);
        return;
    }
    memcpy(words, state_mask(g, m->state), sizeof(uint32_t) * (size_t)g->nw);
}

bool pg_matcher_is_terminated(const pg_matcher *m) { return m->terminated; }

bool pg_matcher_can_end(const pg_matcher *m) {
    return m->terminated || m->cur->states[m->state].accepting;
}

void sg_matcher_reference_mask(pg_matcher *m, uint32_t *words) {
    pg_grammar *g = m->cur;
    const pg_struct_vocab *v = g->v;
    memset(words, 0, sizeof(uint32_t) * (size_t)g->nw);
    bool any = false;
    if (!m->terminated)
        for (int32_t t = 0; t < v->n; t++) {
            if (!v->text[t]) continue;
            int32_t s = m->state;
            for (int32_t i = v->off[t]; i < v->off[t + 1] && s >= 0; i++) s = step(g, s, v->bytes[i]);
            if (s < 0) continue;
            words[t >> 5] |= 1u << (t & 31);
            any = true;
        }
    if (v->eos >= 0 && (m->terminated || !any || g->states[m->state].accepting))
        words[v->eos >> 5] |= 1u << (v->eos & 31);
}
