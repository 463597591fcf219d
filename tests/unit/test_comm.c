// tests/unit/test_comm.c - the communicators of kernels/comm/comm.h (cpu, and
// tcp over loopback with every rank a thread of this process): every
// collective at 1..8 ranks and sizes from 0 to 1M elements, f32 and bf16,
// each rank with its own random values, compared bit for bit against a sum
// in rank order on every rank; hundreds of mixed collectives back to back
// (generation races); abort while ranks wait (pg_comm_cpu_abort, and the
// table's abort from another thread for cpu and tcp); and for tcp a peer
// that leaves mid-collective, a silent peer past the collective timeout, a
// wrong group size, a duplicate rank, collectives called in different
// orders, and a connect that times out.
//
// Also built under ThreadSanitizer (build/tsan/tests/test_comm): there, or
// with PAGED_TEST_COMM_QUICK=1, the sizes stop at 64K elements and the
// stress runs fewer rounds, so it stays well under a minute.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/half.h"
#include "common/net.h"
#include "kernels/comm/comm.h"
#include "kernels/dtype.h"
#include "tests/unit/comm_test_util.h" // the rank-thread harness, free ports

static bool g_quick;

// ---------------------------------------------------------------- data

// A value with a random sign, mantissa and exponent (2^-8 .. 2^8), so the
// order of the additions shows in the rounded sums.
static float rand_f32(uint64_t seed, int64_t i) {
    uint64_t h = mix(seed * 0x9e3779b97f4a7c15ULL + (uint64_t)i);
    float m = (float)(h & 0xffffff) / (float)0x1000000 - 0.5f;
    int e = (int)((h >> 24) % 17) - 8;
    return ldexpf(m, e);
}

static const int64_t SIZES[] = {0, 1, 7, 4095, 65536, 1 << 20};
static int n_sizes(void) { return g_quick ? 5 : 6; }

// The inputs of every rank and the rank-order reference sum.
typedef struct {
    int n;
    int64_t count;
    int32_t dtype;
    void *in[MAX_N];
    void *ref;
} reduce_case;

static size_t esize(int32_t dtype) { return dtype == PG_DTYPE_BF16 ? 2 : 4; }

static void reduce_case_make(reduce_case *rc, int n, int64_t count, int32_t dtype, uint64_t seed) {
    rc->n = n;
    rc->count = count;
    rc->dtype = dtype;
    size_t bytes = (size_t)count * esize(dtype);
    for (int r = 0; r < n; r++) {
        rc->in[r] = malloc(bytes ? bytes : 1);
        for (int64_t i = 0; i < count; i++) {
            float v = rand_f32(seed * 131 + (uint64_t)r, i);
            if (dtype == PG_DTYPE_F32)
                ((float *)rc->in[r])[i] = v;
            else
                ((uint16_t *)rc->in[r])[i] = pg_f32_to_bf16(v);
        }
    }
    rc->ref = malloc(bytes ? bytes : 1);
    for (int64_t i = 0; i < count; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) {
            float v = dtype == PG_DTYPE_F32 ? ((float *)rc->in[r])[i] : pg_bf16_to_f32(((uint16_t *)rc->in[r])[i]);
            s = r == 0 ? v : s + v;
        }
        if (dtype == PG_DTYPE_F32)
            ((float *)rc->ref)[i] = s;
        else
            ((uint16_t *)rc->ref)[i] = pg_f32_to_bf16(s);
    }
}

static void reduce_case_free(reduce_case *rc) {
    for (int r = 0; r < rc->n; r++) free(rc->in[r]);
    free(rc->ref);
}

// ---------------------------------------------------------------- all_reduce

static int do_all_reduce(rank_thread *t, pg_comm *c) {
    reduce_case *rc = t->arg;
    size_t bytes = (size_t)rc->count * esize(rc->dtype);
    if (c->rank != t->rank || c->size != t->n) return rank_fail(t, "rank %d size %d", c->rank, c->size);
    void *buf = malloc(bytes ? bytes : 1);
    memcpy(buf, rc->in[t->rank], bytes);
    int e = c->all_reduce_sum(c, buf, rc->count, rc->dtype);
    int bad = 0;
    if (e < 0)
        bad = rank_fail(t, "all_reduce_sum: %s", pg_err_msg());
    else if (memcmp(buf, rc->ref, bytes) != 0) {
        int64_t i = 0;
        size_t es = esize(rc->dtype);
        while (memcmp((char *)buf + i * es, (char *)rc->ref + i * es, es) == 0) i++;
        bad = rank_fail(t, "%s count %lld: element %lld differs from the rank-order sum", pg_dtype_name(rc->dtype),
                        (long long)rc->count, (long long)i);
    }
    free(buf);
    return bad;
}

