// kernels/cuda/gemma_ops.cu - the element-wise ops Gemma 2/3 add
// (docs/gemma3.md): the embedding scale, the post-norms' RMSNorm-then-add,
// GeGLU's gelu_tanh(g) * u and the logit soft-cap.
//
// All are memory-bound, on bf16 rows with f32 arithmetic: 16-byte loads
// and stores where the row allows (a multiple of 8 bf16, 16-byte aligned),
// else a scalar path with the same arithmetic. The norm is add_rmsnorm's
// (cuda_common.cuh's pg_rms_factor, the same thread layout), so
// rmsnorm_add's normalised row equals pg_cuda_add_rmsnorm's bit for bit;
// it is launched with PDL as add_rmsnorm is (every CTA waits first thing).
// scale, gelu_mul and softcap are grid-stride kernels launched plainly, as
// add_bias and silu_mul are.
// The f32 formulas are kernels/cpu/gemma_ops.c's, written with __fmul_rn /
// __fadd_rn so that nvcc does not contract them into fmas (gcc -std=c11
// does not either): the device differs from the CPU only where its tanhf
// does.
// Contracts: kernels/cuda/cuda_ops.h. Test: tests/gpu/test_cuda_gemma_ops.cu.
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"

namespace {

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// --- scale and soft-cap: one map over the first n columns of m rows ---------------------

enum { OP_SCALE, OP_SOFTCAP };

// OP_SCALE: v * a (a already bf16-rounded). OP_SOFTCAP: a * tanhf(v * b),
// a the cap and b = 1 / cap (pg_cpu_softcap's arithmetic).
template <int OP> __device__ __forceinline__ float map1(float v, float a, float b) {
    if constexpr (OP == OP_SCALE)
        return __fmul_rn(v, a);
    else
        return __fmul_rn(a, tanhf(__fmul_rn(v, b)));
}

// In place over (row, 8-column vector) units (VEC: n and ld multiples of 8,
// x 16-byte aligned) or single elements; columns past n are not touched.
template <int OP, bool VEC>
__global__ void map_rows_kernel(bf16 *x, int64_t ld, int64_t m, int64_t n, float a, float b) {
    const int64_t per_row = VEC ? n / 8 : n, total = m * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / per_row, c = i % per_row;
        if constexpr (VEC) {
            uint4 *p = reinterpret_cast<uint4 *>(x + row * ld) + c;
            float f[8];
            pg_unpack8(*p, f);
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] = map1<OP>(f[e], a, b);
            *p = pack8(f);
        } else {
            bf16 *p = x + row * ld + c;
            *p = __float2bfloat16(map1<OP>(__bfloat162float(*p), a, b));
        }
    }
}

