// bench/bench_comm.c - all_reduce_sum time per size for the cpu and tcp
// communicators (kernels/comm/comm.h) at 2, 4 and 8 ranks, every rank a thread
// of this process (tcp over loopback). Prints the median microseconds per
// f32 all-reduce and the bytes per second of one rank's buffer.
//
//   build/bench/bench_comm [iters]     (default 200 timed calls per size)
//
// On a machine with fewer cores than ranks the spinning ranks share cores,
// so the 8-rank figures there measure the scheduler as much as the code.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/comm/comm.h"
#include "kernels/dtype.h"
#define COMM_TEST_PORT_ONLY // no cmocka here
#include "tests/unit/comm_test_util.h"

#define MAX_N 8

static const int64_t COUNTS[] = {1024, 16384, 262144, 1048576};

typedef struct {
    int tcp, rank, n, port, iters;
    pg_comm *c;
    double med_us[4];
    int rc;
} rank_job;

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *rank_main(void *p) {
    rank_job *j = p;
    pg_comm *c = j->c;
    if (j->tcp) {
        pg_comm_tcp_opts o = {.rank = j->rank, .size = j->n, .host = "127.0.0.1", .port = j->port};
        if ((j->rc = pg_comm_tcp_create(&o, &c)) < 0) {
            fprintf(stderr, "rank %d: %s\n", j->rank, pg_err_msg());
            return NULL;
        }
    }
    float *buf = calloc((size_t)COUNTS[3], sizeof(float));
    double *t = malloc(sizeof(double) * (size_t)j->iters);
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < 10 + j->iters; i++) {
            if (c->barrier(c) < 0) break;
            int64_t t0 = pg_now_ns();
            if ((j->rc = c->all_reduce_sum(c, buf, COUNTS[s], PG_DTYPE_F32)) < 0) {
                fprintf(stderr, "rank %d: %s\n", j->rank, pg_err_msg());
                goto out;
            }
            if (i >= 10) t[i - 10] = (double)(pg_now_ns() - t0) * 1e-3;
        }
        qsort(t, (size_t)j->iters, sizeof *t, cmp_dbl);
        j->med_us[s] = t[j->iters / 2];
    }
out:
    free(buf);
    free(t);
    c->destroy(c);
    return NULL;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 200;
    if (iters < 1) iters = 1;
    printf("%-4s %5s %10s %12s %10s\n", "impl", "ranks", "bytes", "median_us", "GB/s");
    for (int tcp = 0; tcp < 2; tcp++) {
        for (int n = 2; n <= MAX_N; n *= 2) {
            rank_job jobs[MAX_N];
            pthread_t th[MAX_N];
            pg_comm *cs[MAX_N] = {0};
            if (!tcp && pg_comm_cpu_create_group(n, cs) < 0) {
                fprintf(stderr, "%s\n", pg_err_msg());
                return 1;
            }
            int port = tcp ? comm_test_free_port(1) : 0;
            for (int r = 0; r < n; r++) {
                jobs[r] = (rank_job){.tcp = tcp, .rank = r, .n = n, .port = port, .iters = iters, .c = cs[r]};
                pthread_create(&th[r], NULL, rank_main, &jobs[r]);
            }
            for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
            for (int r = 0; r < n; r++)
                if (jobs[r].rc < 0) return 1;
            for (int s = 0; s < 4; s++) {
                double bytes = (double)COUNTS[s] * 4, us = jobs[0].med_us[s];
                printf("%-4s %5d %10.0f %12.1f %10.2f\n", tcp ? "tcp" : "cpu", n, bytes, us, bytes / us * 1e-3);
            }
        }
    }
    return 0;
}
