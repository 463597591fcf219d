// kernels/cuda/argmax.cu - greedy sampling over a vocabulary split across
// tensor-parallel ranks (kernels/backend.h argmax_rows / argmax_pick):
// each rank reduces its logit rows to (max, column), the ranks exchange
// those pairs, and every rank picks the same winner. The CPU backend's
// cpu_argmax_rows / cpu_argmax_pick are the references
// (tests/gpu/test_cuda_kernels.cu compares them). Top-k sampling the same
// way (topk_rows / topk_scatter): each rank keeps its rows' best k entries
// in the sampler's order, and the exchanged entries are scattered into a
// row of -inf that the sampler then reads.
#include <cuda_runtime.h>
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

extern "C" {
#include "common/err.h"
#include "kernels/backend.h"
}

namespace {

constexpr int ARGMAX_THREADS = 256;

// Is (v, i) better than (bv, bi)? Larger value; equal values: lower column.
__device__ __forceinline__ bool better(float v, int32_t i, float bv, int32_t bi) {
    return v > bv || (v == bv && i < bi);
}

// One block per row: a strided scan per thread, then a tree over the block.
template <typename T>
__global__ void argmax_rows_kernel(pg_argmax *out, const T *x, int64_t cols, int64_t ld) {
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int32_t si[ARGMAX_THREADS];
    const T *row = x + (int64_t)blockIdx.x * ld;
    float bv = -INFINITY;
    int32_t bi = INT32_MAX;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = (float)row[j];
        if (better(v, (int32_t)j, bv, bi)) bv = v, bi = (int32_t)j;
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        // A row of -inf (or NaN) keeps column 0, as the CPU reference does.
        out[blockIdx.x] = pg_argmax{si[0] == INT32_MAX ? (float)row[0] : sv[0], si[0] == INT32_MAX ? 0 : si[0]};
    }
}

__global__ void argmax_pick_kernel(pg_sample_out *out, const pg_argmax *cand, int32_t n_ranks, int32_t n,
                                   int32_t ids_per_rank) {
    const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int32_t best = 0;
    for (int32_t r = 1; r < n_ranks; r++)
        if (cand[(int64_t)r * n + i].value > cand[(int64_t)best * n + i].value) best = r;
    pg_sample_out o;
    memset(&o, 0, sizeof o);
    o.token = best * ids_per_rank + cand[(int64_t)best * n + i].index;
    out[i] = o;
}

constexpr int TOPK_THREADS = 256;

// Float bits -> an unsigned order (larger float = larger integer).
__device__ __forceinline__ uint32_t topk_ord(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A unique key per column, larger = earlier in the sampler's order: larger
// s, then lower column. -0 ties +0 and NaN sorts as -inf. Never 0 (that
// would need s's ordered bits 0, a NaN) nor UINT64_MAX (ord(+inf) is below
// 0xFFFFFFFF): 0 means "none", UINT64_MAX is the first round's bound.
__device__ __forceinline__ uint64_t topk_key(float s, int64_t col) {
    if (s != s) s = -INFINITY;
    if (s == 0.0f) s = 0.0f;
    return ((uint64_t)topk_ord(s) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)col);
}

__device__ __forceinline__ float topk_ld(const float *p, int64_t j) { return p[j]; }
__device__ __forceinline__ float topk_ld(const bf16 *p, int64_t j) { return __bfloat162float(p[j]); }
__device__ __forceinline__ void topk_st(float *p, int64_t j, float v) { p[j] = v; }
__device__ __forceinline__ void topk_st(bf16 *p, int64_t j, float v) { p[j] = __float2bfloat16_rn(v); }

// The largest key over the block (every thread gets it).
__device__ __forceinline__ uint64_t topk_block_max(uint64_t v, uint64_t *sh) {
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t w = __shfl_down_sync(0xFFFFFFFFu, (unsigned long long)v, o);
        v = w > v ? w : v;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t m = sh[0];
        for (int w = 1; w < TOPK_THREADS / 32; w++) m = sh[w] > m ? sh[w] : m;
        sh[TOPK_THREADS / 32] = m;
    }
    __syncthreads();
    const uint64_t m = sh[TOPK_THREADS / 32];
    __syncthreads(); // sh is reused by the next round
    return m;
}

// One block per row, k rounds: round j takes the largest key strictly below
// round j - 1's, so the entries come out in the sampler's order. s uses
// round-to-nearest float ops without contraction, as the CPU's
// (l - mx) * inv_t.
template <typename T>
__global__ void topk_rows_kernel(pg_argmax *out, const T *x, int64_t rows, int64_t cols, int64_t ld, int32_t k,
                                 const pg_argmax *cand, int32_t n_ranks, const pg_sample_params *params,
                                 int32_t col0) {
    __shared__ uint64_t sh[TOPK_THREADS / 32 + 1];
    const int64_t i = blockIdx.x;
    const T *row = x + i * ld;
    float mx = cand[i].value;
    for (int32_t r = 1; r < n_ranks; r++) { // as the CPU's loop (a NaN maximum stays NaN)
        const float v = cand[(int64_t)r * rows + i].value;
        mx = v > mx ? v : mx;
    }
    const float t = params[i].temperature;
    const float inv_t = (t <= 0.0f || params[i].top_k == 1) ? 1.0f : __fdiv_rn(1.0f, t);
    pg_argmax *o = out + i * k;
    uint64_t bound = ~(uint64_t)0;
    for (int32_t j = 0; j < k; j++) {
        uint64_t best = 0;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            const uint64_t key = topk_key(__fmul_rn(__fsub_rn(topk_ld(row, c), mx), inv_t), c);
            if (key < bound && key > best) best = key;
        }
        best = topk_block_max(best, sh);
        if (best == 0) { // fewer than k columns: pad the rest
            for (int32_t e = j + threadIdx.x; e < k; e += blockDim.x) o[e] = pg_argmax{-INFINITY, -1};
            return;
        }
        if (threadIdx.x == 0) {
            const int64_t c = (int64_t)(0xFFFFFFFFu - (uint32_t)best);
            o[j] = pg_argmax{topk_ld(row, c), col0 + (int32_t)c};
        }
        bound = best;
    }
}

