// kernels/cuda/lora_fused.cu - the graph-safe LoRA op (cuda_ops.h
// pg_cuda_lora_apply_dev) in ONE kernel a call, for calls of at most
// pg_cuda_lora_dev_fused_rows() rows (PAGED_CUDA_LORA_FUSED=N; 0, never,
// by default; docs/lora.md "One launch a group for small steps").
//
// Why: at batch 1 (W1, one request with an adapter: 1.20x the step of no
// adapter, target 1.1x) a layer's LoRA moves almost no bytes; what it
// costs is its kernel boundaries. lora_graph.cu runs each group (Q|K|V, O,
// gate|up, down) as a shrink and an expand after the base product: two
// boundaries a group, eight a layer, each a few microseconds of launch,
// drain and PDL hand-over while the GPU is nearly idle.
//
//   one kernel, grid (rows, columns / (256 * CW)) over the projections'
//   columns side by side, as lora_graph.cu's expand; each CTA:
//     before the PDL wait: its row's slot and the projections' entries;
//       for each projection its columns [j0, j1) touch whose entry has an
//       `a` (usually one; a block may straddle two or three), t[p][r] for
//       r < min(rank, max rank) over ALL `in` columns of x (the 256
//       threads share the k range: 8-column pieces where x, the norm
//       weight and a allow 16-byte loads, columns otherwise; with a norm
//       weight, x * w, and the row's sum of squares in the same loop, t
//       times the inverse RMS rsqrt(mean(x^2) + eps) at the end); the
//       block's sums in a fixed order (pg_lora_scatter_sum in each warp,
//       then the warps in order) into shared memory; then this thread's
//       rows of B (16 bytes at a time where aligned);
//     after it: out[i][j], then bf16(out + scale * t . b[j]) for the CW
//       columns of the thread (pg_lora_expand_store, the expand's tail).
//
// Everything before the wait reads only what the kernel right before (the
// base product, which writes out) does not write: the rows' slots and the
// tables (uploaded before the step), the adapters, the norm weight and x
// (cuda_common.cuh's PDL rules; cuda_ops.h's contract). out is read only
// after the wait; nothing is written before it; every CTA reaches it. No
// workspace.
//
// What it costs instead: every CTA of a row reads its projection's whole
// A (rank x in bf16, from the L2: 128 KB at rank 16 and in 4096; down's
// 14336 x 16 x 2 = 448 KB) and x's row, where the two-kernel shrink reads
// each A once a row. At one row that is a few MB a layer from the L2,
// spread over every SM; at more rows it grows with them: hence a
// threshold, not a default. Measured (session 31, H100, call B): it loses
// to the two kernels once their shrink's loads were fixed (one layer at
// one row 27.6 against 25.3 us: O 5.2 against 7.0, down 10.6 against
// 6.1; served W1 with an adapter 6.733 against 6.614 ms), so it stays off.
//
// Rows of slot -1, and projections whose entry has no `a`, leave their
// columns untouched. The grid depends only on the rows and the columns;
// every sum runs in a fixed order, so a row's values depend only on the
// row and its adapter (the same bits alone or in any batch, eager or
// replayed); they differ from the two-kernel path's by the order of the
// shrink's f32 sums (one k range, not chunks of 1024).
#include "kernels/cuda/lora_int.cuh"

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int NPROJ = PG_CUDA_LORA_MAX_PROJ;
constexpr int MAXR = PG_CUDA_LORA_MAX_RANK;

using DevSlot = pg_cuda_lora_dev_slot;
using Proj = pg_lora_proj;

