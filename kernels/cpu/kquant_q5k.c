// kernels/cpu/kquant_q5k.c - Q5_K weights times Q8_K activations, the
// scalar reference (the AVX2 tiles are kquant_dot.c's ktile, held to these
// bits by tests/unit/test_cpu_matmul.c).
//
// Q5_K is Q4_K with a fifth bit per element: {fp16 d; fp16 dmin;
// scales[12] (Q4_K's 6-bit scales and mins); qh[32]; qs[128]}. Element l
// (< 32) of the low half of 64-element chunk c is (qs[32c + l] & 15) |
// bit 2c of qh[l] << 4, of the high half qs[32c + l] >> 4 | bit 2c + 1 of
// qh[l] << 4; x = d * scale_s * q - dmin * min_s.
#include "kernels/cpu/kquant_internal.h" // shared scale unpacking and block epilogues

// Weight code e (0..31) of sub-block s's 32 elements: the nibble and the
// fifth bit (bit s of qh[e]).
static inline int q5k_code(const uint8_t *qh, const uint8_t *qs, int s, int e) {
    const uint8_t byte = qs[32 * (s / 2) + e];
    return ((s & 1) ? byte >> 4 : byte & 15) | (((qh[e] >> s) & 1) << 4);
}

// ggml's AVX2 vec_dot_q5_K_q8_K: per block 8 int32 lanes (lane l sums the
// 4-element groups 4l..4l+3 of every sub-block, times its scale), then
// acc[l] = fma(d_x * f32(d_w), lane[l], acc[l]); the mins as one scalar,
// summs += (-d_x * f32(dmin_w)) * (float)(sum_s min_s * S_s), which gcc
// contracts into an fma (ggml's C is built -std=gnu11, -ffp-contract=fast;
// clang's default contracts it too); result hsum8(acc) + summs. Unlike
// Q4_K's vec_dot (4 mins lanes, each an fma), one mins chain per row.
static float q5k_dot(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc[8] = {0}, summs[4] = {0}; // summs[0]: the one mins chain
    for (int64_t b = 0; b < nb; b++, w += Q5_K_BYTES, y++) {
        int sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const uint8_t *qh = w + 16, *qs = w + 48;
        int32_t lane[8] = {0};
        for (int s = 0; s < 8; s++) {
            const int8_t *x = y->qs + 32 * s;
            for (int l = 0; l < 8; l++) {
                int t = 0;
                for (int e = 4 * l; e < 4 * l + 4; e++) t += q5k_code(qh, qs, s, e) * x[e];
                lane[l] += sc[s] * t;
            }
        }
        q45k_vec_block(w, y, mn, lane, true, acc, summs);
    }
    return q45k_vec_result(acc, summs, true);
}

// llama.cpp's tiled kernels (m >= 8) take Q5_K as Q4_K (ggml-cpu/tiled:
// SUBBLK 32, with mins, no bias): per block the whole integer dot s1 and
// mins term s2, res = fma(-f32(dmin_w), (float)s2, f32(d_w) * (float)s1),
// acc = fma(res, d_x, acc).
static float q5k_dot_tiled(const uint8_t *w, const pg_q8k_block *y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q5_K_BYTES, y++) {
        int sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const uint8_t *qh = w + 16, *qs = w + 48;
        int32_t s1 = 0;
        for (int s = 0; s < 8; s++) {
            int t = 0;
            for (int e = 0; e < 32; e++) t += q5k_code(qh, qs, s, e) * y->qs[32 * s + e];
            s1 += sc[s] * t;
        }
        acc = q45k_tiled_block(w, y, s1, q4k_mins(mn, y), acc);
    }
    return acc;
}

float pg_q5k_dot_ref(const uint8_t *w, const pg_q8k_block *y, int64_t nb, int order) {
    return order == PG_KDOT_TILED ? q5k_dot_tiled(w, y, nb) : q5k_dot(w, y, nb);
}
