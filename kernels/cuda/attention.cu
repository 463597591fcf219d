// kernels/cuda/attention.cu - paged attention over the bf16 KV cache.
//
// Versions (the CPU reference is kernels/cpu/attention.c; the test
// tests/gpu/test_cuda_kernels.cu compares both against fp64):
//   v1  (bench/cuda/attention_decode_v1.cuh: the CUDA-core baseline; not
//       in the library, pg_cuda_paged_decode_attention_v(1) is PG_EUNSUPP)
//   v2  FlashAttention-2 on tensor cores (mma.sync m16n8k16 bf16 -> fp32),
//       one kernel template for decode and prefill. A CTA owns a tile of
//       rows packed as (query position, head of the GQA group), so one
//       KV tile in shared memory serves every query head of the group, and
//       a range of KV tiles (all of them, or one split of flash decoding).
//       KV tiles of 64 keys stream through a multistage cp.async pipeline
//       of 16-byte loads (zero-filled past the end), XOR-swizzled so
//       ldmatrix is free of bank conflicts (the loader, the pipeline and
//       the softmax step are attention_common.cuh's). S = Q K^T and O += P V in registers, P
//       re-packed from the S accumulators as the A operand (no smem trip).
//       decode  (NT = 2): 16 rows; the 4 warps split each 64-key tile
//               (16 keys each) and merge their (m, l, O) at the end;
//               split-K over CTAs for long contexts or small batches; the
//               last CTA of a (sequence, KV head) to finish combines the
//               splits (an atomic count per item, no second launch).
//       prefill (NT = 8): 64 rows, one 16-row group per warp, each warp
//               walks all 64 keys of the tile; causal mask per row.
//   v3  (bench/cuda/attention_decode_v3.cuh: persistent, tile-balanced,
//       measured slower; not in the library either)
//   v4  decode for GQA groups <= 8 on sm_89+ (attention_decode_kn.cuh,
//       #included below): keys on the mma's M side, the group's heads on
//       N (S^T = K Q^T, O^T = V^T P^T), fp8 fragments converted straight
//       from the raw e4m3 tile (cvt.rn.f16x2.e4m3x2, f16 mma), v2's
//       pipeline, splits and combine. The default for both KV dtypes where
//       it applies (measured faster than v2 at every W5 point; fp8 1.7-1.9x
//       bf16 v2's KV tokens/s at batch >= 16 x 4096).
//   fp8 KV (e4m3, scale 1) in v2 and prefill: the same kernels with F8 =
//       true. 16-byte cp.async loads carry 16 elements into a raw byte
//       stage; each thread converts the chunks it loaded to bf16 (exact)
//       into one bf16 tile in the layout above, and the math is unchanged.
//   head_dim 64, 128 and 256 (Gemma 3 270M-12B) in every kernel but
//       prefill v2, whose 32 rows a warp would hold 256 output floats a
//       thread at 256: the default prefill there is v1.
//   sliding windows and soft-capping (Mistral, Gemma 2/3; pg_kv_shape.window
//       and .softcap) in every kernel: a CTA starts at the tile of its first
//       row's window (splits divide the tiles from there), keys before a
//       row's window are masked like keys after it, and a capped score is
//       capped before the mask and the softmax.
// Shared pieces (PTX wrappers, AttnParams, split counters and plan, the KV
// tile loader, pipeline and online-softmax step): attention_common.cuh.
#include <math.h>

#include <atomic>

#include "kernels/cuda/attention_common.cuh"

