// kernels/cpu/matmul.c - out = x . W^T for weights in any storage type.
//
// Two numerical modes (pg_cpu_ctx.mode, kernels/kernels.h):
//  - quantized activations (the default for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0
//    weights):
//    x is quantized once per call to 8 bits per 32-element block and
//    multiplied with integer dot products exactly as llama.cpp's CPU backend
//    does (kernels/cpu/quant_dot.c), for every m;
//  - exact f32 (every other type, or PG_MATMUL_EXACT): for m small (decode)
//    each weight row is dequantized block by block in registers and dotted
//    with all m activation rows at once, so the weights (the dominant memory
//    traffic) are read exactly once; for m large (prefill) panels of 64
//    weight rows are dequantized to f32 in per-thread scratch and multiplied
//    with single-threaded OpenBLAS sgemm, the panels spread over the pool.
//
// paged's own types (kernels/dtype.h, docs/quantization.md):
//  - FP8_E4M3 rows carry an f32 scale each (pg_weight.scales), applied to
//    each row's dot product. In the quantized mode (W8A8) x is first
//    quantized per row to e4m3 with a dynamic scale (pg_quantize_row_fp8)
//    and put back to f32, so the products are those of the two e4m3 values
//    (exact in f32) times both scales, summed in f32: what an FP8 GEMM with
//    f32 accumulation computes, up to the order of the sum. In the exact
//    mode x stays f32.
//  - INT4_G128 is weight-only in both modes: x stays f32, each 128-element
//    group is unpacked in registers and dotted, (q - z) * d.
#include <cblas.h>
#include <pthread.h>
#include <string.h>

#include "common/err.h"
#include "common/half.h"
#include "kernels/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/quant_dot.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

#define FUSED_MAX_M 8  // rows of x handled by the fused exact path
#define PANEL_ROWS  64 // sgemm path: weight rows dequantized per task
// Task sizing (both row-split paths): about TASKS_PER_THREAD tasks per
// thread so that a thread slowed down by another process does not hold the
// whole call up, but no task under MIN_TASK_WORK units (one unit: 32 weight
// elements times one activation row, a few ns), so that claiming a task
// (an atomic on a shared line) stays small next to running it.
#define TASKS_PER_THREAD 4
#define MIN_TASK_WORK    4096
// Quantize x on the pool only from this many 32-element blocks on (below,
// a dispatch costs about what quantizing on the caller does).
#define QUANT_PAR_BLOCKS 2048

// Block layouts (Q4_0_BYTES, ld16, ...): kernels/cpu/quant_dot.h.

// --- fused dot products --------------------------------------------------------

#ifdef HAVE_AVX2
static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

// 16 bytes of 4-bit values -> 32 floats in element order (low nibbles are
// elements 0..15, high nibbles 16..31), offset by `bias`.
static inline void unpack_q4(const uint8_t *qs, __m256 bias, __m256 v[4]) {
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f));
    v[0] = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), bias);
    v[1] = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), bias);
    v[2] = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), bias);
    v[3] = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), bias);
}

// Q5: the same plus 16 where the element's fifth bit (bit j of the 32-bit
// little-endian qh) is set.
static inline void unpack_q5(const uint8_t *qs, const uint8_t *qh, __m256 bias, __m256 v[4]) {
    uint32_t h;
    memcpy(&h, qh, 4);
    unpack_q4(qs, bias, v);
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    for (int k = 0; k < 4; k++) {
        __m256i b = _mm256_and_si256(_mm256_set1_epi32((int)(h >> (8 * k))), bit);
        __m256 sixteen = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(b, bit)),
                                       _mm256_set1_ps(16.0f));
        v[k] = _mm256_add_ps(v[k], sixteen);
    }
}

static inline void unpack_q8(const int8_t *qs, __m256 v[4]) {
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * k))));
}

