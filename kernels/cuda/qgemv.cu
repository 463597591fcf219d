// kernels/cuda/qgemv.cu - paged's quantized weight types on the GPU, read as
// they are stored (docs/quantization.md, "CUDA"):
//   PG_DTYPE_FP8_E4M3   [n][k] bytes of e4m3, plus scales f32 [n] (one per row)
//   PG_DTYPE_INT4_G128  [n][k/128] blocks of 68 bytes {f16 d; u8 z; u8 0; u8 qs[64]}
//   PG_DTYPE_INT4_G64   [n][k/64] blocks of 36 bytes (qs[32])
// Two kernels:
//   - qgemv_kernel (small m, the decode path): out[i][j] = sum_k x[i][k] *
//     w[j][k] with the weight dequantized in registers, one pass over its
//     bytes; weight-only (x stays bf16, f32 accumulation). FP8: scale_j *
//     sum_k e4m3(q) * x; int4: sum over groups of d * sum((q - z) * x).
//   - qdequant_kernel (large m, prefill): the weight as bf16 [n][k]
//     (bf16(e4m3(q) * scale) and bf16((q - z) * d), each value rounded once,
//     bit for bit pg_dequantize_row's value rounded to bf16), for the bf16
//     cuBLASLt GEMM (gemm.cu); the caller owns the scratch matrix.
// Written for correctness first: plain launches (no PDL), x staged in shared
// memory as bf16 (m * k * 2 bytes, as gemv.cu), one warp per output row of
// a persistent grid (one CTA of 512 threads per SM). Not yet measured on a
// GPU. CPU references: tests/gpu/test_cuda_kernels.cu (cases qgemv, qgemm).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <atomic>

#include "kernels/cuda/cuda_common.cuh"
extern "C" {
#include "kernels/dtype.h"
}

namespace {

constexpr int QTHREADS = 512;
constexpr int QWARPS = QTHREADS / 32;
constexpr int QU = 4; // loads per lane in flight before any arithmetic

// Types as template arguments.
enum QType { Q_FP8 = 0, Q_INT4_G128 = 1, Q_INT4_G64 = 2 };

struct QArgs {
    bf16 *out;            // [m][ldo]
    const bf16 *x;        // [m][ldx]
    const void *w;        // the stored rows
    const float *scales;  // FP8: [n]; else unused
    int64_t ldo, ldx;
    int n, k;
    int accumulate;
};

// e4m3 -> f32, exact (e4m3 -> f16 is exact: its subnormals are f16 normals;
// f16 -> f32 is exact). NaN (S.1111.111) stays NaN.
__device__ __forceinline__ float2 fp8x2_to_f32(uint32_t two) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return __half22float2(__half2(h));
}
__device__ __forceinline__ float fp8_to_f32(uint32_t b) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)(b & 0xffu), __NV_E4M3);
    return __half2float(__half(h));
}

// 4 bf16 in 8 bytes -> 4 floats (exact).
__device__ __forceinline__ void unpack4(const uint2 &u, float f[4]) {
    f[0] = __uint_as_float(u.x << 16), f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16), f[3] = __uint_as_float(u.y & 0xffff0000u);
}

// The f16 scale and the u8 zero point of an int4 block's first word (the
// zero is a whole byte: a GPTQ v1 zero may be 16).
__device__ __forceinline__ void int4_header(uint32_t hdr, float &d, float &z) {
    __half_raw h;
    h.x = (unsigned short)(hdr & 0xffffu);
    d = __half2float(__half(h));
    z = (float)((hdr >> 16) & 0xffu);
}

// One FP8 row: lane reads 16-byte chunks c (elements 16c..16c+15), QU in
// flight, and accumulates sum e4m3(q) * x per x row (the scale is applied
// by the caller after the warp's sum).
template <int M>
__device__ __forceinline__ void row_fp8(float (&acc)[M], const uint8_t *wrow, const bf16 *xs, int k, int lane) {
    const uint4 *w4 = reinterpret_cast<const uint4 *>(wrow);
    const int k16 = k >> 4;
    for (int base = 0; base < k16; base += 32 * QU) {
        uint4 wv[QU];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int c = base + u * 32 + lane;
            wv[u] = c < k16 ? __ldg(w4 + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int c = base + u * 32 + lane;
            if (c >= k16) break;
            float wf[16];
            const uint32_t words[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float2 lo = fp8x2_to_f32(words[q]), hi = fp8x2_to_f32(words[q] >> 16);
                wf[4 * q + 0] = lo.x, wf[4 * q + 1] = lo.y, wf[4 * q + 2] = hi.x, wf[4 * q + 3] = hi.y;
            }
#pragma unroll
            for (int i = 0; i < M; i++) {
                const uint2 *xr = reinterpret_cast<const uint2 *>(xs + (size_t)i * k + 16 * c);
                float s = 0.0f;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float xf[4];
                    unpack4(xr[q], xf);
#pragma unroll
                    for (int e = 0; e < 4; e++) s = fmaf(wf[4 * q + e], xf[e], s);
                }
                acc[i] += s;
            }
        }
    }
}

