// kernels/cuda/lora_tiles.cu - the graph-safe LoRA op over tiles of rows
// of one adapter (cuda_ops.h pg_cuda_lora_apply_dev from
// pg_cuda_lora_dev_tile_rows() rows; docs/lora.md "Tiles of one adapter on
// the tensor cores").
//
// Why: lora_graph.cu runs a CTA a row, so a step of 92 decode rows over 8
// adapters reads each adapter's pairs (2.6 MB a layer at rank 16 on the
// 8B shape) about 11 times, once a row. Here the rows are grouped by slot
// into tiles of up to 16, and a tile's rows share every load of A and B:
//
//   route   every CTA of both kernels finds its tile from the rows' slots
//           alone (device memory, uploaded with the step): a histogram of
//           the slots, the tiles of slot s (ceil(count / 16)) in slot
//           order, and tile g of slot s as the rows of s ranked 16 g ..
//           16 g + 15 in row order. The grid has ceil(m / 16) + min(m,
//           n_slots) tiles, enough for any mix; CTAs past the last tile
//           leave. Done before the PDL wait, so it runs under the base
//           product's tail.
//   shrink  grid (tiles, projections, chunks of KCHUNK columns), 8 warps a
//           CTA, each over 128 of the chunk's columns: mma.sync m16n8k16
//           (bf16 in, f32 accumulate), the tile's 16 rows times the
//           adapter's rank rows of A, both read straight from memory in
//           16-byte pieces; the k order inside a 32-column window is
//           permuted alike for both operands (thread q of a group holds
//           columns 8q .. 8q+7: the first four in the first step, the rest
//           in the second), which a dot product does not see. With a norm
//           weight the rows are x * w in f32, split into bf16 hi + lo
//           (two products: the rounding of x * w costs 2^-17, not 2^-9).
//           The warps' sums go through shared memory, added in warp
//           order, to parts[chunk][row][p][r]: lora_graph.cu's layout. CTA
//           (tile, 0, 0) also takes the tile rows' inverse RMS.
//   expand  grid (tiles, columns / (256 * CW)): each thread's rows of B in
//           registers once for the tile, the tile's t (chunks summed in
//           order) in shared memory, then out for each of its rows.
//
// Everything before the stores runs before the PDL wait, as in
// lora_graph.cu and under the same contract (the kernel right before the
// shrink does not write x). A row's values depend only on the row and its
// adapter: each mma output is its own row's dot product, and the tile's
// other rows (or zeros) do not enter it, so the bits are the same alone
// and in any batch at this shape; they differ from lora_graph.cu's per-row
// shape by the order of the f32 sums.
#include "kernels/cuda/lora_int.cuh"

