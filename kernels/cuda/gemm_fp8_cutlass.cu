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
// fast-accumulation schedule). The default configuration (c0), 128 x 128 x
// 128 on a 2 x 1 cluster, cooperative consumers (two warpgroups share a tile: 64
// accumulator rows each; the ping-pong schedule gave each a whole 128 x 128
// f32 tile plus the promotion accumulator, which spilled at 168 registers:
// 940 bytes a thread, 90.7 M local requests a launch in ncu, a quarter of
// cuBLASLt's rate), a persistent grid.
//
// The kernel itself is a template over its configuration
// (gemm_fp8_cutlass.cuh); this file instantiates c0 and dispatches; the
// others (other tiles, clusters, one consumer warpgroup for few tokens, the
// swapped product, ping-pong, fast accumulation) live in gemm_fp8_cutlass_c1.cu ... c8.cu and are reached
// through pg_cuda_gemm_fp8_cutlass_cfg, for the sweep in
// bench/bench_cuda_gemm_fp8.cu (--sweep) and the tests.
//
// Built only where CUTLASS's headers are (tools/nvcc_or_stub.sh: PyPI's
// nvidia-cutlass, defines PG_HAVE_CUTLASS; with -DNDEBUG: CUTLASS's device
// asserts are calls, and ptxas serializes the wgmma pipeline across them,
// which cost three quarters of the rate in session 11); else PG_EUNSUPP and
// the caller keeps cuBLASLt.
#include "kernels/cuda/gemm_fp8_cutlass.cuh"

// The configurations' names, in cfg order (c0 first: the default).
// " coop": two consumer warpgroups, a persistent grid (the scheduler's
// knobs apply); " pp": ping-pong, two consumer warpgroups on a tile each, a
// persistent grid; " ws": one consumer warpgroup, one CTA per tile (no
// knobs); " fast": fast accumulation (no promotion; the tests' looser bound).
// 128 x 256 x 128 cooperative (for the wide gate/up) was tried and dropped:
// ptxas spilled 912 bytes a thread at 168 registers (two warpgroups hold a
// 128 x 256 f32 accumulator plus the promotion's second one).
static const char *const cfg_names[] = {
    "c0 128x128x128 2x1 coop",   "c1 128x128x128 1x2 coop",     "c2 64x128x128 1x1 ws",
    "c3 64x128x128 1x2 ws",      "c4 swap 128x64x128 1x1 ws",   "c5 swap 128x64x128 2x1 coop", "c6 64x128x128 2x1 pp",
    "c7 128x128x128 2x1 pp fast",  "c8 128x128x128 2x1 coop fast",
};
static const int n_cfgs = (int)(sizeof cfg_names / sizeof cfg_names[0]);

#ifdef PG_HAVE_CUTLASS

int pg_fp8_cutlass_sm_count() {
    static int sm_count = 0; // the persistent grid's size; asked once
    if (!sm_count) sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
    return sm_count;
}

using namespace pg_fp8;
using Cfg0 = Fp8Config<Shape<_128, _128, _128>, Shape<_2, _1, _1>, KernelCoop, EpiCoop, false>;
static int run_c0(const Fp8CutlassCall &c) { return run<Cfg0>(c); }

static int (*const cfg_fns[])(const Fp8CutlassCall &) = {
    run_c0, pg_fp8_cutlass_c1, pg_fp8_cutlass_c2, pg_fp8_cutlass_c3, pg_fp8_cutlass_c4,
    pg_fp8_cutlass_c5, pg_fp8_cutlass_c6, pg_fp8_cutlass_c7, pg_fp8_cutlass_c8};
static_assert(sizeof cfg_fns / sizeof cfg_fns[0] == sizeof cfg_names / sizeof cfg_names[0], "one name a config");

