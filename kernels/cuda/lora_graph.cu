// kernels/cuda/lora_graph.cu - graph-safe batched LoRA (cuda_ops.h
// pg_cuda_lora_apply_dev / pg_cuda_lora_table_write; docs/lora.md
// "Graph-safe LoRA"): lora.cu's BGMV arithmetic with the rows' slots and
// the slot tables in device memory, so a captured decode graph serves any
// mix of adapters, and adapters loaded after the capture.
//
//   shrink  grid (rows, projections, chunks of KCHUNK columns): a CTA's
//           threads take one 8-column piece of x each, for all the ranks at
//           once (one load of x, `rank` independent loads of A: the chunk
//           of A is in flight in one round trip, where lora.cu's BGMV has
//           one CTA walk a row's whole A a rank a warp), then the block
//           sums its threads' parts in a fixed order into parts[chunk];
//           with a norm weight w the pieces are x * w, and CTA (row, 0, 0)
//           also takes the row's inverse RMS, rsqrt(mean(x^2) + eps): the
//           RMSNorm the base product fused, applied by the expand
//   expand  grid (rows, columns / 512) over the projections' columns side
//           by side: t[i][p] = the chunks' parts summed in order (times the
//           inverse RMS); each thread finds its projection by column and
//           writes bf16(out + scale * t[i][p] . b[j]) for two adjacent
//           columns (one where the projections or out are not
//           even-aligned), t in shared memory
//
// Both kernels launch with programmatic dependent launch, and do all they
// can before the wait (session 26): the shrink everything but its stores,
// as it reads only x (which the base product right before it does not
// write), the adapters and the tables; the expand its rows of B and its
// elements of out. Each warp's sums go through pg_lora_scatter_sum
// (lora_int.cuh), a reduce-scatter with pg_lora_warp_sum's pairs of lanes
// (so its bits) at a fifth of the shuffles. Session 26, call J on an H100,
// against call G's build: W1 with an adapter 7.248 -> 7.051 ms (no adapter
// 5.871); one layer's LoRA at 64 rows of 8 adapters 95.5 us with one
// column a thread, 75.1 with two (docs/lora.md "Before the wait, two
// columns a thread").
//
// Q, K and V read the same normed rows and write adjacent columns of the
// Q|K|V output, as gate and up do of gate|up: one shrink and one expand
// launch cover all of them, so a Llama layer's LoRA is 8 launches (QKV,
// O, gate|up, down) where lora.cu's BGMV takes 21.
//
// A CTA a row at every batch size: fewer, wider CTAs (session 25's tiles,
// session 26's warp-a-row shrink and 8-columns-a-thread expand, bit for
// bit the same sums) lost 1.1-4x, as a step's LoRA is a few dependent
// round trips to memory a CTA and wants every CTA in flight at once
// (docs/lora.md "Fewer, wider CTAs").
//
// From pg_cuda_lora_dev_tile_rows() rows (PAGED_CUDA_LORA_TILES=N, 48 by
// default; 0, never) a call takes lora_tiles.cu's shape instead: the rows
// grouped by slot into tiles of 16 on the device, a tile's shrink on the
// tensor cores, each load of A and B shared by the tile's rows. Calls of
// at most pg_cuda_lora_dev_fused_rows() rows (PAGED_CUDA_LORA_FUSED=N, 0 by
// default: never) take lora_fused.cu's one kernel before either: each
// expand CTA computes the t it needs itself, before the PDL wait.
//
// The grid depends only on the rows and the columns: a row whose slot is
// -1, or whose slot's entry has no `a` for a projection, leaves at once
// (the shrink's CTA; the expand's threads of that projection). Every sum
// runs in a fixed order: a row's values depend only on the row and its
// adapter (the same bits in any batch, eager or replayed); they differ
// from lora.cu's BGMV by the order of the shrink's f32 sums.
#include <limits.h>
#include <stdlib.h>

#include "kernels/cuda/lora_int.cuh"

