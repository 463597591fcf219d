// kernels/cpu/quant_dot.c - integer dot products of GGUF block weights with
// 8-bit quantized activations (the arithmetic is spelled out in quant_dot.h).
//
// The kernels work on tiles of W weight rows x R activation rows: each
// weight block is unpacked once per tile and each activation block loaded
// once per tile, and the W*R accumulators are independent dependency
// chains. Every (weight row, activation row) pair keeps its own 8-lane f32
// accumulator and sums it the way ggml does, so tiling never changes a
// result bit.
#include "kernels/cpu/quant_dot.h"

#include <math.h>
#include <string.h>

#include "common/err.h"
#include "common/half.h"
#include "kernels/cpu/simd_util.h" // ld32, hsum8 (AVX2 builds)
#include "kernels/dtype.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

#define QK 32
// Activation rows a kernel tile reads at most; d and s are padded by as
// many floats so that a tile can load them as one vector.
#define MAX_R 4


// --- activation quantization ------------------------------------------------------

static size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

size_t pg_xq_bytes(int64_t m, int64_t cols) {
    size_t nblk = (size_t)m * (size_t)(cols / QK);
    // qs, then d and s, each padded by MAX_R floats: a tile of fewer than
    // MAX_R rows still loads MAX_R lanes of s (the extra lanes are unused).
    return align_up(nblk * QK, 32) + 2 * align_up((nblk + MAX_R) * sizeof(float), 32);
}

void pg_xq_init(pg_xq *xq, void *mem, int64_t m, int64_t cols) {
    PG_CHECK(cols % QK == 0);
    size_t nblk = (size_t)m * (size_t)(cols / QK);
    uint8_t *p = mem;
    xq->m = m;
    xq->nb = cols / QK;
    xq->qs = (int8_t *)p;
    p += align_up(nblk * QK, 32);
    xq->d = (float *)p;
    p += align_up((nblk + MAX_R) * sizeof(float), 32);
    xq->s = (float *)p;
    for (int k = 0; k < MAX_R; k++) xq->d[nblk + k] = xq->s[nblk + k] = 0.0f;
}

static inline float round_f16(float f) {
#ifdef HAVE_AVX2
    return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
    return pg_f16_to_f32(pg_f32_to_f16(f));
#endif
}

// One block: qs[32], *d and *s as described in quant_dot.h.
static void quantize_block(const float *x, int8_t *qs, float *d, float *s) {
#ifdef HAVE_AVX2
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
    mx = _mm256_max_ps(mx, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(mx, 1), _mm256_castps256_ps128(mx));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float dd = amax / 127.f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    enum { rm = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }; // an ICE: clang needs one
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), rm));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), rm));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), rm));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), rm));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    const int isum = _mm_cvtsi128_si32(s4);
    // int32 -> int8 with two saturating packs; they work per 128-bit half,
    // so a final dword permutation restores element order.
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, p);
#else
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float dd = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    int isum = 0;
    for (int j = 0; j < QK; j++) {
        // nearbyintf rounds half to even in the default rounding mode, like
        // the AVX2 round instruction.
        int q = (int)nearbyintf(x[j] * id);
        q = q > 127 ? 127 : q < -128 ? -128 : q;
        qs[j] = (int8_t)q;
        isum += q;
    }
#endif
    *d = round_f16(dd);
    *s = round_f16(dd * (float)isum);
}

void pg_xq_quantize(pg_xq *xq, const float *x, int64_t ld, int64_t i0, int64_t i1) {
    const int64_t m = xq->m, nb = xq->nb;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t b = 0; b < nb; b++)
            quantize_block(x + i * ld + b * QK, xq->qs + (b * m + i) * QK, xq->d + b * m + i,
                           xq->s + b * m + i);
}

bool pg_qdot_supported(int dtype) {
    return dtype == PG_DTYPE_Q4_0 || dtype == PG_DTYPE_Q4_1 || dtype == PG_DTYPE_Q5_0 ||
           dtype == PG_DTYPE_Q5_1 || dtype == PG_DTYPE_Q8_0;
}

// Q4_1 and Q5_1 are affine (d * n + m, n >= 0, with Q8_1 activations); the
// others are symmetric (d * n, n signed, with Q8_0 activations).
static inline bool has_min(int dtype) {
    return dtype == PG_DTYPE_Q4_1 || dtype == PG_DTYPE_Q5_1;
}

