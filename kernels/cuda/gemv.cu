// kernels/cuda/gemv.cu - weight-streaming GEMV for small batches (m <= 8),
// plain, with RMSNorm fused into the prologue, and with RMSNorm + SiLU*mul
// fused around the gate/up product.
//
// At decode batch sizes a projection is a read of its weight matrix: out[m][n]
// = x[m][k] . w[n][k]^T moves n*k*2 bytes of weights and a few KB of
// activations, so everything here serves keeping HBM busy:
//   - one persistent CTA of 512 threads per SM (grid = min(SMs, tasks));
//   - x (m bf16 rows) is staged once per CTA in shared memory (normalized
//     there when the norm is fused) while the first weight tiles of every
//     warp are already on their way into L2 (prefetch);
//   - a warp task is R output columns: R weight rows (or a gate row and its
//     up row). Tasks are dealt to CTAs round-robin first, then to the warps
//     of a CTA, so every SM streams the same number of rows within one task;
//   - a lane reads 16-byte chunks of a row (a warp load covers 512
//     contiguous bytes), U chunks per row in flight before any arithmetic,
//     with ld.global.nc.L1::no_allocate and an L2 evict_first policy: the
//     weights are used once per step and should not push x, the KV cache or
//     the activations out of the caches;
//   - fp32 accumulation, butterfly shuffles, bf16 out (+ the old out when
//     accumulating, as cuBLASLt's beta = 1).
//   - PDL (cuda_common.cuh): launched with programmatic stream
//     serialization, a CTA takes an SM as soon as the previous kernel's CTA
//     there has left, prefetches its first weight tiles into L2 (the
//     weights depend on no kernel), then waits for the previous grid before
//     it reads x (or out, accumulating) and triggers the next launch.
// gemv_ring_kernel (below) is the same GEMV with the weights staged through
// shared memory, loaded before the PDL wait when the caller promises that
// the weights are static; it is the default under that promise.
// The fused variants reproduce the unfused path operation by operation:
// pg_cuda_add_rmsnorm's fp32 sum of squares in its exact order and rounding
// of the normalized row to bf16; pg_cuda_silu_mul's rounding of gate and up
// to bf16 before silu(g) * u. CPU references: tests/gpu/test_cuda_kernels.cu.
//
// FP8 weights (PG_DTYPE_FP8_E4M3: e4m3 [n][k] and an f32 scale per row) run
// through the same kernels (template WT = W_FP8; pg_cuda_gemv_fp8 and its
// fused variants): a 16-byte chunk then holds 16 weights, decoded exactly
// (e4m3 -> f16 -> f32) in two halves of 8, each against 8 bf16 of x; the
// row's scale multiplies the finished sum (weight-only: x stays bf16, as
// qgemv.cu's FP8 GEMV, which this replaces for decode). Each weight byte is
// read once, so a step reads half the bytes of the bf16 weights. x is
// staged with its 16-byte chunks permuted (even chunks first, then odd:
// xpos()), so a warp's x reads for one half stay on consecutive addresses
// (no bank conflicts). A chunk meets twice the x bytes of a bf16 chunk, so
// more output rows share one x read as m grows (Cfg::R).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdlib.h>

#include <atomic>

#include "kernels/cuda/cuda_common.cuh"

namespace {

constexpr int THREADS = 512; // one CTA per SM: 16 warps, up to 128 registers each
constexpr int WARPS = THREADS / 32;

enum Mode { PLAIN = 0, NORM = 1, NORM_SILU = 2 };
enum WType { W_BF16 = 0, W_FP8 = 1 };

// Per (m, mode): R output columns per warp task, RR weight rows streamed per
// task, U 16-byte loads per row and lane in flight, A partial sums per
// (row, x row) so the FMA chains stay short at small m. R = 2 for m >= 3
// halves the shared-memory reads of x per weight byte; U keeps 8-16 loads
// per lane in flight within 128 registers. A depends on m only and a lane
// visits its chunks in the same order whatever U is, so a row's sum is the
// same bits in every mode (the fused launchers equal the unfused chain).
// FP8 (WT = W_FP8): a chunk meets 32 bytes of each x row, so R grows
// sooner (2 from m = 2, 4 from m = 5; gate/up 2 rows each from m = 3) to
// keep the shared-memory reads of x per weight byte near bf16's.
template <int M, int MODE, int WT = W_BF16> struct Cfg {
    static constexpr int R = WT == W_FP8 ? (MODE == NORM_SILU ? (M >= 3 ? 2 : 1) : (M >= 5 ? 4 : M >= 2 ? 2 : 1))
                                         : (MODE == NORM_SILU ? 1 : (M >= 3 ? 2 : 1));
    static constexpr int RR = MODE == NORM_SILU ? 2 * R : R;
    static constexpr int U = (M >= 5 ? 8 : 16) / RR;
    static constexpr int A = M == 1 ? 4 : M == 2 ? 2 : 1;
};

struct Args {
    bf16 *out;             // [m][ldo]
    const bf16 *x;         // [m][ldx]
    const bf16 *w;         // [n][k], NORM_SILU: [2n][k] (gate rows, then up rows)
    const bf16 *norm_w;    // [k] (fused norm only)
    int64_t ldo, ldx;
    int n;                 // output columns (NORM_SILU: ffn)
    int k;
    int accumulate;        // PLAIN only
    float eps;
    uint32_t zero;         // always 0 (see gemv_step)
    int preload;           // ring kernel: weights may be read before pg_pdl_wait()
    const float *wscale;   // W_FP8: f32 [n] (NORM_SILU: [2n]) row scales; else null
};

// Weight chunks (16 bytes) per row of k: 8 bf16 or 16 e4m3 each.
template <int WT> __host__ __device__ __forceinline__ int chunks_of(int k) { return WT == W_FP8 ? k >> 4 : k >> 3; }

// Where x's 16-byte chunk c (8 bf16) sits in shared memory: in place for
// bf16 weights; for FP8 weights (kc = k / 16 weight chunks, k8 = 2 kc x
// chunks) the even chunks first, then the odd ones, so weight chunk c's two
// halves are x chunks c and kc + c there.
template <int WT> __device__ __forceinline__ int xpos(int c, int kc) {
    return WT == W_FP8 ? (c & 1) * kc + (c >> 1) : c;
}

__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// A 16-byte weight chunk: read-only path, not kept in L1, first out of L2.
__device__ __forceinline__ uint4 ld_weight(const uint4 *p, uint64_t pol) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    return v;
}