namespace {

// Defaults, from the H200 measurements in docs/cuda_kernels.md: decode v2
// (v3, now in bench/cuda/, measured at ~53% of read bandwidth against v2's
// 85-97%), prefill v2.
// Decode v4 is the default wherever it applies (GQA group <= 8, sm_89+):
// for fp8 always; for bf16 while DECODE_BF16_KN (v4 measured 1-18% faster
// than v2 at every W5 point, docs/cuda_kernels.md).
constexpr int DECODE_DEFAULT_VERSION = 2;
constexpr bool DECODE_BF16_KN = true;
constexpr int PREFILL_DEFAULT_VERSION = 2;
// Pipeline depth: decode streams KV and keeps two tiles in flight per CTA;
// prefill reuses each tile for 64 rows and keeps registers for the math.
// fp8 decode keeps three (half-size) tiles in flight for the same shared memory.
__host__ __device__ constexpr int attn_stages(int nt, bool f8 = false) { return nt == 2 ? (f8 ? 4 : 3) : 2; }
// Resident CTAs per SM asked of the compiler (caps registers at 168 / 255).
__host__ __device__ constexpr int attn_min_blocks(int nt) { return nt == 2 ? 2 : 2; }

// --- v2: tensor-core paged attention -------------------------------------------------

// fp8: one bf16 K/V tile (the converted copy the math reads) before the raw stages.
template <int HD>
__host__ __device__ constexpr int cvt_tile_bytes() {
    return 2 * KT * HD * (int)sizeof(bf16);
}

template <int HD, int NT, bool F8 = false>
__host__ __device__ constexpr int attn_smem_bytes() {
    return F8 ? cvt_tile_bytes<HD>() + attn_stages(NT, true) * 2 * KT * HD
              : attn_stages(NT) * 2 * KT * HD * (int)sizeof(bf16);
}

// Stage st of the v2 and prefill kernels (attention_common.cuh's loader):
// bf16, the swizzled tile [K: KT][HD][V: KT][HD] at stages + st * 2 KT HD;
// F8, the raw stage [K: KT * HD bytes][V: KT * HD bytes] in chunk order at
// raw8 + st * 2 KT HD (each thread reads back only what it loaded, so its
// own cp.async wait is the only ordering the conversion needs).
template <int HD, bool F8, bool WC>
__device__ __forceinline__ void f8_or_bf16_load_tile(const AttnParams &p, bf16 *stages, unsigned char *raw8, int st,
                                                     const int32_t *bt, int kvh, int tile, int kv_begin, int kv_end) {
    if constexpr (F8) {
        unsigned char *raw = raw8 + st * 2 * KT * HD;
        load_kv_tile<unsigned char, HD, true, WC>(p, reinterpret_cast<const unsigned char *>(p.k_cache),
                                              reinterpret_cast<const unsigned char *>(p.v_cache), raw, raw + KT * HD,
                                              bt, kvh, tile, kv_begin, kv_end);
    } else {
        bf16 *ks = stages + st * 2 * KT * HD;
        load_kv_tile<bf16, HD, false, WC>(p, p.k_cache, p.v_cache, ks, ks + KT * HD, bt, kvh, tile, kv_begin, kv_end);
    }
}
// Raw stage -> the bf16 tile [K: KT][HD][V: KT][HD], swizzled as the bf16
// loads are (16-byte chunk c of row r at c ^ (r & 7)).
template <int HD>
__device__ __forceinline__ void f8_convert_tile(const unsigned char *raw, bf16 *cvt) {
    constexpr int CPR8 = HD / 16;
#pragma unroll
    for (int i = 0; i < KT * CPR8 / NTHREADS; i++) {
        int chunk = threadIdx.x + i * NTHREADS;
        int r = chunk / CPR8, c = chunk % CPR8;
#pragma unroll
        for (int kv = 0; kv < 2; kv++) {
            uint4 in = *reinterpret_cast<const uint4 *>(raw + kv * KT * HD + chunk * 16), lo, hi;
            e4m3x16_to_bf16(in, lo, hi);
            bf16 *row = cvt + kv * KT * HD + r * HD;
            *reinterpret_cast<uint4 *>(row + (((2 * c) ^ (r & 7)) * 8)) = lo;
            *reinterpret_cast<uint4 *>(row + (((2 * c + 1) ^ (r & 7)) * 8)) = hi;
        }
    }
}

template <int HD, int NT, bool F8, bool WC>
__global__ void __launch_bounds__(NTHREADS, attn_min_blocks(NT)) paged_attn_mma_kernel(const AttnParams p) {
    constexpr int CPR = HD / 8;  // 16-byte chunks per key row
    constexpr int TG = 8 / NT;   // warps splitting the keys of a tile
    constexpr int RG = 4 / TG;   // 16-row groups per CTA
    constexpr int ROWS = 16 * RG;
    constexpr int KSTEPS = HD / 16;
    constexpr int ONT = HD / 8;  // n-tiles of the output
    constexpr int STAGES = attn_stages(NT, F8);
    static_assert(HD == 64 || HD == 128 || HD == 256, "head_dim");
    static_assert(KT * CPR % NTHREADS == 0, "tile load");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *smem = reinterpret_cast<bf16 *>(smem_raw);
    // PDL (decode launches; a no-op for the plain prefill launch): q, the
    // KV cache (the new token's row comes from rope_kv_write), lengths and
    // block tables may be earlier kernels' output. Every CTA waits before
    // anything else, including the ones that leave early below.
    pg_pdl_wait();
    pg_pdl_trigger();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rg = warp / TG, tg = warp % TG;
    const int seq = blockIdx.x / p.n_kv, kvh = blockIdx.x % p.n_kv;
    const int G = p.group;
    const float sl2 = p.scale_log2 * kv_k_scale(p, kvh), vsc = kv_v_scale(p, kvh);
    int q_start, n_q, kv_total;
    if (p.cu_q) {
        q_start = p.cu_q[seq];
        n_q = p.cu_q[seq + 1] - q_start;
        kv_total = p.start_pos[seq] + n_q;
    } else {
        q_start = seq;
        n_q = 1;
        kv_total = p.seq_lens[seq];
    }
    const int rows_total = n_q * G;
    // Prefill: the last row tiles attend to the most keys; start them first
    // so the long CTAs do not form the tail of the grid.
    const int row_tile = TG == 1 ? (int)(gridDim.y - 1 - blockIdx.y) : (int)blockIdx.y;
    const int row0 = row_tile * ROWS;
    if (row0 >= rows_total) return;
    const int last_row = min(row0 + ROWS, rows_total) - 1;
    // Keys this CTA needs: up to the position of its last row (causal),
    // from the window of its first row (a sliding-window layer).
    const int kv_end = kv_total - n_q + last_row / G + 1;
    const int kv_begin = WC ? window_first_key(p, kv_total - n_q + row0 / G) : 0;
    const int n_tiles = kv_end > 0 ? (kv_end + KT - 1) / KT : 0;
    const int t_lo = kv_begin / KT; // < n_tiles when n_tiles > 0
    int t_begin = t_lo, t_end = n_tiles;
    const bool split = gridDim.z > 1;
    if (n_tiles == 0) { // no keys (a decode sequence of length 0): zero rows, never NaN
        if (!split || blockIdx.z == 0)
            for (int idx = threadIdx.x; idx < ROWS * HD; idx += NTHREADS) {
                int r = row0 + idx / HD;
                if (r < rows_total)
                    p.out[((size_t)(q_start + r / G) * p.n_heads + kvh * G + r % G) * HD + idx % HD] =
                        __float2bfloat16(0.0f);
            }
        return;
    }
    // Splits of this sequence that have keys: z < n_parts. A sequence
    // that fits in one split writes its output directly.
    int n_parts = 1;
    if (split) {
        t_begin = t_lo + blockIdx.z * p.tiles_per_split;
        t_end = min(n_tiles, t_begin + p.tiles_per_split);
        if (t_begin >= t_end) return; // not counted: n_parts below excludes it
        // (clamped to the grid: a length past max_seq_len must not leave a
        // counter short of its target for the next launch)
        n_parts = min((n_tiles - t_lo + p.tiles_per_split - 1) / p.tiles_per_split, (int)gridDim.z);
    }
    const bool partial = n_parts > 1;

    // This thread's two rows of the mma fragments, their positions and q.
    int pos[2];
    bool row_ok[2];
    uint32_t qa[KSTEPS][4];
    {
        const bf16 *qp[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = row0 + rg * 16 + lane / 4 + 8 * i;
            row_ok[i] = r < rows_total;
            int rr = row_ok[i] ? r : last_row;
            int qi = rr / G, g = rr % G;
            pos[i] = kv_total - n_q + qi;
            qp[i] = p.q + (size_t)(q_start + qi) * p.q_stride + (size_t)(kvh * G + g) * HD;
        }
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            int c = kk * 16 + (lane % 4) * 2;
            qa[kk][0] = row_ok[0] ? *reinterpret_cast<const uint32_t *>(qp[0] + c) : 0u;
            qa[kk][1] = row_ok[1] ? *reinterpret_cast<const uint32_t *>(qp[1] + c) : 0u;
            qa[kk][2] = row_ok[0] ? *reinterpret_cast<const uint32_t *>(qp[0] + c + 8) : 0u;
            qa[kk][3] = row_ok[1] ? *reinterpret_cast<const uint32_t *>(qp[1] + c + 8) : 0u;
        }
    }

