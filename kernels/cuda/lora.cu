// kernels/cuda/lora.cu - batched multi-adapter LoRA on the GPU (cuda_ops.h
// pg_cuda_lora_apply; kernels/backend.h lora_apply; docs/lora.md), the CUDA
// twin of kernels/cpu/lora.c in Punica's BGMV shape (one CTA per row, each
// row reading its own slot's adapter):
//
//   1. stage     the rows' slots (host) -> int8 [m] in the workspace, by
//                copy kernels whose parameters carry them (STAGE rows each)
//   2. shrink    t[i][0:rank) = x[i] . a_s^T    one CTA per row, a warp per
//                rank index (8 warps stride the ranks), f32, 16-byte loads
//                where x's row and a's rows are aligned, else scalar
//   3. expand    out[i][j] = bf16(out[i][j] + scale_s * t[i] . b_s[j])
//                CTAs of 256 columns per row, t[i] in shared memory
//
// The slot table (device pointers, ranks, scales; at most
// PG_CUDA_LORA_MAX_SLOTS) travels by value as a kernel parameter. Rows with
// slot -1 (or whose slot has no `a`) are staged as -1 and their CTAs leave
// at once: they are never written. An adapter's matrices are read once per
// row that uses it (from L2 after the first): the right shape for decode
// steps; a grouped SGMV (rows sorted by slot, a tile of rows sharing each
// weight load, as moe.cu's moe_align) is the step after this for prefill.
// Every value of a row depends only on that row and its slot, in a fixed
// order: the same bits for any batch.
//
// Not graph-safe (the staged slots and the table are values baked into the
// launches): under stream capture the launcher refuses (PG_EUNSUPP).
#include <limits.h>

#include "kernels/cuda/cuda_common.cuh"
extern "C" {
#include "kernels/dtype.h"
}

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int STAGE = 3072; // rows staged per copy kernel (its parameter: 3 KiB, under the 4 KiB limit)

struct LoraTable {
    const bf16 *a[PG_CUDA_LORA_MAX_SLOTS];
    const bf16 *b[PG_CUDA_LORA_MAX_SLOTS];
    float scale[PG_CUDA_LORA_MAX_SLOTS];
    int32_t rank[PG_CUDA_LORA_MAX_SLOTS];
};

struct LoraStage {
    int8_t s[STAGE];
};

size_t up256(size_t v) { return (v + 255) / 256 * 256; }

__global__ void lora_stage_kernel(int8_t *dst, const LoraStage st, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = st.s[i];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// t[i][r] = x[i] . a_s[r] for r < rank_s; grid m, THREADS threads.
__global__ void __launch_bounds__(THREADS) lora_shrink_kernel(float *t, int tstride, const bf16 *x, int64_t ldx,
                                                              int64_t in, const int8_t *row_slot,
                                                              const LoraTable tab) {
    const int64_t i = blockIdx.x;
    const int s = row_slot[i];
    if (s < 0) return;
    const int rank = tab.rank[s];
    const bf16 *xr = x + i * ldx;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < rank; r += WARPS) {
        const bf16 *ar = tab.a[s] + (int64_t)r * in;
        float acc = 0.f;
        if ((in & 7) == 0 && ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(ar)) & 15) == 0) {
            for (int64_t k = (int64_t)lane * 8; k < in; k += 32 * 8) {
                float xf[8], af[8];
                pg_unpack8(*reinterpret_cast<const uint4 *>(xr + k), xf);
                pg_unpack8(*reinterpret_cast<const uint4 *>(ar + k), af);
#pragma unroll
                for (int e = 0; e < 8; e++) acc = fmaf(xf[e], af[e], acc);
            }
        } else {
            for (int64_t k = lane; k < in; k += 32) acc = fmaf(__bfloat162float(xr[k]), __bfloat162float(ar[k]), acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) t[i * tstride + r] = acc;
    }
}

// out[i][j] += scale_s * t[i] . b_s[j] for j < out_cols; grid (m, column
// blocks of THREADS), one column a thread.
__global__ void __launch_bounds__(THREADS) lora_expand_kernel(bf16 *out, int64_t ldo, int64_t out_cols,
                                                              const float *t, int tstride, const int8_t *row_slot,
                                                              const LoraTable tab) {
    __shared__ float ts[PG_CUDA_LORA_MAX_RANK];
    const int64_t i = blockIdx.x;
    const int s = row_slot[i];
    if (s < 0) return;
    const int rank = tab.rank[s];
    if (threadIdx.x < rank) ts[threadIdx.x] = t[i * tstride + threadIdx.x];
    __syncthreads();
    const int64_t j = (int64_t)blockIdx.y * THREADS + threadIdx.x;
    if (j >= out_cols) return;
    const bf16 *br = tab.b[s] + j * rank;
    float acc = 0.f;
    if ((rank & 7) == 0 && (reinterpret_cast<uintptr_t>(br) & 15) == 0) {
        for (int r = 0; r < rank; r += 8) {
            float bf[8];
            pg_unpack8(*reinterpret_cast<const uint4 *>(br + r), bf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc = fmaf(ts[r + e], bf[e], acc);
        }
    } else {
        for (int r = 0; r < rank; r++) acc = fmaf(ts[r], __bfloat162float(br[r]), acc);
    }
    bf16 *o = out + i * ldo + j;
    *o = __float2bfloat16(__bfloat162float(*o) + tab.scale[s] * acc);
}

} // namespace