__device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// 8 bf16 in 16 bytes -> 8 floats (exact: a bf16 is the top half of an f32).
__device__ __forceinline__ void unpack8(const uint4 &u, float f[8]) {
    f[0] = __uint_as_float(u.x << 16), f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16), f[3] = __uint_as_float(u.y & 0xffff0000u);
    f[4] = __uint_as_float(u.z << 16), f[5] = __uint_as_float(u.z & 0xffff0000u);
    f[6] = __uint_as_float(u.w << 16), f[7] = __uint_as_float(u.w & 0xffff0000u);
}


// 4 e4m3 in 4 bytes -> 4 floats, exact (e4m3 -> f16 is exact: its
// subnormals are f16 normals; f16 -> f32 is exact; NaN stays NaN).
__device__ __forceinline__ void fp8x4(uint32_t v, float f[4]) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

// Half h of a 16-byte weight chunk as 8 floats: the chunk's 8 bf16 (h = 0,
// the only half), or its e4m3 values 8h..8h+7.
template <int WT> __device__ __forceinline__ void unpack_w(const uint4 &u, int h, float f[8]) {
    if constexpr (WT == W_FP8) {
        fp8x4(h ? u.z : u.x, f);
        fp8x4(h ? u.w : u.y, f + 4);
    } else {
        unpack8(u, f);
    }
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// As pg_cuda_silu_mul.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// x rows [M][k8 chunks] in shared memory -> RMSNorm(x) * norm_w, rounded to
// bf16, in place. The sum of squares of a row is computed exactly as
// add_rmsnorm_vec_kernel does it (elementwise.cu) with its launch shape for
// dim = k: T threads (VPT chunks each, chunk t + u*T), each summing
// v*v in chunk order, a xor butterfly per warp, then the warp sums added in
// warp order. The warps here play those T virtual threads, so the fused
// path normalizes to the same bf16 values as the unfused one.
// FP8 weights: x's chunks sit where xpos() puts them (kc = k8 / 2).
template <int M, int NT = THREADS, int WT = W_BF16>
__device__ void normalize_rows(uint4 *xs, int k8, const Args &a, float *wsum /* [M][32] */,
                               float *rs /* [M] */) {
    const int kc = k8 >> 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int vpt = k8 <= 1024 ? 1 : k8 <= 2048 ? 2 : 4;
    const int T = ((k8 + vpt - 1) / vpt + 31) / 32 * 32, nvw = T / 32; // nvw <= 32: k8 <= 4096
    for (int job = warp; job < M * nvw; job += NT / 32) {
        const int i = job / nvw, vw = job - i * nvw, t = vw * 32 + lane;
        float ss = 0.0f;
        for (int u = 0; u < vpt; u++) {
            const int vi = t + u * T;
            if (vi < k8) {
                float v[8];
                unpack8(xs[(size_t)i * k8 + xpos<WT>(vi, kc)], v);
#pragma unroll
                for (int e = 0; e < 8; e++) ss += v[e] * v[e];
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) wsum[i * 32 + vw] = ss;
    }
    __syncthreads();
    if (threadIdx.x < M) {
        float tot = 0.0f;
        for (int vw = 0; vw < nvw; vw++) tot += wsum[threadIdx.x * 32 + vw];
        rs[threadIdx.x] = 1.0f / sqrtf(tot / (float)a.k + a.eps);
    }
    __syncthreads();
    const uint4 *nw = reinterpret_cast<const uint4 *>(a.norm_w);
    for (int e = threadIdx.x; e < M * k8; e += NT) {
        const int i = e / k8, c = e - i * k8;
        const size_t p = (size_t)i * k8 + xpos<WT>(c, kc);
        float v[8], g[8], o[8];
        unpack8(xs[p], v);
        unpack8(nw[c], g);
        const float r = rs[i];
#pragma unroll
        for (int q = 0; q < 8; q++) o[q] = v[q] * r * g[q]; // (v * rs) * w, as the unfused kernel
        xs[p] = pack8(o);
    }
}

// One step of a task: weight chunks [base, base + 32U) of its RR rows (kc
// chunks a row), all loads issued before the first FMA. TAIL: the step runs
// past the row's end (the loads beyond kc are skipped, so are their
// products). x rows are k8 chunks apart in xs.
template <int M, int RR, int U, int A, bool TAIL, int WT>
__device__ __forceinline__ void gemv_step(float (&acc)[RR][M][A], const uint4 *const (&wr)[RR],
                                          const uint4 *xs, int kc, int k8, int base, int lane, uint64_t pol,
                                          uint32_t zero) {
    constexpr int NH = WT == W_FP8 ? 2 : 1; // halves of 8 weights in a chunk
    uint4 wv[RR][U];
    const int at = base + lane; // chunk u of this lane: at + 32u (immediate offsets)
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int rr = 0; rr < RR; rr++) {
            if (!TAIL || at + u * 32 < kc) wv[rr][u] = ld_weight(wr[rr] + at + u * 32, pol);
            else wv[rr][u] = make_uint4(0, 0, 0, 0);
        }
    // ptxas would otherwise sink the later loads below the first FMAs (to
    // reuse their registers), leaving a third of the bytes in flight. The x
    // address is made to depend on every loaded word (xor, and `zero`, a
    // kernel argument that is always 0 and so opaque to the compiler), so all
    // RR * U loads are issued before any arithmetic.
    uint32_t dep = 0;
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int rr = 0; rr < RR; rr++) dep ^= wv[rr][u].x ^ wv[rr][u].y ^ wv[rr][u].z ^ wv[rr][u].w;
    const uint4 *xl = xs + at + (dep & zero);
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (TAIL && at + u * 32 >= kc) break; // and so are all later chunks of this lane
#pragma unroll
        for (int h = 0; h < NH; h++) {
            float wf[RR][8];
#pragma unroll
            for (int rr = 0; rr < RR; rr++) unpack_w<WT>(wv[rr][u], h, wf[rr]);
#pragma unroll
            for (int i = 0; i < M; i++) {
                float xf[8];
                unpack8(xl[(size_t)i * k8 + h * kc + u * 32], xf);
#pragma unroll
                for (int rr = 0; rr < RR; rr++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[rr][i][e % A] = fmaf(wf[rr][e], xf[e], acc[rr][i][e % A]);
            }
        }
    }
}

