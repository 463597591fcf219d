// kernels/cuda/gemm_fp8_cutlass_c2.cu - configuration c2 of the one-pass W8A8
// kernel (gemm_fp8_cutlass.cuh): 64 x 128 x 128 tiles, no cluster, one
// consumer warpgroup (KernelTmaWarpSpecialized), one CTA per tile: for few
// tokens, where 128-row tiles are mostly padding and a grid of one wave
// needs no persistent scheduler.
// Its own translation unit so the configurations compile in parallel.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

#ifdef PG_HAVE_CUTLASS
using namespace pg_fp8;
int pg_fp8_cutlass_c2(const Fp8CutlassCall &c) {
    return run<Fp8Config<Shape<_64, _128, _128>, Shape<_1, _1, _1>, KernelWs, EpiWs, false>>(c);
}
#endif
