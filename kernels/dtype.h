// kernels/dtype.h - element types of weight tensors, and dequantization.
//
// Values equal GGML's type numbers so GGUF tensor types map directly.
// Quantized types are stored in blocks along the innermost dimension.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PG_DTYPE_F32 = 0,
    PG_DTYPE_F16 = 1,
    PG_DTYPE_Q4_0 = 2,
    PG_DTYPE_Q4_1 = 3,
    PG_DTYPE_Q5_0 = 6,
    PG_DTYPE_Q5_1 = 7,
    PG_DTYPE_Q8_0 = 8,
    PG_DTYPE_Q4_K = 12,
    PG_DTYPE_Q5_K = 13,
    PG_DTYPE_Q6_K = 14,
    // GGML's number; no block size here (not a weight type): safetensors'
    // I32 of AWQ / GPTQ packed tensors, which the loader repacks.
    PG_DTYPE_I32 = 26,
    PG_DTYPE_BF16 = 30,
    // paged's own types (numbers past GGML's, which never reach a GGUF
    // file): docs/quantization.md has the layouts the GPU kernels must read.
    //
    // FP8 e4m3 (OCP "e4m3fn": bias 7, no infinities, max 448), one byte per
    // element, and one f32 scale per row in pg_weight.scales (required):
    // w[r][j] = e4m3(q[r][j]) * scales[r]. A per-tensor scale is expanded
    // to every row at load. pg_dequantize_row gives the unscaled values.
    PG_DTYPE_FP8_E4M3 = 64,
    // int4, group-wise along the input dimension: blocks of 128 elements of
    // 68 bytes {f16 d; uint8 z; uint8 reserved = 0; uint8 qs[64]}, 4-byte
    // aligned fields. qs is four 16-byte runs, run k holding elements 32k +
    // j (low nibble of byte j) and 32k + 16 + j (high nibble), Q4_0's order
    // per 32 elements: x = (q - z) * d, q and z in 0..15 (AWQ's and GPTQ's
    // asymmetric int4; symmetric GPTQ is z = 8).
    PG_DTYPE_INT4_G128 = 65,
    // The same with groups of 64 (36-byte blocks, two runs): for input
    // dimensions that are not a multiple of 128 (SmolLM2-135M's hidden 576).
    PG_DTYPE_INT4_G64 = 66,
    PG_DTYPE_COUNT = 67
} pg_dtype;

#define PG_INT4_GROUP 128     // elements per PG_DTYPE_INT4_G128 block
#define PG_INT4_BLOCK_BYTES 68
#define PG_INT4_BLOCK_BYTES_G(g) (4 + (g) / 2) // bytes of a block of g elements
#define PG_FP8_E4M3_MAX 448.0f

// Elements per block (1 for plain types); 0 for an unknown type.
int pg_dtype_block_elems(int dtype);
// Bytes per block; 0 for an unknown type.
size_t pg_dtype_block_bytes(int dtype);
// Name for messages ("q4_1", GGML's spelling, e.g. "q4_K"), or "unknown".
// GGML types that are known but not supported here (e.g. 10, "q2_K") also
// have their name; pg_dtype_block_elems() == 0 is the test for support.
const char *pg_dtype_name(int dtype);
// Bytes of a row of `n` elements; 0 when `n` is negative or not a multiple
// of the block size, the type is unknown, or the size overflows size_t
// (also 0 for n == 0).
size_t pg_dtype_row_bytes(int dtype, int64_t n);

// Dequantizes `n` elements (a multiple of the block size) from `src` to f32.
// `src` needs no alignment (blocks are packed). Bit-identical to GGML's
// reference dequantizers. A type without a dequantizer or a bad `n` is a
// caller bug and aborts (PG_CHECK); the readers validate both at open.
void pg_dequantize_row(int dtype, const void *src, float *dst, int64_t n);

// True for types whose rows need pg_weight.scales (FP8_E4M3).
static inline int pg_dtype_has_row_scales(int dtype) { return dtype == PG_DTYPE_FP8_E4M3; }

// e4m3 <-> f32. The encoding rounds to nearest even and saturates to
// +-448 (vLLM's scaled_fp8_quant clamps before converting); NaN stays NaN.
float pg_fp8_e4m3_to_f32(uint8_t v);
uint8_t pg_f32_to_fp8_e4m3(float x);

// Per-row FP8: scale = max|x| / 448 (1 for an all-zero row), q[j] =
// e4m3(x[j] * (1 / scale)). The rule of the weights (per output channel)
// and of the activations in W8A8 (per token, dynamic).
void pg_quantize_row_fp8(const float *x, int64_t n, uint8_t *q, float *scale);

// True for the int4 group types (INT4_G128, INT4_G64).
static inline int pg_dtype_is_int4(int dtype) { return dtype == PG_DTYPE_INT4_G128 || dtype == PG_DTYPE_INT4_G64; }

// int4 in groups of g = 128 or 64 (n a multiple of g; the block of
// INT4_G128, or INT4_G64's for g = 64), AWQ's round-to-nearest quantizer
// with zero points: per group d = f16((max - min) / 15) (at least 1e-5),
// z = clamp(-rint(min / d), 0, 15), q = clamp(rint(x / d) + z, 0, 15).
void pg_quantize_row_int4(const float *x, int64_t n, int g, void *dst);
