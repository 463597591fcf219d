// common/thread_pool.c - spin-then-sleep fork-join pool.
//
// A job is published by writing its fields and bumping `generation`. Task
// indices are claimed from `next`, whose high bits carry the generation the
// index belongs to: a worker that wakes up late, after its job finished and
// the next one was published, fails the tag check instead of claiming (or
// losing) an index of a job it has not read. The caller never waits for
// workers that did not show up: it runs whatever is left itself and waits
// only for tasks already claimed.
#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "common/err.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

// Spins this many times (tens of microseconds) before sleeping: long enough
// to bridge the gap between two matrix products of one forward pass.
#define SPIN_ITERS 20000
// Every this many spins a waiting thread yields its core: when the machine
// has more runnable threads than cores (other processes, the server's own
// threads), the thread that the spinner waits for may be queued behind it
// on the same core, and a pure spin would burn that core's time slice.
#define YIELD_EVERY 64
#define TAG_SHIFT 40
#define INDEX_MASK ((UINT64_C(1) << TAG_SHIFT) - 1)

struct pg_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    // The current job. Written by the caller before `generation` moves.
    _Atomic(pg_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t n_tasks;
    _Atomic uint64_t next;       // (generation tag << TAG_SHIFT) | next index
    _Atomic int64_t done;        // tasks finished in the current job
    _Atomic uint64_t generation; // 0 = no job yet
    _Atomic int sleepers;
    _Atomic bool stop;
};

// Claims and runs tasks of generation `gen` until none are left.
static void run_tasks(pg_pool *p, uint64_t gen, int thread) {
    pg_pool_fn fn = atomic_load(&p->fn);
    void *ctx = atomic_load(&p->ctx);
    int64_t n = atomic_load(&p->n_tasks);
    uint64_t tag = gen & ((UINT64_C(1) << (64 - TAG_SHIFT)) - 1);
    for (;;) {
        uint64_t v = atomic_load(&p->next);
        if ((v >> TAG_SHIFT) != tag || (int64_t)(v & INDEX_MASK) >= n) return;
        if (!atomic_compare_exchange_weak(&p->next, &v, v + 1)) continue;
        fn(ctx, (int64_t)(v & INDEX_MASK), thread);
        atomic_fetch_add(&p->done, 1);
    }
}

typedef struct {
    pg_pool *pool;
    int index;
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    pg_pool *p = wa.pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen;
        int spins = 0;
        while ((gen = atomic_load(&p->generation)) == seen) {
            if (++spins < SPIN_ITERS) {
                if (spins % YIELD_EVERY == 0)
                    sched_yield();
                else
                    cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        run_tasks(p, gen, wa.index);
    }
}

int pg_pool_create(int n_threads, pg_pool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads <= 0) n_threads = 1;
    pg_pool *p = pg_xcalloc(1, sizeof *p);
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = pg_xcalloc((size_t)n_threads, sizeof(pthread_t));
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = pg_xmalloc(sizeof *wa);
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i;
            pg_pool_destroy(p);
            return pg_err_set(PG_ENOMEM, "thread pool: cannot start thread %d", i);
        }
    }
    *out = p;
    return 0;
}

void pg_pool_destroy(pg_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int pg_pool_threads(const pg_pool *p) { return p->n_threads; }

void pg_pool_run(pg_pool *p, int64_t n_tasks, pg_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int64_t i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    PG_CHECK((uint64_t)n_tasks <= INDEX_MASK);
    uint64_t gen = atomic_load(&p->generation) + 1;
    uint64_t tag = gen & ((UINT64_C(1) << (64 - TAG_SHIFT)) - 1);
    // Order matters: the tagged counter first, then the job, then the
    // generation (see the file comment).
    atomic_store(&p->next, tag << TAG_SHIFT);
    atomic_store(&p->done, 0);
    atomic_store(&p->fn, fn);
    atomic_store(&p->ctx, ctx);
    atomic_store(&p->n_tasks, n_tasks);
    atomic_store(&p->generation, gen);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_tasks(p, gen, 0);
    for (unsigned spins = 1; atomic_load(&p->done) < n_tasks; spins++) {
        if (spins % YIELD_EVERY == 0)
            sched_yield();
        else
            cpu_relax();
    }
}