namespace {

constexpr int THREADS = 256;  // the expand's
constexpr int STHREADS = 128; // the shrink's: one 8-column piece each per chunk
constexpr int KCHUNK = PG_CUDA_LORA_DEV_KCHUNK;
constexpr int NPROJ = PG_CUDA_LORA_MAX_PROJ;

using DevSlot = pg_cuda_lora_dev_slot;
using Proj = pg_lora_proj;

// This thread's sum of squares of a row (of STHREADS threads over all `in`
// columns of xr): row_rms's loop.
__device__ __forceinline__ float rms_piece(const bf16 *xr, int64_t in, bool vec) {
    const int vt = threadIdx.x;
    float ss = 0.f;
    if (vec) {
#pragma unroll 4
        for (int64_t k = (int64_t)vt * 8; k < in; k += STHREADS * 8) {
            float xf[8];
            pg_unpack8(pg_lora_ld16(xr + k), xf);
#pragma unroll
            for (int q = 0; q < 8; q++) ss = fmaf(xf[q], xf[q], ss);
        }
    } else {
        for (int64_t k = vt; k < in; k += STHREADS) {
            const float v = __bfloat162float(xr[k]);
            ss = fmaf(v, v, ss);
        }
    }
    return ss;
}

// A row's inverse RMS over all `in` columns of x, in thread 0 (block-wide:
// every thread of the block calls it; ends with the block synchronised).
__device__ __forceinline__ float row_rms(const bf16 *xr, int64_t in, float eps, bool vec,
                                         float (*red)[PG_CUDA_LORA_MAX_RANK + 1]) {
    const float ss = pg_lora_warp_sum(rms_piece(xr, in, vec));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5][0] = ss;
    __syncthreads();
    float v = 0.f;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int w = 0; w < STHREADS / 32; w++) v += red[w][0];
        v = rsqrtf(v / (float)in + eps);
    }
    __syncthreads(); // red is reused
    return v;
}

// This thread's (vt's) part of a row's shrink over chunk [k0, k1) (of
// STHREADS threads: the 8-column pieces vt * 8 apart by STHREADS * 8, or columns
// with vec false): acc[r] = (x * w)[its columns] . a[r][its columns] for r
// < rank, 0 past it. Every rank's loads of a piece are independent: all in
// flight at once.
template <int RP>
__device__ __forceinline__ void piece_sums(float (&acc)[RP], const bf16 *xr, const bf16 *nw, const bf16 *a, int rank,
                                           int64_t in, int64_t k0, int64_t k1, bool vec) {
    const int vt = threadIdx.x;
#pragma unroll
    for (int r = 0; r < RP; r++) acc[r] = 0.f;
    if (vec) {
        for (int64_t k = k0 + (int64_t)vt * 8; k < k1; k += STHREADS * 8) {
            float xf[8];
            pg_unpack8(pg_lora_ld16(xr + k), xf);
            if (nw) {
                float wf[8];
                pg_unpack8(pg_lora_ld16(nw + k), wf);
#pragma unroll
                for (int q = 0; q < 8; q++) xf[q] *= wf[q];
            }
            pg_lora_piece_fma<RP>(acc, xf, a, in, k, rank);
        }
    } else {
        for (int64_t k = k0 + vt; k < k1; k += STHREADS) {
            float xv = __bfloat162float(xr[k]);
            if (nw) xv *= __bfloat162float(nw[k]);
#pragma unroll
            for (int r = 0; r < RP; r++)
                if (r < rank) acc[r] = fmaf(xv, __bfloat162float(a[(int64_t)r * in + k]), acc[r]);
        }
    }
}

