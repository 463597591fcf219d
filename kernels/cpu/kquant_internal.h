// kernels/cpu/kquant_internal.h - what the K-quant dot-product files of
// kernels/cpu share (kquant_dot.c: Q4_K, Q6_K, the AVX2 tiles and the
// dispatch; kquant_q5k.c: the Q5_K scalar reference). Not a public header.
#pragma once
#include <stdint.h>

#include "kernels/cpu/quant_dot.h" // pg_q8k_block

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

// Q5_K times Q8_K in llama.cpp's order for `order` (PG_KDOT_VEC or
// PG_KDOT_TILED; kquant_q5k.c).
float pg_q5k_dot_ref(const uint8_t *w, const pg_q8k_block *y, int64_t nb, int order);
