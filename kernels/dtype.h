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
    PG_DTYPE_Q8_0 = 8,
    PG_DTYPE_Q4_K = 12,
    PG_DTYPE_Q5_K = 13,
    PG_DTYPE_Q6_K = 14,
    PG_DTYPE_BF16 = 30,
    PG_DTYPE_COUNT = 31
} pg_dtype;

// Elements per block (1 for plain types); 0 for an unknown type.
int pg_dtype_block_elems(int dtype);
// Bytes per block; 0 for an unknown type.
size_t pg_dtype_block_bytes(int dtype);
// Name for messages ("q4_1", GGML's spelling, e.g. "q4_K"), or "unknown".
// GGML types that are known but not supported here (e.g. 6, "q5_0") also
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
