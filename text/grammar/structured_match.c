// text/grammar/structured_match.c - the public side of structured outputs
// (structured.h): compiling a grammar of any kind to the automaton
// (structured_automaton.c), its reference count and precomputation
// (structured_warm.c), the per-state cache of token masks (structured_mask.c
// computes them), and the per-sequence matcher. A sequence that returns to
// a state it (or any other sequence of the same grammar) has seen pays one
// 4*ceil(vocab/32)-byte copy for its mask.
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_state.h"

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
    if (g->bytes + sz > g->lim.max_state_bytes) sg_evict_masks(g);
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
    if (rc == 0) rc = sg_grammar_new(&ir, v, &lim, true, out, err, err_cap);
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
    if (rc == 0) rc = sg_grammar_new(&ir, v, lim, false, out, err, err_cap);
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
    sg_grammar_free(g);
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
    for (int32_t i = v->off[token]; i < v->off[token + 1] && s >= 0; i++) s = sg_step(g, s, v->bytes[i]);
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

// The grammar a matcher is in (g or its precomputed copy, both alive while
// the matcher is) and the state there: enough to come back.
void pg_matcher_save(const pg_matcher *m, pg_matcher_pos *pos) {
    *pos = (pg_matcher_pos){m->cur, m->state, m->terminated};
}

void pg_matcher_restore(pg_matcher *m, const pg_matcher_pos *pos) {
    m->cur = (pg_grammar *)pos->cur;
    m->state = pos->state;
    m->terminated = pos->terminated;
}

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
            for (int32_t i = v->off[t]; i < v->off[t + 1] && s >= 0; i++) s = sg_step(g, s, v->bytes[i]);
            if (s < 0) continue;
            words[t >> 5] |= 1u << (t & 31);
            any = true;
        }
    if (v->eos >= 0 && (m->terminated || !any || g->states[m->state].accepting))
        words[v->eos >> 5] |= 1u << (v->eos & 31);
}
