// kernels/cuda/lora.cu - batched multi-adapter LoRA on the GPU (cuda_ops.h
// pg_cuda_lora_stage / pg_cuda_lora_apply; kernels/backend.h lora_apply;
// docs/lora.md), the CUDA twin of kernels/cpu/lora.c. Two shapes of the
// same arithmetic:
//
//   stage    the rows' slots (host) -> int8 [m] in the workspace, by copy
//            kernels whose parameters carry them (STAGE rows each); one CTA
//            sorts them by slot (int32 [m]) and cuts each slot's rows into
//            tiles of up to TILE rows (the grouped shape's)
//
//   BGMV (the default; Punica's shape), one CTA per row:
//     shrink  t[i][0:rank) = x[i] . a_s^T, a warp per rank index (8 warps
//             stride the ranks), f32, 16-byte loads where aligned
//     expand  out[i][j] = bf16(out[i][j] + scale_s * t[i] . b_s[j]), CTAs
//             of 256 columns per row, t[i] in shared memory
//
//   grouped (PAGED_CUDA_LORA_SGMV=1; Punica's SGMV idea, session 23):
//     shrink  grid (tiles, k splits of KSPLIT): a tile's x rows and its
//             adapter's A rows through shared memory BK columns at a time,
//             each thread summing rows x ranks in f32 into the parts
//             [split][m][rank]
//     expand  grid (tiles, columns / 256): the parts summed in split order
//             into t (shared), each thread's B row in registers, bf16(out
//             + scale * t . b) for the tile's rows
//
// The grouped shape reads each adapter weight once per tile of up to 32
// rows where BGMV reads it once per row, but as written each shrink CTA
// walks its 2,048 columns in 32 dependent round trips to memory: on an
// H100 it was slower than BGMV at W1 (20.5 against 10.4 ms a token) and
// at served W4 with 8 adapters (2,355 against 2,678 tok/s), so it stays
// behind the flag (docs/lora.md, "Figures"). The grouped shape stages
// once a step (the CUDA backend keeps what it staged last); BGMV stages
// in every call, as before (staging it once a step is written for the
// next device run: bench/results/gpu_session23/callM.sh).
//
// The slot table (device pointers, ranks, scales; at most
// PG_CUDA_LORA_MAX_SLOTS) travels by value as a kernel parameter. Rows with
// slot -1, or whose slot has no `a` for this projection, leave at once:
// they are never written. Every value of a row depends only on that row
// and its slot, summed in a fixed order: the same bits for any batch.
//
// Not graph-safe (the staged slots and the table are values baked into the
// launches): under stream capture the launchers refuse (PG_EUNSUPP). The
// decode graphs take lora_graph.cu's op, whose rows and table live in
// device memory.
#include <limits.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_common.cuh"
extern "C" {
#include "kernels/dtype.h"
}

