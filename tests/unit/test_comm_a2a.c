// tests/unit/test_comm_a2a.c - all_to_all_v of the communicators of
// kernels/comm/comm.h (cpu at 1, 2, 3, 5 and 8 ranks; tcp over loopback at
// 2 and 4 ranks, every rank a thread of this process): random per-pair
// sizes with zeros, one round with pieces of a few MB each way between
// pairs of ranks (a peer that sent before it received would block on a
// full socket buffer there), pieces at scattered offsets in both buffers,
// received byte for byte, and every receive byte outside the pieces left
// as it was (poison); rounds back to back with sizes that change. Failures:
// an abort while ranks wait in all_to_all_v fails each of them promptly
// with PG_EIO (cpu); sizes that disagree between a pair fail every rank
// with a message naming both ranks and both sizes (cpu, and tcp with a
// short collective timeout, so a hang would show as a timeout message).
//
// Also built under ThreadSanitizer (build/tsan/tests/test_comm_a2a).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/comm/comm.h"
#include "tests/unit/comm_test_util.h" // the rank-thread harness, free ports

#define POISON 0xa5
// A piece of the "big" round (round 1): a few MB for cpu; for tcp more than
// loopback's socket buffers hold in flight (a 4 MB send buffer and a receive
// buffer that grows to 32 MB), so an exchange in which both ends of a
// pair block in send would hang there (checked: 3 MB did not).
#define BIG_PIECE_CPU ((size_t)3 << 20)
#define BIG_PIECE_TCP ((size_t)48 << 20)
#define ROUNDS 6

// ---------------------------------------------------------------- the plan

// What rank s sends rank d in round `round` of an n-rank group: every rank
// computes the same table, so no sizes need exchanging. A quarter of the
// pieces are empty; in round 1 ranks 2k and 2k + 1 send each other
// BIG_PIECE plus a little (both directions at once, and for tcp one pair
// through rank 0 and one relayed by it).
static size_t piece_bytes(int n, int round, size_t big, int s, int d) {
    if (round == 1 && s != d && (s ^ 1) == d && d < n) return big + (size_t)(s * 7 + d);
    uint64_t h = mix((uint64_t)round * 1000003u + (uint64_t)s * 131u + (uint64_t)d + 17);
    return h % 4 == 0 ? 0 : (size_t)(h >> 8) % 3000 + 1;
}

// Piece (round, s, d)'s bytes: word i / 8 of a hash stream, 8 bytes per
// hash so that pieces of tens of MB stay quick under the sanitizers.
static uint64_t piece_word(int round, int s, int d, size_t w) {
    return mix(((uint64_t)round << 52) ^ ((uint64_t)s << 44) ^ ((uint64_t)d << 36) ^ w);
}

static void piece_fill(uint8_t *dst, size_t len, int round, int s, int d) {
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = piece_word(round, s, d, i / 8);
        memcpy(dst + i, &v, len - i < 8 ? len - i : 8);
    }
}

// The index of the first byte of src that is not the piece's, or len.
static size_t piece_diff(const uint8_t *src, size_t len, int round, int s, int d) {
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = piece_word(round, s, d, i / 8);
        size_t m = len - i < 8 ? len - i : 8;
        if (memcmp(src + i, &v, m) == 0) continue;
        for (size_t k = 0; k < m; k++)
            if (src[i + k] != ((const uint8_t *)&v)[k]) return i + k;
    }
    return len;
}

static size_t poison_diff(const uint8_t *p, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != POISON) return i;
    return len;
}

// One rank's buffers for a round: pieces at scattered offsets (send: by
// destination from the last rank down, recv: by source in an order that
// rotates with the round), with gaps between them that must stay poison.
typedef struct {
    int round;
    size_t sbytes[MAX_N], soff[MAX_N], rbytes[MAX_N], roff[MAX_N];
    size_t send_len, recv_len;
    uint8_t *send, *recv;
} rank_bufs;

