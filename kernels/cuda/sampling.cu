// kernels/cuda/sampling.cu - token sampling on the GPU, kernels/cpu/sampling.c's rules.
//
// Two kernels per call, one CTA per sequence each:
//   logprobs_kernel  (256 threads) log-sum-exp of the raw logits (two passes,
//                    fp64 sum as the CPU) and the top-N raw logits (N <= 20):
//                    per-thread sorted lists in registers, merged by N
//                    block-wide arg-max rounds.
//   sample_kernel    (1024 threads) penalties and banned ids into an fp32
//                    row of the workspace with the arg-max; greedy stops
//                    there. Otherwise the CPU sampler's sorted walk is
//                    reproduced without sorting the vocabulary:
//     - scaled logits s = (l - max) * (1/T), candidates s > -30 (the CPU's
//       window); each element has a unique 64-bit key (s, then lower id)
//       whose descending order is the CPU's qsort order;
//     - a histogram of the candidates over 4096 equal-width bins of s (bins
//       follow key order), counts and fixed-point weights exp(s) * 2^44 in
//       integers, so every partial sum is exact and order-independent;
//     - top-k, top-p, the total and the draw are each "the first element
//       in key order where a running count or weight reaches a target":
//       a block scan over the bins finds the bin, one pass compacts that
//       bin's keys into shared memory, a bitonic sort orders them, and a
//       scan finds the element. A bin over 4096 elements (near-constant
//       logits) is narrowed by 8-bit radix digits of the key first.
//     - min-p is a count of s >= log(min_p) (the top candidate has s = 0).
//   A forced row (prompt logprobs) is scored only: logprobs_kernel adds the
//   given token's rank (a third pass counting greater logits), and
//   sample_kernel writes the token and its logprob and returns.
//   The weights are integers where the CPU sums doubles; the pick differs
//   only when u * total falls within ~1e-12 (relative) of a boundary.
// The RNG is pg_sampler_uniform(seed, n_generated), bit for bit.
#include <math.h>

#include <atomic>

#include "kernels/cuda/cuda_common.cuh"

