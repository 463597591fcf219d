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
} pg_cpu_ctx;

static inline pg_cpu_ctx *pg_cpu(pg_backend *b) { return (pg_cpu_ctx *)b->ctx; }

// Returns thread `t`'s scratch with room for at least `n` floats.
float *pg_cpu_scratch(pg_cpu_ctx *c, int t, size_t n);

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
