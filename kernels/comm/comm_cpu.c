// kernels/comm/comm_cpu.c - the in-process communicator (kernels/comm/comm.h):
// n rank threads of one process share one group state.
//
// Every collective is the same three steps:
//   1. each rank publishes its call (op, sizes, buffer pointers) in its
//      slot and enters a barrier;
//   2. each rank checks that every slot describes the same call, then does
//      its part of the work reading (and, for all_reduce, writing) the other
//      ranks' buffers directly;
//   3. a second barrier, so no rank returns (and reuses its buffer or its
//      slot) while another still reads it.
// all_to_all_v publishes each rank's size and offset arrays with its send
// buffer; every rank checks all pairs' sizes agree, then copies the pieces
// addressed to it out of the other ranks' send buffers.
// all_reduce_sum splits the elements into n contiguous slices; rank r sums
// slice r over all ranks' buffers in rank order 0..n-1 in f32, rounds once,
// and writes the result into every rank's buffer. Each element is computed
// by exactly one rank in one fixed order, so every rank ends up with the
// same bits, whatever the thread timing.
//
// The barrier spins (yielding now and then) before it sleeps on a condvar:
// the all-reduce after every attention and MLP block is a few microseconds
// of work, and a futex sleep and wake-up per barrier would cost more than
// the reduction itself.
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/half.h"
#include "kernels/comm/comm.h"
#include "kernels/comm/comm_op.h"
#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define MAX_RANKS 64
// Spins before sleeping, and yields every YIELD_EVERY spins: with more rank
// threads than cores the rank being waited for may sit behind the spinner.
#define SPIN_ITERS 20000
#define YIELD_EVERY 64
// Slices start on multiples of this many elements (256 bytes of f32), so
// two ranks never write the same cache line of a buffer.
#define SLICE_ALIGN 64
// Elements summed per block in a register-sized temporary (f32), so the
// rank-order loop streams each input once and vectorizes.
#define BLOCK 512

// One rank's published call. Written by its rank before barrier 1, read by
// all ranks between barrier 1 and barrier 2 of the same collective.
typedef struct {
    int op;
    uint64_t seq; // collectives this rank called before this one
    int64_t count;
    int32_t dtype, root;
    size_t bytes;
    void *buf;
    const void *send;
    // all_to_all_v's size and offset arrays (the caller's, `n` entries):
    // read by the other ranks between the barriers like the buffers.
    const size_t *sbytes, *soff, *rbytes;
} slot;

typedef struct {
    int32_t n;
    _Atomic int refs; // communicators not destroyed yet
    // Barrier: (generation << 32) | ranks arrived; the last rank to arrive
    // stores (generation + 1) << 32.
    _Atomic uint64_t word;
    _Atomic int sleepers;
    _Atomic bool aborted;
    pthread_mutex_t mu; // guards the condvar sleep and `why`
    pthread_cond_t cv;
    char why[256]; // the first abort's reason
    slot slots[MAX_RANKS];
} group;

typedef struct {
    group *g;
    uint64_t seq;
} rank_ctx;

static int aborted_err(group *g, int rank, int op) {
    pthread_mutex_lock(&g->mu);
    char why[sizeof g->why];
    memcpy(why, g->why, sizeof why);
    pthread_mutex_unlock(&g->mu);
    return pg_err_set(PG_EIO, "cpu communicator (rank %d of %d): %s: group aborted: %s", rank, g->n,
                      pg_comm_op_name(op), why);
}