namespace {

constexpr int NB = 4096;          // histogram bins of s over (-30, 0]
constexpr float WINDOW = 30.0f;   // kernels/cpu/sampling.c LOGIT_WINDOW
constexpr int CAP = 4096;         // keys sorted in shared memory at once
constexpr int THREADS = 1024;     // sample_kernel
constexpr int LP_THREADS = 256;   // logprobs_kernel
constexpr int NTOP = PG_SAMPLE_MAX_LOGPROBS;
constexpr double FX = 17592186044416.0; // 2^44: weights exp(s) in (9e-14, 1] -> [1, 2^44]
constexpr uint32_t CNT_REP = 1u << 31; // token in history (repetition penalty)
constexpr uint32_t CNT_BAN = 1u << 30; // token banned (EOS / stop ids under min_tokens)
constexpr uint32_t CNT_MASK = CNT_BAN - 1;
static_assert(THREADS * 4 == NB && THREADS * 4 == CAP, "locate scans 4 bins / keys per thread");

// --- keys ---------------------------------------------------------------------------------

// Monotone map of floats to unsigned ints (larger float, larger int).
__device__ __forceinline__ uint32_t ord_f(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float unord_f(uint32_t o) {
    return __uint_as_float((o & 0x80000000u) ? (o ^ 0x80000000u) : ~o);
}
// Larger key = earlier in the CPU's order: larger value, then lower id.
__device__ __forceinline__ uint64_t make_key(float v, int id) {
    if (v == 0.0f) v = 0.0f; // -0 ties +0, as the CPU's comparisons
    return ((uint64_t)ord_f(v) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)id);
}
__device__ __forceinline__ int key_id(uint64_t k) { return (int)(0xFFFFFFFFu - (uint32_t)k); }
__device__ __forceinline__ float key_val(uint64_t k) { return unord_f((uint32_t)(k >> 32)); }

template <typename T> __device__ __forceinline__ float ld_logit(const T *p, int64_t i);
template <> __device__ __forceinline__ float ld_logit<float>(const float *p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float ld_logit<bf16>(const bf16 *p, int64_t i) { return __bfloat162float(p[i]); }

// Row passes: each thread takes 8 consecutive elements per step with one
// 16-byte load (two for f32) where the row is aligned and the 8 are inside
// it, so a pass keeps enough bytes in flight; every thread runs the same
// number of steps (warp-collective code may sit inside).
template <typename T> __device__ __forceinline__ void load8(const T *row, int i, int n, bool vec, float v[8]);
template <> __device__ __forceinline__ void load8<bf16>(const bf16 *row, int i, int n, bool vec, float v[8]) {
    if (vec && i + 8 <= n) {
        uint4 u = *reinterpret_cast<const uint4 *>(row + i);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 f = __bfloat1622float2(h[k]);
            v[2 * k] = f.x;
            v[2 * k + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = i + k < n ? __bfloat162float(row[i + k]) : 0.0f;
    }
}
template <> __device__ __forceinline__ void load8<float>(const float *row, int i, int n, bool vec, float v[8]) {
    if (vec && i + 8 <= n) {
        float4 a = *reinterpret_cast<const float4 *>(row + i), b = *reinterpret_cast<const float4 *>(row + i + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = i + k < n ? row[i + k] : 0.0f;
    }
}
__device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
__device__ __forceinline__ int row_steps(int n, int nth) { return (n + nth * 8 - 1) / (nth * 8); }

// kernels/cpu/sampling.c pg_sampler_uniform, bit for bit.
__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
__device__ __forceinline__ double uniform01(uint64_t seed, uint64_t counter) {
    uint64_t r = splitmix64(splitmix64(seed) ^ splitmix64(counter + 0x632be59bd9b4e019ull));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

// --- block reductions (every thread of the block calls; all get the result) ------------------

__device__ __forceinline__ uint64_t block_max_u64(uint64_t v, uint64_t *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        uint64_t y = __shfl_xor_sync(0xffffffffu, v, o);
        v = y > v ? y : v;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    uint64_t r = 0;
    for (int w = 0; w < nw; w++) r = sh[w] > r ? sh[w] : r;
    return r;
}

__device__ __forceinline__ double block_sum_f64(double v, double *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double r = 0;
    for (int w = 0; w < nw; w++) r += sh[w];
    return r;
}

// Exclusive prefix sum over the block in thread order; *total gets the sum.
__device__ __forceinline__ uint64_t block_excl_scan(uint64_t v, uint64_t *sh, uint64_t *total) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    uint64_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint64_t t = lane < nw ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            uint64_t y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        if (lane < nw) sh[lane] = t;
    }
    __syncthreads();
    *total = sh[nw - 1];
    return (warp > 0 ? sh[warp - 1] : 0) + x - v;
}

// --- logprobs_kernel ----------------------------------------------------------------------

// out[s].logprob temporarily holds the log-sum-exp of the raw row for
// sample_kernel, which replaces it with the token's logprob.
template <typename T>
__global__ void __launch_bounds__(LP_THREADS)
logprobs_kernel(pg_sample_out *outs, const T *logits, int64_t ld, int vocab, const pg_sample_params *params) {
    __shared__ uint64_t sh_u[32];
    __shared__ double sh_d[32];
    const int seq = blockIdx.x;
    pg_sample_out *out = outs + seq;
    const int lp = params[seq].logprobs;
    if (lp < 0) {
        if (threadIdx.x == 0) {
            out->n_top = 0;
            out->logprob = 0.0f;
            out->rank = 0;
        }
        return;
    }
    const int k = lp < NTOP ? lp : NTOP;
    const T *row = logits + (size_t)seq * ld;
    float mx = -INFINITY;
    uint64_t list[NTOP]; // this thread's top keys, descending
#pragma unroll
    for (int j = 0; j < NTOP; j++) list[j] = 0;
    const bool vec = aligned16(row);
    const int steps = row_steps(vocab, LP_THREADS);
    for (int st = 0; st < steps; st++) {
        const int i0 = (st * LP_THREADS + threadIdx.x) * 8;
        float v8[8];
        load8(row, i0, vocab, vec, v8);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (i0 + e >= vocab) break;
            float v = v8[e];
            mx = fmaxf(mx, v);
            if (k > 0) {
                uint64_t key = make_key(v, i0 + e);
                if (key > list[NTOP - 1]) {
#pragma unroll
                    for (int j = 0; j < NTOP; j++) {
                        if (key > list[j]) {
                            uint64_t t = list[j];
                            list[j] = key;
                            key = t;
                        }
                    }
                }
            }
        }
    }
    mx = key_val(block_max_u64(make_key(mx, 0), sh_u));
    double sum = 0.0;
    for (int st = 0; st < steps; st++) {
        const int i0 = (st * LP_THREADS + threadIdx.x) * 8;
        float v8[8];
        load8(row, i0, vocab, vec, v8);
#pragma unroll
        for (int e = 0; e < 8; e++)
            if (i0 + e < vocab) sum += exp((double)(v8[e] - mx));
    }
    sum = block_sum_f64(sum, sh_d);
    const float lse = mx + (float)log(sum);
    int n_top = 0;
    for (int r = 0; r < k; r++) {
        uint64_t best = block_max_u64(list[0], sh_u);
        if (best == 0) break; // vocab < k
        if (list[0] == best) {
#pragma unroll
            for (int j = 0; j < NTOP - 1; j++) list[j] = list[j + 1];
            list[NTOP - 1] = 0;
        }
        if (threadIdx.x == 0) {
            out->top_ids[r] = key_id(best);
            out->top_logprobs[r] = key_val(best) - lse;
        }
        n_top++;
    }
    int rank = 0;
    const int ft = params[seq].forced_token;
    if (params[seq].forced && ft >= 0 && ft < vocab) {
        // Strictly greater, as the CPU (and vLLM): ties do not push it down.
        const float ref = ld_logit(row, ft);
        double above = 0.0;
        for (int st = 0; st < steps; st++) {
            const int i0 = (st * LP_THREADS + threadIdx.x) * 8;
            float v8[8];
            load8(row, i0, vocab, vec, v8);
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (i0 + e < vocab && v8[e] > ref) above += 1.0;
        }
        rank = (int)block_sum_f64(above, sh_d) + 1;
    }
    if (threadIdx.x == 0) {
        out->n_top = n_top;
        out->logprob = lse;
        out->rank = rank;
    }
}

// --- sample_kernel ------------------------------------------------------------------------

struct Smem {
    uint32_t hcnt[NB];  // candidates per bin
    uint64_t hw[NB];    // fixed-point weight per bin
    uint64_t keys[CAP]; // one bin's keys, sorted
    uint32_t rcnt[256]; // radix narrowing of an oversized bin
    uint64_t rw[256];
    uint64_t red[32];   // reductions
    double redd[32];
    int ival[4];
    uint64_t uval[4];
};

struct Ctx {
    const float *proc; // penalized, banned logits [vocab]
    int vocab;
    float mx, inv_t;
    Smem *sm;
};

struct Loc {
    int found;
    int rank;          // position in key order
    uint64_t w_before; // weight of the elements before it
    uint64_t w;        // its weight
    int id;
};

__device__ __forceinline__ bool cand(const Ctx &c, float l, float &s) {
    // (l - max) * (1/T) in two roundings, as the CPU (no FMA contraction).
    s = __fmul_rn(__fsub_rn(l, c.mx), c.inv_t);
    if (s == 0.0f) s = 0.0f; // -0 -> +0: one key for equal values
    return s > -WINDOW;
}
__device__ __forceinline__ int bin_of(float s) {
    int b = (int)(-s * ((float)NB / WINDOW));
    return b < 0 ? 0 : (b >= NB ? NB - 1 : b);
}
__device__ __forceinline__ uint64_t wfx(float s) { return (uint64_t)(exp((double)s) * FX); }

// mode 0: the element of rank `rank`; 1: first with inclusive weight >= T;
// 2: first with inclusive weight > T.
__device__ __forceinline__ bool reached(int mode, uint64_t incl, double T) {
    return mode == 1 ? (double)incl >= T : (double)incl > T;
}

__device__ Loc locate(const Ctx &c, int mode, int rank, double T) {
    Smem &sm = *c.sm;
    const int tid = threadIdx.x;
    const int steps = row_steps(c.vocab, THREADS);
    // 1. The bin, by a scan over the histogram (4 bins per thread).
    uint32_t lc[4];
    uint64_t lw[4];
    uint64_t cs = 0, ws = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        lc[k] = sm.hcnt[tid * 4 + k];
        lw[k] = sm.hw[tid * 4 + k];
        cs += lc[k];
        ws += lw[k];
    }
    uint64_t ctot, wtot;
    uint64_t cc = block_excl_scan(cs, sm.red, &ctot);
    uint64_t ww = block_excl_scan(ws, sm.red, &wtot);
    if (tid == 0) sm.ival[0] = -1;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 4; k++) {
        bool hit;
        if (mode == 0) hit = (uint64_t)rank >= cc && (uint64_t)rank < cc + lc[k];
        else hit = lc[k] > 0 && reached(mode, ww + lw[k], T) && (cc == 0 || !reached(mode, ww, T));
        if (hit) {
            sm.ival[0] = tid * 4 + k;
            sm.uval[0] = cc;
            sm.uval[1] = ww;
        }
        cc += lc[k];
        ww += lw[k];
    }
    __syncthreads();
    const int b = sm.ival[0];
    Loc res = {0, 0, 0, 0, 0};
    if (b < 0) return res; // weight never reached / rank out of range
    uint64_t c_before = sm.uval[0], w_before = sm.uval[1];
    uint32_t nb = sm.hcnt[b];