// acc[i] += scale * dot(v, x[i][0:32])
static inline void fma_block(const __m256 v[4], __m256 scale, const float *x, int64_t m, int64_t ld,
                             __m256 *acc) {
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * ld;
        __m256 s = _mm256_mul_ps(v[0], _mm256_loadu_ps(xi));
        s = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xi + 8), s);
        s = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xi + 16), s);
        s = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xi + 24), s);
        acc[i] = _mm256_fmadd_ps(scale, s, acc[i]);
    }
}

// F16C scalar conversion (x86-64-v3 has it); the portable one branches.
static inline float f16(const uint8_t *p) {
    return _cvtsh_ss(ld16(p));
}

// `xsum[i][b]` is the sum of x row i over block b, precomputed once per
// matmul: the block minimum multiplies it.
static void dot_q4_1(const uint8_t *w, int64_t nb, const float *x, int64_t m, int64_t ld,
                     const float *xsum, float *out, int64_t os) {
    __m256 acc[FUSED_MAX_M];
    float msum[FUSED_MAX_M] = {0};
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    __m256 v[4];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q4_1_BYTES;
        unpack_q4(blk + 4, _mm256_setzero_ps(), v);
        fma_block(v, _mm256_set1_ps(f16(blk)), x + b * 32, m, ld, acc);
        float mn = f16(blk + 2);
        for (int64_t i = 0; i < m; i++) msum[i] += mn * xsum[i * nb + b];
    }
    for (int64_t i = 0; i < m; i++) out[i * os] = hsum8(acc[i]) + msum[i];
}

static void dot_q5_1(const uint8_t *w, int64_t nb, const float *x, int64_t m, int64_t ld,
                     const float *xsum, float *out, int64_t os) {
    __m256 acc[FUSED_MAX_M];
    float msum[FUSED_MAX_M] = {0};
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    __m256 v[4];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q5_1_BYTES;
        unpack_q5(blk + 8, blk + 4, _mm256_setzero_ps(), v);
        fma_block(v, _mm256_set1_ps(f16(blk)), x + b * 32, m, ld, acc);
        float mn = f16(blk + 2);
        for (int64_t i = 0; i < m; i++) msum[i] += mn * xsum[i * nb + b];
    }
    for (int64_t i = 0; i < m; i++) out[i * os] = hsum8(acc[i]) + msum[i];
}

static void dot_q5_0(const uint8_t *w, int64_t nb, const float *x, int64_t m, int64_t ld,
                     float *out, int64_t os) {
    __m256 acc[FUSED_MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    __m256 v[4];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q5_0_BYTES;
        unpack_q5(blk + 6, blk + 2, _mm256_set1_ps(-16.0f), v);
        fma_block(v, _mm256_set1_ps(f16(blk)), x + b * 32, m, ld, acc);
    }
    for (int64_t i = 0; i < m; i++) out[i * os] = hsum8(acc[i]);
}

static void dot_q4_0(const uint8_t *w, int64_t nb, const float *x, int64_t m, int64_t ld,
                     float *out, int64_t os) {
    __m256 acc[FUSED_MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    __m256 v[4];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q4_0_BYTES;
        unpack_q4(blk + 2, _mm256_set1_ps(-8.0f), v);
        fma_block(v, _mm256_set1_ps(f16(blk)), x + b * 32, m, ld, acc);
    }
    for (int64_t i = 0; i < m; i++) out[i * os] = hsum8(acc[i]);
}

static void dot_q8_0(const uint8_t *w, int64_t nb, const float *x, int64_t m, int64_t ld,
                     float *out, int64_t os) {
    __m256 acc[FUSED_MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    __m256 v[4];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q8_0_BYTES;
        unpack_q8((const int8_t *)blk + 2, v);
        fma_block(v, _mm256_set1_ps(f16(blk)), x + b * 32, m, ld, acc);
    }
    for (int64_t i = 0; i < m; i++) out[i * os] = hsum8(acc[i]);
}

