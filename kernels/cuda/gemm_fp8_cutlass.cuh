// kernels/cuda/gemm_fp8_cutlass.cuh - the one-pass W8A8 CUTLASS kernel as a
// template over its tile configuration, shared by gemm_fp8_cutlass.cu (the
// default configuration and the dispatch) and gemm_fp8_cutlass_c*.cu (one
// more configuration each: a CUTLASS sm90 kernel takes about a minute of
// nvcc per instantiation, so each file compiles on its own core).
//
// D[m][n] (row-major, ld ldo) = xs[m] * (ws[n] * sum_k xq[m][k] * w[n][k])
// (+ D[m][n]), f32 accumulation with the mainloop's periodic promotion, one
// rounding to bf16; the configurations named "fast" (c7, c8) take the
// FP8FastAccum schedules instead, which keep the tensor core's own
// accumulator throughout (no promotion: less exact over long k, fewer
// registers), as vLLM's and TensorRT-LLM's sm90 FP8 kernels do.
//
// A configuration (Fp8Config) fixes the tile, the cluster, the kernel and
// epilogue schedules, and whether the product is swapped:
//   - plain: A = xq [M][K], B = w [N][K], D = out [M][N] row-major; xs is
//     a column vector of D (one per row), ws a row vector.
//   - swapped: the transpose, D^T = w xq^T: A = w (M' = n), B = xq (N' =
//     m), D^T column-major with ld ldo, which is out row-major as stored.
//     For few tokens: the tile's wide side covers n, its narrow side the
//     handful of rows. The scales change roles (ws now per row of D^T, xs
//     per column); the visitor tree computes the same xs * (ws * acc).
// Persistent kernels (cooperative) take the tile scheduler's runtime knobs
// (swizzle, raster order); the plain warp-specialized kernel launches one
// CTA per tile in blockIdx order and has none.
#pragma once
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

// One call's arguments, as the C entry point received them (checked there).
struct Fp8CutlassCall {
    void *out;
    int64_t ldo;
    const void *xq;
    const float *xs;
    const void *w;
    const float *ws;
    int m, n, k;
    bool accumulate;
    void *workspace;
    size_t workspace_bytes;
    cudaStream_t stream;
    int swizzle; // the persistent scheduler's max swizzle size: 1, 2, 4 or 8
    int raster;  // 0 CUTLASS's heuristic, 1 along M, 2 along N (of D, not D^T)
};

// The SMs of device 0: the persistent grid's size (asked once, in
// gemm_fp8_cutlass.cu).
int pg_fp8_cutlass_sm_count();