    // 2. An oversized bin: narrow by 8-bit digits of the key, top first.
    uint64_t prefix = 0;
    int plen = 0;
    while (nb > (uint32_t)CAP) {
        __syncthreads();
        if (tid < 256) {
            sm.rcnt[tid] = 0;
            sm.rw[tid] = 0;
        }
        __syncthreads();
        const int shift = 56 - plen;
        for (int st = 0; st < steps; st++) {
            const int i0 = (st * THREADS + tid) * 8;
            float v8[8];
            load8(c.proc, i0, c.vocab, true, v8);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float s;
                if (i0 + e >= c.vocab || !cand(c, v8[e], s) || bin_of(s) != b) continue;
                uint64_t key = make_key(s, i0 + e);
                if (plen > 0 && (key >> (64 - plen)) != prefix) continue;
                int d = (int)((key >> shift) & 255);
                atomicAdd(&sm.rcnt[d], 1u);
                atomicAdd((unsigned long long *)&sm.rw[d], (unsigned long long)wfx(s));
            }
        }
        __syncthreads();
        if (tid == 0) {
            int pick = 0;
            for (int d = 255; d >= 0; d--) { // descending key order
                uint32_t n = sm.rcnt[d];
                if (n == 0) continue;
                bool hit = mode == 0 ? (uint64_t)rank < c_before + n
                                     : reached(mode, w_before + sm.rw[d], T) && (c_before == 0 || !reached(mode, w_before, T));
                pick = d;
                if (hit) break;
                c_before += n;
                w_before += sm.rw[d];
            }
            sm.ival[1] = pick;
            sm.uval[0] = c_before;
            sm.uval[1] = w_before;
        }
        __syncthreads();
        const int d = sm.ival[1];
        c_before = sm.uval[0];
        w_before = sm.uval[1];
        nb = sm.rcnt[d];
        prefix = (prefix << 8) | (uint64_t)d;
        plen += 8;
    }

    // 3. Compact the bin's (or digit range's) keys, sort them descending.
    __syncthreads();
    if (tid == 0) sm.ival[2] = 0;
    __syncthreads();
    const int lane = tid % 32;
    for (int st = 0; st < steps; st++) {
        const int i0 = (st * THREADS + tid) * 8;
        float v8[8];
        load8(c.proc, i0, c.vocab, true, v8);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float s = 0.0f;
            bool take = i0 + e < c.vocab && cand(c, v8[e], s) && bin_of(s) == b;
            uint64_t key = take ? make_key(s, i0 + e) : 0;
            if (take && plen > 0 && (key >> (64 - plen)) != prefix) take = false;
            unsigned m = __ballot_sync(0xffffffffu, take);
            if (m) {
                int first = __ffs(m) - 1, at = 0;
                if (lane == first) at = atomicAdd(&sm.ival[2], __popc(m));
                at = __shfl_sync(0xffffffffu, at, first);
                if (take) sm.keys[at + __popc(m & ((1u << lane) - 1))] = key;
            }
        }
    }
    __syncthreads();
    const int n = sm.ival[2];
    int p2 = 1;
    while (p2 < n) p2 <<= 1;
    for (int i = n + tid; i < p2; i += THREADS) sm.keys[i] = 0;
    __syncthreads();
    for (int k = 2; k <= p2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < p2; i += THREADS) {
                int ixj = i ^ j;
                if (ixj > i) {
                    uint64_t a = sm.keys[i], bb = sm.keys[ixj];
                    bool desc = (i & k) == 0;
                    if (desc ? a < bb : a > bb) {
                        sm.keys[i] = bb;
                        sm.keys[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }

    // 4. The element: a scan of the sorted weights (4 per thread).
    uint64_t wv[4];
    uint64_t lsum = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int idx = tid * 4 + k;
        wv[k] = idx < n ? wfx(key_val(sm.keys[idx])) : 0;
        lsum += wv[k];
    }
    uint64_t tot;
    uint64_t run = w_before + block_excl_scan(lsum, sm.red, &tot);
    if (tid == 0) sm.ival[3] = -1;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int idx = tid * 4 + k;
        if (idx < n) {
            uint64_t g = c_before + idx; // global rank
            bool hit = mode == 0 ? g == (uint64_t)rank
                                 : reached(mode, run + wv[k], T) && (g == 0 || !reached(mode, run, T));
            if (hit) {
                sm.ival[3] = idx;
                sm.uval[2] = run;
            }
        }
        run += wv[k];
    }
    __syncthreads();
    const int idx = sm.ival[3];
    if (idx >= 0) {
        res.found = 1;
        res.rank = (int)(c_before + idx);
        res.w_before = sm.uval[2];
        res.w = wfx(key_val(sm.keys[idx]));
        res.id = key_id(sm.keys[idx]);
    }
    __syncthreads(); // smem reused by the next call
    return res;
}