// INT4_G128: per 128-element group, four Q4_0-ordered 32-element runs
// sharing d and z: (q - z) * d as an fma of d with (q - z).
static void dot_int4(const uint8_t *w, int64_t nb, int G, const float *x, int64_t m, int64_t ld,
                     float *out, int64_t os) {
    __m256 acc[FUSED_MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    __m256 v[4];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * PG_INT4_BLOCK_BYTES_G(G);
        const __m256 d = _mm256_set1_ps(f16(blk)), z = _mm256_set1_ps(-(float)blk[2]);
        for (int run = 0; run < G / 32; run++) {
            unpack_q4(blk + 4 + 16 * run, z, v);
            fma_block(v, d, x + b * G + 32 * run, m, ld, acc);
        }
    }
    for (int64_t i = 0; i < m; i++) out[i * os] = hsum8(acc[i]);
}

// e4m3 -> f32 for every byte (filled once; a gather reads 8 at a time).
static float fp8_lut[256];
static void fp8_lut_init(void) {
    for (int i = 0; i < 256; i++) fp8_lut[i] = pg_fp8_e4m3_to_f32((uint8_t)i);
}

// FP8_E4M3, unscaled (the caller multiplies by the row's scale).
static void dot_fp8(const uint8_t *w, int64_t cols, const float *x, int64_t m, int64_t ld, float *out,
                    int64_t os) {
    __m256 acc[FUSED_MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + j)));
        __m256 wv = _mm256_i32gather_ps(fp8_lut, idx, 4);
        for (int64_t i = 0; i < m; i++)
            acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ld + j), acc[i]);
    }
    float tail[FUSED_MAX_M] = {0};
    for (; j < cols; j++)
        for (int64_t i = 0; i < m; i++) tail[i] += fp8_lut[w[j]] * x[i * ld + j];
    for (int64_t i = 0; i < m; i++) out[i * os] = hsum8(acc[i]) + tail[i];
}

// Plain types: 8 elements at a time, converted to f32 in registers.
static inline __m256 load8(int dtype, const void *w, int64_t j) {
    switch (dtype) {
    case PG_DTYPE_F32:
        return _mm256_loadu_ps((const float *)w + j);
    case PG_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + j)));
    default: // BF16: shift into the high half of an f32
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + j))),
            16));
    }
}

static void dot_plain(int dtype, const void *w, int64_t cols, const float *x, int64_t m, int64_t ld,
                      float *out, int64_t os) {
    __m256 acc[FUSED_MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) {
        __m256 wv = load8(dtype, w, j);
        for (int64_t i = 0; i < m; i++)
            acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ld + j), acc[i]);
    }
    float tail[FUSED_MAX_M] = {0};
    if (j < cols) {
        float buf[8];
        for (int64_t t = j; t < cols; t++) {
            pg_dequantize_row(dtype, (const char *)w + (size_t)t * pg_dtype_block_bytes(dtype), buf,
                              1);
            for (int64_t i = 0; i < m; i++) tail[i] += buf[0] * x[i * ld + t];
        }
    }
    for (int64_t i = 0; i < m; i++) out[i * os] = hsum8(acc[i]) + tail[i];
}
#endif // HAVE_AVX2

static void fp8_lut_init_all(void) {
#ifdef HAVE_AVX2
    fp8_lut_init();
#endif
}
static void fp8_ready(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fp8_lut_init_all);
}

// Any type: dequantize the row, then dot. The reference for the fast paths.
static void dot_generic(int dtype, const void *wrow, int64_t cols, const float *x, int64_t m,
                        int64_t ld, float *out, int64_t os) {
    float buf[256];
    int be = pg_dtype_block_elems(dtype);
    int64_t chunk = be >= 256 ? be : (256 / be) * be;
    size_t bb = pg_dtype_block_bytes(dtype);
    double acc[FUSED_MAX_M] = {0};
    for (int64_t j = 0; j < cols; j += chunk) {
        int64_t n = cols - j < chunk ? cols - j : chunk;
        pg_dequantize_row(dtype, (const char *)wrow + (size_t)(j / be) * bb, buf, n);
        for (int64_t i = 0; i < m; i++) {
            float s = 0;
            for (int64_t t = 0; t < n; t++) s += buf[t] * x[i * ld + j + t];
            acc[i] += s;
        }
    }
    for (int64_t i = 0; i < m; i++) out[i * os] = (float)acc[i];
}

