// kernels/cuda/l2_prefetch.cu - ask the L2 to fetch a weight ahead of the
// kernel that reads it.
//
// Why: a batch-1 decode layer is four weight streams (QKV, O, gate/up,
// down) with RoPE and attention between QKV and O. Attention at batch 1
// reads a few hundred KB of KV and spends ~10 us mostly waiting on
// latency, leaving HBM idle, after which O's GEMV starts its weight stream
// from scratch and pays its ramp-up (docs/fp8_gemm.md: O at 1.5 TB/s in
// the W1 chain against 2.7 for the large matrices). Issuing O's bytes to
// the L2 (50 MB on H100/H200; O is 17 MB in FP8, 33.5 in bf16) while RoPE
// and attention run moves that stream into the idle window; O's GEMV then
// reads L2 hits. Off unless PAGED_CUDA_L2_PREFETCH=1: measured a loss
// (W1 FP8 5.66 against 3.69 ms a token, docs/cuda_kernels.md).
//
// The kernel is launched with PDL after the QKV product: it issues
// cp.async.bulk.prefetch.L2 (sm_90; a hint, no register or shared memory
// destination, nothing to wait for) over the range, then pg_pdl_wait() on
// every CTA, so that it completes only after the kernel before it did and
// the chain's order holds for the kernel after it (cuda_common.cuh's
// rules). It writes nothing.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace {

constexpr int kThreads = 128;
constexpr uint32_t kChunk = 32768; // bytes per prefetch instruction: 530 of them for 17 MB

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const char *p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (size_t off = (size_t)threadIdx.x * kChunk; off < bytes; off += (size_t)kThreads * kChunk) {
        // A multiple of 16 bytes from a 16-byte aligned address (the
        // launcher aligned both ends inward).
        const uint32_t n = bytes - off < kChunk ? (uint32_t)(bytes - off) : kChunk;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
    }
#endif
    pg_pdl_wait();
    pg_pdl_trigger();
}

} // namespace

extern "C" int pg_cuda_l2_prefetch(const void *p, size_t bytes, void *stream) {
    PG_ARG(p || bytes == 0, "l2 prefetch: null pointer");
    // Inward to 16-byte boundaries: a prefetch is only a hint, so the few
    // bytes at the ends are simply left to the reader.
    const uintptr_t a = ((uintptr_t)p + 15) & ~(uintptr_t)15, e = ((uintptr_t)p + bytes) & ~(uintptr_t)15;
    if (bytes == 0 || e <= a) return 0;
    PG_CUDA_TRY(pg_launch_pdl(l2_prefetch_kernel, dim3(1), dim3(kThreads), 0, pg_stream(stream), (const char *)a,
                              (size_t)(e - a)));
    PG_CUDA_LAUNCHED("l2_prefetch");
    return 0;
}
