// kernels/cpu/kquant_internal.h - what the K-quant dot-product files of
// kernels/cpu share (kquant_dot.c: Q4_K, Q6_K, the AVX2 tiles and the
// dispatch; kquant_q5k.c: the Q5_K scalar reference). Not a public header.
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/half.h"
#include "kernels/cpu/quant_dot.h" // pg_q8k_block, ld16

// ggml's hsum_float_8 order: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
static inline float hsum8_lanes(const float a[8]) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// Q4_K's and Q5_K's 12 bytes of 6-bit values: 8 scales then 8 mins.
static inline void q4k_scales(const uint8_t *p, int sc[8], int mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = p[j] & 63;
        mn[j] = p[j + 4] & 63;
        sc[j + 4] = (p[j + 8] & 15) | ((p[j] >> 6) << 4);
        mn[j + 4] = (p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4);
    }
}

// A Q4_K or Q5_K block's whole mins term: sum over sub-blocks of min * (sum
// of x), exact in int32.
static inline int32_t q4k_mins(const int mn[8], const pg_q8k_block *y) {
    int32_t m = 0;
    for (int s = 0; s < 8; s++) m += mn[s] * (y->bsums[2 * s] + y->bsums[2 * s + 1]);
    return m;
}

// One Q4_K or Q5_K block's float steps in ggml's vec_dot order (w: the
// block, lane: its 8 int32 lanes): acc[l] = fma(d_x * f32(d_w), lane[l],
// acc[l]), and the mins times -d_x * f32(dmin_w): Q4_K (whole_mins false)
// per 64 elements into accm[0..3], one fma each; Q5_K (whole_mins) the
// block's whole term into accm[0], summs (one chain per row).
static inline void q45k_vec_block(const uint8_t *w, const pg_q8k_block *y, const int mn[8],
                                  const int32_t lane[8], bool whole_mins, float acc[8], float accm[4]) {
    const float d = y->d * pg_f16_to_f32(ld16(w));
    const float dmin = -y->d * pg_f16_to_f32(ld16(w + 2));
    if (whole_mins) {
        accm[0] = fmaf(dmin, (float)q4k_mins(mn, y), accm[0]);
    } else {
        for (int t = 0; t < 4; t++) {
            int s0 = y->bsums[4 * t] + y->bsums[4 * t + 1];
            int s1 = y->bsums[4 * t + 2] + y->bsums[4 * t + 3];
            accm[t] = fmaf(dmin, (float)(mn[2 * t] * s0 + mn[2 * t + 1] * s1), accm[t]);
        }
    }
    for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
}

// The result after the last block: hsum8(acc) + the mins (Q4_K: its 4
// lanes as ggml sums them; Q5_K: summs).
static inline float q45k_vec_result(const float acc[8], const float accm[4], bool whole_mins) {
    return hsum8_lanes(acc) + (whole_mins ? accm[0] : (accm[0] + accm[2]) + (accm[1] + accm[3]));
}

// One Q4_K or Q5_K block as llama.cpp's tiled kernels take it (s1: the
// whole integer dot, s2: the whole mins term): res = fma(-f32(dmin_w),
// (float)s2, f32(d_w) * (float)s1), then acc = fma(res, d_x, acc).
static inline float q45k_tiled_block(const uint8_t *w, const pg_q8k_block *y, int32_t s1, int32_t s2,
                                     float acc) {
    const float res = fmaf(-pg_f16_to_f32(ld16(w + 2)), (float)s2, pg_f16_to_f32(ld16(w)) * (float)s1);
    return fmaf(res, y->d, acc);
}

// Q5_K times Q8_K in llama.cpp's order for `order` (PG_KDOT_VEC or
// PG_KDOT_TILED; kquant_q5k.c).
float pg_q5k_dot_ref(const uint8_t *w, const pg_q8k_block *y, int64_t nb, int order);
