// kernels/cpu/kquant_dot.c - K-quant (Q4_K, Q5_K, Q6_K) weights times Q8_K
// activations, numerically llama.cpp's CPU backend (the arithmetic is
// spelled out in quant_dot.h; Q5_K's scalar reference is kquant_q5k.c).
#include "kernels/cpu/quant_dot.h"

#include <math.h>
#include <string.h>

#include "common/err.h"
#include "common/half.h"
#include "kernels/cpu/kquant_internal.h" // Q5_K reference, shared scale unpacking
#include "kernels/cpu/simd_util.h"       // ld32, hsum8 (AVX2 builds)
#include "kernels/dtype.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

// --- scalar reference -------------------------------------------------------------------
//
// Compiled in every build: the kernels of a build without AVX2, and what the
// tests hold the AVX2 kernels to, bit for bit. The integer lanes are exact
// whatever the instructions; the float steps are the same fmaf/adds ggml's
// AVX2 vec_dot_q4_K_q8_K / vec_dot_q6_K_q8_K do per lane.

bool pg_kdot_supported(int dtype) {
    return dtype == PG_DTYPE_Q4_K || dtype == PG_DTYPE_Q5_K || dtype == PG_DTYPE_Q6_K;
}

// Round half to even by adding 1.5 * 2^23 (|v| < 2^22): the f32 addition
// rounds, the low mantissa bits are the integer (how ggml's nearest_int
// rounds).
static inline int round_magic(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

void pg_q8k_quantize_row_ref(const float *x, int64_t cols, pg_q8k_block *y) {
    PG_CHECK(cols % QK_K_ELEMS == 0);
    for (int64_t b = 0; b < cols / QK_K_ELEMS; b++, x += QK_K_ELEMS, y++) {
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < QK_K_ELEMS; j++) {
            float a = fabsf(x[j]);
            if (a > amax) {
                amax = a;
                mx = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(y, 0, sizeof *y);
            continue;
        }
        const float iscale = -127.f / mx;
        for (int j = 0; j < QK_K_ELEMS; j++) {
            int q = round_magic(iscale * x[j]);
            y->qs[j] = (int8_t)(q < 127 ? q : 127);
        }
        for (int k = 0; k < QK_K_ELEMS / 16; k++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y->qs[16 * k + j];
            y->bsums[k] = (int16_t)s;
        }
        y->d = 1 / iscale;
    }
}

// Chunk c (elements 64c..64c+63) of a Q4_K block (nibbles qs) against its
// Q8_K block, each half times its sub-block scale; exact in int32.
static int32_t q4k_chunk(const uint8_t *qs, const pg_q8k_block *y, const int sc[8], int c) {
    const uint8_t *q = qs + 32 * c;
    const int8_t *xl = y->qs + 64 * c, *xh = xl + 32;
    int lo = 0, hi = 0;
    for (int e = 0; e < 32; e++) {
        lo += (q[e] & 15) * xl[e];
        hi += (q[e] >> 4) * xh[e];
    }
    return sc[2 * c] * lo + sc[2 * c + 1] * hi;
}

static float q4k_dot(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc[8] = {0}, accm[4] = {0};
    for (int64_t b = 0; b < nb; b++, w += Q4_K_BYTES, y++) {
        int sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const uint8_t *qs = w + 16;
        int32_t lane[8] = {0};
        for (int c = 0; c < 4; c++) { // 64 elements: low nibbles, then high
            const uint8_t *q = qs + 32 * c;
            const int8_t *xl = y->qs + 64 * c, *xh = xl + 32;
            for (int l = 0; l < 8; l++) {
                int lo = 0, hi = 0;
                for (int e = 4 * l; e < 4 * l + 4; e++) {
                    lo += (q[e] & 15) * xl[e];
                    hi += (q[e] >> 4) * xh[e];
                }
                lane[l] += sc[2 * c] * lo + sc[2 * c + 1] * hi;
            }
        }
        q45k_vec_block(w, y, mn, lane, false, acc, accm);
    }
    return q45k_vec_result(acc, accm, false);
}

static float q6k_dot(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, w += Q6_K_BYTES, y++) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        const float d = y->d * pg_f16_to_f32(ld16(w + 208));
        int32_t lane[8];
        for (int l = 0; l < 8; l++)
            lane[l] = -32 * (y->bsums[2 * l] * sc[2 * l] + y->bsums[2 * l + 1] * sc[2 * l + 1]);
        for (int h = 0; h < 2; h++) { // 128 elements: 4 chunks of 32
            const uint8_t *l0 = ql + 64 * h, *hb = qh + 32 * h;
            for (int c = 0; c < 4; c++) {
                const int8_t *x = y->qs + 128 * h + 32 * c;
                const uint8_t *lo = l0 + 32 * (c & 1);
                const int shift = c < 2 ? 0 : 4;
                for (int l = 0; l < 8; l++) {
                    int s = 0;
                    for (int e = 4 * l; e < 4 * l + 4; e++) {
                        int q = ((lo[e] >> shift) & 15) | (((hb[e] >> (2 * c)) & 3) << 4);
                        s += q * x[e];
                    }
                    lane[l] += sc[8 * h + 2 * c + (l >= 4)] * s;
                }
            }
        }
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    return hsum8_lanes(acc);
}

