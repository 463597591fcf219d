// kernels/cuda/moe.cu - the mixture-of-experts feed-forward on the GPU
// (cuda_ops.h pg_cuda_moe_ffn; docs/moe.md), the CPU's kernels/cpu/moe.c
// laid out as launches:
//
//   1. xn = RMSNorm(x) * norm            pg_cuda_add_rmsnorm (bf16 rows)
//   2. logits = xn . router^T            moe_gemm<ROUTER>    (f32 out; moe_router_gemv up to 8 rows)
//   3. softmax, top-k, renorm            moe_route           (a warp a row)
//   4. pairs sorted by expert            moe_align           (one CTA)
//   5. h = silu(xn . gate^T) * (xn . up^T)   moe_gemm<GATE_UP> over tiles of one expert's rows
//   6. y = h . down^T                    moe_gemm<DOWN>      (bf16 rows, one per pair)
//   7. out = [x +] sum_e w_e y_e         moe_combine         (ascending expert id, f32)
//
// Step 4 is vLLM's moe_align_block_size idea: the (row, expert) pairs are
// counted per expert, each expert's run is padded to a multiple of the tile
// height BM, and the pairs are scattered into that order; tile t of the
// padded order belongs to one expert (tile_expert[t]), so the grouped
// products are ordinary tiled GEMMs whose B operand is chosen per tile and
// whose A rows are gathered. Padding rows are zeros and their outputs are
// never read. The launch grids are bounded by m alone (the tiles a batch can
// need at most); CTAs past the batch's real tile count leave at once, so no
// count ever comes back to the host and the whole layer can be captured in
// a CUDA graph. Each row's result is the same whatever order the pairs take
// within an expert (a row's products do not depend on the other rows of its
// tile) and step 7 adds a row's experts in ascending id, so the output does
// not depend on the atomics' order.
//
// The products are mma.sync m16n8k16 (bf16 in, f32 accumulate) over a
// cp.async pipeline, 128 threads, tiles of 16 x 64 or 64 x 128: not yet
// the wgmma/TMA kernels of the dense path; measured in docs/moe.md. FP8
// experts (pg_cuda_moe_ffn_fp8) stream e4m3 bytes and convert each stage
// to bf16 in shared memory. The expert pointers and row scales travel as
// kernel parameters (8 KB; CUDA 12.1+ allows 32 KB), so nothing is
// uploaded per call and a captured graph keeps them. Every launch is PDL
// (cuda_common.cuh's rules: each kernel waits before its first access).
#include <stdlib.h>

#include <atomic>

#include "kernels/cuda/cuda_common.cuh"

extern "C" {
#include "common/err.h"
}