// One int4 row of groups of G: the row is read as 4-byte words, word t by
// lane t % 32 (coalesced). A block is WB = 1 + G / 8 words: word 0 the
// header (d, z), words 1..G/8 the nibbles. Nibble word j (0-based in qs)
// holds qs bytes 4j..4j+3 of run r = j / 4 at byte offset b = 4 (j % 4):
// low nibbles are elements 32r + b + (0..3), high nibbles 32r + 16 + b + (0..3)
// of the group (docs/quantization.md). A lane reads its word's block header
// (a cached load, shared by the block's other lanes) beside the word.
template <int M, int G>
__device__ __forceinline__ void row_int4(float (&acc)[M], const uint8_t *wrow, const bf16 *xs, int k, int lane) {
    constexpr int WB = 1 + G / 8;
    const uint32_t *w32 = reinterpret_cast<const uint32_t *>(wrow);
    const int nw = (k / G) * WB;
    for (int base = 0; base < nw; base += 32 * QU) {
        uint32_t wv[QU], hv[QU];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int t = base + u * 32 + lane;
            const int b = t / WB;
            wv[u] = t < nw ? __ldg(w32 + t) : 0u;
            hv[u] = t < nw ? __ldg(w32 + (size_t)b * WB) : 0u;
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int t = base + u * 32 + lane;
            if (t >= nw) break;
            const int b = t / WB, j = t - b * WB - 1;
            if (j < 0) continue; // the header word itself
            float d, z;
            int4_header(hv[u], d, z);
            const int e0 = b * G + 32 * (j >> 2) + 4 * (j & 3); // first low-nibble element
            float lo[4], hi[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                lo[q] = (float)((wv[u] >> (8 * q)) & 15u) - z;
                hi[q] = (float)((wv[u] >> (8 * q + 4)) & 15u) - z;
            }
#pragma unroll
            for (int i = 0; i < M; i++) {
                const bf16 *xr = xs + (size_t)i * k + e0;
                float xl[4], xh[4];
                unpack4(*reinterpret_cast<const uint2 *>(xr), xl);
                unpack4(*reinterpret_cast<const uint2 *>(xr + 16), xh);
                float s = 0.0f;
#pragma unroll
                for (int q = 0; q < 4; q++) s = fmaf(lo[q], xl[q], s);
#pragma unroll
                for (int q = 0; q < 4; q++) s = fmaf(hi[q], xh[q], s);
                acc[i] = fmaf(d, s, acc[i]);
            }
        }
    }
}

template <int T> struct GroupOf {
    static constexpr int G = T == Q_INT4_G128 ? 128 : T == Q_INT4_G64 ? 64 : 1;
};

