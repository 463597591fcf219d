// kernels/cuda/attention_common.cuh - what the paged attention kernels share:
// tile constants, PTX wrappers, the e4m3 conversions, the kernel parameters,
// the KV tile loader, pipeline and online-softmax step, the split-decode
// arrival counters and the split plan.
//
// Included by attention.cu, which also #includes attention_decode_kn.cuh:
// all library attention kernels are one translation unit, because
// g_split_count must be ONE device array (the split launches of every decode
// kernel rely on it being zero between launches) and the CUDA objects are
// compiled without -rdc (no cross-file __device__ variables). bench/cuda/'s
// decode v1/v3 include it too (in the bench and test programs); they never
// touch g_split_count.
#pragma once
#include <cuda_fp16.h>
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"

namespace {

using namespace pg_ptx;

constexpr int KT = PG_CUDA_DECODE_TILE_KEYS; // keys per KV tile (kernels/cuda/cuda_ops.h)
constexpr int NTHREADS = 128; // 4 warps

// --- PTX wrappers: cuda_common.cuh's (cp.async, ldmatrix, mma.sync, e4m3), and the
// transposed ldmatrix only the attention uses ------------------------------------

__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                          uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// Split decode: one arrival counter per (sequence x KV head x row tile) item
// of a launch, per device (zero at module load). The last CTA of an item
// to arrive combines its splits and puts the counter back to zero, so every
// launch starts from zeros (graph replays included). Launches that split
// must not run concurrently on one device (the runner has one stream).
// PDL keeps that true: a decode launch may start before its predecessor
// kernel P ends, but every CTA executes griddepcontrol.wait before its first
// access to the counters, and that wait returns only once P has completed.
// P is itself a PDL kernel that waited for its own predecessor before
// completing (or a plain launch, which started after it), and so on back to
// the previous decode launch: all kernels between two decode launches wait
// on every path (cuda_common.cuh), so the earlier launch has completed,
// counters back at zero, before any CTA of the later one touches them. Two
// decode launches back to back are the one-step case of the same argument.
constexpr int SPLIT_ITEMS = 16384;
__device__ unsigned int g_split_count[SPLIT_ITEMS];

struct AttnParams {
    bf16 *out;                 // [n_tokens][n_heads][HD]
    const bf16 *q;             // [n_tokens][q_stride]
    int64_t q_stride;
    const bf16 *k_cache, *v_cache; // bf16, or e4m3 bytes in the F8 kernels
    const int32_t *block_tables;
    int64_t bt_stride;
    const int32_t *seq_lens;   // decode: keys per sequence (query row s)
    const int32_t *cu_q;       // prefill: [n_seqs + 1] query row starts
    const int32_t *start_pos;  // prefill: position of each sequence's first query
    int n_heads, n_kv, group, bs_shift;
    float scale_log2;          // softmax scale * log2(e): exp2 throughout
    int tiles_per_split;       // KV tiles per split when gridDim.z > 1
    float *part_o;             // [n_tokens][n_heads][max_splits][HD] normalized partial O
    float *part_lse;           // [n_tokens][n_heads][max_splits] log2-sum-exp of the split
    int max_splits;
    const float *kv_scales;    // fp8 KV: this layer's [2][n_kv] K then V scales (pg_kv_shape.scales); null: 1
    int window;                // > 0: a query at position p sees keys (p - window, p] (pg_kv_shape.window)
    float softcap2;            // > 0: scores v (base 2) become softcap2 * tanh(v / softcap2); softcap * log2(e)
};

// The first key a query at position pos sees: 0, or in a sliding-window
// layer pos - window + 1. Keys before it are never loaded (zero-filled:
// their blocks may have been given back, docs/kv_layer_groups.md) and
// always masked.
__device__ __forceinline__ int window_first_key(const AttnParams &p, int pos) {
    return p.window > 0 ? max(0, pos - p.window + 1) : 0;
}
// Whether key t is outside the window of the query at pos (t <= pos is the caller's).
__device__ __forceinline__ bool before_window(const AttnParams &p, int t, int pos) {
    return p.window > 0 && t <= pos - p.window;
}
// Gemma 2's soft-capping of a score in base-2 units: with C = cap * log2(e),
// cap * tanh(s / cap) * log2(e) = C * tanh(v / C) for v = s * log2(e).
//
// Windows and caps cost the kernels a few instructions a tile and a chunk
// (session 16, H200: W2 -1.3%), so each kernel takes them under a template
// flag WC ("window or cap"), instantiated both ways; the launchers pick WC
// = window > 0 || softcap > 0, and the plain instantiation is the code
// that ran before. Kernels call capped_score in a loop of its own under one
// `p.softcap2 > 0` branch a tile.
__device__ __forceinline__ float capped_score(const AttnParams &p, float v) {
    return p.softcap2 * tanhf(v / p.softcap2);
}

// The fp8 KV scales of KV head kvh: K's multiplies the softmax scale
// (q . (s k) = s (q . k)), V's the output's normalisation (sum p (s v) = s
// sum p v), so the tiles stay raw e4m3 codes and nothing per element changes.
__device__ __forceinline__ float kv_k_scale(const AttnParams &p, int kvh) {
    return p.kv_scales ? p.kv_scales[kvh] : 1.0f;
}
__device__ __forceinline__ float kv_v_scale(const AttnParams &p, int kvh) {
    return p.kv_scales ? p.kv_scales[p.n_kv + kvh] : 1.0f;
}

// Key t of a sequence in the paged cache, in (slot, KV head) rows: its
// block from the block table bt, its slot in the block, then head kvh of
// n_kv. Every tile loader addresses its 16-byte chunks from this.
__device__ __forceinline__ size_t kv_row(const int32_t *bt, int bs_shift, int t, int n_kv, int kvh) {
    const int64_t slot = ((int64_t)bt[t >> bs_shift] << bs_shift) + (t & ((1 << bs_shift) - 1));
    return (size_t)slot * n_kv + kvh;
}

// --- the KV tile pipeline ----------------------------------------------------------------
//
// Every attention kernel streams the KV tiles of one (sequence, KV head)
// through shared memory the same way: 16-byte cp.async chunks addressed
// through the block table per chunk (zero-filled past kv_end), a multistage
// pipeline (STAGES - 1 tiles in flight while one is used), and an online
// softmax in base 2. These are that one copy; each kernel keeps its own
// fragment layout and mma code (S, P.V, the merge).

// Slot of 16-byte chunk c in key row r of a tile with CPR chunks per row, so
// the 8 rows one ldmatrix reads land in 8 different 16-byte bank groups.
// Rows of 128 bytes or more: c ^ (r & 7); 64-byte rows (fp8, head_dim 64)
// pair up in 128 bytes: c ^ ((r >> 1) & 3).
template <int CPR> __device__ __forceinline__ int swz_chunk(int r, int c) {
    return CPR >= 8 ? c ^ (r & 7) : c ^ ((r >> 1) & 3);
}

// One KV tile (keys [tile * KT, tile * KT + KT) of KV head kvh) from the
// caches kc, vc into ks, vs: elements of type T (bf16, or the e4m3 bytes),
// EPR per key row. Thread x issues chunks x, x + NTHREADS, ...; chunk c of
// key row r lands at r * EPR + swz_chunk(r, c) chunks (LINEAR: at chunk
// r * CPR + c, for a raw stage that only its loading thread reads back).
// Keys at or past kv_end, and with WIN keys before kv_begin (outside a
// sliding window), are zero-filled and their block table entries never
// read. Called by every thread; the caller commits the group.
template <typename T, int EPR, bool LINEAR = false, bool WIN = false>
__device__ __forceinline__ void load_kv_tile(const AttnParams &p, const T *kc, const T *vc, T *ks, T *vs,
                                             const int32_t *bt, int kvh, int tile, int kv_begin, int kv_end) {
    constexpr int EPC = 16 / (int)sizeof(T); // elements per 16-byte chunk
    constexpr int CPR = EPR / EPC;           // chunks per key row
    static_assert(EPR % EPC == 0 && KT * CPR % NTHREADS == 0, "tile load");
#pragma unroll
    for (int i = 0; i < KT * CPR / NTHREADS; i++) {
        int chunk = threadIdx.x + i * NTHREADS;
        int r = chunk / CPR, c = chunk % CPR;
        int t = tile * KT + r;
        bool valid = (!WIN || t >= kv_begin) && t < kv_end;
        const T *kp = kc, *vp = vc;
        if (valid) {
            size_t off = kv_row(bt, p.bs_shift, t, p.n_kv, kvh) * EPR + c * EPC;
            kp += off;
            vp += off;
        }
        int so = LINEAR ? chunk * EPC : r * EPR + swz_chunk<CPR>(r, c) * EPC;
        cp_async16(smem_u32(ks + so), kp, valid);
        cp_async16(smem_u32(vs + so), vp, valid);
    }
}

// The multistage pipeline over tiles [t_begin, t_end), STAGES - 1 tiles in
// flight while one is used; load(tile, stage) issues a tile's copies into
// a stage. Each kernel writes its loop as
//   kv_pipeline_start<STAGES>(t_begin, t_end, load);
//   for (int tile = t_begin; tile < t_end; tile++) {
//       kv_pipeline_wait<STAGES>();
//       if (tile + STAGES - 1 < t_end) load(tile + STAGES - 1, its stage);
//       cp_async_commit();
//       ... read the tile from its stage ...
//   }
//   cp_async_wait<0>();
// with its own stage arithmetic. (The issue step stays in the kernel: moved
// into a helper, v4 and prefill v2 compiled to other instructions.) Commit
// groups issued before the start (a q tile) complete with the first tile.
template <int STAGES, typename Load>
__device__ __forceinline__ void kv_pipeline_start(int t_begin, int t_end, Load &&load) {
    static_assert(STAGES >= 2, "pipeline depth");
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {
        if (t_begin + i < t_end) load(t_begin + i, i);
        cp_async_commit();
    }
}
// Returns once every thread's copies of the loop's current tile have landed;
// the barrier also frees the stage the previous iteration read, which the
// next issue reuses.
template <int STAGES> __device__ __forceinline__ void kv_pipeline_wait() {
    cp_async_wait<STAGES - 2>(); // this thread's copies of the tile landed
    __syncthreads();             // everyone's did; the stage read last iteration is free
}

// v = max over the lanes l ^ X... of v (the lanes holding the same softmax
// row: xor 1, 2 for row-major fragments, 4, 8, 16 for v4's columns).
template <int... X> __device__ __forceinline__ float max_xor_lanes(float v) {
    ((v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, X))), ...);
    return v;
}

