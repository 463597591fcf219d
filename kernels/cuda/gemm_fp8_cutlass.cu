// kernels/cuda/gemm_fp8_cutlass.cu - the W8A8 product in one pass: a CUTLASS
// 3.x sm90 warp-specialized FP8 GEMM whose epilogue (a visitor tree, EVT)
// multiplies each f32 accumulator by its token's scale (a column vector
// broadcast along N) and its channel's scale (a row vector broadcast along
// M) before the one rounding to bf16, and (accumulating: O and down into
// the residual stream) adds D's old value first, read in the same epilogue
// (C = D, in place: each tile reads its own C before it stores D). Against
// pg_cuda_gemm_fp8 (cuBLASLt + a rescale pass, gemm.cu) it saves the pass
// over the output and the raw sums' rounding (docs/fp8_gemm.md).
//
// D[m][n] (row-major, ld ldo) = xs[m] * (ws[n] * sum_k xq[m][k] * w[n][k])
// (+ D[m][n]):
// A = xq [M][K] row-major, B = w [N][K] (column-major K x N: the TN form of
// FP8), f32 accumulation with the mainloop's periodic promotion (not the
// fast-accumulation schedule). One tile configuration, 128 x 128 x 128 on
// a 2 x 1 cluster, cooperative consumers (two warpgroups share a tile: 64
// accumulator rows each; the ping-pong schedule gave each a whole 128 x 128
// f32 tile plus the promotion accumulator, which spilled at 168 registers:
// 940 bytes a thread, 90.7 M local requests a launch in ncu, a quarter of
// cuBLASLt's rate), a persistent grid.
//
// Built only where CUTLASS's headers are (tools/nvcc_or_stub.sh: PyPI's
// nvidia-cutlass, defines PG_HAVE_CUTLASS; with -DNDEBUG: CUTLASS's device
// asserts are calls, and ptxas serializes the wgmma pipeline across them,
// which cost three quarters of the rate in session 11); else PG_EUNSUPP and
// the caller keeps cuBLASLt.
#include "kernels/cuda/cuda_common.cuh"

