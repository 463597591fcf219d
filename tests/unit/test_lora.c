// tests/unit/test_lora.c - the CPU backend's batched multi-adapter LoRA
// (kernels/backend.h lora_apply, kernels/cpu/lora.c) against a naive
// reference written here: per row, the slot's (x . A^T) . B^T in double
// over the weights' dequantized values, times the slot's scale. Five slots:
// ranks 4, 8 and 16, one whose adapter leaves the projection alone (A
// NULL) and one no row names; rows mixing them with -1; every row count
// 1..64; an output that is a column slice of a wider fused row (and
// strided inputs); f32 and bf16 weights; the same bits for 1 and 2 threads;
// bad arguments refused.
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

#define N_SLOTS 5 // ranks 4, 8, 16; slot 3 has no A; slot 4 gets no rows
#define MAX_ROWS 64

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

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

// One matrix as stored (f32 or bf16) and as it dequantizes (deq), uploaded.
typedef struct {
    pg_weight w;
    void *data;
    float *deq; // [rows][cols]
    pg_bweight *bw;
} test_mat;

static test_mat make_mat(pg_backend *b, int dtype, int64_t rows, int64_t cols, float std) {
    test_mat t;
    const size_t rb = pg_dtype_row_bytes(dtype, cols);
    t.data = malloc(rb * (size_t)rows);
    t.deq = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t q = 0; q < rows * cols; q++) {
        const float v = std * rnd_normal();
        if (dtype == PG_DTYPE_F32) {
            ((float *)t.data)[q] = v;
        } else {
            assert_int_equal(dtype, PG_DTYPE_BF16);
            ((uint16_t *)t.data)[q] = pg_f32_to_bf16(v);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        pg_dequantize_row(dtype, (uint8_t *)t.data + (size_t)r * rb, t.deq + r * cols, cols);
    t.w = (pg_weight){.data = t.data, .dtype = dtype, .rows = rows, .cols = cols, .row_bytes = rb};
    assert_int_equal(b->store->weight_upload(b, &t.w, 1, &t.bw), 0);
    return t;
}

static void free_mat(pg_backend *b, test_mat *t) {
    b->store->weight_free(b, t->bw);
    free(t->data);
    free(t->deq);
}

// The slots of one projection in -> out: host matrices and the op's table.
typedef struct {
    int64_t in, out;
    test_mat a[N_SLOTS], bm[N_SLOTS];
    bool has[N_SLOTS];
    pg_lora_slot slots[N_SLOTS];
} lora_set;

static const int32_t RANKS[N_SLOTS] = {4, 8, 16, 8, 4};
// alpha / r, and rsLoRA's alpha / sqrt(r) for the rank-16 slot (16 / 4).
static const float SCALES[N_SLOTS] = {0.5f, 2.0f, 4.0f, 1.0f, 3.0f};

static void set_make(pg_backend *b, lora_set *s, int dtype, int64_t in, int64_t out) {
    s->in = in, s->out = out;
    for (int k = 0; k < N_SLOTS; k++) {
        s->has[k] = k != 3;
        s->slots[k] = (pg_lora_slot){.scale = SCALES[k]};
        if (!s->has[k]) continue;
        s->a[k] = make_mat(b, dtype, RANKS[k], in, 0.2f);
        s->bm[k] = make_mat(b, dtype, out, RANKS[k], 0.3f);
        s->slots[k].a = s->a[k].bw;
        s->slots[k].b = s->bm[k].bw;
    }
}

static void set_free(pg_backend *b, lora_set *s) {
    for (int k = 0; k < N_SLOTS; k++)
        if (s->has[k]) free_mat(b, &s->a[k]), free_mat(b, &s->bm[k]);
}

// Row i's slot: -1, 0, 1, 2 and 3 (no A) in a pattern that is not sorted;
// slot 4 never.
static int32_t slot_of(int64_t i) { return (int32_t)((i * 7 + 3) % 5) - 1; }

// delta[m][out] = what the op adds to each row, in double.
static void ref_lora(const lora_set *s, const float *x, int64_t ldx, const int32_t *row_slot, int64_t m,
                     double *delta) {
    double t[16];
    for (int64_t i = 0; i < m; i++) {
        double *d = delta + i * s->out;
        const int32_t k = row_slot[i];
        for (int64_t c = 0; c < s->out; c++) d[c] = 0;
        if (k < 0 || !s->has[k]) continue;
        const int32_t r = RANKS[k];
        for (int32_t q = 0; q < r; q++) {
            t[q] = 0;
            for (int64_t j = 0; j < s->in; j++) t[q] += (double)s->a[k].deq[q * s->in + j] * x[i * ldx + j];
        }
        for (int64_t c = 0; c < s->out; c++) {
            double y = 0;
            for (int32_t q = 0; q < r; q++) y += (double)s->bm[k].deq[c * r + q] * t[q];
            d[c] = SCALES[k] * y;
        }
    }
}

static pg_backend *backend(int n_threads, pg_matmul_mode mode) {
    pg_backend *b = NULL;
    assert_int_equal(pg_backend_cpu_create(n_threads, mode, &b), 0);
    assert_non_null(b->ops->lora_apply);
    assert_non_null(b->ops->lora_workspace_bytes);
    return b;
}

// Runs lora_apply over rows of x (ldx apart) into columns [c0, c0 + s->out)
// of out (ldo wide), with a workspace sized for MAX_ROWS rows of rank 16.
static int run_lora(pg_backend *b, const lora_set *s, float *out, int64_t ldo, int64_t c0, const float *x,
                    int64_t ldx, const int32_t *row_slot, int64_t m) {
    const size_t ws_bytes =
        b->ops->lora_workspace_bytes(b, MAX_ROWS, (int32_t)s->in, (int32_t)s->out, 16, N_SLOTS);
    void *ws = NULL;
    assert_int_equal(b->dev->alloc(b, ws_bytes, &ws), 0);
    pg_tensor full = {.data = out, .dtype = PG_DTYPE_F32, .rows = m, .cols = ldo, .stride = ldo};
    pg_tensor to = pg_tensor_view(full, 0, m, c0, s->out);
    pg_tensor tx = {.data = (void *)x, .dtype = PG_DTYPE_F32, .rows = m, .cols = s->in, .stride = ldx};
    const int rc = b->ops->lora_apply(b, to, tx, row_slot, s->slots, N_SLOTS, ws, ws_bytes);
    b->dev->free(b, ws);
    return rc;
}

static float *rnd_buf(int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = rnd_normal();
    return x;
}

// Every row count 1..64 into columns [c0, c0 + out) of rows ldo wide, x
// rows ldx apart. Columns outside the slice and rows without an adapter
// must keep their bits; the others must match the reference. Returns the
// worst error relative to the row count's largest added value. Only f32
// rounding separates the two (a shrink of <= 96 products rounded once to
// f32, an expand of <= 16): ~1e-7 relative, so the bound 1e-5 leaves 100x
// room yet catches a wrong slot, row, scale or transposition (>= 1e-2).
static double check_shapes(int dtype, int64_t in, int64_t out, int64_t c0, int64_t ldo, int64_t ldx) {
    pg_backend *b = backend(2, PG_MATMUL_EXACT);
    lora_set s;
    set_make(b, &s, dtype, in, out);
    double worst = 0;
    int32_t row_slot[MAX_ROWS];
    for (int64_t i = 0; i < MAX_ROWS; i++) row_slot[i] = slot_of(i);
    for (int64_t m = 1; m <= MAX_ROWS; m++) {
        float *x = rnd_buf(m * ldx), *base = rnd_buf(m * ldo), *o = malloc(sizeof(float) * (size_t)(m * ldo));
        memcpy(o, base, sizeof(float) * (size_t)(m * ldo));
        double *delta = malloc(sizeof(double) * (size_t)(m * out));
        ref_lora(&s, x, ldx, row_slot, m, delta);
        assert_int_equal(run_lora(b, &s, o, ldo, c0, x, ldx, row_slot, m), 0);
        double big = 1e-30, err = 0;
        for (int64_t q = 0; q < m * out; q++) big = fabs(delta[q]) > big ? fabs(delta[q]) : big;
        for (int64_t i = 0; i < m; i++) {
            const bool touched = row_slot[i] >= 0 && s.has[row_slot[i]];
            for (int64_t j = 0; j < ldo; j++) {
                const bool in_slice = j >= c0 && j < c0 + out;
                if (!touched || !in_slice) {
                    assert_true(o[i * ldo + j] == base[i * ldo + j]);
                    continue;
                }
                const double got = (double)o[i * ldo + j] - base[i * ldo + j];
                const double e = fabs(got - delta[i * out + j - c0]) / big;
                err = e > err ? e : err;
            }
        }
        worst = err > worst ? err : worst;
        free(x), free(base), free(o), free(delta);
    }
    set_free(b, &s);
    b->dev->destroy(b);
    printf("lora %s, %lld -> %lld (columns %lld..%lld of %lld), rows 1..64: worst error %.2e of the largest "
           "added value (bound 1e-5)\n",
           dtype == PG_DTYPE_F32 ? "f32" : "bf16", (long long)in, (long long)out, (long long)c0,
           (long long)(c0 + out), (long long)ldo, worst);
    assert_true(worst < 1e-5);
    return worst;
}

// K of a fused Q|K|V row (a slice in the middle), and down_proj's shape
// (wider in than out) over strided inputs.
static void test_matches_reference(void **state) {
    (void)state;
    check_shapes(PG_DTYPE_F32, 64, 32, 64, 128, 64);
    check_shapes(PG_DTYPE_BF16, 64, 32, 64, 128, 64);
    check_shapes(PG_DTYPE_F32, 96, 64, 0, 64, 101);
    check_shapes(PG_DTYPE_BF16, 96, 64, 0, 64, 101);
}

// The same bits for 1 and 2 threads, in both numerics.
static void test_same_bits_for_1_and_2_threads(void **state) {
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        const pg_matmul_mode mm = mode ? PG_MATMUL_QUANT_ACT : PG_MATMUL_EXACT;
        pg_backend *b1 = backend(1, mm), *b2 = backend(2, mm);
        lora_set s;
        set_make(b1, &s, PG_DTYPE_BF16, 128, 96); // CPU weights are borrowed: b2 can run them too
        int32_t row_slot[MAX_ROWS];
        for (int64_t i = 0; i < MAX_ROWS; i++) row_slot[i] = slot_of(i * 3);
        const int64_t m = MAX_ROWS, n = m * 96;
        float *x = rnd_buf(m * 128), *o1 = rnd_buf(n), *o2 = malloc(sizeof(float) * (size_t)n);
        memcpy(o2, o1, sizeof(float) * (size_t)n);
        assert_int_equal(run_lora(b1, &s, o1, 96, 0, x, 128, row_slot, m), 0);
        assert_int_equal(run_lora(b2, &s, o2, 96, 0, x, 128, row_slot, m), 0);
        assert_memory_equal(o1, o2, sizeof(float) * (size_t)n);
        free(x), free(o1), free(o2);
        set_free(b1, &s);
        b1->dev->destroy(b1);
        b2->dev->destroy(b2);
    }
}