// The shrink, a CTA a row: grid (rows, projections, chunks of KCHUNK
// columns), RP the launch's max rank rounded up to 8, 16, 32 or 64:
// parts[((c * m + i) * n + p) * tstride + r] = (x[i] * w)[chunk c] .
// a[r][chunk c] for r < min(rank, tstride), and with a norm, for CTAs of
// (p, c) = (0, 0), the row's inverse RMS to rms[i] (the expand applies it:
// the chunks see only their columns). The block's sums: each warp's
// (pg_lora_scatter_sum), then the warps' in order.
//
// Everything but the stores runs before the PDL wait: the rows' slots and
// the tables (uploaded before the step), the adapters, and x, which the
// kernel right before this one does not write (cuda_ops.h: the base
// product before it writes out) and the kernels before that one have
// finished writing (cuda_common.cuh's PDL rules). So the shrink runs under
// the tail of the base product; only its stores wait, for the kernels that
// may still read parts and rms.
template <int RP>
__global__ void __launch_bounds__(STHREADS) lora_dev_shrink_kernel(float *parts, float *rms, int tstride,
                                                                   const bf16 *x, int64_t ldx, int64_t in, int64_t m,
                                                                   const bf16 *nw, float eps, const int32_t *rows,
                                                                   const Proj pj) {
    constexpr int WARPS = STHREADS / 32;
    __shared__ float red[WARPS][PG_CUDA_LORA_MAX_RANK + 1];
    const int64_t i = blockIdx.x;
    const int p = blockIdx.y, c = blockIdx.z;
    const int s = rows[i];
    const DevSlot e = s >= 0 ? pj.tab[p][s] : DevSlot{};
    const bool with_rms = s >= 0 && nw && p == 0 && c == 0, with_t = s >= 0 && e.a;
    const int rank = with_t ? (e.rank < tstride ? e.rank : tstride) : 0;
    float inv_rms = 0.f, v = 0.f;
    if (s >= 0) { // the whole block alike
        const bf16 *xr = x + i * ldx;
        const bool xvec = pg_lora_vec_ok(xr, nw, in);
        if (with_rms) inv_rms = row_rms(xr, in, eps, xvec, red);
        if (with_t) {
            const bf16 *a = (const bf16 *)e.a;
            const int64_t k0 = (int64_t)c * KCHUNK, k1 = k0 + KCHUNK < in ? k0 + KCHUNK : in;
            const bool avec = (in & 7) == 0 && (reinterpret_cast<uintptr_t>(a) & 15) == 0;
            const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
            float acc[RP];
            piece_sums<RP>(acc, xr, nw, a, rank, in, k0, k1, xvec && avec);
            pg_lora_scatter_sum<RP>(acc, lane);
            using Sc = pg_lora_scatter<RP>;
            if (Sc::writer(lane))
#pragma unroll
                for (int q = 0; q < Sc::N; q++) red[warp][Sc::rank(lane, q)] = acc[q];
            __syncthreads();
            if (threadIdx.x < rank)
#pragma unroll
                for (int w = 0; w < WARPS; w++) v += red[w][threadIdx.x];
        }
    }
    pg_pdl_wait();
    pg_pdl_trigger();
    if (with_rms && threadIdx.x == 0) rms[i] = inv_rms;
    if (threadIdx.x < rank) parts[(((int64_t)c * m + i) * pj.n + p) * tstride + threadIdx.x] = v;
}

// t[i][p] for every projection p of row i into ts (the block's threads
// together; es: the row's entries).
__device__ __forceinline__ void expand_t(float (*ts)[PG_CUDA_LORA_MAX_RANK], const DevSlot *es, const float *parts,
                                         const float *rms, int chunks, int64_t m, int tstride, int64_t i,
                                         const Proj &pj) {
    for (int q = threadIdx.x; q < pj.n * tstride; q += THREADS) {
        const int pq = q / tstride, r = q % tstride;
        const int rank = es[pq].rank < tstride ? es[pq].rank : tstride;
        ts[pq][r] = es[pq].a && r < rank ? pg_lora_t_value(parts, rms, chunks, m, tstride, pj.n, i, pq, r) : 0.f;
    }
}

