// kernels/cuda/gemm_fp8_cutlass_c6.cu - configuration c6 of the one-pass W8A8
// kernel (gemm_fp8_cutlass.cuh): 64 x 128 x 128 tiles on a 2 x 1 cluster,
// ping-pong (each consumer warpgroup on its own 64-row tile: 64 accumulator
// registers a thread plus the promotion's 64, where the 128-row ping-pong
// tile spilled), f32 promotion; vLLM's choice of tile for 65-128 rows.
// Its own translation unit so the configurations compile in parallel.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

#ifdef PG_HAVE_CUTLASS
using namespace pg_fp8;
int pg_fp8_cutlass_c6(const Fp8CutlassCall &c) {
    return run<Fp8Config<Shape<_64, _128, _128>, Shape<_2, _1, _1>, KernelPp, EpiWs, false>>(c);
}
#endif