#ifdef PG_HAVE_CUTLASS
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace {

using namespace cute;

using ElementA = cutlass::float_e4m3_t;
using ElementB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
using ElementAcc = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int AlignA = 16, AlignB = 16, AlignD = 8;

using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_2, _1, _1>;
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;

namespace fus = cutlass::epilogue::fusion;
using XScale = fus::Sm90ColBroadcast<0, TileShape, float>; // xs[m]: one per row of D
using WScale = fus::Sm90RowBroadcast<0, TileShape, float>; // ws[n]: one per column of D
using Acc = fus::Sm90AccFetch;
constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;
using MulW = fus::Sm90Compute<cutlass::multiplies, float, float, RN>;
using EvtW = fus::Sm90EVT<MulW, WScale, Acc>; // ws[n] * acc

// RES = false: D = bf16(xs[m] * (ws[n] * acc)). RES = true: D = bf16(xs[m] *
// (ws[n] * acc) + C) with C = D's bf16 contents (the residual), f32 sum.
template <bool RES> struct Fp8Gemm {
    using ElementC = std::conditional_t<RES, ElementD, void>;
    using MulX = fus::Sm90Compute<cutlass::multiplies, std::conditional_t<RES, float, ElementD>, float, RN>;
    using EvtX = fus::Sm90EVT<MulX, XScale, EvtW>; // xs[m] * (ws[n] * acc)
    using AddC = fus::Sm90Compute<cutlass::plus, ElementD, float, RN>;
    using Evt = std::conditional_t<RES, fus::Sm90EVT<AddC, EvtX, fus::Sm90SrcFetch<ElementD>>, EvtX>;

    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, ElementC, LayoutD, AlignD, ElementD,
        LayoutD, AlignD, EpilogueSchedule, Evt>::CollectiveOp;

    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, AlignA, ElementB, LayoutB, AlignB,
        ElementAcc, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        KernelSchedule>::CollectiveOp;

    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                        cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <bool RES>
int run(void *out, int64_t ldo, const void *xq, const float *xscales, const void *w, const float *wscales, int M,
        int N, int K, void *workspace, size_t workspace_bytes, cudaStream_t s) {
    using G = Fp8Gemm<RES>;
    using Kernel = typename G::Kernel;
    using Gemm = typename G::Gemm;
    static int sm_count = 0; // the persistent grid's size; asked once
    if (!sm_count) sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, make_shape(M, K, 1));
    StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, make_shape(N, K, 1));
    StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, make_shape(M, N, 1));
    get<0>(sd) = ldo; // rows of D may be wider than n (a column range of a fused output)
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {M, N, K, 1},
                                  {(const ElementA *)xq, sa, (const ElementB *)w, sb},
                                  {{}, nullptr, sd, (ElementD *)out, sd}};
    // The visitor trees' arguments: {children..., op}.
    const typename G::EvtX::Arguments xargs = {{xscales, 0.0f, {}}, {{wscales, 0.0f, {}}, {}, {}}, {}};
    if constexpr (RES) {
        args.epilogue.thread = {xargs, {}, {}};
        args.epilogue.ptr_C = (const ElementD *)out; // in place: the residual
    } else {
        args.epilogue.thread = xargs;
    }
    args.hw_info.sm_count = sm_count;
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
        return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: m %d n %d k %d not implementable", M, N, K);
    const size_t need = Gemm::get_workspace_size(args);
    if (need > workspace_bytes)
        return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: %zu bytes of workspace needed, %zu given", need,
                          workspace_bytes);
    cutlass::Status st = gemm.initialize(args, need ? workspace : nullptr, s);
    if (st == cutlass::Status::kSuccess) st = gemm.run(s);
    if (st != cutlass::Status::kSuccess)
        return pg_err_set(PG_EIO, "gemm fp8 cutlass: %s (m %d n %d k %d)", cutlass::cutlassGetStatusString(st), M, N,
                          K);
    PG_CUDA_LAUNCHED("gemm_fp8_cutlass");
    return 0;
}

} // namespace

extern "C" int pg_cuda_gemm_fp8_cutlass(void *out, int64_t ldo, const void *xq, const float *xscales, const void *w,
                                        const float *wscales, int64_t m, int64_t n, int64_t k, int accumulate,
                                        void *workspace, size_t workspace_bytes, void *stream) {
    PG_ARG(out && xq && xscales && w && wscales, "gemm fp8 cutlass: null pointer");
    PG_ARG(m >= 0 && n > 0 && k > 0 && ldo >= n && m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31),
           "gemm fp8 cutlass: m %lld n %lld k %lld ldo %lld", (long long)m, (long long)n, (long long)k,
           (long long)ldo);
    if (k % AlignA || n % AlignD || ldo % AlignD || ((uintptr_t)out % 16) || ((uintptr_t)xq % 16) ||
        ((uintptr_t)w % 16) || ((uintptr_t)wscales % 16))
        return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: k %lld, n %lld, ldo %lld or a pointer misaligned",
                          (long long)k, (long long)n, (long long)ldo);
    if (m == 0) return 0;
    cudaStream_t s = pg_stream(stream);
    if (accumulate)
        return run<true>(out, ldo, xq, xscales, w, wscales, (int)m, (int)n, (int)k, workspace, workspace_bytes, s);
    return run<false>(out, ldo, xq, xscales, w, wscales, (int)m, (int)n, (int)k, workspace, workspace_bytes, s);
}

#else

extern "C" int pg_cuda_gemm_fp8_cutlass(void *out, int64_t ldo, const void *xq, const float *xscales, const void *w,
                                        const float *wscales, int64_t m, int64_t n, int64_t k, int accumulate,
                                        void *workspace, size_t workspace_bytes, void *stream) {
    (void)out, (void)ldo, (void)xq, (void)xscales, (void)w, (void)wscales, (void)m, (void)n, (void)k, (void)accumulate;
    (void)workspace, (void)workspace_bytes, (void)stream;
    return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: built without CUTLASS's headers (pip install nvidia-cutlass)");
}

#endif