static void all_reduce_sweep(impl kind, int n) {
    for (int d = 0; d < 2; d++) {
        int32_t dtype = d ? PG_DTYPE_BF16 : PG_DTYPE_F32;
        for (int s = 0; s < n_sizes(); s++) {
            reduce_case rc;
            reduce_case_make(&rc, n, SIZES[s], dtype, (uint64_t)(n * 100 + s * 10 + d));
            run_ranks(kind, n, do_all_reduce, &rc);
            reduce_case_free(&rc);
        }
    }
}

static void test_cpu_all_reduce_1_to_8_ranks(void **state) {
    for (int n = 1; n <= 8; n++) all_reduce_sweep(IMPL_CPU, n);
}

static void test_tcp_all_reduce_1_2_3_5_ranks(void **state) {
    const int ns[] = {1, 2, 3, 5};
    for (int i = 0; i < 4; i++) all_reduce_sweep(IMPL_TCP, ns[i]);
}

// ---------------------------------------------------------------- all_gather, broadcast

typedef struct {
    size_t bytes;
    bool in_place; // send = recv + rank * bytes
    int32_t root;
} move_case;

static uint8_t byte_of(int rank, size_t i) { return (uint8_t)mix((uint64_t)rank * 1000003u + i); }

static int do_all_gather(rank_thread *t, pg_comm *c) {
    move_case *mc = t->arg;
    size_t b = mc->bytes, total = b * (size_t)t->n;
    uint8_t *recv = malloc(total ? total : 1), *send = malloc(b ? b : 1);
    memset(recv, 0xee, total);
    uint8_t *src = mc->in_place ? recv + (size_t)t->rank * b : send;
    for (size_t i = 0; i < b; i++) src[i] = byte_of(t->rank, i);
    int bad = 0, e = c->all_gather(c, src, recv, b);
    if (e < 0) bad = rank_fail(t, "all_gather: %s", pg_err_msg());
    for (int r = 0; r < t->n && !bad; r++)
        for (size_t i = 0; i < b && !bad; i++)
            if (recv[(size_t)r * b + i] != byte_of(r, i))
                bad = rank_fail(t, "all_gather %zu bytes%s: byte %zu of rank %d wrong", b,
                                mc->in_place ? " in place" : "", i, r);
    free(recv);
    free(send);
    return bad;
}

static int do_broadcast(rank_thread *t, pg_comm *c) {
    move_case *mc = t->arg;
    size_t b = mc->bytes;
    uint8_t *buf = malloc(b ? b : 1);
    for (size_t i = 0; i < b; i++) buf[i] = byte_of(t->rank, i);
    int bad = 0, e = c->broadcast(c, buf, b, mc->root);
    if (e < 0) bad = rank_fail(t, "broadcast: %s", pg_err_msg());
    for (size_t i = 0; i < b && !bad; i++)
        if (buf[i] != byte_of(mc->root, i)) bad = rank_fail(t, "broadcast %zu bytes from %d: byte %zu wrong", b, mc->root, i);
    free(buf);
    return bad;
}

static void gather_broadcast_sweep(impl kind, int n) {
    for (int s = 0; s < n_sizes(); s++) {
        move_case mc = {.bytes = (size_t)SIZES[s]};
        run_ranks(kind, n, do_all_gather, &mc);
        mc.in_place = true;
        run_ranks(kind, n, do_all_gather, &mc);
        mc.root = (int32_t)(s % n);
        run_ranks(kind, n, do_broadcast, &mc);
        mc.root = n - 1;
        run_ranks(kind, n, do_broadcast, &mc);
    }
}

static void test_cpu_all_gather_broadcast(void **state) {
    for (int n = 1; n <= 8; n++) gather_broadcast_sweep(IMPL_CPU, n);
}

