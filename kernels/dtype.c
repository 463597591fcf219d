// kernels/dtype.c - element types of weight tensors, and dequantization.
//
// Block layouts follow GGML (ggml/src/ggml-common.h); every multi-byte field
// is little-endian and blocks are packed (no padding), so fields are read
// with memcpy and a block may start at any address. The arithmetic follows
// GGML's reference dequantizers operation by operation, so with floating
// point contraction off (gcc's default under -std=c11) the results are
// bit-identical to ggml and to gguf-py (tests/unit/test_dtype.c checks this).
#include "kernels/dtype.h"

#include <math.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common/err.h"
#include "common/half.h"

// Results must not depend on the compiler fusing a*b+c into an fma: gcc
// does not contract under -std=c11, clang needs telling (gcc warns about
// this pragma, hence the guard).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kernels/dtype.c reads little-endian blocks with plain loads"
#endif

// Elements per super-block of the K-quants.
#define QK_K 256

// --- type table -------------------------------------------------------------

typedef struct {
    const char *name;
    int block_elems;    // 0: known to GGML but not supported here
    size_t block_bytes; // 0: idem
} dtype_info;

// Indexed by GGML type number. Names of the GGML types we cannot read are
// kept so that an error message can say "q2_K" rather than "type 10".
static const dtype_info dtype_table[] = {
    [PG_DTYPE_F32] = {"f32", 1, 4},
    [PG_DTYPE_F16] = {"f16", 1, 2},
    [PG_DTYPE_Q4_0] = {"q4_0", 32, 2 + 16},
    [PG_DTYPE_Q4_1] = {"q4_1", 32, 2 + 2 + 16},
    [PG_DTYPE_Q5_0] = {"q5_0", 32, 2 + 4 + 16},
    [PG_DTYPE_Q5_1] = {"q5_1", 32, 2 + 2 + 4 + 16},
    [PG_DTYPE_Q8_0] = {"q8_0", 32, 2 + 32},
    [9] = {"q8_1", 0, 0},
    [10] = {"q2_K", 0, 0},
    [11] = {"q3_K", 0, 0},
    [PG_DTYPE_Q4_K] = {"q4_K", QK_K, 2 + 2 + 12 + QK_K / 2},
    [PG_DTYPE_Q5_K] = {"q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2},
    [PG_DTYPE_Q6_K] = {"q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2},
    [15] = {"q8_K", 0, 0},
    [16] = {"iq2_xxs", 0, 0},
    [17] = {"iq2_xs", 0, 0},
    [18] = {"iq3_xxs", 0, 0},
    [19] = {"iq1_s", 0, 0},
    [20] = {"iq4_nl", 0, 0},
    [21] = {"iq3_s", 0, 0},
    [22] = {"iq2_s", 0, 0},
    [23] = {"iq4_xs", 0, 0},
    [24] = {"i8", 0, 0},
    [25] = {"i16", 0, 0},
    [PG_DTYPE_I32] = {"i32", 0, 0},
    [27] = {"i64", 0, 0},
    [28] = {"f64", 0, 0},
    [29] = {"iq1_m", 0, 0},
    [PG_DTYPE_BF16] = {"bf16", 1, 2},
    [PG_DTYPE_FP8_E4M3] = {"fp8_e4m3", 1, 1},
    [PG_DTYPE_INT4_G128] = {"int4_g128", PG_INT4_GROUP, PG_INT4_BLOCK_BYTES},
    [PG_DTYPE_INT4_G64] = {"int4_g64", 64, PG_INT4_BLOCK_BYTES_G(64)},
};
_Static_assert(sizeof dtype_table / sizeof dtype_table[0] == PG_DTYPE_COUNT,
               "dtype_table must cover every type number below PG_DTYPE_COUNT");

static const dtype_info *dtype_get(int dtype) {
    if (dtype < 0 || dtype >= PG_DTYPE_COUNT) return NULL;
    return &dtype_table[dtype];
}

int pg_dtype_block_elems(int dtype) {
    const dtype_info *t = dtype_get(dtype);
    return t ? t->block_elems : 0;
}

size_t pg_dtype_block_bytes(int dtype) {
    const dtype_info *t = dtype_get(dtype);
    return t ? t->block_bytes : 0;
}

const char *pg_dtype_name(int dtype) {
    const dtype_info *t = dtype_get(dtype);
    return t && t->name ? t->name : "unknown";
}

size_t pg_dtype_row_bytes(int dtype, int64_t n) {
    const dtype_info *t = dtype_get(dtype);
    if (!t || t->block_elems == 0 || n < 0 || n % t->block_elems != 0) return 0;
    uint64_t blocks = (uint64_t)n / (uint64_t)t->block_elems;
    if (blocks > SIZE_MAX / t->block_bytes) return 0; // would overflow size_t
    return (size_t)blocks * t->block_bytes;
}

// --- little-endian field readers ---------------------------------------------

// The hosts we build for are little-endian (x86-64), so a memcpy load is
// the file's byte order.
static inline uint16_t rd_u16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

// One fp16 scale. F16C's conversion is exact, like the portable one (they
// differ only in quieting signalling NaNs, which no valid scale is).
static inline float rd_f16(const uint8_t *p) {
#if defined(__F16C__)
    return _cvtsh_ss(rd_u16(p));
#else
    return pg_f16_to_f32(rd_u16(p));
#endif
}

// --- plain types ---------------------------------------------------------------

static void dequant_f32(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void dequant_f16(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    // F16C converts exactly (every fp16 value, subnormals and NaN payloads
    // included, is representable in fp32), so it matches the scalar path.
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + 2 * i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    // F16C turns signalling NaNs into quiet ones; do the same here so a row
    // converts identically whatever its length.
    for (; i < n; i++) {
        float f = pg_f16_to_f32(rd_u16(src + 2 * i));
        uint32_t u;
        memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
        memcpy(&dst[i], &u, 4);
    }
}

static void dequant_bf16(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    // bf16 is the top half of an f32: widen and shift, 8 at a time.
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 2 * i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
#endif
    for (; i < n; i++) {
        uint32_t u = (uint32_t)rd_u16(src + 2 * i) << 16;
        memcpy(&dst[i], &u, 4);
    }
}

// --- 32-element blocks ---------------------------------------------------------

// Q4_0: {fp16 d; uint8 qs[16]}. Element j is the low nibble of qs[j] for
// j < 16 and the high nibble of qs[j-16] after that: x = (q - 8) * d.
static void dequant_q4_0(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 18, dst += 32) {
        const float d = rd_f16(src);
        const uint8_t *qs = src + 2;
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)((qs[j] & 0x0f) - 8) * d;
            dst[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

// Q4_1: {fp16 d; fp16 m; uint8 qs[16]}, nibbles as Q4_0: x = q * d + m.
static void dequant_q4_1(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 20, dst += 32) {
        const float d = rd_f16(src);
        const float m = rd_f16(src + 2);
        const uint8_t *qs = src + 4;
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)(qs[j] & 0x0f) * d + m;
            dst[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

// Q5_0 and Q5_1 add a fifth bit to Q4_0's nibbles: bit j of the 32-bit
// little-endian qh is bit 4 of element j (elements 0..15 take the low
// nibbles, 16..31 the high ones, as in Q4_0).
static inline uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

// Q5_0: {fp16 d; uint8 qh[4]; uint8 qs[16]}: x = (q - 16) * d.
static void dequant_q5_0(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 22, dst += 32) {
        const float d = rd_f16(src);
        const uint32_t qh = rd_u32(src + 2);
        const uint8_t *qs = src + 6;
        for (int j = 0; j < 16; j++) {
            const int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = (float)(lo - 16) * d;
            dst[j + 16] = (float)(hi - 16) * d;
        }
    }
}

// Q5_1: {fp16 d; fp16 m; uint8 qh[4]; uint8 qs[16]}: x = q * d + m.
static void dequant_q5_1(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 24, dst += 32) {
        const float d = rd_f16(src);
        const float m = rd_f16(src + 2);
        const uint32_t qh = rd_u32(src + 4);
        const uint8_t *qs = src + 8;
        for (int j = 0; j < 16; j++) {
            const int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = (float)lo * d + m;
            dst[j + 16] = (float)hi * d + m;
        }
    }
}

// Q8_0: {fp16 d; int8 qs[32]}: x = q * d.
static void dequant_q8_0(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 34, dst += 32) {
        const float d = rd_f16(src);
        const int8_t *qs = (const int8_t *)(src + 2);
        for (int j = 0; j < 32; j++) dst[j] = (float)qs[j] * d;
    }
}

// --- K-quants (256-element super-blocks) -----------------------------------------

// Q4_K and Q5_K pack eight 6-bit scales and eight 6-bit mins in 12 bytes:
// bytes 0-3 hold the low 6 bits of scales 0-3 (top 2 bits: high bits of
// scales 4-7), bytes 4-7 the same for mins, bytes 8-11 the low nibbles of
// scales 4-7 (low half) and mins 4-7 (high half).
static void kquant_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// Q4_K: {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qs[128]}. Eight
// sub-blocks of 32; each 64-element chunk takes 32 bytes of qs, low nibbles
// first: x = (d * sc) * q - (dmin * m).
static void dequant_q4_k(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; b++, src += 144) {
        const float d = rd_f16(src);
        const float dmin = rd_f16(src + 2);
        const uint8_t *scales = src + 4;
        const uint8_t *qs = src + 16;
        for (int j = 0; j < 8; j += 2, qs += 32, dst += 64) {
            uint8_t sc, m;
            kquant_scale_min(scales, j, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            kquant_scale_min(scales, j + 1, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) {
                dst[l] = d1 * (float)(qs[l] & 0x0f) - m1;
                dst[l + 32] = d2 * (float)(qs[l] >> 4) - m2;
            }
        }
    }
}

// Q5_K: {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}:
// Q4_K plus a fifth bit per element: bit (2c) of qh[l] for the low-nibble
// half of 64-element chunk c, bit (2c+1) for the high-nibble half.
static void dequant_q5_k(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; b++, src += 176) {
        const float d = rd_f16(src);
        const float dmin = rd_f16(src + 2);
        const uint8_t *scales = src + 4;
        const uint8_t *qh = src + 16;
        const uint8_t *qs = src + 48;
        for (int j = 0; j < 8; j += 2, qs += 32, dst += 64) {
            uint8_t sc, m;
            kquant_scale_min(scales, j, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            kquant_scale_min(scales, j + 1, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const int sh = j; // chunk j/2 uses qh bits j and j+1
            for (int l = 0; l < 32; l++) {
                int q1 = (qs[l] & 0x0f) | (((qh[l] >> sh) & 1) << 4);
                int q2 = (qs[l] >> 4) | (((qh[l] >> (sh + 1)) & 1) << 4);
                dst[l] = d1 * (float)q1 - m1;
                dst[l + 32] = d2 * (float)q2 - m2;
            }
        }
    }
}

// Q6_K: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d}. Two halves
// of 128 elements; in each, element l + 32k (l < 32, k < 4) takes 4 low bits
// from ql (nibble k/2 of ql[l + 32*(k%2)]) and 2 high bits from qh[l] (bits
// 2k..2k+1), offset by -32; sub-blocks of 16 share one int8 scale:
// x = (d * scale) * q.
static void dequant_q6_k(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; b++, src += 210) {
        const uint8_t *ql = src;
        const uint8_t *qh = src + 128;
        const int8_t *sc = (const int8_t *)(src + 192);
        const float d = rd_f16(src + 208);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, dst += 128) {
            // l < 16 uses scales 0,2,4,6 and l >= 16 scales 1,3,5,7: two
            // loops with the scales hoisted, which gcc vectorizes.
            for (int is = 0; is < 2; is++) {
                const float s1 = d * (float)sc[is + 0], s2 = d * (float)sc[is + 2];
                const float s3 = d * (float)sc[is + 4], s4 = d * (float)sc[is + 6];
                for (int l = 16 * is; l < 16 * is + 16; l++) {
                    int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    dst[l] = s1 * (float)q1;
                    dst[l + 32] = s2 * (float)q2;
                    dst[l + 64] = s3 * (float)q3;
                    dst[l + 96] = s4 * (float)q4;
                }
            }
        }
    }
}

// --- paged's quantized types (kernels/dtype.h) -----------------------------------

float pg_fp8_e4m3_to_f32(uint8_t v) {
    const int e = (v >> 3) & 15, mant = v & 7;
    float a;
    if (e == 15 && mant == 7) a = NAN;
    else if (e == 0) a = ldexpf((float)mant, -9); // subnormal: mant * 2^-6 / 8
    else a = ldexpf((float)(8 + mant), e - 10);   // (1 + mant / 8) * 2^(e - 7)
    return (v & 0x80) ? -a : a;
}

uint8_t pg_f32_to_fp8_e4m3(float x) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (isnan(a)) return sign | 0x7f;
    if (a >= PG_FP8_E4M3_MAX) return sign | 0x7e;
    if (a < 0x1p-6f) {
        // Subnormals step by 2^-9; q == 8 is the smallest normal, whose code
        // (exponent 1, mantissa 0) is also 8.
        return sign | (uint8_t)rintf(a * 512.0f);
    }
    int e;
    frexpf(a, &e); // a = f * 2^e, f in [0.5, 1): the unbiased exponent is e - 1
    int E = e - 1;
    int q = (int)rintf(ldexpf(a, 3 - E)) - 8; // mantissa steps of 1/8, exact up to rint
    if (q == 8) E++, q = 0;
    int code = ((E + 7) << 3) | q;
    if (code > 0x7e) code = 0x7e; // cannot happen below 448; kept as a guard
    return sign | (uint8_t)code;
}