int pg_cuda_lora_apply(void *out, int64_t ldo, const void *x, int64_t ldx, int64_t m, int64_t in, int64_t out_cols,
                       const int32_t *row_slot, const pg_cuda_lora_slot *slots, int32_t n_slots, void *ws,
                       size_t ws_bytes, void *stream) {
    PG_ARG(m >= 0 && m <= INT_MAX && in >= 1 && out_cols >= 1 && ldx >= in && ldo >= out_cols,
           "cuda lora_apply: %lld rows of %lld -> %lld, strides %lld / %lld", (long long)m, (long long)in,
           (long long)out_cols, (long long)ldx, (long long)ldo);
    PG_ARG(n_slots >= 0 && (m == 0 || (row_slot && (slots || n_slots == 0))), "cuda lora_apply: no slot table");
    if (n_slots > PG_CUDA_LORA_MAX_SLOTS)
        return pg_err_set(PG_EUNSUPP, "cuda lora_apply: %d adapter slots, the kernels take at most %d", n_slots,
                          PG_CUDA_LORA_MAX_SLOTS);
    PG_ARG(out_cols <= (int64_t)65535 * THREADS, "cuda lora_apply: %lld output columns", (long long)out_cols);
    if (m == 0) return 0;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    PG_CUDA_TRY(cudaStreamIsCapturing(pg_stream(stream), &cap));
    if (cap != cudaStreamCaptureStatusNone)
        return pg_err_set(PG_EUNSUPP, "cuda lora_apply: not graph-safe (the rows' slots are host values baked into "
                                      "the launches); run LoRA steps outside stream capture");
    int32_t max_rank = 0;
    for (int64_t i = 0; i < m; i++) {
        const int32_t s = row_slot[i];
        PG_ARG(s >= -1 && s < n_slots, "cuda lora_apply: row %lld names slot %d of %d", (long long)i, s, n_slots);
        if (s < 0 || !slots[s].a) continue;
        const pg_cuda_lora_slot *sl = &slots[s];
        if (sl->dtype != PG_DTYPE_BF16)
            return pg_err_set(PG_EUNSUPP, "cuda lora_apply: slot %d's adapter is %s; the GPU runs bf16 adapters "
                                          "(weight_upload makes f32 / f16 ones bf16)", s, pg_dtype_name(sl->dtype));
        PG_ARG(sl->b && sl->rank >= 1, "cuda lora_apply: slot %d: rank %d, B %s", s, sl->rank, sl->b ? "set" : "NULL");
        if (sl->rank > PG_CUDA_LORA_MAX_RANK)
            return pg_err_set(PG_EUNSUPP, "cuda lora_apply: slot %d has rank %d, the kernels take at most %d", s,
                              sl->rank, PG_CUDA_LORA_MAX_RANK);
        max_rank = sl->rank > max_rank ? sl->rank : max_rank;
    }
    if (max_rank == 0) return 0; // no row has an adapter here
    PG_ARG(out && x, "cuda lora_apply: null rows");
    const size_t need = pg_cuda_lora_workspace_size(m, max_rank);
    PG_ARG(ws && ws_bytes >= need && ((uintptr_t)ws & 3) == 0,
           "cuda lora_apply: workspace %zu bytes, %lld rows of rank %d want %zu (4-byte aligned)", ws_bytes,
           (long long)m, max_rank, need);
    int8_t *rs = (int8_t *)ws;
    float *t = (float *)((char *)ws + up256((size_t)m));
    cudaStream_t st = pg_stream(stream);

    LoraStage stage;
    for (int64_t i0 = 0; i0 < m; i0 += STAGE) {
        const int n = (int)(m - i0 < STAGE ? m - i0 : STAGE);
        for (int k = 0; k < n; k++) {
            const int32_t s = row_slot[i0 + k];
            stage.s[k] = (int8_t)(s >= 0 && slots[s].a ? s : -1);
        }
        lora_stage_kernel<<<1, THREADS, 0, st>>>(rs + i0, stage, n);
        PG_CUDA_LAUNCHED("lora_stage_kernel");
    }
    LoraTable tab;
    memset(&tab, 0, sizeof tab);
    for (int32_t s = 0; s < n_slots; s++) {
        if (!slots[s].a) continue;
        tab.a[s] = (const bf16 *)slots[s].a;
        tab.b[s] = (const bf16 *)slots[s].b;
        tab.scale[s] = slots[s].scale;
        tab.rank[s] = slots[s].rank;
    }
    lora_shrink_kernel<<<(unsigned)m, THREADS, 0, st>>>(t, max_rank, (const bf16 *)x, ldx, in, rs, tab);
    PG_CUDA_LAUNCHED("lora_shrink_kernel");
    const dim3 grid((unsigned)m, (unsigned)pg_ceil_div(out_cols, THREADS));
    lora_expand_kernel<<<grid, THREADS, 0, st>>>((bf16 *)out, ldo, out_cols, t, max_rank, rs, tab);
    PG_CUDA_LAUNCHED("lora_expand_kernel");
    return 0;
}
