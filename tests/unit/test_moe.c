// tests/unit/test_moe.c - the CPU backend's mixture-of-experts feed-forward
// (kernels/backend.h moe_ffn, kernels/cpu/moe.c) against a naive reference
// written here: route each row in double (softmax over every expert, top-k
// by repeated argmax with ties to the lower id), then run the chosen
// experts one row at a time over the weights' dequantized values. Shapes of
// Mixtral (8 experts, top 2, renormalised) and Qwen3-MoE (128, top 8, with
// and without norm_topk_prob); f32, bf16 and Q8_0 weights; gate|up fused
// and in two parts; accumulate on and off (and in place, out = x); ties;
// and the same bits for 1 and 2 threads. Expert parallelism: the outputs
// over a partition of the experts (the others NULL) sum to the whole's.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

#define HIDDEN 64
#define FFN 96
#define EPS 1e-6f

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rnd_normal(void) {
    float u = ((float)rnd_u32() + 0.5f) / 4294967296.0f, v = ((float)rnd_u32() + 0.5f) / 4294967296.0f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

// --- weights --------------------------------------------------------------------------

// One matrix as stored (data, in `dtype`) and as it dequantizes (deq).
typedef struct {
    pg_weight w;
    void *data;
    float *deq; // [rows][cols]
} test_mat;

// One row of f32 values into dtype: f32, bf16, or Q8_0 (per 32 values an
// fp16 d = max|x| / 127 and 32 int8 round(x / d), GGML's reference rule).
static void store_row(int dtype, const float *x, int64_t cols, uint8_t *dst) {
    if (dtype == PG_DTYPE_F32) {
        memcpy(dst, x, sizeof(float) * (size_t)cols);
    } else if (dtype == PG_DTYPE_BF16) {
        for (int64_t j = 0; j < cols; j++) {
            uint16_t h = pg_f32_to_bf16(x[j]);
            memcpy(dst + 2 * j, &h, 2);
        }
    } else {
        assert_int_equal(dtype, PG_DTYPE_Q8_0);
        for (int64_t b = 0; b < cols / 32; b++, x += 32, dst += 34) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
            float d = amax / 127, id = d ? 1 / d : 0;
            uint16_t h = pg_f32_to_f16(d);
            memcpy(dst, &h, 2);
            for (int j = 0; j < 32; j++) dst[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        }
    }
}

// rows x cols of N(0, std^2) as stored in dtype (std 0: zeros).
static test_mat make_mat(int dtype, int64_t rows, int64_t cols, float std) {
    test_mat t;
    const size_t rb = pg_dtype_row_bytes(dtype, cols);
    assert_true(rb > 0);
    t.data = malloc(rb * (size_t)rows);
    t.deq = malloc(sizeof(float) * (size_t)(rows * cols));
    float *src = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < cols; j++) src[j] = std * rnd_normal();
        store_row(dtype, src, cols, (uint8_t *)t.data + (size_t)r * rb);
        pg_dequantize_row(dtype, (uint8_t *)t.data + (size_t)r * rb, t.deq + r * cols, cols);
    }
    free(src);
    t.w = (pg_weight){.data = t.data, .dtype = dtype, .rows = rows, .cols = cols, .row_bytes = rb};
    return t;
}

static void free_mat(test_mat *t) {
    free(t->data);
    free(t->deq);
}

// A layer's MoE weights, host side and uploaded.
typedef struct {
    int32_t n_exp;
    float norm[HIDDEN];
    test_mat router, *gu, *down; // gu[e] [2 FFN][HIDDEN] gate rows then up; down[e] [HIDDEN][FFN]
    pg_bweight *b_norm, *b_router, **b_gu, **b_down;
} moe_layer;