template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
sample_kernel(pg_sample_out *outs, const T *logits, int64_t ld, int vocab, int64_t vocab_pad,
              const pg_sample_params *params, const int32_t *tokens, float *ws_proc, uint32_t *ws_cnt) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw);
    const int seq = blockIdx.x, tid = threadIdx.x;
    const pg_sample_params pp = params[seq];
    const T *row = logits + (size_t)seq * ld;
    if (pp.forced) { // scored only (logprobs_kernel left the log-sum-exp); the whole block returns
        if (tid == 0) {
            pg_sample_out *out = outs + seq;
            const int t = pp.forced_token;
            out->token = t;
            out->logprob = pp.logprobs >= 0 && t >= 0 && t < vocab ? ld_logit(row, t) - out->logprob : 0.0f;
        }
        return;
    }
    float *proc = ws_proc + (size_t)seq * vocab_pad;
    uint32_t *cnt = ws_cnt + (size_t)seq * vocab_pad;

    // Penalties and bans, as per-token flags and counts.
    const bool rep = pp.repetition_penalty != 1.0f && pp.repetition_penalty > 0.0f;
    const bool pres = pp.presence_penalty != 0.0f, freq = pp.frequency_penalty != 0.0f;
    const bool pen = rep || pres || freq;
    const bool use_cnt = pen || pp.n_ban > 0;
    if (use_cnt) {
        for (int i = tid; i < vocab; i += THREADS) cnt[i] = 0;
        __syncthreads();
        if (pen)
            for (int j = tid; j < pp.n_history; j += THREADS) {
                int t = tokens[pp.hist_offset + j];
                if (t < 0 || t >= vocab) continue;
                if (rep) atomicOr(&cnt[t], CNT_REP);
                if (j >= pp.n_prompt) atomicAdd(&cnt[t], 1u);
            }
        for (int j = tid; j < pp.n_ban; j += THREADS) {
            int t = tokens[pp.ban_offset + j];
            if (t >= 0 && t < vocab) atomicOr(&cnt[t], CNT_BAN);
        }
        __syncthreads();
    }
    uint64_t best = 0;
    const bool vec = aligned16(row);
    const int steps = row_steps(vocab, THREADS);
    for (int st = 0; st < steps; st++) {
        const int i0 = (st * THREADS + tid) * 8;
        float v8[8];
        load8(row, i0, vocab, vec, v8);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int i = i0 + e;
            if (i >= vocab) break;
            float l = v8[e];
            if (use_cnt) {
                uint32_t c = cnt[i];
                if (rep && (c & CNT_REP))
                    l = l > 0.0f ? __fdiv_rn(l, pp.repetition_penalty) : __fmul_rn(l, pp.repetition_penalty);
                uint32_t n = c & CNT_MASK;
                if (n) {
                    if (freq) l = __fsub_rn(l, __fmul_rn(pp.frequency_penalty, (float)n));
                    if (pres) l = __fsub_rn(l, pp.presence_penalty);
                }
                if (c & CNT_BAN) l = -INFINITY;
            }
            if (pp.n_mask > 0) { // allowed-token bitmask (structured outputs)
                const int w = i >> 5;
                if (w >= pp.n_mask || !((uint32_t)tokens[pp.mask_offset + w] >> (i & 31) & 1u))
                    l = -INFINITY;
            }
            v8[e] = l;
            uint64_t key = make_key(l, i);
            best = key > best ? key : best;
        }
        if (i0 + 8 <= vocab) { // proc rows are 16-byte aligned (vocab_pad % 64 == 0)
            *reinterpret_cast<float4 *>(proc + i0) = make_float4(v8[0], v8[1], v8[2], v8[3]);
            *reinterpret_cast<float4 *>(proc + i0 + 4) = make_float4(v8[4], v8[5], v8[6], v8[7]);
        } else {
            for (int e = 0; e < 8 && i0 + e < vocab; e++) proc[i0 + e] = v8[e];
        }
    }
    if (pp.n_bias > 0) {
        // Logit bias, after the bans and before the mask takes effect (a
        // masked token stays at -inf), then the maximum again over the row:
        // a negative bias may have lowered the best token.
        __syncthreads();
        for (int j = tid; j < pp.n_bias; j += THREADS) {
            const int t = tokens[pp.bias_offset + 2 * j];
            const float bv = __int_as_float(tokens[pp.bias_offset + 2 * j + 1]);
            if (t >= 0 && t < vocab && proc[t] != -INFINITY) proc[t] = __fadd_rn(proc[t], bv);
        }
        __syncthreads();
        best = 0;
        for (int i = tid; i < vocab; i += THREADS) {
            uint64_t key = make_key(proc[i], i);
            best = key > best ? key : best;
        }
    }
    best = block_max_u64(best, sm.red);
    int token = key_id(best);
    const float mx = key_val(best);

    if (!(pp.temperature <= 0.0f || pp.top_k == 1)) {
        __syncthreads(); // proc[] written by all threads is read by all below
        Ctx c = {proc, vocab, mx, __fdiv_rn(1.0f, pp.temperature), &sm};
        for (int b = tid; b < NB; b += THREADS) {
            sm.hcnt[b] = 0;
            sm.hw[b] = 0;
        }
        __syncthreads();
        for (int st = 0; st < steps; st++) {
            const int i0 = (st * THREADS + tid) * 8;
            float v8[8];
            load8(proc, i0, vocab, true, v8);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float s;
                if (i0 + e >= vocab || !cand(c, v8[e], s)) continue;
                int b = bin_of(s);
                atomicAdd(&sm.hcnt[b], 1u);
                atomicAdd((unsigned long long *)&sm.hw[b], (unsigned long long)wfx(s));
            }
        }
        __syncthreads();
        uint64_t lc = 0, lw = 0, ncand64, wall;
        for (int b = tid; b < NB; b += THREADS) {
            lc += sm.hcnt[b];
            lw += sm.hw[b];
        }
        block_excl_scan(lc, sm.red, &ncand64);
        block_excl_scan(lw, sm.red, &wall);
        const int ncand = (int)ncand64;
        int n = ncand;
        if (pp.top_k > 0 && pp.top_k < n) n = pp.top_k;
        uint64_t total = wall;
        if (n < ncand) {
            Loc l = locate(c, 0, n - 1, 0.0);
            total = l.w_before + l.w;
        }
        if (pp.top_p < 1.0f) {
            Loc l = locate(c, 1, 0, (double)pp.top_p * (double)total);
            int keep = l.found && l.rank < n ? l.rank + 1 : n;
            if (keep < n) {
                n = keep;
                total = l.w_before + l.w;
            }
        }
        if (pp.min_p > 0.0f) {
            const double thresh = log((double)pp.min_p);
            uint64_t k = 0;
            for (int st = 0; st < steps; st++) {
                const int i0 = (st * THREADS + tid) * 8;
                float v8[8];
                load8(proc, i0, vocab, true, v8);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    float s;
                    if (i0 + e < vocab && cand(c, v8[e], s) && (double)s >= thresh) k++;
                }
            }
            uint64_t kt;
            block_excl_scan(k, sm.red, &kt);
            int keep = (int)kt < n ? (int)kt : n;
            if (keep < 1) keep = 1;
            if (keep < n) {
                n = keep;
                Loc l = locate(c, 0, n - 1, 0.0);
                total = l.w_before + l.w;
            }
        }
        const double u = uniform01(pp.seed, (uint64_t)pp.n_generated) * (double)total;
        Loc l = locate(c, 2, 0, u);
        if (!l.found || l.rank >= n) l = locate(c, 0, n - 1, 0.0); // the CPU's fall-through pick
        if (l.found) token = l.id;
    }
    if (tid == 0) {
        pg_sample_out *out = outs + seq;
        out->token = token;
        out->logprob = pp.logprobs >= 0 ? ld_logit(row, token) - out->logprob : 0.0f;
    }
}