    const int32_t *bt = p.block_tables + (size_t)seq * p.bt_stride;
    unsigned char *raw8 = smem_raw + cvt_tile_bytes<HD>(); // F8: the raw stages
    auto load_tile = [&](int tile, int st) {
        f8_or_bf16_load_tile<HD, F8, WC>(p, smem, raw8, st, bt, kvh, tile, kv_begin, kv_end);
    };

    float o[ONT][4];
#pragma unroll
    for (int n = 0; n < ONT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int tok0 = tg * NT * 8; // this warp's keys within a tile

    kv_pipeline_start<STAGES>(t_begin, t_end, load_tile);
    for (int tile = t_begin; tile < t_end; tile++) {
        const int it = tile - t_begin;
        kv_pipeline_wait<STAGES>();
        if (tile + STAGES - 1 < t_end) load_tile(tile + STAGES - 1, (it + STAGES - 1) % STAGES);
        cp_async_commit();
        const bf16 *ks = smem + (it % STAGES) * 2 * KT * HD, *vs = ks + KT * HD;
        if constexpr (F8) { // the barrier above freed the bf16 tile; convert, then share it
            f8_convert_tile<HD>(raw8 + (it % STAGES) * 2 * KT * HD, smem);
            __syncthreads();
            ks = smem;
            vs = smem + KT * HD;
        }

        // S = Q K^T for 16 rows x NT*8 keys.
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk += 2) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int r = tok0 + j * 8 + (lane & 7);
                int c = kk * 2 + (lane >> 3);
                uint32_t b0, b1, b2, b3;
                ldsm_x4(smem_u32(ks + r * HD + ((c ^ (r & 7)) * 8)), b0, b1, b2, b3);
                mma_bf16(s[j], qa[kk], b0, b1);
                mma_bf16(s[j], qa[kk + 1], b2, b3);
            }
        }

        // Online softmax (base 2). Keys past a row's position, or before
        // its window, get -inf.
        const int tbase = tile * KT + tok0;
        const bool need_mask = tbase + NT * 8 - 1 > min(pos[0], pos[1]) ||
                               (WC && before_window(p, tbase, max(pos[0], pos[1])));
        float tmax[2] = {-INFINITY, -INFINITY};
        if constexpr (WC) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] *= sl2;
            if (p.softcap2 > 0.0f) // Gemma 2
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[j][e] = capped_score(p, s[j][e]);
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = WC ? s[j][e] : s[j][e] * sl2; // (WC: scaled and capped above)
                if (need_mask) {
                    int t = tbase + j * 8 + (lane % 4) * 2 + (e & 1);
                    if (t > pos[e >> 1] || (WC && before_window(p, t, pos[e >> 1]))) v = -INFINITY;
                }
                s[j][e] = v;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], v);
            }
        }
        softmax_rows<NT, ONT>(s, o, tmax, m, l);

        // O += P V: P from the S accumulators, V^T fragments by ldmatrix.trans.