static void test_tcp_all_gather_broadcast(void **state) {
    const int ns[] = {1, 2, 3, 5};
    for (int i = 0; i < 4; i++) gather_broadcast_sweep(IMPL_TCP, ns[i]);
}

// ---------------------------------------------------------------- mixed stress

// Hundreds of collectives of every kind back to back, chosen by the same
// sequence on every rank, small sizes (so ranks race through generations).
// Values are small integers, so every sum is exact and cheap to check.
typedef struct {
    int rounds;
    _Atomic int arrived; // barrier check: ranks past their pre-barrier step
} stress_arg;

static int do_stress(rank_thread *t, pg_comm *c) {
    stress_arg *sa = t->arg;
    int n = t->n, me = t->rank;
    float f[300];
    uint16_t h[300];
    uint8_t g[MAX_N * 64];
    for (int k = 0; k < sa->rounds; k++) {
        uint64_t x = mix((uint64_t)k + 77);
        int op = (int)(x % 5);
        int64_t count = (int64_t)((x >> 8) % 300);
        if (op == 0) {
            for (int64_t i = 0; i < count; i++) f[i] = (float)((me + 1) * (i % 13) + k % 7);
            if (c->all_reduce_sum(c, f, count, PG_DTYPE_F32) < 0) return rank_fail(t, "#%d: %s", k, pg_err_msg());
            for (int64_t i = 0; i < count; i++) {
                float want = (float)(n * (n + 1) / 2 * (i % 13) + n * (k % 7));
                if (f[i] != want) return rank_fail(t, "#%d all_reduce f32: [%lld] %g, want %g", k, (long long)i, f[i], want);
            }
        } else if (op == 1) {
            for (int64_t i = 0; i < count; i++) h[i] = pg_f32_to_bf16((float)(me + (i & 3)));
            if (c->all_reduce_sum(c, h, count, PG_DTYPE_BF16) < 0) return rank_fail(t, "#%d: %s", k, pg_err_msg());
            for (int64_t i = 0; i < count; i++) {
                float want = (float)(n * (n - 1) / 2 + n * (i & 3));
                if (pg_bf16_to_f32(h[i]) != want) return rank_fail(t, "#%d all_reduce bf16: [%lld]", k, (long long)i);
            }
        } else if (op == 2) {
            size_t b = (size_t)(count % 64);
            uint8_t mine[64];
            for (size_t i = 0; i < b; i++) mine[i] = (uint8_t)(me * 31 + (int)i + k);
            if (c->all_gather(c, mine, g, b) < 0) return rank_fail(t, "#%d: %s", k, pg_err_msg());
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < b; i++)
                    if (g[(size_t)r * b + i] != (uint8_t)(r * 31 + (int)i + k)) return rank_fail(t, "#%d all_gather", k);
        } else if (op == 3) {
            int root = (int)((x >> 20) % (uint64_t)n);
            size_t b = (size_t)count;
            uint8_t buf[300];
            for (size_t i = 0; i < b; i++) buf[i] = (uint8_t)(me == root ? i + (size_t)k : 0xff);
            if (c->broadcast(c, buf, b, root) < 0) return rank_fail(t, "#%d: %s", k, pg_err_msg());
            for (size_t i = 0; i < b; i++)
                if (buf[i] != (uint8_t)(i + (size_t)k)) return rank_fail(t, "#%d broadcast from %d", k, root);
        } else {
            // Everyone counts itself in before the barrier; after it, the
            // count must have reached this barrier's total.
            int before = atomic_fetch_add(&sa->arrived, 1);
            (void)before;
            int nth = 0;
            for (int j = 0; j <= k; j++)
                if (mix((uint64_t)j + 77) % 5 == 4) nth++;
            if (c->barrier(c) < 0) return rank_fail(t, "#%d: %s", k, pg_err_msg());
            int now = atomic_load(&sa->arrived);
            if (now < nth * n) return rank_fail(t, "#%d barrier: %d arrivals, want >= %d", k, now, nth * n);
        }
    }
    return 0;
}

static void test_cpu_mixed_collectives_back_to_back(void **state) {
    for (int n = 1; n <= 8; n++) {
        stress_arg sa = {.rounds = g_quick ? 150 : 600};
        run_ranks(IMPL_CPU, n, do_stress, &sa);
    }
}