void pg_quantize_row_fp8(const float *x, int64_t n, uint8_t *q, float *scale) {
    float amax = 0;
    for (int64_t j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float s = amax > 0 ? amax / PG_FP8_E4M3_MAX : 1.0f;
    const float inv = 1.0f / s;
    for (int64_t j = 0; j < n; j++) q[j] = pg_f32_to_fp8_e4m3(x[j] * inv);
    *scale = s;
}

void pg_quantize_row_int4(const float *x, int64_t n, int G, void *dst) {
    PG_CHECK((G == 64 || G == 128) && n % G == 0);
    uint8_t *o = dst;
    for (int64_t g = 0; g < n / G; g++, x += G, o += PG_INT4_BLOCK_BYTES_G(G)) {
        float mx = x[0], mn = x[0];
        for (int j = 1; j < G; j++) mx = fmaxf(mx, x[j]), mn = fminf(mn, x[j]);
        float d = (mx - mn) / 15.0f;
        if (d < 1e-5f) d = 1e-5f;
        const uint16_t dh = pg_f32_to_f16(d);
        d = pg_f16_to_f32(dh); // quantize against the scale as stored
        float zf = -rintf(mn / d);
        int z = zf < 0 ? 0 : zf > 15 ? 15 : (int)zf;
        memcpy(o, &dh, 2);
        o[2] = (uint8_t)z;
        o[3] = 0;
        uint8_t *qs = o + 4;
        memset(qs, 0, (size_t)G / 2);
        for (int j = 0; j < G; j++) {
            float qf = rintf(x[j] / d) + (float)z;
            int q = qf < 0 ? 0 : qf > 15 ? 15 : (int)qf;
            const int run = j / 32, k = j % 32;
            qs[16 * run + (k & 15)] |= (uint8_t)(k < 16 ? q : q << 4);
        }
    }
}

static void dequant_fp8_e4m3(const uint8_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = pg_fp8_e4m3_to_f32(src[i]);
}

// INT4_G128 / INT4_G64 (groups of G): see kernels/dtype.h for the block.
static void dequant_int4(const uint8_t *restrict src, float *restrict dst, int64_t n, int G) {
    for (int64_t b = 0; b < n / G; b++, src += PG_INT4_BLOCK_BYTES_G(G), dst += G) {
        const float d = rd_f16(src);
        const int z = src[2];
        const uint8_t *qs = src + 4;
        for (int run = 0; run < G / 32; run++)
            for (int j = 0; j < 16; j++) {
                dst[32 * run + j] = (float)((qs[16 * run + j] & 0x0f) - z) * d;
                dst[32 * run + 16 + j] = (float)((qs[16 * run + j] >> 4) - z) * d;
            }
    }
}

// --- dispatch ------------------------------------------------------------------

void pg_dequantize_row(int dtype, const void *src, float *dst, int64_t n) {
    // Callers validate types and shapes at load time (gguf_open rejects
    // anything else), so a bad call here is a bug, not bad input.
    int be = pg_dtype_block_elems(dtype);
    PG_CHECK(be > 0 && n >= 0 && n % be == 0);
    const uint8_t *s = src;
    switch (dtype) {
    case PG_DTYPE_F32: dequant_f32(s, dst, n); break;
    case PG_DTYPE_F16: dequant_f16(s, dst, n); break;
    case PG_DTYPE_BF16: dequant_bf16(s, dst, n); break;
    case PG_DTYPE_Q4_0: dequant_q4_0(s, dst, n); break;
    case PG_DTYPE_Q4_1: dequant_q4_1(s, dst, n); break;
    case PG_DTYPE_Q5_0: dequant_q5_0(s, dst, n); break;
    case PG_DTYPE_Q5_1: dequant_q5_1(s, dst, n); break;
    case PG_DTYPE_Q8_0: dequant_q8_0(s, dst, n); break;
    case PG_DTYPE_Q4_K: dequant_q4_k(s, dst, n); break;
    case PG_DTYPE_Q5_K: dequant_q5_k(s, dst, n); break;
    case PG_DTYPE_Q6_K: dequant_q6_k(s, dst, n); break;
    case PG_DTYPE_FP8_E4M3: dequant_fp8_e4m3(s, dst, n); break;
    case PG_DTYPE_INT4_G128: dequant_int4(s, dst, n, 128); break;
    case PG_DTYPE_INT4_G64: dequant_int4(s, dst, n, 64); break;
    default: PG_CHECK(0); // unreachable: every type with a block size has a case
    }
}