static inline size_t block_bytes(int dtype) {
    switch (dtype) {
    case PG_DTYPE_Q4_0: return Q4_0_BYTES;
    case PG_DTYPE_Q4_1: return Q4_1_BYTES;
    case PG_DTYPE_Q5_0: return Q5_0_BYTES;
    case PG_DTYPE_Q5_1: return Q5_1_BYTES;
    default: return Q8_0_BYTES;
    }
}

// Offset of the nibbles (Q8_0: of the int8 values) in a block; the Q5
// types' 4 bytes of fifth bits sit just before their nibbles.
static inline size_t qs_offset(int dtype) {
    switch (dtype) {
    case PG_DTYPE_Q4_1: return 4;
    case PG_DTYPE_Q5_0: return 6;
    case PG_DTYPE_Q5_1: return 8;
    default: return 2;
    }
}

// --- AVX2 kernels ---------------------------------------------------------------------
//
// Two shapes of work:
//  - decode (m < PANEL_MIN_M): weights are read once, straight from their
//    packed rows, in tiles of W rows x R activation rows; the fp16 scales of
//    the W rows are gathered and converted in one instruction, and the next
//    tile's rows are prefetched (decode streams the weights from DRAM);
//  - batches (m >= PANEL_MIN_M): each group of PANEL_W rows is first
//    unpacked into a small panel in the caller's scratch (bytes ready for
//    the multiply, scales as f32), then swept by every activation row in
//    tiles of PANEL_W x PANEL_R.

#ifdef HAVE_AVX2

#define ALWAYS_INLINE inline __attribute__((always_inline))
// Tile shapes, measured on the 2-core Zen (16 ymm registers; 2 pipes for the
// integer multiplies): decode tiles of GEMV_W rows; batch tiles of PANEL_W
// rows x PANEL_R activation rows (12 accumulators) from m = PANEL_MIN_M on
// (below, the panel's unpacking does not pay: m = 2 is 25% slower); the
// group PF_GROUPS ahead is prefetched.
#define GEMV_W      4
#define PANEL_MIN_M 4
#define PANEL_W     3
#define PANEL_R     4
#define PF_GROUPS   1

// 16 bytes of nibbles -> 32 bytes in element order (low nibbles are
// elements 0..15, high nibbles 16..31), each in 0..15.
static ALWAYS_INLINE __m256i nibbles32(const uint8_t *p) {
    __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    raw = _mm256_srlv_epi32(raw, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(raw, _mm256_set1_epi8(0x0f));
}

// Sums of 4 adjacent u8*s8 products as f32 lanes (exact: no int16 pair can
// saturate with |s8| <= 127 and u8 <= 128).
static ALWAYS_INLINE __m256 dot_lanes(__m256i u, __m256i s) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// The Q5 types' fifth bits: bit j of the little-endian 32-bit qh becomes
// 0x10 in byte j. Each byte picks its qh byte (j / 8; the shuffle works
// per 128-bit half, and both halves hold the whole of qh), then tests its
// own bit j % 8.
static ALWAYS_INLINE __m256i fifth_bits(const uint8_t *qh) {
    const __m256i v = _mm256_set1_epi32((int)ld32(qh));
    const __m256i pick = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                            0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

// A block's 32 weights as bytes in element order: n in 0..15 (Q4_1) or
// 0..31 (Q5_1) for the affine types, signed n for the others (Q4_0: -8..7,
// Q5_0: -16..15, Q8_0: the int8 values).
static ALWAYS_INLINE __m256i weight_bytes(int dtype, const uint8_t *blk) {
    const uint8_t *qs = blk + qs_offset(dtype);
    switch (dtype) {
    case PG_DTYPE_Q8_0: return _mm256_loadu_si256((const __m256i *)qs);
    case PG_DTYPE_Q4_0: return _mm256_sub_epi8(nibbles32(qs), _mm256_set1_epi8(8));
    case PG_DTYPE_Q4_1: return nibbles32(qs);
    case PG_DTYPE_Q5_0:
        return _mm256_sub_epi8(_mm256_or_si256(nibbles32(qs), fifth_bits(qs - 4)),
                               _mm256_set1_epi8(16));
    default: return _mm256_or_si256(nibbles32(qs), fifth_bits(qs - 4)); // Q5_1
    }
}

// Lane a of v in every lane.
static ALWAYS_INLINE __m256 lane(__m256 v, int a) {
    return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(a));
}

// --- decode tiles: W packed weight rows x R activation rows -------------------

static ALWAYS_INLINE void gemv_tile(const int dtype, const int W, const int R, const uint8_t *w,
                                    size_t rb, const pg_xq *xq, int64_t i0, float *out,
                                    int64_t ldo) {
    const int64_t nb = xq->nb, m = xq->m;
    const size_t bb = block_bytes(dtype);
    const bool q41 = has_min(dtype);
    // Scale lanes: Q4_1/Q5_1 gather (d, m) pairs, so row a's d is lane 2a
    // and its m lane 2a + 1; the others gather d alone, row a in lane a.
    const int step = q41 ? 2 : 1;
    __m256 acc[GEMV_W][3];
    __m256 summs[3]; // Q4_1/Q5_1: lane 2a + 1 accumulates m_a * s_x of row a
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        summs[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int a = 0; a < W; a++) acc[a][r] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bb;
        const int8_t *xb = xq->qs + (b * m + i0) * QK;
        const float *dx = xq->d + b * m + i0, *sx = xq->s + b * m + i0;
        // fp16 scales of the W rows, converted together.
        __m256 dm;
        if (q41) {
            uint64_t lo = ld32(blk), hi = 0;
            if (W > 1) lo |= (uint64_t)ld32(blk + rb) << 32;
            if (W > 2) hi = ld32(blk + 2 * rb) | (uint64_t)ld32(blk + 3 * rb) << 32;
            dm = _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
        } else {
            uint64_t v = ld16(blk);
            if (W > 1) v |= (uint64_t)ld16(blk + rb) << 16;
            if (W > 2) v |= (uint64_t)ld16(blk + 2 * rb) << 32 | (uint64_t)ld16(blk + 3 * rb) << 48;
            dm = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)v)));
        }
        __m256 sc[3];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            sc[r] = _mm256_mul_ps(dm, _mm256_broadcast_ss(dx + r));
            if (q41) {
                __m256 s_odd =
                    _mm256_blend_ps(_mm256_setzero_ps(), _mm256_broadcast_ss(sx + r), 0xAA);
                summs[r] = _mm256_fmadd_ps(dm, s_odd, summs[r]);
            }
        }
        __m256i xv[3];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_si256((const __m256i *)(xb + r * QK));