template <int OP>
int map_rows(void *x, int64_t ld, int64_t m, int64_t n, float a, float b, void *stream) {
    if (m == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    if (n % 8 == 0 && ld % 8 == 0 && aligned16(x))
        map_rows_kernel<OP, true><<<pg_grid_for(m * (n / 8), 256), 256, 0, st>>>((bf16 *)x, ld, m, n, a, b);
    else
        map_rows_kernel<OP, false><<<pg_grid_for(m * n, 256), 256, 0, st>>>((bf16 *)x, ld, m, n, a, b);
    PG_CUDA_LAUNCHED("map_rows_kernel");
    return 0;
}

// --- RMSNorm then add -------------------------------------------------------------------

// One CTA per row; each thread keeps VPT 16-byte vectors of y in registers
// between the sum of squares and the scaling, as add_rmsnorm_vec_kernel
// (residual NULL) does: n = bf16(y * rs * w), then x = bf16(x + n).
template <int VPT>
__global__ void rmsnorm_add_vec_kernel(bf16 *x, const bf16 *y, const bf16 *w, int dim, float eps) {
    __shared__ float sh[32];
    pg_pdl_wait(); // PDL: x and y are earlier kernels' outputs
    pg_pdl_trigger();
    const size_t row = blockIdx.x;
    const int nvec = dim / 8;
    const uint4 *yr = reinterpret_cast<const uint4 *>(y + row * dim);
    float vals[VPT][8];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int vi = threadIdx.x + u * blockDim.x;
        if (vi < nvec) {
            pg_unpack8(yr[vi], vals[u]);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += vals[u][e] * vals[u][e];
        }
    }
    const float rs = pg_rms_factor(ss, dim, eps, sh);
    const uint4 *wr = reinterpret_cast<const uint4 *>(w);
    uint4 *xr = reinterpret_cast<uint4 *>(x + row * dim);
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int vi = threadIdx.x + u * blockDim.x;
        if (vi < nvec) {
            float wf[8], nf[8], xf[8];
            pg_unpack8(wr[vi], wf);
#pragma unroll
            for (int e = 0; e < 8; e++) nf[e] = vals[u][e] * rs * wf[e];
            pg_unpack8(pack8(nf), nf); // n rounded to bf16, as add_rmsnorm stores it
            pg_unpack8(xr[vi], xf);
#pragma unroll
            for (int e = 0; e < 8; e++) xf[e] += nf[e];
            xr[vi] = pack8(xf);
        }
    }
}

// Any dim: scalar, two passes over y (add_rmsnorm_scalar_kernel's order).
__global__ void rmsnorm_add_scalar_kernel(bf16 *x, const bf16 *y, const bf16 *w, int dim, float eps) {
    __shared__ float sh[32];
    pg_pdl_wait(); // PDL: as the vector kernel
    pg_pdl_trigger();
    const size_t row = blockIdx.x;
    const bf16 *yr = y + row * dim;
    bf16 *xr = x + row * dim;
    float ss = 0.0f;
    for (int e = threadIdx.x; e < dim; e += blockDim.x) {
        float v = __bfloat162float(yr[e]);
        ss += v * v;
    }
    const float rs = pg_rms_factor(ss, dim, eps, sh);
    for (int e = threadIdx.x; e < dim; e += blockDim.x) {
        const bf16 n = __float2bfloat16(__bfloat162float(yr[e]) * rs * __bfloat162float(w[e]));
        xr[e] = __float2bfloat16(__bfloat162float(xr[e]) + __bfloat162float(n));
    }
}

// --- gelu_tanh * mul --------------------------------------------------------------------

// pg_cpu_gelu_tanh: PyTorch's gelu(approximate="tanh") in f32, unfused.
__device__ __forceinline__ float gelu_tanh(float x) {
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    const float inner = __fmul_rn(beta, __fadd_rn(x, __fmul_rn(kappa, __fmul_rn(__fmul_rn(x, x), x))));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

// silu_mul_vec_kernel's layout: row r of gate_up is [g | u], 2 * ffn wide.
__global__ void gelu_mul_vec_kernel(bf16 *out, const bf16 *gate_up, int64_t m, int64_t ffn) {
    const int64_t nvec = ffn / 8, total = m * nvec;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / nvec, c = i % nvec;
        const uint4 *g4 = reinterpret_cast<const uint4 *>(gate_up + row * 2 * ffn);
        float g[8], u[8], o[8];
        pg_unpack8(g4[c], g);
        pg_unpack8(g4[nvec + c], u);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = __fmul_rn(gelu_tanh(g[e]), u[e]);
        reinterpret_cast<uint4 *>(out + row * ffn)[c] = pack8(o);
    }
}

__global__ void gelu_mul_scalar_kernel(bf16 *out, const bf16 *gate_up, int64_t m, int64_t ffn) {
    const int64_t total = m * ffn;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / ffn, c = i % ffn;
        float g = __bfloat162float(gate_up[row * 2 * ffn + c]), u = __bfloat162float(gate_up[row * 2 * ffn + ffn + c]);
        out[i] = __float2bfloat16(__fmul_rn(gelu_tanh(g), u));
    }
}

} // namespace

