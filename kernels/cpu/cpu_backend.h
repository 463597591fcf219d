// kernels/cpu/cpu_backend.h - internals shared by the CPU backend's files
// (and the CPU kernel tests, which call these directly).
//
// The CPU backend (backend_cpu.c) implements kernels/backend.h with f32
// activations over these kernels; weights stay as stored (GGUF block types
// included) and the KV cache is f32, f16, bf16 or q8_0 (kv_cache.c).
#pragma once
#include "common/thread_pool.h"
#include "kernels/backend.h"

typedef struct pg_cpu_ctx {
    pg_pool *pool;
    int n_threads;
    pg_matmul_mode mode; // numerics (kernels/kernels.h)
    // Per-thread scratch for dequantized weight panels (sgemm path) and
    // attention scores.
    float **scratch;
    size_t *scratch_cap; // floats
    // Quantized activations of the matmul in flight (pg_xq, quant_dot.h);
    // one buffer, since the pool has one caller at a time.
    void *xq_mem;
    size_t xq_cap; // bytes
    struct pg_sampler *sampler; // the CPU sampler (kernels/cpu/sampling.c)
    float *sample_row;          // [vocab] one row of logits being sampled
    int64_t sample_cap;
    double *prof_t; // [PG_PROF_MARKS] timer_mark's clock stamps (ms), allocated on first use
} pg_cpu_ctx;

static inline pg_cpu_ctx *pg_cpu(pg_backend *b) {
    return (pg_cpu_ctx *)b->ctx;
}

// One sequence of the batch as the CPU attention sees it. Its queries are
// rows [q_start, q_start + n_q) of the flattened batch, at positions
// [start_pos, start_pos + n_q); keys and values for positions
// [0, start_pos + n_q) live in the paged cache through `block_table`.
typedef struct pg_attn_seq {
    int32_t q_start;
    int32_t n_q;
    int32_t start_pos;
    const int32_t *block_table; // [ceil((start_pos + n_q) / block_size)]
    int32_t window;             // > 0: the query at position p sees keys (p - window, p] only
    float softcap;              // > 0: every score s becomes softcap * tanh(s / softcap) (Gemma 2)
} pg_attn_seq;

// The next piece of a workspace (lora.c, moe.c): n elements at *off, which then
// advances past them rounded up to 64 bytes (a cache line); base NULL: sizes only.
static inline void *pg_cpu_ws_piece(char *base, size_t *off, size_t elem_bytes, int64_t n) {
    void *piece = base ? base + *off : NULL;
    *off += (elem_bytes * (size_t)n + 63) & ~(size_t)63;
    return piece;
}

// --- KV cache elements (kv_cache.c) --------------------------------------------------
// A cache row is one token's K (or V) of one head, head_dim elements, in
// pg_kv_shape.dtype: PG_KV_NATIVE / PG_KV_F32 (f32), PG_KV_F16,
// PG_KV_BF16_CPU, PG_KV_Q8_0 (blocks of 32 along the row: fp16 d, then 32
// int8; head_dim a multiple of 32), PG_KV_FP8_E4M3 (1 byte an element,
// scale 1.0), PG_KV_FP8_E4M3_SCALED (an f32 scale, then head_dim e4m3).
// The types without a per-head part also take rows of several heads.
// (PG_KV_Q8_0_ELEMS and PG_KV_Q8_0_BYTES: kernels/kernels.h.)

// Bytes of a row of n elements; 0 for a q8_0 row that is not whole blocks.
size_t pg_cpu_kv_row_bytes(int32_t dtype, int64_t n);
// dst (pg_cpu_kv_row_bytes(dtype, n) bytes) = src[0:n] stored as dtype.
void pg_cpu_kv_store_row(int32_t dtype, void *dst, const float *src, int64_t n);
// dst[0:n] = the row at src as f32 (exact: every stored value is an f32;
// fp8 e4m3 scaled: the product of two, rounded once).
void pg_cpu_kv_load_row(int32_t dtype, const void *src, float *dst, int64_t n);
// The 256 e4m3 codes as f32 (pg_fp8_e4m3_to_f32), for the attention's loads.
const float *pg_cpu_fp8_e4m3_table(void);

// Returns thread `t`'s scratch with room for at least `n` floats.
float *pg_cpu_scratch(pg_cpu_ctx *c, int t, size_t n);

// True when pg_cpu_matmul() quantizes the activations for weights of this
// dtype under the context's mode (else it computes in exact f32).
bool pg_cpu_matmul_quantizes(const pg_cpu_ctx *c, int dtype);
// True when the CPU ops follow llama.cpp's arithmetic (every mode but
// PG_MATMUL_EXACT; kernels/cpu/llama_compat.h).
static inline bool pg_cpu_llama_compat(const pg_cpu_ctx *c) {
    return c->mode != PG_MATMUL_EXACT;
}
// True when the attention and the KV cache use the compatible layout and
// arithmetic: K stored in llama.cpp's dimension order, fp16-rounded.
static inline bool pg_cpu_attention_compat(const pg_cpu_ctx *c, int32_t head_dim) {
    return pg_cpu_llama_compat(c) && head_dim % 8 == 0 && head_dim <= 512;
}