// router_std 0 makes every router logit 0: all experts tie.
static void layer_make(pg_backend *b, moe_layer *l, int dtype, int32_t n_exp, float router_std) {
    l->n_exp = n_exp;
    for (int j = 0; j < HIDDEN; j++) l->norm[j] = 1.0f + 0.2f * rnd_normal();
    pg_weight nw = {.data = l->norm, .dtype = PG_DTYPE_F32, .rows = 1, .cols = HIDDEN,
                    .row_bytes = sizeof l->norm};
    assert_int_equal(b->store->weight_upload(b, &nw, 1, &l->b_norm), 0);
    l->router = make_mat(dtype, n_exp, HIDDEN, router_std);
    assert_int_equal(b->store->weight_upload(b, &l->router.w, 1, &l->b_router), 0);
    l->gu = calloc((size_t)n_exp, sizeof(test_mat));
    l->down = calloc((size_t)n_exp, sizeof(test_mat));
    l->b_gu = calloc((size_t)n_exp, sizeof(pg_bweight *));
    l->b_down = calloc((size_t)n_exp, sizeof(pg_bweight *));
    for (int32_t e = 0; e < n_exp; e++) {
        l->gu[e] = make_mat(dtype, 2 * FFN, HIDDEN, 0.15f);
        l->down[e] = make_mat(dtype, HIDDEN, FFN, 0.1f);
        if (e % 2) { // odd experts: gate and up as two parts, as a checkpoint stores them
            pg_weight parts[2] = {l->gu[e].w, l->gu[e].w};
            parts[0].rows = parts[1].rows = FFN;
            parts[1].data = (const uint8_t *)l->gu[e].w.data + (size_t)FFN * l->gu[e].w.row_bytes;
            assert_int_equal(b->store->weight_upload(b, parts, 2, &l->b_gu[e]), 0);
        } else {
            assert_int_equal(b->store->weight_upload(b, &l->gu[e].w, 1, &l->b_gu[e]), 0);
        }
        assert_int_equal(b->store->weight_upload(b, &l->down[e].w, 1, &l->b_down[e]), 0);
    }
}

static void layer_free(pg_backend *b, moe_layer *l) {
    b->store->weight_free(b, l->b_norm);
    b->store->weight_free(b, l->b_router);
    free_mat(&l->router);
    for (int32_t e = 0; e < l->n_exp; e++) {
        b->store->weight_free(b, l->b_gu[e]);
        b->store->weight_free(b, l->b_down[e]);
        free_mat(&l->gu[e]);
        free_mat(&l->down[e]);
    }
    free(l->gu), free(l->down), free(l->b_gu), free(l->b_down);
}

// --- the reference ------------------------------------------------------------------------

// out[m][HIDDEN] = the MoE feed-forward of x[m][HIDDEN] in double, dense
// over the chosen experts.
static void ref_moe(const moe_layer *l, const float *x, int64_t m, int32_t k, bool renorm, double *out) {
    const int32_t E = l->n_exp;
    double xn[HIDDEN], gu[2 * FFN], h[FFN];
    double *p = malloc(sizeof(double) * (size_t)E);
    bool *taken = malloc((size_t)E);
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * HIDDEN;
        double ss = 0;
        for (int j = 0; j < HIDDEN; j++) ss += (double)xi[j] * xi[j];
        const double r = 1.0 / sqrt(ss / HIDDEN + EPS);
        for (int j = 0; j < HIDDEN; j++) xn[j] = xi[j] * r * l->norm[j];
        double mx = -INFINITY, sum = 0;
        for (int32_t e = 0; e < E; e++) {
            p[e] = 0;
            for (int j = 0; j < HIDDEN; j++) p[e] += l->router.deq[e * HIDDEN + j] * xn[j];
            mx = p[e] > mx ? p[e] : mx;
        }
        for (int32_t e = 0; e < E; e++) sum += p[e] = exp(p[e] - mx);
        for (int32_t e = 0; e < E; e++) p[e] /= sum, taken[e] = false;
        int32_t sel[64];
        double chosen = 0;
        for (int32_t t = 0; t < k; t++) { // repeated argmax; the first (lowest) id wins a tie
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
            taken[best] = true;
            sel[t] = best;
            chosen += p[best];
        }
        double *o = out + i * HIDDEN;
        for (int j = 0; j < HIDDEN; j++) o[j] = 0;
        for (int32_t t = 0; t < k; t++) {
            const int32_t e = sel[t];
            const double wt = renorm ? p[e] / chosen : p[e];
            for (int r2 = 0; r2 < 2 * FFN; r2++) {
                gu[r2] = 0;
                for (int j = 0; j < HIDDEN; j++) gu[r2] += l->gu[e].deq[r2 * HIDDEN + j] * xn[j];
            }
            for (int f = 0; f < FFN; f++) h[f] = gu[f] / (1 + exp(-gu[f])) * gu[FFN + f];
            for (int d = 0; d < HIDDEN; d++) {
                double y = 0;
                for (int f = 0; f < FFN; f++) y += l->down[e].deq[d * FFN + f] * h[f];
                o[d] += wt * y;
            }
        }
    }
    free(p);
    free(taken);
}

// --- running the op --------------------------------------------------------------------------

