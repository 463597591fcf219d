// tests/unit/test_cpu_matmul.c - the CPU matmul in both numerical modes
// against plain references written here:
//  (a) exact mode vs a double-precision dequantize-then-dot reference;
//  (b) quantized-activation mode vs a scalar implementation of llama.cpp's
//      arithmetic (8-bit activation blocks, integer block dots);
//  (c) quantized vs exact, as a sanity bound on the quantization error;
// plus the properties the kernels promise: the activation quantizer's exact
// bits, results independent of threads and of how rows are tiled, and the
// output stride.
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
#include "kernels/dtype.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/cpu_backend.h"

// --- random data ---------------------------------------------------------------------

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rnd_uniform(void) {
    return ((float)rnd_u32() + 0.5f) / 4294967296.0f;
}

static float rnd_normal(void) {
    float u = rnd_uniform(), v = rnd_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

// Activations like a transformer's: normal, with a few large outliers so
// that block scales differ a lot.
static float *rnd_x(int64_t m, int64_t cols) {
    float *x = malloc(sizeof(float) * (size_t)(m * cols));
    for (int64_t i = 0; i < m * cols; i++) {
        x[i] = rnd_normal();
        if (rnd_u32() % 97 == 0) x[i] *= 20.0f;
    }
    return x;
}

// --- a small weight quantizer (formats of kernels/dtype.h) ---------------------------------

static void put16(uint8_t *p, uint16_t v) {
    memcpy(p, &v, 2);
}

// One Q5_0 or Q5_1 block of x[32] at dst, GGML's reference rules: Q5_0
// d = (the value of largest magnitude) / -16, n = x / d + 16.5 truncated;
// Q5_1 d = (max - min) / 31, n = (x - min) / d + 0.5 truncated; n at most
// 31. Returns the block's size.
static size_t quantize_q5_block(int dtype, const float *x, uint8_t *dst) {
    const bool affine = dtype == PG_DTYPE_Q5_1;
    float d, id, mn = 0;
    if (affine) {
        float mx = x[0];
        mn = x[0];
        for (int j = 1; j < 32; j++) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
        d = (mx - mn) / 31;
    } else {
        float amax = 0, mx = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), mx = x[j];
        d = mx / -16;
    }
    id = d ? 1 / d : 0;
    put16(dst, pg_f32_to_f16(d));
    if (affine) put16(dst + 2, pg_f32_to_f16(mn));
    uint8_t *qh = dst + (affine ? 4 : 2), *qs = qh + 4;
    uint32_t bits = 0;
    for (int j = 0; j < 32; j++) {
        int n = affine ? (int)((x[j] - mn) * id + 0.5f) : (int)(x[j] * id + 16.5f);
        n = n > 31 ? 31 : n;
        if (j < 16)
            qs[j] = (uint8_t)(n & 15);
        else
            qs[j - 16] |= (uint8_t)((n & 15) << 4);
        bits |= (uint32_t)(n >> 4) << j;
    }
    memcpy(qh, &bits, 4);
    return affine ? 24 : 22;
}

// One row of `cols` values into `dtype` blocks at `dst`. The quantized
// types round to nearest like GGML's reference quantizers (the exact
// choice does not matter: the tests dequantize what was written). The
// K-quants get random code bytes under small random fp16 scales: every bit
// pattern is a valid block.
static void quantize_row(int dtype, const float *x, int64_t cols, uint8_t *dst) {
    switch (dtype) {
    case PG_DTYPE_F32:
        memcpy(dst, x, sizeof(float) * (size_t)cols);
        return;
    case PG_DTYPE_F16:
        for (int64_t j = 0; j < cols; j++) put16(dst + 2 * j, pg_f32_to_f16(x[j]));
        return;
    case PG_DTYPE_BF16:
        for (int64_t j = 0; j < cols; j++) put16(dst + 2 * j, pg_f32_to_bf16(x[j]));
        return;
    case PG_DTYPE_Q8_0:
        for (int64_t b = 0; b < cols / 32; b++, x += 32, dst += 34) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
            float d = amax / 127, id = d ? 1 / d : 0;
            put16(dst, pg_f32_to_f16(d));
            for (int j = 0; j < 32; j++) dst[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        }
        return;
    case PG_DTYPE_Q4_0:
        for (int64_t b = 0; b < cols / 32; b++, x += 32, dst += 18) {
            float amax = 0, mx = 0;
            for (int j = 0; j < 32; j++)
                if (fabsf(x[j]) > amax) amax = fabsf(x[j]), mx = x[j];
            float d = mx / -8, id = d ? 1 / d : 0;
            put16(dst, pg_f32_to_f16(d));
            for (int j = 0; j < 16; j++) {
                int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + 16] * id + 8.5f);
                lo = lo > 15 ? 15 : lo;
                hi = hi > 15 ? 15 : hi;
                dst[2 + j] = (uint8_t)(lo | hi << 4);
            }
        }
        return;
    case PG_DTYPE_Q4_1:
        for (int64_t b = 0; b < cols / 32; b++, x += 32, dst += 20) {
            float mn = x[0], mx = x[0];
            for (int j = 1; j < 32; j++) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
            float d = (mx - mn) / 15, id = d ? 1 / d : 0;
            put16(dst, pg_f32_to_f16(d));
            put16(dst + 2, pg_f32_to_f16(mn));
            for (int j = 0; j < 16; j++) {
                int lo = (int)((x[j] - mn) * id + 0.5f), hi = (int)((x[j + 16] - mn) * id + 0.5f);
                lo = lo > 15 ? 15 : lo;
                hi = hi > 15 ? 15 : hi;
                dst[4 + j] = (uint8_t)(lo | hi << 4);
            }
        }
        return;
    case PG_DTYPE_Q5_0:
    case PG_DTYPE_Q5_1:
        for (int64_t b = 0; b < cols / 32; b++, x += 32) dst += quantize_q5_block(dtype, x, dst);
        return;
    case PG_DTYPE_Q4_K:
    case PG_DTYPE_Q5_K:
    case PG_DTYPE_Q6_K: {
        size_t bb = pg_dtype_block_bytes(dtype);
        for (int64_t b = 0; b < cols / 256; b++, dst += bb) {
            for (size_t k = 0; k < bb; k++) dst[k] = (uint8_t)rnd_u32();
            uint16_t d = pg_f32_to_f16(0.002f + 0.004f * rnd_uniform());
            if (dtype == PG_DTYPE_Q6_K) {
                put16(dst + bb - 2, d);
            } else {
                put16(dst, d);
                put16(dst + 2, pg_f32_to_f16(0.002f + 0.004f * rnd_uniform()));
            }
        }
        return;
    }
    default:
        fail_msg("no test quantizer for %s", pg_dtype_name(dtype));
    }
}

