// kernels/cuda/act_quant.cu - the passes around the W8A8 product (gemm.cu,
// pg_cuda_gemm_fp8): dynamic per-token FP8 quantization of the activations
// before it (alone, or fused into the RMSNorm or the SiLU * mul that makes
// them), and the rescale of its raw sums after it.
//
// Per row of bf16 x: scale = max|x| / 448 (1 for an all-zero row) and q[t]
// = e4m3(x[t] * (1 / scale)), round to nearest even, saturating: the f32
// operations of pg_quantize_row_fp8 (kernels/dtype.c) in the same order, so
// the bytes and scales equal the CPU's bit for bit (nvcc's f32 division is
// IEEE unless -use_fast_math, which the build does not pass).
//
// One CTA of 256 threads per row: a pass for the maximum, then a pass that
// converts (the second read of the row comes from L1/L2: a row is at most
// 56 KiB). 16-byte loads when k and ldx are multiples of 8 and x is 16-byte
// aligned, else one element at a time. A separate pass for now; fusing it
// into what produces x (RMSNorm, SiLU * mul) is the next step (issue 27).
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_common.cuh"

namespace {

constexpr int AQ_THREADS = 256;
constexpr float E4M3_MAX = 448.0f;

__device__ __forceinline__ float block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < AQ_THREADS / 32 ? red[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    return red[0];
}

__device__ __forceinline__ uint8_t to_e4m3(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

template <bool VEC>
__global__ void __launch_bounds__(AQ_THREADS)
    quant_rows_fp8_kernel(uint8_t *__restrict__ q, int64_t ldq, float *__restrict__ scales,
                          const bf16 *__restrict__ x, int64_t ldx, int k) {
    __shared__ float red[AQ_THREADS / 32];
    const int64_t row = blockIdx.x;
    const bf16 *xr = x + row * ldx;
    uint8_t *qr = q + row * ldq;
    float amax = 0.0f;
    if (VEC) {
        const uint4 *xv = (const uint4 *)xr;
        for (int i = threadIdx.x; i < k / 8; i += AQ_THREADS) {
            uint4 u = xv[i];
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(h[j]);
                amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
            }
        }
    } else {
        for (int i = threadIdx.x; i < k; i += AQ_THREADS) amax = fmaxf(amax, fabsf(__bfloat162float(xr[i])));
    }
    amax = block_max(amax, red);
    const float s = amax > 0.0f ? amax / E4M3_MAX : 1.0f;
    const float inv = 1.0f / s;
    if (threadIdx.x == 0) scales[row] = s;
    if (VEC) {
        const uint4 *xv = (const uint4 *)xr;
        for (int i = threadIdx.x; i < k / 8; i += AQ_THREADS) {
            uint4 u = xv[i];
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(h[j]);
                const uint32_t two = (uint32_t)to_e4m3(f.x * inv) | ((uint32_t)to_e4m3(f.y * inv) << 8);
                if (j < 2) lo |= two << (16 * j);
                else hi |= two << (16 * (j - 2));
            }
            *(uint2 *)(qr + (int64_t)i * 8) = make_uint2(lo, hi);
        }
    } else {
        for (int i = threadIdx.x; i < k; i += AQ_THREADS) qr[i] = to_e4m3(__bfloat162float(xr[i]) * inv);
    }
}