namespace {

constexpr int TR = 16;                          // rows a tile (mma's m)
constexpr int SWARPS = 8;                       // the shrink's warps
constexpr int STHREADS = SWARPS * 32;           // 256
constexpr int ETHREADS = 256;                   // the expand's
constexpr int KCHUNK = PG_CUDA_LORA_DEV_KCHUNK; // 1024
constexpr int WCOLS = KCHUNK / SWARPS;          // 128 columns a warp
constexpr int SLOTS = PG_CUDA_LORA_MAX_SLOTS;   // 64: two a lane in the tile scan
constexpr int NPROJ = PG_CUDA_LORA_MAX_PROJ;
static_assert(SLOTS == 64 && WCOLS % 32 == 0, "the route's scan and the shrink's windows");

using DevSlot = pg_cuda_lora_dev_slot;

struct Route {
    int hist[SLOTS];
    int trow[TR];
    int meta[2];
    int wcnt[32];
};

// This CTA's tile t: returns its row count (0: no such tile; then slot is
// -1) and leaves the rows in rt.trow, in row order. Every thread of the
// block calls it (NT of them); ends with the block synchronised.
template <int NT>
__device__ __forceinline__ int route_tile(Route &rt, const int32_t *rows, int64_t m, int n_slots, int t, int &slot) {
    static_assert(NT % 32 == 0 && NT <= 1024, "whole warps");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int s = tid; s < SLOTS; s += NT) rt.hist[s] = 0;
    if (tid == 0) rt.meta[0] = -1, rt.meta[1] = 0;
    __syncthreads();
    for (int64_t i = tid; i < m; i += NT) {
        const int s = rows[i];
        if (s >= 0 && s < n_slots) atomicAdd(&rt.hist[s], 1);
    }
    __syncthreads();
    if (warp == 0) { // tiles of slots 2 lane and 2 lane + 1, scanned
        const int n0 = (rt.hist[2 * lane] + TR - 1) / TR, n1 = (rt.hist[2 * lane + 1] + TR - 1) / TR;
        int inc = n0 + n1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += v;
        }
        const int ex = inc - n0 - n1;
        if (t >= ex && t < ex + n0) rt.meta[0] = 2 * lane, rt.meta[1] = t - ex;
        else if (t >= ex + n0 && t < inc) rt.meta[0] = 2 * lane + 1, rt.meta[1] = t - ex - n0;
    }
    __syncthreads();
    const int s = rt.meta[0];
    slot = s;
    if (s < 0) return 0;
    const int lo = rt.meta[1] * TR, cnt = min(TR, rt.hist[s] - lo);
    // The rows of s ranked lo .. lo + cnt - 1: a stable compaction, NT rows
    // a round (base, the rank of the round's first row, is the block's).
    int base = 0;
    for (int64_t i0 = 0; i0 < m && base < lo + cnt; i0 += NT) {
        const int64_t i = i0 + tid;
        const bool f = i < m && rows[i] == s;
        const unsigned bal = __ballot_sync(0xffffffffu, f);
        if (lane == 0) rt.wcnt[warp] = __popc(bal);
        __syncthreads();
        int before = base, tot = base;
        for (int w = 0; w < NT / 32; w++) {
            const int c = rt.wcnt[w];
            tot += c;
            if (w < warp) before += c;
        }
        before += __popc(bal & ((1u << lane) - 1u));
        if (f && before >= lo && before < lo + cnt) rt.trow[before - lo] = (int)i;
        base = tot;
        __syncthreads();
    }
    return cnt;
}

// 8 bf16 from p: one 16-byte load where vec and all 8 are in range, else
// the `valid` first one at a time and zeros after them.
__device__ __forceinline__ uint4 ld8(const bf16 *p, int valid, bool vec) {
    if (vec && valid >= 8) return *reinterpret_cast<const uint4 *>(p);
    unsigned short h[8];
#pragma unroll
    for (int u = 0; u < 8; u++) h[u] = u < valid ? reinterpret_cast<const unsigned short *>(p)[u] : (unsigned short)0;
    return make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16, h[4] | (unsigned)h[5] << 16,
                      h[6] | (unsigned)h[7] << 16);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
}