typedef struct {
    pg_weight w;
    uint8_t *mem;
    float *deq; // [rows][cols] what the weights dequantize to
} test_weight;

static test_weight make_weight(int dtype, int64_t rows, int64_t cols) {
    test_weight t;
    size_t rb = pg_dtype_row_bytes(dtype, cols);
    assert_true(rb > 0);
    t.mem = malloc(rb * (size_t)rows + 1);
    t.deq = malloc(sizeof(float) * (size_t)(rows * cols));
    // Rows of packed blocks start at odd addresses in real files (Q4_0 is
    // 18 bytes a block): store them one byte off alignment.
    uint8_t *data = t.mem + 1;
    float *src = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        float scale = 0.02f * (1.0f + (float)(r % 7));
        for (int64_t j = 0; j < cols; j++) src[j] = scale * rnd_normal();
        quantize_row(dtype, src, cols, data + (size_t)r * rb);
        pg_dequantize_row(dtype, data + (size_t)r * rb, t.deq + r * cols, cols);
    }
    free(src);
    t.w = (pg_weight){.data = data, .dtype = dtype, .rows = rows, .cols = cols, .row_bytes = rb};
    return t;
}

static void free_weight(test_weight *t) {
    free(t->mem);
    free(t->deq);
}

// --- references ------------------------------------------------------------------------

// out[i][r] = sum_j deq[r][j] * x[i][j] in double.
static double *ref_exact(const test_weight *t, const float *x, int64_t m) {
    const int64_t rows = t->w.rows, cols = t->w.cols;
    double *out = malloc(sizeof(double) * (size_t)(m * rows));
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t j = 0; j < cols; j++) s += (double)t->deq[r * cols + j] * x[i * cols + j];
            out[i * rows + r] = s;
        }
    return out;
}

static float f16_round(float f) {
    return pg_f16_to_f32(pg_f32_to_f16(f));
}

// llama.cpp's activation block (AVX2 quantize_row_q8_0 / q8_1): d = amax/127,
// q = x * (127/amax) rounded half to even, d and d*sum(q) stored as fp16.
static void ref_quantize_block(const float *x, int8_t *q, float *d, float *s) {
    float amax = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
    float dd = amax / 127.0f;
    float id = amax != 0 ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        float v = x[j] * id;
        float fl = floorf(v), diff = v - fl;
        int n = (int)fl;
        if (diff > 0.5f || (diff == 0.5f && (n & 1))) n++; // half to even
        q[j] = (int8_t)n;
        sum += n;
    }
    *d = f16_round(dd);
    *s = f16_round(dd * (float)sum);
}

static float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return pg_f16_to_f32(h);
}

// Weight block b of row `w` as integers n[32] with scale *dw and (Q4_1,
// Q5_1) min *mw: the block's values are dw * n + mw.
static void ref_weight_block(int dtype, const uint8_t *w, int64_t b, int n[32], float *dw,
                             float *mw) {
    *mw = 0;
    if (dtype == PG_DTYPE_Q5_0 || dtype == PG_DTYPE_Q5_1) {
        // {d; (Q5_1) m; qh[4]; qs[16]}: bit j of qh is bit 4 of element j.
        const bool affine = dtype == PG_DTYPE_Q5_1;
        const uint8_t *blk = w + b * (affine ? 24 : 22), *qh = blk + (affine ? 4 : 2);
        const uint8_t *qs = qh + 4;
        *dw = rd_f16(blk);
        if (affine) *mw = rd_f16(blk + 2);
        for (int j = 0; j < 32; j++) {
            int lo = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4), hi = (qh[j / 8] >> (j % 8)) & 1;
            n[j] = (lo | hi << 4) - (affine ? 0 : 16);
        }
        return;
    }
    if (dtype == PG_DTYPE_Q8_0) {
        const uint8_t *blk = w + b * 34;
        *dw = rd_f16(blk);
        for (int j = 0; j < 32; j++) n[j] = (int8_t)blk[2 + j];
        return;
    }
    const uint8_t *blk = w + b * (dtype == PG_DTYPE_Q4_1 ? 20 : 18);
    const uint8_t *qs = blk + (dtype == PG_DTYPE_Q4_1 ? 4 : 2);
    int off = dtype == PG_DTYPE_Q4_1 ? 0 : 8;
    *dw = rd_f16(blk);
    if (dtype == PG_DTYPE_Q4_1) *mw = rd_f16(blk + 2);
    for (int j = 0; j < 16; j++) {
        n[j] = (qs[j] & 15) - off;
        n[j + 16] = (qs[j] >> 4) - off;
    }
}

// llama.cpp's quantized-activation product, plainly: per block the integer
// dot, times the f32 product of the two scales, plus (Q4_1, Q5_1) the weight
// minimum times the activation block's stored sum; accumulated in double.
static double *ref_quant(const test_weight *t, const float *x, int64_t m) {
    const int64_t rows = t->w.rows, cols = t->w.cols, nb = cols / 32;
    double *out = malloc(sizeof(double) * (size_t)(m * rows));
    int8_t q[32];
    float dx, sx, dw, mw;
    int n[32];
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0;
            const uint8_t *wr = (const uint8_t *)t->w.data + (size_t)r * t->w.row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                ref_quantize_block(x + i * cols + b * 32, q, &dx, &sx);
                ref_weight_block(t->w.dtype, wr, b, n, &dw, &mw);
                int sumi = 0;
                for (int j = 0; j < 32; j++) sumi += n[j] * q[j];
                float scale = dw * dx;
                acc += (double)scale * sumi + (double)mw * sx;
            }
            out[i * rows + r] = acc;
        }
    return out;
}

// llama.cpp's Q8_K activation block (ggml's quantize_row_q8_K_ref): the
// element of largest |x| (first on ties) is `mx`, iscale = -127/mx,
// q = min(127, round_half_even(iscale * x)), d = 1/iscale, bsums per 16.
static void ref_q8k_block(const float *x, int8_t q[256], float *d, int16_t bsums[16]) {
    float amax = 0, mx = 0;
    for (int j = 0; j < 256; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), mx = x[j];
    memset(bsums, 0, 16 * sizeof(int16_t));
    if (amax == 0) {
        memset(q, 0, 256);
        *d = 0;
        return;
    }
    float iscale = -127.0f / mx;
    for (int j = 0; j < 256; j++) {
        float v = iscale * x[j];
        float fl = floorf(v), diff = v - fl;
        int n = (int)fl;
        if (diff > 0.5f || (diff == 0.5f && (n & 1))) n++; // half to even
        q[j] = (int8_t)(n < 127 ? n : 127);
        bsums[j / 16] = (int16_t)(bsums[j / 16] + q[j]);
    }
    *d = 1 / iscale;
}