static void test_tcp_mixed_collectives_back_to_back(void **state) {
    const int ns[] = {2, 3, 5};
    for (int i = 0; i < 3; i++) {
        stress_arg sa = {.rounds = g_quick ? 150 : 400};
        run_ranks(IMPL_TCP, ns[i], do_stress, &sa);
    }
}

// ---------------------------------------------------------------- cpu abort

typedef struct {
    int idle_rank; // this rank's thread never calls
    int op;        // 0 all_reduce, 1 barrier, 2 all_gather, 3 broadcast
    _Atomic bool aborted;
} abort_arg;

static int do_wait_for_abort(rank_thread *t, pg_comm *c) {
    abort_arg *aa = t->arg;
    // The idle rank keeps its communicator until the abort is done (the
    // caller of pg_comm_cpu_abort must hold the rank it passes).
    if (t->rank == aa->idle_rank) {
        while (!atomic_load(&aa->aborted)) sched_yield();
        return 0;
    }
    float buf[64] = {0};
    uint8_t g[MAX_N * 8];
    int e = aa->op == 0   ? c->all_reduce_sum(c, buf, 64, PG_DTYPE_F32)
            : aa->op == 1 ? c->barrier(c)
            : aa->op == 2 ? c->all_gather(c, buf, g, 8)
                          : c->broadcast(c, buf, 16, 0);
    if (e != PG_EIO) return rank_fail(t, "op %d returned %d, want PG_EIO", aa->op, e);
    if (!strstr(pg_err_msg(), "the test pulled the plug")) return rank_fail(t, "message: %s", pg_err_msg());
    // Later collectives fail at once too.
    if (c->barrier(c) != PG_EIO) return rank_fail(t, "barrier after abort did not fail");
    if (c->all_reduce_sum(c, buf, 4, PG_DTYPE_F32) != PG_EIO) return rank_fail(t, "all_reduce after abort did not fail");
    return 0;
}

static void abort_case(int n, int op, int sleep_ms) {
    pg_comm *cs[MAX_N];
    assert_int_equal(pg_comm_cpu_create_group(n, cs), 0);
    rank_thread ts[MAX_N];
    memset(ts, 0, sizeof ts);
    abort_arg aa = {.idle_rank = n - 1, .op = op};
    pthread_t th[MAX_N];
    for (int r = 0; r < n; r++) {
        ts[r] = (rank_thread){.kind = IMPL_CPU, .rank = r, .n = n, .c = cs[r], .fn = do_wait_for_abort, .arg = &aa};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ts[r]), 0);
    }
    // Long enough for the waiting ranks to go from spinning to sleeping
    // (or, at 0, to catch them spinning).
    struct timespec ts_sleep = {0, sleep_ms * 1000000L};
    nanosleep(&ts_sleep, NULL);
    pg_comm_cpu_abort(cs[n - 1], "the test pulled the plug");
    atomic_store(&aa.aborted, true);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        if (ts[r].rc) fail_msg("%d ranks, op %d: rank %d: %s", n, op, r, ts[r].err);
}

static void test_cpu_abort_wakes_waiting_ranks(void **state) {
    for (int op = 0; op < 4; op++) {
        abort_case(2, op, 0);
        abort_case(4, op, 60);
        abort_case(8, op, 5);
    }
}

typedef struct {
    _Atomic int failed_ok;
} mismatch_arg;

// Rank 0 reduces 10 elements, the others 11: a caller bug, reported on
// every rank instead of summing mismatched buffers.
static int do_mismatch(rank_thread *t, pg_comm *c) {
    float buf[11] = {0};
    int e = c->all_reduce_sum(c, buf, t->rank == 0 ? 10 : 11, PG_DTYPE_F32);
    if (e >= 0) return rank_fail(t, "mismatched all_reduce succeeded");
    if (!strstr(pg_err_msg(), "collectives differ between ranks"))
        return rank_fail(t, "message: %s", pg_err_msg());
    return 0;
}