// One Q4_K block against its Q8_K block as integers: the whole dot of the
// codes times their sub-block scales (*s1) and the whole mins term (*s2).
static void q4k_block_ints(const uint8_t *w, const pg_q8k_block *y, int32_t *s1, int32_t *s2) {
    int sc[8], mn[8];
    q4k_scales(w + 4, sc, mn);
    *s2 = q4k_mins(mn, y);
    int32_t sum = 0;
    for (int c = 0; c < 4; c++) sum += q4k_chunk(w + 16, y, sc, c);
    *s1 = sum;
}

// Q4_K as ggml's repacked q4_K_8x8 kernels (AVX2 ggml_gemv/gemm_q4_K_8x8_q8_K)
// sum it: one f32 chain per (weight row, activation row) over blocks, the
// block's whole integer dot and its whole mins term each converted once.
static float q4k_dot_8x8(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q4_K_BYTES, y++) {
        int32_t sumi, summ;
        q4k_block_ints(w, y, &sumi, &summ);
        acc = fmaf((float)sumi, pg_f16_to_f32(ld16(w)) * y->d, acc);
        accm = fmaf((float)summ, pg_f16_to_f32(ld16(w + 2)) * y->d, accm);
    }
    return acc - accm;
}

// Q4_K as the repack's AVX2 gemm (ggml_gemm_q4_K_8x8_q8_K, activation rows
// 4 at a time) sums it: the same integers, but the products and the mins
// of each pair of sub-blocks (64 elements) are converted and accumulated
// on their own: 4 fmas per block in each chain.
static float q4k_dot_8x8_gemm(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q4_K_BYTES, y++) {
        int sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const uint8_t *qs = w + 16;
        const float dd = pg_f16_to_f32(ld16(w)) * y->d, dm = pg_f16_to_f32(ld16(w + 2)) * y->d;
        for (int c = 0; c < 4; c++) {
            const int32_t summ = mn[2 * c] * (y->bsums[4 * c] + y->bsums[4 * c + 1]) +
                                 mn[2 * c + 1] * (y->bsums[4 * c + 2] + y->bsums[4 * c + 3]);
            acc = fmaf((float)q4k_chunk(qs, y, sc, c), dd, acc);
            accm = fmaf((float)summ, dm, accm);
        }
    }
    return acc - accm;
}

// Q4_K and Q6_K as llama.cpp's "tiled" kernels (ggml-cpu/tiled, AVX2
// tiled_run_microtile_avx2; m >= 8 activation rows, matrices the repack
// does not take) sum them: per block the whole integer dot s1 (Q6_K: the
// codes less 32) and, for Q4_K, the whole mins term s2, then
//   res = f32(d_w) * (float)s1  (Q4_K: res = fma(-f32(dmin_w), (float)s2, res)),
//   acc = fma(res, d_x, acc),
// one f32 chain per output over the blocks (the narrow and the standard
// path, any thread split, keep that order).
static float q4k_dot_tiled(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q4_K_BYTES, y++) {
        int32_t s1, s2;
        q4k_block_ints(w, y, &s1, &s2);
        acc = q45k_tiled_block(w, y, s1, s2, acc);
    }
    return acc;
}

static float q6k_dot_tiled(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q6_K_BYTES, y++) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        int32_t s1 = 0;
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++) {
                const int8_t *x = y->qs + 128 * h + 32 * c;
                const uint8_t *lo = ql + 64 * h + 32 * (c & 1), *hb = qh + 32 * h;
                const int shift = c < 2 ? 0 : 4;
                for (int half = 0; half < 2; half++) { // 16 elements, one scale
                    int s = 0;
                    for (int e = 16 * half; e < 16 * half + 16; e++) {
                        int q = ((lo[e] >> shift) & 15) | (((hb[e] >> (2 * c)) & 3) << 4);
                        s += (q - 32) * x[e];
                    }
                    s1 += sc[8 * h + 2 * c + half] * s;
                }
            }
        acc = fmaf(pg_f16_to_f32(ld16(w + 208)) * (float)s1, y->d, acc);
    }
    return acc;
}

