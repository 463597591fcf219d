// tests/unit/test_gemma_ops.c - the CPU backend's Gemma 3 ops
// (kernels/backend.h gate_up_gelu, rmsnorm_add, scale; kernels/cpu/gemma_ops.c)
// against naive references in double written here: RMSNorm, the product
// with the fused [gate | up] weight, gelu with PyTorch's tanh formula; the
// post-norm's x += RMSNorm(y) * w; the embedding scale. f32 weights, 1 and
// 2 threads (the same bits).
#include "tests/unit/backend_test_util.h" // cmocka and its prerequisites
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_backend.h"

#define H 48
#define FFN 80
#define ROWS 7
#define EPS 1e-6f

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { return lcg_frand(&rng); }

static double ref_gelu(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

static void ref_rmsnorm(const float *x, const float *w, int n, double *out) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + EPS);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

// h = gelu_tanh(g) * u, [g | u] = RMSNorm(x) * norm . W^T; returns h [ROWS][FFN].
static float *run_geglu(int threads, const float *x, const float *norm, const float *w) {
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(threads, PG_MATMUL_EXACT, &be), 0);
    pg_bweight *bn = upload_f32(be, norm, 1, H), *bw = upload_f32(be, w, 2 * FFN, H);
    float *h = calloc(ROWS * FFN, sizeof(float)), *xn = calloc(ROWS * H, sizeof(float));
    float *gu = calloc(ROWS * 2 * FFN, sizeof(float));
    assert_int_equal(be->ops->gate_up_gelu(be, view_f32(h, ROWS, FFN), view_f32((float *)x, ROWS, H), bn,
                                           EPS, bw, view_f32(xn, ROWS, H), view_f32(gu, ROWS, 2 * FFN)),
                     0);
    be->store->weight_free(be, bn);
    be->store->weight_free(be, bw);
    be->dev->destroy(be);
    free(xn), free(gu);
    return h;
}

static void test_gate_up_gelu(void **state) {
    (void)state;
    float *x = malloc(sizeof(float) * ROWS * H), *norm = malloc(sizeof(float) * H);
    float *w = malloc(sizeof(float) * 2 * FFN * H);
    for (int i = 0; i < ROWS * H; i++) x[i] = 3.0f * frand();
    for (int i = 0; i < H; i++) norm[i] = 1.0f + 0.5f * frand();
    for (int i = 0; i < 2 * FFN * H; i++) w[i] = 0.4f * frand();
    float *h1 = run_geglu(1, x, norm, w), *h2 = run_geglu(2, x, norm, w);
    assert_memory_equal(h1, h2, sizeof(float) * ROWS * FFN);
    // The error relative to the row's largest output (the f32 sums of the
    // product cancel: an element's own size is no measure).
    double worst = 0, xn[H], want[FFN];
    for (int r = 0; r < ROWS; r++) {
        ref_rmsnorm(x + r * H, norm, H, xn);
        double big = 0;
        for (int j = 0; j < FFN; j++) {
            double g = 0, u = 0;
            for (int e = 0; e < H; e++) g += xn[e] * w[j * H + e], u += xn[e] * w[(FFN + j) * H + e];
            want[j] = ref_gelu(g) * u;
            big = fabs(want[j]) > big ? fabs(want[j]) : big;
        }
        for (int j = 0; j < FFN; j++) {
            const double err = fabs(h1[r * FFN + j] - want[j]) / big;
            worst = err > worst ? err : worst;
        }
    }
    print_message("gate_up_gelu: worst error %.2e of the row's largest output\n", worst);
    assert_true(worst < 1e-5);
    // gelu_tanh itself at points across its range, and its limits.
    for (int i = -80; i <= 80; i++) {
        const double v = i / 8.0;
        assert_true(fabs(pg_cpu_gelu_tanh((float)v) - ref_gelu(v)) <= 1e-6 * (1 + fabs(v)));
    }
    assert_true(pg_cpu_gelu_tanh(-30.0f) == 0.0f && pg_cpu_gelu_tanh(30.0f) == 30.0f);
    free(x), free(norm), free(w), free(h1), free(h2);
}

static void test_rmsnorm_add_and_scale(void **state) {
    (void)state;
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(2, PG_MATMUL_EXACT, &be), 0);
    float x[ROWS * H], x0[ROWS * H], y[ROWS * H], w[H];
    for (int i = 0; i < ROWS * H; i++) x[i] = x0[i] = frand(), y[i] = 5.0f * frand();
    for (int i = 0; i < H; i++) w[i] = 1.0f + frand();
    pg_bweight *bw = upload_f32(be, w, 1, H);
    assert_int_equal(be->ops->rmsnorm_add(be, view_f32(x, ROWS, H), view_f32(y, ROWS, H), bw, EPS),
                     0);
    double n[H], worst = 0;
    for (int r = 0; r < ROWS; r++) {
        ref_rmsnorm(y + r * H, w, H, n);
        for (int e = 0; e < H; e++) {
            const double err = fabs(x[r * H + e] - (x0[r * H + e] + n[e]));
            worst = err > worst ? err : worst;
        }
    }
    print_message("rmsnorm_add: worst absolute error %.2e\n", worst);
    assert_true(worst < 1e-5);
    // The scale: every element times s in f32, strided views left alone
    // outside their columns.
    memcpy(x0, x, sizeof x);
    pg_tensor half = {x, PG_DTYPE_F32, ROWS, H / 2, H};
    assert_int_equal(be->ops->scale(be, half, sqrtf((float)H)), 0);
    for (int r = 0; r < ROWS; r++)
        for (int e = 0; e < H; e++)
            assert_true(x[r * H + e] == (e < H / 2 ? x0[r * H + e] * sqrtf((float)H) : x0[r * H + e]));
    be->store->weight_free(be, bw);
    be->dev->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_up_gelu),
        cmocka_unit_test(test_rmsnorm_add_and_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
