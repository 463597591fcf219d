// tests/unit/test_backend_prof.c - the op profiler (kernels/backend_prof.h)
// around the CPU backend: the wrapped ops give the same bits as the bare
// backend, each op is charged under its name (linear layers by weight
// shape and type), the time charged is the clock's between stamps (no more
// than the wall time around the ops), graph capture is not stamped, and
// destroying the wrapped backend unwraps it (no leak under ASan).
#include "tests/unit/backend_test_util.h" // cmocka and its prerequisites
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/backend_prof.h"
#include "kernels/cpu/cpu_backend.h"

#define H 64
#define N 96
#define ROWS 5

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { return lcg_frand(&rng); }

// rmsnorm, then out = xn . W^T (reps times), then out += xn . W^T: the
// outputs, on a backend wrapped or not.
static void run_ops(bool wrap, int reps, const float *x, const float *w, const float *nw, float *out, float *xn,
                    pg_backend **keep) {
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(1, PG_MATMUL_EXACT, &be), 0);
    if (wrap) assert_int_equal(pg_backend_prof_wrap(be), 0);
    pg_bweight *bw = upload_f32(be, w, N, H), *bn;
    assert_int_equal(be->store->vector_f32(be, nw, H, &bn), 0);
    pg_tensor tx = view_f32((float *)x, ROWS, H), txn = view_f32(xn, ROWS, H);
    pg_tensor to = view_f32(out, ROWS, N);
    assert_int_equal(be->ops->rmsnorm(be, txn, tx, bn, 1e-6f), 0);
    for (int i = 0; i < reps; i++)
        assert_int_equal(be->ops->linear(be, to, txn, NULL, 0, bw, NULL, false, (pg_tensor){0}), 0);
    float *scratch = calloc(ROWS * N, sizeof(float)); // accumulate's product before the add
    assert_int_equal(be->ops->linear(be, to, txn, NULL, 0, bw, NULL, true, view_f32(scratch, ROWS, N)),
                     0);
    assert_int_equal(be->dev->sync(be), 0);
    be->store->weight_free(be, bw);
    be->store->weight_free(be, bn);
    free(scratch);
    if (keep) *keep = be;
    else be->dev->destroy(be);
}

static void test_same_bits_and_names(void **state) {
    (void)state;
    float *x = malloc(sizeof(float) * ROWS * H), *w = malloc(sizeof(float) * N * H), nw[H];
    for (int i = 0; i < ROWS * H; i++) x[i] = frand();
    for (int i = 0; i < N * H; i++) w[i] = frand();
    for (int i = 0; i < H; i++) nw[i] = 1.0f + 0.1f * frand();
    float *o0 = calloc(ROWS * N, sizeof(float)), *o1 = calloc(ROWS * N, sizeof(float));
    float *n0 = calloc(ROWS * H, sizeof(float)), *n1 = calloc(ROWS * H, sizeof(float));
    run_ops(false, 3, x, w, nw, o0, n0, NULL);
    pg_backend *be;
    const int64_t t0 = pg_now_ns();
    run_ops(true, 3, x, w, nw, o1, n1, &be);
    assert_memory_equal(o0, o1, sizeof(float) * ROWS * N);
    assert_memory_equal(n0, n1, sizeof(float) * ROWS * H);
    double ms_lin = -1, ms_res = -1, ms_norm = -1;
    assert_int_equal(pg_backend_prof_calls(be, "linear 96x64 f32", &ms_lin), 3);
    assert_int_equal(pg_backend_prof_calls(be, "linear 96x64 f32 +res", &ms_res), 1);
    assert_int_equal(pg_backend_prof_calls(be, "rmsnorm", &ms_norm), 1);
    assert_int_equal(pg_backend_prof_calls(be, "attention decode", NULL), -1);
    assert_true(ms_lin > 0 && ms_res > 0 && ms_norm >= 0);
    // Every stamp lies inside the wall time around the ops; the timeline
    // is the ops plus the idle intervals (after the sync, before a read).
    // (An idle interval goes to the long-gap line when the machine stalls
    // this process for over 50 ms: either line may hold it.)
    double idle = 0, gap = 0;
    const int64_t n_idle = pg_backend_prof_calls(be, "idle (nothing queued)", &idle);
    const int64_t n_gap = pg_backend_prof_calls(be, "idle over 50 ms (start-up, no requests)", &gap);
    assert_true((n_idle > 0 ? n_idle : 0) + (n_gap > 0 ? n_gap : 0) >= 1);
    const double total = pg_backend_prof_report(be);
    const double wall_ms = (double)(pg_now_ns() - t0) * 1e-6;
    assert_true(total >= ms_lin + ms_res + ms_norm + idle + gap - 1e-6);
    assert_true(total <= wall_ms);
    be->dev->destroy(be); // reports, unwraps and frees
    free(x), free(w), free(o0), free(o1), free(n0), free(n1);
}

// An idle interval over 50 ms (start-up, no requests) is charged apart
// from the idle between steps.
static void test_long_gap(void **state) {
    (void)state;
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(1, PG_MATMUL_EXACT, &be), 0);
    assert_int_equal(pg_backend_prof_wrap(be), 0);
    float x[H], y[H], nw[H];
    for (int i = 0; i < H; i++) x[i] = frand(), nw[i] = 1.0f;
    pg_bweight *bn;
    assert_int_equal(be->store->vector_f32(be, nw, H, &bn), 0);
    assert_int_equal(be->ops->rmsnorm(be, view_f32(y, 1, H), view_f32(x, 1, H), bn, 1e-6f), 0);
    assert_int_equal(be->dev->sync(be), 0);
    nanosleep(&(struct timespec){0, 80 * 1000 * 1000}, NULL);
    assert_int_equal(be->ops->rmsnorm(be, view_f32(y, 1, H), view_f32(x, 1, H), bn, 1e-6f), 0);
    assert_int_equal(be->dev->sync(be), 0);
    double gap = 0;
    assert_true(pg_backend_prof_calls(be, "idle over 50 ms (start-up, no requests)", &gap) >= 1);
    assert_true(gap >= 79.0);
    assert_int_equal(pg_backend_prof_calls(be, "rmsnorm", NULL), 2);
    be->store->weight_free(be, bn);
    be->dev->destroy(be);
}

// Not wrapped: no table; wrapping twice is refused; a backend without a
// timer cannot be wrapped.
static void test_refusals(void **state) {
    (void)state;
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(1, PG_MATMUL_EXACT, &be), 0);
    assert_true(pg_backend_prof_report(be) < 0);
    assert_int_equal(pg_backend_prof_calls(be, "rmsnorm", NULL), -1);
    assert_int_equal(pg_backend_prof_wrap(be), 0);
    assert_int_equal(pg_backend_prof_wrap(be), PG_EINVAL);
    pg_backend_dev nodev = *be->dev;
    nodev.timer_mark = NULL;
    pg_backend fake = *be;
    fake.dev = &nodev;
    assert_int_equal(pg_backend_prof_wrap(&fake), PG_EUNSUPP);
    be->dev->destroy(be);
}

// PAGED_PROFILE_OPS: unset or "0" is off.
static void test_wanted(void **state) {
    (void)state;
    unsetenv("PAGED_PROFILE_OPS");
    assert_false(pg_backend_prof_wanted());
    setenv("PAGED_PROFILE_OPS", "0", 1);
    assert_false(pg_backend_prof_wanted());
    setenv("PAGED_PROFILE_OPS", "1", 1);
    assert_true(pg_backend_prof_wanted());
    unsetenv("PAGED_PROFILE_OPS");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_and_names),
        cmocka_unit_test(test_long_gap),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_wanted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