namespace {

constexpr int THREADS = 256;
constexpr int TILE = PG_CUDA_LORA_TILE_ROWS;
constexpr int KSPLIT = PG_CUDA_LORA_KSPLIT;
constexpr int BK = 64;      // k per shared-memory chunk of the shrink
constexpr int STAGE = 3072; // rows staged per copy kernel (its parameter: 3 KiB, under the 4 KiB limit)
constexpr int ROUTE_THREADS = 1024;
static_assert(KSPLIT % BK == 0, "a split is whole chunks");

struct LoraTable {
    const bf16 *a[PG_CUDA_LORA_MAX_SLOTS];
    const bf16 *b[PG_CUDA_LORA_MAX_SLOTS];
    float scale[PG_CUDA_LORA_MAX_SLOTS];
    int32_t rank[PG_CUDA_LORA_MAX_SLOTS];
};

struct LoraStage {
    int8_t s[STAGE];
};

// One slot's rows [start, start + count) of the sorted order.
struct Tile {
    int32_t start;
    int16_t count, slot;
};
static_assert(sizeof(Tile) == 8, "the planner counts 8 bytes a tile");

size_t up256(size_t v) { return (v + 255) / 256 * 256; }

// The workspace's regions for m rows (cuda_ops.h pg_cuda_lora_stage_size).
struct Layout {
    int8_t *rs;
    int32_t *perm;
    Tile *tiles;
    float *parts;
};
Layout layout_of(void *ws, int64_t m) {
    char *p = (char *)ws;
    Layout l;
    l.rs = (int8_t *)p;
    l.perm = (int32_t *)(p + up256((size_t)m));
    l.tiles = (Tile *)(p + up256((size_t)m) + up256(4 * (size_t)m));
    l.parts = (float *)(p + pg_cuda_lora_stage_size(m));
    return l;
}

__global__ void lora_stage_kernel(int8_t *dst, const LoraStage st, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = st.s[i];
}

// Rows sorted by slot into perm; tiles in slot order, each slot's rows cut
// every TILE. The order of rows inside a slot is whatever the atomics give:
// no value depends on it. One CTA.
__global__ void __launch_bounds__(ROUTE_THREADS) lora_route_kernel(const int8_t *rs, int m, int32_t *perm,
                                                                   Tile *tiles) {
    __shared__ int cnt[PG_CUDA_LORA_MAX_SLOTS], cur[PG_CUDA_LORA_MAX_SLOTS];
    if (threadIdx.x < PG_CUDA_LORA_MAX_SLOTS) cnt[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x)
        if (rs[i] >= 0) atomicAdd(&cnt[rs[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, nt = 0;
        for (int s = 0; s < PG_CUDA_LORA_MAX_SLOTS; s++) {
            cur[s] = off;
            for (int c = 0; c < cnt[s]; c += TILE)
                tiles[nt++] = Tile{off + c, (int16_t)(cnt[s] - c < TILE ? cnt[s] - c : TILE), (int16_t)s};
            off += cnt[s];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x)
        if (rs[i] >= 0) perm[atomicAdd(&cur[rs[i]], 1)] = i;
}

// Loads n <= 8 bf16 from p as f32 into v (zeros past n): one 16-byte load
// where whole and aligned.
__device__ __forceinline__ void load8(const bf16 *p, int n, float v[8]) {
    if (n == 8 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
        pg_unpack8(*reinterpret_cast<const uint4 *>(p), v);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = e < n ? __bfloat162float(p[e]) : 0.0f;
    }
}

// parts[split][p][r] = x[perm[p]][k split] . a_s[r][k split] for the tile's
// rows p and r < rank_s. RP: the ranks rounded up to 8, 16, 32 or 64 (the
// launch's largest); thread (r, g) sums rows g, g + G, ... for rank r.
template <int RP>
__global__ void __launch_bounds__(THREADS) lora_shrink_kernel(float *parts, int rstride, int64_t m, const bf16 *x,
                                                              int64_t ldx, int64_t in, const int32_t *perm,
                                                              const Tile *tiles, const LoraTable tab) {
    constexpr int G = THREADS / RP, NJ = TILE / G;
    static_assert(NJ >= 1 && TILE % G == 0, "tile rows over thread groups");
    __shared__ float xs[TILE][BK + 1];
    __shared__ float as[RP][BK + 1];
    __shared__ const bf16 *xrow[TILE];
    const Tile tl = tiles[blockIdx.x];
    const bf16 *a = tab.a[tl.slot];
    if (!a) return;
    const int rank = tab.rank[tl.slot];
    const int64_t k0 = (int64_t)blockIdx.y * KSPLIT, k1 = k0 + KSPLIT < in ? k0 + KSPLIT : in;
    if (threadIdx.x < TILE) xrow[threadIdx.x] = threadIdx.x < tl.count ? x + perm[tl.start + threadIdx.x] * ldx : nullptr;
    const int r = threadIdx.x % RP, g = threadIdx.x / RP;
    float acc[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[j] = 0.0f;
    __syncthreads();
    for (int64_t kc = k0; kc < k1; kc += BK) {
        const int kn = (int)(k1 - kc < BK ? k1 - kc : BK);
        // x: TILE rows x BK = 256 pieces of 8, one a thread
        {
            const int row = threadIdx.x / (BK / 8), c = (threadIdx.x % (BK / 8)) * 8;
            float v[8];
            if (xrow[row] && c < kn)
                load8(xrow[row] + kc + c, kn - c < 8 ? kn - c : 8, v);
            else
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) xs[row][c + e] = v[e];
        }
        // A: RP rows x BK
        for (int q = threadIdx.x; q < RP * (BK / 8); q += THREADS) {
            const int ar = q / (BK / 8), c = (q % (BK / 8)) * 8;
            float v[8];
            if (ar < rank && c < kn)
                load8(a + (int64_t)ar * in + kc + c, kn - c < 8 ? kn - c : 8, v);
            else
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) as[ar][c + e] = v[e];
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < kn; kk++) {
            const float av = as[r][kk];
#pragma unroll
            for (int j = 0; j < NJ; j++) acc[j] = fmaf(xs[g + G * j][kk], av, acc[j]);
        }
        __syncthreads();
    }
    if (r >= rank) return;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int row = g + G * j;
        if (row < tl.count) parts[((int64_t)blockIdx.y * m + tl.start + row) * rstride + r] = acc[j];
    }
}

// out[perm[p]][j] = bf16(out + scale_s * t[p] . b_s[j]) for the tile's rows
// p and j < out_cols, t[p] the parts summed in split order; one column a
// thread, its B row in registers (zeros past rank_s).
template <int RP>
__global__ void __launch_bounds__(THREADS) lora_expand_kernel(bf16 *out, int64_t ldo, int64_t out_cols,
                                                              const float *parts, int rstride, int64_t m,
                                                              int splits, const int32_t *perm, const Tile *tiles,
                                                              const LoraTable tab) {
    __shared__ float ts[TILE][RP];
    __shared__ int32_t rows[TILE];
    const Tile tl = tiles[blockIdx.x];
    if (!tab.a[tl.slot]) return; // the shrink wrote no parts for it
    const int rank = tab.rank[tl.slot];
    for (int e = threadIdx.x; e < TILE * RP; e += THREADS) {
        const int i = e / RP, r = e % RP;
        float v = 0.0f;
        if (i < tl.count && r < rank)
            for (int sp = 0; sp < splits; sp++) v += parts[((int64_t)sp * m + tl.start + i) * rstride + r];
        ts[i][r] = v;
    }
    if (threadIdx.x < TILE) rows[threadIdx.x] = threadIdx.x < tl.count ? perm[tl.start + threadIdx.x] : 0;
    __syncthreads();
    const int64_t j = (int64_t)blockIdx.y * THREADS + threadIdx.x;
    if (j >= out_cols) return;
    const bf16 *br = tab.b[tl.slot] + j * rank;
    float bj[RP];
#pragma unroll
    for (int r = 0; r < RP; r += 8) load8(br + r, rank - r < 8 ? (rank - r > 0 ? rank - r : 0) : 8, bj + r);
    const float sc = tab.scale[tl.slot];
    for (int i = 0; i < tl.count; i++) {
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < RP; r++) acc = fmaf(ts[i][r], bj[r], acc);
        bf16 *o = out + rows[i] * ldo + j;
        *o = __float2bfloat16(__bfloat162float(*o) + sc * acc);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// BGMV: t[i][r] = x[i] . a_s[r] for r < rank_s; grid m, THREADS threads.
__global__ void __launch_bounds__(THREADS) bgmv_shrink_kernel(float *t, int tstride, const bf16 *x, int64_t ldx,
                                                              int64_t in, const int8_t *row_slot,
                                                              const LoraTable tab) {
    const int64_t i = blockIdx.x;
    const int s = row_slot[i];
    if (s < 0 || !tab.a[s]) return;
    const int rank = tab.rank[s];
    const bf16 *xr = x + i * ldx;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < rank; r += THREADS / 32) {
        const bf16 *ar = tab.a[s] + (int64_t)r * in;
        float acc = 0.f;
        if ((in & 7) == 0 && ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(ar)) & 15) == 0) {
            for (int64_t k = (int64_t)lane * 8; k < in; k += 32 * 8) {
                float xf[8], af[8];
                pg_unpack8(*reinterpret_cast<const uint4 *>(xr + k), xf);
                pg_unpack8(*reinterpret_cast<const uint4 *>(ar + k), af);
#pragma unroll
                for (int e = 0; e < 8; e++) acc = fmaf(xf[e], af[e], acc);
            }
        } else {
            for (int64_t k = lane; k < in; k += 32) acc = fmaf(__bfloat162float(xr[k]), __bfloat162float(ar[k]), acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) t[i * tstride + r] = acc;
    }
}

// BGMV: out[i][j] += scale_s * t[i] . b_s[j] for j < out_cols; grid (m,
// column blocks of THREADS), one column a thread.
__global__ void __launch_bounds__(THREADS) bgmv_expand_kernel(bf16 *out, int64_t ldo, int64_t out_cols,
                                                              const float *t, int tstride, const int8_t *row_slot,
                                                              const LoraTable tab) {
    __shared__ float ts[PG_CUDA_LORA_MAX_RANK];
    const int64_t i = blockIdx.x;
    const int s = row_slot[i];
    if (s < 0 || !tab.a[s]) return;
    const int rank = tab.rank[s];
    if (threadIdx.x < rank) ts[threadIdx.x] = t[i * tstride + threadIdx.x];
    __syncthreads();
    const int64_t j = (int64_t)blockIdx.y * THREADS + threadIdx.x;
    if (j >= out_cols) return;
    const bf16 *br = tab.b[s] + j * rank;
    float acc = 0.f;
    if ((rank & 7) == 0 && (reinterpret_cast<uintptr_t>(br) & 15) == 0) {
        for (int r = 0; r < rank; r += 8) {
            float bf[8];
            pg_unpack8(*reinterpret_cast<const uint4 *>(br + r), bf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc = fmaf(ts[r + e], bf[e], acc);
        }
    } else {
        for (int r = 0; r < rank; r++) acc = fmaf(ts[r], __bfloat162float(br[r]), acc);
    }
    bf16 *o = out + i * ldo + j;
    *o = __float2bfloat16(__bfloat162float(*o) + tab.scale[s] * acc);
}

// The rows' slots into rs (int8) by copy kernels whose parameters carry
// STAGE of them each. With `slots`, a row whose slot has no `a` is staged
// as -1 (BGMV's per-projection staging); without, the slots as they are
// (the grouped shape's, shared by every projection of a step).
int stage_rows(int8_t *rs, const int32_t *row_slot, int64_t m, const pg_cuda_lora_slot *slots, cudaStream_t st) {
    LoraStage stage;
    for (int64_t i0 = 0; i0 < m; i0 += STAGE) {
        const int n = (int)(m - i0 < STAGE ? m - i0 : STAGE);
        for (int k = 0; k < n; k++) {
            const int32_t s = row_slot[i0 + k];
            stage.s[k] = (int8_t)(slots && s >= 0 && !slots[s].a ? -1 : s);
        }
        lora_stage_kernel<<<1, THREADS, 0, st>>>(rs + i0, stage, n);
        PG_CUDA_LAUNCHED("lora_stage_kernel");
    }
    return 0;
}

int refuse_capture(cudaStream_t st, const char *what) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    PG_CUDA_TRY(cudaStreamIsCapturing(st, &cap));
    if (cap != cudaStreamCaptureStatusNone)
        return pg_err_set(PG_EUNSUPP, "cuda %s: not graph-safe (the rows' slots are host values baked into the "
                                      "launches); run LoRA steps outside stream capture", what);
    return 0;
}

template <int RP>
int launch_rp(bf16 *out, int64_t ldo, int64_t out_cols, const bf16 *x, int64_t ldx, int64_t in, int64_t m,
               int n_tiles, int max_rank, const Layout &l, const LoraTable &tab, cudaStream_t st) {
    const int splits = (int)((in + KSPLIT - 1) / KSPLIT);
    lora_shrink_kernel<RP><<<dim3((unsigned)n_tiles, (unsigned)splits), THREADS, 0, st>>>(
        l.parts, max_rank, m, x, ldx, in, l.perm, l.tiles, tab);
    PG_CUDA_LAUNCHED("lora_shrink_kernel");
    lora_expand_kernel<RP><<<dim3((unsigned)n_tiles, (unsigned)pg_ceil_div(out_cols, THREADS)), THREADS, 0, st>>>(
        out, ldo, out_cols, l.parts, max_rank, m, splits, l.perm, l.tiles, tab);
    PG_CUDA_LAUNCHED("lora_expand_kernel");
    return 0;
}

} // namespace

