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
//   expand  grid (rows, columns / 256) over the projections' columns side
//           by side: t[i][p] = the chunks' parts summed in order (times the
//           inverse RMS); each thread finds its projection by column and
//           writes bf16(out + scale * t[i][p] . b[j]), t in shared memory
//
// Both kernels launch with programmatic dependent launch: before the wait
// a CTA reads only what no kernel of the step writes (its row's slot, the
// table entry) and asks the L2 for its chunk of A (shrink) or its row of B
// (expand), so those fetches overlap the kernel before (session 25: W1
// with an adapter 7.92 -> 7.08 ms on an H100).
//
// Q, K and V read the same normed rows and write adjacent columns of the
// Q|K|V output, as gate and up do of gate|up: one shrink and one expand
// launch cover all of them, so a Llama layer's LoRA is 8 launches (QKV,
// O, gate|up, down) where lora.cu's BGMV takes 21.
//
// A CTA runs one row, or with PAGED_CUDA_LORA_DEV_TILES=1 past 8 rows a
// tile of rows (docs/lora.md "Tiles of rows"): the shrink's 64 / rank
// rows of one adapter at once, their pieces of A loaded once; the
// expand's 16 rows, their t in one pass, then a column's rows one after
// another. A row's arithmetic is the same in either: its bits too.
//
// The grid depends only on the rows and the columns: a row whose slot is
// -1, or whose slot's entry has no `a` for a projection, leaves at once
// (the shrink's CTA; the expand's threads of that projection). Every sum
// runs in a fixed order: a row's values depend only on the row and its
// adapter (the same bits in any batch, eager or replayed); they differ
// from lora.cu's BGMV by the order of the shrink's f32 sums.
#include <limits.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_common.cuh"

namespace {

constexpr int THREADS = 256;  // the expand's
constexpr int STHREADS = 128; // the shrink's: one 8-column piece each per chunk
constexpr int KCHUNK = PG_CUDA_LORA_DEV_KCHUNK;
constexpr int NPROJ = PG_CUDA_LORA_MAX_PROJ;

using DevSlot = pg_cuda_lora_dev_slot;

// The projections of one launch: their tables and first columns (c0[n]:
// every column).
struct Proj {
    const DevSlot *tab[NPROJ];
    int64_t c0[NPROJ + 1];
    int n;
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Asks the L2 for `bytes` (a multiple of 16) at p (16-byte aligned): a
// hint, no register kept (sm_90's bulk prefetch; nothing before).
__device__ __forceinline__ void l2_prefetch(const void *p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// A row's inverse RMS over all `in` columns of x into rms[i] (block-wide;
// every thread of the block calls it).
__device__ __forceinline__ void row_rms(float *rms, int64_t i, const bf16 *xr, int64_t in, float eps, bool vec,
                                        float (*red)[PG_CUDA_LORA_MAX_RANK + 1]) {
    float ss = 0.f;
    if (vec) {
#pragma unroll 4
        for (int64_t k = (int64_t)threadIdx.x * 8; k < in; k += STHREADS * 8) {
            float xf[8];
            pg_unpack8(*reinterpret_cast<const uint4 *>(xr + k), xf);
#pragma unroll
            for (int q = 0; q < 8; q++) ss = fmaf(xf[q], xf[q], ss);
        }
    } else {
        for (int64_t k = threadIdx.x; k < in; k += STHREADS) {
            const float v = __bfloat162float(xr[k]);
            ss = fmaf(v, v, ss);
        }
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5][0] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < STHREADS / 32; w++) v += red[w][0];
        rms[i] = rsqrtf(v / (float)in + eps);
    }
    __syncthreads(); // red is reused
}

// The L2 prefetch of a shrink CTA's chunk c of A (entry e): a rank a thread.
__device__ __forceinline__ void prefetch_a(const DevSlot &e, int tstride, int64_t in, int c) {
    const int rank = e.rank < tstride ? e.rank : tstride;
    const bf16 *a = (const bf16 *)e.a;
    const int64_t k0 = (int64_t)c * KCHUNK, k1 = k0 + KCHUNK < in ? k0 + KCHUNK : in;
    if (a && (in & 7) == 0 && (reinterpret_cast<uintptr_t>(a) & 15) == 0 && (int)threadIdx.x < rank)
        l2_prefetch(a + (int64_t)threadIdx.x * in + k0, (uint32_t)(k1 - k0) * 2);
}

// One row's part of the shrink (every thread of the block calls it, for
// a row whose slot s >= 0, e = the slot's entry for projection p):
// parts[((c * m + i) * n + p) * tstride + r] = (x[i] * w)[chunk c] .
// a[r][chunk c] for r < min(rank, tstride), and with
// a norm, for CTAs of (p, c) = (0, 0), the row's inverse RMS to rms[i] (the
// expand applies it: the chunks see only their columns). The same
// arithmetic in the same order whichever CTA and tile run the row. Ends
// with the block synchronised (red is reused by the next row).
template <int RP>
__device__ __forceinline__ void shrink_row(float *parts, float *rms, int tstride, const bf16 *x, int64_t ldx,
                                           int64_t in, int64_t m, const bf16 *nw, float eps, const Proj &pj,
                                           int64_t i, const DevSlot &e, int p, int c,
                                           float (*red)[PG_CUDA_LORA_MAX_RANK + 1]) {
    constexpr int WARPS = STHREADS / 32;
    const bf16 *xr = x + i * ldx;
    const bool xvec = (in & 7) == 0 &&
                      ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(nw)) & 15) == 0;
    if (nw && p == 0 && c == 0) row_rms(rms, i, xr, in, eps, xvec, red);
    if (!e.a) return;
    const int rank = e.rank < tstride ? e.rank : tstride;
    const bf16 *a = (const bf16 *)e.a;
    const int64_t k0 = (int64_t)c * KCHUNK, k1 = k0 + KCHUNK < in ? k0 + KCHUNK : in;
    const bool avec = (in & 7) == 0 && (reinterpret_cast<uintptr_t>(a) & 15) == 0;
    float acc[RP];
