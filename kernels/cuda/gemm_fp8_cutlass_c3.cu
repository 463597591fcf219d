// kernels/cuda/gemm_fp8_cutlass_c3.cu - configuration c3 of the one-pass W8A8
// kernel (gemm_fp8_cutlass.cuh): 64 x 128 x 128 tiles on a 1 x 2 cluster,
// one consumer warpgroup, one CTA per tile (c2 with the activations'
// loads multicast to the two CTAs of a cluster).
// Its own translation unit so the configurations compile in parallel.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

#ifdef PG_HAVE_CUTLASS
using namespace pg_fp8;
int pg_fp8_cutlass_c3(const Fp8CutlassCall &c) {
    return run<Fp8Config<Shape<_64, _128, _128>, Shape<_1, _2, _1>, KernelWs, EpiWs, false>>(c);
}
#endif
