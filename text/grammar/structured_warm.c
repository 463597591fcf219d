// text/grammar/structured_warm.c - precomputes a grammar's token masks in the
// background right after it is compiled, so that a schema's first request
// finds them built (structured_state.h, docs/structured_outputs.md).
//
// Why: a mask is one walk of the vocabulary trie from a state, and a state
// inside a string accepts almost every token, so its walk visits the whole
// trie (1-4 ms at 128k tokens). Built on first use, those walks land in the
// first request's decode steps. Here a private copy of the grammar (parsed
// again from its GBNF, sharing nothing mutable) walks its automaton breadth
// first from the start, one byte per byte class, and computes every
// state's mask with the same exact trie walk; equal masks are stored once.
// When done it publishes the copy with one release store; from then on the
// engine thread borrows a mask by looking its state's stacks up in the
// copy (the automaton is deterministic in its stacks, so the same stacks
// give the same mask). Before that, or for a state the copy never reached,
// the engine builds the mask itself as before: correctness never depends on
// the timing.
//
// Bounds: the copy stops at lim->precompute_states states, ->precompute_bytes
// of memory, ->precompute_ms of wall time, or when the grammar is dropped;
// at most MAX_RUNNING copies work at once (others are not precomputed). A
// copy that hits a cap on state memory publishes nothing, since a capped
// state may differ from what the engine's grammar would build.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "text/grammar/structured_state.h"

#define MAX_RUNNING 2

static atomic_int running;

// Equal masks stored once: open addressing on a hash of the words.
typedef struct mask_pool {
    uint32_t **m;
    uint64_t *h;
    int32_t n, cap;
} mask_pool;

struct sg_warm {
    atomic_int refs;                 // the grammar's hold and the thread's
    atomic_bool cancel;              // the grammar was dropped
    atomic_bool done;
    _Atomic(pg_grammar *) result;    // set once, when published
    pthread_mutex_t mu;              // with cv: sg_warm_wait
    pthread_cond_t cv;
    char *gbnf;
    const pg_struct_vocab *v;
    pg_grammar_limits lim;
    pg_grammar *copy;                // the thread's until done
    mask_pool pool;
    pg_grammar_precompute stats;     // written by the thread before done
    void (*notify)(void *);          // with mu: called once when done (sg_warm_notify)
    void *notify_arg;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t hash_words(const uint32_t *w, int32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) h = (h ^ w[i]) * 1099511628211ull;
    return h;
}

// Returns the pooled copy of m (freeing m when an equal one is there).
static uint32_t *pool_put(mask_pool *p, uint32_t *m, int32_t nw, size_t *bytes) {
    if ((p->n + 1) * 2 > p->cap) {
        int32_t cap = p->cap ? p->cap * 2 : 256;
        uint32_t **nm = pg_xcalloc((size_t)cap, sizeof *nm);
        uint64_t *nh = pg_xcalloc((size_t)cap, sizeof *nh);
        for (int32_t i = 0; i < p->cap; i++)
            if (p->m[i]) {
                uint32_t j = (uint32_t)p->h[i] & (uint32_t)(cap - 1);
                while (nm[j]) j = (j + 1) & (uint32_t)(cap - 1);
                nm[j] = p->m[i];
                nh[j] = p->h[i];
            }
        free(p->m);
        free(p->h);
        p->m = nm;
        p->h = nh;
        p->cap = cap;
    }
    uint64_t h = hash_words(m, nw);
    uint32_t j = (uint32_t)h & (uint32_t)(p->cap - 1);
    for (; p->m[j]; j = (j + 1) & (uint32_t)(p->cap - 1))
        if (p->h[j] == h && !memcmp(p->m[j], m, sizeof(uint32_t) * (size_t)nw)) {
            free(m);
            return p->m[j];
        }
    p->m[j] = m;
    p->h[j] = h;
    p->n++;
    *bytes += sizeof(uint32_t) * (size_t)nw;
    return m;
}

static void warm_free(sg_warm *w) {
    // The pool owns the copy's masks (all borrowed): unref skips them.
    sg_grammar_free(w->copy);
    for (int32_t i = 0; i < w->pool.cap; i++) free(w->pool.m[i]);
    free(w->pool.m);
    free(w->pool.h);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->gbnf);
    free(w);
}

static void warm_drop(sg_warm *w) {
    if (atomic_fetch_sub(&w->refs, 1) == 1) warm_free(w);
}

