// kernels/cuda/attention_decode_kn.cuh - decode v4: paged decode attention
// with the keys on the MMA's M side, for GQA groups of at most 8 heads.
//
// #included by attention.cu (one translation unit with the other attention
// kernels: they share g_split_count; see attention_common.cuh).
//
// Why: decode v2 packs the G query heads of a group as the 16 M rows of
// mma.m16n8k16, so at Llama-3-8B's G = 4, 75% of its MMA and softmax work is
// padding, and its fp8 path converts each tile into a bf16 copy in shared
// memory (a store pass and a second barrier per tile). With fp8 that work,
// not the HBM stream, set its speed (the same KV tokens/s as bf16).
//
// Here one CTA owns one (sequence, KV head), its 4 warps take 16 keys each of
// every 64-key tile, and the transposed products put the keys on M and the
// (up to 8) query heads on N:
//   S^T = K Q^T    A = 16 keys x 16 dims of K, B = Q^T (k16 x n8), C = 16 x 8
//   O^T += V^T P^T A = 16 dims x 16 keys of V^T, B = P^T (k16 x n8)
// That is HD/16 + HD/16 mma per 16 keys (16 for HD 128, against v2's 32).
//
// fp8 fragments come straight from the raw e4m3 tile, no staging copy:
//   K: ldmatrix .b16 (no trans) of 8 key rows x 16 bytes gives lane l the
//      key l/4 and bytes 4t..4t+3 (t = l%4) of that 16-dim chunk. Converted
//      to f16 pairs, (4t, 4t+1) serves as the A columns (2t, 2t+1) and
//      (4t+2, 4t+3) as (2t+8, 2t+9): a permutation of the head dim inside
//      each chunk. Q's B fragments are loaded with the same permutation, and
//      a dot product does not depend on the order of its terms.
//   V: ldmatrix .trans on the bytes treats dim pairs as b16 elements: lane l
//      gets the dim pair l/4 of keys 2t and 2t+1, i.e. bytes (k2t,d), (k2t,d+1),
//      (k2t+1,d), (k2t+1,d+1) with d = 2(l/4). One prmt regroups them per dim,
//      and converted they are the A rows "dim d" and "dim d+1" over keys
//      (2t, 2t+1). So the O^T M rows of chunk c are the dims c*16 + 2i (row i)
//      and c*16 + 2i + 1 (row 8 + i); the output store un-permutes.
//   P^T: each f16 pair of the S^T accumulators is an 8x8 fragment (rows keys,
//      columns queries); movmatrix.trans makes it the k16n8 B fragment.
// Conversion: cvt.rn.f16x2.e4m3x2 (sm_89+, one instruction per 2 elements)
// and f16 mma. e4m3 is exact in f16; P in [0, 1] loses nothing that bf16
// would keep (f16 has more mantissa); q is pre-scaled by softmax_scale *
// log2(e) and rounded to f16 with saturation at +-65504 (|q * scale| that
// large is not a real case; f16's 11-bit mantissa is finer than bf16's 8).
// bf16 caches use the same layout with bf16 mma: K fragments by plain
// ldmatrix (natural order), V^T by ldmatrix.trans.
//
// The rest is v2's: a cp.async multistage pipeline of 16-byte loads with the
// block table per chunk (zero-filled past the end), XOR-swizzled tiles,
// online softmax in base 2 with the all-masked guards, the warps' (m, l, O)
// merged through shared memory, and flash-decoding splits combined by the
// last CTA of a (sequence, KV head) through g_split_count and the same
// workspace layout (part_o, part_lse), under the same PDL rules.
#pragma once
#include "kernels/cuda/attention_common.cuh"