#pragma unroll
        for (int k2 = 0; k2 < NT / 2; k2++) {
            uint32_t a[4] = {pack_bf16(s[2 * k2][0], s[2 * k2][1]), pack_bf16(s[2 * k2][2], s[2 * k2][3]),
                             pack_bf16(s[2 * k2 + 1][0], s[2 * k2 + 1][1]),
                             pack_bf16(s[2 * k2 + 1][2], s[2 * k2 + 1][3])};
            int r = tok0 + k2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int c = 0; c < HD / 16; c++) {
                int ch = 2 * c + (lane >> 4);
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(smem_u32(vs + r * HD + ((ch ^ (r & 7)) * 8)), b0, b1, b2, b3);
                mma_bf16(o[2 * c], a, b0, b1);
                mma_bf16(o[2 * c + 1], a, b2, b3);
            }
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }

    auto out_index = [&](int r) { // row -> (token, head) offset in units of HD
        int qi = r / G, g = r % G;
        return (size_t)(q_start + qi) * p.n_heads + kvh * G + g;
    };

    if constexpr (TG == 1) {
        // Each warp owns its rows: normalize and store from the fragments.
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (!row_ok[i]) continue;
            int r = row0 + rg * 16 + lane / 4 + 8 * i;
            float inv = l[i] > 0.0f ? vsc / l[i] : 0.0f;
            bf16 *op = p.out + out_index(r) * HD; // prefill (TG == 1) never splits
#pragma unroll
            for (int n = 0; n < ONT; n++) {
                int c = n * 8 + (lane % 4) * 2;
                *reinterpret_cast<__nv_bfloat162 *>(op + c) =
                    __floats2bfloat162_rn(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
            }
        }
    } else {
        // The TG warps hold partial (m, l, O) of the same 16 rows over
        // different keys: merge them through shared memory (the pipeline
        // has drained; the loop's last barrier ordered every smem read).
        constexpr int RS = HD + 8; // padded row stride (floats)
        float *red = reinterpret_cast<float *>(smem_raw); // [TG][16][RS]
        float *sm_m = red + TG * 16 * RS;                  // [TG][16]
        float *sm_l = sm_m + TG * 16;                      // [TG][16]
        float *sm_lse = sm_l + TG * 16;                    // [16]
        int *sm_last = reinterpret_cast<int *>(sm_lse + 16); // [1]
        static_assert(TG * 16 * RS * 4 + (2 * TG + 2) * 16 * 4 <= attn_smem_bytes<HD, NT, F8>(), "merge smem");
        __syncthreads();
        if (lane % 4 == 0) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                sm_m[tg * 16 + lane / 4 + 8 * i] = m[i];
                sm_l[tg * 16 + lane / 4 + 8 * i] = l[i];
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int rl = lane / 4 + 8 * i;
            float ms = -INFINITY;
#pragma unroll
            for (int w = 0; w < TG; w++) ms = fmaxf(ms, sm_m[w * 16 + rl]);
            float ls = 0.0f;
#pragma unroll
            for (int w = 0; w < TG; w++) {
                float mw = sm_m[w * 16 + rl];
                ls += mw == -INFINITY ? 0.0f : exp2f(mw - ms) * sm_l[w * 16 + rl];
            }
            float f = (m[i] == -INFINITY || ls == 0.0f) ? 0.0f : exp2f(m[i] - ms) / ls;
            float *rp = red + (tg * 16 + rl) * RS;
#pragma unroll
            for (int n = 0; n < ONT; n++) {
                int c = n * 8 + (lane % 4) * 2;
                *reinterpret_cast<float2 *>(rp + c) = make_float2(o[n][2 * i] * f, o[n][2 * i + 1] * f);
            }
            if (tg == 0 && lane % 4 == 0) sm_lse[rl] = ls > 0.0f ? ms + log2f(ls) : -INFINITY;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < 16 * HD / 2; idx += NTHREADS) {
            int rl = idx / (HD / 2), c = (idx % (HD / 2)) * 2;
            int r = row0 + rl;
            if (r >= rows_total) continue;
            float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
            for (int w = 0; w < TG; w++) {
                float2 v = *reinterpret_cast<const float2 *>(red + (w * 16 + rl) * RS + c);
                acc.x += v.x;
                acc.y += v.y;
            }
            acc.x *= vsc;
            acc.y *= vsc;
            size_t oi = out_index(r);
            if (!partial) {
                *reinterpret_cast<__nv_bfloat162 *>(p.out + oi * HD + c) = __floats2bfloat162_rn(acc.x, acc.y);
            } else {
                size_t pi = oi * p.max_splits + blockIdx.z;
                *reinterpret_cast<float2 *>(p.part_o + pi * HD + c) = acc;
                if (c == 0) p.part_lse[pi] = sm_lse[rl];
            }
        }
        if (!partial) return;
        // Stream-K style combine (attention_common.cuh); a decode row tile's
        // rows are consecutive heads of one token.
        split_arrive_and_combine<HD>(p, blockIdx.x * gridDim.y + blockIdx.y, n_parts, sm_last, out_index(row0),
                                     min(ROWS, rows_total - row0));
    }
}

// --- prefill v2: 32 rows per warp ------------------------------------------------------
//
// The 64-row prefill CTA (one 16-row m-tile per warp) reads every K and V
// fragment from shared memory for one mma: ldmatrix traffic, not the
// tensor cores, bounds it. Here each warp owns two m-tiles (32 rows, 128 per
// CTA), so each K/V fragment feeds two mma; q stays in shared memory (its
// fragments are re-read per k-step: registers go to the two S and O tiles).

template <int HD, bool F8 = false>
__host__ __device__ constexpr int pf2_smem_bytes() {
    // q tile + 2 stages of K, V (F8: q tile + the bf16 K, V tile + 2 raw stages)
    return F8 ? 128 * HD * (int)sizeof(bf16) + cvt_tile_bytes<HD>() + 2 * 2 * KT * HD
              : (128 + 2 * 2 * KT) * HD * (int)sizeof(bf16);
}

// Head dims v2 is built for: its 32 rows a warp hold 2 x HD/8 output tiles
// in registers (256 floats a thread at head_dim 256, more than a thread
// has), so head_dim 256 runs v1 (16 rows a warp).
constexpr int PF2_MAX_HD = 128;