#pragma unroll
    for (int r = 0; r < RP; r++) acc[r] = 0.f;
    // Every rank's loads of a piece are independent: all in flight at once.
    if (xvec && avec) {
        for (int64_t k = k0 + (int64_t)threadIdx.x * 8; k < k1; k += STHREADS * 8) {
            float xf[8];
            pg_unpack8(*reinterpret_cast<const uint4 *>(xr + k), xf);
            if (nw) {
                float wf[8];
                pg_unpack8(*reinterpret_cast<const uint4 *>(nw + k), wf);
#pragma unroll
                for (int q = 0; q < 8; q++) xf[q] *= wf[q];
            }
#pragma unroll
            for (int r = 0; r < RP; r++)
                if (r < rank) {
                    float af[8];
                    pg_unpack8(*reinterpret_cast<const uint4 *>(a + (int64_t)r * in + k), af);
#pragma unroll
                    for (int q = 0; q < 8; q++) acc[r] = fmaf(xf[q], af[q], acc[r]);
                }
        }
    } else {
        for (int64_t k = k0 + threadIdx.x; k < k1; k += STHREADS) {
            float xv = __bfloat162float(xr[k]);
            if (nw) xv *= __bfloat162float(nw[k]);
#pragma unroll
            for (int r = 0; r < RP; r++)
                if (r < rank) acc[r] = fmaf(xv, __bfloat162float(a[(int64_t)r * in + k]), acc[r]);
        }
    }
    // The block's sums: each warp's by shuffles, then the warps' in order.
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < RP; r++)
        if (r < rank) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) red[warp][r] = v;
        }
    __syncthreads();
    if (threadIdx.x < rank) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) v += red[w][threadIdx.x];
        parts[(((int64_t)c * m + i) * pj.n + p) * tstride + threadIdx.x] = v;
    }
    __syncthreads();
}