static pg_backend *backend(int n_threads, pg_matmul_mode mode) {
    pg_backend *b = NULL;
    assert_int_equal(pg_backend_cpu_create(n_threads, mode, &b), 0);
    assert_non_null(b->ops->moe_ffn);
    assert_non_null(b->ops->moe_workspace_bytes);
    return b;
}

static float *rnd_rows(int64_t m) {
    float *x = malloc(sizeof(float) * (size_t)(m * HIDDEN));
    for (int64_t i = 0; i < m * HIDDEN; i++) x[i] = rnd_normal();
    return x;
}

// Runs moe_ffn on x into out (out == x allowed), with a workspace sized
// for max_rows >= m rows.
static void run_moe(pg_backend *b, const moe_layer *l, float *out, int64_t out_stride, const float *x,
                    int64_t m, int32_t k, bool renorm, bool accumulate) {
    const size_t ws_bytes = b->ops->moe_workspace_bytes(b, (int32_t)m + 3, HIDDEN, FFN, l->n_exp, k);
    void *ws = NULL;
    assert_int_equal(b->dev->alloc(b, ws_bytes, &ws), 0);
    pg_tensor to = {.data = out, .dtype = PG_DTYPE_F32, .rows = m, .cols = HIDDEN, .stride = out_stride};
    pg_tensor tx = {.data = (void *)x, .dtype = PG_DTYPE_F32, .rows = m, .cols = HIDDEN, .stride = HIDDEN};
    assert_int_equal(b->ops->moe_ffn(b, to, tx, l->b_norm, EPS, l->b_router,
                                     (const pg_bweight *const *)l->b_gu, (const pg_bweight *const *)l->b_down,
                                     l->n_exp, k, renorm, accumulate, ws, ws_bytes),
                     0);
    b->dev->free(b, ws);
}

static const char *dtype_name(int dtype) {
    return dtype == PG_DTYPE_F32 ? "f32" : dtype == PG_DTYPE_BF16 ? "bf16" : "q8_0";
}

// Every row count, accumulate off, on (into a wider-strided output whose
// extra columns must stay) and in place (out = x); returns the worst error
// relative to the case's largest reference value. The reference uses the
// exact values the stored weights dequantize to, so only f32 rounding
// separates the two (dots of <= 96 terms, expf): ~1e-6 relative; the bound
// 1e-4 leaves 100x room yet catches any wrong expert, weight or row (>= 1e-2).
static void check_case(int dtype, int32_t n_exp, int32_t k, bool renorm, float router_std) {
    static const int64_t ms[] = {1, 3, 17, 64};
    pg_backend *b = backend(2, PG_MATMUL_EXACT);
    moe_layer l;
    layer_make(b, &l, dtype, n_exp, router_std);
    double worst = 0;
    for (size_t c = 0; c < sizeof ms / sizeof ms[0]; c++) {
        const int64_t m = ms[c], ldo = HIDDEN + 5;
        float *x = rnd_rows(m), *base = rnd_rows(m);
        double *ref = malloc(sizeof(double) * (size_t)(m * HIDDEN));
        ref_moe(&l, x, m, k, renorm, ref);
        double scale = 1e-30;
        for (int64_t q = 0; q < m * HIDDEN; q++) scale = fabs(ref[q]) > scale ? fabs(ref[q]) : scale;
        float *out = malloc(sizeof(float) * (size_t)(m * ldo));
        for (int mode = 0; mode < 3; mode++) { // 0: set, 1: accumulate, 2: accumulate in place
            float *xin = x;
            if (mode == 2) {
                xin = malloc(sizeof(float) * (size_t)(m * HIDDEN));
                memcpy(xin, x, sizeof(float) * (size_t)(m * HIDDEN));
                run_moe(b, &l, xin, HIDDEN, xin, m, k, renorm, true);
            } else {
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < ldo; j++) out[i * ldo + j] = j < HIDDEN ? base[i * HIDDEN + j] : -7.0f;
                run_moe(b, &l, out, ldo, x, m, k, renorm, mode == 1);
            }
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < HIDDEN; j++) {
                    const double got = mode == 2 ? xin[i * HIDDEN + j] : out[i * ldo + j];
                    const double init = mode == 0 ? 0.0 : mode == 1 ? base[i * HIDDEN + j] : x[i * HIDDEN + j];
                    const double err = fabs(got - init - ref[i * HIDDEN + j]) / scale;
                    worst = err > worst ? err : worst;
                }
            if (mode != 2)
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = HIDDEN; j < ldo; j++) assert_true(out[i * ldo + j] == -7.0f);
            if (xin != x) free(xin);
        }
        free(x), free(base), free(ref), free(out);
    }
    printf("moe %s, %d experts, top %d, renorm %d%s: worst error %.2e of the largest output\n", dtype_name(dtype),
           n_exp, k, renorm, router_std == 0 ? " (all tied)" : "", worst);
    assert_true(worst < 1e-4);
    layer_free(b, &l);
    b->dev->destroy(b);
}