// K-quant weight block as integers and per-element scale/offset: element e
// is dsc[e] * n[e] - dmn[e] (ggml's dequantize_row_q4_K / q5_K / q6_K,
// spelled out).
static void ref_kquant_block(int dtype, const uint8_t *blk, int n[256], float dsc[256],
                             float dmn[256]) {
    if (dtype == PG_DTYPE_Q4_K || dtype == PG_DTYPE_Q5_K) {
        // {d; dmin; scales[12]; (Q5_K: qh[32];) qs[128]}: 8 sub-blocks of 32
        // with 6-bit scale and min; 64 elements per 32 bytes (low nibbles,
        // then high); Q5_K adds 16 when bit (e / 32) of qh[e % 32] is set.
        const bool q5 = dtype == PG_DTYPE_Q5_K;
        const float d = rd_f16(blk), dmin = rd_f16(blk + 2);
        const uint8_t *sc = blk + 4, *qh = blk + 16, *qs = blk + (q5 ? 48 : 16);
        for (int e = 0; e < 256; e++) {
            int s = e / 32, scale, mn;
            if (s < 4) {
                scale = sc[s] & 63;
                mn = sc[s + 4] & 63;
            } else {
                scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
                mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
            }
            uint8_t byte = qs[32 * (e / 64) + e % 32];
            n[e] = (e % 64) < 32 ? byte & 15 : byte >> 4;
            if (q5 && (qh[e % 32] >> (e / 32) & 1)) n[e] += 16;
            dsc[e] = d * (float)scale;
            dmn[e] = dmin * (float)mn;
        }
        return;
    }
    // Q6_K {ql[128]; qh[64]; scales[16] (int8); d}: 16 sub-blocks of 16;
    // per 128 elements, 4 quarters of 32: ql low nibbles of bytes 0..31,
    // of 32..63, high nibbles of 0..31, of 32..63; 2 bits each from qh.
    const float d = rd_f16(blk + 208);
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, quarter = (e % 128) / 32, b = e % 32;
        uint8_t lo = ql[64 * h + 32 * (quarter % 2) + b];
        int nib = quarter < 2 ? lo & 15 : lo >> 4;
        int hi = (qh[32 * h + b] >> (2 * quarter)) & 3;
        n[e] = (nib | hi << 4) - 32;
        dsc[e] = d * (float)sc[e / 16];
        dmn[e] = 0;
    }
}

// llama.cpp's K-quant x Q8_K product, plainly: the activations quantized to
// Q8_K, then sum over elements of (weight scale * n - weight min) * q * d_x,
// in double.
static double *ref_kquant(const test_weight *t, const float *x, int64_t m) {
    const int64_t rows = t->w.rows, cols = t->w.cols, nb = cols / 256;
    const size_t bb = pg_dtype_block_bytes(t->w.dtype);
    double *out = malloc(sizeof(double) * (size_t)(m * rows));
    int8_t q[256];
    int16_t bs[16];
    int n[256];
    float dx, dsc[256], dmn[256];
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0;
            const uint8_t *wr = (const uint8_t *)t->w.data + (size_t)r * t->w.row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                ref_q8k_block(x + i * cols + b * 256, q, &dx, bs);
                ref_kquant_block(t->w.dtype, wr + b * bb, n, dsc, dmn);
                double blk = 0;
                for (int e = 0; e < 256; e++)
                    blk += ((double)dsc[e] * n[e] - (double)dmn[e]) * q[e];
                acc += blk * dx;
            }
            out[i * rows + r] = acc;
        }
    return out;
}

// ||got - ref|| / ||ref|| over the m x rows result (got rows `ldo` apart).
static double rel_err(const float *got, int64_t ldo, const double *ref, int64_t m, int64_t rows) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < rows; r++) {
            double d = got[i * ldo + r] - ref[i * rows + r];
            num += d * d;
            den += ref[i * rows + r] * ref[i * rows + r];
        }
    return sqrt(num / (den > 0 ? den : 1));
}

// --- harness ---------------------------------------------------------------------------

static const int64_t test_ms[] = {1, 3, 8, 9, 17, 64};
#define N_MS (sizeof test_ms / sizeof test_ms[0])

static pg_backend *backend(int n_threads, pg_matmul_mode mode) {
    pg_backend *b = NULL;
    assert_int_equal(pg_backend_cpu_create(n_threads, mode, &b), 0);
    return b;
}

// Runs the matmul into an output with a wider stride than the weight's
// rows, and checks that the columns beyond stay untouched.
static float *run_matmul(pg_backend *b, const test_weight *t, const float *x, int64_t m,
                         int64_t *ldo) {
    *ldo = t->w.rows + 5;
    float *out = malloc(sizeof(float) * (size_t)(m * *ldo));
    for (int64_t k = 0; k < m * *ldo; k++) out[k] = -12345.0f;
    pg_cpu_matmul(pg_cpu(b), out, *ldo, x, m, &t->w);
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = t->w.rows; r < *ldo; r++) assert_true(out[i * *ldo + r] == -12345.0f);
    return out;
}

typedef struct {
    int64_t rows, cols;
} shape;

