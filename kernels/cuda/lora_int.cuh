// kernels/cuda/lora_int.cuh - what the graph-safe LoRA op's three shapes
// share (lora_graph.cu: a CTA a row; lora_tiles.cu: tiles of rows of one
// adapter; lora_fused.cu: one launch a call for small row counts). Internal
// to those files; the contract is cuda_ops.h's pg_cuda_lora_apply_dev.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

// The projections of one launch: their tables and first columns (c0[n]:
// every column).
struct pg_lora_proj {
    const pg_cuda_lora_dev_slot *tab[PG_CUDA_LORA_MAX_PROJ];
    int64_t c0[PG_CUDA_LORA_MAX_PROJ + 1];
    int n;
};

// --- Sums in a fixed order (both lora_graph.cu's kernels and lora_fused.cu's) ---

__device__ __forceinline__ float pg_lora_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The warp's sums of each of v's RP values (RP 8, 16, 32 or 64), spread
// over the lanes: on return lane l holds in v[0 .. pg_lora_scatter<RP>::N)
// the sums of the values pg_lora_scatter<RP>::rank(l, q). Each sum is
// pg_lora_warp_sum's bit for bit: the same pairs of lanes (l, l ^ o) are
// added at each stage o = 16 .. 1, and a float sum is the same either way
// round; but a stage exchanges only the half of the values the lane gives
// away (16 values: 8 + 4 + 2 + 1 + 1 shuffles where pg_lora_warp_sum on
// each takes 80).
template <int RP> struct pg_lora_scatter {
    static_assert(RP == 8 || RP == 16 || RP == 32 || RP == 64, "ranks 8, 16, 32, 64");
    static constexpr int N = RP >= 32 ? RP / 32 : 1;             // values a lane keeps
    static constexpr int SH = RP >= 32 ? 0 : (RP == 16 ? 1 : 2); // lanes sharing a value: 1 << SH
    __device__ static int rank(int lane, int q) { return (lane >> SH) * N + q; }
    __device__ static bool writer(int lane) { return (lane & ((1 << SH) - 1)) == 0; }
};
template <int N, int O> struct pg_lora_scatter_stage {
    __device__ __forceinline__ static void run(float *v, int lane) {
        if constexpr (O > 0) {
            if constexpr (N > 1) {
                // The upper half stays with the lanes whose bit O is set.
                const bool hi = (lane & O) != 0;
#pragma unroll
                for (int q = 0; q < N / 2; q++) {
                    const float give = hi ? v[q] : v[q + N / 2], keep = hi ? v[q + N / 2] : v[q];
                    v[q] = keep + __shfl_xor_sync(0xffffffffu, give, O);
                }
                pg_lora_scatter_stage<N / 2, O / 2>::run(v, lane);
            } else {
                v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
                pg_lora_scatter_stage<1, O / 2>::run(v, lane);
            }
        }
    }
};
template <int RP> __device__ __forceinline__ void pg_lora_scatter_sum(float (&v)[RP], int lane) {
    pg_lora_scatter_stage<RP, 16>::run(v, lane);
}

// Whether x's row and the norm weight take 16-byte loads (x's pieces);
// a's are checked per entry.
__device__ __forceinline__ bool pg_lora_vec_ok(const bf16 *xr, const bf16 *nw, int64_t in) {
    return (in & 7) == 0 && ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(nw)) & 15) == 0;
}

// Eight bf16 at p (16-byte aligned) in one 16-byte load: pg_unpack8 takes
// its uint4 by reference, so unpacking straight from memory reads it as
// four 4-byte loads.
__device__ __forceinline__ uint4 pg_lora_ld16(const bf16 *p) { return *reinterpret_cast<const uint4 *>(p); }