template <int HD, bool F8, bool WC>
__global__ void __launch_bounds__(NTHREADS, 1) paged_prefill_v2_kernel(const AttnParams p) {
    constexpr int CPR = HD / 8;
    constexpr int KSTEPS = HD / 16;
    constexpr int NT = KT / 8;
    constexpr int ONT = HD / 8;
    constexpr int ROWS = 128;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *qs = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *stages = qs + ROWS * HD; // F8: the bf16 K, V tile, then the raw stages
    unsigned char *raw8 = smem_raw + ROWS * HD * sizeof(bf16) + cvt_tile_bytes<HD>();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int seq = blockIdx.x / p.n_kv, kvh = blockIdx.x % p.n_kv;
    const int G = p.group;
    const float sl2 = p.scale_log2 * kv_k_scale(p, kvh), vsc = kv_v_scale(p, kvh);
    const int q_start = p.cu_q[seq], n_q = p.cu_q[seq + 1] - q_start, kv_total = p.start_pos[seq] + n_q;
    const int rows_total = n_q * G;
    const int row0 = (int)(gridDim.y - 1 - blockIdx.y) * ROWS; // long (late) row tiles first
    if (row0 >= rows_total) return;
    const int last_row = min(row0 + ROWS, rows_total) - 1;
    const int kv_end = kv_total - n_q + last_row / G + 1;
    const int kv_begin = WC ? window_first_key(p, kv_total - n_q + row0 / G) : 0; // the first row's window
    const int n_tiles = kv_end > 0 ? (kv_end + KT - 1) / KT : 0;
    const int t_lo = kv_begin / KT;

    // q tile: rows past the end zero-filled.
#pragma unroll
    for (int i = 0; i < ROWS * CPR / NTHREADS; i++) {
        int chunk = threadIdx.x + i * NTHREADS;
        int r = chunk / CPR, c = chunk % CPR;
        int gr = row0 + r;
        bool valid = gr < rows_total;
        const bf16 *src = valid ? p.q + (size_t)(q_start + gr / G) * p.q_stride + (size_t)(kvh * G + gr % G) * HD + c * 8
                                : p.q;
        cp_async16(smem_u32(qs + r * HD + ((c ^ (r & 7)) * 8)), src, valid);
    }
    // Rows of this thread: row0 + warp*32 + mt*16 + lane/4 + 8i; positions are
    // recomputed where needed (diagonal tiles), registers go to S and O.
    auto row_pos = [&](int mt, int i) {
        int r = min(row0 + warp * 32 + mt * 16 + lane / 4 + 8 * i, last_row);
        return kv_total - n_q + r / G;
    };
    const int min_pos = row_pos(0, 0), max_pos = row_pos(1, 1); // the thread's smallest and largest rows

    const int32_t *bt = p.block_tables + (size_t)seq * p.bt_stride;
    auto load_tile = [&](int tile, int st) {
        f8_or_bf16_load_tile<HD, F8, WC>(p, stages, raw8, st, bt, kvh, tile, kv_begin, kv_end);
    };

    float o[2][ONT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < ONT; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};

    kv_pipeline_start<2>(t_lo, n_tiles, load_tile); // the q tile rides with the first KV tile
    for (int tile = t_lo; tile < n_tiles; tile++) {
        const int it = tile - t_lo; // stages count from the first tile loaded
        kv_pipeline_wait<2>();
        if (tile + 1 < n_tiles) load_tile(tile + 1, (it + 1) & 1);
        cp_async_commit();
        const bf16 *ks = stages + (it & 1) * 2 * KT * HD, *vs = ks + KT * HD;
        if constexpr (F8) { // the barrier above freed the bf16 tile
            f8_convert_tile<HD>(raw8 + (it & 1) * 2 * KT * HD, stages);
            __syncthreads();
            ks = stages;
            vs = stages + KT * HD;
        }

        float sc[2][NT][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++) sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk += 2) {
            uint32_t qa[2][2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int d = 0; d < 2; d++) {
                    int r = warp * 32 + mt * 16 + (lane & 15), c = (kk + d) * 2 + (lane >> 4);
                    ldsm_x4(smem_u32(qs + r * HD + ((c ^ (r & 7)) * 8)), qa[mt][d][0], qa[mt][d][1], qa[mt][d][2],
                            qa[mt][d][3]);
                }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int r = j * 8 + (lane & 7);
                int c = kk * 2 + (lane >> 3);
                uint32_t b0, b1, b2, b3;
                ldsm_x4(smem_u32(ks + r * HD + ((c ^ (r & 7)) * 8)), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma_bf16(sc[mt][j], qa[mt][0], b0, b1);
                    mma_bf16(sc[mt][j], qa[mt][1], b2, b3);
                }
            }
        }

        const bool need_mask = tile * KT + KT - 1 > min_pos || (WC && before_window(p, tile * KT, max_pos));
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < NT; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = sc[mt][j][e] * sl2;
                    sc[mt][j][e] = v;
                }
            }
            if (WC && p.softcap2 > 0.0f) // Gemma 2
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) sc[mt][j][e] = capped_score(p, sc[mt][j][e]);
            if (need_mask) {
                const int p0 = row_pos(mt, 0), p1 = row_pos(mt, 1);
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int t = tile * KT + j * 8 + (lane % 4) * 2 + (e & 1), pe = (e >> 1) ? p1 : p0;
                        if (t > pe || (WC && before_window(p, t, pe))) sc[mt][j][e] = -INFINITY;
                    }
            }
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) tmax[e >> 1] = fmaxf(tmax[e >> 1], sc[mt][j][e]);
            softmax_rows<NT, ONT>(sc[mt], o[mt], tmax, m[mt], l[mt]);
        }