static void check_dtype(int dtype, const shape *shapes, int n_shapes) {
    pg_backend *exact = backend(2, PG_MATMUL_EXACT);
    pg_backend *quant = backend(2, PG_MATMUL_QUANT_ACT);
    const bool has_kquant = pg_kdot_supported(dtype);
    const bool has_quant = pg_qdot_supported(dtype) || has_kquant;
    for (int s = 0; s < n_shapes; s++) {
        test_weight t = make_weight(dtype, shapes[s].rows, shapes[s].cols);
        for (size_t k = 0; k < N_MS; k++) {
            const int64_t m = test_ms[k], rows = t.w.rows;
            float *x = rnd_x(m, t.w.cols);
            int64_t ldo;
            double *ref = ref_exact(&t, x, m);
            float *got = run_matmul(exact, &t, x, m, &ldo);
            double e = rel_err(got, ldo, ref, m, rows);
            if (getenv("PG_TEST_VERBOSE"))
                printf("  %-5s %5lldx%-5lld m=%-3lld exact %.2e", pg_dtype_name(dtype),
                       (long long)rows, (long long)t.w.cols, (long long)m, e);
            if (e >= 1e-5)
                fail_msg("%s %lldx%lld m=%lld: exact rel err %g", pg_dtype_name(dtype),
                         (long long)rows, (long long)t.w.cols, (long long)m, e);
            if (has_quant) {
                double *qref = has_kquant ? ref_kquant(&t, x, m) : ref_quant(&t, x, m);
                float *qgot = run_matmul(quant, &t, x, m, &ldo);
                double eq = rel_err(qgot, ldo, qref, m, rows);
                double ex = rel_err(qgot, ldo, ref, m, rows);
                if (getenv("PG_TEST_VERBOSE")) printf("  quant %.2e  quant-vs-exact %.2e", eq, ex);
                if (eq >= 1e-6)
                    fail_msg("%s %lldx%lld m=%lld: quantized rel err %g", pg_dtype_name(dtype),
                             (long long)rows, (long long)t.w.cols, (long long)m, eq);
                // Q8_K's 256-element blocks share one scale among 8x the
                // elements of Q8_0's: outliers cost more resolution.
                if (ex >= (has_kquant ? 5e-2 : 2e-2))
                    fail_msg("%s %lldx%lld m=%lld: quantized vs exact %g", pg_dtype_name(dtype),
                             (long long)rows, (long long)t.w.cols, (long long)m, ex);
                free(qref);
                free(qgot);
            } else {
                // Without a kernel the quantized mode falls back to exact.
                float *qgot = run_matmul(quant, &t, x, m, &ldo);
                assert_memory_equal(qgot, got, sizeof(float) * (size_t)(m * ldo));
                free(qgot);
            }
            if (getenv("PG_TEST_VERBOSE")) printf("\n");
            free(ref);
            free(got);
            free(x);
        }
        free_weight(&t);
    }
    exact->dev->destroy(exact);
    quant->dev->destroy(quant);
}

// Rows not a multiple of the tile height (4) and of the task size, and
// column counts from one block up.
static const shape shapes_32[] = {{37, 96}, {64, 576}, {130, 32}, {16, 1536}};
// Q4_K: 40 rows takes llama.cpp's repacked (q4_K_8x8) summation order.
static const shape shapes_256k[] = {{37, 256}, {20, 768}, {40, 512}};

static void test_q4_0_both_modes_match_references(void **state) {
    check_dtype(PG_DTYPE_Q4_0, shapes_32, 4);
}
static void test_q4_1_both_modes_match_references(void **state) {
    check_dtype(PG_DTYPE_Q4_1, shapes_32, 4);
}
static void test_q5_0_both_modes_match_references(void **state) {
    check_dtype(PG_DTYPE_Q5_0, shapes_32, 4);
}
static void test_q5_1_both_modes_match_references(void **state) {
    check_dtype(PG_DTYPE_Q5_1, shapes_32, 4);
}
static void test_q8_0_both_modes_match_references(void **state) {
    check_dtype(PG_DTYPE_Q8_0, shapes_32, 4);
}
static void test_q4_k_both_modes_match_references(void **state) {
    check_dtype(PG_DTYPE_Q4_K, shapes_256k, 3);
}
static void test_q5_k_both_modes_match_references(void **state) {
    check_dtype(PG_DTYPE_Q5_K, shapes_256k, 3);
}
static void test_q6_k_both_modes_match_references(void **state) {
    check_dtype(PG_DTYPE_Q6_K, shapes_256k, 3);
}
static void test_plain_types_exact_match_reference(void **state) {
    static const shape s[] = {{37, 96}, {64, 100}};
    check_dtype(PG_DTYPE_F32, s, 2);
    check_dtype(PG_DTYPE_F16, s, 2);
    check_dtype(PG_DTYPE_BF16, s, 2);
}

// The quantizer's bits, including ties (x * 127/amax exactly k + 0.5 rounds
// to even), an all-zero block and a block of one sign.
static void test_activation_quantizer_matches_llama_cpp_rules(void **state) {
    enum { M = 5, COLS = 96 };
    float *x = rnd_x(M, COLS);
    // Row 1, block 0: amax 127, so x * 127/amax = x and halves are ties.
    for (int j = 0; j < 32; j++) x[COLS + j] = (float)(j - 16) + 0.5f;
    x[COLS + 31] = 127.0f;
    for (int j = 32; j < 64; j++) x[COLS + j] = 0.0f;             // row 1, block 1: zeros
    for (int j = 64; j < 96; j++) x[COLS + j] = 0.25f + (float)j; // row 1, block 2: positive
    void *mem = aligned_alloc(64, (pg_xq_bytes(M, COLS) + 63) / 64 * 64);
    pg_xq xq;
    pg_xq_init(&xq, mem, M, COLS);
    pg_xq_quantize(&xq, x, COLS, 0, 2);
    pg_xq_quantize(&xq, x, COLS, 2, M);
    for (int i = 0; i < M; i++)
        for (int b = 0; b < COLS / 32; b++) {
            int8_t q[32];
            float d, s;
            ref_quantize_block(x + i * COLS + b * 32, q, &d, &s);
            assert_memory_equal(xq.qs + (b * M + i) * 32, q, 32);
            assert_true(xq.d[b * M + i] == d);
            assert_true(xq.s[b * M + i] == s);
        }
    assert_int_equal(xq.qs[(0 * M + 1) * 32 + 0], -16); // -15.5 -> -16 (even)
    assert_int_equal(xq.qs[(0 * M + 1) * 32 + 1], -14); // -14.5 -> -14
    assert_int_equal(xq.qs[(0 * M + 1) * 32 + 16], 0);  // 0.5 -> 0
    assert_int_equal(xq.qs[(0 * M + 1) * 32 + 17], 2);  // 1.5 -> 2
    assert_true(xq.d[1 * M + 1] == 0.0f && xq.s[1 * M + 1] == 0.0f);
    free(mem);
    free(x);
}