namespace {

using namespace pg_ptx;

constexpr int THREADS = 128;
constexpr int MAX_TOPK = 16;

enum Mode { ROUTER = 0, GATE_UP = 1, DOWN = 2 };

// An expert's weight (bf16, or e4m3 bytes) and, for FP8, its row scales.
struct ExpertPtrs {
    const void *w[PG_CUDA_MOE_MAX_EXPERTS];
    const float *s[PG_CUDA_MOE_MAX_EXPERTS];
};

// The workspace, carved in this order, each piece 256-byte aligned. sel,
// sel_w come before anything whose size depends on the tile height, so
// pg_cuda_moe_routing finds them from the shape alone.
struct Ws {
    bf16 *xn;           // [m][hidden]
    float *logits;      // [m][n_experts]
    int32_t *sel;       // [m][top_k] best first
    float *sel_w;       // [m][top_k]
    int32_t *pair_pos;  // [m][top_k] the pair's row in the padded order, -1: expert not held here
    int32_t *n_tiles;   // [1]
    int32_t *tile_expert; // [max_tiles]
    int32_t *sorted;    // [max_tiles * BM] pair index (row * top_k + slot), -1: padding
    bf16 *h;            // [max_tiles * BM][ffn]
    bf16 *y;            // [max_tiles * BM][hidden]
};

inline size_t up256(size_t v) { return (v + 255) / 256 * 256; }

// Tile height for a batch: 16 while an expert averages at most 16 pairs
// (decode: little padding), else 64. Measured (bench_cuda_moe, H200,
// Qwen3-30B-A3B shape): at m = 256 (16 a expert) 16-row tiles take 423 us
// against 453, at m = 512 664 against 463. PAGED_CUDA_MOE_SMALL_PAIRS=N
// moves the switch (read once; measurement).
inline int tile_rows(int64_t m, int32_t n_experts, int32_t top_k) {
    static const int64_t small = [] {
        const char *v = getenv("PAGED_CUDA_MOE_SMALL_PAIRS");
        return v && atoi(v) >= 0 ? (int64_t)atoi(v) : (int64_t)16;
    }();
    return m * top_k <= small * n_experts ? 16 : 64;
}

inline int64_t max_tiles(int64_t m, int32_t n_experts, int32_t top_k, int bm) {
    const int64_t pairs = m * top_k;
    return (pairs + bm - 1) / bm + (pairs < n_experts ? pairs : n_experts);
}

// Carves ws (base NULL: sizes only); returns the bytes.
size_t carve(Ws *w, char *base, int64_t m, int64_t hidden, int64_t ffn, int32_t n_exp, int32_t k, int bm) {
    size_t off = 0;
    auto piece = [&](size_t bytes) -> char * {
        char *p = base ? base + off : nullptr;
        off += up256(bytes);
        return p;
    };
    const int64_t mt = max_tiles(m, n_exp, k, bm), rows = mt * bm;
    w->xn = (bf16 *)piece(sizeof(bf16) * m * hidden);
    w->logits = (float *)piece(sizeof(float) * m * n_exp);
    w->sel = (int32_t *)piece(sizeof(int32_t) * m * k);
    w->sel_w = (float *)piece(sizeof(float) * m * k);
    w->pair_pos = (int32_t *)piece(sizeof(int32_t) * m * k);
    w->n_tiles = (int32_t *)piece(sizeof(int32_t));
    w->tile_expert = (int32_t *)piece(sizeof(int32_t) * mt);
    w->sorted = (int32_t *)piece(sizeof(int32_t) * rows);
    w->h = (bf16 *)piece(sizeof(bf16) * rows * ffn);
    w->y = (bf16 *)piece(sizeof(bf16) * rows * hidden);
    return off;
}

// --- the tiled products ---------------------------------------------------------------------
//
// One CTA computes a BM x BN tile: BM rows of A (gathered per mode) times
// BN rows of one weight ([n][k], k contiguous, as linear's), over k in
// steps of BK through a STAGES-deep cp.async ring. Warps: WM x WN, each a
// (BM / WM) x (BN / WN) block of m16n8 fragments.

struct GemmArgs {
    const bf16 *a;            // ROUTER, GATE_UP: xn [m][k]; DOWN: h [rows][k]
    const int32_t *sorted;    // GATE_UP, DOWN: the padded order's pairs
    const int32_t *n_tiles;   // GATE_UP, DOWN: tiles in use
    const int32_t *tile_expert;
    void *out;                // ROUTER: f32 [m][n]; GATE_UP: h bf16 [rows][ffn]; DOWN: y bf16 [rows][n]
    int64_t m;                // ROUTER: rows of xn
    int32_t n, k;             // output columns (GATE_UP: ffn), depth
    int32_t top_k;
};

// A tile shape: BM rows x BN weight rows (in GATE_UP the first half gate
// rows, the second the same rows of up), k in steps of BK through STAGES
// buffers. LDS, the shared row stride, pads a row by 16 bytes so that the 8
// rows one ldmatrix reads fall in 8 different bank groups.
template <int BM_, int BN_, int BK_, int STAGES_> struct Cfg {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_;
    static constexpr int LDS = BK + 8;
    static constexpr int WM = BM == 16 ? 1 : 2;
    static constexpr int WN = 4 / WM;
    static constexpr int MF = BM / WM / 16;   // m16 fragments per warp
    static constexpr int NF = BN / WN / 8;    // n8 fragments per warp
    static constexpr int STAGE_ELEMS = (BM + BN) * LDS;
    static constexpr size_t SMEM = sizeof(bf16) * STAGE_ELEMS * STAGES;
    // FP8 weights: a stage holds A (bf16) and B's raw e4m3 rows (BK bytes
    // each); one bf16 B tile, converted from the stage in use, follows the
    // stages.
    static constexpr int F8_STAGE_BYTES = BM * LDS * 2 + BN * BK;
    static constexpr size_t SMEM_F8 = (size_t)F8_STAGE_BYTES * STAGES + (size_t)BN * LDS * 2;
    static constexpr size_t smem(bool f8) { return f8 ? SMEM_F8 : SMEM; }
};
// While experts see few rows (decode): 16 x 64, many small CTAs keep many
// weight bytes in flight. (16 x 64 with k steps of 128, 3 stages, measured
// the same within 1%: bench_cuda_moe, session 15.) Otherwise 64 x 128.
using Small = Cfg<16, 64, 64, 4>;
using Large = Cfg<64, 128, 64, 3>;

// F8: B is e4m3 bytes with a scale per weight row (GATE_UP, DOWN only):
// the raw rows stream through the ring, each stage is converted to bf16
// (exactly) before its products, and the scale multiplies the f32 sum.
template <class C, int MODE, bool F8>
__global__ void __launch_bounds__(THREADS) moe_gemm(const __grid_constant__ GemmArgs g,
                                                    const __grid_constant__ ExpertPtrs wp) {
    pg_pdl_wait(); // before any read or write: PDL's rules (cuda_common.cuh)
    pg_pdl_trigger();
    static_assert(!(F8 && MODE == ROUTER), "the router stays bf16");
    constexpr int BM = C::BM, BN = C::BN, BK = C::BK, LDS = C::LDS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tile = blockIdx.x;
    const unsigned char *w;   // the weight's bytes (bf16 or e4m3)
    const float *wscale = nullptr;
    if constexpr (MODE == ROUTER) {
        if ((int64_t)tile * BM >= g.m) return;
        w = (const unsigned char *)wp.w[0];
    } else {
        if (tile >= *g.n_tiles) return;
        const int e = g.tile_expert[tile];
        w = (const unsigned char *)wp.w[e];
        if constexpr (F8) wscale = wp.s[e];
    }
    // GATE_UP: this CTA's BN / 2 output columns; B rows [0, BN / 2) are
    // gate rows n0.., the rest the up rows ffn + n0.. . Else BN columns.
    const int n0 = blockIdx.y * (MODE == GATE_UP ? BN / 2 : BN);

    // The ring: stage s holds A [BM][LDS] bf16 then B: [BN][LDS] bf16, or
    // for F8 [BN][BK] e4m3 bytes; F8's converted bf16 B tile after the stages.
    constexpr int STAGE_BYTES = F8 ? C::F8_STAGE_BYTES : C::STAGE_ELEMS * 2;
    auto a_tile = [&](int st) { return reinterpret_cast<bf16 *>(smem_raw + st * STAGE_BYTES); };
    auto b_raw = [&](int st) { return smem_raw + st * STAGE_BYTES + BM * LDS * 2; };
    bf16 *const b_f8 = reinterpret_cast<bf16 *>(smem_raw + C::STAGES * STAGE_BYTES);

    // Each thread's A rows (fixed over k): chunk c = tid + i * THREADS is
    // row c / CPR, 16-byte column chunk c % CPR. B likewise with CPRB
    // chunks a row (16 bytes: 8 bf16 or 16 e4m3 weights).
    constexpr int CPR = BK / 8;
    constexpr int WB = F8 ? 1 : 2;        // bytes a weight
    constexpr int CPRB = BK * WB / 16;
    static_assert(THREADS % CPR == 0 && THREADS % CPRB == 0, "a thread's chunks share one column");
    constexpr int A_CHUNKS = BM * CPR / THREADS;
    constexpr int B_CHUNKS = BN * CPRB / THREADS;
    const bf16 *arow[A_CHUNKS];
#pragma unroll
    for (int i = 0; i < A_CHUNKS; i++) {
        const int r = (tid + i * THREADS) / CPR;
        const int64_t pos = (int64_t)tile * BM + r;
        const bf16 *src = nullptr;
        if constexpr (MODE == ROUTER) {
            if (pos < g.m) src = g.a + pos * g.k;
        } else {
            const int32_t p = g.sorted[pos];
            if (p >= 0) src = MODE == GATE_UP ? g.a + (int64_t)(p / g.top_k) * g.k : g.a + pos * g.k;
        }
        arow[i] = src;
    }
    const unsigned char *brow[B_CHUNKS];
#pragma unroll
    for (int i = 0; i < B_CHUNKS; i++) {
        const int r = (tid + i * THREADS) / CPRB;
        int64_t n;
        bool ok;
        if constexpr (MODE == GATE_UP) {
            const int c = n0 + r % (BN / 2);
            ok = c < g.n;
            n = (r < BN / 2 ? 0 : g.n) + c;
        } else {
            n = n0 + r;
            ok = n < g.n;
        }
        brow[i] = ok ? w + n * g.k * WB : nullptr;
    }
    const int kc = (tid % CPR) * 8;    // A's column (elements)
    const int kcb = (tid % CPRB) * 16; // B's column (bytes)

    auto load = [&](int stage, int kt) {
        bf16 *as = a_tile(stage);
        unsigned char *bs = b_raw(stage);
        const int k = kt * BK + kc;
        const bool kin = k < g.k; // k, and so every chunk start, is a multiple of 8
#pragma unroll
        for (int i = 0; i < A_CHUNKS; i++) {
            const int r = (tid + i * THREADS) / CPR;
            const bool v = kin && arow[i];
            cp_async16(smem_u32(as + r * LDS + kc), v ? arow[i] + k : g.a, v);
        }
        // (F8: K is a multiple of 16, so a 16-weight chunk is all in or all out.)
        const int kb = kt * BK * WB + kcb;
        const bool kbin = kb < g.k * WB;
#pragma unroll
        for (int i = 0; i < B_CHUNKS; i++) {
            const int r = (tid + i * THREADS) / CPRB;
            const bool v = kbin && brow[i];
            cp_async16(smem_u32(bs + r * (F8 ? BK : LDS * 2) + kcb), v ? brow[i] + kb : w, v);
        }
    };

    float acc[C::MF][C::NF][4];
#pragma unroll
    for (int i = 0; i < C::MF; i++)
#pragma unroll
        for (int j = 0; j < C::NF; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

    const int nk = (g.k + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < nk) load(s, s);
        cp_async_commit();
    }
    const int wm0 = (warp / C::WN) * (BM / C::WM), wn0 = (warp % C::WN) * (BN / C::WN);
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<C::STAGES - 2>();
        __syncthreads(); // stage kt landed for every thread; stage kt - 1 (and F8's B tile) is free
        if (kt + C::STAGES - 1 < nk) load((kt + C::STAGES - 1) % C::STAGES, kt + C::STAGES - 1);
        cp_async_commit();
        const bf16 *as = a_tile(kt % C::STAGES);
        const bf16 *bs;
        if constexpr (F8) {
            // e4m3 -> bf16, exact: BN x BK weights, 16 a chunk.
            const unsigned char *raw = b_raw(kt % C::STAGES);
            for (int c = tid; c < BN * CPRB; c += THREADS) {
                const int r = c / CPRB, col = (c % CPRB) * 16;
                const uint4 in = *reinterpret_cast<const uint4 *>(raw + r * BK + col);
                uint4 lo, hi;
                e4m3x16_to_bf16(in, lo, hi);
                *reinterpret_cast<uint4 *>(b_f8 + r * LDS + col) = lo;
                *reinterpret_cast<uint4 *>(b_f8 + r * LDS + col + 8) = hi;
            }
            __syncthreads();
            bs = b_f8;
        } else {
            bs = reinterpret_cast<const bf16 *>(b_raw(kt % C::STAGES));
        }
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t a[C::MF][4], b[C::NF][2];
#pragma unroll
            for (int i = 0; i < C::MF; i++)
                ldsm_x4(smem_u32(as + (wm0 + i * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 8), a[i][0], a[i][1],
                        a[i][2], a[i][3]);
#pragma unroll
            for (int j = 0; j < C::NF; j += 2) {
                uint32_t r[4];
                ldsm_x4(smem_u32(bs + (wn0 + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * LDS + kk +
                                 ((lane >> 3) & 1) * 8),
                        r[0], r[1], r[2], r[3]);
                b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < C::MF; i++)
#pragma unroll
                for (int j = 0; j < C::NF; j++) mma_bf16(acc[i][j], a[i], b[j][0], b[j][1]);
        }
    }
    cp_async_wait<0>();

    // Fragment (i, j) holds rows wm0 + i*16 + lane/4 (+8) and columns
    // wn0 + j*8 + 2*(lane%4) (+1) of the tile. F8: a column's sum times its
    // weight row's scale.
    const int fr = lane >> 2, fc = 2 * (lane & 3);
    if constexpr (MODE == GATE_UP) {
        // Gate and up of one column sit in different warps: through shared memory.
        __syncthreads(); // everyone is done with the ring
        constexpr int LDT = BN + 4;
        float *t = reinterpret_cast<float *>(smem_raw);
#pragma unroll
        for (int i = 0; i < C::MF; i++)
#pragma unroll
            for (int j = 0; j < C::NF; j++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    t[(wm0 + i * 16 + fr + (q >> 1) * 8) * LDT + wn0 + j * 8 + fc + (q & 1)] = acc[i][j][q];
        __syncthreads();
        bf16 *h = reinterpret_cast<bf16 *>(g.out);
        for (int e = tid; e < BM * (BN / 2); e += THREADS) {
            const int r = e / (BN / 2), c = e % (BN / 2);
            if (n0 + c >= g.n) continue;
            float gt = t[r * LDT + c], up = t[r * LDT + BN / 2 + c];
            if constexpr (F8) gt *= wscale[n0 + c], up *= wscale[g.n + n0 + c];
            h[((int64_t)tile * BM + r) * g.n + n0 + c] = __float2bfloat16(gt / (1.0f + expf(-gt)) * up);
        }
    } else {
#pragma unroll
        for (int i = 0; i < C::MF; i++)
#pragma unroll
            for (int j = 0; j < C::NF; j++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int64_t row = (int64_t)tile * BM + wm0 + i * 16 + fr + half * 8;
                    const int col = n0 + wn0 + j * 8 + fc;
                    float v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
                    if constexpr (MODE == ROUTER) {
                        if (row >= g.m) continue;
                        float *o = reinterpret_cast<float *>(g.out) + row * g.n;
                        if (col < g.n) o[col] = v0;
                        if (col + 1 < g.n) o[col + 1] = v1;
                    } else { // DOWN: n is a multiple of 8, so col and col + 1 are both in or both out
                        if (col < g.n) {
                            if constexpr (F8) v0 *= wscale[col], v1 *= wscale[col + 1];
                            *reinterpret_cast<__nv_bfloat162 *>(reinterpret_cast<bf16 *>(g.out) + row * g.n + col) =
                                __floats2bfloat162_rn(v0, v1);
                        }
                    }
                }
    }
}

// The router product for batches of at most ROUTER_GEMV_ROWS rows: a warp
// an expert, every row's dot product in f32 over 16-byte chunks. (The
// tiled kernel would give 128 experts one CTA, which reads the whole router
// alone: about 10 us at m = 1 against 2-3 here.)
constexpr int ROUTER_GEMV_ROWS = 8;
__global__ void moe_router_gemv(const bf16 *xn, const bf16 *router, float *logits, int m, int32_t n_exp,
                                int32_t k) {
    pg_pdl_wait(); // before any read or write: PDL's rules (cuda_common.cuh)
    pg_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int e = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (e >= n_exp) return;
    const bf16 *w = router + (int64_t)e * k;
    float acc[ROUTER_GEMV_ROWS];
#pragma unroll
    for (int i = 0; i < ROUTER_GEMV_ROWS; i++) acc[i] = 0.0f;
    for (int c = lane * 8; c < k; c += 32 * 8) {
        const uint4 wv = *reinterpret_cast<const uint4 *>(w + c);
        const bf16 *wb = reinterpret_cast<const bf16 *>(&wv);
#pragma unroll
        for (int i = 0; i < ROUTER_GEMV_ROWS; i++) {
            if (i >= m) break;
            const uint4 xv = *reinterpret_cast<const uint4 *>(xn + (int64_t)i * k + c);
            const bf16 *xb = reinterpret_cast<const bf16 *>(&xv);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[i] += __bfloat162float(wb[j]) * __bfloat162float(xb[j]);
        }
    }
#pragma unroll
    for (int i = 0; i < ROUTER_GEMV_ROWS; i++) {
        if (i >= m) break;
        float v = acc[i];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) logits[(int64_t)i * n_exp + e] = v;
    }
}

// --- routing ----------------------------------------------------------------------------------

// A warp a row: softmax over the experts in f32 (max subtracted, then
// times the reciprocal of the sum, as the CPU), then top_k rounds of a
// warp argmax (ties to the lower id), then the optional renormalisation
// (the sum in selection order, as the CPU).
__global__ void moe_route(const float *logits, int64_t m, int32_t n_exp, int32_t top_k, int renorm,
                          int32_t *sel, float *sel_w) {
    pg_pdl_wait(); // before any read or write: PDL's rules (cuda_common.cuh)
    pg_pdl_trigger();
    constexpr int PER = PG_CUDA_MOE_MAX_EXPERTS / 32;
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= m) return;
    const float *l = logits + row * n_exp;
    float p[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n_exp ? l[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        p[i] = lane + 32 * i < n_exp ? expf(p[i] - mx) : 0.0f;
        sum += p[i];
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < PER; i++) p[i] = lane + 32 * i < n_exp ? p[i] * inv : -1.0f; // -1: never chosen
    float chosen[MAX_TOPK];
    int32_t ids[MAX_TOPK];
    float total = 0.0f;
    for (int t = 0; t < top_k; t++) {
        float best = -2.0f;
        int32_t id = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER; i++) // ascending e within the lane: strict > keeps the lower id
            if (p[i] > best) best = p[i], id = lane + 32 * i;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
            if (ob > best || (ob == best && oi < id)) best = ob, id = oi;
        }
#pragma unroll
        for (int i = 0; i < PER; i++) // (a constant index keeps p in registers)
            if (lane + 32 * i == id) p[i] = -1.0f;
        chosen[t] = best;
        ids[t] = id;
    }
    for (int t = 0; t < top_k; t++) total += chosen[t];
    const float scale = renorm ? 1.0f / total : 1.0f;
    if (lane < top_k) {
        float v = chosen[0];
        int32_t e = ids[0];
        for (int t = 1; t < top_k; t++)
            if (t == lane) v = chosen[t], e = ids[t];
        sel[row * top_k + lane] = e;
        sel_w[row * top_k + lane] = v * scale;
    }
}