// The expand, a CTA a row: grid (rows, columns / (THREADS * CW)) over the
// projections' columns side by side; out[i][j] = bf16(out[i][j] + scale_p
// * t[i][p] . b_p[j - c0_p]) for the CW columns j of each thread, p their
// projection, the FMAs over the ranks in order. Before the PDL wait, what
// the shrink right before does not write: the slots, the tables, the
// thread's rows of B (in registers, 16 bytes at a time) and out[i][j],
// which the base product two kernels back wrote (complete once this grid
// starts: the shrink triggers after its wait). After it, t (the shrink's
// parts) and the FMAs. RP: as the shrink's.
template <int RP, int CW>
__global__ void __launch_bounds__(THREADS) lora_dev_expand_kernel(bf16 *out, int64_t ldo, const float *parts,
                                                                  const float *rms, int chunks, int64_t m,
                                                                  int tstride, const int32_t *rows, const Proj pj) {
    constexpr int NB = RP / 8; // B's 16-byte pieces a column keeps
    __shared__ float ts[NPROJ][PG_CUDA_LORA_MAX_RANK];
    __shared__ DevSlot es[NPROJ];
    const int64_t i = blockIdx.x;
    const int s = rows[i];
    if (threadIdx.x < pj.n) es[threadIdx.x] = s >= 0 ? pj.tab[threadIdx.x][s] : DevSlot{};
    __syncthreads();
    // CW adjacent columns of one projection (CW 2: the host checked that
    // every projection starts at an even column and out takes 4-byte
    // accesses); their rows of B are adjacent too.
    const int64_t j = ((int64_t)blockIdx.y * THREADS + threadIdx.x) * CW;
    int p = 0;
    while (p + 1 < pj.n && j >= pj.c0[p + 1]) p++;
    const DevSlot e = es[p];
    const bool mine = s >= 0 && j < pj.c0[pj.n] && e.a;
    const bf16 *br = mine ? (const bf16 *)e.b + (j - pj.c0[p]) * e.rank : nullptr;
    const int rank = mine ? (e.rank < tstride ? e.rank : tstride) : 0;
    const bool bvec =
        mine && (rank & 7) == 0 && (CW == 1 || (e.rank & 7) == 0) && (reinterpret_cast<uintptr_t>(br) & 15) == 0;
    uint4 bv[CW][NB];
    float ov[CW];
#pragma unroll
    for (int c = 0; c < CW; c++) ov[c] = 0.f;
    if (mine) {
        if (CW == 1) {
            ov[0] = __bfloat162float(out[i * ldo + j]);
        } else {
            const float2 o2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(out + i * ldo + j));
            ov[0] = o2.x;
            ov[CW - 1] = o2.y;
        }
    }
    if (bvec)
#pragma unroll
        for (int c = 0; c < CW; c++)
#pragma unroll
            for (int q = 0; q < NB; q++)
                if (q * 8 < rank) bv[c][q] = *reinterpret_cast<const uint4 *>(br + c * e.rank + q * 8);
    pg_pdl_wait();
    pg_pdl_trigger();
    if (s < 0) return;
    expand_t(ts, es, parts, rms, chunks, m, tstride, i, pj);
    __syncthreads();
    if (!mine) return;
    pg_lora_expand_store<CW, NB>(out + i * ldo + j, ts[p], bv, br, e.rank, rank, bvec, e.scale, ov);
}

// Columns a thread of the expand: 2 where the shapes allow (session 26,
// call J on an H100: one layer's LoRA at 64 rows of 8 adapters 95.5 -> 75.1
// us, served W4 +2.7%, W1 the same), PAGED_CUDA_LORA_EXPAND_COLS=1 for one
// (read once).
int expand_cols() {
    static int n = -1;
    if (n < 0) {
        const char *e = getenv("PAGED_CUDA_LORA_EXPAND_COLS");
        n = e && atoi(e) == 1 ? 1 : 2;
    }
    return n;
}

