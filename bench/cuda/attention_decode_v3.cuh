// bench/cuda/attention_decode_v3.cuh - decode attention v3: persistent and
// tile-balanced. Correct, but measured slower than v2 everywhere except
// batch 1 (about 2.4 TB/s at every large size; docs/cuda_kernels.md says
// why), so the product never runs it: it left kernels/cuda/attention.cu
// (llm.c keeps its numbered versions in dev/cuda/). bench_cuda_attention
// times it and test_cuda_kernels checks it.
// #include into one translation unit per program (anonymous namespace).
#pragma once
#include <atomic>

#include "kernels/cuda/attention_common.cuh"

namespace {

// How: v2 launches one CTA per (sequence, KV head, split); at batch 16 x 4096
// that is ~8 waves of short CTAs, each paying the latency of its first
// block-table read and KV tile before streaming. v3 launches exactly the
// CTAs that fit at once (2 per SM) and gives each an equal share of the
// flattened list of KV tiles (sequence-major, then KV head, then tile):
// a CTA streams its range through one 3-stage cp.async pipeline that runs
// across (sequence, head) boundaries, so it starts once and all CTAs end
// together. A range cuts the tile list into segments; a segment that is a
// whole (sequence, head) writes the output, others write a partial
// (O / l, lse) to slot item + CTA (unique: both grow along the list) and
// decode_v3_reduce_kernel combines them. The warps split head_dim for P V
// instead of keys (each computes the full S = Q K^T for the tile, cheap at
// 16 rows), so no cross-warp merge and no shared memory outside the
// pipeline. q rows are cp.async'ed into the stage with the first tile of a
// segment (zero rows past the GQA group).

constexpr int V3_MAX_SEQS = 512;
constexpr int V3_STAGES = 3;
constexpr int V3_P_BYTES = ((V3_MAX_SEQS + 1) * 4 + 127) / 128 * 128; // tile prefix, 128-byte aligned stages after it
constexpr int V3_MIN_TILES = 2; // tiles per CTA at least (tiny batches launch fewer CTAs)

struct DecodeV3Params {
    bf16 *out;
    const bf16 *q;
    int64_t q_stride;
    const bf16 *k_cache, *v_cache;
    const int32_t *block_tables;
    int64_t bt_stride;
    const int32_t *seq_lens;
    int n_seqs, n_heads, n_kv, group, bs_shift;
    float scale_log2;
    float *part_o;            // [(n_seqs * n_kv + gridDim.x) * group][HD]
    float *part_lse;          // [(n_seqs * n_kv + gridDim.x) * group]
    int32_t *seq_tile_start;  // [n_seqs + 1]: first tile of each sequence (written by CTA 0)
};

template <int HD>
__host__ __device__ constexpr int v3_stage_elems() {
    return (2 * KT + 16) * HD; // K tile, V tile, 16 q rows
}
template <int HD>
__host__ __device__ constexpr int v3_smem_bytes() {
    return V3_P_BYTES + V3_STAGES * v3_stage_elems<HD>() * (int)sizeof(bf16);
}

template <int HD>
__global__ void __launch_bounds__(NTHREADS, 2) paged_decode_v3_kernel(const DecodeV3Params p) {
    constexpr int CPR = HD / 8;
    constexpr int KSTEPS = HD / 16;
    constexpr int NT = KT / 8;     // n-tiles of S per tile (all 64 keys in every warp)
    constexpr int DW = HD / 4;     // output dims per warp
    constexpr int DNT = DW / 8;    // output n-tiles per warp
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int32_t *P = reinterpret_cast<int32_t *>(smem_raw); // [n_seqs + 1] tile prefix
    bf16 *stages = reinterpret_cast<bf16 *>(smem_raw + V3_P_BYTES);
    __shared__ int32_t warp_sums[NTHREADS / 32];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n_seqs = p.n_seqs, n_kv = p.n_kv, G = p.group;

    // Tile prefix over sequences: sequence s owns tiles [P[s], P[s+1]),
    // n_kv * ceil(len / KT) of them, KV head major within the sequence.
    int carry = 0;
    for (int base = 0; base < n_seqs; base += NTHREADS) {
        const int s = base + tid;
        int len = s < n_seqs ? p.seq_lens[s] : 0;
        int v = len > 0 ? n_kv * ((len + KT - 1) / KT) : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += y;
        }
        if (lane == 31) warp_sums[warp] = v;
        __syncthreads();
        int before = carry;
        for (int w = 0; w < warp; w++) before += warp_sums[w];
        if (s < n_seqs) P[s + 1] = before + v;
        for (int w = 0; w < NTHREADS / 32; w++) carry += warp_sums[w];
        __syncthreads();
    }
    if (tid == 0) P[0] = 0;
    __syncthreads();
    if (blockIdx.x == 0)
        for (int s = tid; s <= n_seqs; s += NTHREADS) p.seq_tile_start[s] = P[s];
    const int T = P[n_seqs];
    const int per = (T + gridDim.x - 1) / gridDim.x;
    const int g0 = blockIdx.x * per, g1 = min(T, g0 + per);
    if (g0 >= g1) return;