struct HeldMask {
    uint32_t bits[PG_CUDA_MOE_MAX_EXPERTS / 32];
};

// One CTA: counts the pairs of each held expert, pads each expert's run to
// a multiple of bm, writes tile_expert and n_tiles, fills the padded order
// with -1 and scatters the pairs into it.
__global__ void __launch_bounds__(1024) moe_align(const int32_t *sel, int64_t pairs, int32_t n_exp, int bm,
                                                  const __grid_constant__ HeldMask held, int32_t *sorted,
                                                  int32_t *pair_pos, int32_t *tile_expert, int32_t *n_tiles) {
    pg_pdl_wait(); // before any read or write: PDL's rules (cuda_common.cuh)
    pg_pdl_trigger();
    __shared__ int32_t count[PG_CUDA_MOE_MAX_EXPERTS];
    __shared__ int32_t start[PG_CUDA_MOE_MAX_EXPERTS + 1];
    const int tid = threadIdx.x;
    for (int e = tid; e < n_exp; e += blockDim.x) count[e] = 0;
    __syncthreads();
    auto is_held = [&](int32_t e) { return (held.bits[e >> 5] >> (e & 31)) & 1u; };
    for (int64_t q = tid; q < pairs; q += blockDim.x) {
        const int32_t e = sel[q];
        if (is_held(e)) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int32_t s = 0;
        for (int e = 0; e < n_exp; e++) {
            start[e] = s;
            s += (count[e] + bm - 1) / bm * bm;
        }
        start[n_exp] = s;
        *n_tiles = s / bm;
    }
    __syncthreads();
    for (int e = tid; e < n_exp; e += blockDim.x) {
        for (int32_t t = start[e] / bm; t < start[e + 1] / bm; t++) tile_expert[t] = e;
        count[e] = start[e]; // now the scatter's cursor
    }
    for (int32_t i = tid; i < start[n_exp]; i += blockDim.x) sorted[i] = -1;
    __syncthreads();
    for (int64_t q = tid; q < pairs; q += blockDim.x) {
        const int32_t e = sel[q];
        int32_t pos = -1;
        if (is_held(e)) {
            pos = atomicAdd(&count[e], 1);
            sorted[pos] = (int32_t)q;
        }
        pair_pos[q] = pos;
    }
}