extern "C" int pg_cuda_gemm_fp8_cutlass_cfg(int cfg, int swizzle, int raster, void *out, int64_t ldo, const void *xq,
                                            const float *xscales, const void *w, const float *wscales, int64_t m,
                                            int64_t n, int64_t k, int accumulate, void *workspace,
                                            size_t workspace_bytes, void *stream) {
    PG_ARG(out && xq && xscales && w && wscales, "gemm fp8 cutlass: null pointer");
    PG_ARG(m >= 0 && n > 0 && k > 0 && ldo >= n && m < (1ll << 31) && n < (1ll << 31) && k < (1ll << 31),
           "gemm fp8 cutlass: m %lld n %lld k %lld ldo %lld", (long long)m, (long long)n, (long long)k,
           (long long)ldo);
    PG_ARG((swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8) && raster >= 0 && raster <= 2,
           "gemm fp8 cutlass: swizzle %d raster %d", swizzle, raster);
    if (cfg < 0 || cfg >= n_cfgs) return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: no configuration %d", cfg);
    // 16-byte rows of the operands and D for TMA; the row vector of scales
    // 16-byte aligned (wscales; xscales too for the swapped configurations,
    // run() checks).
    if (k % AlignAB || n % AlignD || ldo % AlignD || ((uintptr_t)out % 16) || ((uintptr_t)xq % 16) ||
        ((uintptr_t)w % 16) || ((uintptr_t)wscales % 16))
        return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: k %lld, n %lld, ldo %lld or a pointer misaligned",
                          (long long)k, (long long)n, (long long)ldo);
    if (m == 0) return 0;
    const Fp8CutlassCall c = {out, ldo,        xq, xscales,         w,          wscales,         (int)m, (int)n,
                              (int)k, accumulate != 0, workspace, workspace_bytes, pg_stream(stream), swizzle, raster};
    return cfg_fns[cfg](c);
}

#else

extern "C" int pg_cuda_gemm_fp8_cutlass_cfg(int cfg, int swizzle, int raster, void *out, int64_t ldo, const void *xq,
                                            const float *xscales, const void *w, const float *wscales, int64_t m,
                                            int64_t n, int64_t k, int accumulate, void *workspace,
                                            size_t workspace_bytes, void *stream) {
    (void)cfg, (void)swizzle, (void)raster, (void)out, (void)ldo, (void)xq, (void)xscales, (void)w, (void)wscales;
    (void)m, (void)n, (void)k, (void)accumulate, (void)workspace, (void)workspace_bytes, (void)stream;
    return pg_err_set(PG_EUNSUPP, "gemm fp8 cutlass: built without CUTLASS's headers (pip install nvidia-cutlass)");
}

#endif

extern "C" const char *pg_cuda_gemm_fp8_cutlass_cfg_name(int cfg) {
#ifdef PG_HAVE_CUTLASS
    return cfg >= 0 && cfg < n_cfgs ? cfg_names[cfg] : nullptr;
#else
    (void)cfg, (void)cfg_names, (void)n_cfgs;
    return nullptr; // none built
#endif
}

// The default: c0, no swizzle, CUTLASS's raster heuristic.
extern "C" int pg_cuda_gemm_fp8_cutlass(void *out, int64_t ldo, const void *xq, const float *xscales, const void *w,
                                        const float *wscales, int64_t m, int64_t n, int64_t k, int accumulate,
                                        void *workspace, size_t workspace_bytes, void *stream) {
    return pg_cuda_gemm_fp8_cutlass_cfg(0, 1, 0, out, ldo, xq, xscales, w, wscales, m, n, k, accumulate, workspace,
                                        workspace_bytes, stream);
}

// The model's choice by shape, read from the sweep (bench_cuda_gemm_fp8
// --sweep on an H100, session 18; bench/cuda/fp8_sweep_table.py prints its
// table; docs/fp8_gemm.md). Against cuBLASLt + rescale, the Llama-3-8B
// matrices:
//   - m < 256: cuBLASLt (no configuration is more than 9% faster at 64-128
//     rows, most are slower, and cuBLASLt keeps the promoted accumulation);
//   - m >= 256: c7, vLLM's schedule (128 x 128 ping-pong, fast
//     accumulation): on QKV, O and gate/up 1.04-1.25x at 256 rows and
//     1.14-1.45x at 512-8,192;
//   - except a long reduction (k >= 8,192: down): cuBLASLt below 512 rows
//     (c7 0.89x at 256), c8 (cooperative, fast) to 2,048 rows (1.01-1.13x,
//     where c7 gave 0.95-1.04x), c7 above (1.06-1.08x).
// Swizzle 1 and CUTLASS's raster heuristic: the best fixed knobs over the
// points picked (1.6% under each point's best on the geometric mean, 8% at
// worst; swizzle 2 along n won a few large points and lost up to half at
// others).
extern "C" int pg_cuda_gemm_fp8_cutlass_pick(int64_t m, int64_t n, int64_t k, int *cfg, int *swizzle, int *raster) {
    (void)n; // unused by today's rule, kept: a sweep of other models' shapes may pick by n too
    *swizzle = 1, *raster = 0, *cfg = 0;
    if (m < 256) return -1;
    if (k >= 8192) {
        if (m < 512) return -1;
        *cfg = m <= 2048 ? 8 : 7;
        return 0;
    }
    *cfg = 7;
    return 0;
}
