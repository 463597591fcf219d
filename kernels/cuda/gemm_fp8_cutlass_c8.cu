// kernels/cuda/gemm_fp8_cutlass_c8.cu - configuration c8 of the one-pass W8A8
// kernel (gemm_fp8_cutlass.cuh): 128 x 128 x 128 tiles on a 2 x 1 cluster,
// cooperative with fast accumulation (FP8FastAccum): c0 without the
// promotion, to tell the schedule's gain from the accumulation's.
// Its own translation unit so the configurations compile in parallel.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

#ifdef PG_HAVE_CUTLASS
using namespace pg_fp8;
int pg_fp8_cutlass_c8(const Fp8CutlassCall &c) {
    return run<Fp8Config<Shape<_128, _128, _128>, Shape<_2, _1, _1>, KernelCoopFast, EpiCoop, false>>(c);
}
#endif