// A CTA a row: out = [x +] sum over the row's held experts in ascending id
// of w * y, in f32, 8 columns a thread at a time.
__global__ void moe_combine(bf16 *out, const bf16 *x, const bf16 *y, const int32_t *sel, const float *sel_w,
                            const int32_t *pair_pos, int64_t hidden, int32_t top_k, int accumulate) {
    pg_pdl_wait(); // before any read or write: PDL's rules (cuda_common.cuh)
    pg_pdl_trigger();
    const int64_t row = blockIdx.x;
    int32_t order[MAX_TOPK];
    int n = 0;
    for (int t = 0; t < top_k; t++) { // insertion by expert id; experts of a row are distinct
        const int32_t e = sel[row * top_k + t];
        int at = n;
        while (at > 0 && sel[row * top_k + order[at - 1]] > e) order[at] = order[at - 1], at--;
        order[at] = t;
        n++;
    }
    for (int64_t c = threadIdx.x * 8; c < hidden; c += blockDim.x * 8) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < top_k; i++) {
            const int32_t q = (int32_t)row * top_k + order[i], pos = pair_pos[q];
            if (pos < 0) continue;
            const float wt = sel_w[q];
            const uint4 v = *reinterpret_cast<const uint4 *>(y + (int64_t)pos * hidden + c);
            const bf16 *vb = reinterpret_cast<const bf16 *>(&v);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] += wt * __bfloat162float(vb[j]);
        }
        if (accumulate) {
            const uint4 v = *reinterpret_cast<const uint4 *>(x + row * hidden + c);
            const bf16 *vb = reinterpret_cast<const bf16 *>(&v);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] = __bfloat162float(vb[j]) + acc[j];
        }
        *reinterpret_cast<uint4 *>(out + row * hidden + c) = pack8(acc);
    }
}