template <typename T>
int launch_sample(pg_sample_out *out, const void *logits, int64_t ld, int n, int vocab,
                  const pg_sample_params *params, const int32_t *tokens, void *workspace, cudaStream_t st) {
    static_assert(sizeof(Smem) <= 200 * 1024, "sampler smem");
    int dev = 0;
    PG_CUDA_TRY(cudaGetDevice(&dev));
    static std::atomic<uint64_t> done{0};
    if (!(done.load() & (1ull << (dev & 63)))) {
        PG_CUDA_TRY(cudaFuncSetAttribute(sample_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(Smem)));
        done.fetch_or(1ull << (dev & 63));
    }
    const size_t vp = pg_cuda_sample_vocab_pad(vocab);
    uintptr_t base = ((uintptr_t)workspace + 255) & ~(uintptr_t)255;
    float *proc = (float *)base;
    uint32_t *cnt = (uint32_t *)(proc + (size_t)n * vp);
    logprobs_kernel<T><<<n, LP_THREADS, 0, st>>>(out, (const T *)logits, ld, vocab, params);
    PG_CUDA_LAUNCHED("logprobs_kernel");
    sample_kernel<T><<<n, THREADS, sizeof(Smem), st>>>(out, (const T *)logits, ld, vocab, (int64_t)vp, params, tokens,
                                                       proc, cnt);
    PG_CUDA_LAUNCHED("sample_kernel");
    return 0;
}

} // namespace