namespace {

constexpr int KN_MAX_GROUP = 8; // query heads per KV head that fit the mma's N

// Pipeline depth: 3 stages (2 tiles in flight). fp8 at head_dim 128 is then
// 48 KB per CTA, so 4 CTAs fit per SM (registers allow 4 too) and batch 64 x
// 4096 (512 CTAs) runs in one wave; 4 stages (3 CTAs/SM) measured 3408 GB/s
// there against 4123 at 16 x 32768 (wave tail).
__host__ __device__ constexpr int kn_stages(bool) { return 3; }
template <int HD, bool F8> __host__ __device__ constexpr int kn_row_bytes() { return HD * (F8 ? 1 : 2); }
template <int HD, bool F8> __host__ __device__ constexpr int kn_stage_bytes() {
    return 2 * KT * kn_row_bytes<HD, F8>(); // K tile, then V tile
}
template <int HD, bool F8> __host__ __device__ constexpr int kn_smem_bytes() {
    return kn_stages(F8) * kn_stage_bytes<HD, F8>();
}

// c[4] += A(16x16, a[4]) * B(16x8, b0 b1), f16 in, fp32 accumulate.
__device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Transposes the 8x8 b16 matrix held as one register per lane (lane l: row
// l/4, columns 2(l%4), 2(l%4)+1).
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// Two e4m3 bytes at bits 8-15 and 24-31 of y -> f16x2, exactly, on the ALU:
// (s eeee mmm) placed as f16 (s 0eeee mmm0000000) is the value * 2^-8
// (e = 0 lands on f16 subnormals), and one f16 multiply by 2^8 restores it.
// Only the fallback below sm_89 (the host does not pick v4 there).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_alu(uint32_t y) {
    uint32_t r = (y & 0x80008000u) | ((y >> 1) & 0x3F803F80u), d;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(r), "r"(0x5C005C00u));
    return d;
}

// Four e4m3 bytes -> f16 pairs: lo = bytes 0, 1; hi = bytes 2, 3 (the lower
// byte in the lower half), exactly.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t x, uint32_t &lo, uint32_t &hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
#else
    lo = e4m3x2_to_f16x2_alu(__byte_perm(x, 0u, 0x1404));
    hi = e4m3x2_to_f16x2_alu(__byte_perm(x, 0u, 0x3424));
#endif
}

// Two bf16 of q -> f16x2 of q * s, saturated to the f16 range.
__device__ __forceinline__ uint32_t q_to_f16x2(uint32_t u, float s) {
    float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u));
    f.x = fminf(fmaxf(f.x * s, -65504.0f), 65504.0f);
    f.y = fminf(fmaxf(f.y * s, -65504.0f), 65504.0f);
    __half2 h = __floats2half2_rn(f.x, f.y);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <int HD, bool F8, bool WC>