int pg_kdot_order(int dtype, bool rows8, int64_t m, int64_t i) {
    // Q5_K and Q6_K: no repack on AVX2 (llama.cpp's q5_K/q6_K repacks are ARM's).
    if (m >= 8 && (dtype != PG_DTYPE_Q4_K || !rows8)) return PG_KDOT_TILED;
    if (dtype == PG_DTYPE_Q4_K && rows8) return m >= 4 && i < m - m % 4 ? PG_KDOT_8X8_GEMM : PG_KDOT_8X8;
    return PG_KDOT_VEC;
}

float pg_kdot_row_ref(int dtype, const uint8_t *w, const pg_q8k_block *y, int64_t nb, int order) {
    PG_CHECK(pg_kdot_supported(dtype));
    if (dtype == PG_DTYPE_Q4_K)
        return order == PG_KDOT_TILED      ? q4k_dot_tiled(w, y, nb)
               : order == PG_KDOT_8X8_GEMM ? q4k_dot_8x8_gemm(w, y, nb)
               : order == PG_KDOT_8X8      ? q4k_dot_8x8(w, y, nb)
                                           : q4k_dot(w, y, nb);
    if (dtype == PG_DTYPE_Q5_K) return pg_q5k_dot_ref(w, y, nb, order);
    return order == PG_KDOT_TILED ? q6k_dot_tiled(w, y, nb) : q6k_dot(w, y, nb);
}

#ifdef HAVE_AVX2

// --- AVX2 kernels -------------------------------------------------------------------------
//
// The same operations as the reference, 8 or 32 at a time: the integers are
// exact in any order, and every float operation (the product d_x * d_w, the
// fma per lane or per output, the final sums) is the reference's, in its
// order. Tiles of W weight rows x R activation rows share each unpacked
// weight chunk and each activation chunk; every (weight row, activation row)
// pair keeps its own accumulators, so the tiling never changes a bit.

#define ALWAYS_INLINE inline __attribute__((always_inline))

// Lane totals of 8 int32 vectors: lane k of the result sums v[k]'s 8 lanes.
static ALWAYS_INLINE __m256i hsum_8x8_epi32(const __m256i v[8]) {
    // hadd(hadd(a, b), hadd(c, d)) = [a lo, b lo, c lo, d lo | a hi, ...]
    // (lo/hi: the sums of lanes 0..3 and 4..7).
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

// --- Q8_K quantizer ------------------------------------------------------------------

// One block, bit for bit the reference's, NaN and infinities included: the
// largest |x| by max (NaN lanes lose, as they fail the reference's `>`),
// the first element of that magnitude, then round_magic's own operations
// (add 1.5 * 2^23, take the mantissa bits) and a truncating narrowing.
static void q8k_block(const float *x, pg_q8k_block *y) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < QK_K_ELEMS; k += 8)
        mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), mx);
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(mx, 1), _mm256_castps256_ps128(mx));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    if (amax == 0.0f) {
        memset(y, 0, sizeof *y);
        return;
    }
    const __m256 am = _mm256_set1_ps(amax);
    int first = 0;
    for (int k = 0; k < QK_K_ELEMS; k += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(a, am, _CMP_EQ_OQ));
        if (hit) {
            first = k + __builtin_ctz((unsigned)hit);
            break;
        }
    }
    const float iscale = -127.f / x[first];
    const __m256 is = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f);
    const __m256i mant = _mm256_set1_epi32(0x007fffff), half = _mm256_set1_epi32(0x00400000);
    const __m256i top = _mm256_set1_epi32(127), low8 = _mm256_set1_epi32(0xff);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i part[8]; // per 32 elements: 4-element sums of the stored int8 q
    for (int c = 0; c < 8; c++) {
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            // A product, then an add: two roundings, like the reference
            // (-std=c11 keeps gcc from contracting them into an fma).
            __m256 t = _mm256_add_ps(_mm256_mul_ps(is, _mm256_loadu_ps(x + 32 * c + 8 * k)), magic);
            __m256i i = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), mant), half);
            // min(127, q), then its low byte: the reference's (int8_t) cast.
            q[k] = _mm256_and_si256(_mm256_min_epi32(i, top), low8);
        }
        // 0..255 values: the unsigned packs keep them; they work per 128-bit
        // half, so a dword permutation restores element order.
        __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]), _mm256_packus_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(y->qs + 32 * c), p);
        part[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
    }
    // Lanes 0..3 of part[c] hold elements 32c..32c+15 (bsums[2c]), lanes
    // 4..7 the next 16 (bsums[2c + 1]); two rounds of hadd sum them.
    __m256i e = _mm256_hadd_epi32(_mm256_hadd_epi32(part[0], part[1]), _mm256_hadd_epi32(part[2], part[3]));
    __m256i f = _mm256_hadd_epi32(_mm256_hadd_epi32(part[4], part[5]), _mm256_hadd_epi32(part[6], part[7]));
    // e = [b0 b2 b4 b6 | b1 b3 b5 b7], f = [b8 b10 b12 b14 | b9 b11 b13 b15]
    __m256i s = _mm256_packs_epi32(e, f); // [b0 b2 .. b14 | b1 b3 .. b15] (int16)
    __m128i ev = _mm256_castsi256_si128(s), od = _mm256_extracti128_si256(s, 1);
    _mm_storeu_si128((__m128i *)y->bsums, _mm_unpacklo_epi16(ev, od));
    _mm_storeu_si128((__m128i *)(y->bsums + 8), _mm_unpackhi_epi16(ev, od));
    y->d = 1 / iscale;
}