static void test_mixtral_shape_matches_reference(void **state) {
    (void)state;
    check_case(PG_DTYPE_F32, 8, 2, true, 0.15f);
    check_case(PG_DTYPE_BF16, 8, 2, true, 0.15f);
    check_case(PG_DTYPE_Q8_0, 8, 2, true, 0.15f);
}

static void test_qwen3_shape_matches_reference(void **state) {
    (void)state;
    // 128 experts, 8 a row: one row leaves 120 experts without rows.
    check_case(PG_DTYPE_BF16, 128, 8, true, 0.15f);
    check_case(PG_DTYPE_BF16, 128, 8, false, 0.15f);
    check_case(PG_DTYPE_F32, 128, 8, false, 0.15f);
    check_case(PG_DTYPE_Q8_0, 128, 8, true, 0.15f);
}

// A zero router ties every expert: each row takes experts 0..k-1 (the
// lower ids), so all rows land on the same few experts and the other 120
// (or 6) get none.
static void test_ties_go_to_lower_ids(void **state) {
    (void)state;
    check_case(PG_DTYPE_BF16, 8, 2, true, 0.0f);
    check_case(PG_DTYPE_BF16, 128, 8, false, 0.0f);
}

// The same bits for 1 and 2 threads, in both numerics: the products are
// split over weight rows and every row sums its experts in id order.
static void test_same_bits_for_1_and_2_threads(void **state) {
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        const pg_matmul_mode mm = mode ? PG_MATMUL_QUANT_ACT : PG_MATMUL_EXACT;
        pg_backend *b1 = backend(1, mm), *b2 = backend(2, mm);
        moe_layer l;
        layer_make(b1, &l, PG_DTYPE_Q8_0, 128, 0.15f); // CPU weights are borrowed: b2 can run them too
        const int64_t m = 64;
        float *x = rnd_rows(m), *o1 = malloc(sizeof(float) * m * HIDDEN), *o2 = malloc(sizeof(float) * m * HIDDEN);
        run_moe(b1, &l, o1, HIDDEN, x, m, 8, true, false);
        run_moe(b2, &l, o2, HIDDEN, x, m, 8, true, false);
        assert_memory_equal(o1, o2, sizeof(float) * m * HIDDEN);
        free(x), free(o1), free(o2);
        layer_free(b1, &l);
        b1->dev->destroy(b1);
        b2->dev->destroy(b2);
    }
}

// Expert parallelism: each part of a partition of the experts runs with
// the others' weights NULL (as a rank holding only its experts does), and
// the parts' outputs, summed in f32 (as the all-reduce does), give the
// output with every expert. Routing is the same in every part, so the
// only difference is the order of a row's <= top_k weighted terms: the
// sum regrouped, k - 1 extra f32 roundings of values no larger than the
// largest output, k * 2^-24 = 4.8e-7 of it for top 8; bound 1e-6. Parts:
// contiguous ranges of 2 and 4 ranks (--enable-expert-parallel's split),
// a strided one (e % 3), and one part that holds no expert at all.
static double partition_error(pg_backend *b, const moe_layer *l, const float *x, int64_t m, int32_t k,
                              int n_parts, int (*part_of)(int32_t e, int32_t n_exp, int n_parts)) {
    float *full = malloc(sizeof(float) * (size_t)(m * HIDDEN)), *sum = calloc((size_t)(m * HIDDEN), sizeof(float));
    float *part = malloc(sizeof(float) * (size_t)(m * HIDDEN));
    run_moe(b, l, full, HIDDEN, x, m, k, true, false);
    moe_layer masked = *l;
    masked.b_gu = calloc((size_t)l->n_exp, sizeof(pg_bweight *));
    masked.b_down = calloc((size_t)l->n_exp, sizeof(pg_bweight *));
    for (int p = 0; p < n_parts; p++) {
        for (int32_t e = 0; e < l->n_exp; e++) {
            const bool mine = part_of(e, l->n_exp, n_parts) == p;
            masked.b_gu[e] = mine ? l->b_gu[e] : NULL;
            masked.b_down[e] = mine ? l->b_down[e] : NULL;
        }
        run_moe(b, &masked, part, HIDDEN, x, m, k, true, false);
        for (int64_t q = 0; q < m * HIDDEN; q++) sum[q] += part[q];
    }
    double scale = 1e-30, worst = 0;
    for (int64_t q = 0; q < m * HIDDEN; q++) scale = fabs(full[q]) > scale ? fabs(full[q]) : scale;
    for (int64_t q = 0; q < m * HIDDEN; q++) worst = fmax(worst, fabs((double)sum[q] - full[q]) / scale);
    free(masked.b_gu), free(masked.b_down), free(full), free(sum), free(part);
    return worst;
}