// Types whose blocks carry a minimum (d * q + m): their fused dots need
// the activation block sums.
static bool has_min(int dtype) {
    return dtype == PG_DTYPE_Q4_1 || dtype == PG_DTYPE_Q5_1;
}

// Sums of each x row over 32-element blocks: xsum[i][b] (the minimum term).
static void block_sums(const float *x, int64_t m, int64_t ld, int64_t cols, float *xsum) {
    int64_t nb = cols / 32;
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < nb; b++) {
            float s = 0;
            for (int t = 0; t < 32; t++) s += x[i * ld + b * 32 + t];
            xsum[i * nb + b] = s;
        }
}

static void dot_rows(int dtype, const void *wrow, int64_t cols, const float *x, int64_t m,
                     int64_t ld, const float *xsum, float *out, int64_t os) {
    for (int64_t i0 = 0; i0 < m; i0 += FUSED_MAX_M) {
        int64_t mm = m - i0 < FUSED_MAX_M ? m - i0 : FUSED_MAX_M;
        const float *xi = x + i0 * ld;
        float *oi = out + i0 * os;
#ifdef HAVE_AVX2
        switch (dtype) {
        case PG_DTYPE_Q4_1:
            dot_q4_1(wrow, cols / 32, xi, mm, ld, xsum + i0 * (cols / 32), oi, os);
            continue;
        case PG_DTYPE_Q4_0:
            dot_q4_0(wrow, cols / 32, xi, mm, ld, oi, os);
            continue;
        case PG_DTYPE_Q5_1:
            dot_q5_1(wrow, cols / 32, xi, mm, ld, xsum + i0 * (cols / 32), oi, os);
            continue;
        case PG_DTYPE_Q5_0:
            dot_q5_0(wrow, cols / 32, xi, mm, ld, oi, os);
            continue;
        case PG_DTYPE_Q8_0:
            dot_q8_0(wrow, cols / 32, xi, mm, ld, oi, os);
            continue;
        case PG_DTYPE_INT4_G128:
            dot_int4(wrow, cols / 128, 128, xi, mm, ld, oi, os);
            continue;
        case PG_DTYPE_INT4_G64:
            dot_int4(wrow, cols / 64, 64, xi, mm, ld, oi, os);
            continue;
        case PG_DTYPE_FP8_E4M3:
            dot_fp8(wrow, cols, xi, mm, ld, oi, os);
            continue;
        case PG_DTYPE_F32:
        case PG_DTYPE_F16:
        case PG_DTYPE_BF16:
            dot_plain(dtype, wrow, cols, xi, mm, ld, oi, os);
            continue;
        default:
            break;
        }
#endif
        dot_generic(dtype, wrow, cols, xi, mm, ld, oi, os);
    }
}

void pg_cpu_dot_rows(int dtype, const void *wrow, int64_t cols, const float *x, int64_t m,
                     int64_t ld, float *out, int64_t os) {
    float *xsum = NULL;
    fp8_ready();
    if (has_min(dtype)) {
        xsum = pg_xmalloc(sizeof(float) * (size_t)(m * (cols / 32) + 1));
        block_sums(x, m, ld, cols, xsum);
    }
    dot_rows(dtype, wrow, cols, x, m, ld, xsum, out, os);
    free(xsum);
}

// --- the parallel matmul ---------------------------------------------------------