// A task's partial sums back to zero.
template <int RR, int M, int A> __device__ __forceinline__ void zero_acc(float (&acc)[RR][M][A]) {
#pragma unroll
    for (int rr = 0; rr < RR; rr++)
#pragma unroll
        for (int i = 0; i < M; i++)
#pragma unroll
            for (int q = 0; q < A; q++) acc[rr][i][q] = 0.0f;
}

// The end of a warp task (both kernels, so they give the same bits): each
// output's A partial sums are added in order, then an xor butterfly gives
// every lane every sum; lane r * M + i writes output (i, t * R + r) (with
// NORM_SILU: bf16(silu(g) * u) of the gate and up rows r and R + r). FP8
// weights: each sum times its row's scale first (gate row j, up row n + j),
// as the unfused chain's GEMV rounds it.
template <int M, int MODE, int R, int RR, int A, int WT>
__device__ __forceinline__ void finish_task(const float (&acc)[RR][M][A], const Args &a, int t, int lane) {
    float res[RR][M];
#pragma unroll
    for (int rr = 0; rr < RR; rr++)
#pragma unroll
        for (int i = 0; i < M; i++) {
            float s = acc[rr][i][0];
#pragma unroll
            for (int q = 1; q < A; q++) s += acc[rr][i][q];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            res[rr][i] = s;
        }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) {
            const int j = t * R + r;
            if (lane != r * M + i || j >= a.n) continue;
            bf16 *o = a.out + (size_t)i * (size_t)a.ldo + (size_t)j;
            float v;
            if (MODE == NORM_SILU) {
                float sg = res[r][i], su = res[R + r][i];
                if (WT == W_FP8) sg *= a.wscale[j], su *= a.wscale[(size_t)a.n + j];
                const float g = round_bf16(sg), u = round_bf16(su);
                v = silu(g) * u;
            } else {
                v = res[r][i];
                if (WT == W_FP8) v *= a.wscale[j];
                if (a.accumulate) v += __bfloat162float(*o);
            }
            *o = __float2bfloat16(v);
        }
}