// Rank 0 calls barrier, the others broadcast: also reported everywhere.
static int do_order_mismatch(rank_thread *t, pg_comm *c) {
    uint8_t buf[8] = {0};
    int e = t->rank == 0 ? c->barrier(c) : c->broadcast(c, buf, sizeof buf, 0);
    if (e >= 0) return rank_fail(t, "mismatched collectives succeeded");
    if (!strstr(pg_err_msg(), "collectives differ between ranks"))
        return rank_fail(t, "message: %s", pg_err_msg());
    return 0;
}

static void test_cpu_mismatched_calls_fail_on_every_rank(void **state) {
    run_ranks(IMPL_CPU, 3, do_mismatch, NULL);
    run_ranks(IMPL_CPU, 2, do_order_mismatch, NULL);
}

static void test_cpu_bad_arguments(void **state) {
    pg_comm *cs[2];
    assert_int_equal(pg_comm_cpu_create_group(0, cs), PG_EINVAL);
    assert_int_equal(pg_comm_cpu_create_group(65, cs), PG_EINVAL);
    assert_int_equal(pg_comm_cpu_create_group(1, cs), 0);
    assert_string_equal(cs[0]->name, "cpu");
    float x = 1;
    // A bad dtype aborts the group (the others would wait forever).
    assert_int_equal(cs[0]->all_reduce_sum(cs[0], &x, 1, PG_DTYPE_F16), PG_EINVAL);
    assert_int_equal(cs[0]->barrier(cs[0]), PG_EIO);
    cs[0]->destroy(cs[0]);
}

// ---------------------------------------------------------------- abort through the table

// One rank never calls the collective; the others wait in it until
// another thread (the test's) calls abort on one rank's communicator, as
// the executor does from the thread of a rank that failed.
typedef struct {
    impl kind;
    int idle_rank, aborted_rank, op;
    pg_comm *_Atomic comms[MAX_N]; // published by the rank threads
    _Atomic int ready;
    _Atomic bool done; // abort returned: every rank may destroy its communicator
    double waited[MAX_N];
} table_abort_arg;

static int call_op(pg_comm *c, int op) {
    float buf[64] = {0};
    uint8_t g[MAX_N * 8];
    return op == 0   ? c->all_reduce_sum(c, buf, 64, PG_DTYPE_F32)
           : op == 1 ? c->barrier(c)
           : op == 2 ? c->all_gather(c, buf, g, 8)
                     : c->broadcast(c, buf, 16, 0);
}

static int do_wait_for_table_abort(rank_thread *t, pg_comm *c) {
    table_abort_arg *aa = t->arg;
    atomic_store(&aa->comms[t->rank], c);
    atomic_fetch_add(&aa->ready, 1);
    int bad = 0;
    if (t->rank != aa->idle_rank) {
        double t0 = now_s();
        int e = call_op(c, aa->op);
        aa->waited[t->rank] = now_s() - t0;
        // cpu: every rank of the group is aborted. tcp: the aborted rank
        // says why; the others see its connections close, named.
        char want[96];
        if (aa->kind == IMPL_CPU || t->rank == aa->aborted_rank)
            snprintf(want, sizeof want, "the test pulled the plug");
        else
            snprintf(want, sizeof want, "rank %d closed the connection", aa->aborted_rank);
        if (e != PG_EIO)
            bad = rank_fail(t, "op %d returned %d, want PG_EIO (%s)", aa->op, e, pg_err_msg());
        else if (!strstr(pg_err_msg(), want))
            bad = rank_fail(t, "op %d: message without '%s': %s", aa->op, want, pg_err_msg());
        else if (c->barrier(c) != PG_EIO || c->all_reduce_sum(c, (float[4]){0}, 4, PG_DTYPE_F32) != PG_EIO)
            bad = rank_fail(t, "a collective after the abort did not fail");
    }
    // The caller of abort must hold the communicator during the call.
    while (!atomic_load(&aa->done)) sched_yield();
    return bad;
}