int pg_cuda_lora_stage(const int32_t *row_slot, int64_t m, int32_t n_slots, void *ws, size_t ws_bytes,
                       void *stream) {
    PG_ARG(m >= 0 && m <= INT_MAX && n_slots >= 0 && (m == 0 || row_slot), "cuda lora_stage: %lld rows",
           (long long)m);
    if (n_slots > PG_CUDA_LORA_MAX_SLOTS)
        return pg_err_set(PG_EUNSUPP, "cuda lora_stage: %d adapter slots, the kernels take at most %d", n_slots,
                          PG_CUDA_LORA_MAX_SLOTS);
    if (m == 0) return 0;
    for (int64_t i = 0; i < m; i++)
        PG_ARG(row_slot[i] >= -1 && row_slot[i] < n_slots, "cuda lora_stage: row %lld names slot %d of %d",
               (long long)i, row_slot[i], n_slots);
    PG_ARG(ws && ws_bytes >= pg_cuda_lora_stage_size(m) && ((uintptr_t)ws & 3) == 0,
           "cuda lora_stage: workspace %zu bytes, %lld rows want %zu (4-byte aligned)", ws_bytes, (long long)m,
           pg_cuda_lora_stage_size(m));
    cudaStream_t st = pg_stream(stream);
    PG_TRY(refuse_capture(st, "lora_stage"));
    const Layout l = layout_of(ws, m);
    PG_TRY(stage_rows(l.rs, row_slot, m, nullptr, st));
    lora_route_kernel<<<1, ROUTE_THREADS, 0, st>>>(l.rs, (int)m, l.perm, l.tiles);
    PG_CUDA_LAUNCHED("lora_route_kernel");
    return 0;
}

