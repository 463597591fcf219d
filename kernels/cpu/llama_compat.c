// kernels/cpu/llama_compat.c - ggml-cpu's element-wise arithmetic (see the
// header). Every fused multiply-add here is explicit (fmaf or an FMA
// intrinsic) and nothing else may be contracted: the file is built with
// -std=c11, under which gcc does not fuse a*b+c on its own.
#include "kernels/cpu/llama_compat.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

// --- RMSNorm ---------------------------------------------------------------------

void pg_lc_rmsnorm_row(float *y, const float *x, const float *w, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float sq = x[i] * x[i]; // rounded to f32 before the double sum
        sum += (double)sq;
    }
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
}

// --- expf ---------------------------------------------------------------------------
//
// exp(x) = 2^n * exp(b), n = round(x / ln 2), b = x - n ln 2 (ln 2 split in a
// high and a low part), exp(b) - 1 by a degree-5 polynomial; lanes whose |n|
// exceeds 126 scale in two steps to reach the subnormal and overflow range.
// The constants are those of ggml_v_expf (from Arm's optimized routines).

#define EXP_SHIFT  0x1.8p23f
#define EXP_LOG2E  0x1.715476p+0f
#define EXP_LN2_HI 0x1.62e4p-1f
#define EXP_LN2_LO 0x1.7f7d1cp-20f
#define EXP_C0     0x1.ffffecp-1f
#define EXP_C1     0x1.fffdb6p-2f
#define EXP_C2     0x1.555e66p-3f
#define EXP_C3     0x1.573e2ep-5f
#define EXP_C4     0x1.0e4020p-7f

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// One lane, operation for operation the vector code below.
static float expf_lane(float x) {
    const float z = fmaf(x, EXP_LOG2E, EXP_SHIFT);
    const float n = z - EXP_SHIFT;
    const float b = fmaf(-n, EXP_LN2_LO, fmaf(-n, EXP_LN2_HI, x));
    const uint32_t e = f2u(z) << 23;
    const float k = u2f(e + f2u(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(EXP_C4, b, EXP_C3), u, fmaf(EXP_C2, b, EXP_C1)), u, EXP_C0 * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(j, k, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = u2f(g + 0x7f000000u);
    const float s2 = u2f(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

#ifdef HAVE_AVX2
static inline __m256 expf8(__m256 x) {
    const __m256 shift = _mm256_set1_ps(EXP_SHIFT);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(EXP_LOG2E), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k =
        _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(absn, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 hi = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C4), b, _mm256_set1_ps(EXP_C3));
    const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C2), b, _mm256_set1_ps(EXP_C1));
    const __m256 j =
        _mm256_fmadd_ps(_mm256_fmadd_ps(hi, u, lo), u, _mm256_mul_ps(_mm256_set1_ps(EXP_C0), b));
    const __m256 normal = _mm256_fmadd_ps(j, k, k);
    if (!_mm256_movemask_ps(big)) return normal;
    const __m256i g =
        _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                         _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    __m256 r = _mm256_blendv_ps(normal, scaled, big);
    return _mm256_blendv_ps(r, _mm256_mul_ps(s1, s1), huge);
}
#endif

void pg_lc_expf(float *y, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef HAVE_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, expf8(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = expf_lane(x[i]);
}

// --- SwiGLU ----------------------------------------------------------------------------

void pg_lc_swiglu_row(float *out, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    // ggml_v_silu: x / (1 + expf(-x)) with the vector expf, then * up.
    for (; i + 8 <= n; i += 8) {
#ifdef HAVE_AVX2
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 ex = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), ex));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
#else
        for (int k = 0; k < 8; k++) {
            float x = g[i + k];
            out[i + k] = x / (1.0f + expf_lane(0.0f - x)) * u[i + k];
        }
#endif
    }
    // ggml's scalar tail: ggml_silu_f32 with libm's expf.
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// --- GeGLU ------------------------------------------------------------------------------
//
// ggml-cpu builds the table once (ggml_cpu_init): for every fp16 code h,
// table[h] = f16(ggml_gelu_f32(f32(h))). gcc contracts the `1 + a*x*x` of
// ggml_gelu_f32 into an fma: checked against the table of llama-cpp-python
// 0.3.36's libggml-cpu.so (AVX2 build), all 63,490 non-NaN codes equal with
// the fma, one differs without it. The entries are kept as f32 (exact).

static float gelu_table[1 << 16];

static void gelu_table_init(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) {
        const float x = pg_f16_to_f32((uint16_t)h);
        gelu_table[h] = pg_lc_f16(pg_lc_gelu_f32(x));
    }
}

static const float *gelu_lut(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, gelu_table_init);
    return gelu_table;
}

float pg_lc_gelu_f32(float x) {
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f, coef_a = 0.044715f;
    const float inner = fmaf(coef_a * x, x, 1.0f);
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * inner));
}

static inline float gelu_lookup(const float *lut, float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return lut[pg_lc_f16_bits(x)];
}

float pg_lc_gelu(float x) {
    return gelu_lookup(gelu_lut(), x);
}

void pg_lc_geglu_row(float *out, const float *g, const float *u, int64_t n) {
    const float *lut = gelu_lut();
    for (int64_t i = 0; i < n; i++) out[i] = gelu_lookup(lut, g[i]) * u[i];
}

// --- ggml_vec_dot_f16 -----------------------------------------------------------------

float pg_lc_dot_f16_reduce(const float a[32]) {
    float x[8];
    for (int l = 0; l < 8; l++) x[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

float pg_lc_dot_f16(const float *x, const float *y, int64_t n) {
    float a[32] = {0};
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
        for (int c = 0; c < 32; c++) a[c] = fmaf(x[i + c], y[i + c], a[c]);
    double sum = (double)pg_lc_dot_f16_reduce(a);
    for (int64_t i = np; i < n; i++) sum += (double)(x[i] * y[i]);
    return (float)sum;
}

// --- RoPE -------------------------------------------------------------------------------

void pg_lc_rope_cache(int32_t pos, float theta_scale, int32_t half, float *cs) {
    float theta = (float)pos;
    for (int32_t i = 0; i < half; i++) {
        cs[2 * i] = cosf(theta);
        cs[2 * i + 1] = sinf(theta);
        theta *= theta_scale;
    }
}

void pg_lc_rope_row(float *x, int32_t half, const float *cs) {
    for (int32_t i = 0; i < half; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float x0 = x[i], x1 = x[i + half];
        // gcc's contraction of ggml's x0*cos - x1*sin and x0*sin + x1*cos.
        const float x1s = x1 * s, x1c = x1 * c;
        x[i] = fmaf(x0, c, -x1s);
        x[i + half] = fmaf(x0, s, x1c);
    }
}

// --- softmax ------------------------------------------------------------------------------

void pg_lc_softmax_row(float *p, const float *s, int64_t n) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) max = s[i] > max ? s[i] : max;
    double sum = 0.0;
    for (int64_t c = 0; c < n; c += 8) {
        // One chunk of llama.cpp's padded row: masked positions are 0.
        float x[8], e[8];
        for (int k = 0; k < 8; k++) x[k] = c + k < n ? s[c + k] - max : -INFINITY;
        pg_lc_expf(e, x, 8);
        for (int k = 0; k < 8; k++)
            if (c + k < n) p[c + k] = e[k];
        sum += (double)pg_lc_hsum8(e);
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) p[i] *= inv;
}