// x * w in f32 for 8 columns, as bf16 hi and lo = bf16(v - hi).
__device__ __forceinline__ void split8(const uint4 &xv, const uint4 &wv, uint4 &hi, uint4 &lo) {
    float xf[8], wf[8];
    pg_unpack8(xv, xf);
    pg_unpack8(wv, wf);
    uint32_t h[4], l[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const float v0 = xf[2 * u] * wf[2 * u], v1 = xf[2 * u + 1] * wf[2 * u + 1];
        h[u] = pack_bf16(v0, v1);
        const __nv_bfloat162 hb = *reinterpret_cast<const __nv_bfloat162 *>(&h[u]);
        l[u] = pack_bf16(v0 - __low2float(hb), v1 - __high2float(hb));
    }
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    lo = make_uint4(l[0], l[1], l[2], l[3]);
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 32-column window: rows g and g + 8 (xg, xg8: columns 8q .. 8q + 7)
// times every fragment's rank rows (bf[f]: row f * 8 + g, the same columns),
// in two steps of 16 columns (the permuted order in the file's comment).
template <int NF>
__device__ __forceinline__ void window_mma(float (&acc)[NF][4], const uint4 &xg, const uint4 &xg8,
                                           const uint4 (&bf)[NF]) {
#pragma unroll
    for (int f = 0; f < NF; f++) {
        mma16816(acc[f], xg.x, xg8.x, xg.y, xg8.y, bf[f].x, bf[f].y);
        mma16816(acc[f], xg.z, xg8.z, xg.w, xg8.w, bf[f].z, bf[f].w);
    }
}

// One warp's 128 columns [kw, kw + 128) of the tile's rows g and g + 8 (x0,
// x8; zeroed where !ok0 / !ok8) times the rank rows of A, into acc, four
// 32-column windows. FAST: every load 16 bytes and in range (the caller
// checked, for the whole warp), so all of them can be in flight at once;
// else ld8's checked loads, zeros past k1.
template <int NF, bool FAST>
__device__ __forceinline__ void shrink_warp(float (&acc)[NF][4], const bf16 *x0, const bf16 *x8, bool ok0, bool ok8,
                                            const bf16 *nw, const bf16 *a, int rank, int64_t in, int64_t kw,
                                            int64_t k1, int g, int q) {
    constexpr int NW = WCOLS / 32;
    // Up to rank 16 the four windows' loads (20 pieces a thread) are all
    // issued before the first product; past it, a window at a time.
    constexpr int GROUP = NF <= 2 ? NW : 1;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int w0 = 0; w0 < NW; w0 += GROUP) {
        uint4 xg[GROUP], xg8[GROUP], wv[GROUP], bf[GROUP][NF];
#pragma unroll
        for (int wi = 0; wi < GROUP; wi++) {
            const int64_t k = kw + (w0 + wi) * 32 + q * 8;
            const int valid = FAST ? 8 : (k1 - k >= 8 ? 8 : (k1 > k ? (int)(k1 - k) : 0));
            xg[wi] = ld8(x0 + k, valid, FAST);
            xg8[wi] = ld8(x8 + k, valid, FAST);
            if (!ok0) xg[wi] = zero;
            if (!ok8) xg8[wi] = zero;
#pragma unroll
            for (int f = 0; f < NF; f++) {
                const int r = f * 8 + g;
                bf[wi][f] = ld8(a + (int64_t)(r < rank ? r : 0) * in + k, valid, FAST);
                if (r >= rank) bf[wi][f] = zero;
            }
            wv[wi] = nw ? ld8(nw + k, valid, FAST) : zero;
        }
#pragma unroll
        for (int wi = 0; wi < GROUP; wi++) {
            if (nw) {
                uint4 h0, l0, h8, l8;
                split8(xg[wi], wv[wi], h0, l0);
                split8(xg8[wi], wv[wi], h8, l8);
                window_mma<NF>(acc, h0, h8, bf[wi]);
                window_mma<NF>(acc, l0, l8, bf[wi]);
            } else {
                window_mma<NF>(acc, xg[wi], xg8[wi], bf[wi]);
            }
        }
    }
}