// The Q8_K quantizer's bits: random rows, ties (iscale -1 makes x.5 a tie),
// a positive and a negative largest element, an all-zero block, and |x| ties
// between +max and -max (the first wins).
static void test_q8k_quantizer_matches_llama_cpp_rules(void **state) {
    enum { M = 3, COLS = 1024 };
    float *x = rnd_x(M, COLS);
    float *r1 = x + COLS;
    for (int j = 0; j < 256; j++) r1[j] = (float)(j % 64 - 32) + 0.5f; // block 0: ties
    r1[100] = 127.0f;                                                  // iscale = -1
    for (int j = 256; j < 512; j++) r1[j] = 0.0f;                      // block 1: zeros
    for (int j = 512; j < 768; j++) r1[j] = -0.1f * (float)(j - 500);  // block 2: max < 0
    r1[800] = 300.0f;  // block 3: +300 first,
    r1[900] = -300.0f; //          then -300: iscale = -127/300
    pg_q8k_block y[M * COLS / 256];
    for (int i = 0; i < M; i++) pg_q8k_quantize_row(x + i * COLS, COLS, y + i * (COLS / 256));
    for (int i = 0; i < M; i++)
        for (int b = 0; b < COLS / 256; b++) {
            int8_t q[256];
            int16_t bs[16];
            float d;
            ref_q8k_block(x + i * COLS + b * 256, q, &d, bs);
            const pg_q8k_block *g = &y[i * (COLS / 256) + b];
            assert_memory_equal(g->qs, q, 256);
            assert_memory_equal(g->bsums, bs, sizeof bs);
            assert_true(g->d == d);
        }
    const pg_q8k_block *t = &y[COLS / 256];
    assert_true(t[0].d == -1.0f);
    assert_int_equal(t[0].qs[100], -127);
    assert_int_equal(t[0].qs[0], 32);  // -31.5 * -1 = 31.5 -> 32 (even)
    assert_int_equal(t[0].qs[1], 30);  // 30.5 -> 30
    assert_int_equal(t[0].qs[32], 0);  // 0.5 * -1 = -0.5 -> 0
    assert_true(t[1].d == 0.0f);
    assert_true(t[2].d > 0.0f);        // largest |x| negative: d = max/-127 > 0
    assert_int_equal(t[3].qs[800 - 768], -127);
    assert_int_equal(t[3].qs[900 - 768], 127);
    free(x);
}

// --- K-quant kernels against their scalar reference, bit for bit ----------------------

// Same bits, or both NaN (an overflow to inf - inf gives the default NaN).
static bool same_float(float a, float b) {
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub || (isnan(a) && isnan(b));
}

// The Q8_K quantizer (AVX2 in this build) against pg_q8k_quantize_row_ref:
// normal rows, huge and tiny ones (1e30, 1e-30 and subnormal, where
// -127/max overflows to inf), ties, zeros, inf and NaN elements, +max/-max
// ties.
static void test_q8k_quantizer_bits_equal_scalar_reference(void **state) {
    enum { M = 12, NB = 3, COLS = NB * 256 };
    float *x = rnd_x(M, COLS);
    for (int j = 0; j < COLS; j++) {
        x[1 * COLS + j] *= 1e30f;
        x[2 * COLS + j] *= 1e-30f;
        x[3 * COLS + j] *= 1e-42f; // subnormal (some 0)
        x[4 * COLS + j] = (float)(j % 64 - 32) + 0.5f;
        x[5 * COLS + j] = j < 256 ? 0.0f : j < 512 ? -0.0f : x[5 * COLS + j];
        x[6 * COLS + j] = (float)(j % 7) - 3.0f; // +3 and -3 tie, +3 comes... -3 first
    }
    x[4 * COLS + 300] = 127.0f;
    x[7 * COLS + 5] = INFINITY;
    x[7 * COLS + 300] = -INFINITY;
    x[7 * COLS + 600] = NAN;
    x[8 * COLS + 0] = NAN; // NaN first in its block: ignored for the max
    x[8 * COLS + 256] = 3e38f;
    x[8 * COLS + 257] = -3e38f;
    for (int j = 0; j < COLS; j++) x[9 * COLS + j] = j % 256 == 255 ? -1e-38f : 0.0f;
    x[10 * COLS + 511] = 1.0f; // largest |x| last in its block
    pg_q8k_block got[NB], want[NB];
    for (int i = 0; i < M; i++) {
        pg_q8k_quantize_row(x + i * COLS, COLS, got);
        pg_q8k_quantize_row_ref(x + i * COLS, COLS, want);
        for (int b = 0; b < NB; b++) {
            if (memcmp(&got[b], &want[b], sizeof got[b]) != 0)
                fail_msg("Q8_K row %d block %d differs from the scalar reference", i, b);
        }
    }
    free(x);
}

// Random K-quant blocks (any bytes are a block; the fp16 scales kept
// finite), with extreme scales (65504, subnormal, 0) and all-zero blocks.
static void rnd_kquant_blocks(int dtype, uint8_t *p, int64_t n) {
    const size_t bb = pg_dtype_block_bytes(dtype);
    const size_t dpos = dtype == PG_DTYPE_Q6_K ? 208 : 0;
    for (int64_t k = 0; k < n; k++, p += bb) {
        for (size_t j = 0; j < bb; j++) p[j] = (uint8_t)rnd_u32();
        switch (rnd_u32() % 8) {
        case 0: memset(p, 0, bb); break;
        case 1: put16(p + dpos, 0x7bff); break; // 65504
        case 2: put16(p + dpos, 0x0001); break; // the smallest subnormal
        default: put16(p + dpos, pg_f32_to_f16(0.01f * rnd_normal())); break;
        }
        if (dtype == PG_DTYPE_Q4_K || dtype == PG_DTYPE_Q5_K) {
            uint16_t h = (uint16_t)rnd_u32();
            if ((h & 0x7c00) == 0x7c00) h &= 0x3fff; // no inf / NaN dmin
            put16(p + 2, h);
        }
    }
}

