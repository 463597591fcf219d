// kernels/cuda/cuda_common.cuh - helpers shared by the kernels/cuda/*.cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <utility>

#include "kernels/cuda/cuda_ops.h"

typedef __nv_bfloat16 bf16;

// Returns PG_EIO with file, line, the failing call and CUDA's reason.
#define PG_CUDA_TRY(call)                                                                  \
    do {                                                                                   \
        cudaError_t pg_e_ = (call);                                                        \
        if (pg_e_ != cudaSuccess)                                                          \
            return pg_err_set(PG_EIO, "%s:%d: %s: %s", __FILE__, __LINE__, #call,          \
                              cudaGetErrorString(pg_e_));                                  \
    } while (0)

// After a launch: a bad configuration or an earlier sticky error.
#define PG_CUDA_LAUNCHED(name) PG_CUDA_TRY(cudaGetLastError())

// Argument checks of launchers: PG_ARG (common/err.h).

static inline cudaStream_t pg_stream(void *s) { return (cudaStream_t)s; }

static inline int pg_ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

// Multiprocessors of the current device (cached per device id).
int pg_cuda_sm_count(void);

// --- Programmatic Dependent Launch (PDL, sm_90+) -----------------------------------------
//
// A kernel launched with pg_launch_pdl may start while the kernel before it
// on the stream is still running (once every CTA of that one has executed
// pg_pdl_trigger() or exited). It may therefore do only independent work
// (L2 prefetches of weights, index arithmetic on its arguments) before
// pg_pdl_wait(), which returns once the previous grid has completed and its
// memory is visible. Rules for every kernel launched this way:
//   - pg_pdl_wait() before the first read of anything an earlier kernel may
//     have written and before the first global write, on every path; every
//     CTA calls it, also one that leaves early (so that "this grid is
//     complete" implies "the grid before it is complete", transitively: the
//     chain of waits orders each kernel after all earlier ones, not only
//     after its immediate predecessor);
//   - pg_pdl_trigger() after pg_pdl_wait() (so the next kernel starts only
//     once the one before this one has completed); it only lets the next
//     grid be scheduled and promises nothing about memory.
// So what kernels two or more launches back wrote is complete once a kernel
// starts: a kernel may read it before its wait where its contract says the
// kernel right before it never writes it (lora_graph.cu's shrink reads x,
// its expand out; cuda_ops.h pg_cuda_lora_apply_dev).
// Without the launch attribute (PDL off, or sm < 90) both are no-ops. The
// attribute only relaxes the order against an immediately preceding kernel
// (not a copy, memset or event wait); a kernel launched without it (cuBLASLt,
// the unconverted element-wise kernels) waits for full completion as usual.
// Stream capture records the relaxed order as a programmatic graph edge.

// Whether pg_launch_pdl sets the attribute on the current device: compute
// capability >= 9.0, and not disabled by PAGED_CUDA_PDL=0 (read once) or by
// pg_cuda_pdl_set(0). device.cu.
int pg_cuda_pdl_enabled(void);
// Tests and benchmarks: 0 off, 1 on (where the device supports it), -1 back
// to the environment's default. Process-wide; takes effect at the next launch
// (a captured graph keeps what it was captured with).
void pg_cuda_pdl_set(int mode);

// 8 floats -> 8 bf16 in 16 bytes, round to nearest even (vectorized stores).
__device__ __forceinline__ uint4 pack8(const float f[8]) {
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return u;
}

// 8 bf16 in 16 bytes -> 8 floats (exact), the way back of pack8.
__device__ __forceinline__ void pg_unpack8(const uint4 &u, float f[8]) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

// Blocks of a grid-stride loop over `items`: enough for one item per
// thread, at most 16 per multiprocessor.
static inline unsigned pg_grid_for(int64_t items, int threads) {
    int64_t b = (items + threads - 1) / threads;
    int64_t cap = (int64_t)pg_cuda_sm_count() * 16;
    if (b > cap) b = cap;
    return (unsigned)(b < 1 ? 1 : b);
}

// --- RMSNorm of a row held by one CTA (elementwise.cu, gemma_ops.cu) ----------------------
//
// One definition of the arithmetic, so that every kernel that normalises a
// row (add_rmsnorm, Gemma's rmsnorm_add) gets the same bits: each thread
// sums the squares of its values in order, the CTA adds those sums
// (pg_cta_sum), the factor is 1 / sqrt(sum / dim + eps) in f32 (IEEE sqrt
// and division), and a value becomes bf16(v * factor * w). The 16-byte
// vector kernels give thread t the vectors t + u * blockDim.x, u < VPT,
// with VPT and the thread count from pg_rms_vec_plan.