typedef struct {
    pg_cpu_ctx *c;
    float *out;
    int64_t ldo;
    const float *x;
    int64_t m;
    const pg_weight *w;
    const float *xsum; // [m][cols / 32] for Q4_1/Q5_1 (exact fused path)
    int64_t task_rows; // weight rows per task (row-split paths)
    pg_xq *xq;         // quantized x (quantized path)
    pg_q8k_block *xk;  // Q8_K x (K-quant weights, quantized path)
    const float *xscale; // [m] activation scales (1 unless W8A8), with w->scales
} mm_job;

// Weight rows per task, a multiple of `align`, for `rows` rows of
// `work_per_row` units each (see TASKS_PER_THREAD).
static int64_t task_rows(int64_t rows, int64_t work_per_row, int n_threads, int64_t align) {
    int64_t per_thread = rows * work_per_row / ((int64_t)n_threads * MIN_TASK_WORK);
    if (per_thread > TASKS_PER_THREAD) per_thread = TASKS_PER_THREAD;
    if (per_thread < 1) per_thread = 1;
    int64_t n_tasks = per_thread * n_threads;
    int64_t per = (rows + n_tasks - 1) / n_tasks;
    per = (per + align - 1) / align * align;
    return per < rows ? per : rows;
}

static void fused_task(void *ctx, int64_t t, int thread) {
    mm_job *j = ctx;
    const pg_weight *w = j->w;
    int64_t r0 = t * j->task_rows, r1 = r0 + j->task_rows < w->rows ? r0 + j->task_rows : w->rows;
    for (int64_t r = r0; r < r1; r++) {
        dot_rows(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes, w->cols, j->x, j->m,
                 w->cols, j->xsum, j->out + r, j->ldo);
        if (w->scales)
            for (int64_t i = 0; i < j->m; i++) j->out[r + i * j->ldo] *= w->scales[r] * j->xscale[i];
    }
}

static void panel_task(void *ctx, int64_t t, int thread) {
    mm_job *j = ctx;
    const pg_weight *w = j->w;
    int64_t r0 = t * PANEL_ROWS, n = w->rows - r0 < PANEL_ROWS ? w->rows - r0 : PANEL_ROWS;
    const float *panel;
    if (w->dtype == PG_DTYPE_F32) {
        panel = (const float *)((const char *)w->data + (size_t)r0 * w->row_bytes);
    } else {
        float *s = pg_cpu_scratch(j->c, thread, (size_t)n * (size_t)w->cols);
        for (int64_t r = 0; r < n; r++)
            pg_dequantize_row(w->dtype, (const char *)w->data + (size_t)(r0 + r) * w->row_bytes,
                              s + r * w->cols, w->cols);
        panel = s;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->m, (int)n, (int)w->cols, 1.0f,
                j->x, (int)w->cols, panel, (int)w->cols, 0.0f, j->out + r0, (int)j->ldo);
    // Row scales after the product, as the fused path and a GPU epilogue do.
    if (w->scales)
        for (int64_t i = 0; i < j->m; i++)
            for (int64_t r = 0; r < n; r++) j->out[i * j->ldo + r0 + r] *= w->scales[r0 + r] * j->xscale[i];
}

static void exact_matmul(pg_cpu_ctx *c, float *out, int64_t ldo, const float *x, int64_t m,
                         const pg_weight *w, const float *xscale) {
    mm_job j = {.c = c, .out = out, .ldo = ldo, .x = x, .m = m, .w = w, .xscale = xscale};
    if (m <= FUSED_MAX_M) {
        float xsum[FUSED_MAX_M * 1024];
        float *xs = NULL;
        if (has_min(w->dtype)) {
            size_t n = (size_t)(m * (w->cols / 32));
            xs = n <= sizeof xsum / sizeof xsum[0] ? xsum : pg_xmalloc(n * sizeof(float));
            block_sums(x, m, w->cols, w->cols, xs);
            j.xsum = xs;
        }
        int64_t units = (w->cols + 31) / 32 * m;
        j.task_rows = task_rows(w->rows, units, c->n_threads, 4);
        pg_pool_run(c->pool, (w->rows + j.task_rows - 1) / j.task_rows, fused_task, &j);
        if (xs && xs != xsum) free(xs);
    } else
        pg_pool_run(c->pool, (w->rows + PANEL_ROWS - 1) / PANEL_ROWS, panel_task, &j);
}