void pg_q8k_quantize_row(const float *x, int64_t cols, pg_q8k_block *y) {
    PG_CHECK(cols % QK_K_ELEMS == 0);
    for (int64_t b = 0; b < cols / QK_K_ELEMS; b++) q8k_block(x + b * QK_K_ELEMS, y + b);
}

// --- dot products ---------------------------------------------------------------------

// q4k_dot, q4k_dot_8x8, q4k_dot_8x8_gemm, q4k_dot_tiled, q6k_dot, q6k_dot_tiled,
// and kquant_q5k.c's q5k_dot, q5k_dot_tiled
enum { KQ4, KQ4_8X8, KQ4_GEMM, KQ4_TILED, KQ6, KQ6_TILED, KQ5, KQ5_TILED };
#define KT_MAX_W 4
#define KT_MAX_R 4

// Q4_K's 12 bytes of 6-bit values as int16: scales 0..7 in both 128-bit
// halves of *sc, mins 0..7 in *mn (q4k_scales' rule, 4 bytes at a time).
static ALWAYS_INLINE void q4k_scales_mins(const uint8_t *p, __m256i *sc, __m128i *mn) {
    const uint32_t u0 = ld32(p), u1 = ld32(p + 4), u2 = ld32(p + 8);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, hi2 = 0x30303030;
    const __m128i b = _mm_setr_epi32((int)(u0 & m6), (int)((u2 & m4) | ((u0 >> 2) & hi2)),
                                     (int)(u1 & m6), (int)(((u2 >> 4) & m4) | ((u1 >> 2) & hi2)));
    const __m256i v = _mm256_cvtepu8_epi16(b); // scales 0..7 | mins 0..7
    *sc = _mm256_permute2x128_si256(v, v, 0x00);
    *mn = _mm256_extracti128_si256(v, 1);
}

// int16 element s (0..7) of each 128-bit half, in every int16 of that half.
static ALWAYS_INLINE __m256i bcast16(__m256i v, int s) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * s)));
}

// Q6_K: int8 scales k (elements 0..15 of a 32-element chunk) and k + 1
// (elements 16..31) as int16, one per 128-bit half.
static ALWAYS_INLINE __m256i q6k_scale_pair(__m128i sc8, int k) {
    const long long one = 0x0101010101010101LL;
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, _mm_set_epi64x(one * (k + 1), one * k)));
}

// Q6_K: 32 weights 0..63 of chunk c of half h (the reference's
// ((lo >> shift) & 15) | ((hb >> 2c) & 3) << 4, per byte).
static ALWAYS_INLINE __m256i q6k_chunk(const uint8_t *blk, int h, int c) {
    __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (c & 1)));
    if (c >= 2) lo = _mm256_srli_epi16(lo, 4);
    lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0f));
    __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    // bits 2c, 2c + 1 of each byte to bits 4, 5 (16-bit shifts: the mask
    // keeps only bits that stayed in their byte)
    hb = c == 0 ? _mm256_slli_epi16(hb, 4)
         : c == 1 ? _mm256_slli_epi16(hb, 2)
         : c == 2 ? hb
                  : _mm256_srli_epi16(hb, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
}