// The online-softmax step of one row (base 2) once tmax, the row's max
// over the new keys, is known: m_use is the max to subtract from them (0
// while every key so far is masked, so exp2 gives 0, not NaN), corr the
// factor that rescales the old l (done here) and O (the caller's layout).
__device__ __forceinline__ void softmax_rescale(float tmax, float &m, float &l, float &m_use, float &corr) {
    const float m_new = fmaxf(m, tmax);
    m_use = m_new == -INFINITY ? 0.0f : m_new;
    corr = exp2f(m - m_use);
    m = m_new;
    l *= corr;
}

// Row-major mma fragments (decode v2, prefill v1/v2: the thread's rows are
// lane/4 and lane/4 + 8, elements 0, 1 and 2, 3 of each 16x8 tile): the
// row maxima of s reduced over the quad, the rescale, P = exp2(s - m_use)
// in place with its sums into l, and O rescaled.
template <int NT, int ONT>
__device__ __forceinline__ void softmax_rows(float (&s)[NT][4], float (&o)[ONT][4], float tmax[2], float m[2],
                                             float l[2]) {
    float m_use[2], corr[2];
#pragma unroll
    for (int i = 0; i < 2; i++) softmax_rescale(max_xor_lanes<1, 2>(tmax[i]), m[i], l[i], m_use[i], corr[i]);
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float pv = exp2f(s[j][e] - m_use[e >> 1]);
            s[j][e] = pv;
            l[e >> 1] += pv;
        }
    }