#pragma GCC unroll 4
        for (int a = 0; a < W; a++) {
            const uint8_t *ba = blk + (size_t)a * rb;
            // The same block of the next tile's row: streams the weights in.
            _mm_prefetch((const char *)ba + (size_t)W * rb, _MM_HINT_T0);
            const __m256i q = weight_bytes(dtype, ba);
            if (q41) {
#pragma GCC unroll 4
                for (int r = 0; r < R; r++)
                    acc[a][r] =
                        _mm256_fmadd_ps(lane(sc[r], step * a), dot_lanes(q, xv[r]), acc[a][r]);
            } else {
                // Signed weights: |w| times x carrying w's sign.
                const __m256i aq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++)
                    acc[a][r] =
                        _mm256_fmadd_ps(lane(sc[r], step * a),
                                        dot_lanes(aq, _mm256_sign_epi8(xv[r], q)), acc[a][r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float ms[8];
        _mm256_storeu_ps(ms, summs[r]);
#pragma GCC unroll 4
        for (int a = 0; a < W; a++) {
            float v = hsum8(acc[a][r]);
            if (q41) v += ms[2 * a + 1];
            out[(i0 + r) * ldo + a] = v;
        }
    }
}

// --- batch tiles: unpacked panels of PANEL_W rows x R activation rows -----------

// Panel layout: per block, PANEL_W x 32 bytes to multiply as unsigned
// (affine types: n; symmetric ones: |w|) and for the symmetric types
// PANEL_W x 32 signed weights (whose signs move onto x); then per row the
// f32 scales d[nb] and, for the affine types, the minimums m[nb].
static ALWAYS_INLINE size_t panel_block_bytes(int dtype) {
    return has_min(dtype) ? PANEL_W * 32 : PANEL_W * 64;
}

// n fp16 values `stride` bytes apart -> f32, 8 per conversion.
static void f16_column(const uint8_t *p, size_t stride, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8, p += 8 * stride) {
        uint64_t lo = ld16(p) | (uint64_t)ld16(p + stride) << 16 |
                      (uint64_t)ld16(p + 2 * stride) << 32 | (uint64_t)ld16(p + 3 * stride) << 48;
        const uint8_t *q = p + 4 * stride;
        uint64_t hi = ld16(q) | (uint64_t)ld16(q + stride) << 16 |
                      (uint64_t)ld16(q + 2 * stride) << 32 | (uint64_t)ld16(q + 3 * stride) << 48;
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo)));
    }
    for (; i < n; i++, p += stride) out[i] = _cvtsh_ss(ld16(p));
}