// Q5_K: the fifth bits of sub-block s (bit s of each qh byte) at bit 4 of
// each byte (16-bit shifts: the mask keeps only bits that stayed in their
// byte).
static ALWAYS_INLINE __m256i q5k_hbits(__m256i qh, int s) {
    const __m256i b = s <= 4 ? _mm256_slli_epi16(qh, 4 - s) : _mm256_srli_epi16(qh, s - 4);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

// out[r * ldo + a] for weight rows a < W (rows rb bytes apart from w) and
// activation rows r < R (blocks x + r * nb), each the reference's result.
static ALWAYS_INLINE void ktile(const int kind, const int W, const int R, const uint8_t *w,
                                size_t rb, const pg_q8k_block *x, int64_t nb, float *out,
                                int64_t ldo) {
    const bool q6 = kind == KQ6 || kind == KQ6_TILED, q5 = kind == KQ5 || kind == KQ5_TILED;
    const size_t bb = q6 ? Q6_K_BYTES : q5 ? Q5_K_BYTES : Q4_K_BYTES;
    const size_t qoff = q5 ? 48 : 16; // Q4_K, Q5_K: the nibbles
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[KT_MAX_W][KT_MAX_R];  // KQ4, KQ6: the 8 lanes of each pair
    __m128 accm[KT_MAX_W][KT_MAX_R]; // KQ4: the 4 mins lanes of each pair; KQ5: summs in lane 0
    // KQ4_8X8, KQ4_GEMM, the tiled kinds: pair a * R + r in lane a * R + r
    __m256 acc8 = _mm256_setzero_ps(), accm8 = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int a = 0; a < W; a++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            acc[a][r] = _mm256_setzero_ps();
            accm[a][r] = _mm_setzero_ps();
        }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + (size_t)b * bb;
        const pg_q8k_block *xb = x + b; // activation row r: xb + r * nb
        __m256i lane[KT_MAX_W][KT_MAX_R];
        // The same block of the next group's rows: decode streams the
        // weights from DRAM, faster than the hardware prefetcher brings them.
#pragma GCC unroll 4
        for (int a = 0; a < W; a++) {
            const char *nx = (const char *)wb + (size_t)(W + a) * rb;
#pragma GCC unroll 4
            for (size_t off = 0; off < bb; off += 64) _mm_prefetch(nx + off, _MM_HINT_T0);
            _mm_prefetch(nx + bb - 1, _MM_HINT_T0);
        }
        if (q6) {
            __m128i sc8[KT_MAX_W];
#pragma GCC unroll 4
            for (int a = 0; a < W; a++) {
                sc8[a] = _mm_loadu_si128((const __m128i *)(wb + a * rb + 192));
                const __m256i sc16 = _mm256_cvtepi8_epi16(sc8[a]);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const __m256i bs = _mm256_loadu_si256((const __m256i *)xb[r * nb].bsums);
                    lane[a][r] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                                  _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
#pragma GCC unroll 4
                    for (int a = 0; a < W; a++) {
                        const __m256i q = q6k_chunk(wb + a * rb, h, c);
                        const __m256i s = q6k_scale_pair(sc8[a], 8 * h + 2 * c);
#pragma GCC unroll 4
                        for (int r = 0; r < R; r++) {
                            const __m256i xv = _mm256_loadu_si256(
                                (const __m256i *)(xb[r * nb].qs + 128 * h + 32 * c));
                            lane[a][r] = _mm256_add_epi32(
                                lane[a][r], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), s));
                        }
                    }
            if (kind == KQ6_TILED) {
                // Whole-block integers of the W * R pairs, one per lane:
                // res = f32(d_w) * s1, then acc = fma(res, d_x, acc).
                __m256i vi[8];
                float dwf[8] = {0}, dxf[8] = {0};
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++) vi[k] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int a = 0; a < W; a++) {
                    const float dw = _cvtsh_ss(ld16(wb + a * rb + 208));
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) {
                        vi[a * R + r] = lane[a][r];
                        dwf[a * R + r] = dw;
                        dxf[a * R + r] = xb[r * nb].d;
                    }
                }
                const __m256 res = _mm256_mul_ps(_mm256_loadu_ps(dwf), _mm256_cvtepi32_ps(hsum_8x8_epi32(vi)));
                acc8 = _mm256_fmadd_ps(res, _mm256_loadu_ps(dxf), acc8);
                continue;
            }
#pragma GCC unroll 4
            for (int a = 0; a < W; a++) {
                const float dw = _cvtsh_ss(ld16(wb + a * rb + 208));
#pragma GCC unroll 4
                for (int r = 0; r < R; r++)
                    acc[a][r] = _mm256_fmadd_ps(_mm256_set1_ps(xb[r * nb].d * dw),
                                                _mm256_cvtepi32_ps(lane[a][r]), acc[a][r]);
            }
            continue;
        }
        // Q4_K, Q5_K
        __m256i sc[KT_MAX_W], qh[KT_MAX_W];
        __m128i mn[KT_MAX_W];