template <class C, int MODE, bool F8>
cudaError_t launch_gemm(unsigned tiles, int64_t n, const GemmArgs &g, const ExpertPtrs &wp, cudaStream_t st) {
    // The shared-memory opt-in is per device (and per instantiation): once
    // each, before the first launch (an eager call precedes any capture).
    static std::atomic<uint64_t> done{0};
    constexpr size_t smem = C::smem(F8);
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const uint64_t bit = 1ull << (dev & 63);
    if (!(done.load(std::memory_order_acquire) & bit)) {
        e = cudaFuncSetAttribute(moe_gemm<C, MODE, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        done.fetch_or(bit, std::memory_order_release);
    }
    // grid.x: tiles; grid.y: the output's column blocks (GATE_UP: BN / 2 of h's).
    const dim3 grid(tiles, (unsigned)pg_ceil_div(n, MODE == GATE_UP ? C::BN / 2 : C::BN));
    return pg_launch_pdl(moe_gemm<C, MODE, F8>, grid, dim3(THREADS), smem, st, g, wp);
}

template <int MODE, bool F8>
cudaError_t launch_gemm_bm(int bm, unsigned tiles, int64_t n, const GemmArgs &g, const ExpertPtrs &wp,
                           cudaStream_t st) {
    return bm == Large::BM ? launch_gemm<Large, MODE, F8>(tiles, n, g, wp, st)
                           : launch_gemm<Small, MODE, F8>(tiles, n, g, wp, st);
}

template <int MODE>
cudaError_t launch_experts(bool f8, int bm, unsigned tiles, int64_t n, const GemmArgs &g, const ExpertPtrs &wp,
                           cudaStream_t st) {
    return f8 ? launch_gemm_bm<MODE, true>(bm, tiles, n, g, wp, st) : launch_gemm_bm<MODE, false>(bm, tiles, n, g, wp, st);
}

} // namespace