// out = bf16(raw * xs[i] * ws[j] (+ out)), 8 columns per thread.
template <bool VEC>
__global__ void fp8_rescale_kernel(bf16 *out, int64_t ldo, const bf16 *raw, int64_t ldr, const float *__restrict__ xs,
                                   const float *__restrict__ ws, int64_t m, int n, int accumulate) {
    const int64_t per_row = VEC ? n / 8 : n;
    const int64_t total = m * per_row;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t / per_row;
        const int c = (int)(t % per_row);
        const float si = xs[i];
        if (VEC) {
            const int j0 = c * 8;
            uint4 u = *(const uint4 *)(raw + i * ldr + j0);
            uint4 r = accumulate ? *(const uint4 *)(out + i * ldo + j0) : make_uint4(0, 0, 0, 0);
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u, *hr = (const __nv_bfloat162 *)&r;
            const float4 w0 = *(const float4 *)(ws + j0), w1 = *(const float4 *)(ws + j0 + 4);
            const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
            float f[8];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 a = __bfloat1622float2(h[e]);
                f[2 * e] = a.x * si * wv[2 * e];
                f[2 * e + 1] = a.y * si * wv[2 * e + 1];
                if (accumulate) {
                    float2 b = __bfloat1622float2(hr[e]);
                    f[2 * e] += b.x;
                    f[2 * e + 1] += b.y;
                }
            }
            *(uint4 *)(out + i * ldo + j0) = pack8(f);
        } else {
            float v = __bfloat162float(raw[i * ldr + c]) * si * ws[c];
            if (accumulate) v += __bfloat162float(out[i * ldo + c]);
            out[i * ldo + c] = __float2bfloat16(v);
        }
    }
}

// --- quantization fused into what makes the activations --------------------------------

__device__ __forceinline__ void unpack8f(const uint4 &u, float f[8]) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float2 a = __bfloat1622float2(h[e]);
        f[2 * e] = a.x;
        f[2 * e + 1] = a.y;
    }
}

// 8 floats times inv to e4m3, as 8 bytes.
__device__ __forceinline__ uint2 quant8(const float f[8], float inv) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) lo |= (uint32_t)to_e4m3(f[e] * inv) << (8 * e);
#pragma unroll
    for (int e = 0; e < 4; e++) hi |= (uint32_t)to_e4m3(f[4 + e] * inv) << (8 * e);
    return make_uint2(lo, hi);
}

// Max over a CTA of any multiple of 32 threads (<= 1024), as
// cuda_common.cuh's pg_cta_sum sums (the sum is that one, so the norm
// equals add_rmsnorm's).
__device__ __forceinline__ float cta_max(float v, float *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = (blockDim.x + 31) / 32;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < nw; w++) t = fmaxf(t, sh[w]);
    return t;
}

// RMSNorm then the row's quantization, one CTA per row, the row in
// registers (VPT 16-byte vectors per thread): add_rmsnorm_vec_kernel's
// arithmetic (the normed value rounded to bf16, as the unfused chain
// stores it), then quant_rows_fp8_kernel's.
template <int VPT>
__global__ void rmsnorm_quant_fp8_kernel(uint8_t *__restrict__ q, int64_t ldq, float *__restrict__ scales,
                                         const bf16 *__restrict__ x, const bf16 *__restrict__ w, int dim,
                                         float eps) {
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const int nvec = dim / 8;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x + row * dim);
    float vals[VPT][8];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int vi = threadIdx.x + u * blockDim.x;
        if (vi < nvec) {
            unpack8f(xr[vi], vals[u]);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += vals[u][e] * vals[u][e];
        }
    }
    const float tot = pg_cta_sum(ss, sh);
    const float rs = 1.0f / sqrtf(tot / (float)dim + eps);
    const uint4 *wr = reinterpret_cast<const uint4 *>(w);
    float amax = 0.0f;
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int vi = threadIdx.x + u * blockDim.x;
        if (vi < nvec) {
            float wf[8], o[8];
            unpack8f(wr[vi], wf);
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = vals[u][e] * rs * wf[e];
            unpack8f(pack8(o), vals[u]); // the bf16 value the chain would store
#pragma unroll
            for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(vals[u][e]));
        }
    }
    amax = cta_max(amax, sh);
    const float s = amax > 0.0f ? amax / E4M3_MAX : 1.0f;
    const float inv = 1.0f / s;
    if (threadIdx.x == 0) scales[row] = s;
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int vi = threadIdx.x + u * blockDim.x;
        if (vi < nvec) *(uint2 *)(q + row * ldq + (size_t)vi * 8) = quant8(vals[u], inv);
    }
}

__device__ __forceinline__ float silu_f(float g) { return g / (1.0f + expf(-g)); }

