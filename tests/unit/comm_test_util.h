// tests/unit/comm_test_util.h - what the communicator tests share
// (test_comm.c, test_comm_a2a.c; bench/bench_comm.c takes only the port):
// a free loopback port for a tcp group, and the harness that runs a
// function on n rank threads of this process, each with its communicator
// (cpu: one group made by the main thread; tcp: each thread makes its own
// over loopback). Static inline functions: each test binary is one .c file
// and gets its own copy. Also built under ASan and TSan (TSAN_UNIT_TESTS in
// tools/gen_build.py).
//
// With COMM_TEST_PORT_ONLY defined before the include, only
// comm_test_free_port (no cmocka needed: bench/bench_comm.c).
#ifndef PAGED_TESTS_UNIT_COMM_TEST_UTIL_H
#define PAGED_TESTS_UNIT_COMM_TEST_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

// A port P of 127.0.0.1 with P .. P + n - 1 all free now, or -1. Drawn at
// random below the kernel's ephemeral range (32768 up), as
// tests/integration/server_util.py's free_port draws: a port bind(0) hands
// out is one an outgoing connection of this machine (another test's dial)
// can take between this check and the group's listen. The seed mixes the
// clock and the pid, so tests run side by side draw apart.
static inline int comm_test_free_port(int n) {
    enum { MAX_PORTS = 8 };
    static uint64_t state;
    if (n < 1 || n > MAX_PORTS) return -1;
    if (state == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        state = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32) ^ 1;
    }
    for (int attempt = 0; attempt < 200; attempt++) {
        uint64_t z = (state += 0x9e3779b97f4a7c15ULL); // splitmix64
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        int p = 20000 + (int)(z % (uint64_t)(32768 - n - 20000));
        int fds[MAX_PORTS], k = 0;
        for (; k < n; k++) {
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(p + k)),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            fds[k] = socket(AF_INET, SOCK_STREAM, 0);
            if (fds[k] < 0) break;
            if (bind(fds[k], (struct sockaddr *)&a, sizeof a) != 0) {
                close(fds[k]);
                break;
            }
        }
        bool ok = k == n;
        while (k > 0) close(fds[--k]);
        if (ok) return p;
    }
    return -1;
}

#ifndef COMM_TEST_PORT_ONLY

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "kernels/comm/comm.h"

#define MAX_N 8

typedef enum { IMPL_CPU, IMPL_TCP } impl;
static inline const char *impl_name(impl k) { return k == IMPL_CPU ? "cpu" : "tcp"; }

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

// What one rank thread does once it has its communicator. Returns 0, or
// non-zero after writing what went wrong into `err` (rank_fail; cmocka's
// asserts must stay on the main thread).
typedef struct rank_thread rank_thread;
typedef int (*rank_fn)(rank_thread *t, pg_comm *c);

struct rank_thread {
    impl kind;
    int rank, n;
    int port;           // tcp
    int claimed_size;   // tcp: the size this rank says in its hello (0: n)
    int claimed_rank;   // tcp: -1: its own (run_ranks sets -1; a zeroed one claims rank 0)
    int timeout_ms;     // tcp: the connect timeout (0: 20 s)
    int op_timeout_ms;  // tcp
    pg_comm *c;         // cpu: made by the main thread
    rank_fn fn;
    void *arg;
    int create_rc;      // tcp: pg_comm_tcp_create's result
    int rc;             // fn's result
    char err[1024];
};

static inline int rank_fail(rank_thread *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
    return -1;
}

// A rank thread's body: makes its tcp communicator (a failure: create_rc,
// rc -1 and err), runs fn (none: rc 0) and destroys the communicator.
static inline void *rank_main(void *p) {
    rank_thread *t = p;
    pg_comm *c = t->c;
    if (t->kind == IMPL_TCP) {
        pg_comm_tcp_opts o = {.rank = t->claimed_rank >= 0 ? t->claimed_rank : t->rank,
                              .size = t->claimed_size ? t->claimed_size : t->n,
                              .host = "127.0.0.1",
                              .port = t->port,
                              .timeout_ms = t->timeout_ms ? t->timeout_ms : 20000,
                              .op_timeout_ms = t->op_timeout_ms};
        t->create_rc = pg_comm_tcp_create(&o, &c);
        if (t->create_rc < 0) {
            t->rc = rank_fail(t, "create: %s", pg_err_msg());
            return NULL;
        }
    }
    t->rc = t->fn ? t->fn(t, c) : 0;
    c->destroy(c);
    return NULL;
}

// Starts n rank threads running ts[r].fn (cpu: over one group made here;
// tcp: each makes its communicator first, on a free port).
static inline void start_ranks(impl kind, int n, rank_thread *ts, pthread_t *th) {
    int port = kind == IMPL_TCP ? comm_test_free_port(1) : 0;
    if (kind == IMPL_TCP) assert_true(port > 0);
    pg_comm *cs[MAX_N] = {0};
    if (kind == IMPL_CPU) assert_int_equal(pg_comm_cpu_create_group(n, cs), 0);
    for (int r = 0; r < n; r++) {
        ts[r].kind = kind;
        ts[r].rank = r;
        ts[r].n = n;
        ts[r].port = port;
        ts[r].c = cs[r];
        ts[r].err[0] = 0;
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ts[r]), 0);
    }
}

// Runs ts[r].fn on n rank threads, waits for all. ts[] holds the results.
static inline void run_ranks_custom(impl kind, int n, rank_thread *ts) {
    pthread_t th[MAX_N];
    start_ranks(kind, n, ts, th);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

// Runs fn on n rank threads (tcp: collectives time out after op_timeout_ms,
// 0: the default) and fails the test with the first failing rank's error.
static inline void run_ranks_timeout(impl kind, int n, rank_fn fn, void *arg, int op_timeout_ms) {
    rank_thread ts[MAX_N];
    memset(ts, 0, sizeof ts);
    for (int r = 0; r < n; r++)
        ts[r].fn = fn, ts[r].arg = arg, ts[r].claimed_rank = -1, ts[r].op_timeout_ms = op_timeout_ms;
    run_ranks_custom(kind, n, ts);
    for (int r = 0; r < n; r++)
        if (ts[r].rc != 0) fail_msg("%s, %d ranks: rank %d: %s", impl_name(kind), n, r, ts[r].err);
}

static inline void run_ranks(impl kind, int n, rank_fn fn, void *arg) { run_ranks_timeout(kind, n, fn, arg, 0); }

#endif // COMM_TEST_PORT_ONLY

#endif // PAGED_TESTS_UNIT_COMM_TEST_UTIL_H