// Rows from which a call takes lora_tiles.cu's tiles of one adapter
// (PAGED_CUDA_LORA_TILES=N, read once; 0: never; pg_cuda_lora_dev_tile_rows
// changes it). 48 by default since session 31 (H100, call B, with the
// shrink's loads fixed, one layer's op: below 32 rows a CTA a row wins for
// any mix, from 64 the tiles do; at 48 rows the tiles lose 13% for one
// adapter and win 20% for eight: docs/lora.md "The tiles' threshold").
// 16 in session 30, when served W4 with 8 adapters gained 1.7% with them.
int64_t g_tile_rows = -1;
int64_t tile_rows() {
    if (g_tile_rows < 0) {
        const char *e = getenv("PAGED_CUDA_LORA_TILES");
        g_tile_rows = !e ? 48 : atoll(e) > 0 ? atoll(e) : 0;
    }
    return g_tile_rows;
}

// Rows up to which a call takes lora_fused.cu's one kernel
// (PAGED_CUDA_LORA_FUSED=N, read once; 0: never, the default;
// pg_cuda_lora_dev_fused_rows changes it). Checked before the tiles.
int64_t g_fused_rows = -1;
int64_t fused_rows() {
    if (g_fused_rows < 0) {
        const char *e = getenv("PAGED_CUDA_LORA_FUSED");
        g_fused_rows = e && atoll(e) > 0 ? atoll(e) : 0;
    }
    return g_fused_rows;
}

// The launch's two kernels, RP the max rank rounded up to 8, 16, 32 or 64.
template <int RP>
cudaError_t launch(bf16 *out, int64_t ldo, float *parts, float *rms, int tstride, const bf16 *x, int64_t ldx,
                   int64_t in, const bf16 *nw, float eps, const int32_t *rows, const Proj &pj, int64_t m, int chunks,
                   unsigned col_blocks, bool even, cudaStream_t st) {
    cudaError_t e = pg_launch_pdl(lora_dev_shrink_kernel<RP>, dim3((unsigned)m, (unsigned)pj.n, (unsigned)chunks),
                                  dim3(STHREADS), 0, st, parts, rms, tstride, x, ldx, in, m, nw, eps, rows, pj);
    if (e != cudaSuccess) return e;
    const float *rms_or_null = nw ? rms : nullptr;
    if (even)
        return pg_launch_pdl(lora_dev_expand_kernel<RP, 2>, dim3((unsigned)m, (col_blocks + 1) / 2), dim3(THREADS), 0,
                             st, out, ldo, (const float *)parts, rms_or_null, chunks, m, tstride, rows, pj);
    return pg_launch_pdl(lora_dev_expand_kernel<RP, 1>, dim3((unsigned)m, col_blocks), dim3(THREADS), 0, st, out, ldo,
                         (const float *)parts, rms_or_null, chunks, m, tstride, rows, pj);
}

} // namespace

