// kernels/kernels.h - the plain data types below the backend interface:
// a stored weight matrix as a file holds it, the KV cache's shape and
// element types, and the CPU backend's numerics modes. The backend
// interface itself is kernels/backend.h.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { // the .cu files include this too
#endif

// A weight matrix: `rows` output features, each a row of `cols` input
// features stored contiguously in `dtype` (quantized types in blocks along
// the row). The room for per-tensor scales of future int8/fp8 layouts is
// `scales` (unused for GGUF block types, which carry their own).
typedef struct pg_weight {
    const void *data;   // [rows][row_bytes]
    int dtype;          // pg_dtype (kernels/dtype.h)
    int64_t rows, cols;
    size_t row_bytes;
    const float *scales; // reserved: per-row scales for future layouts
} pg_weight;

// Element types of the KV cache (pg_kv_shape.dtype). 0 and 1 keep their
// old meaning (0 is the backend's native type everywhere, so a shape
// initialized without a dtype means native); 2..6 are the CPU backend's
// explicit types, which the CUDA backend refuses. fp8 e4m3 (1) is both
// backends' (the same conversion: kernels/dtype.h pg_f32_to_fp8_e4m3).
enum {
    // The backend's native type: bf16 on CUDA, f32 on the CPU (pg_backend.kv_native).
    PG_KV_BF16 = 0,
    PG_KV_NATIVE = PG_KV_BF16,
    // fp8 e4m3, scale 1.0: values are converted (round to nearest even) with
    // saturation to +-448 and without a calibrated scale (vLLM's fp8 default
    // without scales). 1 byte per element. CUDA and the CPU.
    PG_KV_FP8_E4M3 = 1,
    // CPU only: f32 elements (the same bytes as the CPU's native type).
    PG_KV_F32 = 2,
    // CPU only: IEEE fp16, round to nearest even (llama.cpp's default cache).
    PG_KV_F16 = 3,
    // CPU only: bfloat16, round to nearest even. (On CUDA, bf16 is
    // PG_KV_NATIVE; a separate value because the CPU's native type is f32.)
    PG_KV_BF16_CPU = 4,
    // CPU only: llama.cpp's Q8_0 along head_dim (a multiple of 32): per 32
    // elements an fp16 scale d = max|x| / 127 and 32 int8 q = round(x / d),
    // 34 bytes, x ~ d * q. A row of head_dim elements is head_dim / 32 blocks.
    PG_KV_Q8_0 = 5,
    // CPU only: fp8 e4m3 with a scale per head row: each head's row of one
    // token is an f32 s = max|x| / 448 then head_dim e4m3 q = fp8(x / s),
    // x ~ s * q: nothing saturates and no calibration is needed, for 4
    // bytes per head_dim (head_dim + 4 bytes a row). A row is one head's.
    PG_KV_FP8_E4M3_SCALED = 6,
};
// q8_0 KV rows: blocks of 32 elements along head_dim, each an fp16 scale
// then 32 int8 (llama.cpp's Q8_0 layout).
#define PG_KV_Q8_0_ELEMS 32
#define PG_KV_Q8_0_BYTES 34

// "native", "fp8 e4m3", "f32", "f16", "bf16", "q8_0", "fp8 e4m3 scaled"
// (logs); "unknown" otherwise.
const char *pg_kv_dtype_name(int32_t dtype);
// Bytes of one KV row (one head's head_dim elements) in `dtype` on a backend
// whose native type (PG_KV_NATIVE) is f32 (the CPU) or bf16 (CUDA); 0 when
// the type cannot hold that row (q8_0 needs head_dim % 32 == 0).
size_t pg_kv_row_bytes(int32_t dtype, int64_t head_dim, bool native_f32);