static void table_abort_case(impl kind, int n, int op, int idle_rank, int aborted_rank) {
    rank_thread ts[MAX_N];
    memset(ts, 0, sizeof ts);
    table_abort_arg aa = {.kind = kind, .idle_rank = idle_rank, .aborted_rank = aborted_rank, .op = op};
    for (int r = 0; r < n; r++) ts[r].fn = do_wait_for_table_abort, ts[r].arg = &aa, ts[r].claimed_rank = -1;
    pthread_t th[MAX_N];
    start_ranks(kind, n, ts, th);
    double give_up = now_s() + 30;
    while (atomic_load(&aa.ready) < n && now_s() < give_up) sched_yield();
    int ready = atomic_load(&aa.ready);
    if (ready < n) fail_msg("%s: only %d of %d ranks started", impl_name(kind), ready, n);
    struct timespec pause = {0, 50 * 1000000L}; // the waiting ranks are blocked by now
    nanosleep(&pause, NULL);
    pg_comm *victim = atomic_load(&aa.comms[aborted_rank]);
    victim->abort(victim, "the test pulled the plug");
    atomic_store(&aa.done, true);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
        if (ts[r].rc) fail_msg("%s, %d ranks, op %d, rank %d aborted: rank %d: %s", impl_name(kind), n, op,
                               aborted_rank, r, ts[r].err);
        // About 50 ms; a bound far from a hang, loose enough for TSan.
        if (r != idle_rank && aa.waited[r] > 3.0)
            fail_msg("%s op %d: rank %d returned %.2f s after it called", impl_name(kind), op, r, aa.waited[r]);
    }
}

static void test_cpu_abort_from_another_thread(void **state) {
    for (int op = 0; op < 4; op++) {
        table_abort_case(IMPL_CPU, 3, op, 2, 2); // the idle rank's communicator
        table_abort_case(IMPL_CPU, 4, op, 3, 1); // a waiting rank's
    }
}

static void test_tcp_abort_from_another_thread(void **state) {
    for (int op = 0; op < 4; op++) {
        table_abort_case(IMPL_TCP, 3, op, 2, 2); // the idle rank's: the others see it close
        table_abort_case(IMPL_TCP, 3, op, 2, 1); // a waiting peer's, while it waits
        table_abort_case(IMPL_TCP, 3, op, 2, 0); // rank 0's, while it waits for rank 2
    }
}

// ---------------------------------------------------------------- tcp failures

// Rank `silent` never calls (but keeps its connection open): past the
// collective timeout the others fail, rank 0 naming the silent rank.
typedef struct {
    int silent, op;
    _Atomic int finished; // ranks that returned from the collective
    double waited[MAX_N];
} silent_arg;

static int do_with_silent_rank(rank_thread *t, pg_comm *c) {
    silent_arg *sa = t->arg;
    if (t->rank == sa->silent) {
        while (atomic_load(&sa->finished) < t->n - 1) sched_yield();
        return 0;
    }
    double t0 = now_s();
    int e = call_op(c, sa->op);
    sa->waited[t->rank] = now_s() - t0;
    char named[64];
    snprintf(named, sizeof named, "rank %d sent nothing for 0.2 s", sa->silent);
    int bad = 0;
    if (e != PG_EIO)
        bad = rank_fail(t, "op %d returned %d, want PG_EIO (%s)", sa->op, e, pg_err_msg());
    // Rank 0 names the silent rank; a peer reports that (or, had rank 0
    // been slower to start waiting than the peer, its own wait for rank 0).
    else if (!strstr(pg_err_msg(), t->rank == 0 ? named : "sent nothing for 0."))
        bad = rank_fail(t, "op %d: message: %s", sa->op, pg_err_msg());
    else if (c->barrier(c) != PG_EIO || !strstr(pg_err_msg(), "broken earlier"))
        bad = rank_fail(t, "a barrier after the timeout: %s", pg_err_msg());
    atomic_fetch_add(&sa->finished, 1);
    return bad;
}

static void test_tcp_silent_rank_times_out(void **state) {
    for (int op = 0; op < 4; op++) {
        int n = op == 1 ? 2 : 3;
        silent_arg sa = {.silent = n - 1, .op = op};
        rank_thread ts[MAX_N];
        memset(ts, 0, sizeof ts);
        for (int r = 0; r < n; r++)
            ts[r] = (rank_thread){.fn = do_with_silent_rank, .arg = &sa, .claimed_rank = -1, .op_timeout_ms = 200};
        run_ranks_custom(IMPL_TCP, n, ts);
        for (int r = 0; r < n; r++) {
            if (ts[r].rc) fail_msg("op %d, %d ranks: rank %d: %s", op, n, r, ts[r].err);
            if (r != sa.silent && (sa.waited[r] < 0.15 || sa.waited[r] > 0.9))
                fail_msg("op %d: rank %d gave up after %.3f s (timeout 0.2 s)", op, r, sa.waited[r]);
        }
    }
}