// Rows past `n` (a tail group) are zero blocks.
static void unpack_panel(int dtype, const uint8_t *w, size_t rb, int n, int64_t nb,
                         uint8_t *panel) {
    const size_t bb = block_bytes(dtype), pb = panel_block_bytes(dtype);
    float *d = (float *)(panel + (size_t)nb * pb), *mn = d + PANEL_W * nb;
    for (int a = 0; a < PANEL_W; a++) {
        if (a >= n) {
            for (int64_t b = 0; b < nb; b++) {
                memset(panel + (size_t)b * pb + a * 32, 0, 32);
                if (!has_min(dtype))
                    memset(panel + (size_t)b * pb + PANEL_W * 32 + a * 32, 0, 32);
            }
            memset(d + a * nb, 0, sizeof(float) * (size_t)nb);
            if (has_min(dtype)) memset(mn + a * nb, 0, sizeof(float) * (size_t)nb);
            continue;
        }
        const uint8_t *row = w + (size_t)a * rb;
        if (has_min(dtype)) {
            float *da = d + a * nb, *ma = mn + a * nb;
            int64_t b = 0;
            // (d, m) pairs of 4 blocks in one conversion, then split.
            const __m256i split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
            for (; b + 4 <= nb; b += 4) {
                const uint8_t *p = row + b * bb;
                uint64_t lo = ld32(p) | (uint64_t)ld32(p + bb) << 32;
                uint64_t hi = ld32(p + 2 * bb) | (uint64_t)ld32(p + 3 * bb) << 32;
                __m256 f = _mm256_permutevar8x32_ps(
                    _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo)), split);
                _mm_storeu_ps(da + b, _mm256_castps256_ps128(f));
                _mm_storeu_ps(ma + b, _mm256_extractf128_ps(f, 1));
            }
            for (; b < nb; b++) {
                da[b] = _cvtsh_ss(ld16(row + b * bb));
                ma[b] = _cvtsh_ss(ld16(row + b * bb + 2));
            }
            for (b = 0; b < nb; b++)
                _mm256_storeu_si256((__m256i *)(panel + (size_t)b * pb + a * 32),
                                    weight_bytes(dtype, row + b * bb));
        } else {
            f16_column(row, bb, nb, d + a * nb);
            for (int64_t b = 0; b < nb; b++) {
                const __m256i q = weight_bytes(dtype, row + b * bb);
                uint8_t *pp = panel + (size_t)b * pb;
                _mm256_storeu_si256((__m256i *)(pp + a * 32), _mm256_sign_epi8(q, q));
                _mm256_storeu_si256((__m256i *)(pp + PANEL_W * 32 + a * 32), q);
            }
        }
    }
}

static ALWAYS_INLINE void panel_tile(const int dtype, const int R, const uint8_t *panel, int n,
                                     const pg_xq *xq, int64_t i0, float *out, int64_t ldo) {
    const int64_t nb = xq->nb, m = xq->m;
    const bool q41 = has_min(dtype);
    const size_t pb = panel_block_bytes(dtype);
    const float *d = (const float *)(panel + (size_t)nb * pb), *mn = d + PANEL_W * nb;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[PANEL_W][PANEL_R];
#pragma GCC unroll 4
    for (int a = 0; a < PANEL_W; a++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[a][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pp = panel + (size_t)b * pb;
        const int8_t *xb = xq->qs + (b * m + i0) * QK;
        const float *dx = xq->d + b * m + i0;
#pragma GCC unroll 4
        for (int a = 0; a < PANEL_W; a++) {
            const __m256 dw = _mm256_broadcast_ss(d + a * nb + b);
            const __m256i u = _mm256_loadu_si256((const __m256i *)(pp + a * 32));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i xr = _mm256_loadu_si256((const __m256i *)(xb + r * QK));
                if (!q41)
                    xr = _mm256_sign_epi8(
                        xr, _mm256_loadu_si256((const __m256i *)(pp + PANEL_W * 32 + a * 32)));
                __m256 sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(dx + r));
                __m256 l = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, xr), ones));
                acc[a][r] = _mm256_fmadd_ps(sc, l, acc[a][r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < PANEL_W; a++) {
        if (a >= n) break;
        // Q4_1/Q5_1: the minimum times the activation block sums, accumulated
        // in block order like ggml's summs (one lane per activation row).
        float ms[4] = {0, 0, 0, 0};
        if (q41) {
            __m128 sm = _mm_setzero_ps();
            for (int64_t b = 0; b < nb; b++)
                sm = _mm_fmadd_ps(_mm_broadcast_ss(mn + a * nb + b),
                                  _mm_loadu_ps(xq->s + b * m + i0), sm);
            _mm_storeu_ps(ms, sm);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) out[(i0 + r) * ldo + a] = hsum8(acc[a][r]) + ms[r];
    }
}