// The shrink, a CTA a row: grid (rows, projections, chunks of KCHUNK
// columns), RP the launch's max rank rounded up to 8, 16, 32 or 64.
template <int RP>
__global__ void __launch_bounds__(STHREADS) lora_dev_shrink_kernel(float *parts, float *rms, int tstride,
                                                                   const bf16 *x, int64_t ldx, int64_t in, int64_t m,
                                                                   const bf16 *nw, float eps, const int32_t *rows,
                                                                   const Proj pj) {
    __shared__ float red[STHREADS / 32][PG_CUDA_LORA_MAX_RANK + 1];
    const int64_t i = blockIdx.x;
    const int p = blockIdx.y, c = blockIdx.z;
    // Before the PDL wait, only what no kernel of the step writes (the rows'
    // slots and the tables, uploaded before it; the adapters): this CTA's
    // chunk of A goes to the L2 while the kernel before (the base product)
    // still runs.
    const int s = rows[i];
    const DevSlot e = s >= 0 ? pj.tab[p][s] : DevSlot{};
    prefetch_a(e, tstride, in, c);
    pg_pdl_wait();
    pg_pdl_trigger();
    if (s >= 0) shrink_row<RP>(parts, rms, tstride, x, ldx, in, m, nw, eps, pj, i, e, p, c, red);
}

// The shrink over tiles (PAGED_CUDA_LORA_DEV_TILES=1): grid (tiles of T
// consecutive rows, projections, chunks), T = 64 / RP (8 rows at rank 8,
// 4 at 16, 2 at 32, 1 at 64: T x RP accumulators a thread). When the
// tile's rows with an adapter all name one slot (a prefill chunk's rows
// do), each thread loads its piece of A once for all T rows and keeps T x
// RP sums in registers; each (row, rank) sum takes the same FMAs in the
// same order as shrink_row's, and the block reduces them the same way, so
// a row's bits are those of a CTA a row. A tile of mixed slots runs its
// rows one after another (shrink_row).
template <int RP>
__global__ void __launch_bounds__(STHREADS) lora_dev_shrink_tiles_kernel(float *parts, float *rms, int tstride,
                                                                         const bf16 *x, int64_t ldx, int64_t in,
                                                                         int64_t m, const bf16 *nw, float eps,
                                                                         const int32_t *rows, const Proj pj) {
    constexpr int T = 64 / RP;
    constexpr int WARPS = STHREADS / 32;
    __shared__ float red[WARPS][PG_CUDA_LORA_MAX_RANK + 1];
    const int64_t i0 = (int64_t)blockIdx.x * T;
    const int p = blockIdx.y, c = blockIdx.z;
    int sl[T], s0 = -1;
    bool uniform = true;
#pragma unroll
    for (int t = 0; t < T; t++) {
        sl[t] = i0 + t < m ? rows[i0 + t] : -1;
        if (sl[t] >= 0) {
            if (s0 < 0) s0 = sl[t];
            uniform = uniform && sl[t] == s0;
        }
    }
    const DevSlot e0 = s0 >= 0 ? pj.tab[p][s0] : DevSlot{};
    prefetch_a(e0, tstride, in, c);
    pg_pdl_wait();
    pg_pdl_trigger();
    if (s0 < 0) return;
    const int64_t k0 = (int64_t)c * KCHUNK, k1 = k0 + KCHUNK < in ? k0 + KCHUNK : in;
    const bf16 *a = (const bf16 *)e0.a;
    bool vec = (in & 7) == 0 && (ldx & 7) == 0 &&
               ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(nw) | reinterpret_cast<uintptr_t>(a)) &
                15) == 0;
    if (!uniform || !vec) {
        for (int t = 0; t < T; t++)
            if (sl[t] >= 0)
                shrink_row<RP>(parts, rms, tstride, x, ldx, in, m, nw, eps, pj, i0 + t, pj.tab[p][sl[t]], p, c, red);
        return;
    }
    if (nw && p == 0 && c == 0)
        for (int t = 0; t < T; t++)
            if (sl[t] >= 0) row_rms(rms, i0 + t, x + (i0 + t) * ldx, in, eps, true, red);
    if (!a) return;
    const int rank = e0.rank < tstride ? e0.rank : tstride;
    float acc[T][RP];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < RP; r++) acc[t][r] = 0.f;
    for (int64_t k = k0 + (int64_t)threadIdx.x * 8; k < k1; k += STHREADS * 8) {
        float xf[T][8];
        float wf[8];
        if (nw) pg_unpack8(*reinterpret_cast<const uint4 *>(nw + k), wf);
#pragma unroll
        for (int t = 0; t < T; t++) {
            if (sl[t] >= 0) {
                pg_unpack8(*reinterpret_cast<const uint4 *>(x + (i0 + t) * ldx + k), xf[t]);
                if (nw) {
#pragma unroll
                    for (int q = 0; q < 8; q++) xf[t][q] *= wf[q];
                }
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++) xf[t][q] = 0.f;
            }
        }
