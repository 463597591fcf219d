// kernels/cuda/prefill_fp8_flashinfer.cu - FlashInfer's sm90 fp8 paged
// prefill over our fp8 e4m3 KV cache (issue 29, step 3; docs/cuda_kernels.md,
// "fp8 KV through FlashInfer"): the half of prefill_flashinfer.cu that runs
// when the cache is e4m3: the default since session 21 (PAGED_CUDA_FI_FP8=0
// keeps paged's kernel for fp8 caches).
//
// FlashInfer's fp8 kernel (FA3's) multiplies e4m3 by e4m3 on the tensor
// cores, so Q must be e4m3 too. vLLM quantizes Q for it with a static scale
// (1.0 unless the checkpoint gives one); here each query head gets a
// dynamic scale, its largest |q| over the launch's rows / 448, so no value
// saturates and none needs a calibration. Q is quantized in place: row r's
// e4m3 codes go to the first half of the bytes of its own bf16 Q (the
// fused QKV row, which nothing reads after attention), so no buffer is
// added; one CTA reads a row whole into shared memory before it writes it.
// The kernel quantizes P (scaled by 448) itself; K's and V's per-head
// scales (pg_kv_shape.scales) and Q's go to its variant as per-head arrays.
#include "kernels/cuda/cuda_ops.h"

#ifdef PG_HAVE_FLASHINFER

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <flashinfer/attention/hopper/quantization/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/attention/mask.cuh>

#include "kernels/cuda/prefill_flashinfer_int.cuh"

using namespace flashinfer;

namespace pg_fi {

namespace {

// What the fp8 config (flashinfer/jit/attention/modules.py, fp8_enabled)
// generates as additional_params.
struct Fp8Extra {
    float *maybe_scale_q;
    float *maybe_scale_k;
    float *maybe_scale_v;
    double sm_scale;
    double scale_q_scalar;
    double scale_k_scalar;
    double scale_v_scalar;
};
using Fp8Params = PagedParams<cutlass::float_e4m3_t, cutlass::float_e4m3_t, Fp8Extra>;

constexpr int QMAX_ELEMS = 24576; // a Q row in 48 KB of shared memory
constexpr int AMAX_ROWS = 32;     // rows per CTA of the reduction

// amax[h] = max |q[r][h][:]| over the rows: CTA (row block, head), each
// thread a 16-byte chunk of a row, the block's maximum by atomicMax on the
// bits (non-negative floats order as their bits do).
__global__ void q_amax_kernel(float *amax, const __nv_bfloat16 *q, int64_t q_stride, int rows, int hd) {
    const int h = blockIdx.y, cpr = hd / 8; // 16-byte chunks per head row
    const int r0 = blockIdx.x * AMAX_ROWS;
    float m = 0.0f;
    for (int i = threadIdx.x; i < AMAX_ROWS * cpr; i += blockDim.x) {
        const int r = r0 + i / cpr;
        if (r >= rows) break;
        const uint4 v = *reinterpret_cast<const uint4 *>(q + (size_t)r * q_stride + (size_t)h * hd + (i % cpr) * 8);
        const __nv_bfloat162 *b = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = __bfloat1622float2(b[j]);
            m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
    }
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __shared__ float wm[32];
    if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, wm[w]);
        atomicMax(reinterpret_cast<int *>(amax + h), __float_as_int(m));
    }
}

