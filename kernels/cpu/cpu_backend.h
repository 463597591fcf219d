// kernels/cpu/cpu_backend.h - internals shared by the CPU backend's files.
#pragma once
#include "common/thread_pool.h"
#include "kernels/kernels.h"

typedef struct {
    pg_pool *pool;
    int n_threads;
    // Per-thread scratch for dequantized weight panels (sgemm path).
    float **scratch;
    size_t *scratch_cap; // floats
    // Quantized activations of the matmul in flight (pg_xq, quant_dot.h);
    // one buffer, since the pool has one caller at a time.
    void *xq_mem;
    size_t xq_cap; // bytes
} pg_cpu_ctx;

static inline pg_cpu_ctx *pg_cpu(pg_backend *b) {
    return (pg_cpu_ctx *)b->ctx;
}

// Returns thread `t`'s scratch with room for at least `n` floats.
float *pg_cpu_scratch(pg_cpu_ctx *c, int t, size_t n);

// True when pg_cpu_matmul() quantizes the activations for weights of this
// dtype under b->matmul_mode (else it computes in exact f32).
bool pg_cpu_matmul_quantizes(const pg_backend *b, int dtype);
// True when the CPU ops follow llama.cpp's arithmetic (every mode but
// PG_MATMUL_EXACT; kernels/cpu/llama_compat.h).
static inline bool pg_cpu_llama_compat(const pg_backend *b) {
    return b->matmul_mode != PG_MATMUL_EXACT;
}
// True when the attention and the KV cache use the compatible layout and
// arithmetic: K stored in llama.cpp's dimension order, fp16-rounded.
static inline bool pg_cpu_attention_compat(const pg_backend *b, int32_t head_dim) {
    return pg_cpu_llama_compat(b) && head_dim % 8 == 0 && head_dim <= 512;
}

void pg_cpu_matmul(pg_backend *b, float *out, int64_t ldo, const float *x, int64_t m,
                   const pg_weight *w);
void pg_cpu_attention(pg_backend *b, float *out, const float *q, const pg_attn_seq *seqs,
                      int32_t n_seqs, int32_t n_heads, float scale, const float *k_cache,
                      const float *v_cache, pg_kv_shape kv);

// Single-threaded dot products of one weight row with x rows, used by the
// matmul and tested against the dequantize-then-dot reference.
// out[i] = dot(dequant(wrow), x[i]) for i < m, x rows `ld` floats apart.
void pg_cpu_dot_rows(int dtype, const void *wrow, int64_t cols, const float *x, int64_t m,
                     int64_t ld, float *out, int64_t out_stride);