#pragma unroll
        for (int r = 0; r < RP; r++)
            if (r < rank) {
                float af[8];
                pg_unpack8(*reinterpret_cast<const uint4 *>(a + (int64_t)r * in + k), af);
#pragma unroll
                for (int t = 0; t < T; t++)
#pragma unroll
                    for (int q = 0; q < 8; q++) acc[t][r] = fmaf(xf[t][q], af[q], acc[t][r]);
            }
    }
    // The block's sums as shrink_row's: each warp's by shuffles, then the
    // warps' in order; (t, r) at t * RP + r (T * RP = 64 fits red's row).
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < RP; r++)
            if (r < rank) {
                const float v = warp_sum(acc[t][r]);
                if (lane == 0) red[warp][t * RP + r] = v;
            }
    __syncthreads();
    const int q = threadIdx.x, t = q / RP, r = q % RP;
    if (q < T * RP && r < rank && sl[t] >= 0) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) v += red[w][q];
        parts[(((int64_t)c * m + i0 + t) * pj.n + p) * tstride + r] = v;
    }
}

// t[i][p] for every projection p of row i into ts: the chunks' parts
// summed in order, times the row's inverse RMS with a norm (the block's
// threads together; es: the row's entries).
__device__ __forceinline__ void expand_t(float (*ts)[PG_CUDA_LORA_MAX_RANK], const DevSlot *es, const float *parts,
                                         const float *rms, int chunks, int64_t m, int tstride, int64_t i,
                                         const Proj &pj) {
    const int64_t cs = m * pj.n * tstride; // one chunk's stride
    for (int q = threadIdx.x; q < pj.n * tstride; q += THREADS) {
        const int pq = q / tstride, r = q % tstride;
        const int rank = es[pq].rank < tstride ? es[pq].rank : tstride;
        float v = 0.f;
        if (es[pq].a && r < rank) {
            // The chunks' parts in order; four loads in flight at a time.
            const float *pp = parts + (i * pj.n + pq) * tstride + r;
            int c = 0;
            for (; c + 4 <= chunks; c += 4) {
                const float v0 = pp[c * cs], v1 = pp[(c + 1) * cs], v2 = pp[(c + 2) * cs], v3 = pp[(c + 3) * cs];
                v += v0;
                v += v1;
                v += v2;
                v += v3;
            }
            for (; c < chunks; c++) v += pp[c * cs];
            if (rms) v *= rms[i];
        }
        ts[pq][r] = v;
    }
}

// out[i][j] = bf16(out[i][j] + e.scale * tp . br) (br: column j's row of B).
__device__ __forceinline__ void expand_col(bf16 *o, const DevSlot &e, const bf16 *br, const float *tp, int tstride) {
    const int rank = e.rank < tstride ? e.rank : tstride;
    float acc = 0.f;
    if ((rank & 7) == 0 && (reinterpret_cast<uintptr_t>(br) & 15) == 0) {
        for (int r = 0; r < rank; r += 8) {
            float bf[8];
            pg_unpack8(*reinterpret_cast<const uint4 *>(br + r), bf);
#pragma unroll
            for (int q = 0; q < 8; q++) acc = fmaf(tp[r + q], bf[q], acc);
        }
    } else {
        for (int r = 0; r < rank; r++) acc = fmaf(tp[r], __bfloat162float(br[r]), acc);
    }
    *o = __float2bfloat16(__bfloat162float(*o) + e.scale * acc);
}