template <int M, int MODE, int WT>
__global__ void __launch_bounds__(THREADS, 1) gemv_kernel(Args a) {
    using C = Cfg<M, MODE, WT>;
    constexpr int R = C::R, RR = C::RR, U = C::U, A = C::A;
    static_assert(R * M <= 32, "one lane per output of a task");
    extern __shared__ uint4 smem[]; // x [M][k8], then (fused norm) wsum [M][32], rs [M]
    const int k8 = a.k >> 3, kc = chunks_of<WT>(a.k);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_tasks = (a.n + R - 1) / R;
    // Task t goes to CTA t % grid, then to its warps in turn.
    const int first = blockIdx.x + gridDim.x * warp, stride = gridDim.x * WARPS;
    const uint4 *w4 = reinterpret_cast<const uint4 *>(a.w);
    const uint64_t pol = evict_first_policy();

    // Weight row of stream rr of task t. Columns past n (a last task of R = 2
    // with odd n) re-read column n - 1; their results are never written.
    auto row_ptr = [&](int t, int rr) -> const uint4 * {
        int c = t * R + rr % R;
        if (c >= a.n) c = a.n - 1;
        const size_t row = (MODE == NORM_SILU && rr >= R) ? (size_t)a.n + (size_t)c : (size_t)c;
        return w4 + row * (size_t)kc;
    };

    // Start HBM on the first step's weights while x is staged and (PDL)
    // while the previous kernel drains: the weights are no kernel's output,
    // and an L2 prefetch is safe even if they were (L2 is the coherence
    // point; it returns nothing to registers).
    if (first < n_tasks) {
#pragma unroll
        for (int rr = 0; rr < RR; rr++) {
            const uint4 *wr = row_ptr(first, rr);
#pragma unroll
            for (int u = 0; u < U; u++)
                if (u * 32 + lane < kc) prefetch_l2(wr + u * 32 + lane);
        }
    }

    // PDL: x, and out when accumulating (the residual stream), are earlier
    // kernels' outputs; out is written below. Every CTA passes here.
    pg_pdl_wait();

    uint4 *xs = smem;
    for (int e = threadIdx.x; e < M * k8; e += THREADS) {
        const int i = e / k8, c = e - i * k8;
        xs[(size_t)i * k8 + xpos<WT>(c, kc)] = reinterpret_cast<const uint4 *>(a.x + (size_t)i * (size_t)a.ldx)[c];
    }
    if (MODE != PLAIN) {
        __syncthreads();
        float *wsum = reinterpret_cast<float *>(xs + (size_t)M * k8);
        normalize_rows<M, THREADS, WT>(xs, k8, a, wsum, wsum + M * 32);
    }
    __syncthreads();
    // The next kernel may be scheduled now (its CTAs take SMs as ours leave,
    // prefetch, and wait for our completion).
    pg_pdl_trigger();

    for (int t = first; t < n_tasks; t += stride) {
        const uint4 *wr[RR];
#pragma unroll
        for (int rr = 0; rr < RR; rr++) wr[rr] = row_ptr(t, rr);
        float acc[RR][M][A];
        zero_acc(acc);
        int base = 0;
        for (; base + U * 32 <= kc; base += U * 32)
            gemv_step<M, RR, U, A, false, WT>(acc, wr, xs, kc, k8, base, lane, pol, a.zero);
        if (base < kc) gemv_step<M, RR, U, A, true, WT>(acc, wr, xs, kc, k8, base, lane, pol, a.zero);

        finish_task<M, MODE, R, RR, A, WT>(acc, a, t, lane);
    }
}