__global__ void __launch_bounds__(NTHREADS) paged_decode_kn_kernel(const AttnParams p) {
    constexpr int RB = kn_row_bytes<HD, F8>(); // bytes per key row
    constexpr int CPR = RB / 16;               // 16-byte chunks per key row
    constexpr int MT = HD / 16;                // 16-dim chunks: S^T k-steps, O^T m-tiles
    constexpr int STAGES = kn_stages(F8);
    constexpr int STAGE = kn_stage_bytes<HD, F8>();
    static_assert(HD == 64 || HD == 128 || HD == 256, "head_dim");
    static_assert(KT * CPR % NTHREADS == 0 && KT == 16 * (NTHREADS / 32), "tile load, 16 keys per warp");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // PDL: q, the KV cache, lengths and block tables may be earlier kernels'
    // output, and the split counters must be back at zero. Every CTA waits
    // before anything else, including the ones that leave early below.
    pg_pdl_wait();
    pg_pdl_trigger();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g8 = lane / 4, t4 = lane % 4; // fragment row group, column pair
    const int seq = blockIdx.x / p.n_kv, kvh = blockIdx.x % p.n_kv;
    const int G = p.group;
    const float sl2 = p.scale_log2 * kv_k_scale(p, kvh), vsc = kv_v_scale(p, kvh);
    const int kv_end = p.seq_lens[seq];
    const int kv_begin = WC ? window_first_key(p, kv_end - 1) : 0; // the query is at kv_end - 1
    const int n_tiles = kv_end > 0 ? (kv_end + KT - 1) / KT : 0;
    const int t_lo = kv_begin / KT;
    const size_t out_row0 = (size_t)seq * p.n_heads + (size_t)kvh * G; // out row of head g: out_row0 + g
    const bool split = gridDim.z > 1;
    if (n_tiles == 0) { // no keys: zero rows, never NaN
        if (!split || blockIdx.z == 0)
            for (int idx = threadIdx.x; idx < G * HD; idx += NTHREADS)
                p.out[out_row0 * HD + idx] = __float2bfloat16(0.0f);
        return;
    }
    // Splits of this sequence that have keys: z < n_parts (as v2).
    int t_begin = t_lo, t_end = n_tiles, n_parts = 1;
    if (split) {
        t_begin = t_lo + blockIdx.z * p.tiles_per_split;
        t_end = min(n_tiles, t_begin + p.tiles_per_split);
        if (t_begin >= t_end) return; // not counted: n_parts below excludes it
        n_parts = min((n_tiles - t_lo + p.tiles_per_split - 1) / p.tiles_per_split, (int)gridDim.z);
    }
    const bool partial = n_parts > 1;

    // Q^T as B fragments: column (query head) g8, zeros past the group.
    // fp8: the K chunk permutation (b0 = dims 4t, 4t+1; b1 = 4t+2, 4t+3),
    // pre-scaled to f16; bf16: natural order (2t, 2t+1; 2t+8, 2t+9), raw.
    uint32_t qb[MT][2];
    {
        const bool ok = g8 < G;
        const bf16 *qp = p.q + (size_t)seq * p.q_stride + (size_t)(kvh * G + (ok ? g8 : 0)) * HD;
#pragma unroll
        for (int c = 0; c < MT; c++) {
            const int d0 = c * 16 + (F8 ? 4 * t4 : 2 * t4), d1 = d0 + (F8 ? 2 : 8);
            uint32_t u0 = ok ? *reinterpret_cast<const uint32_t *>(qp + d0) : 0u;
            uint32_t u1 = ok ? *reinterpret_cast<const uint32_t *>(qp + d1) : 0u;
            qb[c][0] = F8 ? q_to_f16x2(u0, sl2) : u0;
            qb[c][1] = F8 ? q_to_f16x2(u1, sl2) : u1;
        }
    }

    const int32_t *bt = p.block_tables + (size_t)seq * p.bt_stride;
    const unsigned char *kb = reinterpret_cast<const unsigned char *>(p.k_cache);
    const unsigned char *vb = reinterpret_cast<const unsigned char *>(p.v_cache);
    auto load_tile = [&](int tile, int st) {
        unsigned char *ks = smem_raw + st * STAGE;
        load_kv_tile<unsigned char, RB, false, WC>(p, kb, vb, ks, ks + KT * RB, bt, kvh, tile, kv_begin, kv_end);
    };

    float o[MT][4]; // O^T: m-tile c, rows = dims (see kn_dim), columns = query heads
#pragma unroll
    for (int c = 0; c < MT; c++) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; // query columns 2t, 2t+1
    const int key0 = warp * 16;
    // This lane's ldmatrix row: matrices 0/1 = keys 0-7 / 8-15 of chunk x,
    // matrices 2/3 the same keys of chunk x + 1.
    const int lrow = key0 + (lane & 7) + ((lane >> 3) & 1) * 8, lch = lane >> 4;

    kv_pipeline_start<STAGES>(t_begin, t_end, load_tile);
    for (int tile = t_begin; tile < t_end; tile++) {
        const int it = tile - t_begin;
        kv_pipeline_wait<STAGES>();
        if (tile + STAGES - 1 < t_end) load_tile(tile + STAGES - 1, (it + STAGES - 1) % STAGES);
        cp_async_commit();
        const uint32_t kaddr = smem_u32(smem_raw + (it % STAGES) * STAGE + lrow * RB);
        const uint32_t vaddr = kaddr + KT * RB;

        // S^T = K Q^T: 16 keys x 8 query heads (two accumulators: shorter mma chains).
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        if constexpr (F8) {
#pragma unroll
            for (int c = 0; c < MT; c += 2) {
                uint32_t r0, r1, r2, r3, a[4];
                ldsm_x4(kaddr + swz_chunk<CPR>(lrow, c + lch) * 16, r0, r1, r2, r3);
                e4m3x4_to_f16(r0, a[0], a[2]);
                e4m3x4_to_f16(r1, a[1], a[3]);
                mma_f16(s[0], a, qb[c][0], qb[c][1]);
                e4m3x4_to_f16(r2, a[0], a[2]);
                e4m3x4_to_f16(r3, a[1], a[3]);
                mma_f16(s[1], a, qb[c + 1][0], qb[c + 1][1]);
            }
        } else {
#pragma unroll
            for (int c = 0; c < MT; c++) {
                uint32_t a[4];
                ldsm_x4(kaddr + swz_chunk<CPR>(lrow, 2 * c + lch) * 16, a[0], a[1], a[2], a[3]);
                mma_bf16(s[c & 1], a, qb[c][0], qb[c][1]);
            }
        }

        // Online softmax (base 2) per query column over this warp's keys:
        // the lane holds keys g8, g8 + 8 of columns 2t, 2t+1 (soft-capped
        // first where the layer caps); keys past the end or before the
        // window get -inf.
        float sv[4];
#pragma unroll
        for (int e = 0; e < 4; e++) sv[e] = F8 ? s[0][e] + s[1][e] : (s[0][e] + s[1][e]) * sl2;
        if (WC && p.softcap2 > 0.0f) // Gemma 2
#pragma unroll
            for (int e = 0; e < 4; e++) sv[e] = capped_score(p, sv[e]);
        if (tile * KT + KT > kv_end) {
            const int k0 = tile * KT + key0 + g8;
            if (k0 >= kv_end) sv[0] = sv[1] = -INFINITY;
            if (k0 + 8 >= kv_end) sv[2] = sv[3] = -INFINITY;
        }
        if (WC && tile * KT < kv_begin) { // keys before the window (sliding-window layers)
            const int k0 = tile * KT + key0 + g8;
            if (k0 < kv_begin) sv[0] = sv[1] = -INFINITY;
            if (k0 + 8 < kv_begin) sv[2] = sv[3] = -INFINITY;
        }
        float corr[2], m_use[2];
#pragma unroll
        for (int i = 0; i < 2; i++)
            softmax_rescale(max_xor_lanes<4, 8, 16>(fmaxf(sv[i], sv[i + 2])), m[i], l[i], m_use[i], corr[i]);
        float pr[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            pr[e] = exp2f(sv[e] - m_use[e & 1]);
            l[e & 1] += pr[e];
        }
#pragma unroll
        for (int c = 0; c < MT; c++) {
            o[c][0] *= corr[0];
            o[c][1] *= corr[1];
            o[c][2] *= corr[0];
            o[c][3] *= corr[1];
        }

        // P^T as the B fragment: (keys g8 | g8+8, columns 2t, 2t+1) -> transposed.
        const uint32_t pb0 = movmatrix_t(F8 ? pack_f16(pr[0], pr[1]) : pack_bf16(pr[0], pr[1]));
        const uint32_t pb1 = movmatrix_t(F8 ? pack_f16(pr[2], pr[3]) : pack_bf16(pr[2], pr[3]));

        // O^T += V^T P^T.
        if constexpr (F8) {
#pragma unroll
            for (int c = 0; c < MT; c += 2) {
                uint32_t r0, r1, r2, r3, a[4];
                ldsm_x4_t(vaddr + swz_chunk<CPR>(lrow, c + lch) * 16, r0, r1, r2, r3);
                // (k2t,d) (k2t,d+1) (k2t+1,d) (k2t+1,d+1) -> dim d: keys 2t, 2t+1; dim d+1: same keys
                e4m3x4_to_f16(__byte_perm(r0, 0u, 0x3120), a[0], a[1]);
                e4m3x4_to_f16(__byte_perm(r1, 0u, 0x3120), a[2], a[3]);
                mma_f16(o[c], a, pb0, pb1);
                e4m3x4_to_f16(__byte_perm(r2, 0u, 0x3120), a[0], a[1]);
                e4m3x4_to_f16(__byte_perm(r3, 0u, 0x3120), a[2], a[3]);
                mma_f16(o[c + 1], a, pb0, pb1);
            }
        } else {
#pragma unroll
            for (int c = 0; c < MT; c++) {
                uint32_t r0, r1, r2, r3;
                ldsm_x4_t(vaddr + swz_chunk<CPR>(lrow, 2 * c + lch) * 16, r0, r1, r2, r3);
                const uint32_t a[4] = {r0, r2, r1, r3}; // dims c*16 + g8 | + 8, keys 0-7 | 8-15
                mma_bf16(o[c], a, pb0, pb1);
            }
        }
    }
    cp_async_wait<0>();

    // The lane's l covers its two keys per tile: sum over the 8 key rows.
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 4);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 8);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 16);
    }

    // Merge the 4 warps' (m, l, O) through shared memory (the pipeline has
    // drained; the barrier below orders every read of the last stage).
    constexpr int NW = NTHREADS / 32;
    constexpr int RS = HD + 4;                        // padded row stride (floats)
    float *red = reinterpret_cast<float *>(smem_raw); // [NW][8 heads][RS]
    float *sm_m = red + NW * 8 * RS;                  // [NW][8]
    float *sm_l = sm_m + NW * 8;                      // [NW][8]
    float *sm_lse = sm_l + NW * 8;                    // [8]
    int *sm_last = reinterpret_cast<int *>(sm_lse + 8);
    static_assert((NW * 8 * RS + 2 * NW * 8 + 8 + 1) * 4 <= kn_smem_bytes<HD, F8>(), "merge smem");
    __syncthreads();
    if (g8 == 0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            sm_m[warp * 8 + 2 * t4 + i] = m[i];
            sm_l[warp * 8 + 2 * t4 + i] = l[i];
        }
    }
    __syncthreads();
    float f[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int qc = 2 * t4 + i;
        float ms = -INFINITY, ls = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) ms = fmaxf(ms, sm_m[w * 8 + qc]);