static void group_abort(group *g, const char *why) {
    pthread_mutex_lock(&g->mu);
    if (!atomic_load(&g->aborted)) {
        snprintf(g->why, sizeof g->why, "%s", why && *why ? why : "(no reason given)");
        atomic_store(&g->aborted, true);
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

// The barrier word: generation in the high 32 bits, ranks arrived in the
// low 32. One word, so "the last rank arrived" and "a waiting rank gave up
// because of an abort" cannot both happen: a barrier either completes for
// every rank or for none.
#define ARRIVED_MASK UINT64_C(0xffffffff)

static bool barrier_passed(group *g, uint64_t gen) {
    return (atomic_load_explicit(&g->word, memory_order_acquire) >> 32) != gen;
}

// Takes back this rank's arrival after an abort, unless the barrier
// completed meanwhile. True when it was taken back.
static bool barrier_withdraw(group *g, uint64_t gen) {
    for (;;) {
        uint64_t v = atomic_load(&g->word);
        if ((v >> 32) != gen) return false;
        // All arrived: the last rank is about to bump the generation.
        if ((v & ARRIVED_MASK) == (uint64_t)g->n) {
            cpu_relax();
            continue;
        }
        if (atomic_compare_exchange_weak(&g->word, &v, v - 1)) return true;
    }
}

// Returns 0 when all n ranks have arrived. An abortable barrier returns
// PG_EIO (message set) when the group is aborted before that; the second
// barrier of a collective is not abortable: every rank passed the first,
// so every rank reaches it after a bounded amount of local work, and
// waiting for it keeps a rank from returning (and its caller from freeing
// the buffer) while another still reads that buffer.
static int barrier(group *g, int rank, int op, bool abortable) {
    if (abortable && atomic_load(&g->aborted)) return aborted_err(g, rank, op);
    uint64_t v = atomic_fetch_add(&g->word, 1);
    uint64_t gen = v >> 32;
    if ((v & ARRIVED_MASK) + 1 == (uint64_t)g->n) {
        atomic_store(&g->word, (gen + 1) << 32);
        // seq_cst on `word` and `sleepers` on both sides: either the sleeper
        // sees the new generation under the mutex, or this load sees it.
        if (atomic_load(&g->sleepers)) {
            pthread_mutex_lock(&g->mu);
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
        }
        return 0;
    }
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (barrier_passed(g, gen)) return 0;
        if (abortable && atomic_load_explicit(&g->aborted, memory_order_relaxed)) break;
        if (i % YIELD_EVERY == YIELD_EVERY - 1)
            sched_yield();
        else
            cpu_relax();
    }
    pthread_mutex_lock(&g->mu);
    atomic_fetch_add(&g->sleepers, 1);
    while ((atomic_load(&g->word) >> 32) == gen && !(abortable && atomic_load(&g->aborted)))
        pthread_cond_wait(&g->cv, &g->mu);
    atomic_fetch_sub(&g->sleepers, 1);
    pthread_mutex_unlock(&g->mu);
    if (barrier_passed(g, gen) || !barrier_withdraw(g, gen)) return 0;
    return aborted_err(g, rank, op);
}

static size_t elem_bytes(int32_t dtype) { return dtype == PG_DTYPE_BF16 ? 2 : 4; }

// Publishes `s`, waits for every rank's, and checks they all describe one
// call. On a mismatch every rank sees the same slots, so every rank aborts
// the group with the same reason.
static int enter(pg_comm *c, slot s) {
    rank_ctx *rc = c->ctx;
    group *g = rc->g;
    s.seq = rc->seq++;
    g->slots[c->rank] = s;
    PG_TRY(barrier(g, c->rank, s.op, true));
    const slot *a = &g->slots[0];
    for (int r = 1; r < g->n; r++) {
        const slot *b = &g->slots[r];
        if (a->op == b->op && a->seq == b->seq && a->count == b->count && a->dtype == b->dtype &&
            a->root == b->root && a->bytes == b->bytes)
            continue;
        char why[200];
        snprintf(why, sizeof why,
                 "collectives differ between ranks: rank 0 calls %s #%llu (%lld elements, %zu bytes, root %d), "
                 "rank %d calls %s #%llu (%lld elements, %zu bytes, root %d)",
                 pg_comm_op_name(a->op), (unsigned long long)a->seq, (long long)a->count, a->bytes, a->root, r,
                 pg_comm_op_name(b->op), (unsigned long long)b->seq, (long long)b->count, b->bytes, b->root);
        group_abort(g, why);
        barrier(g, c->rank, s.op, false); // others still read the slots
        return aborted_err(g, c->rank, s.op);
    }
    return 0;
}

// A call that is wrong on this rank alone: the others would wait for it
// forever, so the group is aborted with the reason.
static int bad_call(pg_comm *c, int op, const char *what) {
    rank_ctx *rc = c->ctx;
    char why[200];
    snprintf(why, sizeof why, "rank %d called %s with %s", c->rank, pg_comm_op_name(op), what);
    group_abort(rc->g, why);
    return pg_err_set(PG_EINVAL, "cpu communicator: %s", why);
}

static int leave(pg_comm *c, int op) {
    rank_ctx *rc = c->ctx;
    return barrier(rc->g, c->rank, op, false);
}

// ---------------------------------------------------------------- collectives

// Sums elements [lo, hi) over all ranks in rank order, writing every rank.
static void reduce_f32(group *g, int64_t lo, int64_t hi) {
    float acc[BLOCK];
    for (int64_t b = lo; b < hi; b += BLOCK) {
        int64_t m = hi - b < BLOCK ? hi - b : BLOCK;
        const float *x0 = (const float *)g->slots[0].buf + b;
        for (int64_t i = 0; i < m; i++) acc[i] = x0[i];
        for (int r = 1; r < g->n; r++) {
            const float *x = (const float *)g->slots[r].buf + b;
            for (int64_t i = 0; i < m; i++) acc[i] += x[i];
        }
        for (int r = 0; r < g->n; r++) memcpy((float *)g->slots[r].buf + b, acc, (size_t)m * sizeof(float));
    }
}

static void reduce_bf16(group *g, int64_t lo, int64_t hi) {
    float acc[BLOCK];
    uint16_t out[BLOCK];
    for (int64_t b = lo; b < hi; b += BLOCK) {
        int64_t m = hi - b < BLOCK ? hi - b : BLOCK;
        const uint16_t *x0 = (const uint16_t *)g->slots[0].buf + b;
        for (int64_t i = 0; i < m; i++) acc[i] = pg_bf16_to_f32(x0[i]);
        for (int r = 1; r < g->n; r++) {
            const uint16_t *x = (const uint16_t *)g->slots[r].buf + b;
            for (int64_t i = 0; i < m; i++) acc[i] += pg_bf16_to_f32(x[i]);
        }
        for (int64_t i = 0; i < m; i++) out[i] = pg_f32_to_bf16(acc[i]);
        for (int r = 0; r < g->n; r++) memcpy((uint16_t *)g->slots[r].buf + b, out, (size_t)m * 2);
    }
}

static int cpu_all_reduce_sum(pg_comm *c, void *buf, int64_t count, int32_t dtype) {
    if (dtype != PG_DTYPE_F32 && dtype != PG_DTYPE_BF16) return bad_call(c, OP_ALL_REDUCE, "an unsupported dtype");
    if (count < 0 || (count > 0 && !buf)) return bad_call(c, OP_ALL_REDUCE, "a negative count or no buffer");
    group *g = ((rank_ctx *)c->ctx)->g;
    PG_TRY(enter(c, (slot){.op = OP_ALL_REDUCE, .count = count, .dtype = dtype, .bytes = (size_t)count * elem_bytes(dtype), .buf = buf}));
    if (g->n > 1 && count > 0) {
        int64_t slice = (count + g->n - 1) / g->n;
        slice = (slice + SLICE_ALIGN - 1) / SLICE_ALIGN * SLICE_ALIGN;
        int64_t lo = slice * c->rank, hi = lo + slice < count ? lo + slice : count;
        if (lo < hi) {
            if (dtype == PG_DTYPE_F32)
                reduce_f32(g, lo, hi);
            else
                reduce_bf16(g, lo, hi);
        }
    }
    return leave(c, OP_ALL_REDUCE);
}

static int cpu_all_gather(pg_comm *c, const void *send, void *recv, size_t bytes) {
    if (bytes > 0 && (!send || !recv)) return bad_call(c, OP_ALL_GATHER, "no buffer");
    group *g = ((rank_ctx *)c->ctx)->g;
    PG_TRY(enter(c, (slot){.op = OP_ALL_GATHER, .bytes = bytes, .buf = recv, .send = send}));
    // Each rank fills its own recv: it reads every rank's send, and writes
    // only memory the others do not read (their send slots lie in their own
    // recv, at their own rank's offset).
    for (int r = 0; r < g->n && bytes > 0; r++) {
        char *dst = (char *)recv + (size_t)r * bytes;
        const void *src = g->slots[r].send;
        if (dst != src) memmove(dst, src, bytes);
    }
    return leave(c, OP_ALL_GATHER);
}

// Every rank checks every pair (not only the pieces it receives), so all
// ranks find the same first mismatch and abort the group with one reason,
// as enter() does for calls that differ.
static int check_a2a_sizes(pg_comm *c) {
    group *g = ((rank_ctx *)c->ctx)->g;
    for (int s = 0; s < g->n; s++)
        for (int d = 0; d < g->n; d++) {
            size_t sent = g->slots[s].sbytes[d], expected = g->slots[d].rbytes[s];
            if (sent == expected) continue;
            char why[200];
            snprintf(why, sizeof why, "%s sizes differ: rank %d sends %zu bytes to rank %d, which expects %zu from it",
                     pg_comm_op_name(OP_ALL_TO_ALL), s, sent, d, expected);
            group_abort(g, why);
            barrier(g, c->rank, OP_ALL_TO_ALL, false); // others still read the slots
            return aborted_err(g, c->rank, OP_ALL_TO_ALL);
        }
    return 0;
}

static int cpu_all_to_all_v(pg_comm *c, const void *send, const size_t *sbytes, const size_t *soff, void *recv,
                            const size_t *rbytes, const size_t *roff) {
    if (!sbytes || !soff || !rbytes || !roff) return bad_call(c, OP_ALL_TO_ALL, "no size or offset array");
    group *g = ((rank_ctx *)c->ctx)->g;
    for (int r = 0; r < g->n; r++) {
        if (sbytes[r] > 0 && !send) return bad_call(c, OP_ALL_TO_ALL, "no send buffer");
        if (rbytes[r] > 0 && !recv) return bad_call(c, OP_ALL_TO_ALL, "no receive buffer");
    }
    PG_TRY(enter(c, (slot){.op = OP_ALL_TO_ALL, .send = send, .sbytes = sbytes, .soff = soff, .rbytes = rbytes}));
    PG_TRY(check_a2a_sizes(c));
    // Each rank pulls the pieces addressed to it into its own recv, which
    // no other rank touches; the second barrier keeps every send buffer
    // alive until the last rank has read from it.
    for (int s = 0; s < g->n; s++) {
        const slot *from = &g->slots[s];
        size_t len = from->sbytes[c->rank];
        if (len) memcpy((char *)recv + roff[s], (const char *)from->send + from->soff[c->rank], len);
    }
    return leave(c, OP_ALL_TO_ALL);
}

static int cpu_broadcast(pg_comm *c, void *buf, size_t bytes, int32_t root) {
    if (root < 0 || root >= c->size) return bad_call(c, OP_BROADCAST, "a root outside the group");
    if (bytes > 0 && !buf) return bad_call(c, OP_BROADCAST, "no buffer");
    group *g = ((rank_ctx *)c->ctx)->g;
    PG_TRY(enter(c, (slot){.op = OP_BROADCAST, .bytes = bytes, .root = root, .buf = buf}));
    if (c->rank != root && bytes > 0) memcpy(buf, g->slots[root].buf, bytes);
    return leave(c, OP_BROADCAST);
}

static int cpu_barrier(pg_comm *c) {
    PG_TRY(enter(c, (slot){.op = OP_BARRIER}));
    return leave(c, OP_BARRIER);
}

static void cpu_abort(pg_comm *c, const char *why) { group_abort(((rank_ctx *)c->ctx)->g, why); }

static void cpu_destroy(pg_comm *c) {
    if (!c) return;
    rank_ctx *rc = c->ctx;
    group *g = rc->g;
    if (atomic_fetch_sub(&g->refs, 1) == 1) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g);
    }
    free(rc);
    free(c);
}