static int part_range(int32_t e, int32_t n_exp, int n_parts) { return e / (n_exp / n_parts); }
static int part_stride3(int32_t e, int32_t n_exp, int n_parts) { (void)n_exp, (void)n_parts; return e % 3; }
// Part 0 holds every expert, part 1 none: a rank without experts adds zeros.
static int part_all_or_none(int32_t e, int32_t n_exp, int n_parts) { (void)e, (void)n_exp, (void)n_parts; return 0; }

static void test_expert_partitions_sum_to_the_whole(void **state) {
    (void)state;
    pg_backend *b = backend(2, PG_MATMUL_EXACT);
    static const int32_t n_exps[] = {8, 128}, ks[] = {2, 8};
    for (int c = 0; c < 2; c++) {
        moe_layer l;
        layer_make(b, &l, PG_DTYPE_BF16, n_exps[c], 0.15f);
        const int64_t m = 17;
        float *x = rnd_rows(m);
        const double e2 = partition_error(b, &l, x, m, ks[c], 2, part_range);
        const double e4 = partition_error(b, &l, x, m, ks[c], 4, part_range);
        const double e3 = partition_error(b, &l, x, m, ks[c], 3, part_stride3);
        const double e0 = partition_error(b, &l, x, m, ks[c], 2, part_all_or_none);
        printf("moe %d experts, top %d: parts of 2 / 4 ranks, e %% 3, all-or-none sum to the whole within "
               "%.1e / %.1e / %.1e / %.1e of the largest output\n", n_exps[c], ks[c], e2, e4, e3, e0);
        assert_true(e2 < 1e-6 && e4 < 1e-6 && e3 < 1e-6);
        assert_true(e0 == 0.0); // the empty part adds exact zeros
        free(x);
        layer_free(b, &l);
    }
    b->dev->destroy(b);
}

// A workspace too small for the rows and a top_k above n_experts are refused.
static void test_bad_arguments_are_refused(void **state) {
    (void)state;
    pg_backend *b = backend(1, PG_MATMUL_EXACT);
    moe_layer l;
    layer_make(b, &l, PG_DTYPE_F32, 8, 0.15f);
    const int64_t m = 4;
    float *x = rnd_rows(m), out[4 * HIDDEN];
    const size_t small = b->ops->moe_workspace_bytes(b, 2, HIDDEN, FFN, 8, 2);
    void *ws = malloc(small);
    pg_tensor to = {.data = out, .dtype = PG_DTYPE_F32, .rows = m, .cols = HIDDEN, .stride = HIDDEN};
    pg_tensor tx = {.data = x, .dtype = PG_DTYPE_F32, .rows = m, .cols = HIDDEN, .stride = HIDDEN};
    const pg_bweight *const *gu = (const pg_bweight *const *)l.b_gu, *const *dn = (const pg_bweight *const *)l.b_down;
    assert_true(b->ops->moe_ffn(b, to, tx, l.b_norm, EPS, l.b_router, gu, dn, 8, 2, true, false, ws, small) < 0);
    assert_true(b->ops->moe_ffn(b, to, tx, l.b_norm, EPS, l.b_router, gu, dn, 8, 9, true, false, ws, small) < 0);
    free(ws), free(x);
    layer_free(b, &l);
    b->dev->destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixtral_shape_matches_reference),
        cmocka_unit_test(test_qwen3_shape_matches_reference),
        cmocka_unit_test(test_ties_go_to_lower_ids),
        cmocka_unit_test(test_same_bits_for_1_and_2_threads),
        cmocka_unit_test(test_expert_partitions_sum_to_the_whole),
        cmocka_unit_test(test_bad_arguments_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