// One block per row: the row's columns to -inf, then the candidates of every
// rank (distinct columns, so no two threads write one element).
template <typename T>
__global__ void topk_scatter_kernel(T *logits, int64_t rows, int64_t cols, int64_t ld, const pg_argmax *cand,
                                    int32_t n_ranks, int32_t k) {
    const int64_t i = blockIdx.x;
    T *row = logits + i * ld;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) topk_st(row, c, -INFINITY);
    __syncthreads();
    const int32_t n = n_ranks * k;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        const int32_t r = e / k, j = e - r * k;
        const pg_argmax c = cand[((int64_t)r * rows + i) * k + j];
        if (c.index >= 0 && c.index < cols) topk_st(row, c.index, c.value);
    }
}

} // namespace

extern "C" int pg_cuda_argmax_rows(pg_argmax *out, const void *x, int dtype, int64_t rows, int64_t cols, int64_t ld,
                                   void *stream) {
    PG_ARG(out && x && rows >= 0 && cols > 0 && ld >= cols, "argmax_rows: %lld x %lld (ld %lld)", (long long)rows,
           (long long)cols, (long long)ld);
    if (rows == 0) return 0;
    if (dtype == PG_DTYPE_F32)
        argmax_rows_kernel<float><<<(unsigned)rows, ARGMAX_THREADS, 0, pg_stream(stream)>>>(out, (const float *)x,
                                                                                            cols, ld);
    else
        argmax_rows_kernel<bf16><<<(unsigned)rows, ARGMAX_THREADS, 0, pg_stream(stream)>>>(out, (const bf16 *)x,
                                                                                           cols, ld);
    PG_CUDA_LAUNCHED("argmax_rows_kernel");
    return 0;
}

extern "C" int pg_cuda_argmax_pick(pg_sample_out *out, const pg_argmax *cand, int32_t n_ranks, int32_t n,
                                   int32_t ids_per_rank, void *stream) {
    PG_ARG(out && cand && n_ranks >= 1 && n >= 0, "argmax_pick: %d ranks, %d rows", n_ranks, n);
    if (n == 0) return 0;
    argmax_pick_kernel<<<pg_ceil_div(n, 128), 128, 0, pg_stream(stream)>>>(out, cand, n_ranks, n, ids_per_rank);
    PG_CUDA_LAUNCHED("argmax_pick_kernel");
    return 0;
}

extern "C" int pg_cuda_topk_rows(pg_argmax *out, const void *x, int dtype, int64_t rows, int64_t cols, int64_t ld,
                                 int32_t k, const pg_argmax *cand, int32_t n_ranks, const pg_sample_params *params,
                                 int32_t col0, void *stream) {
    PG_ARG(out && x && cand && params && rows >= 0 && cols > 0 && cols <= INT32_MAX && ld >= cols && k >= 1 &&
               k <= PG_TOPK_EXCHANGE_MAX && n_ranks >= 1 && col0 >= 0,
           "topk_rows: %lld x %lld (ld %lld), k %d, %d ranks, col0 %d", (long long)rows, (long long)cols,
           (long long)ld, k, n_ranks, col0);
    if (rows == 0) return 0;
    if (dtype == PG_DTYPE_F32)
        topk_rows_kernel<float><<<(unsigned)rows, TOPK_THREADS, 0, pg_stream(stream)>>>(
            out, (const float *)x, rows, cols, ld, k, cand, n_ranks, params, col0);
    else
        topk_rows_kernel<bf16><<<(unsigned)rows, TOPK_THREADS, 0, pg_stream(stream)>>>(
            out, (const bf16 *)x, rows, cols, ld, k, cand, n_ranks, params, col0);
    PG_CUDA_LAUNCHED("topk_rows_kernel");
    return 0;
}

extern "C" int pg_cuda_topk_scatter(void *logits, int dtype, int64_t rows, int64_t cols, int64_t ld,
                                    const pg_argmax *cand, int32_t n_ranks, int32_t k, void *stream) {
    PG_ARG(logits && cand && rows >= 0 && cols > 0 && ld >= cols && n_ranks >= 1 && k >= 1 &&
               k <= PG_TOPK_EXCHANGE_MAX,
           "topk_scatter: %lld x %lld (ld %lld), %d ranks, k %d", (long long)rows, (long long)cols, (long long)ld,
           n_ranks, k);
    if (rows == 0) return 0;
    if (dtype == PG_DTYPE_F32)
        topk_scatter_kernel<float><<<(unsigned)rows, TOPK_THREADS, 0, pg_stream(stream)>>>(
            (float *)logits, rows, cols, ld, cand, n_ranks, k);
    else
        topk_scatter_kernel<bf16><<<(unsigned)rows, TOPK_THREADS, 0, pg_stream(stream)>>>(
            (bf16 *)logits, rows, cols, ld, cand, n_ranks, k);
    PG_CUDA_LAUNCHED("topk_scatter_kernel");
    return 0;
}