static int bufs_make(rank_bufs *b, int n, int round, size_t big, int me) {
    memset(b, 0, sizeof *b);
    b->round = round;
    size_t off = 3;
    for (int d = n - 1; d >= 0; d--) {
        b->sbytes[d] = piece_bytes(n, round, big, me, d);
        b->soff[d] = off;
        off += b->sbytes[d] + (size_t)(d % 3) * 5;
    }
    b->send_len = off;
    off = 1;
    for (int k = 0; k < n; k++) {
        int s = (k + round) % n;
        b->rbytes[s] = piece_bytes(n, round, big, s, me);
        b->roff[s] = off;
        off += b->rbytes[s] + 1 + (size_t)(s % 4);
    }
    b->recv_len = off + 64;
    b->send = malloc(b->send_len);
    b->recv = malloc(b->recv_len);
    if (!b->send || !b->recv) return -1;
    memset(b->send, POISON, b->send_len);
    for (int d = 0; d < n; d++) piece_fill(b->send + b->soff[d], b->sbytes[d], round, me, d);
    memset(b->recv, POISON, b->recv_len);
    return 0;
}

static void bufs_free(rank_bufs *b) {
    free(b->send);
    free(b->recv);
}

// Walks recv in its layout: a gap that must be poison, a piece, ... and
// the poison tail; names the first wrong byte.
static int bufs_check(rank_thread *t, const rank_bufs *b) {
    size_t at = 0;
    for (int k = 0; k <= t->n; k++) {
        int s = (k + b->round) % t->n;
        size_t gap_end = k < t->n ? b->roff[s] : b->recv_len;
        size_t i = poison_diff(b->recv + at, gap_end - at);
        if (i < gap_end - at)
            return rank_fail(t, "round %d: recv byte %zu, outside every piece, was written (%u)", b->round, at + i,
                             b->recv[at + i]);
        if (k == t->n) break;
        i = piece_diff(b->recv + b->roff[s], b->rbytes[s], b->round, s, t->rank);
        if (i < b->rbytes[s])
            return rank_fail(t, "round %d: byte %zu of rank %d's %zu-byte piece is wrong (%u)", b->round, i, s,
                             b->rbytes[s], b->recv[b->roff[s] + i]);
        at = b->roff[s] + b->rbytes[s];
    }
    // The send buffer is read only.
    for (int d = 0; d < t->n; d++)
        if (piece_diff(b->send + b->soff[d], b->sbytes[d], b->round, t->rank, d) < b->sbytes[d])
            return rank_fail(t, "round %d: the send piece for rank %d changed", b->round, d);
    return 0;
}

// ---------------------------------------------------------------- exchanges

// The big round's piece size (see piece_bytes), per test.
typedef struct {
    size_t big;
} rounds_arg;

static int do_rounds(rank_thread *t, pg_comm *c) {
    const rounds_arg *ra = t->arg;
    for (int round = 0; round < ROUNDS; round++) {
        rank_bufs b;
        int bad = bufs_make(&b, t->n, round, ra->big, t->rank) < 0 ? rank_fail(t, "out of memory") : 0;
        if (!bad && c->all_to_all_v(c, b.send, b.sbytes, b.soff, b.recv, b.rbytes, b.roff) < 0)
            bad = rank_fail(t, "round %d: %s", round, pg_err_msg());
        if (!bad) bad = bufs_check(t, &b);
        bufs_free(&b);
        if (bad) return bad;
    }
    return 0;
}

static void test_cpu_all_to_all_v_1_2_3_5_8_ranks(void **state) {
    rounds_arg ra = {.big = BIG_PIECE_CPU};
    const int ns[] = {1, 2, 3, 5, 8};
    for (int i = 0; i < 5; i++) run_ranks(IMPL_CPU, ns[i], do_rounds, &ra);
}

static void test_tcp_all_to_all_v_2_4_ranks(void **state) {
    rounds_arg ra = {.big = BIG_PIECE_TCP};
    run_ranks(IMPL_TCP, 2, do_rounds, &ra);
    run_ranks(IMPL_TCP, 4, do_rounds, &ra);
}

// ---------------------------------------------------------------- failures