#pragma unroll
    for (int n = 0; n < ONT; n++) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
    }
}

// Flash decoding, after every thread of a split CTA stored its partial
// (normalized O, log2-sum-exp) rows: the stores are made visible device-wide
// (each thread fences its own) before thread 0 counts the CTA's arrival on
// g_split_count[item]; the last of the item's n_parts splits resets the
// counter (ready for the next launch) and combines every split's partials
// of output rows [out_row0, out_row0 + n_rows) into out, reading them from
// L2. Decode v2 and v4. Called by every thread of the CTA.
template <int HD>
__device__ void split_arrive_and_combine(const AttnParams &p, unsigned item, int n_parts, int *sm_last,
                                         size_t out_row0, int n_rows) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int *cnt = &g_split_count[item];
        const bool last = atomicAdd(cnt, 1u) + 1u == (unsigned int)n_parts;
        if (last) atomicExch(cnt, 0u); // every split of the item has arrived
        *sm_last = last;
    }
    __syncthreads();
    if (!*sm_last) return;
    __threadfence();
    for (int idx = threadIdx.x; idx < n_rows * HD / 2; idx += NTHREADS) {
        const int c = (idx % (HD / 2)) * 2;
        const size_t oi = out_row0 + idx / (HD / 2);
        const float *lse = p.part_lse + oi * p.max_splits;
        const float *po = p.part_o + oi * p.max_splits * HD + c;
        float mx = -INFINITY;
        for (int z = 0; z < n_parts; z++) mx = fmaxf(mx, __ldcg(lse + z));
        float2 acc = make_float2(0.0f, 0.0f);
        float wsum = 0.0f;
        for (int z = 0; z < n_parts; z++) {
            float lz = __ldcg(lse + z);
            float w = lz == -INFINITY ? 0.0f : exp2f(lz - mx);
            float2 v = __ldcg(reinterpret_cast<const float2 *>(po + (size_t)z * HD));
            acc.x += w * v.x;
            acc.y += w * v.y;
            wsum += w;
        }
        float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
        *reinterpret_cast<__nv_bfloat162 *>(p.out + oi * HD + c) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    }
}