#pragma unroll
        for (int w = 0; w < NW; w++) {
            float mw = sm_m[w * 8 + qc];
            ls += mw == -INFINITY ? 0.0f : exp2f(mw - ms) * sm_l[w * 8 + qc];
        }
        f[i] = (m[i] == -INFINITY || ls == 0.0f) ? 0.0f : exp2f(m[i] - ms) / ls;
        if (warp == 0 && g8 == 0) sm_lse[qc] = ls > 0.0f ? ms + log2f(ls) : -INFINITY;
    }
    // Un-permute: accumulator rows g8 and g8 + 8 of m-tile c hold dims
    // c*16 + 2*g8 (+1) for fp8, c*16 + g8 (+8) for bf16.
#pragma unroll
    for (int c = 0; c < MT; c++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int d = c * 16 + (F8 ? 2 * g8 + h : g8 + 8 * h);
            red[(warp * 8 + 2 * t4) * RS + d] = o[c][2 * h] * f[0];
            red[(warp * 8 + 2 * t4 + 1) * RS + d] = o[c][2 * h + 1] * f[1];
        }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD / 2; idx += NTHREADS) {
        const int qh = idx / (HD / 2), c = (idx % (HD / 2)) * 2;
        float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < NW; w++) {
            float2 v = *reinterpret_cast<const float2 *>(red + (w * 8 + qh) * RS + c);
            acc.x += v.x;
            acc.y += v.y;
        }
        acc.x *= vsc;
        acc.y *= vsc;
        const size_t oi = out_row0 + qh;
        if (!partial) {
            *reinterpret_cast<__nv_bfloat162 *>(p.out + oi * HD + c) = __floats2bfloat162_rn(acc.x, acc.y);
        } else {
            const size_t pi = oi * p.max_splits + blockIdx.z;
            *reinterpret_cast<float2 *>(p.part_o + pi * HD + c) = acc;
            if (c == 0) p.part_lse[pi] = sm_lse[qh];
        }
    }
    if (!partial) return;
    // Stream-K style combine, as v2 (item = (sequence, KV head); gridDim.y == 1).
    split_arrive_and_combine<HD>(p, blockIdx.x, n_parts, sm_last, out_row0, G);
}

