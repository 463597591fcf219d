// kernels/cuda/lora_int.cuh - what the graph-safe LoRA op's two shapes
// share (lora_graph.cu: a CTA a row; lora_tiles.cu: tiles of rows of one
// adapter). Internal to those two files; the contract is cuda_ops.h's
// pg_cuda_lora_apply_dev.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

// The projections of one launch: their tables and first columns (c0[n]:
// every column).
struct pg_lora_proj {
    const pg_cuda_lora_dev_slot *tab[PG_CUDA_LORA_MAX_PROJ];
    int64_t c0[PG_CUDA_LORA_MAX_PROJ + 1];
    int n;
};

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