// Shape of the paged KV cache of one layer: [n_blocks][block_size][n_kv_heads][head_dim].
// `dtype` is last, so positional initializers of the first four fields
// mean the native type.
typedef struct pg_kv_shape {
    int32_t n_blocks;
    int32_t block_size;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t dtype; // PG_KV_*
    // fp8 e4m3 only (PG_KV_FP8_E4M3): this layer's scales in backend memory,
    // [2][n_kv_heads] f32, K's then V's, one per KV head: the cache holds
    // fp8(x / s) and attention reads s * code (CPU: applied to the scores
    // and to the output, not per element; CUDA: folded the same way into
    // the softmax scale and the output's normalisation). NULL: scale 1.0.
    // A layer's shape gets them from the runner (engine/runner/runner_kv_scales.c:
    // a checkpoint's k_scale / v_scale, or calibrated at start-up).
    const float *scales;
    // The CPU's llama.cpp-compatible numerics only (kernels/cpu/attention.c):
    // a Gemma layer. llama.cpp runs Gemma with NEOX RoPE, so its K and Q
    // dimensions are in the rows' own order (not the interleaved pairs of
    // its permuted Llama rows), and it multiplies q by the attention scale
    // (ggml_scale of Qcur) before the fp16 rounding, the scores by 1.
    bool lc_gemma;
    // The CUDA attention kernels only (kernels/cuda/attention.cu; the CPU
    // op takes both as arguments, and the CUDA op copies its arguments
    // here): window > 0, the query at position p sees the keys
    // (p - window, p] (a sliding-window layer); softcap > 0, every score s
    // (after the scale) becomes softcap * tanh(s / softcap) (Gemma 2).
    int32_t window;
    float softcap;
} pg_kv_shape;

// Bytes of one block of one layer's K (or V): block_size slots of
// n_kv_heads rows of head_dim elements in s.dtype on a backend whose
// native type is f32 or bf16 (pg_kv_row_bytes); 0 for a type that cannot
// hold the row.
size_t pg_kv_layer_block_bytes(pg_kv_shape s, bool native_f32);
// Bytes of one KV block (K and V of n_layers layers): what both backends'
// kv_block_bytes return and what `paged plan` (engine/memplan.c) sizes the
// pool by, so one formula decides the pool on both sides.
size_t pg_kv_block_bytes(int32_t n_layers, pg_kv_shape s, bool native_f32);

// The CPU backend's numerics (pg_backend_cpu_create; CUDA has one).
typedef enum {
    // The backend's choice. CPU: PG_MATMUL_QUANT_ACT.
    PG_MATMUL_DEFAULT = 0,
    // The reference: f32 products of the dequantized weights with the f32
    // activations, f32 attention over the f32 KV cache, libm exp.
    PG_MATMUL_EXACT = 1,
    // llama.cpp-compatible (its CPU backend, AVX2 build, no flash
    // attention): activations quantized per 32-element block to 8 bits (Q8_1
    // for Q4_1 weights, Q8_0 for Q4_0/Q8_0) and multiplied with integer dot
    // products; RMSNorm, RoPE, softmax and SwiGLU with ggml's rounding and
    // its vectorized exp; K, V, Q and the attention probabilities rounded to
    // fp16 as in llama.cpp's f16 KV cache (kernels/cpu/llama_compat.h; a
    // bf16 or q8_0 cache holds that type's rounding of f32 instead). On
    // the default model the logits are bit-identical to llama.cpp's (they
    // differ from the exact mode's by 1-9%). Weight types without an
    // integer kernel (K-quants, f16, bf16, f32) keep f32 products.
    PG_MATMUL_QUANT_ACT = 2,
} pg_matmul_mode;

// "default", "exact", "quant" (for flags and logs); "unknown" otherwise.
const char *pg_matmul_mode_name(pg_matmul_mode mode);
// Parses one of those names; PG_EINVAL (with a message) for anything else.
int pg_matmul_mode_parse(const char *name, pg_matmul_mode *out);

#ifdef __cplusplus
}
#endif
