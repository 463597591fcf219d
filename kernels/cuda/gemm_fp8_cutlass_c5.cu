// kernels/cuda/gemm_fp8_cutlass_c5.cu - configuration c5 of the one-pass W8A8
// kernel (gemm_fp8_cutlass.cuh): swapped, 128 x 64 x 128 tiles on a 2 x 1
// cluster (two CTAs of one token column share its loads), cooperative,
// persistent.
// Its own translation unit so the configurations compile in parallel.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

#ifdef PG_HAVE_CUTLASS
using namespace pg_fp8;
int pg_fp8_cutlass_c5(const Fp8CutlassCall &c) {
    return run<Fp8Config<Shape<_128, _64, _128>, Shape<_2, _1, _1>, KernelCoop, EpiCoop, true>>(c);
}
#endif