// Breadth first over the copy's states in the order they were created (a
// trie walk creates states too: every one is a place a token may end).
static bool precompute(sg_warm *w) {
    char err[160];
    sg_ir ir = {0};
    if (sg_parse_gbnf(w->gbnf, strlen(w->gbnf), &w->lim, &ir, err, sizeof err) < 0) return false;
    pg_grammar *g;
    if (sg_grammar_new(&ir, w->v, &w->lim, false, &g, err, sizeof err) < 0) return false;
    w->copy = g;
    g->cancel = &w->cancel;
    double t0 = now_ms();
    g->deadline_ms = t0 + w->lim.precompute_ms;
    size_t mask_bytes = 0;
    for (int32_t s = 0; s < g->n_states; s++) {
        if (atomic_load_explicit(&w->cancel, memory_order_relaxed)) return false;
        if (s >= w->lim.precompute_states || g->bytes + mask_bytes > w->lim.precompute_bytes ||
            now_ms() - t0 > w->lim.precompute_ms)
            break;  // the rest is built on first use
        uint32_t *m = sg_compute_mask(g, s);
        if (g->cut) {  // partial: dropped, or out of time (what is done stays)
            free(m);
            break;
        }
        g->states[s].mask = pool_put(&w->pool, m, g->nw, &mask_bytes);
        g->states[s].borrowed = true;
        for (int32_t r = 0; r < g->n_reps; r++) {
            uint8_t b = g->reps[r];
            if (g->states[s].first[b >> 5] >> (b & 31) & 1) sg_step(g, s, b);
        }
        if (g->spent) return false;
    }
    if (atomic_load(&w->cancel)) return false;
    // States past the cut have no mask: the engine builds those itself.
    w->stats.states = g->n_states;
    w->stats.masks = w->pool.n;
    w->stats.bytes = mask_bytes;
    w->stats.ms = now_ms() - t0;
    return true;
}

static void *warm_main(void *arg) {
    sg_warm *w = arg;
    double t0 = now_ms();
    bool ok = precompute(w);
    if (!ok) w->stats.ms = now_ms() - t0;
    w->stats.published = ok;
    // Counted out before waiters wake, so a waiter that compiles the next
    // grammar finds the slot free.
    atomic_fetch_sub(&running, 1);
    pthread_mutex_lock(&w->mu);
    if (ok) atomic_store_explicit(&w->result, w->copy, memory_order_release);
    atomic_store(&w->done, true);
    pthread_cond_broadcast(&w->cv);
    if (w->notify) w->notify(w->notify_arg);
    w->notify = NULL;
    pthread_mutex_unlock(&w->mu);
    warm_drop(w);
    return NULL;
}

sg_warm *sg_warm_start(const char *gbnf, const pg_struct_vocab *v, const pg_grammar_limits *lim) {
    if (lim->precompute_states <= 0) return NULL;
    if (atomic_fetch_add(&running, 1) >= MAX_RUNNING) {
        atomic_fetch_sub(&running, 1);
        return NULL;
    }
    sg_warm *w = pg_xcalloc(1, sizeof *w);
    atomic_init(&w->refs, 2);
    atomic_init(&w->cancel, false);
    atomic_init(&w->done, false);
    atomic_init(&w->result, NULL);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->gbnf = pg_xstrdup(gbnf);
    w->v = v;
    w->lim = *lim;
    w->stats.started = true;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &at, warm_main, w);
    pthread_attr_destroy(&at);
    if (rc != 0) {  // no thread: no precomputation, masks are built on use
        atomic_fetch_sub(&running, 1);
        warm_free(w);
        return NULL;
    }
    return w;
}

const pg_grammar *sg_warm_result(sg_warm *w) {
    return atomic_load_explicit(&w->result, memory_order_acquire);
}

// Waits for the thread: it reads the vocabulary, which the caller may free
// once the grammar is gone. Cancelled, it stops within one poll of the
// trie walk (sg_compute_mask) or one transition.
void sg_warm_release(sg_warm *w) {
    if (!w) return;
    atomic_store(&w->cancel, true);
    pthread_mutex_lock(&w->mu);
    while (!atomic_load(&w->done)) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    warm_drop(w);
}

bool sg_warm_wait(sg_warm *w, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    while (!atomic_load(&w->done))
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) != 0) break;
    pthread_mutex_unlock(&w->mu);
    return sg_warm_result(w) != NULL;
}

void sg_warm_notify(sg_warm *w, void (*fn)(void *), void *arg) {
    pthread_mutex_lock(&w->mu);
    if (fn && atomic_load(&w->done)) {
        fn(arg);
        fn = NULL;
    }
    w->notify = fn;
    w->notify_arg = arg;
    pthread_mutex_unlock(&w->mu);
}

void sg_warm_stats(sg_warm *w, pg_grammar_precompute *st) {
    pthread_mutex_lock(&w->mu);
    bool done = atomic_load(&w->done);
    pthread_mutex_unlock(&w->mu);
    if (done) *st = w->stats;
    else st->started = true;
    st->done = done;
}