// The sum of v over a CTA of any multiple of 32 threads (<= 1024): warp
// butterflies, then every thread adds the warps' sums in order. sh: 32
// floats of shared memory (reusable: the call synchronises first).
__device__ __forceinline__ float pg_cta_sum(float v, float *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = (blockDim.x + 31) / 32;
    __syncthreads(); // sh may be in use by a previous call
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < nw; w++) t += sh[w];
    return t;
}

// The row's RMSNorm factor from this thread's sum of squares ss (every
// thread of the CTA calls it).
__device__ __forceinline__ float pg_rms_factor(float ss, int dim, float eps, float *sh) {
    return 1.0f / sqrtf(pg_cta_sum(ss, sh) / (float)dim + eps);
}

// The vector kernels' plan for rows of nvec 16-byte vectors (nvec <= 4096):
// returns VPT (1, 2 or 4) and sets *threads (a multiple of 32, <= 1024).
static inline int pg_rms_vec_plan(int64_t nvec, int *threads) {
    const int vpt = nvec <= 1024 ? 1 : nvec <= 2048 ? 2 : 4;
    *threads = (int)((nvec + vpt - 1) / vpt + 31) / 32 * 32;
    return vpt;
}

// --- PTX wrappers for tensor-core tiles (attention, MoE) ---------------------------------
//
// In a namespace of their own: CUTLASS (gemm_fp8_cutlass.cu) has a
// cute::cp_async_wait that an unqualified call would find beside ours.
// Users say `using namespace pg_ptx;`.
namespace pg_ptx {

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, bypassing L1; zero-fills when !valid.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                        uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
// c[4] += A(16x16, a[4]) * B(16x8, b0 b1), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two e4m3 bytes, placed at bits 8-15 and 24-31 of y, -> bf16x2, exactly.
// (s eeee mmm) << 4 inside a bf16 is the value * 2^-120 (e = 0, the
// e4m3 subnormals, lands on bf16 subnormals, which bf16 fma keeps); one
// multiply by 2^120 (bf16 0x7B80) restores it. The e4m3 NaN (0x7F/0xFF)
// reads as +-480: the writer saturates, so only a NaN input makes one.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t y) {
    uint32_t r = (y & 0x80008000u) | ((y >> 4) & 0x07F007F0u), d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(r), "r"(0x7B807B80u), "r"(0x80008000u));
    return d;
}
// 16 e4m3 (one 16-byte load) -> 16 bf16 (elements 0-7 in lo, 8-15 in hi).
__device__ __forceinline__ void e4m3x16_to_bf16(const uint4 &in, uint4 &lo, uint4 &hi) {
    lo.x = e4m3x2_to_bf16x2(__byte_perm(in.x, 0u, 0x1404));
    lo.y = e4m3x2_to_bf16x2(__byte_perm(in.x, 0u, 0x3424));
    lo.z = e4m3x2_to_bf16x2(__byte_perm(in.y, 0u, 0x1404));
    lo.w = e4m3x2_to_bf16x2(__byte_perm(in.y, 0u, 0x3424));
    hi.x = e4m3x2_to_bf16x2(__byte_perm(in.z, 0u, 0x1404));
    hi.y = e4m3x2_to_bf16x2(__byte_perm(in.z, 0u, 0x3424));
    hi.z = e4m3x2_to_bf16x2(__byte_perm(in.w, 0u, 0x1404));
    hi.w = e4m3x2_to_bf16x2(__byte_perm(in.w, 0u, 0x3424));
}
} // namespace pg_ptx

__device__ __forceinline__ void pg_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pg_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, st>>>(args...), with the PDL attribute when
// pg_cuda_pdl_enabled(). Only for kernels that follow the rules above.
template <typename... KArgs, typename... Args>
static inline cudaError_t pg_launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                        cudaStream_t st, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pg_cuda_pdl_enabled() ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e != cudaSuccess && cfg.numAttrs) { // a stream that refuses the attribute: launch plainly
        (void)cudaGetLastError();
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    }
    return e;
}