    // Tile g -> (sequence, KV head, tile within the sequence, tiles per head).
    auto locate_tile = [&](int g, int &s, int &kvh, int &lt, int &nt) {
        int lo = 0, hi = n_seqs - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (P[mid] <= g) lo = mid;
            else hi = mid - 1;
        }
        s = lo;
        nt = (P[s + 1] - P[s]) / n_kv;
        int r = g - P[s];
        kvh = r / nt;
        lt = r % nt;
    };

    auto load_tile = [&](int g, int st) {
        int s, kvh, lt, nt;
        locate_tile(g, s, kvh, lt, nt);
        const int len = p.seq_lens[s];
        const int32_t *bt = p.block_tables + (size_t)s * p.bt_stride;
        bf16 *ks = stages + st * v3_stage_elems<HD>(), *vs = ks + KT * HD, *qs = vs + KT * HD;
#pragma unroll
        for (int i = 0; i < KT * CPR / NTHREADS; i++) {
            int chunk = tid + i * NTHREADS;
            int r = chunk / CPR, c = chunk % CPR;
            int t = lt * KT + r;
            bool valid = t < len;
            const bf16 *kp = p.k_cache, *vp = p.v_cache;
            if (valid) {
                size_t off = kv_row(bt, p.bs_shift, t, n_kv, kvh) * HD + c * 8;
                kp += off;
                vp += off;
            }
            int so = r * HD + ((c ^ (r & 7)) * 8);
            cp_async16(smem_u32(ks + so), kp, valid);
            cp_async16(smem_u32(vs + so), vp, valid);
        }
        if (lt == 0 || g == g0) { // first tile of a segment: its q rows
#pragma unroll
            for (int i = 0; i < 16 * CPR / NTHREADS; i++) {
                int chunk = tid + i * NTHREADS;
                int r = chunk / CPR, c = chunk % CPR;
                bool valid = r < G;
                const bf16 *qp = valid ? p.q + (size_t)s * p.q_stride + (size_t)(kvh * G + r) * HD + c * 8 : p.q;
                cp_async16(smem_u32(qs + r * HD + ((c ^ (r & 7)) * 8)), qp, valid);
            }
        }
    };

    uint32_t qa[KSTEPS][4];
    float o[DNT][4];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

#pragma unroll
    for (int i = 0; i < V3_STAGES - 1; i++) {
        if (g0 + i < g1) load_tile(g0 + i, i);
        cp_async_commit();
    }
    for (int g = g0; g < g1; g++) {
        const int it = g - g0;
        cp_async_wait<V3_STAGES - 2>();
        __syncthreads();
        if (g + V3_STAGES - 1 < g1) load_tile(g + V3_STAGES - 1, (it + V3_STAGES - 1) % V3_STAGES);
        cp_async_commit();
        const bf16 *ks = stages + (it % V3_STAGES) * v3_stage_elems<HD>(), *vs = ks + KT * HD, *qs = vs + KT * HD;
        int s, kvh, lt, nt;
        locate_tile(g, s, kvh, lt, nt);
        const int len = p.seq_lens[s];

        if (lt == 0 || g == g0) { // a new segment: fresh state, q fragments from smem
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++) {
                int r = lane & 15, c = kk * 2 + (lane >> 4);
                ldsm_x4(smem_u32(qs + r * HD + ((c ^ (r & 7)) * 8)), qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3]);
            }