size_t pg_cuda_moe_workspace_size(int64_t max_rows, int64_t hidden, int64_t ffn, int32_t n_experts,
                                  int32_t top_k) {
    if (max_rows < 1) max_rows = 1;
    Ws w;
    // Either tile height may run for a batch of up to max_rows rows.
    const size_t a = carve(&w, nullptr, max_rows, hidden, ffn, n_experts, top_k, 16);
    const size_t b = carve(&w, nullptr, max_rows, hidden, ffn, n_experts, top_k, 64);
    return a > b ? a : b;
}

// Both launchers: scales NULL for bf16 experts.
static int moe_ffn(void *out, const void *x, int64_t m, int64_t hidden, int64_t ffn, const void *norm, float eps,
                   const void *router, const void *const *gate_up, const float *const *gu_scales,
                   const void *const *down, const float *const *dn_scales, int32_t n_experts, int32_t top_k,
                   int renorm, int accumulate, void *ws, size_t ws_bytes, void *stream) {
    const bool f8 = gu_scales != nullptr;
    PG_ARG(n_experts >= 1 && n_experts <= PG_CUDA_MOE_MAX_EXPERTS && top_k >= 1 && top_k <= MAX_TOPK &&
               top_k <= n_experts,
           "cuda moe_ffn: top %d of %d experts (at most top %d of %d)", top_k, n_experts, MAX_TOPK,
           PG_CUDA_MOE_MAX_EXPERTS);
    PG_ARG(hidden > 0 && ffn > 0 && hidden % 8 == 0 && ffn % 8 == 0 && hidden < (1 << 30) && ffn < (1 << 30),
           "cuda moe_ffn: hidden %lld and ffn %lld must be positive multiples of 8", (long long)hidden,
           (long long)ffn);
    PG_ARG(m >= 0 && m * top_k < (1LL << 30), "cuda moe_ffn: %lld rows", (long long)m);
    PG_ARG(out && x && router && gate_up && down, "cuda moe_ffn: a null pointer");
    if (m == 0) return 0;
    const int bm = tile_rows(m, n_experts, top_k);
    Ws w;
    // What the contract promises (either tile height's layout), not only
    // what this batch's needs: a caller that sized short fails at once.
    const size_t need = pg_cuda_moe_workspace_size(m, hidden, ffn, n_experts, top_k);
    PG_ARG(ws && ws_bytes >= need && ((uintptr_t)ws & 255) == 0,
           "cuda moe_ffn: workspace of %zu bytes, %lld rows want %zu (256-byte aligned)", ws_bytes, (long long)m,
           need);
    carve(&w, (char *)ws, m, hidden, ffn, n_experts, top_k, bm);
    ExpertPtrs gu = {}, dn = {}, rt = {};
    HeldMask held = {};
    if (f8)
        PG_ARG(dn_scales && hidden % 16 == 0 && ffn % 16 == 0,
               "cuda moe_ffn: FP8 experts want scales and hidden %lld, ffn %lld multiples of 16", (long long)hidden,
               (long long)ffn);
    for (int32_t e = 0; e < n_experts; e++) {
        PG_ARG(!gate_up[e] == !down[e], "cuda moe_ffn: expert %d has only one of gate_up and down", e);
        if (f8 && gate_up[e])
            PG_ARG(gu_scales[e] && dn_scales[e], "cuda moe_ffn: FP8 expert %d without its row scales", e);
        gu.w[e] = gate_up[e];
        dn.w[e] = down[e];
        if (f8) gu.s[e] = gu_scales[e], dn.s[e] = dn_scales[e];
        if (gate_up[e]) held.bits[e >> 5] |= 1u << (e & 31);
    }
    rt.w[0] = router;
    cudaStream_t st = pg_stream(stream);

    const bf16 *xn = (const bf16 *)x;
    if (norm) {
        PG_TRY(pg_cuda_add_rmsnorm(w.xn, (void *)x, nullptr, norm, m, hidden, eps, stream));
        xn = w.xn;
    }
    GemmArgs g = {};
    g.a = xn, g.out = w.logits, g.m = m, g.n = n_experts, g.k = (int32_t)hidden, g.top_k = top_k;
    if (m <= ROUTER_GEMV_ROWS) {
        PG_CUDA_TRY(pg_launch_pdl(moe_router_gemv, dim3(pg_ceil_div(n_experts, 8)), dim3(256), 0, st, xn,
                                  (const bf16 *)router, w.logits, (int)m, n_experts, (int32_t)hidden));
    } else {
        PG_CUDA_TRY((launch_gemm_bm<ROUTER, false>(bm, (unsigned)pg_ceil_div(m, bm), n_experts, g, rt, st)));
    }
    PG_CUDA_TRY(pg_launch_pdl(moe_route, dim3(pg_ceil_div(m, 4)), dim3(128), 0, st, (const float *)w.logits, m,
                              n_experts, top_k, renorm, w.sel, w.sel_w));
    PG_CUDA_TRY(pg_launch_pdl(moe_align, dim3(1), dim3(1024), 0, st, (const int32_t *)w.sel, m * top_k, n_experts, bm,
                              held, w.sorted, w.pair_pos, w.tile_expert, w.n_tiles));
    const int64_t mt = max_tiles(m, n_experts, top_k, bm);
    g = GemmArgs{};
    g.a = xn, g.sorted = w.sorted, g.n_tiles = w.n_tiles, g.tile_expert = w.tile_expert, g.out = w.h;
    g.n = (int32_t)ffn, g.k = (int32_t)hidden, g.top_k = top_k;
    PG_CUDA_TRY((launch_experts<GATE_UP>(f8, bm, (unsigned)mt, ffn, g, gu, st)));
    g.a = w.h, g.out = w.y, g.n = (int32_t)hidden, g.k = (int32_t)ffn;
    PG_CUDA_TRY((launch_experts<DOWN>(f8, bm, (unsigned)mt, hidden, g, dn, st)));
    PG_CUDA_TRY(pg_launch_pdl(moe_combine, dim3((unsigned)m), dim3(128), 0, st, (bf16 *)out, (const bf16 *)x,
                              (const bf16 *)w.y, (const int32_t *)w.sel, (const float *)w.sel_w,
                              (const int32_t *)w.pair_pos, hidden, top_k, accumulate));
    return 0;
}

