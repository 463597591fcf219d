// kernels/cuda/gemm_fp8_cutlass_c1.cu - configuration c1 of the one-pass W8A8
// kernel (gemm_fp8_cutlass.cuh): 128 x 128 x 128 tiles on a 1 x 2 cluster
// (two CTAs of one row of tiles share the activations' loads, multicast),
// cooperative, persistent.
// Its own translation unit so the configurations compile in parallel.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

#ifdef PG_HAVE_CUTLASS
using namespace pg_fp8;
int pg_fp8_cutlass_c1(const Fp8CutlassCall &c) {
    return run<Fp8Config<Shape<_128, _128, _128>, Shape<_1, _2, _1>, KernelCoop, EpiCoop, false>>(c);
}
#endif