// This thread's part of row xr's shrink over all `in` columns (the
// 8-column pieces threadIdx.x * 8 apart by THREADS * 8 with vec, else the
// columns threadIdx.x apart by THREADS): acc[r] = (x * w) . a[r] for r <
// rank, 0 past it (w: nw, or 1 without); with want_ss also ss = the sum of
// squares of x over the same columns (else ss is left alone).
template <int RP>
__device__ __forceinline__ void row_sums(float (&acc)[RP], float &ss, bool want_ss, const bf16 *xr, const bf16 *nw,
                                         const bf16 *a, int rank, int64_t in, bool vec) {
    const int vt = threadIdx.x;
#pragma unroll
    for (int r = 0; r < RP; r++) acc[r] = 0.f;
    if (vec) {
        for (int64_t k = (int64_t)vt * 8; k < in; k += THREADS * 8) {
            float xf[8];
            pg_unpack8(pg_lora_ld16(xr + k), xf);
            if (want_ss)
#pragma unroll
                for (int q = 0; q < 8; q++) ss = fmaf(xf[q], xf[q], ss);
            if (nw) {
                float wf[8];
                pg_unpack8(pg_lora_ld16(nw + k), wf);
#pragma unroll
                for (int q = 0; q < 8; q++) xf[q] *= wf[q];
            }
            pg_lora_piece_fma<RP>(acc, xf, a, in, k, rank);
        }
    } else {
        for (int64_t k = vt; k < in; k += THREADS) {
            float xv = __bfloat162float(xr[k]);
            if (want_ss) ss = fmaf(xv, xv, ss);
            if (nw) xv *= __bfloat162float(nw[k]);
#pragma unroll
            for (int r = 0; r < RP; r++)
                if (r < rank) acc[r] = fmaf(xv, __bfloat162float(a[(int64_t)r * in + k]), acc[r]);
        }
    }
}

// The kernel, a CTA a (row, THREADS * CW columns): RP the launch's max rank
// (tstride) rounded up to 8, 16, 32 or 64; CW 2 only where every
// projection starts at an even column and out takes 4-byte accesses (the
// host's `even`), as lora_graph.cu's expand.
template <int RP, int CW>
__global__ void __launch_bounds__(THREADS)
    lora_fused_kernel(bf16 *out, int64_t ldo, const bf16 *x, int64_t ldx, int64_t in, const bf16 *nw, float eps,
                      int tstride, const int32_t *rows, const Proj pj) {
    constexpr int NB = RP / 8; // B's 16-byte pieces a column keeps
    __shared__ float red[WARPS][MAXR + 1]; // [w][MAXR]: the warps' sums of squares
    __shared__ float ts[NPROJ][MAXR];
    __shared__ DevSlot es[NPROJ];
    const int64_t i = blockIdx.x;
    const int s = rows[i];
    if (threadIdx.x < pj.n) es[threadIdx.x] = s >= 0 ? pj.tab[threadIdx.x][s] : DevSlot{};
    __syncthreads();
    const int64_t total = pj.c0[pj.n];
    const int64_t jb = (int64_t)blockIdx.y * THREADS * CW, je = jb + THREADS * CW < total ? jb + THREADS * CW : total;
    // This thread's CW adjacent columns, of one projection p.
    const int64_t j = jb + (int64_t)threadIdx.x * CW;
    int p = 0;
    while (p + 1 < pj.n && j >= pj.c0[p + 1]) p++;
    const DevSlot e = es[p];
    const bool mine = s >= 0 && j < total && e.a;
    if (s >= 0) { // the whole block alike (s, es, jb and je are the block's)
        const bf16 *xr = x + i * ldx;
        const bool xvec = pg_lora_vec_ok(xr, nw, in);
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        float inv_rms = 1.f; // stays 1 without a norm: v * 1 is v
        bool have_rms = !nw;
        for (int q = 0; q < pj.n; q++) {
            if (!es[q].a || pj.c0[q] >= je || pj.c0[q + 1] <= jb) continue;
            const bf16 *a = (const bf16 *)es[q].a;
            const int rank = es[q].rank < tstride ? es[q].rank : tstride;
            const bool avec = (in & 7) == 0 && (reinterpret_cast<uintptr_t>(a) & 15) == 0;
            const bool want_ss = !have_rms;
            float acc[RP], ss = 0.f;
            row_sums<RP>(acc, ss, want_ss, xr, nw, a, rank, in, xvec && avec);
            pg_lora_scatter_sum<RP>(acc, lane);
            using Sc = pg_lora_scatter<RP>;
            if (Sc::writer(lane))
#pragma unroll
                for (int u = 0; u < Sc::N; u++) red[warp][Sc::rank(lane, u)] = acc[u];
            if (want_ss) {
                ss = pg_lora_warp_sum(ss);
                if (lane == 0) red[warp][MAXR] = ss;
            }
            __syncthreads();
            if (want_ss) { // every thread, the warps in order: the same value in all
                float v = 0.f;
#pragma unroll
                for (int w = 0; w < WARPS; w++) v += red[w][MAXR];
                inv_rms = rsqrtf(v / (float)in + eps);
                have_rms = true;
            }
            if (threadIdx.x < RP) {
                float v = 0.f;
                if (threadIdx.x < rank)
#pragma unroll
                    for (int w = 0; w < WARPS; w++) v += red[w][threadIdx.x];
                ts[q][threadIdx.x] = v * inv_rms;
            }
            __syncthreads(); // red is reused by the next projection
        }
    }
    // This thread's rows of B (adjacent for CW 2), still before the wait.
    const bf16 *br = mine ? (const bf16 *)e.b + (j - pj.c0[p]) * e.rank : nullptr;
    const int rank = mine ? (e.rank < tstride ? e.rank : tstride) : 0;
    const bool bvec =
        mine && (rank & 7) == 0 && (CW == 1 || (e.rank & 7) == 0) && (reinterpret_cast<uintptr_t>(br) & 15) == 0;
    uint4 bv[CW][NB];
    if (bvec)
#pragma unroll
        for (int c = 0; c < CW; c++)
#pragma unroll
            for (int q = 0; q < NB; q++)
                if (q * 8 < rank) bv[c][q] = *reinterpret_cast<const uint4 *>(br + c * e.rank + q * 8);
    // out is the base product's, the kernel right before: only after the wait.
    pg_pdl_wait();
    pg_pdl_trigger();
    if (!mine) return;
    float ov[CW];
    if (CW == 1) {
        ov[0] = __bfloat162float(out[i * ldo + j]);
    } else {
        const float2 o2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(out + i * ldo + j));
        ov[0] = o2.x;
        ov[CW - 1] = o2.y;
    }
    pg_lora_expand_store<CW, NB>(out + i * ldo + j, ts[p], bv, br, e.rank, rank, bvec, e.scale, ov);
}