// --- C API -------------------------------------------------------------------------------

extern "C" int pg_cuda_scale(void *x, int64_t ld, int64_t m, int64_t n, float s, void *stream) {
    PG_ARG(x, "scale: null pointer");
    PG_ARG(m >= 0 && n > 0 && ld >= n, "scale: m %lld n %lld ld %lld", (long long)m, (long long)n, (long long)ld);
    // s in the activations' type first, as transformers' embed_scale.to(dtype).
    const float sb = __bfloat162float(__float2bfloat16(s));
    return map_rows<OP_SCALE>(x, ld, m, n, sb, 0.0f, stream);
}

extern "C" int pg_cuda_softcap(void *x, int64_t ld, int64_t m, int64_t n, float cap, void *stream) {
    PG_ARG(x, "softcap: null pointer");
    PG_ARG(m >= 0 && n > 0 && ld >= n, "softcap: m %lld n %lld ld %lld", (long long)m, (long long)n, (long long)ld);
    PG_ARG(cap > 0.0f, "softcap: cap %g (must be > 0)", (double)cap);
    return map_rows<OP_SOFTCAP>(x, ld, m, n, cap, 1.0f / cap, stream);
}

extern "C" int pg_cuda_rmsnorm_add(void *x, const void *y, const void *w, int64_t m, int64_t dim, float eps,
                                   void *stream) {
    PG_ARG(x && y && w, "rmsnorm_add: null pointer");
    PG_ARG(x != y, "rmsnorm_add: y aliases x");
    PG_ARG(m >= 0 && m <= INT32_MAX && dim > 0 && dim <= (1 << 20), "rmsnorm_add: m %lld dim %lld", (long long)m,
           (long long)dim);
    if (m == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    const int64_t nvec = dim / 8;
    // The path and thread count pg_cuda_add_rmsnorm picks for the same row
    // (so the reduction order, and the normalised row, are the same).
    if (dim % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(w) && nvec <= 4 * 1024) {
        int threads;
        const int vpt = pg_rms_vec_plan(nvec, &threads);
        PG_CUDA_TRY(pg_launch_pdl(vpt == 1   ? rmsnorm_add_vec_kernel<1>
                                  : vpt == 2 ? rmsnorm_add_vec_kernel<2>
                                             : rmsnorm_add_vec_kernel<4>,
                                  dim3((unsigned)m), dim3(threads), 0, st, (bf16 *)x, (const bf16 *)y,
                                  (const bf16 *)w, (int)dim, eps));
    } else {
        PG_CUDA_TRY(pg_launch_pdl(rmsnorm_add_scalar_kernel, dim3((unsigned)m), dim3(256), 0, st, (bf16 *)x,
                                  (const bf16 *)y, (const bf16 *)w, (int)dim, eps));
    }
    PG_CUDA_LAUNCHED("rmsnorm_add_kernel");
    return 0;
}

extern "C" int pg_cuda_gelu_mul(void *out, const void *gate_up, int64_t m, int64_t ffn, void *stream) {
    PG_ARG(out && gate_up, "gelu_mul: null pointer");
    PG_ARG(m >= 0 && ffn > 0, "gelu_mul: m %lld ffn %lld", (long long)m, (long long)ffn);
    if (m == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    if (ffn % 8 == 0 && aligned16(out) && aligned16(gate_up))
        gelu_mul_vec_kernel<<<pg_grid_for(m * ffn / 8, 256), 256, 0, st>>>((bf16 *)out, (const bf16 *)gate_up, m, ffn);
    else
        gelu_mul_scalar_kernel<<<pg_grid_for(m * ffn, 256), 256, 0, st>>>((bf16 *)out, (const bf16 *)gate_up, m, ffn);
    PG_CUDA_LAUNCHED("gelu_mul_kernel");
    return 0;
}
