// kernels/cuda/gemm_fp8_cutlass_c7.cu - configuration c7 of the one-pass W8A8
// kernel (gemm_fp8_cutlass.cuh): 128 x 128 x 128 tiles on a 2 x 1 cluster,
// ping-pong with fast accumulation (FP8FastAccum: no promotion, so a
// warpgroup's whole 128 x 128 f32 tile fits in registers): the schedule
// and tile vLLM's sm90 FP8 kernel runs above 128 rows.
// Its own translation unit so the configurations compile in parallel.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

#ifdef PG_HAVE_CUTLASS
using namespace pg_fp8;
int pg_fp8_cutlass_c7(const Fp8CutlassCall &c) {
    return run<Fp8Config<Shape<_128, _128, _128>, Shape<_2, _1, _1>, KernelPpFast, EpiWs, false>>(c);
}
#endif