template <int RP>
cudaError_t launch(bf16 *out, int64_t ldo, const bf16 *x, int64_t ldx, int64_t in, const bf16 *nw, float eps,
                   int tstride, const int32_t *rows, const Proj &pj, int64_t m, bool even, cudaStream_t st) {
    const int64_t total = pj.c0[pj.n];
    if (even)
        return pg_launch_pdl(lora_fused_kernel<RP, 2>, dim3((unsigned)m, (unsigned)pg_ceil_div(total, THREADS * 2)),
                             dim3(THREADS), 0, st, out, ldo, x, ldx, in, nw, eps, tstride, rows, pj);
    return pg_launch_pdl(lora_fused_kernel<RP, 1>, dim3((unsigned)m, (unsigned)pg_ceil_div(total, THREADS)),
                         dim3(THREADS), 0, st, out, ldo, x, ldx, in, nw, eps, tstride, rows, pj);
}

} // namespace

cudaError_t pg_lora_fused_launch(bf16 *out, int64_t ldo, const bf16 *x, int64_t ldx, int64_t in, const bf16 *nw,
                                 float eps, int tstride, const int32_t *rows, const pg_lora_proj &pj, int64_t m,
                                 bool even, cudaStream_t st) {
    if (tstride <= 8) return launch<8>(out, ldo, x, ldx, in, nw, eps, tstride, rows, pj, m, even, st);
    if (tstride <= 16) return launch<16>(out, ldo, x, ldx, in, nw, eps, tstride, rows, pj, m, even, st);
    if (tstride <= 32) return launch<32>(out, ldo, x, ldx, in, nw, eps, tstride, rows, pj, m, even, st);
    return launch<64>(out, ldo, x, ldx, in, nw, eps, tstride, rows, pj, m, even, st);
}
