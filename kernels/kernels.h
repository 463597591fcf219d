// kernels/kernels.h - backend-neutral operations of the Llama forward pass.
//
// The forward pass (engine/llama.c) calls every op through a pg_backend
// table, so the same code runs on the CPU backend (kernels/cpu/, the
// reference) and the CUDA backend (kernels/cuda/). Pointers are in the
// backend's memory (host for CPU, device for CUDA). Activations are f32 on
// the CPU; weights keep their storage type (pg_weight.dtype).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

// One sequence of the batch as attention sees it. Its queries are rows
// [q_start, q_start + n_q) of the flattened batch, at positions
// [start_pos, start_pos + n_q); keys and values for positions
// [0, start_pos + n_q) live in the paged cache through `block_table`.
typedef struct pg_attn_seq {
    int32_t q_start;
    int32_t n_q;
    int32_t start_pos;
    const int32_t *block_table; // [ceil((start_pos + n_q) / block_size)]
} pg_attn_seq;

// Element types of the KV cache (pg_kv_shape.dtype).
enum {
    // The backend's native type: bf16 on CUDA, f32 on the CPU.
    PG_KV_BF16 = 0,
    // fp8 e4m3 (CUDA only), scale 1.0: values are converted with saturation
    // to +-448 and without a calibrated scale (vLLM's fp8 default without
    // scales). 1 byte per element.
    PG_KV_FP8_E4M3 = 1,
};

// Shape of the paged KV cache of one layer: [n_blocks][block_size][n_kv_heads][head_dim].
// `dtype` is last, so positional initializers of the first four fields
// mean the native type.
typedef struct pg_kv_shape {
    int32_t n_blocks;
    int32_t block_size;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t dtype; // PG_KV_*
} pg_kv_shape;

typedef struct pg_backend pg_backend;

// The CPU backend's numerics (CUDA ignores the choice for now).
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
    // fp16 as in llama.cpp's f16 KV cache (kernels/cpu/llama_compat.h). On
    // the default model the logits are bit-identical to llama.cpp's (they
    // differ from the exact mode's by 1-9%). Weight types without an
    // integer kernel (K-quants, f16, bf16, f32) keep f32 products.
    PG_MATMUL_QUANT_ACT = 2,
} pg_matmul_mode;

// "default", "exact", "quant" (for flags and logs); "unknown" otherwise.
const char *pg_matmul_mode_name(pg_matmul_mode mode);
// Parses one of those names; PG_EINVAL (with a message) for anything else.
int pg_matmul_mode_parse(const char *name, pg_matmul_mode *out);

struct pg_backend {
    const char *name;  // "cpu", "cuda"
    void *ctx;         // backend state (thread pool, streams, handles)

    // out[i][0:w->rows] = x[i][0:w->cols] . w^T for i < m, out rows `ldo`
    // floats apart (so several weights can fill column ranges of one output).
    void (*matmul)(pg_backend *b, float *out, int64_t ldo, const float *x, int64_t m,
                   const pg_weight *w);

    // out[m][dim] = x * rsqrt(mean(x^2) + eps) * weight; out may alias x.
    void (*rmsnorm)(pg_backend *b, float *out, const float *x, const float *weight, int64_t m,
                    int64_t dim, float eps);

    // x[m][dim] += y[m][dim]
    void (*add)(pg_backend *b, float *x, const float *y, int64_t m, int64_t dim);

    // out[m][ffn] = silu(gate_up[m][0:ffn]) * gate_up[m][ffn:2ffn]
    void (*silu_mul)(pg_backend *b, float *out, const float *gate_up, int64_t m, int64_t ffn);

    // out[m][dim] = dequantized rows ids[m] of the embedding table `emb`.
    void (*embed)(pg_backend *b, float *out, const int32_t *ids, int64_t m, const pg_weight *emb);

    // Rotary embedding (rotate-half / NeoX layout, as in Hugging Face
    // checkpoints) applied in place to q[m][n_heads][head_dim] and
    // k[m][n_kv_heads][head_dim] at positions pos[m], with per-pair inverse
    // frequencies inv_freq[head_dim/2]; then k and v[m][n_kv_heads][head_dim]
    // are written to the cache at slots[m] (block * block_size + offset).
    void (*rope_kv_write)(pg_backend *b, float *q, float *k, const float *v, const int32_t *pos,
                          const int32_t *slots, int64_t m, int32_t n_heads, const float *inv_freq,
                          float *k_cache, float *v_cache, pg_kv_shape kv);

    // Causal attention over the paged cache for every sequence of the batch:
    // out[m][n_heads][head_dim] from q[m][n_heads][head_dim]; query head h
    // reads KV head h / (n_heads / n_kv_heads).
    void (*attention)(pg_backend *b, float *out, const float *q, const pg_attn_seq *seqs,
                      int32_t n_seqs, int32_t n_heads, float scale, const float *k_cache,
                      const float *v_cache, pg_kv_shape kv);

    // Copies whole KV blocks within the cache (copy-on-write).
    void (*copy_blocks)(pg_backend *b, float *k_cache, float *v_cache, pg_kv_shape kv,
                        const int32_t *from, const int32_t *to, int32_t n);

    void (*destroy)(pg_backend *b);

    // Read by every op call; set it before the first forward of a sequence
    // (the KV cache written under one mode is read under the same one). A
    // backend without the choice ignores it. Zero (calloc) is the default.
    pg_matmul_mode matmul_mode;
};

// The CPU backend with `n_threads` threads (0 = all online CPUs).
int pg_backend_cpu_create(int n_threads, pg_backend **out);