// --- host side ---------------------------------------------------------------------------

// Compute capability of the current device as major * 10 + minor (cached).
int device_cc() {
    static std::atomic<int> cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    int v = cache[dev & 63].load(std::memory_order_relaxed);
    if (v > 0) return v;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    v = major * 10 + minor;
    cache[dev & 63].store(v, std::memory_order_relaxed);
    return v;
}

// v4 applies to groups of <= 8 query heads on sm_89+ (cvt e4m3x2; the
// sm_80 build of the kernel carries only an untested ALU fallback).
bool kn_applies(int group) { return group >= 1 && group <= KN_MAX_GROUP && device_cc() >= 89; }

template <int HD, bool F8, bool WC = false> int kn_set_smem_attr() {
    static std::atomic<uint64_t> done{0};
    int dev = 0;
    PG_CUDA_TRY(cudaGetDevice(&dev));
    uint64_t bit = 1ull << (dev & 63);
    if (done.load(std::memory_order_acquire) & bit) return 0;
    PG_CUDA_TRY(cudaFuncSetAttribute(paged_decode_kn_kernel<HD, F8, WC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kn_smem_bytes<HD, F8>()));
    done.fetch_or(bit, std::memory_order_release);
    return 0;
}

// Resident v4 CTAs per SM (the split plan's slots; computed once).
template <int HD, bool F8, bool WC = false> int kn_ctas_per_sm() {
    static const int n = [] {
        int v = 0;
        if (kn_set_smem_attr<HD, F8, WC>() < 0 ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, paged_decode_kn_kernel<HD, F8, WC>, NTHREADS,
                                                          kn_smem_bytes<HD, F8>()) != cudaSuccess ||
            v < 1)
            v = 1;
        return v;
    }();
    return n;
}

