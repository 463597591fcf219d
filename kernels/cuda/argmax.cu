// kernels/cuda/argmax.cu - greedy sampling over a vocabulary split across
// tensor-parallel ranks (kernels/backend.h argmax_rows / argmax_pick):
// each rank reduces its logit rows to (max, column), the ranks exchange
// those pairs, and every rank picks the same winner. The CPU backend's
// cpu_argmax_rows / cpu_argmax_pick are the references
// (tests/gpu/test_cuda_kernels.cu compares them).
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