typedef void (*gemv_fn)(const uint8_t *w, size_t rb, const pg_xq *xq, int64_t i0, float *out,
                        int64_t ldo);
typedef void (*panel_fn)(const uint8_t *panel, int n, const pg_xq *xq, int64_t i0, float *out,
                         int64_t ldo);

#define DEF_GEMV(name, DT, W, R)                                                                   \
    static void name##_gemv_##W##x##R(const uint8_t *w, size_t rb, const pg_xq *xq, int64_t i0,    \
                                      float *out, int64_t ldo) {                                   \
        gemv_tile(DT, W, R, w, rb, xq, i0, out, ldo);                                              \
    }
#define DEF_PANEL(name, DT, R)                                                                     \
    static void name##_panel_##R(const uint8_t *panel, int n, const pg_xq *xq, int64_t i0,         \
                                 float *out, int64_t ldo) {                                        \
        panel_tile(DT, R, panel, n, xq, i0, out, ldo);                                             \
    }
#define DEF_KERNELS(name, DT)                                                                      \
    DEF_GEMV(name, DT, 1, 1)                                                                       \
    DEF_GEMV(name, DT, 1, 2)                                                                       \
    DEF_GEMV(name, DT, 1, 3)                                                                       \
    DEF_GEMV(name, DT, 4, 1)                                                                       \
    DEF_GEMV(name, DT, 4, 2)                                                                       \
    DEF_GEMV(name, DT, 2, 3)                                                                       \
    DEF_PANEL(name, DT, 1)                                                                         \
    DEF_PANEL(name, DT, 2)                                                                         \
    DEF_PANEL(name, DT, 3)                                                                         \
    DEF_PANEL(name, DT, 4)                                                                         \
    static const gemv_fn name##_gemv[2][3] = {                                                     \
        {name##_gemv_1x1, name##_gemv_1x2, name##_gemv_1x3},                                       \
        {name##_gemv_4x1, name##_gemv_4x2, name##_gemv_2x3},                                       \
    };                                                                                             \
    static const panel_fn name##_panel[PANEL_R] = {name##_panel_1, name##_panel_2, name##_panel_3, \
                                                   name##_panel_4};

DEF_KERNELS(q4_0, PG_DTYPE_Q4_0)
DEF_KERNELS(q4_1, PG_DTYPE_Q4_1)
DEF_KERNELS(q5_0, PG_DTYPE_Q5_0)
DEF_KERNELS(q5_1, PG_DTYPE_Q5_1)
DEF_KERNELS(q8_0, PG_DTYPE_Q8_0)

// Index of a type's kernels in the dispatch tables below.
#define N_KINDS 5
static int kernel_index(int dtype) {
    switch (dtype) {
    case PG_DTYPE_Q4_0: return 0;
    case PG_DTYPE_Q4_1: return 1;
    case PG_DTYPE_Q5_0: return 2;
    case PG_DTYPE_Q5_1: return 3;
    default: return 4; // Q8_0
    }
}

// Weight rows per decode tile for R activation rows (registers: W*R
// accumulators, R activation blocks, R scale vectors).
static const int gemv_w[4] = {0, 4, 4, 2};

size_t pg_qdot_scratch_bytes(int dtype, int64_t cols) {
    return (size_t)(cols / QK) * (panel_block_bytes(dtype) + 2 * PANEL_W * sizeof(float)) + 64;
}

void pg_qdot_rows(int dtype, const void *wdata, size_t row_bytes, int64_t r0, int64_t r1,
                  const pg_xq *xq, float *out, int64_t ldo, void *scratch) {
    PG_CHECK(pg_qdot_supported(dtype));
    const int k = kernel_index(dtype);
    const uint8_t *w = wdata;
    const int64_t m = xq->m;
    if (m < PANEL_MIN_M) {
        static const gemv_fn(*const gemv[N_KINDS])[3] = {q4_0_gemv, q4_1_gemv, q5_0_gemv,
                                                         q5_1_gemv, q8_0_gemv};
        const int R = (int)m, W = gemv_w[R];
        int64_t r = r0;
        for (; r + W <= r1; r += W)
            gemv[k][1][R - 1](w + (size_t)r * row_bytes, row_bytes, xq, 0, out + r, ldo);
        for (; r < r1; r++)
            gemv[k][0][R - 1](w + (size_t)r * row_bytes, row_bytes, xq, 0, out + r, ldo);
        return;
    }
    static const panel_fn *const panel[N_KINDS] = {q4_0_panel, q4_1_panel, q5_0_panel, q5_1_panel,
                                                   q8_0_panel};
    uint8_t *pnl = (uint8_t *)(((uintptr_t)scratch + 31) & ~(uintptr_t)31);
    for (int64_t r = r0; r < r1; r += PANEL_W) {
        int n = r1 - r < PANEL_W ? (int)(r1 - r) : PANEL_W;
        // The next group's rows come from DRAM while this one is swept: the
        // hardware prefetcher does not run that far ahead of a loop that
        // touches the weights only once every few thousand cycles.
        if (r + PF_GROUPS * PANEL_W < r1) {
            const uint8_t *next = w + (size_t)(r + PF_GROUPS * PANEL_W) * row_bytes;
            int64_t nn =
                r1 - r - PF_GROUPS * PANEL_W < PANEL_W ? r1 - r - PF_GROUPS * PANEL_W : PANEL_W;
            for (size_t off = 0; off < (size_t)nn * row_bytes; off += 64)
                _mm_prefetch((const char *)next + off, _MM_HINT_T0);
        }
        unpack_panel(dtype, w + (size_t)r * row_bytes, row_bytes, n, xq->nb, pnl);
        for (int64_t i = 0; i < m; i += PANEL_R) {
            int rr = m - i < PANEL_R ? (int)(m - i) : PANEL_R;
            panel[k][rr - 1](pnl, n, xq, i, out + r, ldo);
        }
    }
}

#else // !HAVE_AVX2

// --- portable kernels (same arithmetic, same bits) ---------------------------------

static float f16(const uint8_t *p) {
    return pg_f16_to_f32(ld16(p));
}

static float dot_row(int dtype, const uint8_t *w, const pg_xq *xq, int64_t i) {
    const int64_t nb = xq->nb, m = xq->m;
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *x = xq->qs + (b * m + i) * QK;
        int q[QK];
        float dw;
        const uint8_t *blk = w + b * block_bytes(dtype), *qs = blk + qs_offset(dtype);
        dw = f16(blk);
        if (dtype == PG_DTYPE_Q8_0) {
            for (int j = 0; j < QK; j++) q[j] = (int8_t)qs[j];
        } else {
            const bool q5 = dtype == PG_DTYPE_Q5_0 || dtype == PG_DTYPE_Q5_1;
            uint32_t qh = 0;
            if (q5) memcpy(&qh, qs - 4, 4);
            const int off = has_min(dtype) ? 0 : q5 ? 16 : 8;
            for (int j = 0; j < 16; j++) {
                q[j] = ((qs[j] & 15) | (int)((qh >> j) & 1) << 4) - off;
                q[j + 16] = ((qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - off;
            }
            if (has_min(dtype)) summs = fmaf(f16(blk + 2), xq->s[b * m + i], summs);
        }
        const float sc = dw * xq->d[b * m + i];
        for (int k = 0; k < 8; k++) {
            int lane = 0;
            for (int e = 4 * k; e < 4 * k + 4; e++) lane += q[e] * x[e];
            acc[k] = fmaf(sc, (float)lane, acc[k]);
        }
    }
    float r = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    return r + summs;
}

size_t pg_qdot_scratch_bytes(int dtype, int64_t cols) {
    return 0;
}

void pg_qdot_rows(int dtype, const void *wdata, size_t row_bytes, int64_t r0, int64_t r1,
                  const pg_xq *xq, float *out, int64_t ldo, void *scratch) {
    PG_CHECK(pg_qdot_supported(dtype));
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < xq->m; i++)
            out[i * ldo + r] =
                dot_row(dtype, (const uint8_t *)wdata + (size_t)r * row_bytes, xq, i);
}

#endif // HAVE_AVX2