int kn_ctas_per_sm_of(int head_dim, bool f8) {
    switch (head_dim) {
    case 64: return f8 ? kn_ctas_per_sm<64, true>() : kn_ctas_per_sm<64, false>();
    case 128: return f8 ? kn_ctas_per_sm<128, true>() : kn_ctas_per_sm<128, false>();
    default: return f8 ? kn_ctas_per_sm<256, true>() : kn_ctas_per_sm<256, false>();
    }
}

template <int HD, bool F8, bool WC>
int launch_decode_kn(void *out, const void *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                     pg_kv_shape kv, const int32_t *block_tables, int32_t bt_stride, const int32_t *seq_lens,
                     int32_t n_seqs, int32_t n_heads, float scale, int32_t max_seq_len, void *workspace,
                     size_t workspace_bytes, cudaStream_t st) {
    PG_TRY((kn_set_smem_attr<HD, F8, WC>()));
    const AttnParams p = decode_params(out, q, q_stride, k_cache, v_cache, kv, block_tables, bt_stride, seq_lens,
                                       n_seqs, n_heads, scale, max_seq_len, workspace, workspace_bytes, 1,
                                       kn_ctas_per_sm<HD, F8, WC>(), F8);
    dim3 grid((unsigned)(n_seqs * kv.n_kv_heads), 1, (unsigned)p.max_splits);
    PG_CUDA_TRY(pg_launch_pdl(paged_decode_kn_kernel<HD, F8, WC>, grid, dim3(NTHREADS), kn_smem_bytes<HD, F8>(), st, p));
    PG_CUDA_LAUNCHED("paged_decode_kn_kernel");
    return 0;
}

} // namespace
