// tests/unit/test_thread_pool.c - the fork-join pool under stress: every task
// index of every job runs exactly once, on a valid thread index, with jobs
// of 1..1000 tasks published back to back (workers still finishing or
// waking up from the previous job), tasks of uneven length, more threads
// than cores, workers that fell asleep, and pools created and destroyed in
// a loop.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/thread_pool.h"

#define MAX_TASKS 1000

typedef struct {
    _Atomic int hits[MAX_TASKS];
    _Atomic int bad_thread;
    int n_threads;
    int spin; // busy work per task, scaled by the index (uneven tasks)
    _Atomic int64_t sum;
} job;

static void count_task(void *ctx, int64_t i, int thread) {
    job *j = ctx;
    if (thread < 0 || thread >= j->n_threads) atomic_fetch_add(&j->bad_thread, 1);
    volatile int64_t x = 0;
    for (int k = 0; k < j->spin * (int)(i % 7); k++) x += k;
    atomic_fetch_add(&j->hits[i], 1);
    atomic_fetch_add(&j->sum, i);
}

static void run_and_check(pg_pool *p, job *j, int64_t n) {
    for (int64_t i = 0; i < n; i++) atomic_store(&j->hits[i], 0);
    atomic_store(&j->sum, 0);
    pg_pool_run(p, n, count_task, j);
    // pg_pool_run returns only after every task finished: all counts final.
    for (int64_t i = 0; i < n; i++)
        if (atomic_load(&j->hits[i]) != 1)
            fail_msg("n_tasks %lld: index %lld ran %d times", (long long)n, (long long)i,
                     atomic_load(&j->hits[i]));
    assert_int_equal(atomic_load(&j->sum), n * (n - 1) / 2);
    assert_int_equal(atomic_load(&j->bad_thread), 0);
}

static void stress(int n_threads, int spin, int rounds) {
    pg_pool *p = NULL;
    assert_int_equal(pg_pool_create(n_threads, &p), 0);
    assert_int_equal(pg_pool_threads(p), n_threads);
    job *j = calloc(1, sizeof *j);
    j->n_threads = n_threads;
    j->spin = spin;
    for (int r = 0; r < rounds; r++)
        for (int64_t n = 1; n <= MAX_TASKS; n += 1 + (n * 7 + r) % 37) run_and_check(p, j, n);
    // Every size from 1 to 64 back to back: the smallest jobs race hardest
    // with workers still leaving the previous one.
    for (int r = 0; r < 20; r++)
        for (int64_t n = 1; n <= 64; n++) run_and_check(p, j, n);
    free(j);
    pg_pool_destroy(p);
}

static void test_every_index_once_two_threads(void **state) {
    stress(2, 0, 20);
}
static void test_every_index_once_uneven_tasks(void **state) {
    stress(2, 200, 3);
}
static void test_every_index_once_oversubscribed(void **state) {
    stress(16, 20, 2);
}
static void test_every_index_once_single_thread(void **state) {
    stress(1, 0, 2);
}

// Workers sleep after spinning a while; jobs separated by pauses longer
// than the spin must still wake them (or be finished by the caller).
static void test_jobs_after_workers_slept(void **state) {
    pg_pool *p = NULL;
    assert_int_equal(pg_pool_create(3, &p), 0);
    job *j = calloc(1, sizeof *j);
    j->n_threads = 3;
    for (int r = 0; r < 5; r++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        run_and_check(p, j, 1 + r * 97);
        run_and_check(p, j, 500);
    }
    free(j);
    pg_pool_destroy(p);
}

// Creating and destroying pools, with and without jobs in between, leaks
// nothing and never hangs (run under ASan by `ninja asan`).
static void test_create_destroy_loop(void **state) {
    job *j = calloc(1, sizeof *j);
    for (int r = 0; r < 50; r++) {
        pg_pool *p = NULL;
        int n = 1 + r % 5;
        assert_int_equal(pg_pool_create(n, &p), 0);
        j->n_threads = n;
        if (r % 2) run_and_check(p, j, 1 + r);
        pg_pool_destroy(p);
    }
    free(j);
}

// Zero or negative task counts run nothing.
static void test_empty_job_runs_nothing(void **state) {
    pg_pool *p = NULL;
    assert_int_equal(pg_pool_create(2, &p), 0);
    job *j = calloc(1, sizeof *j);
    j->n_threads = 2;
    pg_pool_run(p, 0, count_task, j);
    pg_pool_run(p, -3, count_task, j);
    assert_int_equal(atomic_load(&j->sum), 0);
    assert_int_equal(atomic_load(&j->hits[0]), 0);
    free(j);
    pg_pool_destroy(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_index_once_two_threads),
        cmocka_unit_test(test_every_index_once_uneven_tasks),
        cmocka_unit_test(test_every_index_once_oversubscribed),
        cmocka_unit_test(test_every_index_once_single_thread),
        cmocka_unit_test(test_jobs_after_workers_slept),
        cmocka_unit_test(test_create_destroy_loop),
        cmocka_unit_test(test_empty_job_runs_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