int pg_cuda_moe_ffn(void *out, const void *x, int64_t m, int64_t hidden, int64_t ffn, const void *norm, float eps,
                    const void *router, const void *const *gate_up, const void *const *down, int32_t n_experts,
                    int32_t top_k, int renorm, int accumulate, void *ws, size_t ws_bytes, void *stream) {
    return moe_ffn(out, x, m, hidden, ffn, norm, eps, router, gate_up, nullptr, down, nullptr, n_experts, top_k,
                   renorm, accumulate, ws, ws_bytes, stream);
}

int pg_cuda_moe_ffn_fp8(void *out, const void *x, int64_t m, int64_t hidden, int64_t ffn, const void *norm,
                        float eps, const void *router, const void *const *gate_up,
                        const float *const *gate_up_scales, const void *const *down,
                        const float *const *down_scales, int32_t n_experts, int32_t top_k, int renorm,
                        int accumulate, void *ws, size_t ws_bytes, void *stream) {
    PG_ARG(gate_up_scales && down_scales, "cuda moe_ffn: FP8 experts without scale arrays");
    return moe_ffn(out, x, m, hidden, ffn, norm, eps, router, gate_up, gate_up_scales, down, down_scales, n_experts,
                   top_k, renorm, accumulate, ws, ws_bytes, stream);
}

int pg_cuda_moe_routing(int32_t *sel, float *wts, const void *ws, int64_t m, int64_t hidden, int64_t ffn,
                        int32_t n_experts, int32_t top_k, void *stream) {
    PG_ARG(sel && wts && ws && m >= 0, "cuda moe_routing: a null pointer");
    Ws w;
    carve(&w, (char *)ws, m, hidden, ffn, n_experts, top_k, 64); // sel and sel_w do not depend on the tile height
    cudaStream_t st = pg_stream(stream);
    PG_CUDA_TRY(cudaMemcpyAsync(sel, w.sel, sizeof(int32_t) * m * top_k, cudaMemcpyDeviceToHost, st));
    PG_CUDA_TRY(cudaMemcpyAsync(wts, w.sel_w, sizeof(float) * m * top_k, cudaMemcpyDeviceToHost, st));
    PG_CUDA_TRY(cudaStreamSynchronize(st));
    return 0;
}