#pragma unroll
            for (int n = 0; n < DNT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
            m[0] = m[1] = -INFINITY;
            l[0] = l[1] = 0.0f;
        }

        // S = Q K^T: 16 rows x 64 keys (every warp the whole tile).
        float sc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk += 2) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int r = j * 8 + (lane & 7);
                int c = kk * 2 + (lane >> 3);
                uint32_t b0, b1, b2, b3;
                ldsm_x4(smem_u32(ks + r * HD + ((c ^ (r & 7)) * 8)), b0, b1, b2, b3);
                mma_bf16(sc[j], qa[kk], b0, b1);
                mma_bf16(sc[j], qa[kk + 1], b2, b3);
            }
        }
        const bool need_mask = (lt + 1) * KT > len;
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = sc[j][e] * p.scale_log2;
                if (need_mask && lt * KT + j * 8 + (lane % 4) * 2 + (e & 1) >= len) v = -INFINITY;
                sc[j][e] = v;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], v);
            }
        }
        float m_use[2], corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 1));
            tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 2));
            float m_new = fmaxf(m[i], tmax[i]);
            m_use[i] = m_new == -INFINITY ? 0.0f : m_new;
            corr[i] = exp2f(m[i] - m_use[i]);
            m[i] = m_new;
            l[i] *= corr[i];
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float pv = exp2f(sc[j][e] - m_use[e >> 1]);
                sc[j][e] = pv;
                l[e >> 1] += pv;
            }
        }
#pragma unroll
        for (int n = 0; n < DNT; n++) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        // O[:, warp's dims] += P V[:, warp's dims].
#pragma unroll
        for (int k2 = 0; k2 < NT / 2; k2++) {
            uint32_t a[4] = {pack_bf16(sc[2 * k2][0], sc[2 * k2][1]), pack_bf16(sc[2 * k2][2], sc[2 * k2][3]),
                             pack_bf16(sc[2 * k2 + 1][0], sc[2 * k2 + 1][1]),
                             pack_bf16(sc[2 * k2 + 1][2], sc[2 * k2 + 1][3])};
            int r = k2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int c = 0; c < DW / 16; c++) {
                int ch = warp * (DW / 8) + 2 * c + (lane >> 4);
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(smem_u32(vs + r * HD + ((ch ^ (r & 7)) * 8)), b0, b1, b2, b3);
                mma_bf16(o[2 * c], a, b0, b1);
                mma_bf16(o[2 * c + 1], a, b2, b3);
            }
        }

        // End of a segment: the output, or a partial for the reduce.
        if (lt == nt - 1 || g == g1 - 1) {
            const int first = P[s] + kvh * nt; // the (sequence, head)'s first tile
            const bool whole = first / per == (first + nt - 1) / per;
            const int seg = s * n_kv + kvh + blockIdx.x;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int row = lane / 4 + 8 * i;
                float lt_ = l[i];
                lt_ += __shfl_xor_sync(0xffffffffu, lt_, 1);
                lt_ += __shfl_xor_sync(0xffffffffu, lt_, 2);
                if (row >= G) continue;
                const float inv = lt_ > 0.0f ? 1.0f / lt_ : 0.0f;
                if (whole) {
                    bf16 *op = p.out + ((size_t)s * p.n_heads + kvh * G + row) * HD;
#pragma unroll
                    for (int n = 0; n < DNT; n++) {
                        int c = warp * DW + n * 8 + (lane % 4) * 2;
                        *reinterpret_cast<__nv_bfloat162 *>(op + c) =
                            __floats2bfloat162_rn(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
                    }
                } else {
                    float *pp = p.part_o + ((size_t)seg * G + row) * HD;
#pragma unroll
                    for (int n = 0; n < DNT; n++) {
                        int c = warp * DW + n * 8 + (lane % 4) * 2;
                        *reinterpret_cast<float2 *>(pp + c) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
                    }
                    if (warp == 0 && lane % 4 == 0)
                        p.part_lse[(size_t)seg * G + row] = lt_ > 0.0f ? m[i] + log2f(lt_) : -INFINITY;
                }
            }
        }
    }
    cp_async_wait<0>();
}

