// bench/cuda/attention_decode_v1.cuh - decode attention v1, the CUDA-core
// baseline: one CTA per (sequence, query head), warps stride over keys with
// an online softmax each, merged at the end; each query head re-reads its
// KV head (G times the bytes), no split. The product never runs it (it left
// kernels/cuda/attention.cu, as llm.c keeps its numbered versions in
// dev/cuda/); bench_cuda_attention times it and test_cuda_kernels checks it.
// #include into one translation unit per program (anonymous namespace).
#pragma once
#include "kernels/cuda/attention_common.cuh"

namespace {

template <int HD>
__global__ void __launch_bounds__(NTHREADS)
paged_decode_v1_kernel(bf16 *out, const bf16 *q, int64_t q_stride, const bf16 *k_cache,
                       const bf16 *v_cache, const int32_t *block_tables, int64_t bt_stride,
                       const int32_t *seq_lens, int n_heads, int n_kv, int bs_shift, float scale) {
    constexpr int EPL = HD / 32; // elements per lane
    const int s = blockIdx.x, h = blockIdx.y;
    const int kvh = h / (n_heads / n_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int len = seq_lens[s];
    const int32_t *bt = block_tables + (size_t)s * bt_stride;
    float qv[EPL], acc[EPL];
    const bf16 *qp = q + (size_t)s * q_stride + (size_t)h * HD + lane * EPL;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        qv[e] = __bfloat162float(qp[e]) * scale;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t = warp; t < len; t += NTHREADS / 32) {
        int64_t slot = ((int64_t)bt[t >> bs_shift] << bs_shift) + (t & ((1 << bs_shift) - 1));
        size_t off = ((size_t)slot * n_kv + kvh) * HD + lane * EPL;
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) d += qv[e] * __bfloat162float(k_cache[off + e]);
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) d += __shfl_xor_sync(0xffffffffu, d, x);
        float m_new = fmaxf(m, d);
        float corr = expf(m - m_new), pw = expf(d - m_new);
        l = l * corr + pw;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[e] = acc[e] * corr + pw * __bfloat162float(v_cache[off + e]);
        m = m_new;
    }
    __shared__ float sm_m[NTHREADS / 32], sm_l[NTHREADS / 32];
    __shared__ float sm_o[NTHREADS / 32][HD];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) sm_o[warp][lane * EPL + e] = acc[e];
    __syncthreads();
    float ms = -INFINITY;
    for (int w = 0; w < NTHREADS / 32; w++) ms = fmaxf(ms, sm_m[w]);
    for (int c = threadIdx.x; c < HD; c += NTHREADS) {
        float num = 0.0f, den = 0.0f;
        for (int w = 0; w < NTHREADS / 32; w++) {
            float f = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - ms);
            num += f * sm_o[w][c];
            den += f * sm_l[w];
        }
        out[((size_t)s * n_heads + h) * HD + c] = __float2bfloat16(den > 0.0f ? num / den : 0.0f);
    }
}


// The decode contract of pg_cuda_paged_decode_attention (bf16 KV only; no
// workspace), through v1. PG_EUNSUPP for an fp8 cache, head_dim other than
// 64/128 or a block size that is not a power of two >= 8.
int bench_decode_v1(void *out, const void *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                    pg_kv_shape kv, const int32_t *block_tables, int32_t bt_stride, const int32_t *seq_lens,
                    int32_t n_seqs, int32_t n_heads, float scale, void *stream) {
    PG_ARG(out && q && k_cache && v_cache && block_tables && seq_lens, "decode v1: null pointer");
    PG_ARG(n_seqs >= 0 && n_heads > 0 && kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0,
           "decode v1: %d query heads over %d KV heads", n_heads, kv.n_kv_heads);
    if (kv.dtype != PG_KV_BF16) return pg_err_set(PG_EUNSUPP, "decode attention v1: fp8 KV cache (only v2 and v4)");
    if ((kv.head_dim != 64 && kv.head_dim != 128) || log2_exact(kv.block_size) < 3)
        return pg_err_set(PG_EUNSUPP, "decode v1: head_dim %d, block_size %d", kv.head_dim, kv.block_size);
    if (n_seqs == 0) return 0;
    dim3 grid((unsigned)n_seqs, (unsigned)n_heads);
    cudaStream_t st = pg_stream(stream);
    if (kv.head_dim == 64)
        paged_decode_v1_kernel<64><<<grid, NTHREADS, 0, st>>>((bf16 *)out, (const bf16 *)q, q_stride,
                                                              (const bf16 *)k_cache, (const bf16 *)v_cache,
                                                              block_tables, bt_stride, seq_lens, n_heads,
                                                              kv.n_kv_heads, log2_exact(kv.block_size), scale);
    else
        paged_decode_v1_kernel<128><<<grid, NTHREADS, 0, st>>>((bf16 *)out, (const bf16 *)q, q_stride,
                                                               (const bf16 *)k_cache, (const bf16 *)v_cache,
                                                               block_tables, bt_stride, seq_lens, n_heads,
                                                               kv.n_kv_heads, log2_exact(kv.block_size), scale);
    PG_CUDA_LAUNCHED("paged_decode_v1_kernel");
    return 0;
}

} // namespace
