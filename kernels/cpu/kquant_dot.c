// kernels/cpu/kquant_dot.c - K-quant (Q4_K, Q6_K) weights times Q8_K
// activations, numerically llama.cpp's CPU backend (the arithmetic is
// spelled out in quant_dot.h).
#include "kernels/cpu/quant_dot.h"

#include <math.h>
#include <string.h>

#include "common/err.h"
#include "common/half.h"
#include "kernels/dtype.h"

// --- K-quants x Q8_K (arithmetic in quant_dot.h) --------------------------------------
//
// Portable code in every build: the integer lanes are exact whatever the
// instructions, and the float steps are the same fmaf/adds ggml's AVX2
// vec_dot_q4_K_q8_K / vec_dot_q6_K_q8_K do per lane.

bool pg_kdot_supported(int dtype) {
    return dtype == PG_DTYPE_Q4_K || dtype == PG_DTYPE_Q6_K;
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

void pg_q8k_quantize_row(const float *x, int64_t cols, pg_q8k_block *y) {
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

static inline float hsum8_lanes(const float a[8]) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// Q4_K's 12 bytes of 6-bit values: 8 scales then 8 mins.
static void q4k_scales(const uint8_t *p, int sc[8], int mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = p[j] & 63;
        mn[j] = p[j + 4] & 63;
        sc[j + 4] = (p[j + 8] & 15) | ((p[j] >> 6) << 4);
        mn[j + 4] = (p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4);
    }
}

static float q4k_dot(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc[8] = {0}, accm[4] = {0};
    for (int64_t b = 0; b < nb; b++, w += Q4_K_BYTES, y++) {
        const float d = y->d * pg_f16_to_f32(ld16(w));
        const float dmin = -y->d * pg_f16_to_f32(ld16(w + 2));
        int sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const uint8_t *qs = w + 16;
        for (int t = 0; t < 4; t++) {
            int s0 = y->bsums[4 * t] + y->bsums[4 * t + 1];
            int s1 = y->bsums[4 * t + 2] + y->bsums[4 * t + 3];
            accm[t] = fmaf(dmin, (float)(mn[2 * t] * s0 + mn[2 * t + 1] * s1), accm[t]);
        }
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
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    return hsum8_lanes(acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]));
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

// Q4_K as ggml's repacked q4_K_8x8 kernels (AVX2 ggml_gemv/gemm_q4_K_8x8_q8_K)
// sum it: one f32 chain per (weight row, activation row) over blocks, the
// block's whole integer dot and its whole mins term each converted once.
static float q4k_dot_8x8(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q4_K_BYTES, y++) {
        int sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const uint8_t *qs = w + 16;
        int32_t sumi = 0, summ = 0;
        for (int s = 0; s < 8; s++)
            summ += mn[s] * (y->bsums[2 * s] + y->bsums[2 * s + 1]);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = qs + 32 * c;
            const int8_t *xl = y->qs + 64 * c, *xh = xl + 32;
            int lo = 0, hi = 0;
            for (int e = 0; e < 32; e++) {
                lo += (q[e] & 15) * xl[e];
                hi += (q[e] >> 4) * xh[e];
            }
            sumi += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        acc = fmaf((float)sumi, pg_f16_to_f32(ld16(w)) * y->d, acc);
        accm = fmaf((float)summ, pg_f16_to_f32(ld16(w + 2)) * y->d, accm);
    }
    return acc - accm;
}

float pg_kdot_row(int dtype, const uint8_t *w, const pg_q8k_block *y, int64_t nb, bool rows8) {
    PG_CHECK(pg_kdot_supported(dtype));
    if (dtype == PG_DTYPE_Q4_K) return rows8 ? q4k_dot_8x8(w, y, nb) : q4k_dot(w, y, nb);
    return q6k_dot(w, y, nb);
}