// --- split planning (host) ---------------------------------------------------------------

int log2_exact(int x) {
    if (x <= 0 || (x & (x - 1))) return -1;
    int s = 0;
    while ((1 << s) < x) s++;
    return s;
}

struct SplitPlan {
    int n_splits;        // grid z
    int tiles_per_split; // KV tiles of 64 keys per split
};

// The split plan minimizes a cost model of one launch, in units of the time
// one CTA slot (SMs x resident CTAs) takes to stream one bf16 tile at its
// share of the bandwidth when every slot is busy:
//   per CTA  tiles * (bytes per element / 2) + SPLIT_OVH (first block-table
//            read and tile latency, the warp merge, the partial write);
//   waves    full waves cost per CTA each; a last partial wave of `rem`
//            CTAs runs faster (rem / slots of a wave) but a CTA alone streams
//            at most SPLIT_RHO times its full-load share;
//   combine  the last CTA of an item reads splits * rows fp32 partials.
// The old plan (about 8 waves of 4-tile splits) spent a third of the time
// of batch 16 x 4096 in CTA start-ups and the second (reduce) launch; this
// one gives 2 splits of 32 tiles (256 CTAs, one wave) there, no split at
// batch >= 64 x 4096, and ~200 CTAs for one long sequence.
constexpr int MAX_SPLITS = PG_CUDA_DECODE_MAX_SPLITS;
constexpr double SPLIT_OVH = 2.0;  // from the H200 runs: 4-tile splits reached 65% of the wave-limited rate
constexpr double SPLIT_RHO = 1.25; // assumed, not measured

SplitPlan plan_decode(int n_seqs, int n_kv, int row_tiles, int group, int max_seq_len, int sms, int ctas_per_sm,
                      bool fp8) {
    SplitPlan pl = {1, 1 << 30};
    const int max_tiles = max_seq_len > 0 ? (max_seq_len + KT - 1) / KT : 1;
    const int64_t base = (int64_t)n_seqs * n_kv * row_tiles;
    if (max_tiles < 2 || base < 1 || base > SPLIT_ITEMS) return pl; // the counters cover SPLIT_ITEMS items
    const double slots = (double)sms * ctas_per_sm, tile_w = fp8 ? 0.5 : 1.0;
    const double rows = group < 16 ? group : 16;
    double best = 0.0;
    int best_n = 1, best_tps = max_tiles;
    const int n_max = max_tiles < MAX_SPLITS ? max_tiles : MAX_SPLITS;
    for (int n = 1; n <= n_max; n++) {
        const int tps = (max_tiles + n - 1) / n;
        if ((max_tiles + tps - 1) / tps != n) continue; // the same plan as a smaller n
        const double ctas = (double)base * n, full = floor(ctas / slots), rem = ctas - full * slots;
        const double per = tps * tile_w + SPLIT_OVH + (n > 1 ? rows / 64.0 : 0.0);
        double c = full * per + (rem > 0 ? per * fmax(1.0 / SPLIT_RHO, rem / slots) : 0.0);
        if (n > 1) c += n * rows / 64.0 / SPLIT_RHO;
        if (n == 1 || c < best * (1.0 - 1e-9)) { // ties: fewer splits
            best = c;
            best_n = n;
            best_tps = tps;
        }
    }
    if (best_n > 1) {
        pl.n_splits = best_n;
        pl.tiles_per_split = best_tps;
    }
    return pl;
}