// The shrink: grid (tiles, projections, chunks), RP the launch's max rank
// rounded up to 8, 16, 32 or 64. parts[((c * m + i) * n + p) * tstride +
// r] for the tile's rows i and r < min(rank, tstride); with a norm, CTAs
// (t, 0, 0) write rms[i] for the tile's rows.
template <int RP>
__global__ void __launch_bounds__(STHREADS) lora_tile_shrink_kernel(float *parts, float *rms, int tstride,
                                                                    const bf16 *x, int64_t ldx, int64_t in,
                                                                    int64_t m, const bf16 *nw, float eps,
                                                                    const int32_t *rows, int n_slots,
                                                                    const pg_lora_proj pj) {
    constexpr int NF = RP / 8;                  // n8 fragments of the rank
    constexpr int NV = TR * RP / STHREADS; // sums a thread adds up and stores: 0 at rank 8, where
    constexpr int NVS = NV > 0 ? NV : 1;    // the first 128 threads store one each
    __shared__ Route rt;
    __shared__ float red[SWARPS][TR][RP];
    const int p = blockIdx.y, c = blockIdx.z;
    int s;
    const int cnt = route_tile<STHREADS>(rt, rows, m, n_slots, blockIdx.x, s);
    const DevSlot e = s >= 0 ? pj.tab[p][s] : DevSlot{};
    const bool with_t = cnt > 0 && e.a && e.rank > 0, with_rms = cnt > 0 && nw && p == 0 && c == 0;
    const int rank = with_t ? (e.rank < tstride ? e.rank : tstride) : 0;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    // The tile rows' inverse RMS: warp w takes rows w and w + 8.
    float inv[2] = {0.f, 0.f};
    if (with_rms) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int rq = warp + h * SWARPS;
            if (rq >= cnt) continue;
            const bf16 *xr = x + (int64_t)rt.trow[rq] * ldx;
            const bool vec = (in & 7) == 0 && (reinterpret_cast<uintptr_t>(xr) & 15) == 0;
            float ss = 0.f;
            for (int64_t k = (int64_t)lane * 8; k < in; k += 256) {
                float xf[8];
                pg_unpack8(ld8(xr + k, in - k < 8 ? (int)(in - k) : 8, vec), xf);
#pragma unroll
                for (int u = 0; u < 8; u++) ss = fmaf(xf[u], xf[u], ss);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            inv[h] = rsqrtf(ss / (float)in + eps);
        }
    }
    float val[NVS];
#pragma unroll
    for (int v = 0; v < NVS; v++) val[v] = 0.f;
    if (with_t) { // the whole block alike
        const bf16 *a = (const bf16 *)e.a;
        const int64_t k1 = (int64_t)(c + 1) * KCHUNK < in ? (int64_t)(c + 1) * KCHUNK : in;
        const int64_t kw = (int64_t)c * KCHUNK + (int64_t)warp * WCOLS;
        // Rows past the tile's read its first row and are zeroed (their
        // sums are never stored), so the fast path's loads are unconditional.
        const bool ok0 = g < cnt, ok8 = g + 8 < cnt;
        const bf16 *x0 = x + (int64_t)rt.trow[ok0 ? g : 0] * ldx, *x8 = x + (int64_t)rt.trow[ok8 ? g + 8 : 0] * ldx;
        float acc[NF][4];
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int u = 0; u < 4; u++) acc[f][u] = 0.f;
        // The fast path (the warp's 128 columns in range, every row and
        // piece 16-byte aligned) must be the whole warp's: mma.sync is.
        const bool fast = __all_sync(0xffffffffu, (in & 7) == 0 && k1 - kw >= WCOLS &&
                                                      ((reinterpret_cast<uintptr_t>(x0) | reinterpret_cast<uintptr_t>(x8) |
                                                        reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(nw)) &
                                                       15) == 0);
        if (fast)
            shrink_warp<NF, true>(acc, x0, x8, ok0, ok8, nw, a, rank, in, kw, k1, g, q);
        else
            shrink_warp<NF, false>(acc, x0, x8, ok0, ok8, nw, a, rank, in, kw, k1, g, q);
#pragma unroll
        for (int f = 0; f < NF; f++) {
            red[warp][g][f * 8 + 2 * q] = acc[f][0];
            red[warp][g][f * 8 + 2 * q + 1] = acc[f][1];
            red[warp][g + 8][f * 8 + 2 * q] = acc[f][2];
            red[warp][g + 8][f * 8 + 2 * q + 1] = acc[f][3];
        }
        __syncthreads();