// pg_kdot_rows (AVX2 tiles of 1, 2 or 4 weight rows x 1..4 activation
// rows) against pg_kdot_row_ref for every pair: odd block counts, row
// ranges that start at odd rows and leave tails, m from 1 to 11, every
// summation order of pg_kdot_order (Q4_K with rows8 and m >= 4: the first
// m - m % 4 activation rows in the repack gemm's; m >= 8: Q6_K and Q4_K
// without rows8 in the tiled kernels'; Q5_K as Q6_K), activation rows with
// extreme and zero blocks.
static void test_kquant_dot_bits_equal_scalar_reference(void **state) {
    static const int dtypes[] = {PG_DTYPE_Q4_K, PG_DTYPE_Q5_K, PG_DTYPE_Q6_K};
    static const int nbs[] = {1, 3, 5, 8};
    enum { ROWS = 19, MAXM = 11 };
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++)
        for (size_t n = 0; n < sizeof nbs / sizeof nbs[0]; n++) {
            const int dtype = dtypes[t], nb = nbs[n];
            const size_t rb = pg_dtype_row_bytes(dtype, nb * 256);
            uint8_t *mem = malloc(rb * ROWS + 1), *w = mem + 1; // rows at odd addresses
            rnd_kquant_blocks(dtype, w, (int64_t)ROWS * nb);
            float *x = rnd_x(MAXM, nb * 256);
            for (int j = 0; j < nb * 256; j++) {
                x[1 * nb * 256 + j] *= 1e30f;
                if (j < 256) x[2 * nb * 256 + j] = 0.0f;
                x[3 * nb * 256 + j] *= 1e-30f;
            }
            pg_q8k_block *xk = malloc(sizeof(pg_q8k_block) * (size_t)(MAXM * nb));
            for (int i = 0; i < MAXM; i++)
                pg_q8k_quantize_row_ref(x + i * nb * 256, nb * 256, xk + i * nb);
            for (int rows8 = 0; rows8 < 2; rows8++) {
                float want1[MAXM][ROWS];
                for (int i = 0; i < MAXM; i++)
                    for (int r = 0; r < ROWS; r++)
                        want1[i][r] = pg_kdot_row_ref(dtype, w + r * rb, xk + i * nb, nb, rows8);
                for (int m = 1; m <= MAXM; m++) {
                    float want[MAXM][ROWS];
                    for (int i = 0; i < m; i++)
                        for (int r = 0; r < ROWS; r++)
                            want[i][r] = pg_kdot_row_ref(dtype, w + r * rb, xk + i * nb, nb,
                                                         pg_kdot_order(dtype, rows8, m, i));
                    static const int ranges[][2] = {{0, ROWS}, {3, 16}, {1, 2}, {5, 10}};
                    for (int k = 0; k < 4; k++) {
                        float got[MAXM][ROWS + 1];
                        for (int i = 0; i < MAXM; i++)
                            for (int r = 0; r <= ROWS; r++) got[i][r] = -12345.0f;
                        const int r0 = ranges[k][0], r1 = ranges[k][1];
                        pg_kdot_rows(dtype, w, rb, r0, r1, xk, m, nb, rows8, &got[0][0],
                                     ROWS + 1);
                        for (int i = 0; i < MAXM; i++)
                            for (int r = 0; r <= ROWS; r++) {
                                if (i >= m || r < r0 || r >= r1) {
                                    assert_true(got[i][r] == -12345.0f);
                                    continue;
                                }
                                if (!same_float(got[i][r], want[i][r]))
                                    fail_msg("%s nb=%d rows8=%d m=%d rows [%d,%d): (%d,%d) "
                                             "%.9g vs reference %.9g",
                                             pg_dtype_name(dtype), nb, rows8, m, r0, r1, r, i,
                                             got[i][r], want[i][r]);
                            }
                    }
                }
                for (int r = 0; r < ROWS; r++)
                    assert_true(
                        same_float(pg_kdot_row(dtype, w + r * rb, xk + nb, nb, rows8), want1[1][r]));
            }
            free(xk);
            free(x);
            free(mem);
        }
}

// llama.cpp's tiled kernels (ggml-cpu/tiled/tiled-kernel.cpp, AVX2
// microtile) written out again from ggml's dequantize_row_q4_K /
// dequantize_row_q5_K / dequantize_row_q6_K element formulas: per
// 256-element block the exact integers s1 = sum scale * code * x (Q6_K:
// code - 32) and, for Q4_K and Q5_K, s2 = sum min * x; res = d_w * s1
// (Q4_K, Q5_K: res = fma(-dmin_w, s2, res)); acc = fma(res, d_x, acc) over
// the blocks.
static float tiled_dot_ggml(int dtype, const uint8_t *w, const pg_q8k_block *y, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++, y++) {
        int32_t s1 = 0, s2 = 0;
        uint16_t h;
        if (dtype == PG_DTYPE_Q6_K) {
            const uint8_t *blk = w + (size_t)b * 210, *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8)
                for (int l = 0; l < 32; l++) {
                    const int is = l / 16;
                    const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    s1 += sc[is] * q1 * y->qs[n + l] + sc[is + 2] * q2 * y->qs[n + l + 32] +
                          sc[is + 4] * q3 * y->qs[n + l + 64] + sc[is + 6] * q4 * y->qs[n + l + 96];
                }
            memcpy(&h, blk + 208, 2);
            acc = fmaf(pg_f16_to_f32(h) * (float)s1, y->d, acc);
            continue;
        }
        const bool q5 = dtype == PG_DTYPE_Q5_K;
        const uint8_t *blk = w + (size_t)b * (q5 ? 176 : 144), *k = blk + 4, *q = blk + (q5 ? 48 : 16);
        const uint8_t *qh = blk + 16; // Q5_K
        uint8_t u1 = 1, u2 = 2;       // dequantize_row_q5_K's masks
        for (int j = 0, is = 0; j < 256; j += 64, q += 32, is += 2, u1 <<= 2, u2 <<= 2)
            for (int t = 0; t < 2; t++) { // get_scale_min_k4(is + t)
                const int jj = is + t;
                const int sc = jj < 4 ? k[jj] & 63 : (k[jj + 4] & 0xF) | ((k[jj - 4] >> 6) << 4);
                const int mn = jj < 4 ? k[jj + 4] & 63 : (k[jj + 4] >> 4) | ((k[jj] >> 6) << 4);
                for (int l = 0; l < 32; l++) {
                    const int x = y->qs[j + 32 * t + l];
                    const int hb = q5 && (qh[l] & (t ? u2 : u1)) ? 16 : 0;
                    s1 += sc * ((t ? q[l] >> 4 : q[l] & 0xF) + hb) * x;
                    s2 += mn * x;
                }
            }
        uint16_t hm;
        memcpy(&h, blk, 2);
        memcpy(&hm, blk + 2, 2);
        const float res = fmaf(-pg_f16_to_f32(hm), (float)s2, pg_f16_to_f32(h) * (float)s1);
        acc = fmaf(res, y->d, acc);
    }
    return acc;
}