size_t split_ws_bytes(int n_seqs, int n_heads, int head_dim, int n_splits) {
    return pg_cuda_decode_split_ws_bytes((int64_t)n_seqs * n_heads * n_splits, head_dim);
}

// What every launch of the AttnParams kernels (decode v2/v4, prefill v1/v2)
// fills alike; the caller adds lengths, splits or query ranges.
inline AttnParams attn_params(void *out, const void *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                              pg_kv_shape kv, const int32_t *block_tables, int32_t bt_stride, int32_t n_heads,
                              float scale) {
    AttnParams p = {};
    p.out = (bf16 *)out;
    p.q = (const bf16 *)q;
    p.q_stride = q_stride;
    p.k_cache = (const bf16 *)k_cache;
    p.v_cache = (const bf16 *)v_cache;
    p.block_tables = block_tables;
    p.bt_stride = bt_stride;
    p.n_heads = n_heads;
    p.n_kv = kv.n_kv_heads;
    p.group = n_heads / kv.n_kv_heads;
    p.bs_shift = log2_exact(kv.block_size);
    p.scale_log2 = scale * 1.4426950408889634f; // softmax in base 2
    p.kv_scales = kv.dtype == PG_KV_FP8_E4M3 ? kv.scales : nullptr;
    p.window = kv.window;
    p.softcap2 = kv.softcap > 0.0f ? kv.softcap * 1.4426950408889634f : 0.0f;
    return p;
}

// The parameters of a decode launch (v2 and v4; grid z = .max_splits): the
// split plan for the kernel's occupancy, then fewer, longer splits while
// the workspace is too small (never an error). row_tiles: 16-row tiles of
// the GQA group per CTA (v2), 1 for v4.
inline AttnParams decode_params(void *out, const void *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                                pg_kv_shape kv, const int32_t *block_tables, int32_t bt_stride,
                                const int32_t *seq_lens, int32_t n_seqs, int32_t n_heads, float scale,
                                int32_t max_seq_len, void *workspace, size_t workspace_bytes, int row_tiles,
                                int ctas_per_sm, bool f8) {
    const int G = n_heads / kv.n_kv_heads, HD = kv.head_dim;
    // A sliding window reads at most window + 2 KT - 1 keys of any length
    // (its first and last tiles partly): split that span, not the context.
    if (kv.window > 0 && max_seq_len > kv.window + 2 * KT) max_seq_len = kv.window + 2 * KT;
    SplitPlan pl = plan_decode(n_seqs, kv.n_kv_heads, row_tiles, G, max_seq_len, pg_cuda_sm_count(), ctas_per_sm, f8);
    while (pl.n_splits > 1 && (!workspace || split_ws_bytes(n_seqs, n_heads, HD, pl.n_splits) > workspace_bytes)) {
        int max_tiles = (max_seq_len + KT - 1) / KT;
        int splits = pl.n_splits / 2;
        pl.tiles_per_split = (max_tiles + splits - 1) / splits;
        pl.n_splits = splits > 1 ? (max_tiles + pl.tiles_per_split - 1) / pl.tiles_per_split : 1;
    }
    AttnParams p = attn_params(out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride, n_heads, scale);
    p.seq_lens = seq_lens;
    p.tiles_per_split = pl.tiles_per_split;
    p.max_splits = pl.n_splits;
    if (pl.n_splits > 1) {
        uintptr_t base = ((uintptr_t)workspace + 255) & ~(uintptr_t)255;
        p.part_o = (float *)base;
        p.part_lse = p.part_o + (size_t)n_seqs * n_heads * pl.n_splits * HD;
    }
    return p;
}

} // namespace