// --- quantized-activation path ---------------------------------------------------

static void quant_x_task(void *ctx, int64_t t, int thread) {
    mm_job *j = ctx;
    int64_t i0 = t * j->task_rows, i1 = i0 + j->task_rows < j->m ? i0 + j->task_rows : j->m;
    pg_xq_quantize(j->xq, j->x, j->w->cols, i0, i1);
}

static void quant_task(void *ctx, int64_t t, int thread) {
    mm_job *j = ctx;
    const pg_weight *w = j->w;
    int64_t r0 = t * j->task_rows, r1 = r0 + j->task_rows < w->rows ? r0 + j->task_rows : w->rows;
    size_t bytes = pg_qdot_scratch_bytes(w->dtype, w->cols);
    void *scratch =
        bytes ? pg_cpu_scratch(j->c, thread, (bytes + sizeof(float) - 1) / sizeof(float)) : NULL;
    pg_qdot_rows(w->dtype, w->data, w->row_bytes, r0, r1, j->xq, j->out, j->ldo, scratch);
}

// K-quant weights: activation rows quantized to Q8_K (256-element blocks),
// then one ggml-order dot product per (weight row, activation row) pair.
static void kq_x_task(void *ctx, int64_t t, int thread) {
    mm_job *j = ctx;
    int64_t i0 = t * j->task_rows, i1 = i0 + j->task_rows < j->m ? i0 + j->task_rows : j->m;
    const int64_t nb = j->w->cols / QK_K_ELEMS;
    for (int64_t i = i0; i < i1; i++)
        pg_q8k_quantize_row(j->x + i * j->w->cols, j->w->cols, j->xk + i * nb);
}

static void kq_task(void *ctx, int64_t t, int thread) {
    mm_job *j = ctx;
    const pg_weight *w = j->w;
    int64_t r0 = t * j->task_rows, r1 = r0 + j->task_rows < w->rows ? r0 + j->task_rows : w->rows;
    pg_kdot_rows(w->dtype, w->data, w->row_bytes, r0, r1, j->xk, j->m, w->cols / QK_K_ELEMS,
                 w->rows % 8 == 0, j->out, j->ldo);
}

static void kq_matmul(pg_cpu_ctx *c, float *out, int64_t ldo, const float *x, int64_t m,
                      const pg_weight *w) {
    const int64_t nb = w->cols / QK_K_ELEMS;
    size_t need = (size_t)(m * nb) * sizeof(pg_q8k_block);
    if (c->xq_cap < need) {
        free(c->xq_mem);
        c->xq_mem = aligned_alloc(64, (need + 63) / 64 * 64);
        PG_CHECK(c->xq_mem != NULL);
        c->xq_cap = need;
    }
    mm_job j = {.c = c, .out = out, .ldo = ldo, .x = x, .m = m, .w = w, .xk = c->xq_mem};
    if (c->n_threads > 1 && m > 1 && m * nb * 8 >= QUANT_PAR_BLOCKS) {
        int64_t n = m < 2 * c->n_threads ? m : 2 * c->n_threads;
        j.task_rows = (m + n - 1) / n;
        pg_pool_run(c->pool, (m + j.task_rows - 1) / j.task_rows, kq_x_task, &j);
    } else {
        j.task_rows = m;
        kq_x_task(&j, 0, 0);
    }
    j.task_rows = task_rows(w->rows, nb * 8 * m, c->n_threads, 4);
    pg_pool_run(c->pool, (w->rows + j.task_rows - 1) / j.task_rows, kq_task, &j);
}

