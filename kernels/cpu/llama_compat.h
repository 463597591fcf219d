// kernels/cpu/llama_compat.h - the element-wise arithmetic of llama.cpp's CPU
// backend (ggml-cpu, x86-64 AVX2 build), for the llama.cpp-compatible mode.
//
// With 8-bit activation quantization before every matrix product, a
// difference of one float rounding anywhere upstream can flip an activation
// code and move the logits by percents, so matching llama.cpp's outputs needs
// its rounding everywhere, not only in the products:
//  - RMSNorm: sum of the f32 squares in double, scale = 1/sqrtf(f32 mean + eps),
//    y = (x * scale) * w;
//  - RoPE: angles theta_i = pos * theta_scale^i by repeated f32
//    multiplication, cosf/sinf, and the rotation with fused multiply-adds
//    x0' = fma(x0, cos, -(x1 * sin)), x1' = fma(x0, sin, x1 * cos);
//  - attention (llama.cpp without flash attention, f16 KV cache): K, V and Q
//    rounded to fp16 (K and V, with an f32 or f16 cache; a bf16 or q8_0
//    cache holds its own rounding of f32); scores and the value sums as 8-lane fma chains summed
//    like ggml's hsum (tinyBLAS); softmax with ggml's vectorized expf and its
//    sums in double; probabilities rounded to fp16 (kernels/cpu/attention.c);
//  - SwiGLU: silu(g) = g / (1 + expf(-g)) with ggml's vectorized expf;
//  - GeGLU (Gemma): gelu(g) * u with gelu from ggml's fp16 lookup table
//    (GGML_GELU_FP16) indexed by the fp16 rounding of g, 0 for g <= -10 and
//    g for g >= 10.
// Each function states which ggml routine it reproduces; tests compare them
// with the formulas written out, and /tmp-style harnesses with ggml itself
// (docs/cpu_kernels.md).
#pragma once
#include <stdint.h>

#include "common/half.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

// Rounds to fp16 (nearest even) and back, as ggml's f32 -> f16 conversion.
static inline float pg_lc_f16(float x) {
#if defined(__F16C__)
    return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
    return pg_f16_to_f32(pg_f32_to_f16(x));
#endif
}

// The fp16 code of x (nearest even), as ggml's GGML_CPU_FP32_TO_FP16.
static inline uint16_t pg_lc_f16_bits(float x) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
#else
    return pg_f32_to_f16(x);
#endif
}

// y[0:n] = x * scale * w with ggml_compute_forward_rms_norm_f32's scale.
// y may alias x.
void pg_lc_rmsnorm_row(float *y, const float *x, const float *w, int64_t n, float eps);

// y[i] = exp(x[i]) as ggml_v_expf (AVX2; max error about 1.5 ulp).
void pg_lc_expf(float *y, const float *x, int64_t n);

// out[0:n] = silu(g) * u as ggml_vec_swiglu_f32 (vectorized silu for the
// first n - n % 8 elements, expf for the rest). out may alias g or u.
void pg_lc_swiglu_row(float *out, const float *g, const float *u, int64_t n);

// ggml_gelu_f32 as gcc builds ggml-cpu (-ffp-contract=fast, FMA):
// 0.5x (1 + tanhf(sqrt(2/pi) x * fma(0.044715 x, x, 1))), sqrt(2/pi) as the
// f32 constant 0.7978846; the source of ggml's table.
float pg_lc_gelu_f32(float x);

// The GELU of ggml_vec_gelu_f32 / ggml_vec_geglu_f32 with GGML_GELU_FP16
// (on in every ggml-cpu build): 0 for x <= -10, x for x >= 10, else
// ggml_table_gelu_f16[f16(x)] = f16(pg_lc_gelu_f32(f16(x))) as f32 (NaN:
// the table's entry for the NaN's code).
float pg_lc_gelu(float x);

// out[0:n] = gelu(g) * u as ggml_vec_geglu_f32 (x >= 10: x * u, one
// multiply either way). out may alias g or u.
void pg_lc_geglu_row(float *out, const float *g, const float *u, int64_t n);

// ggml_rope_cache_init for NORM/NEOX rope without scaling: cs[2i] = cos,
// cs[2i+1] = sin of theta_i = pos * theta_scale^i (f32 recurrence).
void pg_lc_rope_cache(int32_t pos, float theta_scale, int32_t half, float *cs);

// Rotates the pairs (x[i], x[i + half]) (rotate-half layout; the same pairs
// as ggml's adjacent ones on llama.cpp's permuted Q/K rows) with `cs`.
void pg_lc_rope_row(float *x, int32_t half, const float *cs);

// Softmax of scores s[0:n] (positions 0..n-1 of a row) as
// ggml_compute_forward_soft_max_f32 over llama.cpp's padded, masked row:
// p[i] = e_i * (float)(1 / sum), e_i = ggml expf(s_i - max), with the sum
// taken over chunks of 8 positions (each chunk summed in f32 like ggml's
// hsum, the chunks in double). p may alias s.
void pg_lc_softmax_row(float *p, const float *s, int64_t n);

// ggml_vec_dot_f16's sum (AVX2; llama.cpp's attention when a ubatch holds a
// single token, tinyBLAS being for two and more): 4 accumulators of 8 lanes,
// a[8j + l] for element i of each 32 with (i % 32) = 8j + l, fma each; then
// x = (a[0:8] + a[16:24]) + (a[8:16] + a[24:32]) lane by lane and
// ((x0+x4)+(x1+x5)) + ((x2+x6)+(x3+x7)). The elements past the last whole
// 32 are added in double, the total rounded to f32.
float pg_lc_dot_f16_reduce(const float a[32]);
// x . y for f16-valued x and y, in that order.
float pg_lc_dot_f16(const float *x, const float *y, int64_t n);

// ggml's horizontal sum of 8 lanes: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
static inline float pg_lc_hsum8(const float a[8]) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}