static void test_kquant_tiled_order_is_ggml_tiled_kernel(void **state) {
    static const int dtypes[] = {PG_DTYPE_Q4_K, PG_DTYPE_Q5_K, PG_DTYPE_Q6_K};
    enum { ROWS = 24, NB = 8, M = 8 };
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
        const int dtype = dtypes[t];
        const size_t rb = pg_dtype_row_bytes(dtype, NB * 256);
        uint8_t *w = malloc(rb * ROWS);
        rnd_kquant_blocks(dtype, w, (int64_t)ROWS * NB);
        float *x = rnd_x(M, NB * 256);
        pg_q8k_block *xk = malloc(sizeof(pg_q8k_block) * M * NB);
        for (int i = 0; i < M; i++) pg_q8k_quantize_row_ref(x + i * NB * 256, NB * 256, xk + i * NB);
        int differs = 0;
        for (int i = 0; i < M; i++)
            for (int r = 0; r < ROWS; r++) {
                const float want = tiled_dot_ggml(dtype, w + r * rb, xk + i * NB, NB);
                const float got = pg_kdot_row_ref(dtype, w + r * rb, xk + i * NB, NB, PG_KDOT_TILED);
                if (!same_float(got, want))
                    fail_msg("%s (%d,%d): %.9g vs ggml's tiled %.9g", pg_dtype_name(dtype), r, i, got, want);
                differs += !same_float(got, pg_kdot_row_ref(dtype, w + r * rb, xk + i * NB, NB, PG_KDOT_VEC));
            }
        assert_true(differs > 0); // the orders do differ somewhere
        assert_int_equal(pg_kdot_order(dtype, false, 8, 0), PG_KDOT_TILED);
        assert_int_equal(pg_kdot_order(dtype, false, 7, 0), PG_KDOT_VEC);
        free(xk);
        free(x);
        free(w);
    }
    // Q4_K with rows8 stays in the repack's orders at any m; Q6_K has no repack on AVX2.
    assert_int_equal(pg_kdot_order(PG_DTYPE_Q4_K, true, 8, 7), PG_KDOT_8X8_GEMM);
    assert_int_equal(pg_kdot_order(PG_DTYPE_Q4_K, true, 9, 8), PG_KDOT_8X8);
    assert_int_equal(pg_kdot_order(PG_DTYPE_Q6_K, true, 8, 0), PG_KDOT_TILED);
    assert_int_equal(pg_kdot_order(PG_DTYPE_Q6_K, true, 7, 0), PG_KDOT_VEC);
    assert_int_equal(pg_kdot_order(PG_DTYPE_Q5_K, true, 8, 0), PG_KDOT_TILED);
    assert_int_equal(pg_kdot_order(PG_DTYPE_Q5_K, true, 7, 6), PG_KDOT_VEC);
}

// ggml's AVX2 vec_dot_q5_K_q8_K written out again from dequantize_row_q5_K's
// element formulas: per block 8 int32 lanes (lane l: elements 4l..4l+3 of
// every 32-element sub-block, times its scale), acc[l] = fma(d_x * d_w,
// lane[l], acc[l]); the mins as one scalar, summs = fma(-d_x * dmin_w,
// sum min * x, summs) (gcc contracts ggml's summs += dmin * int); the
// result hsum_float_8(acc) + summs.
static float vec_dot_q5k_ggml(const uint8_t *w, const pg_q8k_block *y, int nb) {
    float acc[8] = {0}, summs = 0.0f;
    for (int b = 0; b < nb; b++, y++) {
        const uint8_t *blk = w + (size_t)b * 176, *k = blk + 4, *qh = blk + 16, *q = blk + 48;
        int32_t lane[8] = {0}, s2 = 0;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < 256; j += 64, q += 32, is += 2, u1 <<= 2, u2 <<= 2)
            for (int t = 0; t < 2; t++) { // get_scale_min_k4(is + t)
                const int jj = is + t;
                const int sc = jj < 4 ? k[jj] & 63 : (k[jj + 4] & 0xF) | ((k[jj - 4] >> 6) << 4);
                const int mn = jj < 4 ? k[jj + 4] & 63 : (k[jj + 4] >> 4) | ((k[jj] >> 6) << 4);
                for (int l = 0; l < 32; l++) {
                    const int x = y->qs[j + 32 * t + l];
                    const int code = (t ? q[l] >> 4 : q[l] & 0xF) + ((qh[l] & (t ? u2 : u1)) ? 16 : 0);
                    lane[l / 4] += sc * code * x;
                    s2 += mn * x;
                }
            }
        uint16_t h, hm;
        memcpy(&h, blk, 2);
        memcpy(&hm, blk + 2, 2);
        const float d = y->d * pg_f16_to_f32(h), dmin = -y->d * pg_f16_to_f32(hm);
        summs = fmaf(dmin, (float)s2, summs);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + summs;
}

static void test_q5k_vec_order_is_ggml_vec_dot(void **state) {
    enum { ROWS = 24, NB = 8, M = 4 };
    const size_t rb = pg_dtype_row_bytes(PG_DTYPE_Q5_K, NB * 256);
    uint8_t *w = malloc(rb * ROWS);
    rnd_kquant_blocks(PG_DTYPE_Q5_K, w, (int64_t)ROWS * NB);
    float *x = rnd_x(M, NB * 256);
    pg_q8k_block *xk = malloc(sizeof(pg_q8k_block) * M * NB);
    for (int i = 0; i < M; i++) pg_q8k_quantize_row_ref(x + i * NB * 256, NB * 256, xk + i * NB);
    for (int i = 0; i < M; i++)
        for (int r = 0; r < ROWS; r++) {
            const float want = vec_dot_q5k_ggml(w + r * rb, xk + i * NB, NB);
            const float got = pg_kdot_row_ref(PG_DTYPE_Q5_K, w + r * rb, xk + i * NB, NB, PG_KDOT_VEC);
            if (!same_float(got, want))
                fail_msg("q5_K (%d,%d): %.9g vs ggml's vec_dot %.9g", r, i, got, want);
        }
    free(xk);
    free(x);
    free(w);
}