int pg_cuda_lora_apply_dev(void *out, int64_t ldo, const void *x, int64_t ldx, int64_t m, int64_t in,
                           const void *norm_w, float eps, const int64_t *cols, int32_t n_proj,
                           const int32_t *row_slot_dev, const pg_cuda_lora_dev_slot *const *tables, int32_t n_slots,
                           int32_t max_rank, void *ws, size_t ws_bytes, void *stream) {
    PG_ARG(n_slots >= 1 && n_slots <= PG_CUDA_LORA_MAX_SLOTS, "cuda lora_apply_dev: %d slots (1 to %d)", n_slots,
           PG_CUDA_LORA_MAX_SLOTS);
    PG_ARG(n_proj >= 1 && n_proj <= NPROJ && cols && tables, "cuda lora_apply_dev: %d projections (1 to %d)",
           n_proj, NPROJ);
    PG_ARG(max_rank >= 1 && max_rank <= PG_CUDA_LORA_MAX_RANK, "cuda lora_apply_dev: max rank %d (1 to %d)",
           max_rank, PG_CUDA_LORA_MAX_RANK);
    Proj pj;
    memset(&pj, 0, sizeof pj);
    pj.n = n_proj;
    for (int p = 0; p < n_proj; p++) {
        PG_ARG(cols[p] >= 1 && tables[p], "cuda lora_apply_dev: projection %d: %lld columns, table %s", p,
               (long long)cols[p], tables[p] ? "set" : "NULL");
        pj.tab[p] = tables[p];
        pj.c0[p + 1] = pj.c0[p] + cols[p];
    }
    const int64_t total = pj.c0[n_proj];
    PG_ARG(m >= 0 && m <= INT_MAX && in >= 1 && ldx >= in && ldo >= total && total <= (int64_t)65535 * THREADS,
           "cuda lora_apply_dev: %lld rows of %lld -> %lld, strides %lld / %lld", (long long)m, (long long)in,
           (long long)total, (long long)ldx, (long long)ldo);
    if (m == 0) return 0;
    PG_ARG(out && x && row_slot_dev, "cuda lora_apply_dev: null rows or slots");
    const int chunks = pg_ceil_div(in, KCHUNK);
    const size_t need = pg_cuda_lora_dev_workspace_size(m, in, n_proj, max_rank);
    PG_ARG(ws && ws_bytes >= need && ((uintptr_t)ws & 3) == 0,
           "cuda lora_apply_dev: workspace %zu bytes, %lld rows x %d projections of %lld columns at rank %d want %zu "
           "(4-byte aligned)", ws_bytes, (long long)m, n_proj, (long long)in, max_rank, need);
    cudaStream_t st = pg_stream(stream);
    float *parts = (float *)ws, *rms = parts + (size_t)chunks * (size_t)m * (size_t)n_proj * (size_t)max_rank;
    const bf16 *xb = (const bf16 *)x, *nw = (const bf16 *)norm_w;
    const unsigned col_blocks = (unsigned)pg_ceil_div(total, THREADS);
    bf16 *ob = (bf16 *)out;
    // Two columns a thread in the expand when every projection starts at
    // an even column and out takes 4-byte accesses.
    bool even = expand_cols() == 2 && (ldo & 1) == 0 && ((uintptr_t)out & 3) == 0;
    for (int p = 0; p < pj.n; p++) even = even && (pj.c0[p + 1] & 1) == 0;
    cudaError_t le;
    if (fused_rows() > 0 && m <= fused_rows())
        le = pg_lora_fused_launch(ob, ldo, xb, ldx, in, nw, eps, max_rank, row_slot_dev, pj, m, even, st);
    else if (tile_rows() > 0 && m >= tile_rows())
        le = pg_lora_tiles_launch(ob, ldo, parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, n_slots,
                                  chunks, even, st);
    else if (max_rank <= 8)
        le = launch<8>(ob, ldo, parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, chunks, col_blocks,
                       even, st);
    else if (max_rank <= 16)
        le = launch<16>(ob, ldo, parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, chunks, col_blocks,
                        even, st);
    else if (max_rank <= 32)
        le = launch<32>(ob, ldo, parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, chunks, col_blocks,
                        even, st);
    else
        le = launch<64>(ob, ldo, parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, chunks, col_blocks,
                        even, st);
    PG_CUDA_TRY(le);
    return 0;
}

int64_t pg_cuda_lora_dev_tile_rows(int64_t set) {
    const int64_t was = tile_rows();
    if (set >= 0) g_tile_rows = set;
    return was;
}

int64_t pg_cuda_lora_dev_fused_rows(int64_t set) {
    const int64_t was = fused_rows();
    if (set >= 0) g_fused_rows = set;
    return was;
}

int pg_cuda_lora_table_write(pg_cuda_lora_dev_slot *dst, const pg_cuda_lora_dev_slot *src, int64_t n,
                             void *stream) {
    PG_ARG(n >= 0 && (n == 0 || (dst && src)), "cuda lora_table_write: %lld entries", (long long)n);
    if (n == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    PG_CUDA_TRY(cudaStreamIsCapturing(st, &cap));
    if (cap != cudaStreamCaptureStatusNone)
        return pg_err_set(PG_EUNSUPP, "cuda lora_table_write: not under stream capture (adapters load between "
                                      "steps)");
    // The steps queued so far may read the old entries: let them finish.
    PG_CUDA_TRY(cudaStreamSynchronize(st));
    PG_CUDA_TRY(cudaMemcpy(dst, src, sizeof *src * (size_t)n, cudaMemcpyHostToDevice));
    return 0;
}