static int do_big_reduce_expect_eio(rank_thread *t, pg_comm *c) {
    if (t->rank == 2) return 0; // leaves at once: destroy closes its socket
    int64_t n = 1 << 20;
    float *buf = calloc((size_t)n, sizeof(float));
    int e = c->all_reduce_sum(c, buf, n, PG_DTYPE_F32);
    free(buf);
    if (e != PG_EIO) return rank_fail(t, "all_reduce returned %d, want PG_EIO", e);
    if (!strstr(pg_err_msg(), "rank 2 closed the connection")) return rank_fail(t, "message: %s", pg_err_msg());
    if (c->barrier(c) != PG_EIO || !strstr(pg_err_msg(), "broken earlier"))
        return rank_fail(t, "barrier after the failure: %s", pg_err_msg());
    return 0;
}

static void test_tcp_peer_that_leaves_fails_the_collective(void **state) {
    run_ranks(IMPL_TCP, 3, do_big_reduce_expect_eio, NULL);
}

static void test_tcp_mismatched_calls_fail_on_every_rank(void **state) {
    run_ranks(IMPL_TCP, 3, do_mismatch, NULL);
    run_ranks(IMPL_TCP, 2, do_order_mismatch, NULL);
}

static void test_tcp_wrong_group_size_is_refused(void **state) {
    rank_thread ts[2];
    memset(ts, 0, sizeof ts);
    ts[0].claimed_rank = ts[1].claimed_rank = -1;
    ts[1].claimed_size = 3;
    run_ranks_custom(IMPL_TCP, 2, ts);
    assert_int_equal(ts[0].create_rc, PG_EINVAL);
    assert_non_null(strstr(ts[0].err, "rank 1 says the group has 3 ranks, rank 0 says 2"));
    assert_int_equal(ts[1].create_rc, PG_EINVAL);
    assert_non_null(strstr(ts[1].err, "refused this rank: rank 1 says the group has 3 ranks, rank 0 says 2"));
}

static void test_tcp_duplicate_rank_is_refused(void **state) {
    rank_thread ts[3];
    memset(ts, 0, sizeof ts);
    ts[0].claimed_rank = ts[1].claimed_rank = -1;
    ts[2].claimed_rank = 1;
    run_ranks_custom(IMPL_TCP, 3, ts);
    assert_int_equal(ts[0].create_rc, PG_EINVAL);
    if (!strstr(ts[0].err, "a second connection claims rank 1")) fail_msg("rank 0: %s", ts[0].err);
    assert_true(ts[1].create_rc < 0 && ts[2].create_rc < 0);
}