static void quant_matmul(pg_cpu_ctx *c, float *out, int64_t ldo, const float *x, int64_t m,
                         const pg_weight *w) {
    if (pg_kdot_supported(w->dtype)) {
        kq_matmul(c, out, ldo, x, m, w);
        return;
    }
    size_t need = pg_xq_bytes(m, w->cols);
    if (c->xq_cap < need) {
        free(c->xq_mem);
        c->xq_mem = aligned_alloc(64, (need + 63) / 64 * 64);
        PG_CHECK(c->xq_mem != NULL);
        c->xq_cap = need;
    }
    pg_xq xq;
    pg_xq_init(&xq, c->xq_mem, m, w->cols);
    mm_job j = {.c = c, .out = out, .ldo = ldo, .x = x, .m = m, .w = w, .xq = &xq};
    if (c->n_threads > 1 && m > 1 && m * xq.nb >= QUANT_PAR_BLOCKS) {
        int64_t n = m < 2 * c->n_threads ? m : 2 * c->n_threads;
        j.task_rows = (m + n - 1) / n;
        pg_pool_run(c->pool, (m + j.task_rows - 1) / j.task_rows, quant_x_task, &j);
    } else {
        pg_xq_quantize(&xq, x, w->cols, 0, m);
    }
    // Multiples of 12 rows: whole tiles of the decode (4 rows) and batch
    // (3 rows) kernels.
    j.task_rows = task_rows(w->rows, xq.nb * m, c->n_threads, 12);
    pg_pool_run(c->pool, (w->rows + j.task_rows - 1) / j.task_rows, quant_task, &j);
}

bool pg_cpu_matmul_quantizes(const pg_cpu_ctx *c, int dtype) {
    // K-quants x Q8_K in the default mode too, as llama.cpp runs them: the
    // AVX2 kernels prefill as fast as the f32 path and decode about 3x
    // faster on Gemma 3 270M (docs/cpu_kernels.md).
    return c->mode != PG_MATMUL_EXACT && (pg_qdot_supported(dtype) || pg_kdot_supported(dtype));
}

// FP8 weights: the activation rows' scales (1, or W8A8's per-token
// scales with x replaced by its e4m3 values) and a matmul with those.
static void fp8_matmul(pg_cpu_ctx *c, float *out, int64_t ldo, const float *x, int64_t m,
                       const pg_weight *w) {
    fp8_ready();
    float *xs = pg_xmalloc(sizeof(float) * (size_t)m);
    if (c->mode == PG_MATMUL_EXACT) {
        for (int64_t i = 0; i < m; i++) xs[i] = 1.0f;
        exact_matmul(c, out, ldo, x, m, w, xs);
        free(xs);
        return;
    }
    const int64_t k = w->cols;
    float *xd = pg_xmalloc(sizeof(float) * (size_t)(m * k));
    uint8_t *q = pg_xmalloc((size_t)k);
    for (int64_t i = 0; i < m; i++) {
        pg_quantize_row_fp8(x + i * k, k, q, &xs[i]);
        for (int64_t t = 0; t < k; t++) xd[i * k + t] = pg_fp8_e4m3_to_f32(q[t]);
    }
    free(q);
    exact_matmul(c, out, ldo, xd, m, w, xs);
    free(xd);
    free(xs);
}

void pg_cpu_matmul(pg_cpu_ctx *c, float *out, int64_t ldo, const float *x, int64_t m,
                   const pg_weight *w) {
    if (m <= 0 || w->rows <= 0) return;
    if (w->dtype == PG_DTYPE_FP8_E4M3) {
        PG_CHECK(w->scales != NULL); // the loaders always give FP8 rows their scales
        fp8_matmul(c, out, ldo, x, m, w);
    } else if (pg_cpu_matmul_quantizes(c, w->dtype))
        quant_matmul(c, out, ldo, x, m, w);
    else
        exact_matmul(c, out, ldo, x, m, w, NULL);
}