extern "C" int pg_cuda_sample(pg_sample_out *out, const void *logits, int logits_dtype, int64_t ld_logits,
                              int32_t n, int32_t vocab, const pg_sample_params *params, const int32_t *tokens,
                              void *workspace, size_t workspace_bytes, void *stream) {
    PG_ARG(out && logits && params, "sample: null pointer");
    PG_ARG(n >= 0 && vocab > 0 && ld_logits >= vocab, "sample: n %d vocab %d ld %lld", n, vocab, (long long)ld_logits);
    PG_ARG(logits_dtype == PG_CUDA_F32 || logits_dtype == PG_CUDA_BF16, "sample: logits dtype %d", logits_dtype);
    if (n == 0) return 0;
    PG_ARG(workspace && workspace_bytes >= pg_cuda_sample_workspace_size(n, vocab),
           "sample: workspace %zu bytes, needs %zu", workspace_bytes, pg_cuda_sample_workspace_size(n, vocab));
    cudaStream_t st = pg_stream(stream);
    if (logits_dtype == PG_CUDA_F32)
        return launch_sample<float>(out, logits, ld_logits, n, vocab, params, tokens, workspace, st);
    return launch_sample<bf16>(out, logits, ld_logits, n, vocab, params, tokens, workspace, st);
}

// --- async scheduling: sampled tokens fed to the next step ------------------------------

namespace {
__global__ void feed_tokens_kernel(int32_t *tokens, const pg_sample_out *prev, const int32_t *pairs,
                                   int32_t n) {
    const int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) tokens[pairs[2 * i]] = prev[pairs[2 * i + 1]].token;
}
} // namespace

extern "C" int pg_cuda_feed_tokens(int32_t *tokens, const pg_sample_out *prev, const int32_t *pairs,
                                   int32_t n, void *stream) {
    PG_ARG(n >= 0, "feed_tokens: n %d", n);
    if (n == 0) return 0;
    PG_ARG(tokens && prev && pairs, "feed_tokens: null pointer");
    feed_tokens_kernel<<<(unsigned)((n + 255) / 256), 256, 0, pg_stream(stream)>>>(tokens, prev, pairs, n);
    PG_CUDA_LAUNCHED("feed_tokens_kernel");
    return 0;
}