#pragma GCC unroll 4
        for (int a = 0; a < W; a++) {
            q4k_scales_mins(wb + a * rb + 4, &sc[a], &mn[a]);
            if (q5) qh[a] = _mm256_loadu_si256((const __m256i *)(wb + a * rb + 16));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) lane[a][r] = _mm256_setzero_si256();
        }
        if (kind == KQ4_GEMM) {
            // Per pair k = a * R + r: the 4 mins terms (one per 64
            // elements), then per 64 elements the pairs' integer sums, one
            // per lane, and one fma each into acc8 and accm8.
            int32_t mt[4][8] = {{0}};
            float dwf[8] = {0}, dmf[8] = {0}, dxf[8] = {0};
#pragma GCC unroll 4
            for (int a = 0; a < W; a++) {
                const float dw = _cvtsh_ss(ld16(wb + a * rb)), dm = _cvtsh_ss(ld16(wb + a * rb + 2));
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const int k = a * R + r;
                    const __m128i s16 = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)xb[r * nb].bsums),
                                                       _mm_loadu_si128((const __m128i *)(xb[r * nb].bsums + 8)));
                    int32_t t4[4];
                    _mm_storeu_si128((__m128i *)t4, _mm_madd_epi16(mn[a], s16));
                    for (int c = 0; c < 4; c++) mt[c][k] = t4[c];
                    dwf[k] = dw;
                    dmf[k] = dm;
                    dxf[k] = xb[r * nb].d;
                }
            }
            const __m256 dx = _mm256_loadu_ps(dxf);
            const __m256 sd = _mm256_mul_ps(_mm256_loadu_ps(dwf), dx), sm = _mm256_mul_ps(_mm256_loadu_ps(dmf), dx);
            __m256i vi[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) vi[k] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
#pragma GCC unroll 4
                for (int a = 0; a < W; a++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(wb + a * rb + 16 + 32 * c));
                    const __m256i lo = _mm256_and_si256(q, m4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    const __m256i slo = bcast16(sc[a], 2 * c), shi = bcast16(sc[a], 2 * c + 1);
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) {
                        const int8_t *xq = xb[r * nb].qs + 64 * c;
                        const __m256i xl = _mm256_loadu_si256((const __m256i *)xq);
                        const __m256i xh = _mm256_loadu_si256((const __m256i *)(xq + 32));
                        vi[a * R + r] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), slo),
                                                         _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), shi));
                    }
                }
                acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_8x8_epi32(vi)), sd, acc8);
                accm8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)mt[c])), sm, accm8);
            }
            continue;
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
#pragma GCC unroll 4
            for (int a = 0; a < W; a++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(wb + a * rb + qoff + 32 * c));
                __m256i lo = _mm256_and_si256(q, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (q5) {
                    lo = _mm256_or_si256(lo, q5k_hbits(qh[a], 2 * c));
                    hi = _mm256_or_si256(hi, q5k_hbits(qh[a], 2 * c + 1));
                }
                const __m256i slo = bcast16(sc[a], 2 * c), shi = bcast16(sc[a], 2 * c + 1);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const int8_t *xq = xb[r * nb].qs + 64 * c;
                    const __m256i xl = _mm256_loadu_si256((const __m256i *)xq);
                    const __m256i xh = _mm256_loadu_si256((const __m256i *)(xq + 32));
                    lane[a][r] = _mm256_add_epi32(
                        lane[a][r],
                        _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), slo),
                                         _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), shi)));
                }
            }
        // Activation sums of the 8 sub-blocks (bsums in pairs), int16.
        __m128i s16[KT_MAX_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            s16[r] = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)xb[r * nb].bsums),
                                    _mm_loadu_si128((const __m128i *)(xb[r * nb].bsums + 8)));
        if (kind == KQ4 || kind == KQ5) {
            // acc = fma(d_x * f32(d_w), lanes, acc); the mins, fma(-d_x *
            // f32(dmin_w), term, accm) per lane: KQ4 the 4 per-64-element terms
            // (Q4_K's 4 mins lanes), KQ5 their sum (summs, one chain; each
            // lane's fma rounds on its own, so lane 0 is the scalar's).
#pragma GCC unroll 4
            for (int a = 0; a < W; a++) {
                const float dw = _cvtsh_ss(ld16(wb + a * rb)), dm = _cvtsh_ss(ld16(wb + a * rb + 2));
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const float dx = xb[r * nb].d;
                    acc[a][r] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dw),
                                                _mm256_cvtepi32_ps(lane[a][r]), acc[a][r]);
                    __m128i t = _mm_madd_epi16(mn[a], s16[r]);
                    if (kind == KQ5) { // the whole term in every lane (lane 0 is the one read)
                        t = _mm_hadd_epi32(t, t);
                        t = _mm_hadd_epi32(t, t);
                    }
                    accm[a][r] = _mm_fmadd_ps(_mm_set1_ps(-dx * dm), _mm_cvtepi32_ps(t), accm[a][r]);
                }
            }
            continue;
        }
        // KQ4_8X8, KQ4_TILED, KQ5_TILED: whole-block integers of the W * R pairs, one per lane.
        __m256i vi[8], vm[8];
        float dwf[8] = {0}, dmf[8] = {0}, dxf[8] = {0};
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) vi[k] = vm[k] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int a = 0; a < W; a++) {
            const float dw = _cvtsh_ss(ld16(wb + a * rb)), dm = _cvtsh_ss(ld16(wb + a * rb + 2));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int k = a * R + r;
                vi[k] = lane[a][r];
                vm[k] = _mm256_zextsi128_si256(_mm_madd_epi16(mn[a], s16[r]));
                dwf[k] = dw;
                dmf[k] = dm;
                dxf[k] = xb[r * nb].d;
            }
        }
        const __m256 dx = _mm256_loadu_ps(dxf);
        if (kind == KQ4_TILED || kind == KQ5_TILED) {
            // res = fma(-f32(dmin_w), s2, f32(d_w) * s1); acc = fma(res, d_x, acc).
            const __m256 res = _mm256_fnmadd_ps(_mm256_loadu_ps(dmf), _mm256_cvtepi32_ps(hsum_8x8_epi32(vm)),
                                                _mm256_mul_ps(_mm256_loadu_ps(dwf),
                                                              _mm256_cvtepi32_ps(hsum_8x8_epi32(vi))));
            acc8 = _mm256_fmadd_ps(res, dx, acc8);
            continue;
        }
        acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_8x8_epi32(vi)),
                               _mm256_mul_ps(_mm256_loadu_ps(dwf), dx), acc8);
        accm8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_8x8_epi32(vm)),
                                _mm256_mul_ps(_mm256_loadu_ps(dmf), dx), accm8);
    }
    if (kind == KQ4_8X8 || kind == KQ4_GEMM || kind == KQ4_TILED || kind == KQ5_TILED || kind == KQ6_TILED) {
        float res[8];
        _mm256_storeu_ps(res, kind == KQ4_8X8 || kind == KQ4_GEMM ? _mm256_sub_ps(acc8, accm8) : acc8);
#pragma GCC unroll 4
        for (int a = 0; a < W; a++)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) out[r * ldo + a] = res[a * R + r];
        return;
    }