// --- the ring kernel: weights staged through shared memory, loaded before the wait ---
//
// gemv_kernel keeps its in-flight bytes in registers, so a warp's loads drop
// to zero between its steps and tasks, and under PDL it may only prefetch into
// L2 before pg_pdl_wait(). This kernel keeps gemv_kernel's task order and
// per-lane summation order (so its sums are the same bits; the test checks
// the decode chain against kind 0 bit for bit) but:
//   - weights go global -> shared memory with cp.async (16 bytes per lane, L2
//     evict_first), S stages of PC chunks per lane in a per-warp ring. A lane
//     reads back only the chunks it copied itself, so no barrier is needed:
//     cp.async.wait_group orders the thread's own copies. In-flight bytes cost
//     no registers and stay (S - 1) pieces deep across task boundaries (task
//     i + 1's first pieces load while task i is reduced and written);
//   - with Args::preload (pg_cuda_gemv_preload_set: the caller promises that
//     no kernel still running writes the weights) the first S - 1 pieces are
//     issued before pg_pdl_wait(), i.e. while the previous kernel still runs:
//     up to 190 KB per SM (25 MB over the GPU, ~6 us of HBM) is already on
//     its way when the wait returns. This is what pays in the W1 chain, most
//     after decode attention (few CTAs, HBM mostly idle), where the O GEMV's
//     CTAs land on the idle SMs early. Without the promise the same bytes
//     are only L2-prefetched there and copied after the wait.
// NT and MINB: kinds 1-3 use the whole SM (512 threads, up to 128 registers,
// a 128-192 KB ring). Kind 4 (256 threads, MINB 2, 80 KB) fits two CTAs per
// SM so that the next kernel's CTA could be resident during our tail; it
// measured 25% slower (64 KB in flight per SM is too few bytes for HBM's
// latency under load; docs/cuda_kernels.md) and is kept for comparison.
template <int M, int MODE, int NT, int PC, int S, int MINB, int WT>
__global__ void __launch_bounds__(NT, MINB) gemv_ring_kernel(Args a) {
    using C = Cfg<M, MODE, WT>;
    constexpr int R = C::R, RR = C::RR, A = C::A;
    constexpr int NH = WT == W_FP8 ? 2 : 1;
    constexpr int PU = PC / RR > 0 ? PC / RR : 1; // chunks per row and lane in one piece
    constexpr int NW = NT / 32;
    static_assert(R * M <= 32, "one lane per output of a task");
    extern __shared__ uint4 smem[]; // x [M][k8], (fused norm) wsum/rs, then ring [NW][S][RR][PU][32]
    const int k8 = a.k >> 3, kc = chunks_of<WT>(a.k);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_tasks = (a.n + R - 1) / R;
    const int first = blockIdx.x + gridDim.x * warp, stride = gridDim.x * NW;
    const int my_tasks = first < n_tasks ? (n_tasks - first + stride - 1) / stride : 0;
    const int npt = (kc + 32 * PU - 1) / (32 * PU); // pieces per task
    const int n_pieces = my_tasks * npt;
    const uint4 *w4 = reinterpret_cast<const uint4 *>(a.w);
    const uint64_t pol = evict_first_policy();
    uint4 *xs = smem;
    const int scratch = MODE != PLAIN ? (M * 33 * 4 + 15) / 16 : 0; // in uint4
    uint4 *ring = smem + (size_t)M * k8 + scratch + (size_t)warp * (S * RR * PU * 32);
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);

    auto row_ptr = [&](int t, int rr) -> const uint4 * {
        int c = t * R + rr % R;
        if (c >= a.n) c = a.n - 1;
        const size_t row = (MODE == NORM_SILU && rr >= R) ? (size_t)a.n + (size_t)c : (size_t)c;
        return w4 + row * (size_t)kc;
    };
    // Issue iterator: the next piece to copy (task it, chunk base ib, stage is).
    int ip = 0, it = first, ib = 0, is = 0;
    auto issue = [&](bool l2_only) {
        if (ip < n_pieces) {
#pragma unroll
            for (int rr = 0; rr < RR; rr++) {
                const uint4 *wr = row_ptr(it, rr);
#pragma unroll
                for (int u = 0; u < PU; u++) {
                    const int c = ib + u * 32 + lane;
                    if (c < kc) {
                        if (l2_only) prefetch_l2(wr + c);
                        else {
                            const uint32_t d = ring_s + (uint32_t)((((is * RR + rr) * PU + u) * 32 + lane) * 16);
                            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(d),
                                         "l"(wr + c), "l"(pol)
                                         : "memory");
                        }
                    }
                }
            }
            ip++;
            if ((ib += 32 * PU) >= kc) ib = 0, it += stride;
            if (++is == S) is = 0;
        }
        if (!l2_only) asm volatile("cp.async.commit_group;" ::: "memory");
    };

    if (a.preload) {
        // The weights are not written by the kernel before us (the caller's
        // promise), so they may be read before the wait.
#pragma unroll
        for (int s = 0; s < S - 1; s++) issue(false);
    } else {
        // An L2 prefetch of the same bytes is safe whatever wrote them.
#pragma unroll
        for (int s = 0; s < S - 1; s++) issue(true);
        ip = 0, it = first, ib = 0, is = 0;
    }

    // PDL: x, and out when accumulating, are earlier kernels' outputs; out is
    // written below. Every CTA passes here.
    pg_pdl_wait();

    for (int e = threadIdx.x; e < M * k8; e += NT) {
        const int i = e / k8, c = e - i * k8;
        xs[(size_t)i * k8 + xpos<WT>(c, kc)] = reinterpret_cast<const uint4 *>(a.x + (size_t)i * (size_t)a.ldx)[c];
    }
    if (!a.preload) {
#pragma unroll
        for (int s = 0; s < S - 1; s++) issue(false);
    }
    if (MODE != PLAIN) {
        __syncthreads();
        float *wsum = reinterpret_cast<float *>(xs + (size_t)M * k8);
        normalize_rows<M, NT, WT>(xs, k8, a, wsum, wsum + M * 32);
    }
    __syncthreads();
    pg_pdl_trigger();

    float acc[RR][M][A];
    zero_acc(acc);
    int ct = first, cb = 0, cs = 0; // compute iterator: task, chunk base, stage
    for (int p = 0; p < n_pieces; p++) {
        issue(false); // piece p + S - 1 (or an empty group), into the stage piece p - 1 used
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory"); // piece p has landed
        const uint4 *st = ring + (size_t)cs * (RR * PU * 32) + lane;
#pragma unroll
        for (int u = 0; u < PU; u++) {
            const int c = cb + u * 32 + lane;
            if (c >= kc) break; // and so are all later chunks of this lane
#pragma unroll
            for (int h = 0; h < NH; h++) {
                float wf[RR][8];
#pragma unroll
                for (int rr = 0; rr < RR; rr++) unpack_w<WT>(st[(rr * PU + u) * 32], h, wf[rr]);
#pragma unroll
                for (int i = 0; i < M; i++) {
                    float xf[8];
                    unpack8(xs[(size_t)i * k8 + h * kc + c], xf);
#pragma unroll
                    for (int rr = 0; rr < RR; rr++)
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[rr][i][e % A] = fmaf(wf[rr][e], xf[e], acc[rr][i][e % A]);
                }
            }
        }
        if (++cs == S) cs = 0;
        if ((cb += 32 * PU) < kc) continue;
        // Task ct is complete: reduce and write it, then restart the sums.
        finish_task<M, MODE, R, RR, A, WT>(acc, a, ct, lane);
        zero_acc(acc);
        cb = 0, ct += stride;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

int smem_optin(int dev) {
    static std::atomic<int> cache[64];
    int v = cache[dev & 63].load(std::memory_order_relaxed);
    if (v > 0) return v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || v <= 0) {
        (void)cudaGetLastError();
        v = 48 * 1024;
    }
    cache[dev & 63].store(v, std::memory_order_relaxed);
    return v;
}