int pg_cuda_lora_apply(void *out, int64_t ldo, const void *x, int64_t ldx, int64_t m, int64_t in, int64_t out_cols,
                       const int32_t *row_slot, const pg_cuda_lora_slot *slots, int32_t n_slots, void *ws,
                       size_t ws_bytes, int staged, void *stream) {
    PG_ARG(m >= 0 && m <= INT_MAX && in >= 1 && out_cols >= 1 && ldx >= in && ldo >= out_cols,
           "cuda lora_apply: %lld rows of %lld -> %lld, strides %lld / %lld", (long long)m, (long long)in,
           (long long)out_cols, (long long)ldx, (long long)ldo);
    PG_ARG(n_slots >= 0 && (m == 0 || (row_slot && (slots || n_slots == 0))), "cuda lora_apply: no slot table");
    if (n_slots > PG_CUDA_LORA_MAX_SLOTS)
        return pg_err_set(PG_EUNSUPP, "cuda lora_apply: %d adapter slots, the kernels take at most %d", n_slots,
                          PG_CUDA_LORA_MAX_SLOTS);
    PG_ARG(out_cols <= (int64_t)65535 * THREADS, "cuda lora_apply: %lld output columns", (long long)out_cols);
    if (m == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    PG_TRY(refuse_capture(st, "lora_apply"));
    int32_t max_rank = 0, cnt[PG_CUDA_LORA_MAX_SLOTS] = {0};
    for (int64_t i = 0; i < m; i++) {
        const int32_t s = row_slot[i];
        PG_ARG(s >= -1 && s < n_slots, "cuda lora_apply: row %lld names slot %d of %d", (long long)i, s, n_slots);
        if (s < 0) continue;
        cnt[s]++;
        if (!slots[s].a) continue;
        const pg_cuda_lora_slot *sl = &slots[s];
        if (sl->dtype != PG_DTYPE_BF16)
            return pg_err_set(PG_EUNSUPP, "cuda lora_apply: slot %d's adapter is %s; the GPU runs bf16 adapters "
                                          "(weight_upload makes f32 / f16 ones bf16)", s, pg_dtype_name(sl->dtype));
        PG_ARG(sl->b && sl->rank >= 1, "cuda lora_apply: slot %d: rank %d, B %s", s, sl->rank, sl->b ? "set" : "NULL");
        if (sl->rank > PG_CUDA_LORA_MAX_RANK)
            return pg_err_set(PG_EUNSUPP, "cuda lora_apply: slot %d has rank %d, the kernels take at most %d", s,
                              sl->rank, PG_CUDA_LORA_MAX_RANK);
        max_rank = sl->rank > max_rank ? sl->rank : max_rank;
    }
    if (max_rank == 0) return 0; // no row has an adapter here
    PG_ARG(out && x, "cuda lora_apply: null rows");
    const size_t need = pg_cuda_lora_workspace_size(m, in, max_rank);
    PG_ARG(ws && ws_bytes >= need && ((uintptr_t)ws & 3) == 0,
           "cuda lora_apply: workspace %zu bytes, %lld rows of %lld at rank %d want %zu (4-byte aligned)", ws_bytes,
           (long long)m, (long long)in, max_rank, need);
    LoraTable tab;
    memset(&tab, 0, sizeof tab);
    for (int32_t s = 0; s < n_slots; s++) {
        if (!slots[s].a || !cnt[s]) continue;
        tab.a[s] = (const bf16 *)slots[s].a;
        tab.b[s] = (const bf16 *)slots[s].b;
        tab.scale[s] = slots[s].scale;
        tab.rank[s] = slots[s].rank;
    }
    const Layout l = layout_of(ws, m);
    bf16 *o = (bf16 *)out;
    const bf16 *xb = (const bf16 *)x;
    if (!pg_cuda_lora_grouped()) {
        // BGMV, staged in every call as before session 23 (`staged` is not
        // looked at): -1 for rows whose slot has no `a` here.
        PG_TRY(stage_rows(l.rs, row_slot, m, slots, st));
        bgmv_shrink_kernel<<<(unsigned)m, THREADS, 0, st>>>(l.parts, max_rank, xb, ldx, in, l.rs, tab);
        PG_CUDA_LAUNCHED("bgmv_shrink_kernel");
        const dim3 grid((unsigned)m, (unsigned)pg_ceil_div(out_cols, THREADS));
        bgmv_expand_kernel<<<grid, THREADS, 0, st>>>(o, ldo, out_cols, l.parts, max_rank, l.rs, tab);
        PG_CUDA_LAUNCHED("bgmv_expand_kernel");
        return 0;
    }
    if (!staged) PG_TRY(pg_cuda_lora_stage(row_slot, m, n_slots, ws, ws_bytes, stream));
    // The route kernel's tiles, counted here for the grid (the same cut).
    int n_tiles = 0;
    for (int s = 0; s < n_slots; s++) n_tiles += (cnt[s] + TILE - 1) / TILE;
    if (max_rank <= 8) return launch_rp<8>(o, ldo, out_cols, xb, ldx, in, m, n_tiles, max_rank, l, tab, st);
    if (max_rank <= 16) return launch_rp<16>(o, ldo, out_cols, xb, ldx, in, m, n_tiles, max_rank, l, tab, st);
    if (max_rank <= 32) return launch_rp<32>(o, ldo, out_cols, xb, ldx, in, m, n_tiles, max_rank, l, tab, st);
    return launch_rp<64>(o, ldo, out_cols, xb, ldx, in, m, n_tiles, max_rank, l, tab, st);
}