#pragma unroll
        for (int v = 0; v < NVS; v++) {
            const int idx = v * STHREADS + tid;
            if (idx < TR * RP) {
                float sum = 0.f;
#pragma unroll
                for (int w = 0; w < SWARPS; w++) sum += red[w][idx / RP][idx % RP];
                val[v] = sum;
            }
        }
    }
    pg_pdl_wait();
    pg_pdl_trigger();
    if (with_rms && lane == 0) {
        if (warp < cnt) rms[rt.trow[warp]] = inv[0];
        if (warp + SWARPS < cnt) rms[rt.trow[warp + SWARPS]] = inv[1];
    }
    if (!with_t) return;
#pragma unroll
    for (int v = 0; v < NVS; v++) {
        const int idx = v * STHREADS + tid, rq = idx / RP, r = idx % RP;
        if (idx < TR * RP && rq < cnt && r < rank)
            parts[(((int64_t)c * m + rt.trow[rq]) * pj.n + p) * tstride + r] = val[v];
    }
}

// The expand: grid (tiles, columns / (ETHREADS * CW)) over the projections'
// columns side by side; for each row i of the tile and each of the
// thread's CW columns j (projection p): out[i][j] = bf16(out[i][j] +
// scale_p * t[i][p] . b_p[j - c0_p]), the FMAs over the ranks in order.
// Before the PDL wait: the route, the entries, the thread's rows of B and
// its elements of out (written by the base product two kernels back,
// complete once this grid starts: the shrink triggers after its wait).
template <int RP, int CW>
__global__ void __launch_bounds__(ETHREADS) lora_tile_expand_kernel(bf16 *out, int64_t ldo, const float *parts,
                                                                    const float *rms, int chunks, int64_t m,
                                                                    int tstride, const int32_t *rows, int n_slots,
                                                                    const pg_lora_proj pj) {
    constexpr int NB = RP / 8;
    __shared__ Route rt;
    __shared__ float ts[TR][NPROJ][RP];
    __shared__ DevSlot es[NPROJ];
    int s;
    const int cnt = route_tile<ETHREADS>(rt, rows, m, n_slots, blockIdx.x, s);
    if (threadIdx.x < pj.n) es[threadIdx.x] = s >= 0 ? pj.tab[threadIdx.x][s] : DevSlot{};
    __syncthreads();
    const int64_t j = ((int64_t)blockIdx.y * ETHREADS + threadIdx.x) * CW;
    int p = 0;
    while (p + 1 < pj.n && j >= pj.c0[p + 1]) p++;
    const DevSlot e = es[p];
    const bool mine = cnt > 0 && j < pj.c0[pj.n] && e.a;
    const bf16 *br = mine ? (const bf16 *)e.b + (j - pj.c0[p]) * e.rank : nullptr;
    const int rank = mine ? (e.rank < tstride ? e.rank : tstride) : 0;
    const bool bvec =
        mine && (rank & 7) == 0 && (CW == 1 || (e.rank & 7) == 0) && (reinterpret_cast<uintptr_t>(br) & 15) == 0;
    uint4 bv[CW][NB];
    float ov[TR][CW];
#pragma unroll
    for (int rq = 0; rq < TR; rq++)
#pragma unroll
        for (int u = 0; u < CW; u++) ov[rq][u] = 0.f;
    if (mine) {
        // Rows past the tile's load its last row again (unused), so the
        // loads carry no condition and are all in flight at once.
#pragma unroll
        for (int rq = 0; rq < TR; rq++) {
            const bf16 *o = out + (int64_t)rt.trow[rq < cnt ? rq : cnt - 1] * ldo + j;
            if (CW == 1) {
                ov[rq][0] = __bfloat162float(*o);
            } else {
                const float2 o2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(o));
                ov[rq][0] = o2.x;
                ov[rq][CW - 1] = o2.y;
            }
        }
    }
    if (bvec)