#pragma unroll
        for (int k2 = 0; k2 < NT / 2; k2++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                a[mt][0] = pack_bf16(sc[mt][2 * k2][0], sc[mt][2 * k2][1]);
                a[mt][1] = pack_bf16(sc[mt][2 * k2][2], sc[mt][2 * k2][3]);
                a[mt][2] = pack_bf16(sc[mt][2 * k2 + 1][0], sc[mt][2 * k2 + 1][1]);
                a[mt][3] = pack_bf16(sc[mt][2 * k2 + 1][2], sc[mt][2 * k2 + 1][3]);
            }
            int r = k2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int c = 0; c < HD / 16; c++) {
                int ch = 2 * c + (lane >> 4);
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(smem_u32(vs + r * HD + ((ch ^ (r & 7)) * 8)), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma_bf16(o[mt][2 * c], a[mt], b0, b1);
                    mma_bf16(o[mt][2 * c + 1], a[mt], b2, b3);
                }
            }
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float lt_ = l[mt][i];
            lt_ += __shfl_xor_sync(0xffffffffu, lt_, 1);
            lt_ += __shfl_xor_sync(0xffffffffu, lt_, 2);
            const int r = row0 + warp * 32 + mt * 16 + lane / 4 + 8 * i;
            if (r >= rows_total) continue;
            const float inv = lt_ > 0.0f ? vsc / lt_ : 0.0f;
            bf16 *op = p.out + ((size_t)(q_start + r / G) * p.n_heads + kvh * G + r % G) * HD;
#pragma unroll
            for (int n = 0; n < ONT; n++) {
                int c = n * 8 + (lane % 4) * 2;
                *reinterpret_cast<__nv_bfloat162 *>(op + c) =
                    __floats2bfloat162_rn(o[mt][n][2 * i] * inv, o[mt][n][2 * i + 1] * inv);
            }
        }
}

// --- planning and launchers ---------------------------------------------------------------

// Raises the kernel's dynamic shared memory limit, once per device (the
// attribute belongs to the device's context).
template <int HD, int NT, bool F8 = false, bool WC = false> int set_smem_attr() {
    static std::atomic<uint64_t> done{0};
    int dev = 0;
    PG_CUDA_TRY(cudaGetDevice(&dev));
    uint64_t bit = 1ull << (dev & 63);
    if (done.load(std::memory_order_acquire) & bit) return 0;
    PG_CUDA_TRY(cudaFuncSetAttribute(paged_attn_mma_kernel<HD, NT, F8, WC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     attn_smem_bytes<HD, NT, F8>()));
    done.fetch_or(bit, std::memory_order_release);
    return 0;
}

// CTAs of the decode kernel resident per SM (the same on every device of
// one kind; computed once).
template <int HD, bool F8 = false, bool WC = false> int decode_ctas_per_sm() {
    static const int n = [] {
        int v = 0;
        if (set_smem_attr<HD, 2, F8, WC>() < 0 ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, paged_attn_mma_kernel<HD, 2, F8, WC>, NTHREADS,
                                                          attn_smem_bytes<HD, 2, F8>()) != cudaSuccess ||
            v < 1)
            v = 1;
        return v;
    }();
    return n;
}


int decode_ctas_per_sm_of(int head_dim, bool f8) {
    switch (head_dim) {
    case 64: return f8 ? decode_ctas_per_sm<64, true>() : decode_ctas_per_sm<64, false>();
    case 128: return f8 ? decode_ctas_per_sm<128, true>() : decode_ctas_per_sm<128, false>();
    default: return f8 ? decode_ctas_per_sm<256, true>() : decode_ctas_per_sm<256, false>();
    }
}

int check_common(const void *out, const void *q, const void *k_cache, const void *v_cache,
                 pg_kv_shape kv, const int32_t *block_tables, int32_t n_seqs, int32_t n_heads,
                 int64_t q_stride) {
    PG_ARG(out && q && k_cache && v_cache && block_tables, "attention: null pointer");
    PG_ARG(n_seqs >= 0 && n_heads > 0 && kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0,
           "attention: %d query heads over %d KV heads", n_heads, kv.n_kv_heads);
    if (!pg_cuda_head_dim_ok(kv.head_dim))
        return pg_err_set(PG_EUNSUPP, "attention: head_dim %d (built: 64, 128, 256)", kv.head_dim);
    PG_ARG(kv.window >= 0 && kv.softcap >= 0.0f, "attention: window %d, softcap %g", kv.window, (double)kv.softcap);
    if (log2_exact(kv.block_size) < 3)
        return pg_err_set(PG_EUNSUPP, "attention: block_size %d (a power of two >= 8)", kv.block_size);
    PG_ARG(q_stride >= (int64_t)n_heads * kv.head_dim && q_stride % 2 == 0,
           "attention: q_stride %lld", (long long)q_stride);
    PG_ARG(kv.dtype == PG_KV_BF16 || kv.dtype == PG_KV_FP8_E4M3, "attention: KV cache dtype %d", kv.dtype);
    return 0;
}

template <int HD, bool F8, bool WC>
int launch_decode_v2(void *out, const void *q, int64_t q_stride, const void *k_cache,
                     const void *v_cache, pg_kv_shape kv, const int32_t *block_tables,
                     int32_t bt_stride, const int32_t *seq_lens, int32_t n_seqs, int32_t n_heads,
                     float scale, int32_t max_seq_len, void *workspace, size_t workspace_bytes,
                     cudaStream_t st) {
    PG_TRY((set_smem_attr<HD, 2, F8, WC>()));
    const int G = n_heads / kv.n_kv_heads;
    const int row_tiles = (G + 15) / 16;
    const AttnParams p = decode_params(out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride, seq_lens,
                                       n_seqs, n_heads, scale, max_seq_len, workspace, workspace_bytes, row_tiles,
                                       decode_ctas_per_sm<HD, F8, WC>(), F8);
    dim3 grid((unsigned)(n_seqs * kv.n_kv_heads), (unsigned)row_tiles, (unsigned)p.max_splits);
    PG_CUDA_TRY(pg_launch_pdl(paged_attn_mma_kernel<HD, 2, F8, WC>, grid, dim3(NTHREADS), attn_smem_bytes<HD, 2, F8>(),
                              st, p));
    PG_CUDA_LAUNCHED("paged_attn_mma_kernel<decode>");
    return 0;
}