// A socket bound to port P and connected to P joins itself (TCP's
// simultaneous open): what a retrying connect to a port nobody listens on
// meets once in thousands of tries. pg_net_self_connected must see it, and
// pg_net_connect never returns one.
static void test_self_connected_socket_is_recognised(void **state) {
    int port = comm_test_free_port(1);
    assert_true(port > 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_true(pg_net_self_connected(fd));
    close(fd);
    // A real connection is not.
    int lfd, cfd, sfd;
    assert_int_equal(pg_net_listen("127.0.0.1", port, 4, &lfd), 0);
    assert_int_equal(pg_net_connect("127.0.0.1", port, 1000, &cfd), 0);
    assert_int_equal(pg_net_accept(lfd, 1000, &sfd), 0);
    assert_false(pg_net_self_connected(cfd));
    assert_false(pg_net_self_connected(sfd));
    close(cfd);
    close(sfd);
    close(lfd);
}

static void test_tcp_connect_timeout_names_the_address(void **state) {
    int port = comm_test_free_port(1);
    assert_true(port > 0);
    pg_comm_tcp_opts o = {.rank = 1, .size = 2, .host = "127.0.0.1", .port = port, .timeout_ms = 300};
    pg_comm *c = (pg_comm *)1;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(pg_comm_tcp_create(&o, &c), PG_EIO);
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_null(c);
    char want[128];
    snprintf(want, sizeof want, "cannot connect to 127.0.0.1:%d (rank 1 of 2): Connection refused after ", port);
    if (!strstr(pg_err_msg(), want)) fail_msg("message: %s", pg_err_msg());
    double dt = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    assert_true(dt >= 0.25 && dt < 5);
    // Rank 0 waiting for peers that never come says who is missing.
    o = (pg_comm_tcp_opts){.rank = 0, .size = 3, .host = "127.0.0.1", .port = port, .timeout_ms = 200};
    assert_int_equal(pg_comm_tcp_create(&o, &c), PG_EIO);
    if (!strstr(pg_err_msg(), "only 0 of 2 peers connected") || !strstr(pg_err_msg(), "missing ranks 1, 2"))
        fail_msg("message: %s", pg_err_msg());
}

static void test_tcp_bad_options(void **state) {
    pg_comm *c;
    pg_comm_tcp_opts o = {.rank = 2, .size = 2, .host = "127.0.0.1", .port = 1};
    assert_int_equal(pg_comm_tcp_create(&o, &c), PG_EINVAL);
    o = (pg_comm_tcp_opts){.rank = 1, .size = 2, .host = NULL, .port = 1};
    assert_int_equal(pg_comm_tcp_create(&o, &c), PG_EINVAL);
    o = (pg_comm_tcp_opts){.rank = 0, .size = 1, .port = 0};
    assert_int_equal(pg_comm_tcp_create(&o, &c), 0);
    assert_string_equal(c->name, "tcp");
    float x = 2;
    assert_int_equal(c->all_reduce_sum(c, &x, 1, PG_DTYPE_F32), 0);
    assert_true(x == 2);
    c->destroy(c);
}

// ---------------------------------------------------------------- the nccl stubs

static void test_nccl_stubs_say_built_without_cuda(void **state) {
    pg_comm *c = (pg_comm *)1;
    uint8_t id[PG_NCCL_ID_BYTES];
    assert_int_equal(pg_comm_nccl_create_all(NULL, 1, &c), PG_EUNSUPP);
    assert_non_null(strstr(pg_err_msg(), "built without CUDA"));
    assert_int_equal(pg_comm_nccl_unique_id(id), PG_EUNSUPP);
    assert_int_equal(pg_comm_nccl_create_rank(NULL, 0, 1, id, &c), PG_EUNSUPP);
    assert_null(c);
}

int main(void) {
    const char *q = getenv("PAGED_TEST_COMM_QUICK");
#if defined(__SANITIZE_THREAD__)
    g_quick = !q || strcmp(q, "0") != 0;
#else
    g_quick = q && strcmp(q, "0") != 0;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_all_reduce_1_to_8_ranks),
        cmocka_unit_test(test_cpu_all_gather_broadcast),
        cmocka_unit_test(test_cpu_mixed_collectives_back_to_back),
        cmocka_unit_test(test_cpu_abort_wakes_waiting_ranks),
        cmocka_unit_test(test_cpu_mismatched_calls_fail_on_every_rank),
        cmocka_unit_test(test_cpu_bad_arguments),
        cmocka_unit_test(test_cpu_abort_from_another_thread),
        cmocka_unit_test(test_tcp_all_reduce_1_2_3_5_ranks),
        cmocka_unit_test(test_tcp_all_gather_broadcast),
        cmocka_unit_test(test_tcp_mixed_collectives_back_to_back),
        cmocka_unit_test(test_tcp_peer_that_leaves_fails_the_collective),
        cmocka_unit_test(test_tcp_abort_from_another_thread),
        cmocka_unit_test(test_tcp_silent_rank_times_out),
        cmocka_unit_test(test_tcp_mismatched_calls_fail_on_every_rank),
        cmocka_unit_test(test_tcp_wrong_group_size_is_refused),
        cmocka_unit_test(test_tcp_duplicate_rank_is_refused),
        cmocka_unit_test(test_self_connected_socket_is_recognised),
        cmocka_unit_test(test_tcp_connect_timeout_names_the_address),
        cmocka_unit_test(test_tcp_bad_options),
        cmocka_unit_test(test_nccl_stubs_say_built_without_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