#pragma unroll
        for (int u = 0; u < CW; u++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (b * 8 < rank) bv[u][b] = *reinterpret_cast<const uint4 *>(br + u * e.rank + b * 8);
    pg_pdl_wait();
    pg_pdl_trigger();
    if (cnt == 0) return;
    for (int idx = threadIdx.x; idx < cnt * pj.n * tstride; idx += ETHREADS) {
        const int rq = idx / (pj.n * tstride), pq = idx / tstride % pj.n, r = idx % tstride;
        const int rk = es[pq].rank < tstride ? es[pq].rank : tstride;
        ts[rq][pq][r] = es[pq].a && r < rk
                            ? pg_lora_t_value(parts, rms, chunks, m, tstride, pj.n, rt.trow[rq], pq, r)
                            : 0.f;
    }
    __syncthreads();
    if (!mine) return;
#pragma unroll
    for (int rq = 0; rq < TR; rq++) {
        if (rq >= cnt) break;
        pg_lora_expand_store<CW, NB>(out + (int64_t)rt.trow[rq] * ldo + j, ts[rq][p], bv, br, e.rank, rank, bvec,
                                     e.scale, ov[rq]);
    }
}

template <int RP>
cudaError_t launch(bf16 *out, int64_t ldo, float *parts, float *rms, int tstride, const bf16 *x, int64_t ldx,
                   int64_t in, const bf16 *nw, float eps, const int32_t *rows, const pg_lora_proj &pj, int64_t m,
                   int n_slots, int chunks, bool even, cudaStream_t st) {
    const int64_t tiles = (m + TR - 1) / TR + (m < n_slots ? m : n_slots);
    cudaError_t e = pg_launch_pdl(lora_tile_shrink_kernel<RP>, dim3((unsigned)tiles, (unsigned)pj.n, (unsigned)chunks),
                                  dim3(STHREADS), 0, st, parts, rms, tstride, x, ldx, in, m, nw, eps, rows, n_slots,
                                  pj);
    if (e != cudaSuccess) return e;
    const float *rms_or_null = nw ? rms : nullptr;
    const int64_t total = pj.c0[pj.n];
    if (even)
        return pg_launch_pdl(lora_tile_expand_kernel<RP, 2>, dim3((unsigned)tiles, (unsigned)pg_ceil_div(total, 2 * ETHREADS)),
                             dim3(ETHREADS), 0, st, out, ldo, (const float *)parts, rms_or_null, chunks, m, tstride,
                             rows, n_slots, pj);
    return pg_launch_pdl(lora_tile_expand_kernel<RP, 1>, dim3((unsigned)tiles, (unsigned)pg_ceil_div(total, ETHREADS)),
                         dim3(ETHREADS), 0, st, out, ldo, (const float *)parts, rms_or_null, chunks, m, tstride, rows,
                         n_slots, pj);
}

} // namespace

cudaError_t pg_lora_tiles_launch(bf16 *out, int64_t ldo, float *parts, float *rms, int tstride, const bf16 *x,
                                 int64_t ldx, int64_t in, const bf16 *nw, float eps, const int32_t *rows,
                                 const pg_lora_proj &pj, int64_t m, int n_slots, int chunks, bool even,
                                 cudaStream_t st) {
    if (tstride <= 8)
        return launch<8>(out, ldo, parts, rms, tstride, x, ldx, in, nw, eps, rows, pj, m, n_slots, chunks, even, st);
    if (tstride <= 16)
        return launch<16>(out, ldo, parts, rms, tstride, x, ldx, in, nw, eps, rows, pj, m, n_slots, chunks, even, st);
    if (tstride <= 32)
        return launch<32>(out, ldo, parts, rms, tstride, x, ldx, in, nw, eps, rows, pj, m, n_slots, chunks, even, st);
    return launch<64>(out, ldo, parts, rms, tstride, x, ldx, in, nw, eps, rows, pj, m, n_slots, chunks, even, st);
}