namespace pg_fp8 {

using namespace cute;
namespace fus = cutlass::epilogue::fusion;

using KernelCoop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpiCoop = cutlass::epilogue::TmaWarpSpecializedCooperative;
using KernelWs = cutlass::gemm::KernelTmaWarpSpecialized; // one consumer warpgroup, one tile per CTA
using EpiWs = cutlass::epilogue::TmaWarpSpecialized;
// Ping-pong: two consumer warpgroups, each on a whole tile of its own, one's
// math overlapping the other's epilogue; a persistent grid, the plain
// warp-specialized epilogue.
using KernelPp = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using KernelPpFast = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
using KernelCoopFast = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;

template <class Tile_, class Cluster_, class KSched_, class ESched_, bool Swap_> struct Fp8Config {
    using TileShape = Tile_;
    using ClusterShape = Cluster_;
    using KernelSchedule = KSched_;
    using EpilogueSchedule = ESched_;
    static constexpr bool kSwap = Swap_;
    static constexpr bool kPersistent = !std::is_same_v<KSched_, KernelWs>;
};

using ElementFp8 = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
using ElementAcc = float;
constexpr int AlignAB = 16, AlignD = 8;
constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;

// RES = false: D = bf16(xs[m] * (ws[n] * acc)). RES = true: D = bf16(xs[m] *
// (ws[n] * acc) + C) with C = D's bf16 contents (the residual), f32 sum.
template <class Cfg, bool RES> struct Fp8Gemm {
    using TileShape = typename Cfg::TileShape;
    using ClusterShape = typename Cfg::ClusterShape;
    // Both operands K-major (the TN form FP8 wgmma needs): A row-major, B
    // column-major, in both forms. D row-major, or its transpose
    // column-major.
    using LayoutA = cutlass::layout::RowMajor;
    using LayoutB = cutlass::layout::ColumnMajor;
    using LayoutD = std::conditional_t<Cfg::kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
    // The token scales broadcast along D's columns (one per row of D), or
    // along D^T's rows; the channel scales the other way.
    using ColB = fus::Sm90ColBroadcast<0, TileShape, float>;
    using RowB = fus::Sm90RowBroadcast<0, TileShape, float>;
    using XScale = std::conditional_t<Cfg::kSwap, RowB, ColB>;
    using WScale = std::conditional_t<Cfg::kSwap, ColB, RowB>;
    using MulW = fus::Sm90Compute<cutlass::multiplies, float, float, RN>;
    using EvtW = fus::Sm90EVT<MulW, WScale, fus::Sm90AccFetch>; // ws[n] * acc
    using ElementC = std::conditional_t<RES, ElementD, void>;
    using MulX = fus::Sm90Compute<cutlass::multiplies, std::conditional_t<RES, float, ElementD>, float, RN>;
    using EvtX = fus::Sm90EVT<MulX, XScale, EvtW>; // xs[m] * (ws[n] * acc)
    using AddC = fus::Sm90Compute<cutlass::plus, ElementD, float, RN>;
    using Evt = std::conditional_t<RES, fus::Sm90EVT<AddC, EvtX, fus::Sm90SrcFetch<ElementD>>, EvtX>;

    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, ElementC, LayoutD, AlignD, ElementD,
        LayoutD, AlignD, typename Cfg::EpilogueSchedule, Evt>::CollectiveOp;

    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementFp8, LayoutA, AlignAB, ElementFp8, LayoutB,
        AlignAB, ElementAcc, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        typename Cfg::KernelSchedule>::CollectiveOp;

    // PersistentScheduler: a persistent grid for the cooperative kernel; the
    // plain warp-specialized kernel accepts only this tag (or void) and
    // launches one CTA per tile.
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                        cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Cfg, bool RES> int run_one(const Fp8CutlassCall &c) {
    using G = Fp8Gemm<Cfg, RES>;
    using Kernel = typename G::Kernel;
    using Gemm = typename G::Gemm;
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    // Problem (M', N') and operands: (m, n) and (xq, w), or swapped.
    const int M = Cfg::kSwap ? c.n : c.m, N = Cfg::kSwap ? c.m : c.n, K = c.k;
    const void *a = Cfg::kSwap ? c.w : c.xq, *b = Cfg::kSwap ? c.xq : c.w;
    StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, make_shape(M, K, 1));
    StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, make_shape(N, K, 1));
    StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, make_shape(M, N, 1));
    // Rows of D may be wider than n (a column range of a fused output): D's
    // row stride, or D^T's column stride.
    if constexpr (Cfg::kSwap)
        get<1>(sd) = c.ldo;
    else
        get<0>(sd) = c.ldo;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {M, N, K, 1},
                                  {(const ElementFp8 *)a, sa, (const ElementFp8 *)b, sb},
                                  {{}, nullptr, sd, (ElementD *)c.out, sd}};
    // The visitor trees' arguments: {children..., op}. XScale and WScale
    // take {pointer, value when null, stride} whichever way they broadcast.
    const typename G::EvtX::Arguments xargs = {{c.xs, 0.0f, {}}, {{c.ws, 0.0f, {}}, {}, {}}, {}};
    if constexpr (RES) {
        args.epilogue.thread = {xargs, {}, {}};
        args.epilogue.ptr_C = (const ElementD *)c.out; // in place: the residual
    } else {
        args.epilogue.thread = xargs;
    }
    args.hw_info.sm_count = pg_fp8_cutlass_sm_count();
    if constexpr (Cfg::kPersistent) {
        // Raster along D's M is along D^T's N.
        const bool along_m = c.raster == 1, along_n = c.raster == 2;
        args.scheduler.max_swizzle_size = c.swizzle;
        args.scheduler.raster_order = (Cfg::kSwap ? along_n : along_m)   ? Raster::AlongM
                                      : (Cfg::kSwap ? along_m : along_n) ? Raster::AlongN
                                                                         : Raster::Heuristic;
    }
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
        return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: m %d n %d k %d not implementable", c.m, c.n, c.k);
    const size_t need = Gemm::get_workspace_size(args);
    if (need > c.workspace_bytes)
        return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: %zu bytes of workspace needed, %zu given", need,
                          c.workspace_bytes);
    cutlass::Status st = gemm.initialize(args, need ? c.workspace : nullptr, c.stream);
    if (st == cutlass::Status::kSuccess) st = gemm.run(c.stream);
    if (st != cutlass::Status::kSuccess)
        return pg_err_set(PG_EIO, "gemm fp8 cutlass: %s (m %d n %d k %d)", cutlass::cutlassGetStatusString(st), c.m,
                          c.n, c.k);
    PG_CUDA_LAUNCHED("gemm_fp8_cutlass");
    return 0;
}

// Both variants of one configuration: what each gemm_fp8_cutlass_c*.cu
// instantiates, once.
template <class Cfg> int run(const Fp8CutlassCall &c) {
    if (!Cfg::kPersistent && (c.swizzle != 1 || c.raster != 0))
        return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: this configuration has no tile scheduler (swizzle %d, "
                                      "raster %d)", c.swizzle, c.raster);
    if (Cfg::kSwap && (uintptr_t)c.xs % 16)
        return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: xscales misaligned (a row vector when swapped)");
    return c.accumulate ? run_one<Cfg, true>(c) : run_one<Cfg, false>(c);
}

} // namespace pg_fp8

// The configurations past the default (gemm_fp8_cutlass_c<i>.cu), each
// defined in its own translation unit.
int pg_fp8_cutlass_c1(const Fp8CutlassCall &c);
int pg_fp8_cutlass_c2(const Fp8CutlassCall &c);
int pg_fp8_cutlass_c3(const Fp8CutlassCall &c);
int pg_fp8_cutlass_c4(const Fp8CutlassCall &c);
int pg_fp8_cutlass_c5(const Fp8CutlassCall &c);
int pg_fp8_cutlass_c6(const Fp8CutlassCall &c);
int pg_fp8_cutlass_c7(const Fp8CutlassCall &c);
int pg_fp8_cutlass_c8(const Fp8CutlassCall &c);

#endif