// ---------------------------------------------------------------- public

int pg_comm_cpu_create_group(int32_t n, pg_comm **out) {
    PG_ARG(out, "pg_comm_cpu_create_group: no output array");
    PG_ARG(n >= 1 && n <= MAX_RANKS, "cpu communicator: group size %d outside 1..%d", n, MAX_RANKS);
    group *g = calloc(1, sizeof *g);
    if (!g) return pg_err_set(PG_ENOMEM, "cpu communicator: out of memory");
    g->n = n;
    atomic_init(&g->refs, n);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int32_t r = 0; r < n; r++) {
        pg_comm *c = calloc(1, sizeof *c);
        rank_ctx *rc = calloc(1, sizeof *rc);
        if (!c || !rc) {
            free(c);
            free(rc);
            // The ranks made so far hold references; the rest are dropped here.
            for (int32_t k = 0; k < r; k++) cpu_destroy(out[k]), out[k] = NULL;
            if (atomic_fetch_sub(&g->refs, n - r) == n - r) {
                pthread_mutex_destroy(&g->mu);
                pthread_cond_destroy(&g->cv);
                free(g);
            }
            return pg_err_set(PG_ENOMEM, "cpu communicator: out of memory");
        }
        rc->g = g;
        *c = (pg_comm){.name = "cpu",
                       .rank = r,
                       .size = n,
                       .ctx = rc,
                       .all_reduce_sum = cpu_all_reduce_sum,
                       .all_gather = cpu_all_gather,
                       .all_to_all_v = cpu_all_to_all_v,
                       .broadcast = cpu_broadcast,
                       .barrier = cpu_barrier,
                       .abort = cpu_abort,
                       .destroy = cpu_destroy};
        out[r] = c;
    }
    return 0;
}

// The caller must hold `any_rank_of_group` (not destroyed) during the
// call: the ranks it wakes may destroy theirs and the last one frees the
// group. A communicator that is not a cpu one is ignored.
void pg_comm_cpu_abort(pg_comm *any_rank_of_group, const char *why) {
    if (!any_rank_of_group || any_rank_of_group->destroy != cpu_destroy) return;
    cpu_abort(any_rank_of_group, why);
}