// Rank 0 sends rank 1 four bytes, rank 1 expects five: every rank fails,
// told which pair and which sizes, and the communicator stays broken.
static int do_mismatch(rank_thread *t, pg_comm *c) {
    size_t sbytes[MAX_N] = {0}, soff[MAX_N] = {0}, rbytes[MAX_N] = {0}, roff[MAX_N] = {0};
    uint8_t send[8] = {1, 2, 3, 4}, recv[8];
    if (t->rank == 0) sbytes[1] = 4;
    if (t->rank == 1) rbytes[0] = 5;
    double t0 = now_s();
    int e = c->all_to_all_v(c, send, sbytes, soff, recv, rbytes, roff);
    double waited = now_s() - t0;
    if (e >= 0) return rank_fail(t, "mismatched all_to_all_v succeeded");
    if (!strstr(pg_err_msg(), "rank 0 sends 4 bytes to rank 1, which expects 5"))
        return rank_fail(t, "message: %s", pg_err_msg());
    if (waited > 2.0) return rank_fail(t, "failed after %.2f s", waited);
    if (c->barrier(c) >= 0) return rank_fail(t, "a barrier after the mismatch succeeded");
    return 0;
}

static void test_cpu_size_mismatch_fails_every_rank(void **state) {
    run_ranks(IMPL_CPU, 2, do_mismatch, NULL);
    run_ranks(IMPL_CPU, 3, do_mismatch, NULL);
}

// The collective timeout is short (3 s): a mismatch that hung instead of
// failing would end in a timeout message, not the sizes.
static void test_tcp_size_mismatch_fails_every_rank(void **state) {
    run_ranks_timeout(IMPL_TCP, 2, do_mismatch, NULL, 3000);
    run_ranks_timeout(IMPL_TCP, 3, do_mismatch, NULL, 3000);
}

typedef struct {
    int idle_rank; // never calls; the group is aborted while the others wait
    _Atomic int calling;
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
    rank_bufs b;
    if (bufs_make(&b, t->n, 0, 0, t->rank) < 0) {
        bufs_free(&b);
        return rank_fail(t, "out of memory");
    }
    atomic_fetch_add(&aa->calling, 1);
    int e = c->all_to_all_v(c, b.send, b.sbytes, b.soff, b.recv, b.rbytes, b.roff);
    bufs_free(&b);
    if (e != PG_EIO) return rank_fail(t, "returned %d, want PG_EIO (%s)", e, pg_err_msg());
    if (!strstr(pg_err_msg(), "the test pulled the plug")) return rank_fail(t, "message: %s", pg_err_msg());
    size_t zero[MAX_N] = {0};
    if (c->all_to_all_v(c, NULL, zero, zero, NULL, zero, zero) != PG_EIO)
        return rank_fail(t, "all_to_all_v after the abort did not fail");
    return 0;
}

static void abort_case(int n, int sleep_ms) {
    pg_comm *cs[MAX_N];
    assert_int_equal(pg_comm_cpu_create_group(n, cs), 0);
    abort_arg aa = {.idle_rank = n - 1};
    rank_thread ts[MAX_N];
    pthread_t th[MAX_N];
    for (int r = 0; r < n; r++) {
        ts[r] = (rank_thread){.kind = IMPL_CPU, .rank = r, .n = n, .c = cs[r], .fn = do_wait_for_abort, .arg = &aa};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ts[r]), 0);
    }
    while (atomic_load(&aa.calling) < n - 1) sched_yield();
    // Long enough for the waiting ranks to go from spinning to sleeping
    // (or, at 0, to catch them spinning).
    struct timespec pause = {0, sleep_ms * 1000000L};
    nanosleep(&pause, NULL);
    double t0 = now_s();
    pg_comm_cpu_abort(cs[n - 1], "the test pulled the plug");
    atomic_store(&aa.aborted, true);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    double joined = now_s() - t0;
    for (int r = 0; r < n; r++)
        if (ts[r].rc) fail_msg("%d ranks: rank %d: %s", n, r, ts[r].err);
    // Milliseconds; a bound far from a hang, loose enough for sanitizers.
    if (joined > 3.0) fail_msg("%d ranks: the ranks returned %.2f s after the abort", n, joined);
}

static void test_cpu_abort_fails_waiting_ranks(void **state) {
    abort_case(2, 0);
    abort_case(3, 60);
    abort_case(5, 5);
    abort_case(8, 60);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_all_to_all_v_1_2_3_5_8_ranks),
        cmocka_unit_test(test_tcp_all_to_all_v_2_4_ranks),
        cmocka_unit_test(test_cpu_size_mismatch_fails_every_rank),
        cmocka_unit_test(test_tcp_size_mismatch_fails_every_rank),
        cmocka_unit_test(test_cpu_abort_fails_waiting_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