// Combines the segments of each (sequence, head) that spans CTAs, and
// zeroes the rows of sequences with no keys. One CTA of HD/2 threads per
// (sequence, query head).
template <int HD>
__global__ void decode_v3_reduce_kernel(bf16 *out, const float *part_o, const float *part_lse,
                                        const int32_t *seq_lens, const int32_t *seq_tile_start, int n_seqs,
                                        int n_heads, int n_kv, int n_ctas) {
    const int row = blockIdx.x, s = row / n_heads, h = row % n_heads;
    const int G = n_heads / n_kv, kvh = h / G, g = h % G;
    const int c = threadIdx.x * 2;
    const int len = seq_lens[s];
    const int nt = len > 0 ? (len + KT - 1) / KT : 0;
    if (nt == 0) {
        *reinterpret_cast<__nv_bfloat162 *>(out + (size_t)row * HD + c) = __floats2bfloat162_rn(0.0f, 0.0f);
        return;
    }
    const int T = seq_tile_start[n_seqs];
    const int per = (T + n_ctas - 1) / n_ctas;
    const int first = seq_tile_start[s] + kvh * nt;
    const int c0 = first / per, c1 = (first + nt - 1) / per;
    if (c0 == c1) return; // one segment: written by the attention kernel
    const int item = s * n_kv + kvh;
    float mx = -INFINITY;
    for (int cta = c0; cta <= c1; cta++) mx = fmaxf(mx, part_lse[(size_t)(item + cta) * G + g]);
    float2 acc = make_float2(0.0f, 0.0f);
    float wsum = 0.0f;
    for (int cta = c0; cta <= c1; cta++) {
        size_t seg = (size_t)(item + cta) * G + g;
        float lse = part_lse[seg];
        float w = lse == -INFINITY ? 0.0f : exp2f(lse - mx);
        float2 v = *reinterpret_cast<const float2 *>(part_o + seg * HD + c);
        acc.x += w * v.x;
        acc.y += w * v.y;
        wsum += w;
    }
    float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
    *reinterpret_cast<__nv_bfloat162 *>(out + (size_t)row * HD + c) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
}

// --- host side ---------------------------------------------------------------------------

// v3's dynamic shared memory limit, once per device.
template <int HD> int v3_set_smem_attr() {
    static std::atomic<uint64_t> done{0};
    int dev = 0;
    PG_CUDA_TRY(cudaGetDevice(&dev));
    uint64_t bit = 1ull << (dev & 63);
    if (done.load(std::memory_order_acquire) & bit) return 0;
    PG_CUDA_TRY(cudaFuncSetAttribute(paged_decode_v3_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     v3_smem_bytes<HD>()));
    done.fetch_or(bit, std::memory_order_release);
    return 0;
}

template <int HD> int v3_ctas_per_sm() {
    static const int n = [] {
        int v = 0;
        if (v3_set_smem_attr<HD>() < 0 ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, paged_decode_v3_kernel<HD>, NTHREADS,
                                                          v3_smem_bytes<HD>()) != cudaSuccess ||
            v < 1)
            v = 1;
        return v;
    }();
    return n;
}

// CTAs of a v3 launch: all that fit at once, fewer for tiny batches.
int v3_ctas(int n_seqs, int n_kv, int max_seq_len, int head_dim) {
    const int64_t tiles = (int64_t)n_seqs * n_kv * (max_seq_len > 0 ? (max_seq_len + KT - 1) / KT : 1);
    const int64_t full = (int64_t)pg_cuda_sm_count() * (head_dim == 64 ? v3_ctas_per_sm<64>() : v3_ctas_per_sm<128>());
    int64_t c = (tiles + V3_MIN_TILES - 1) / V3_MIN_TILES;
    if (c > full) c = full;
    return (int)(c < 1 ? 1 : c);
}

size_t v3_ws_bytes(int n_seqs, int n_kv, int group, int head_dim, int n_ctas) {
    const size_t segs = (size_t)n_seqs * n_kv + n_ctas;
    return 256 + ((size_t)(n_seqs + 1) * 4 + 255) / 256 * 256 + segs * group * (size_t)head_dim * 4 + segs * group * 4 + 256;
}

