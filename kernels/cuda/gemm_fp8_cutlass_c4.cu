// kernels/cuda/gemm_fp8_cutlass_c4.cu - configuration c4 of the one-pass W8A8
// kernel (gemm_fp8_cutlass.cuh): swapped (D^T = w xq^T, the weights on the
// 128-row side of a 128 x 64 x 128 tile, the tokens on its 64 columns), no
// cluster, one consumer warpgroup, one CTA per tile: for m <= 64.
// Its own translation unit so the configurations compile in parallel.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

#ifdef PG_HAVE_CUTLASS
using namespace pg_fp8;
int pg_fp8_cutlass_c4(const Fp8CutlassCall &c) {
    return run<Fp8Config<Shape<_128, _64, _128>, Shape<_1, _1, _1>, KernelWs, EpiWs, true>>(c);
}
#endif