// h = bf16(silu(gate) * up) (elementwise.cu's silu_mul, bit for bit) and
// h's per-row quantization, one CTA per row: the first pass writes h and
// takes the maximum, the second reads the thread's own h back.
__global__ void __launch_bounds__(AQ_THREADS)
    silu_mul_quant_fp8_kernel(bf16 *__restrict__ h, uint8_t *__restrict__ q, int64_t ldq,
                              float *__restrict__ scales, const bf16 *__restrict__ gate_up, int ffn) {
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const int nvec = ffn / 8;
    const uint4 *g4 = reinterpret_cast<const uint4 *>(gate_up + row * 2 * (size_t)ffn);
    uint4 *h4 = reinterpret_cast<uint4 *>(h + row * (size_t)ffn);
    float amax = 0.0f;
    for (int c = threadIdx.x; c < nvec; c += AQ_THREADS) {
        float g[8], u[8], o[8];
        unpack8f(g4[c], g);
        unpack8f(g4[nvec + c], u);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = silu_f(g[e]) * u[e];
        const uint4 p = pack8(o);
        h4[c] = p;
        unpack8f(p, o);
#pragma unroll
        for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(o[e]));
    }
    amax = cta_max(amax, sh);
    const float s = amax > 0.0f ? amax / E4M3_MAX : 1.0f;
    const float inv = 1.0f / s;
    if (threadIdx.x == 0) scales[row] = s;
    for (int c = threadIdx.x; c < nvec; c += AQ_THREADS) {
        float o[8];
        unpack8f(h4[c], o);
        *(uint2 *)(q + row * ldq + (size_t)c * 8) = quant8(o, inv);
    }
}

} // namespace

extern "C" int pg_cuda_rmsnorm_quant_fp8(void *q, int64_t ldq, float *scales, const void *x, const void *w, int64_t m,
                                         int64_t dim, float eps, void *stream) {
    PG_ARG(q && scales && x && w, "rmsnorm_quant_fp8: null pointer");
    PG_ARG(m >= 0 && dim > 0 && dim <= (1 << 20) && ldq >= dim, "rmsnorm_quant_fp8: m %lld dim %lld ldq %lld",
           (long long)m, (long long)dim, (long long)ldq);
    const int64_t nvec = dim / 8;
    if (dim % 8 || ldq % 8 || nvec > 4 * 1024 || ((uintptr_t)x % 16) || ((uintptr_t)w % 16) || ((uintptr_t)q % 8))
        return pg_err_set(PG_EUNSUPP, "rmsnorm_quant_fp8: dim %lld (a multiple of 8 up to 32768) and aligned rows only",
                          (long long)dim);
    if (m == 0) return 0;
    // add_rmsnorm's launch shape, so its sum runs in the same order.
    const int vpt = nvec <= 1024 ? 1 : nvec <= 2048 ? 2 : 4;
    int threads = (int)((nvec + vpt - 1) / vpt);
    threads = (threads + 31) / 32 * 32;
    cudaStream_t st = pg_stream(stream);
    if (vpt == 1)
        rmsnorm_quant_fp8_kernel<1><<<(unsigned)m, threads, 0, st>>>((uint8_t *)q, ldq, scales, (const bf16 *)x,
                                                                     (const bf16 *)w, (int)dim, eps);
    else if (vpt == 2)
        rmsnorm_quant_fp8_kernel<2><<<(unsigned)m, threads, 0, st>>>((uint8_t *)q, ldq, scales, (const bf16 *)x,
                                                                     (const bf16 *)w, (int)dim, eps);
    else
        rmsnorm_quant_fp8_kernel<4><<<(unsigned)m, threads, 0, st>>>((uint8_t *)q, ldq, scales, (const bf16 *)x,
                                                                     (const bf16 *)w, (int)dim, eps);
    PG_CUDA_LAUNCHED("rmsnorm_quant_fp8");
    return 0;
}