template <int M, int MODE, int WT> int launch(const Args &a, cudaStream_t st) {
    using C = Cfg<M, MODE, WT>;
    const size_t smem = (size_t)M * (size_t)a.k * sizeof(bf16) + (MODE != PLAIN ? (size_t)M * 33 * sizeof(float) : 0);
    int dev = 0;
    PG_CUDA_TRY(cudaGetDevice(&dev));
    const int optin = smem_optin(dev);
    if (smem > (size_t)optin)
        return pg_err_set(PG_EUNSUPP, "gemv: m %d x k %d needs %zu bytes of shared memory, the device allows %d", M,
                          a.k, smem, optin);
    // Raised once per kernel and device (before any graph capture: the first
    // eager call of a shape does it).
    static std::atomic<int> smem_set[64];
    if (smem > 48 * 1024 && !smem_set[dev & 63].load(std::memory_order_acquire)) {
        PG_CUDA_TRY(cudaFuncSetAttribute(gemv_kernel<M, MODE, WT>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        smem_set[dev & 63].store(1, std::memory_order_release);
    }
    const int n_tasks = (a.n + C::R - 1) / C::R;
    int grid = pg_cuda_sm_count();
    if (grid > n_tasks) grid = n_tasks;
    PG_CUDA_TRY(pg_launch_pdl(gemv_kernel<M, MODE, WT>, dim3(grid), dim3(THREADS), smem, st, a));
    PG_CUDA_LAUNCHED("gemv_kernel");
    return 0;
}

// Which kernel the launchers use (pg_cuda_gemv_kernel_set, PAGED_CUDA_GEMV_KERNEL):
//   0  gemv_kernel, 512 threads, the whole SM
//   1  ring, 512 threads, 4 chunks/lane/piece, 4 stages (128 KB ring)      [all m]
//   2  ring, 512 threads, 4 chunks, 6 stages (192 KB)                     [m <= 2, else 1]
//   3  ring, 512 threads, 8 chunks, 3 stages (192 KB)                     [m <= 2, else 1]
//   4  ring, 256 threads (<= 128 registers), 4 chunks, 5 stages (80 KB):
//      half an SM, so two kernels' CTAs share one                        [m <= 2, else 1]
// A ring that does not fit in shared memory falls back to kind 1's, and
// that one to kind 0. The default (KIND_AUTO) is kind 2 when the caller has
// made the weights-before-wait promise (pg_cuda_gemv_preload_set), kind 1
// for FP8 weights, and kind 0 otherwise: measured in the W1 chain (docs/cuda_kernels.md), kind 2 with
// preload saves 3 us per layer, but without preload it is 3 us slower than
// kind 0, since its deeper ring then fills only after the wait.
constexpr int KIND_AUTO = -1, KIND_UNREAD = -2;
std::atomic<int> g_kind{KIND_UNREAD}, g_preload{0};

int gemv_kind() {
    int v = g_kind.load(std::memory_order_relaxed);
    if (v == KIND_UNREAD) {
        const char *e = getenv("PAGED_CUDA_GEMV_KERNEL");
        v = e && *e ? atoi(e) : KIND_AUTO;
        if (v < 0 || v > 4) v = KIND_AUTO;
        g_kind.store(v, std::memory_order_relaxed);
    }
    return v;
}

// 1 launched, 0 does not fit (the caller falls back to gemv_kernel), < 0 error.
template <int M, int MODE, int WT, int NT, int PC, int S, int MINB> int launch_ring(const Args &a0, cudaStream_t st) {
    using C = Cfg<M, MODE, WT>;
    constexpr int PU = PC / C::RR > 0 ? PC / C::RR : 1;
    const size_t scratch = MODE != PLAIN ? (size_t)(M * 33 * 4 + 15) / 16 * 16 : 0;
    const size_t smem = (size_t)M * (size_t)a0.k * sizeof(bf16) + scratch + (size_t)(NT / 32) * S * C::RR * PU * 32 * 16;
    int dev = 0;
    PG_CUDA_TRY(cudaGetDevice(&dev));
    const int optin = smem_optin(dev);
    if (smem > (size_t)optin) return 0;
    static std::atomic<int> attr_set[64];
    if (!attr_set[dev & 63].load(std::memory_order_acquire)) {
        PG_CUDA_TRY(cudaFuncSetAttribute(gemv_ring_kernel<M, MODE, NT, PC, S, MINB, WT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        // All of the SM's unified memory as shared memory, so two CTAs (of
        // this kernel and the next) fit side by side; weights bypass L1.
        PG_CUDA_TRY(cudaFuncSetAttribute(gemv_ring_kernel<M, MODE, NT, PC, S, MINB, WT>,
                                         cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        attr_set[dev & 63].store(1, std::memory_order_release);
    }
    Args a = a0;
    a.preload = g_preload.load(std::memory_order_relaxed);
    const int n_tasks = (a.n + C::R - 1) / C::R;
    int grid = pg_cuda_sm_count();
    if (grid > n_tasks) grid = n_tasks;
    PG_CUDA_TRY(pg_launch_pdl(gemv_ring_kernel<M, MODE, NT, PC, S, MINB, WT>, dim3(grid), dim3(NT), smem, st, a));
    PG_CUDA_LAUNCHED("gemv_ring_kernel");
    return 1;
}

template <int M, int MODE, int WT> int launch_kind(const Args &a, cudaStream_t st) {
    int rc = 0;
    int kind = gemv_kind();
    // The default: with the preload promise, kind 2 for bf16 weights and
    // kind 1 for FP8 (W1 with an FP8 checkpoint, H100, session 18: 3.606
    // against 3.693 ms a token for kind 2, twice each; half the bytes a
    // weight row, so the shallower ring is deep enough); kind 0 without it.
    if (kind == KIND_AUTO) kind = g_preload.load(std::memory_order_relaxed) ? (WT == W_FP8 ? 1 : 2) : 0;
    if constexpr (M <= 2) { // the experimental shapes exist for m <= 2 only (compile time)
        if (kind == 2) rc = launch_ring<M, MODE, WT, 512, 4, 6, 1>(a, st);
        else if (kind == 3) rc = launch_ring<M, MODE, WT, 512, 8, 3, 1>(a, st);
        else if (kind == 4) rc = launch_ring<M, MODE, WT, 256, 4, 5, 2>(a, st);
    }
    // Kind 1, and the fallback of a kind whose ring does not fit.
    if (kind != 0 && rc == 0) rc = launch_ring<M, MODE, WT, 512, 4, 4, 1>(a, st);
    if (rc) return rc < 0 ? rc : 0;
    return launch<M, MODE, WT>(a, st);
}

template <int MODE, int WT = W_BF16> int dispatch(int m, const Args &a, cudaStream_t st) {
    switch (m) {
    case 1: return launch_kind<1, MODE, WT>(a, st);
    case 2: return launch_kind<2, MODE, WT>(a, st);
    case 3: return launch_kind<3, MODE, WT>(a, st);
    case 4: return launch_kind<4, MODE, WT>(a, st);
    case 5: return launch_kind<5, MODE, WT>(a, st);
    case 6: return launch_kind<6, MODE, WT>(a, st);
    case 7: return launch_kind<7, MODE, WT>(a, st);
    case 8: return launch_kind<8, MODE, WT>(a, st);
    }
    return pg_err_set(PG_EUNSUPP, "gemv: m %d (at most %d)", m, PG_CUDA_GEMV_MAX_M);
}
static_assert(PG_CUDA_GEMV_MAX_M == 8, "dispatch() instantiates m = 1..8");

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// The checks shared by the three launchers; *rc is 0 when the call should
// launch, 1 when there is nothing to do (m == 0), else the error.
// FP8 weights (wscale given) also need whole 16-byte rows: k % 16 == 0.
int check(const char *who, const void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, int64_t m,
          int64_t n, int64_t k, const void *norm_w, bool norm, bool fp8 = false, const float *wscale = nullptr) {
    PG_ARG(out && x && w && (!norm || norm_w), "%s: null pointer", who);
    PG_ARG(!fp8 || wscale, "%s: fp8_e4m3 weights need their row scales", who);
    PG_ARG(m >= 0 && n > 0 && k > 0 && ldx >= k && ldo >= n, "%s: m %lld n %lld k %lld ldx %lld ldo %lld", who,
           (long long)m, (long long)n, (long long)k, (long long)ldx, (long long)ldo);
    if (m == 0) return 1;
    if (m > PG_CUDA_GEMV_MAX_M)
        return pg_err_set(PG_EUNSUPP, "%s: m %lld (at most %d)", who, (long long)m, PG_CUDA_GEMV_MAX_M);
    if (k % 8 || ldx % 8 || !aligned16(x) || !aligned16(w) || (norm && !aligned16(norm_w)))
        return pg_err_set(PG_EUNSUPP, "%s: k %lld, ldx %lld and x, w%s must be multiples of 16 bytes", who,
                          (long long)k, (long long)ldx, norm ? ", norm_w" : "");
    if (fp8 && k % 16)
        return pg_err_set(PG_EUNSUPP, "%s: fp8 rows of k %lld are not whole 16-byte chunks", who, (long long)k);
    if (n > (1 << 29) || k > (1 << 20))
        return pg_err_set(PG_EUNSUPP, "%s: n %lld k %lld too large", who, (long long)n, (long long)k);
    // The unfused norm's vector path (whose summation order the fused norm
    // copies) stops at 4096 chunks.
    if (norm && k > 8 * 4096)
        return pg_err_set(PG_EUNSUPP, "%s: fused RMSNorm over k %lld (at most 32768)", who, (long long)k);
    return 0;
}

} // namespace

// --- C API -------------------------------------------------------------------------------

extern "C" int pg_cuda_gemv_bf16(void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, int64_t m,
                                 int64_t n, int64_t k, int accumulate, void *stream) {
    int rc = check("gemv", out, ldo, x, ldx, w, m, n, k, nullptr, false);
    if (rc) return rc < 0 ? rc : 0;
    Args a = {(bf16 *)out, (const bf16 *)x, (const bf16 *)w, nullptr, ldo, ldx, (int)n, (int)k, accumulate ? 1 : 0, 0.0f, 0, 0};
    return dispatch<PLAIN>((int)m, a, pg_stream(stream));
}

extern "C" int pg_cuda_gemv_rmsnorm_bf16(void *out, int64_t ldo, const void *x, int64_t ldx, const void *norm_w,
                                         float eps, const void *w, int64_t m, int64_t n, int64_t k, void *stream) {
    int rc = check("gemv_rmsnorm", out, ldo, x, ldx, w, m, n, k, norm_w, true);
    if (rc) return rc < 0 ? rc : 0;
    Args a = {(bf16 *)out, (const bf16 *)x, (const bf16 *)w, (const bf16 *)norm_w, ldo, ldx, (int)n, (int)k, 0, eps, 0, 0};
    return dispatch<NORM>((int)m, a, pg_stream(stream));
}

extern "C" int pg_cuda_gemv_rmsnorm_silu_bf16(void *out, int64_t ldo, const void *x, int64_t ldx,
                                              const void *norm_w, float eps, const void *w, int64_t m, int64_t ffn,
                                              int64_t k, void *stream) {
    int rc = check("gemv_rmsnorm_silu", out, ldo, x, ldx, w, m, ffn, k, norm_w, true);
    if (rc) return rc < 0 ? rc : 0;
    Args a = {(bf16 *)out, (const bf16 *)x, (const bf16 *)w, (const bf16 *)norm_w, ldo, ldx, (int)ffn, (int)k, 0, eps, 0, 0};
    return dispatch<NORM_SILU>((int)m, a, pg_stream(stream));
}

extern "C" int pg_cuda_gemv_fp8(void *out, int64_t ldo, const void *x, int64_t ldx, const void *w,
                                const float *wscale, int64_t m, int64_t n, int64_t k, int accumulate, void *stream) {
    int rc = check("gemv_fp8", out, ldo, x, ldx, w, m, n, k, nullptr, false, true, wscale);
    if (rc) return rc < 0 ? rc : 0;
    Args a = {(bf16 *)out, (const bf16 *)x, (const bf16 *)w, nullptr, ldo, ldx, (int)n, (int)k, accumulate ? 1 : 0,
              0.0f, 0, 0, wscale};
    return dispatch<PLAIN, W_FP8>((int)m, a, pg_stream(stream));
}

extern "C" int pg_cuda_gemv_rmsnorm_fp8(void *out, int64_t ldo, const void *x, int64_t ldx, const void *norm_w,
                                        float eps, const void *w, const float *wscale, int64_t m, int64_t n,
                                        int64_t k, void *stream) {
    int rc = check("gemv_rmsnorm_fp8", out, ldo, x, ldx, w, m, n, k, norm_w, true, true, wscale);
    if (rc) return rc < 0 ? rc : 0;
    Args a = {(bf16 *)out, (const bf16 *)x, (const bf16 *)w, (const bf16 *)norm_w, ldo, ldx, (int)n, (int)k, 0, eps,
              0, 0, wscale};
    return dispatch<NORM, W_FP8>((int)m, a, pg_stream(stream));
}

extern "C" int pg_cuda_gemv_rmsnorm_silu_fp8(void *out, int64_t ldo, const void *x, int64_t ldx,
                                             const void *norm_w, float eps, const void *w, const float *wscale,
                                             int64_t m, int64_t ffn, int64_t k, void *stream) {
    int rc = check("gemv_rmsnorm_silu_fp8", out, ldo, x, ldx, w, m, ffn, k, norm_w, true, true, wscale);
    if (rc) return rc < 0 ? rc : 0;
    Args a = {(bf16 *)out, (const bf16 *)x, (const bf16 *)w, (const bf16 *)norm_w, ldo, ldx, (int)ffn, (int)k, 0,
              eps, 0, 0, wscale};
    return dispatch<NORM_SILU, W_FP8>((int)m, a, pg_stream(stream));
}

extern "C" int pg_cuda_gemv_kernel_set(int kind) {
    const int old = gemv_kind();
    g_kind.store(kind >= 0 && kind <= 4 ? kind : KIND_UNREAD, std::memory_order_relaxed);
    return old;
}

extern "C" int pg_cuda_gemv_preload_set(int on) {
    return g_preload.exchange(on ? 1 : 0, std::memory_order_relaxed);
}