// Row r of Q (n_heads * hd bf16) -> e4m3 codes at the row's first
// n_heads * hd bytes, q / scale[h] rounded to nearest even, saturating;
// scale[h] = amax[h] / 448 (1 where the head is all zeros), written by CTA 0.
__global__ void q_quant_kernel(float *scales, const float *amax, __nv_bfloat16 *q, int64_t q_stride, int n_heads,
                               int hd) {
    extern __shared__ __align__(16) unsigned char qrow[];
    const int n = n_heads * hd;
    __nv_bfloat16 *row = q + (size_t)blockIdx.x * q_stride;
    for (int c = threadIdx.x; c < n / 8; c += blockDim.x)
        reinterpret_cast<uint4 *>(qrow)[c] = reinterpret_cast<const uint4 *>(row)[c];
    if (blockIdx.x == 0)
        for (int h = threadIdx.x; h < n_heads; h += blockDim.x) scales[h] = amax[h] > 0.0f ? amax[h] / 448.0f : 1.0f;
    __syncthreads(); // the whole row is read before any of it is written
    const __nv_bfloat16 *src = reinterpret_cast<const __nv_bfloat16 *>(qrow);
    unsigned char *dst = reinterpret_cast<unsigned char *>(row);
    for (int c = threadIdx.x; c < n / 8; c += blockDim.x) {
        const int h = c * 8 / hd;
        const float inv = amax[h] > 0.0f ? 448.0f / amax[h] : 1.0f;
        uint2 outv;
        unsigned char *o = reinterpret_cast<unsigned char *>(&outv);
#pragma unroll
        for (int j = 0; j < 8; j++)
            o[j] = (unsigned char)__nv_cvt_float_to_fp8(__bfloat162float(src[c * 8 + j]) * inv, __NV_SATFINITE,
                                                        __NV_E4M3);
        reinterpret_cast<uint2 *>(dst)[c] = outv;
    }
}

template <int HD, bool WIN> cudaError_t launch_kernel(Fp8Params &p, bool same, cudaStream_t st) {
    if (same)
        return BatchFP8PrefillWithPagedKVCacheDispatched<HD, MaskMode::kCausal, WIN, true, StandardFP8Attention,
                                                         Fp8Params>(p, /*enable_pdl=*/false, st);
    return BatchFP8PrefillWithPagedKVCacheDispatched<HD, MaskMode::kCausal, WIN, false, StandardFP8Attention,
                                                     Fp8Params>(p, /*enable_pdl=*/false, st);
}

} // namespace

bool fp8_supports(int32_t head_dim, int32_t n_heads, float softcap) {
    return pg_cuda_head_dim_ok(head_dim) && softcap <= 0.0f &&
           (int64_t)n_heads * head_dim <= QMAX_ELEMS;
}

cudaError_t launch_fp8(const Launch &l, cudaStream_t st) {
    if (!fp8_supports(l.head_dim, l.n_heads, l.softcap)) return cudaErrorNotSupported;
    __nv_bfloat16 *q = (__nv_bfloat16 *)l.q;
    cudaError_t e = cudaMemsetAsync(l.q_amax, 0, sizeof(float) * (size_t)l.n_heads, st);
    if (e != cudaSuccess) return e;
    q_amax_kernel<<<dim3((l.rows + AMAX_ROWS - 1) / AMAX_ROWS, l.n_heads), 128, 0, st>>>(l.q_amax, q, l.q_stride,
                                                                                         l.rows, l.head_dim);
    const size_t smem = (size_t)l.n_heads * l.head_dim * 2;
    q_quant_kernel<<<l.rows, 256, smem, st>>>(l.q_scales, l.q_amax, q, l.q_stride, l.n_heads, l.head_dim);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;

    Fp8Params p;
    memset(&p, 0, sizeof p);
    fill_common(p, l);
    p.q_stride_n = 2 * l.q_stride; // e4m3 codes in place in the bf16 rows
    p.additional_params.maybe_scale_q = l.q_scales;
    p.additional_params.maybe_scale_k = (float *)l.kv_scales;
    p.additional_params.maybe_scale_v = l.kv_scales ? (float *)l.kv_scales + l.n_kv : nullptr;
    p.additional_params.sm_scale = l.scale;
    p.additional_params.scale_q_scalar = p.additional_params.scale_k_scalar = p.additional_params.scale_v_scalar = 1.0;
    const bool win = l.window > 0;
    switch (l.head_dim) {
    case 64: return win ? launch_kernel<64, true>(p, l.same_schedule, st) : launch_kernel<64, false>(p, l.same_schedule, st);
    case 128:
        return win ? launch_kernel<128, true>(p, l.same_schedule, st) : launch_kernel<128, false>(p, l.same_schedule, st);
    default:
        return win ? launch_kernel<256, true>(p, l.same_schedule, st) : launch_kernel<256, false>(p, l.same_schedule, st);
    }
}

} // namespace pg_fi

#endif // PG_HAVE_FLASHINFER