extern "C" int pg_cuda_silu_mul_quant_fp8(void *h, void *q, int64_t ldq, float *scales, const void *gate_up, int64_t m,
                                          int64_t ffn, void *stream) {
    PG_ARG(h && q && scales && gate_up, "silu_mul_quant_fp8: null pointer");
    PG_ARG(m >= 0 && ffn > 0 && ffn <= (1 << 28) && ldq >= ffn, "silu_mul_quant_fp8: m %lld ffn %lld ldq %lld",
           (long long)m, (long long)ffn, (long long)ldq);
    if (ffn % 8 || ldq % 8 || ((uintptr_t)h % 16) || ((uintptr_t)gate_up % 16) || ((uintptr_t)q % 8))
        return pg_err_set(PG_EUNSUPP, "silu_mul_quant_fp8: ffn %lld a multiple of 8 and aligned rows only",
                          (long long)ffn);
    if (m == 0) return 0;
    silu_mul_quant_fp8_kernel<<<(unsigned)m, AQ_THREADS, 0, pg_stream(stream)>>>(
        (bf16 *)h, (uint8_t *)q, ldq, scales, (const bf16 *)gate_up, (int)ffn);
    PG_CUDA_LAUNCHED("silu_mul_quant_fp8");
    return 0;
}

extern "C" int pg_cuda_fp8_rescale(void *out, int64_t ldo, const void *raw, int64_t ldr, const float *xscales,
                                   const float *wscales, int64_t m, int64_t n, int accumulate, void *stream) {
    PG_ARG(out && raw && xscales && wscales, "fp8_rescale: null pointer");
    PG_ARG(m >= 0 && n > 0 && n <= (1 << 30) && ldo >= n && ldr >= n, "fp8_rescale: m %lld n %lld ldo %lld ldr %lld",
           (long long)m, (long long)n, (long long)ldo, (long long)ldr);
    PG_ARG(!(accumulate && raw == out), "fp8_rescale: accumulating needs raw apart from out");
    if (m == 0) return 0;
    const bool vec = n % 8 == 0 && ldo % 8 == 0 && ldr % 8 == 0 && ((uintptr_t)out % 16) == 0 &&
                     ((uintptr_t)raw % 16) == 0 && ((uintptr_t)wscales % 16) == 0;
    const int64_t work = vec ? m * (n / 8) : m * n;
    const int threads = 256;
    int64_t blocks = (work + threads - 1) / threads;
    if (blocks > 132 * 16) blocks = 132 * 16; // a grid-stride loop past a few waves
    cudaStream_t s = pg_stream(stream);
    if (vec)
        fp8_rescale_kernel<true><<<(unsigned)blocks, threads, 0, s>>>((bf16 *)out, ldo, (const bf16 *)raw, ldr,
                                                                      xscales, wscales, m, (int)n, accumulate);
    else
        fp8_rescale_kernel<false><<<(unsigned)blocks, threads, 0, s>>>((bf16 *)out, ldo, (const bf16 *)raw, ldr,
                                                                       xscales, wscales, m, (int)n, accumulate);
    PG_CUDA_LAUNCHED("fp8_rescale");
    return 0;
}

extern "C" int pg_cuda_quant_rows_fp8(void *q, int64_t ldq, float *scales, const void *x, int64_t ldx, int64_t rows,
                                      int64_t k, void *stream) {
    PG_ARG(q && scales && x, "quant_rows_fp8: null pointer");
    PG_ARG(rows >= 0 && k > 0 && k <= (1 << 30) && ldx >= k && ldq >= k,
           "quant_rows_fp8: rows %lld k %lld ldx %lld ldq %lld", (long long)rows, (long long)k, (long long)ldx,
           (long long)ldq);
    PG_ARG(rows <= 0x7fffffff, "quant_rows_fp8: %lld rows", (long long)rows);
    if (rows == 0) return 0;
    const bool vec = k % 8 == 0 && ldx % 8 == 0 && ldq % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)q % 8) == 0;
    cudaStream_t s = pg_stream(stream);
    if (vec)
        quant_rows_fp8_kernel<true><<<(unsigned)rows, AQ_THREADS, 0, s>>>((uint8_t *)q, ldq, scales, (const bf16 *)x,
                                                                          ldx, (int)k);
    else
        quant_rows_fp8_kernel<false><<<(unsigned)rows, AQ_THREADS, 0, s>>>((uint8_t *)q, ldq, scales,
                                                                           (const bf16 *)x, ldx, (int)k);
    PG_CUDA_LAUNCHED("quant_rows_fp8");
    return 0;
}