// The expand, a CTA a row: grid (rows, columns / THREADS) over the
// projections' columns side by side; out[i][j] += scale_p * t[i][p] .
// b_p[j - c0_p] for the column j of each thread, p its projection.
__global__ void __launch_bounds__(THREADS) lora_dev_expand_kernel(bf16 *out, int64_t ldo, const float *parts,
                                                                  const float *rms, int chunks, int64_t m,
                                                                  int tstride, const int32_t *rows, const Proj pj) {
    __shared__ float ts[NPROJ][PG_CUDA_LORA_MAX_RANK];
    __shared__ DevSlot es[NPROJ];
    const int64_t i = blockIdx.x;
    // Before the PDL wait, as in the shrink: the slots, the tables and this
    // thread's row of B (to the L2) while the shrink runs.
    const int s = rows[i];
    if (threadIdx.x < pj.n) es[threadIdx.x] = s >= 0 ? pj.tab[threadIdx.x][s] : DevSlot{};
    __syncthreads();
    const int64_t j = (int64_t)blockIdx.y * THREADS + threadIdx.x;
    int p = 0;
    while (p + 1 < pj.n && j >= pj.c0[p + 1]) p++;
    const DevSlot e = es[p];
    const bool mine = s >= 0 && j < pj.c0[pj.n] && e.a;
    const bf16 *br = mine ? (const bf16 *)e.b + (j - pj.c0[p]) * e.rank : nullptr;
    if (br && ((e.rank & 7) | (reinterpret_cast<uintptr_t>(br) & 15)) == 0) l2_prefetch(br, (uint32_t)e.rank * 2);
    pg_pdl_wait();
    pg_pdl_trigger();
    if (s < 0) return;
    expand_t(ts, es, parts, rms, chunks, m, tstride, i, pj);
    __syncthreads();
    if (mine) expand_col(out + i * ldo + j, e, br, ts[p], tstride);
}

// The expand over tiles (PAGED_CUDA_LORA_DEV_TILES=1): grid (tiles of
// ETILE consecutive rows, columns / THREADS). The tile's t, every row's
// and projection's, in one pass into shared memory, then each thread runs
// down the tile's rows for its column (expand_col, the arithmetic of a CTA
// a row); its row of B stays in the L1 while the rows share an adapter.
constexpr int ETILE = 16;
__global__ void __launch_bounds__(THREADS) lora_dev_expand_tiles_kernel(bf16 *out, int64_t ldo, const float *parts,
                                                                        const float *rms, int chunks, int64_t m,
                                                                        int tstride, const int32_t *rows,
                                                                        const Proj pj) {
    __shared__ float ts[ETILE][NPROJ][PG_CUDA_LORA_MAX_RANK];
    __shared__ DevSlot es[ETILE][NPROJ];
    __shared__ int sl[ETILE];
    const int64_t i0 = (int64_t)blockIdx.x * ETILE;
    const int nt = (int)(i0 + ETILE < m ? ETILE : m - i0);
    const int64_t j = (int64_t)blockIdx.y * THREADS + threadIdx.x;
    int p = 0;
    while (p + 1 < pj.n && j >= pj.c0[p + 1]) p++;
    const bool incols = j < pj.c0[pj.n];
    if (threadIdx.x < ETILE) sl[threadIdx.x] = (int)threadIdx.x < nt ? rows[i0 + threadIdx.x] : -1;
    __syncthreads();
    for (int q = threadIdx.x; q < ETILE * pj.n; q += THREADS) {
        const int t = q / pj.n, pq = q % pj.n;
        es[t][pq] = sl[t] >= 0 ? pj.tab[pq][sl[t]] : DevSlot{};
    }
    __syncthreads();
    {
        // The first row's row of B for this thread (to the L2), as above.
        const DevSlot e = incols ? es[0][p] : DevSlot{};
        const bf16 *br = e.a ? (const bf16 *)e.b + (j - pj.c0[p]) * e.rank : nullptr;
        if (br && ((e.rank & 7) | (reinterpret_cast<uintptr_t>(br) & 15)) == 0) l2_prefetch(br, (uint32_t)e.rank * 2);
    }
    pg_pdl_wait();
    pg_pdl_trigger();
    const int64_t cs = m * pj.n * tstride; // one chunk's stride
    for (int q = threadIdx.x; q < nt * pj.n * tstride; q += THREADS) {
        const int t = q / (pj.n * tstride), pq = (q / tstride) % pj.n, r = q % tstride;
        const DevSlot &e = es[t][pq];
        const int rank = e.rank < tstride ? e.rank : tstride;
        float v = 0.f;
        if (sl[t] >= 0 && e.a && r < rank) {
            // The chunks' parts in order, as expand_t.
            const float *pp = parts + ((i0 + t) * pj.n + pq) * tstride + r;
            int c = 0;
            for (; c + 4 <= chunks; c += 4) {
                const float v0 = pp[c * cs], v1 = pp[(c + 1) * cs], v2 = pp[(c + 2) * cs], v3 = pp[(c + 3) * cs];
                v += v0;
                v += v1;
                v += v2;
                v += v3;
            }
            for (; c < chunks; c++) v += pp[c * cs];
            if (rms) v *= rms[i0 + t];
        }
        ts[t][pq][r] = v;
    }
    __syncthreads();
    if (!incols) return;
    for (int t = 0; t < nt; t++) {
        const DevSlot &e = es[t][p];
        if (sl[t] >= 0 && e.a)
            expand_col(out + (i0 + t) * ldo + j, e, (const bf16 *)e.b + (j - pj.c0[p]) * e.rank, ts[t][p], tstride);
    }
}