// out[i][0:w->rows] = x[i][0:w->cols] . w^T for i < m, out rows `ldo`
// floats apart, x rows contiguous.
void pg_cpu_matmul(pg_cpu_ctx *c, float *out, int64_t ldo, const float *x, int64_t m,
                   const pg_weight *w);
// pg_cpu_matmul over a backend weight: out[i][0:w->rows] = x[i] . w^T for
// i < m, its parts (Q|K|V, gate|up) into consecutive column ranges; any
// type the CPU runs (GGUF blocks, f32, bf16, FP8, int4). ldo as above.
void pg_cpu_matmul_weight(pg_cpu_ctx *c, float *out, int64_t ldo, const float *x, int64_t m,
                          const pg_bweight *w);
// A vector weight's values as f32 (rows == 1: norms, biases).
const float *pg_cpu_weight_vec(const pg_bweight *w);
// The MoE feed-forward (kernels/backend.h moe_ffn; kernels/cpu/moe.c).
int pg_cpu_moe_ffn(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                   const pg_bweight *router, const pg_bweight *const *gate_up,
                   const pg_bweight *const *down, int32_t n_experts, int32_t top_k, bool renorm,
                   bool accumulate, void *workspace, size_t workspace_bytes);
size_t pg_cpu_moe_workspace_bytes(pg_backend *b, int32_t max_rows, int32_t hidden, int32_t ffn,
                                  int32_t n_experts, int32_t top_k);
// Batched multi-adapter LoRA (kernels/backend.h lora_apply; kernels/cpu/lora.c).
int pg_cpu_lora_apply(pg_backend *b, pg_tensor out, pg_tensor x, const int32_t *row_slot,
                      const pg_lora_slot *slots, int32_t n_slots, void *workspace, size_t workspace_bytes);
size_t pg_cpu_lora_workspace_bytes(pg_backend *b, int32_t max_rows, int32_t in_cols, int32_t out_cols,
                                   int32_t max_rank, int32_t n_slots);
// The graph-safe op's contract (backend.h lora_apply_dev, lora_table_write;
// kernels/cpu/lora.c): the reference the dev-row paths are checked against.
int pg_cpu_lora_table_write(pg_backend *b, pg_lora_dev_slot *dst, const pg_lora_slot *src, int64_t n);
int pg_cpu_lora_apply_dev(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                          const int32_t *row_slot, const pg_lora_dev_slot *const *tables, int32_t n_slots,
                          const int64_t *cols, int32_t n_proj, int32_t max_rank, void *workspace,
                          size_t workspace_bytes);
// out[m][dim] = x * rsqrt(mean(x^2) + eps) * weight; out may alias x.
void pg_cpu_rmsnorm(pg_cpu_ctx *c, float *out, const float *x, const float *weight, int64_t m,
                    int64_t dim, float eps);
// out[m][ffn] = silu(gate_up[m][0:ffn]) * gate_up[m][ffn:2ffn]
void pg_cpu_silu_mul(pg_cpu_ctx *c, float *out, const float *gate_up, int64_t m, int64_t ffn);
// Gemma's ops (kernels/cpu/gemma_ops.c; kernels/backend.h gate_up_gelu,
// rmsnorm_add, scale).
int pg_cpu_gate_up_gelu(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                        const pg_bweight *w, pg_tensor scratch_xn, pg_tensor scratch_gu);
int pg_cpu_rmsnorm_add(pg_backend *b, pg_tensor x, pg_tensor y, const pg_bweight *w, float eps);
int pg_cpu_scale(pg_backend *b, pg_tensor x, float s);
int pg_cpu_softcap(pg_backend *b, pg_tensor x, float cap);
// gelu with PyTorch's tanh approximation, in f32.
float pg_cpu_gelu_tanh(float x);
// RoPE of q (rows q_stride apart, n_heads heads) and k (rows k_stride
// apart, kv.n_kv_heads heads) in place at positions pos[m], then k and v
// (rows v_stride apart) to the cache at slots[m] (< 0: no write), stored
// as kv.dtype.
void pg_cpu_rope_kv_write(pg_cpu_ctx *c, float *q, int64_t q_stride, float *k, int64_t k_stride,
                          const float *v, int64_t v_stride, const int32_t *pos,
                          const int32_t *slots, int64_t m, int32_t n_heads, const float *inv_freq,
                          void *k_cache, void *v_cache, pg_kv_shape kv);
// Causal attention over the paged cache: out[m][n_heads][head_dim]
// (contiguous) from q rows q_stride apart; the caches hold kv.dtype rows,
// read as f32 a row (or 8 lanes) at a time.
void pg_cpu_attention(pg_cpu_ctx *c, float *out, const float *q, int64_t q_stride,
                      const pg_attn_seq *seqs, int32_t n_seqs, int32_t n_heads, float scale,
                      const void *k_cache, const void *v_cache, pg_kv_shape kv);

// Single-threaded dot products of one weight row with x rows, used by the
// matmul and tested against the dequantize-then-dot reference.
// out[i] = dot(dequant(wrow), x[i]) for i < m, x rows `ld` floats apart.
void pg_cpu_dot_rows(int dtype, const void *wrow, int64_t cols, const float *x, int64_t m,
                     int64_t ld, float *out, int64_t out_stride);