// acc[r] += xf . a[r][k .. k+8) for every r < rank (a: [rank][in] bf16,
// row k's piece 16-byte aligned): the pieces of A are loaded 16 ranks at
// a time into registers, every load of a group issued before its FMAs, so
// a group costs one round trip to memory. Ranks past `rank` in a group
// read row 0 again (in bounds; not summed). Session 31: with the load
// inside `if (r < rank)` as before, nvcc issued one rank's load per
// branch and waited for each in turn (ncu: 12 us a shrink launch at one
// row, the expand 6); the sums and their order are unchanged.
template <int RP>
__device__ __forceinline__ void pg_lora_piece_fma(float (&acc)[RP], const float (&xf)[8], const bf16 *a, int64_t in,
                                                  int64_t k, int rank) {
    constexpr int G = RP < 16 ? RP : 16;
#pragma unroll
    for (int g = 0; g < RP; g += G) {
        if (g >= rank) break; // uniform across the block
        uint4 av[G];
#pragma unroll
        for (int u = 0; u < G; u++)
            av[u] = *reinterpret_cast<const uint4 *>(a + (int64_t)(g + u < rank ? g + u : 0) * in + k);
#pragma unroll
        for (int u = 0; u < G; u++)
            if (g + u < rank) {
                float af[8];
                pg_unpack8(av[u], af);
#pragma unroll
                for (int q = 0; q < 8; q++) acc[g + u] = fmaf(xf[q], af[q], acc[g + u]);
            }
    }
}

// t[i][pq][r]: the shrink's parts of row i, projection pq, rank r over its
// chunks, summed in order (four loads in flight at a time), times the
// row's inverse RMS with a norm. parts: [chunks][m][n][tstride].
__device__ __forceinline__ float pg_lora_t_value(const float *parts, const float *rms, int chunks, int64_t m,
                                                 int tstride, int n, int64_t i, int pq, int r) {
    const int64_t cs = m * n * tstride; // one chunk's stride
    const float *pp = parts + (i * n + pq) * tstride + r;
    float v = 0.f;
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
    return v;
}

// The expand's tail for one row and CW adjacent columns (both shapes):
// acc = t . B over the rank (from the 16-byte pieces bv when bvec, else
// from B's row br element by element), then out = ov + scale * acc in bf16,
// one 4-byte store for CW 2. brs: B's row stride (the adapter's rank);
// rank: how much of it t holds.
template <int CW, int NB>
__device__ __forceinline__ void pg_lora_expand_store(bf16 *o, const float *tp, const uint4 (&bv)[CW][NB],
                                                     const bf16 *br, int brs, int rank, bool bvec, float scale,
                                                     const float (&ov)[CW]) {
    float acc[CW];
#pragma unroll
    for (int c = 0; c < CW; c++) {
        acc[c] = 0.f;
        if (bvec) {
#pragma unroll
            for (int q = 0; q < NB; q++)
                if (q * 8 < rank) {
                    float bf[8];
                    pg_unpack8(bv[c][q], bf);
#pragma unroll
                    for (int u = 0; u < 8; u++) acc[c] = fmaf(tp[q * 8 + u], bf[u], acc[c]);
                }
        } else {
            for (int r = 0; r < rank; r++) acc[c] = fmaf(tp[r], __bfloat162float(br[c * brs + r]), acc[c]);
        }
    }
    if (CW == 1) {
        *o = __float2bfloat16(fmaf(scale, acc[0], ov[0]));
    } else {
        *reinterpret_cast<__nv_bfloat162 *>(o) =
            __floats2bfloat162_rn(fmaf(scale, acc[0], ov[0]), fmaf(scale, acc[CW - 1], ov[CW - 1]));
    }
}

// lora_tiles.cu's shrink and expand over m rows (the tiled shape of
// pg_cuda_lora_apply_dev; the arguments are that function's, checked, with
// the workspace split into parts and rms as lora_graph.cu splits it, and
// even: every projection starts at an even column and out takes 4-byte
// stores).
cudaError_t pg_lora_tiles_launch(bf16 *out, int64_t ldo, float *parts, float *rms, int tstride, const bf16 *x,
                                 int64_t ldx, int64_t in, const bf16 *nw, float eps, const int32_t *rows,
                                 const pg_lora_proj &pj, int64_t m, int n_slots, int chunks, bool even,
                                 cudaStream_t st);
// lora_fused.cu's one kernel over m rows (the fused shape of
// pg_cuda_lora_apply_dev for calls of at most pg_cuda_lora_dev_fused_rows()
// rows; the arguments are that function's, checked; no workspace; tstride:
// the max rank; even: as pg_lora_tiles_launch's).
cudaError_t pg_lora_fused_launch(bf16 *out, int64_t ldo, const bf16 *x, int64_t ldx, int64_t in, const bf16 *nw,
                                 float eps, int tstride, const int32_t *rows, const pg_lora_proj &pj, int64_t m,
                                 bool even, cudaStream_t st);