// Through the matmul (2 threads): Q4_K with 16 rows (the repacked order)
// and 13 rows, Q5_K, Q6_K, for decode and prefill sizes, each output the
// reference's bits for its pair.
static void test_kquant_matmul_bits_equal_scalar_reference(void **state) {
    static const struct {
        int dtype;
        int64_t rows;
    } cases[] = {{PG_DTYPE_Q4_K, 16}, {PG_DTYPE_Q4_K, 13}, {PG_DTYPE_Q5_K, 16},
                 {PG_DTYPE_Q5_K, 13}, {PG_DTYPE_Q6_K, 16}, {PG_DTYPE_Q6_K, 13}};
    static const int64_t ms[] = {1, 2, 4, 7, 8, 33};
    pg_backend *q = backend(2, PG_MATMUL_QUANT_ACT);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t cols = 768, nb = cols / 256;
        test_weight t = make_weight(cases[c].dtype, cases[c].rows, cols);
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) {
            const int64_t m = ms[k];
            float *x = rnd_x(m, cols);
            int64_t ldo;
            float *got = run_matmul(q, &t, x, m, &ldo);
            pg_q8k_block xk[3];
            // Q4_K with 8k rows: the repack's gemm order for the first m - m % 4
            // rows; m >= 8: Q6_K and Q4_K with 13 rows in the tiled order.
            const bool rows8 = t.w.rows % 8 == 0;
            for (int64_t i = 0; i < m; i++) {
                pg_q8k_quantize_row_ref(x + i * cols, cols, xk);
                for (int64_t r = 0; r < t.w.rows; r++) {
                    float want = pg_kdot_row_ref(t.w.dtype,
                                                 (const uint8_t *)t.w.data + r * t.w.row_bytes, xk,
                                                 nb, pg_kdot_order(t.w.dtype, rows8, m, i));
                    if (!same_float(got[i * ldo + r], want))
                        fail_msg("%s %lld rows m=%lld: (%lld,%lld) %.9g vs %.9g",
                                 pg_dtype_name(t.w.dtype), (long long)t.w.rows, (long long)m,
                                 (long long)r, (long long)i, got[i * ldo + r], want);
                }
            }
            free(got);
            free(x);
        }
        free_weight(&t);
    }
    q->dev->destroy(q);
}

// Each output element depends only on its weight row and activation row:
// the same whatever the thread count, the batch size it came in (tiles of
// 1..4 activation rows, 1..4 weight rows) and the rows around it.
static void test_quantized_results_independent_of_threads_and_tiling(void **state) {
    static const int dtypes[] = {PG_DTYPE_Q4_0, PG_DTYPE_Q4_1, PG_DTYPE_Q5_0, PG_DTYPE_Q5_1,
                                 PG_DTYPE_Q8_0};
    pg_backend *b1 = backend(1, PG_MATMUL_QUANT_ACT), *b3 = backend(3, PG_MATMUL_QUANT_ACT);
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
        const int64_t m = 70, rows = 203, cols = 192;
        test_weight t = make_weight(dtypes[k], rows, cols);
        float *x = rnd_x(m, cols);
        int64_t ldo;
        float *all1 = run_matmul(b1, &t, x, m, &ldo);
        float *all3 = run_matmul(b3, &t, x, m, &ldo);
        assert_memory_equal(all1, all3, sizeof(float) * (size_t)(m * ldo));
        for (int64_t i0 = 0; i0 < m; i0 += 1 + i0 % 5) {
            int64_t n = 1 + i0 % 5 < m - i0 ? 1 + i0 % 5 : m - i0;
            float *part = run_matmul(b3, &t, x + i0 * cols, n, &ldo);
            assert_memory_equal(part, all1 + i0 * ldo, sizeof(float) * (size_t)(n * ldo));
            free(part);
        }
        // A sub-matrix of weight rows starting at an odd row.
        test_weight sub = t;
        sub.w.data = (const uint8_t *)t.w.data + 3 * t.w.row_bytes;
        sub.w.rows = 5;
        float *few = run_matmul(b1, &sub, x, m, &ldo);
        for (int64_t i = 0; i < m; i++)
            assert_memory_equal(few + i * ldo, all1 + i * (rows + 5) + 3, sizeof(float) * 5);
        free(few);
        free(all1);
        free(all3);
        free(x);
        free_weight(&t);
    }
    b1->dev->destroy(b1);
    b3->dev->destroy(b3);
}

// PG_MATMUL_DEFAULT quantizes on the CPU; the names round-trip.
static void test_mode_default_is_quantized_and_names_parse(void **state) {
    test_weight t = make_weight(PG_DTYPE_Q4_1, 40, 128);
    float *x = rnd_x(3, 128);
    pg_backend *d = backend(2, PG_MATMUL_DEFAULT), *q = backend(2, PG_MATMUL_QUANT_ACT);
    int64_t ldo;
    float *a = run_matmul(d, &t, x, 3, &ldo), *c = run_matmul(q, &t, x, 3, &ldo);
    assert_memory_equal(a, c, sizeof(float) * (size_t)(3 * ldo));
    pg_matmul_mode mode;
    static const pg_matmul_mode all[] = {PG_MATMUL_DEFAULT, PG_MATMUL_EXACT, PG_MATMUL_QUANT_ACT};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(pg_matmul_mode_parse(pg_matmul_mode_name(all[k]), &mode), 0);
        assert_int_equal(mode, all[k]);
    }
    assert_true(pg_matmul_mode_parse("fast", &mode) < 0);
    free(a);
    free(c);
    free(x);
    free_weight(&t);
    d->dev->destroy(d);
    q->dev->destroy(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activation_quantizer_matches_llama_cpp_rules),
        cmocka_unit_test(test_q8k_quantizer_matches_llama_cpp_rules),
        cmocka_unit_test(test_q4_0_both_modes_match_references),
        cmocka_unit_test(test_q4_1_both_modes_match_references),
        cmocka_unit_test(test_q5_0_both_modes_match_references),
        cmocka_unit_test(test_q5_1_both_modes_match_references),
        cmocka_unit_test(test_q8_0_both_modes_match_references),
        cmocka_unit_test(test_q4_k_both_modes_match_references),
        cmocka_unit_test(test_q5_k_both_modes_match_references),
        cmocka_unit_test(test_q6_k_both_modes_match_references),
        cmocka_unit_test(test_plain_types_exact_match_reference),
        cmocka_unit_test(test_quantized_results_independent_of_threads_and_tiling),
        cmocka_unit_test(test_mode_default_is_quantized_and_names_parse),
        // Last: they draw random numbers, and the tolerances above were
        // measured on the data the sequence gives them.
        cmocka_unit_test(test_q8k_quantizer_bits_equal_scalar_reference),
        cmocka_unit_test(test_kquant_dot_bits_equal_scalar_reference),
        cmocka_unit_test(test_kquant_tiled_order_is_ggml_tiled_kernel),
        cmocka_unit_test(test_q5k_vec_order_is_ggml_vec_dot),
        cmocka_unit_test(test_kquant_matmul_bits_equal_scalar_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