template <int HD, bool F8, bool WC>
int launch_prefill(void *out, const void *q, int64_t q_stride, const void *k_cache,
                   const void *v_cache, pg_kv_shape kv, const int32_t *block_tables,
                   int32_t bt_stride, const int32_t *cu_q, const int32_t *start_pos, int32_t n_seqs,
                   int32_t n_heads, float scale, int32_t max_q_len, cudaStream_t st) {
    PG_TRY((set_smem_attr<HD, 8, F8, WC>()));
    const int G = n_heads / kv.n_kv_heads;
    AttnParams p = attn_params(out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride, n_heads, scale);
    p.cu_q = cu_q;
    p.start_pos = start_pos;
    p.tiles_per_split = 1 << 30;
    p.max_splits = 1;
    const int64_t row_tiles = ((int64_t)max_q_len * G + 63) / 64;
    PG_ARG(row_tiles <= 65535, "prefill attention: max_q_len %d too large for one launch", max_q_len);
    dim3 grid((unsigned)(n_seqs * kv.n_kv_heads), (unsigned)row_tiles, 1);
    paged_attn_mma_kernel<HD, 8, F8, WC><<<grid, NTHREADS, attn_smem_bytes<HD, 8, F8>(), st>>>(p);
    PG_CUDA_LAUNCHED("paged_attn_mma_kernel<prefill>");
    return 0;
}

template <int HD, bool F8, bool WC>
int launch_prefill_v2(void *out, const void *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                      pg_kv_shape kv, const int32_t *block_tables, int32_t bt_stride, const int32_t *cu_q,
                      const int32_t *start_pos, int32_t n_seqs, int32_t n_heads, float scale, int32_t max_q_len,
                      cudaStream_t st) {
    if constexpr (HD > PF2_MAX_HD) {
        return pg_err_set(PG_EUNSUPP, "prefill attention v2: head_dim %d (at most %d; v1 takes it)", HD, PF2_MAX_HD);
    } else {
        static std::atomic<uint64_t> done{0};
        int dev = 0;
        PG_CUDA_TRY(cudaGetDevice(&dev));
        if (!(done.load(std::memory_order_acquire) & (1ull << (dev & 63)))) {
            PG_CUDA_TRY(cudaFuncSetAttribute(paged_prefill_v2_kernel<HD, F8, WC>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, pf2_smem_bytes<HD, F8>()));
            done.fetch_or(1ull << (dev & 63), std::memory_order_release);
        }
        const int G = n_heads / kv.n_kv_heads;
        AttnParams p = attn_params(out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride, n_heads, scale);
        p.cu_q = cu_q;
        p.start_pos = start_pos;
        const int64_t row_tiles = ((int64_t)max_q_len * G + 127) / 128;
        PG_ARG(row_tiles <= 65535, "prefill attention: max_q_len %d too large for one launch", max_q_len);
        dim3 grid((unsigned)(n_seqs * kv.n_kv_heads), (unsigned)row_tiles, 1);
        paged_prefill_v2_kernel<HD, F8, WC><<<grid, NTHREADS, pf2_smem_bytes<HD, F8>(), st>>>(p);
        PG_CUDA_LAUNCHED("paged_prefill_v2_kernel");
        return 0;
    }
}

} // namespace

#include "kernels/cuda/attention_decode_kn.cuh" // decode v4

// --- C API -------------------------------------------------------------------------------

// Calls fn<HD, F8, WC>(args...) for the shape's head_dim, KV dtype and
// whether it has a window or a soft-cap (check_common has limited the first
// two to what is built).
#define PG_ATTN_DISPATCH_HD(fn, kv, F8, WC, ...)                                                   \
    ((kv).head_dim == 64    ? fn<64, F8, WC>(__VA_ARGS__)                                          \
     : (kv).head_dim == 128 ? fn<128, F8, WC>(__VA_ARGS__)                                         \
                            : fn<256, F8, WC>(__VA_ARGS__))
#define PG_ATTN_DISPATCH_WC(fn, kv, WC, ...)                                                       \
    ((kv).dtype == PG_KV_FP8_E4M3 ? PG_ATTN_DISPATCH_HD(fn, kv, true, WC, __VA_ARGS__)             \
                                  : PG_ATTN_DISPATCH_HD(fn, kv, false, WC, __VA_ARGS__))
#define PG_ATTN_DISPATCH(fn, kv, ...)                                                              \
    (((kv).window > 0 || (kv).softcap > 0.0f) ? PG_ATTN_DISPATCH_WC(fn, kv, true, __VA_ARGS__)     \
                                              : PG_ATTN_DISPATCH_WC(fn, kv, false, __VA_ARGS__))