// Whether the tiled kernels run (PAGED_CUDA_LORA_DEV_TILES=1, read once;
// graph-safe: then m alone decides): past 8 rows. Up to 8 rows
// (single-stream and small decode buckets) a CTA a row, as without:
// those steps are launch-bound and want every SM.
bool use_tiles(int64_t m) {
    static int tiles = -1;
    if (tiles < 0) {
        const char *e = getenv("PAGED_CUDA_LORA_DEV_TILES");
        tiles = e && atoi(e) != 0;
    }
    return tiles && m > 8;
}

} // namespace

template <int RP>
cudaError_t shrink(float *parts, float *rms, int tstride, const bf16 *x, int64_t ldx, int64_t in, const bf16 *nw, float eps,
            const int32_t *rows, const Proj &pj, int64_t m, int chunks, cudaStream_t st) {
    if (!use_tiles(m))
        return pg_launch_pdl(lora_dev_shrink_kernel<RP>, dim3((unsigned)m, (unsigned)pj.n, (unsigned)chunks),
                             dim3(STHREADS), 0, st, parts, rms, tstride, x, ldx, in, m, nw, eps, rows, pj);
    return pg_launch_pdl(lora_dev_shrink_tiles_kernel<RP>, dim3((unsigned)pg_ceil_div(m, 64 / RP), (unsigned)pj.n,
                         (unsigned)chunks), dim3(STHREADS), 0, st, parts, rms, tstride, x, ldx, in, m, nw, eps, rows,
                         pj);
}

int pg_cuda_lora_apply_dev(void *out, int64_t ldo, const void *x, int64_t ldx, int64_t m, int64_t in,
                           const void *norm_w, float eps, const int64_t *cols, int32_t n_proj,
                           const int32_t *row_slot_dev, const pg_cuda_lora_dev_slot *const *tables, int32_t max_rank,
                           void *ws, size_t ws_bytes, void *stream) {
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
    cudaError_t le;
    if (max_rank <= 8)
        le = shrink<8>(parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, chunks, st);
    else if (max_rank <= 16)
        le = shrink<16>(parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, chunks, st);
    else if (max_rank <= 32)
        le = shrink<32>(parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, chunks, st);
    else
        le = shrink<64>(parts, rms, max_rank, xb, ldx, in, nw, eps, row_slot_dev, pj, m, chunks, st);
    PG_CUDA_TRY(le);
    const unsigned col_blocks = (unsigned)pg_ceil_div(total, THREADS);
    const float *rms_or_null = nw ? rms : nullptr;
    if (!use_tiles(m))
        PG_CUDA_TRY(pg_launch_pdl(lora_dev_expand_kernel, dim3((unsigned)m, col_blocks), dim3(THREADS), 0, st,
                                  (bf16 *)out, ldo, (const float *)parts, rms_or_null, chunks, m, (int)max_rank,
                                  row_slot_dev, pj));
    else
        PG_CUDA_TRY(pg_launch_pdl(lora_dev_expand_tiles_kernel, dim3((unsigned)pg_ceil_div(m, ETILE), col_blocks),
                                  dim3(THREADS), 0, st, (bf16 *)out, ldo, (const float *)parts, rms_or_null, chunks,
                                  m, (int)max_rank, row_slot_dev, pj));
    return 0;
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