// Rows that all say -1 (or name the slot without A) change nothing and
// need no workspace.
static void test_no_adapter_rows_are_untouched(void **state) {
    (void)state;
    pg_backend *b = backend(2, PG_MATMUL_EXACT);
    lora_set s;
    set_make(b, &s, PG_DTYPE_F32, 64, 32);
    const int32_t row_slot[4] = {-1, 3, -1, 3};
    float *x = rnd_buf(4 * 64), *o = rnd_buf(4 * 32), keep[4 * 32];
    memcpy(keep, o, sizeof keep);
    pg_tensor to = {.data = o, .dtype = PG_DTYPE_F32, .rows = 4, .cols = 32, .stride = 32};
    pg_tensor tx = {.data = x, .dtype = PG_DTYPE_F32, .rows = 4, .cols = 64, .stride = 64};
    assert_int_equal(b->ops->lora_apply(b, to, tx, row_slot, s.slots, N_SLOTS, NULL, 0), 0);
    assert_memory_equal(o, keep, sizeof keep);
    free(x), free(o);
    set_free(b, &s);
    b->dev->destroy(b);
}

// A slot out of range, a B of the wrong shape and a small workspace are refused.
static void test_bad_arguments_are_refused(void **state) {
    (void)state;
    pg_backend *b = backend(1, PG_MATMUL_EXACT);
    lora_set s;
    set_make(b, &s, PG_DTYPE_F32, 64, 32);
    int32_t row_slot[4] = {0, 1, 2, N_SLOTS};
    float *x = rnd_buf(4 * 64), o[4 * 32];
    const size_t small = b->ops->lora_workspace_bytes(b, 2, 64, 32, 16, N_SLOTS);
    void *ws = malloc(small);
    pg_tensor to = {.data = o, .dtype = PG_DTYPE_F32, .rows = 4, .cols = 32, .stride = 32};
    pg_tensor tx = {.data = x, .dtype = PG_DTYPE_F32, .rows = 4, .cols = 64, .stride = 64};
    assert_true(b->ops->lora_apply(b, to, tx, row_slot, s.slots, N_SLOTS, ws, small) < 0);
    row_slot[3] = 0;
    assert_true(b->ops->lora_apply(b, to, tx, row_slot, s.slots, N_SLOTS, ws, small) < 0); // 4 rows > 2
    pg_lora_slot bad[N_SLOTS];
    memcpy(bad, s.slots, sizeof bad);
    bad[1].b = s.bm[0].bw; // rank 4's B under rank 8's A
    const size_t big = b->ops->lora_workspace_bytes(b, 4, 64, 32, 16, N_SLOTS);
    void *ws2 = malloc(big);
    assert_true(b->ops->lora_apply(b, to, tx, row_slot, bad, N_SLOTS, ws2, big) < 0);
    assert_int_equal(b->ops->lora_apply(b, to, tx, row_slot, s.slots, N_SLOTS, ws2, big), 0);
    free(ws), free(ws2), free(x);
    set_free(b, &s);
    b->dev->destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_same_bits_for_1_and_2_threads),
        cmocka_unit_test(test_no_adapter_rows_are_untouched),
        cmocka_unit_test(test_bad_arguments_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