#pragma GCC unroll 4
    for (int a = 0; a < W; a++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float v = hsum8(acc[a][r]);
            if (kind == KQ4) {
                __m128 m = accm[a][r];
                m = _mm_add_ps(m, _mm_movehl_ps(m, m)); // (m0 + m2), (m1 + m3)
                v += _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
            } else if (kind == KQ5) {
                v += _mm_cvtss_f32(accm[a][r]); // hsum8(acc) + summs
            }
            out[r * ldo + a] = v;
        }
}

typedef void (*ktile_fn)(const uint8_t *w, size_t rb, const pg_q8k_block *x, int64_t nb,
                         float *out, int64_t ldo);

#define DEF_KTILE(name, K, W, R)                                                                   \
    static void name##_##W##x##R(const uint8_t *w, size_t rb, const pg_q8k_block *x, int64_t nb,   \
                                 float *out, int64_t ldo) {                                        \
        ktile(K, W, R, w, rb, x, nb, out, ldo);                                                    \
    }
// Per kind: [log2 W][R - 1] (4 weight rows only for R <= 2).
#define DEF_KTILES(name, K)                                                                        \
    DEF_KTILE(name, K, 1, 1)                                                                       \
    DEF_KTILE(name, K, 1, 2)                                                                       \
    DEF_KTILE(name, K, 1, 3)                                                                       \
    DEF_KTILE(name, K, 1, 4)                                                                       \
    DEF_KTILE(name, K, 2, 1)                                                                       \
    DEF_KTILE(name, K, 2, 2)                                                                       \
    DEF_KTILE(name, K, 2, 3)                                                                       \
    DEF_KTILE(name, K, 2, 4)                                                                       \
    DEF_KTILE(name, K, 4, 1)                                                                       \
    DEF_KTILE(name, K, 4, 2)                                                                       \
    static const ktile_fn name##_tiles[3][KT_MAX_R] = {                                            \
        {name##_1x1, name##_1x2, name##_1x3, name##_1x4},                                          \
        {name##_2x1, name##_2x2, name##_2x3, name##_2x4},                                          \
        {name##_4x1, name##_4x2, NULL, NULL},                                                      \
    };

DEF_KTILES(kq4, KQ4)
DEF_KTILES(kq4_8x8, KQ4_8X8)
DEF_KTILES(kq4_gemm, KQ4_GEMM)
DEF_KTILES(kq4_tiled, KQ4_TILED)
DEF_KTILES(kq6, KQ6)
DEF_KTILES(kq6_tiled, KQ6_TILED)
DEF_KTILES(kq5, KQ5)
DEF_KTILES(kq5_tiled, KQ5_TILED)

// Groups of G weight rows, each swept by every activation row in tiles of
// up to RM rows while it sits in L1 (4 x 1 and 4 x 2 for one or two
// activation rows, else 2 x 4: measured with bench_cpu_matmul --hot);
// rows past the last whole group one at a time.
static void kdot_tiles(const ktile_fn (*tiles)[KT_MAX_R], const uint8_t *w, size_t row_bytes, int64_t r0,
                       int64_t r1, const pg_q8k_block *x, int64_t m, int64_t nb, float *out, int64_t ldo) {
    const int lg = m <= 2 ? 2 : 1, G = 1 << lg, RM = G == 4 ? 2 : KT_MAX_R;
    int64_t r = r0;
    for (; r + G <= r1; r += G)
        for (int64_t i = 0; i < m; i += RM) {
            const int R = m - i < RM ? (int)(m - i) : RM;
            tiles[lg][R - 1](w + (size_t)r * row_bytes, row_bytes, x + i * nb, nb,
                             out + i * ldo + r, ldo);
        }
    for (; r < r1; r++)
        for (int64_t i = 0; i < m; i += KT_MAX_R) {
            const int R = m - i < KT_MAX_R ? (int)(m - i) : KT_MAX_R;
            tiles[0][R - 1](w + (size_t)r * row_bytes, row_bytes, x + i * nb, nb,
                            out + i * ldo + r, ldo);
        }
}

void pg_kdot_rows(int dtype, const void *wdata, size_t row_bytes, int64_t r0, int64_t r1,
                  const pg_q8k_block *x, int64_t m, int64_t nb, bool rows8, float *out,
                  int64_t ldo) {
    PG_CHECK(pg_kdot_supported(dtype));
    const ktile_fn(*tiles)[KT_MAX_R] = dtype == PG_DTYPE_Q6_K   ? kq6_tiles
                                       : dtype == PG_DTYPE_Q5_K ? kq5_tiles
                                       : rows8                  ? kq4_8x8_tiles
                                                                : kq4_tiles;
    const uint8_t *w = wdata;
    if (pg_kdot_order(dtype, rows8, m, 0) == PG_KDOT_TILED) { // every row alike
        kdot_tiles(dtype == PG_DTYPE_Q6_K   ? kq6_tiled_tiles
                   : dtype == PG_DTYPE_Q5_K ? kq5_tiled_tiles
                                            : kq4_tiled_tiles,
                   w, row_bytes, r0, r1, x, m, nb, out, ldo);
        return;
    }
    // Q4_K in the repacked order with m >= 4: the first m - m % 4 activation
    // rows in the gemm's order (whole tiles of 4), the rest in the gemv's.
    const int64_t m4 = dtype == PG_DTYPE_Q4_K && rows8 && m >= 4 ? m - m % 4 : 0;
    if (m4 > 0) kdot_tiles(kq4_gemm_tiles, w, row_bytes, r0, r1, x, m4, nb, out, ldo);
    if (m > m4) kdot_tiles(tiles, w, row_bytes, r0, r1, x + m4 * nb, m - m4, nb, out + m4 * ldo, ldo);
}

float pg_kdot_row(int dtype, const uint8_t *w, const pg_q8k_block *y, int64_t nb, bool rows8) {
    float out;
    pg_kdot_rows(dtype, w, 0, 0, 1, y, 1, nb, rows8, &out, 1);
    return out;
}

#else // !HAVE_AVX2

void pg_q8k_quantize_row(const float *x, int64_t cols, pg_q8k_block *y) {
    pg_q8k_quantize_row_ref(x, cols, y);
}

void pg_kdot_rows(int dtype, const void *wdata, size_t row_bytes, int64_t r0, int64_t r1,
                  const pg_q8k_block *x, int64_t m, int64_t nb, bool rows8, float *out,
                  int64_t ldo) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < m; i++)
            out[i * ldo + r] = pg_kdot_row_ref(dtype, (const uint8_t *)wdata + (size_t)r * row_bytes,
                                               x + i * nb, nb, pg_kdot_order(dtype, rows8, m, i));
}

float pg_kdot_row(int dtype, const uint8_t *w, const pg_q8k_block *y, int64_t nb, bool rows8) {
    return pg_kdot_row_ref(dtype, w, y, nb, rows8);
}

#endif // HAVE_AVX2
