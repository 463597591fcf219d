// kernels/cpu/simd_util.h - small AVX2 helpers shared by the CPU quantized
// dot products (quant_dot.c, kquant_dot.c); internal to kernels/cpu.
#pragma once
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

// The 4 bytes at p as a little-endian uint32 (any alignment).
static inline uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

// ggml's hsum_float_8: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
static inline float hsum8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#endif