// v3 when it applies (GQA group <= 16, <= 512 sequences, enough workspace);
// returns 1 when it did not launch, so the caller falls back to v2.
template <int HD>
int launch_decode_v3(void *out, const void *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                     pg_kv_shape kv, const int32_t *block_tables, int32_t bt_stride, const int32_t *seq_lens,
                     int32_t n_seqs, int32_t n_heads, float scale, int32_t max_seq_len, void *workspace,
                     size_t workspace_bytes, cudaStream_t st) {
    const int G = n_heads / kv.n_kv_heads;
    if (G > 16 || n_seqs > V3_MAX_SEQS || !workspace) return 1;
    PG_TRY(v3_set_smem_attr<HD>());
    const int C = v3_ctas(n_seqs, kv.n_kv_heads, max_seq_len, HD);
    if (v3_ws_bytes(n_seqs, kv.n_kv_heads, G, HD, C) > workspace_bytes) return 1;
    const size_t segs = (size_t)n_seqs * kv.n_kv_heads + C;
    uintptr_t base = ((uintptr_t)workspace + 255) & ~(uintptr_t)255;
    DecodeV3Params p = {};
    p.seq_tile_start = (int32_t *)base;
    p.part_o = (float *)(base + ((size_t)(n_seqs + 1) * 4 + 255) / 256 * 256);
    p.part_lse = p.part_o + segs * G * HD;
    p.out = (bf16 *)out;
    p.q = (const bf16 *)q;
    p.q_stride = q_stride;
    p.k_cache = (const bf16 *)k_cache;
    p.v_cache = (const bf16 *)v_cache;
    p.block_tables = block_tables;
    p.bt_stride = bt_stride;
    p.seq_lens = seq_lens;
    p.n_seqs = n_seqs;
    p.n_heads = n_heads;
    p.n_kv = kv.n_kv_heads;
    p.group = G;
    p.bs_shift = log2_exact(kv.block_size);
    p.scale_log2 = scale * 1.4426950408889634f;
    paged_decode_v3_kernel<HD><<<C, NTHREADS, v3_smem_bytes<HD>(), st>>>(p);
    PG_CUDA_LAUNCHED("paged_decode_v3_kernel");
    decode_v3_reduce_kernel<HD><<<n_seqs * n_heads, HD / 2, 0, st>>>((bf16 *)out, p.part_o, p.part_lse, seq_lens,
                                                                     p.seq_tile_start, n_seqs, n_heads,
                                                                     kv.n_kv_heads, C);
    PG_CUDA_LAUNCHED("decode_v3_reduce_kernel");
    return 0;
}


// The decode contract of pg_cuda_paged_decode_attention through v3 (bf16 KV
// only). Where v3 does not apply (GQA group > 16, more than 512 sequences,
// a workspace short of bench_decode_v3_workspace_size) it runs the
// library's v2, as the library's version 3 did. PG_EUNSUPP for an fp8
// cache, head_dim other than 64/128, or a block size that is not a power of
// two >= 8.
int bench_decode_v3(void *out, const void *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                    pg_kv_shape kv, const int32_t *block_tables, int32_t bt_stride, const int32_t *seq_lens,
                    int32_t n_seqs, int32_t n_heads, float scale, int32_t max_seq_len, void *workspace,
                    size_t workspace_bytes, void *stream) {
    PG_ARG(out && q && k_cache && v_cache && block_tables && seq_lens, "decode v3: null pointer");
    PG_ARG(n_seqs >= 0 && n_heads > 0 && kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0 && max_seq_len >= 0,
           "decode v3: %d query heads over %d KV heads", n_heads, kv.n_kv_heads);
    if (kv.dtype != PG_KV_BF16) return pg_err_set(PG_EUNSUPP, "decode attention v3: fp8 KV cache (only v2 and v4)");
    if ((kv.head_dim != 64 && kv.head_dim != 128) || log2_exact(kv.block_size) < 3)
        return pg_err_set(PG_EUNSUPP, "decode v3: head_dim %d, block_size %d", kv.head_dim, kv.block_size);
    if (n_seqs == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    int rc = kv.head_dim == 64 ? launch_decode_v3<64>(out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride,
                                                      seq_lens, n_seqs, n_heads, scale, max_seq_len, workspace,
                                                      workspace_bytes, st)
                               : launch_decode_v3<128>(out, q, q_stride, k_cache, v_cache, kv, block_tables,
                                                       bt_stride, seq_lens, n_seqs, n_heads, scale, max_seq_len,
                                                       workspace, workspace_bytes, st);
    if (rc <= 0) return rc; // launched, or failed; 1: not applicable, v2 below
    return pg_cuda_paged_decode_attention_v(2, out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride,
                                            seq_lens, n_seqs, n_heads, scale, max_seq_len, workspace,
                                            workspace_bytes, stream);
}

// Bytes of workspace that both v3 (at the largest batch it takes) and the
// library's decode kernels (pg_cuda_decode_workspace_size) want.
size_t bench_decode_v3_workspace_size(int32_t max_seqs, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                      int32_t max_seq_len) {
    size_t best = pg_cuda_decode_workspace_size(max_seqs, n_heads, n_kv_heads, head_dim, max_seq_len);
    if (max_seqs <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || n_heads / n_kv_heads > 16)
        return best;
    const int n = max_seqs < V3_MAX_SEQS ? max_seqs : V3_MAX_SEQS; // its need grows with the batch
    const size_t b = v3_ws_bytes(n, n_kv_heads, n_heads / n_kv_heads, head_dim,
                                 v3_ctas(n, n_kv_heads, max_seq_len, head_dim));
    return b > best ? b : best;
}

} // namespace