template <int M, int T>
__global__ void __launch_bounds__(QTHREADS, 1) qgemv_kernel(QArgs a) {
    extern __shared__ uint4 qsmem[];
    bf16 *xs = reinterpret_cast<bf16 *>(qsmem); // [M][k]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // x rows into shared memory (k and ldx multiples of 8, x 16-byte aligned: checked).
    const int k8 = a.k >> 3;
    for (int e = threadIdx.x; e < M * k8; e += QTHREADS) {
        const int i = e / k8, c = e - i * k8;
        qsmem[e] = reinterpret_cast<const uint4 *>(a.x + (size_t)i * (size_t)a.ldx)[c];
    }
    __syncthreads();
    constexpr int G = GroupOf<T>::G;
    const size_t row_bytes = T == Q_FP8 ? (size_t)a.k : (size_t)(a.k / G) * (4 + G / 2);
    const uint8_t *w8 = reinterpret_cast<const uint8_t *>(a.w);
    for (int j = blockIdx.x * QWARPS + warp; j < a.n; j += gridDim.x * QWARPS) {
        float acc[M];
#pragma unroll
        for (int i = 0; i < M; i++) acc[i] = 0.0f;
        const uint8_t *wrow = w8 + (size_t)j * row_bytes;
        if constexpr (T == Q_FP8) row_fp8<M>(acc, wrow, xs, a.k, lane);
        else row_int4<M, G>(acc, wrow, xs, a.k, lane);
#pragma unroll
        for (int i = 0; i < M; i++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
        const float sc = T == Q_FP8 ? a.scales[j] : 1.0f;
#pragma unroll
        for (int i = 0; i < M; i++)
            if (lane == i) {
                bf16 *o = a.out + (size_t)i * (size_t)a.ldo + (size_t)j;
                float v = acc[i] * sc;
                if (a.accumulate) v += __bfloat162float(*o);
                *o = __float2bfloat16(v);
            }
    }
}

int qsmem_optin(int dev) {
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

template <int M, int T> int qlaunch(const QArgs &a, cudaStream_t st) {
    const size_t smem = (size_t)M * (size_t)a.k * sizeof(bf16);
    int dev = 0;
    PG_CUDA_TRY(cudaGetDevice(&dev));
    const int optin = qsmem_optin(dev);
    if (smem > (size_t)optin)
        return pg_err_set(PG_EUNSUPP, "qgemv: m %d x k %d needs %zu bytes of shared memory, the device allows %d", M,
                          a.k, smem, optin);
    static std::atomic<int> smem_set[64];
    if (smem > 48 * 1024 && !smem_set[dev & 63].load(std::memory_order_acquire)) {
        PG_CUDA_TRY(cudaFuncSetAttribute(qgemv_kernel<M, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        smem_set[dev & 63].store(1, std::memory_order_release);
    }
    int grid = pg_cuda_sm_count();
    const int need = (a.n + QWARPS - 1) / QWARPS;
    if (grid > need) grid = need;
    if (grid < 1) grid = 1;
    qgemv_kernel<M, T><<<grid, QTHREADS, smem, st>>>(a);
    PG_CUDA_LAUNCHED("qgemv_kernel");
    return 0;
}

template <int T> int qdispatch(int m, const QArgs &a, cudaStream_t st) {
    switch (m) {
    case 1: return qlaunch<1, T>(a, st);
    case 2: return qlaunch<2, T>(a, st);
    case 3: return qlaunch<3, T>(a, st);
    case 4: return qlaunch<4, T>(a, st);
    case 5: return qlaunch<5, T>(a, st);
    case 6: return qlaunch<6, T>(a, st);
    case 7: return qlaunch<7, T>(a, st);
    case 8: return qlaunch<8, T>(a, st);
    }
    return pg_err_set(PG_EUNSUPP, "qgemv: m %d (at most %d)", m, PG_CUDA_QGEMV_MAX_M);
}
static_assert(PG_CUDA_QGEMV_MAX_M == 8, "qdispatch() instantiates m = 1..8");

// --- dequantization to bf16 -------------------------------------------------------------

// FP8: one thread per element e of [n][k]: bf16(e4m3(q) * scale[row]).
__global__ void dequant_fp8_kernel(bf16 *out, const uint8_t *w, const float *scales, int64_t n, int64_t k) {
    const int64_t total = n * k, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const int64_t r = e / k;
        out[e] = __float2bfloat16(fp8_to_f32(w[e]) * scales[r]);
    }
}

// int4: one thread per nibble byte p of a block (G / 2 per block, blocks
// [n][k / G] in order): elements 32 (p / 16) + p % 16 (low nibble) and 16
// further (high), bf16((q - z) * d).
template <int G> __global__ void dequant_int4_kernel(bf16 *out, const uint8_t *w, int64_t n_blocks) {
    constexpr int BB = 4 + G / 2;
    const int64_t total = n_blocks * (G / 2), stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const int64_t blk = e / (G / 2);
        const int p = (int)(e - blk * (G / 2));
        const uint8_t *b = w + blk * BB;
        const uint32_t hdr = *reinterpret_cast<const uint32_t *>(b); // blocks are 4-byte aligned
        float d, z;
        int4_header(hdr, d, z);
        const uint32_t q = b[4 + p];
        const int lo = 32 * (p >> 4) + (p & 15);
        bf16 *o = out + blk * G;
        o[lo] = __float2bfloat16(((float)(q & 15u) - z) * d);
        o[lo + 16] = __float2bfloat16(((float)(q >> 4) - z) * d);
    }
}

unsigned dq_grid(int64_t n) {
    int64_t g = (n + 255) / 256, cap = (int64_t)pg_cuda_sm_count() * 32;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

// Common checks; *type gets the QType.
int qcheck(const char *who, int dtype, const void *w, const float *scales, int64_t n, int64_t k, int *type) {
    PG_ARG(w, "%s: null weight", who);
    PG_ARG(n > 0 && k > 0, "%s: n %lld k %lld", who, (long long)n, (long long)k);
    if (dtype == PG_DTYPE_FP8_E4M3) *type = Q_FP8;
    else if (dtype == PG_DTYPE_INT4_G128) *type = Q_INT4_G128;
    else if (dtype == PG_DTYPE_INT4_G64) *type = Q_INT4_G64;
    else return pg_err_set(PG_EINVAL, "%s: weight type %s is not fp8_e4m3 or int4", who, pg_dtype_name(dtype));
    PG_ARG(*type != Q_FP8 || scales, "%s: fp8_e4m3 needs its row scales", who);
    const int G = *type == Q_INT4_G128 ? 128 : *type == Q_INT4_G64 ? 64 : 1;
    PG_ARG(k % G == 0, "%s: k %lld is not a multiple of the group %d", who, (long long)k, G);
    PG_ARG(*type == Q_FP8 || ((uintptr_t)w & 3) == 0, "%s: int4 blocks must be 4-byte aligned", who);
    return 0;
}

} // namespace

// --- C API -------------------------------------------------------------------------------

extern "C" int pg_cuda_qgemv(void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, const float *scales,
                             int dtype, int64_t m, int64_t n, int64_t k, int accumulate, void *stream) {
    int type = 0;
    PG_TRY(qcheck("qgemv", dtype, w, scales, n, k, &type));
    PG_ARG(out && x, "qgemv: null pointer");
    PG_ARG(m >= 0 && ldx >= k && ldo >= n, "qgemv: m %lld ldx %lld ldo %lld", (long long)m, (long long)ldx,
           (long long)ldo);
    if (m == 0) return 0;
    if (m > PG_CUDA_QGEMV_MAX_M)
        return pg_err_set(PG_EUNSUPP, "qgemv: m %lld (at most %d)", (long long)m, PG_CUDA_QGEMV_MAX_M);
    if (k % 8 || ldx % 8 || ((uintptr_t)x & 15))
        return pg_err_set(PG_EUNSUPP, "qgemv: k %lld and ldx %lld must be multiples of 8 and x 16-byte aligned",
                          (long long)k, (long long)ldx);
    if (type == Q_FP8 && (k % 16 || ((uintptr_t)w & 15)))
        return pg_err_set(PG_EUNSUPP, "qgemv: fp8 rows of k %lld must be whole 16-byte chunks, 16-byte aligned",
                          (long long)k);
    if (n > (1 << 30) || k > (1 << 20))
        return pg_err_set(PG_EUNSUPP, "qgemv: n %lld k %lld too large", (long long)n, (long long)k);
    QArgs a = {(bf16 *)out, (const bf16 *)x, w, scales, ldo, ldx, (int)n, (int)k, accumulate ? 1 : 0};
    cudaStream_t st = pg_stream(stream);
    if (type == Q_FP8) return qdispatch<Q_FP8>((int)m, a, st);
    if (type == Q_INT4_G128) return qdispatch<Q_INT4_G128>((int)m, a, st);
    return qdispatch<Q_INT4_G64>((int)m, a, st);
}

extern "C" int pg_cuda_qdequant_bf16(void *out, const void *w, const float *scales, int dtype, int64_t n, int64_t k,
                                     void *stream) {
    int type = 0;
    PG_TRY(qcheck("qdequant", dtype, w, scales, n, k, &type));
    PG_ARG(out, "qdequant: null output");
    cudaStream_t st = pg_stream(stream);
    if (type == Q_FP8) {
        dequant_fp8_kernel<<<dq_grid(n * k), 256, 0, st>>>((bf16 *)out, (const uint8_t *)w, scales, n, k);
    } else if (type == Q_INT4_G128) {
        const int64_t nb = n * (k / 128);
        dequant_int4_kernel<128><<<dq_grid(nb * 64), 256, 0, st>>>((bf16 *)out, (const uint8_t *)w, nb);
    } else {
        const int64_t nb = n * (k / 64);
        dequant_int4_kernel<64><<<dq_grid(nb * 32), 256, 0, st>>>((bf16 *)out, (const uint8_t *)w, nb);
    }
    PG_CUDA_LAUNCHED("qdequant");
    return 0;
}