extern "C" int pg_cuda_paged_decode_attention_v(int version, void *out, const void *q, int64_t q_stride,
                                                const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                                const int32_t *block_tables, int32_t bt_stride,
                                                const int32_t *seq_lens, int32_t n_seqs, int32_t n_heads,
                                                float scale, int32_t max_seq_len, void *workspace,
                                                size_t workspace_bytes, void *stream) {
    PG_TRY(check_common(out, q, k_cache, v_cache, kv, block_tables, n_seqs, n_heads, q_stride));
    PG_ARG(seq_lens, "decode attention: null seq_lens");
    PG_ARG(max_seq_len >= 0, "decode attention: max_seq_len %d", max_seq_len);
    PG_ARG(version >= 1 && version <= 4, "decode attention: no version %d", version);
    if (version == 1 || version == 3) // numbered versions the product never runs
        return pg_err_set(PG_EUNSUPP, "decode attention v%d: not in the library (bench/cuda/attention_decode_v%d.cuh)",
                          version, version);
    if (version == 4 && !kn_applies(n_heads / kv.n_kv_heads))
        return pg_err_set(PG_EUNSUPP, "decode attention v4: GQA group %d (at most %d) or compute capability %d < 8.9",
                          n_heads / kv.n_kv_heads, KN_MAX_GROUP, device_cc());
    if (n_seqs == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    if (version == 4)
        return PG_ATTN_DISPATCH(launch_decode_kn, kv, out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride,
                                seq_lens, n_seqs, n_heads, scale, max_seq_len, workspace, workspace_bytes, st);
    return PG_ATTN_DISPATCH(launch_decode_v2, kv, out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride,
                            seq_lens, n_seqs, n_heads, scale, max_seq_len, workspace, workspace_bytes, st);
}

extern "C" int pg_cuda_paged_decode_attention(void *out, const void *q, int64_t q_stride,
                                              const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                              const int32_t *block_tables, int32_t bt_stride,
                                              const int32_t *seq_lens, int32_t n_seqs, int32_t n_heads,
                                              float scale, int32_t max_seq_len, void *workspace,
                                              size_t workspace_bytes, void *stream) {
    const bool kn = (kv.dtype == PG_KV_FP8_E4M3 || DECODE_BF16_KN) && kv.n_kv_heads > 0 && n_heads > 0 &&
                    n_heads % kv.n_kv_heads == 0 && kn_applies(n_heads / kv.n_kv_heads);
    return pg_cuda_paged_decode_attention_v(kn ? 4 : DECODE_DEFAULT_VERSION, out, q, q_stride, k_cache, v_cache, kv,
                                            block_tables, bt_stride, seq_lens, n_seqs, n_heads, scale, max_seq_len,
                                            workspace, workspace_bytes, stream);
}

extern "C" size_t pg_cuda_decode_workspace_size(int32_t max_seqs, int32_t n_heads, int32_t n_kv_heads,
                                                int32_t head_dim, int32_t max_seq_len) {
    if (max_seqs <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads) return 0;
    const int G = n_heads / n_kv_heads, row_tiles = (G + 15) / 16;
    const int sms = pg_cuda_sm_count();
    size_t best = 0;
    // Both KV dtypes and both split kernels (v2, v4; their plans differ), so
    // one size serves whatever the dispatcher picks.
    for (int f8 = 0; f8 < 2; f8++) {
        const int cps = decode_ctas_per_sm_of(head_dim, f8 != 0);
        for (int n = 1; n <= max_seqs; n++) {
            SplitPlan pl = plan_decode(n, n_kv_heads, row_tiles, G, max_seq_len, sms, cps, f8 != 0);
            if (pl.n_splits > 1) {
                size_t b = split_ws_bytes(n, n_heads, head_dim, pl.n_splits);
                if (b > best) best = b;
            }
        }
        if (G <= KN_MAX_GROUP) { // v4's plan (one row tile, its own occupancy)
            const int kcps = kn_ctas_per_sm_of(head_dim, f8 != 0);
            for (int n = 1; n <= max_seqs; n++) {
                SplitPlan pl = plan_decode(n, n_kv_heads, 1, G, max_seq_len, sms, kcps, f8 != 0);
                if (pl.n_splits > 1) {
                    size_t b = split_ws_bytes(n, n_heads, head_dim, pl.n_splits);
                    if (b > best) best = b;
                }
            }
        }
    }
    return best;
}

extern "C" int pg_cuda_paged_prefill_attention_v(int version, void *out, const void *q, int64_t q_stride,
                                                 const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                                 const int32_t *block_tables, int32_t bt_stride,
                                                 const int32_t *cu_q, const int32_t *start_pos, int32_t n_seqs,
                                                 int32_t n_heads, float scale, int32_t max_q_len, void *stream) {
    PG_TRY(check_common(out, q, k_cache, v_cache, kv, block_tables, n_seqs, n_heads, q_stride));
    PG_ARG(cu_q && start_pos, "prefill attention: null cu_q or start_pos");
    PG_ARG(version == 1 || version == 2, "prefill attention: no version %d", version);
    if (n_seqs == 0 || max_q_len <= 0) return 0;
    cudaStream_t st = pg_stream(stream);
    if (version == 2)
        return PG_ATTN_DISPATCH(launch_prefill_v2, kv, out, q, q_stride, k_cache, v_cache, kv, block_tables,
                                bt_stride, cu_q, start_pos, n_seqs, n_heads, scale, max_q_len, st);
    return PG_ATTN_DISPATCH(launch_prefill, kv, out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride,
                            cu_q, start_pos, n_seqs, n_heads, scale, max_q_len, st);
}

extern "C" int pg_cuda_paged_prefill_attention(void *out, const void *q, int64_t q_stride,
                                               const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                               const int32_t *block_tables, int32_t bt_stride,
                                               const int32_t *cu_q, const int32_t *start_pos, int32_t n_seqs,
                                               int32_t n_heads, float scale, int32_t max_q_len, void *stream) {
    const int version = kv.head_dim > PF2_MAX_HD ? 1 : PREFILL_DEFAULT_VERSION; // v2 is built up to 128
    return pg_cuda_paged_prefill_attention_v(version, out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride,
                                             cu_q, start_pos, n_seqs, n_heads, scale, max_q_len, stream);
}
