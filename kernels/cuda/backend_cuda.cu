// kernels/cuda/backend_cuda.cu - the CUDA backend: kernels/backend.h over
// the launchers of kernels/cuda/cuda_ops.h, on one device.
//
// One compute stream carries every op, in call order; swaps run on their own
// stream, ordered with events. Activations and weights are bf16 (weights of
// other stored types are dequantized row by row on the host and converted on
// the device at upload), except paged's FP8 / int4 types, which stay as
// stored (qgemv.cu; docs/quantization.md, "CUDA");
// the KV cache is bf16 or fp8 e4m3. Small batches
// (rows <= gemv_rows) take the weight-streaming GEMV with the RMSNorm (and
// for gate/up the SiLU) fused in; larger ones add_rmsnorm + cuBLASLt. The
// residual stream is bf16 and the O and down projections add into it inside
// the GEMM (beta = 1). Design: docs/backend.md, docs/cuda_runner.md.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
extern "C" {
#include "common/log.h"
#include "kernels/backend.h"
}

// Host rows per conversion chunk at weight upload: rows * cols <= this.
#define PG_CUDA_UPLOAD_ELEMS ((int64_t)16 << 20)

namespace {

struct CudaCtx {
    int device;
    cudaStream_t stream;      // compute
    cudaStream_t copy_stream; // swaps
    cudaEvent_t ev_compute, ev_copy, ev_done[2];
    cudaEvent_t ev_in[2]; // stream_in's copies (weight offload), one per slot
    pg_cuda_gemm *gemm;
    void *gemm_ws; // PG_CUDA_GEMM_WORKSPACE, for the compute stream's GEMMs
    // Steps of at most this many rows take the GEMV kernels (gemv.cu), larger
    // ones cuBLASLt. Default 2: on the H200 the GEMV wins at m = 1-2 and
    // loses at m >= 4 (bench_cuda_gemv). PAGED_CUDA_GEMV=N sets it
    // (0 = cuBLASLt only, at most PG_CUDA_GEMV_MAX_M).
    int64_t gemv_rows;
    // Quantized weights (FP8 e4m3, int4; PAGED_CUDA_QUANT=1): steps of at
    // most qgemv_rows rows take pg_cuda_qgemv (PAGED_CUDA_QGEMV=N, default
    // and at most PG_CUDA_QGEMV_MAX_M), larger ones dequantize the weight into
    // qscratch (bf16, sized for the largest quantized matrix uploaded,
    // qmax_elems; allocated at the first such step, i.e. in the runner's
    // profiling forward, so it is measured as workspace) and run cuBLASLt.
    int64_t qgemv_rows;
    int64_t qmax_elems, qscratch_elems;
    bf16 *qscratch;
    float *upload_f32;        // device staging for weight conversion: allocated at the first
    float *upload_host;       //   weight that needs it, with its host twin (pinned)
    int32_t *pairs_dev;       // copy-on-write pairs staging
    int32_t *pairs_host;      // pinned
    // Swaps by kernel (cu_kv_swap): two pinned, mapped pair buffers the
    // kernel reads directly, each reused only after the launch that read it
    // two swaps ago has finished (ev_swap), so a swap never waits for the
    // step before it. swap_mode: PAGED_CUDA_SWAP (auto, kernel, memcpy).
    int32_t *swap_pairs[2];
    cudaEvent_t ev_swap[2];
    int swap_slot, swap_mode;
    char desc[160];
    // PAGED_CUDA_FAULT=N (tests): the N-th step's work ends with a kernel
    // that traps, a real device error (sticky: the context is lost), so the
    // watchdog path is exercised on the GPU as a failing card would.
    int64_t fault_at, n_records;
};

struct CudaWeight {
    pg_bweight base;
    void *data;    // device [rows][cols] of base.dtype (quantized: [rows][row bytes] as stored)
    float *scales; // FP8_E4M3: device [rows] f32 row scales (in data's allocation); else null
    size_t pack;   // bytes of data's allocation (scales included): what offload moves
    bool offloaded; // weight_offload: data points into a slot the model owns (not freed here)
};

struct CudaKv {
    pg_bkv base;
    char *mem;          // device: K of layer l at 2l * layer_bytes, V at (2l + 1) * layer_bytes
    size_t block_bytes; // one block of one layer, K or V
    size_t layer_bytes;
    void **ptrs_dev;    // [2][n_layers]: K pointers then V pointers (move_blocks)
    char *host;         // pinned, mapped [2 n_layers][n_host_blocks][block_bytes] (the device layout)
    void **host_ptrs_dev; // [2][n_layers]: the host mirror's K then V pointers, as the device sees them
};

constexpr int PAIRS_CAP = 4096; // copy-on-write pairs per staged chunk
constexpr int SWAP_CAP = 8192;  // swap pairs per kernel launch (one pinned buffer)
enum { SWAP_AUTO = 0, SWAP_KERNEL = 1, SWAP_MEMCPY = 2 };

CudaCtx *ctx_of(pg_backend *b) {
    return (CudaCtx *)b->ctx;
}

const void *wdata(const pg_bweight *w) {
    return ((const CudaWeight *)w)->data;
}

// paged's quantized types, which the CUDA backend keeps as stored.
bool is_quant(int dtype) {
    return dtype == PG_DTYPE_FP8_E4M3 || pg_dtype_is_int4(dtype);
}


} // namespace

// For the NCCL communicator (comm_nccl.cu): the compute stream and device.
extern "C" void *pg_cuda_backend_stream(pg_backend *b) {
    return ctx_of(b)->stream;
}
extern "C" int pg_cuda_backend_device(pg_backend *b) {
    return ctx_of(b)->device;
}

namespace {

// --- dummy weights --------------------------------------------------------------------

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// w[i] = std * N(0, 1) by Box-Muller on 2 x 24 bits of splitmix64(key, i)
// (the CPU backend's cpu_weight_random computes the same values).
// A window of rows x cols at (row0, col0) of a virtual matrix full_cols
// wide (pg_rand_window): element i of w is the generator's element of its
// place in the virtual matrix.
__global__ void init_normal_kernel(bf16 *w, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                                   int64_t full_cols, uint64_t key, float std) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, n = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t e = (row0 + i / cols) * full_cols + col0 + i % cols;
        uint64_t r = splitmix64(key ^ splitmix64((uint64_t)e));
        float u1 = ((float)(r >> 40) + 1.0f) * (1.0f / 16777216.0f); // (0, 1]
        float u2 = (float)(r & 0xffffffu) * (1.0f / 16777216.0f);    // [0, 1)
        float z = sqrtf(-2.0f * __logf(u1)) * __cosf(6.28318530718f * u2);
        w[i] = __float2bfloat16(z * std);
    }
}

__global__ void fill_kernel(bf16 *w, int64_t n, float v) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const bf16 b = __float2bfloat16(v);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) w[i] = b;
}

__global__ void trap_kernel() {
    __trap();
}

unsigned fill_grid(int64_t n) {
    int64_t g = (n + 255) / 256, cap = (int64_t)pg_cuda_sm_count() * 16;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

} // namespace

// --- device and memory ----------------------------------------------------------------------

static void cu_describe(pg_backend *b, char *out, size_t cap) {
    snprintf(out, cap, "%s", ctx_of(b)->desc);
}

static int cu_mem_info(pg_backend *b, int64_t *free_bytes, int64_t *total_bytes) {
    size_t f = 0, t = 0;
    PG_CUDA_TRY(cudaSetDevice(ctx_of(b)->device));
    PG_CUDA_TRY(cudaMemGetInfo(&f, &t));
    *free_bytes = (int64_t)f, *total_bytes = (int64_t)t;
    return 0;
}

static int cu_alloc(pg_backend *b, size_t bytes, void **out) {
    *out = nullptr;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = nullptr;
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        return pg_err_set(PG_ENOMEM, "cuda: %.2f GiB of device memory needed, %.2f GiB free",
                          (double)bytes / (1 << 30), (double)f / (1 << 30));
    }
    return 0;
}

static void cu_free(pg_backend *b, void *p) {
    (void)b;
    if (p) cudaFree(p);
}

static int cu_host_alloc(pg_backend *b, size_t bytes, void **out) {
    (void)b;
    *out = nullptr;
    if (cudaHostAlloc(out, bytes ? bytes : 256, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        *out = nullptr;
        return pg_err_set(PG_ENOMEM, "cuda: %.2f GiB of pinned host memory cannot be allocated",
                          (double)bytes / (1 << 30));
    }
    return 0;
}

static void cu_host_free(pg_backend *b, void *p) {
    (void)b;
    if (p) cudaFreeHost(p);
}

static int cu_upload(pg_backend *b, void *dst, const void *src, size_t bytes) {
    if (bytes) PG_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx_of(b)->stream));
    return 0;
}

static int cu_download(pg_backend *b, void *dst, const void *src, size_t bytes) {
    if (bytes) PG_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx_of(b)->stream));
    return 0;
}

static int cu_record(pg_backend *b, int slot) {
    CudaCtx *c = ctx_of(b);
    if (c->fault_at > 0 && ++c->n_records == c->fault_at) {
        PG_LOGW("PAGED_CUDA_FAULT=%lld: this step ends with a trapping kernel", (long long)c->fault_at);
        trap_kernel<<<1, 1, 0, c->stream>>>();
    }
    PG_CUDA_TRY(cudaEventRecord(c->ev_done[slot & 1], c->stream));
    return 0;
}

static int cu_wait(pg_backend *b, int slot) {
    PG_CUDA_TRY(cudaEventSynchronize(ctx_of(b)->ev_done[slot & 1]));
    return 0;
}

static int cu_sync(pg_backend *b) {
    PG_CUDA_TRY(cudaStreamSynchronize(ctx_of(b)->stream));
    return 0;
}

// --- weights ---------------------------------------------------------------------------------

static bool cu_runs_in_place(pg_backend *b, int dtype) {
    (void)b;
    return pg_backend_cuda_caps()->runs_in_place(dtype);
}

static int new_weight(int64_t rows, int64_t cols, int32_t dtype, size_t elem, CudaWeight **out) {
    CudaWeight *w = (CudaWeight *)calloc(1, sizeof *w);
    if (!w) return pg_err_set(PG_ENOMEM, "cuda weight: out of host memory");
    w->base.rows = rows, w->base.cols = cols, w->base.dtype = dtype;
    w->base.bytes = (size_t)rows * (size_t)cols * elem;
    cudaError_t e = cudaMalloc(&w->data, w->base.bytes ? w->base.bytes : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        free(w);
        return pg_err_set(PG_ENOMEM,
                          "cuda: a %lldx%lld weight needs %.2f MiB of device memory, %.2f GiB are free",
                          (long long)rows, (long long)cols, (double)(rows * cols * (int64_t)elem) / (1 << 20),
                          (double)f / (1 << 30));
    }
    *out = w;
    return 0;
}

// Rows [row0, row0 + p->rows) of a bf16 device matrix from one stored part:
// bf16 rows are copied as they are, other types dequantized on the host to
// f32 in chunks and converted on the device. Every copy goes on the compute
// stream (a plain cudaMemcpy from pageable memory may return before its DMA
// lands, and the non-blocking stream would not wait for it).
static int upload_part(CudaCtx *c, bf16 *dst, int64_t row0, const pg_weight *p) {
    const int64_t cols = p->cols, chunk = PG_CUDA_UPLOAD_ELEMS / (cols > 0 ? cols : 1);
    const bool raw = p->dtype == PG_DTYPE_BF16 && p->row_bytes == (size_t)cols * 2;
    for (int64_t r = 0; r < p->rows; r += chunk) {
        const int64_t nr = p->rows - r < chunk ? p->rows - r : chunk;
        const char *src = (const char *)p->data + (size_t)r * p->row_bytes;
        bf16 *d = dst + (row0 + r) * cols;
        if (raw) {
            PG_CUDA_TRY(cudaMemcpyAsync(d, src, (size_t)(nr * cols) * 2, cudaMemcpyHostToDevice, c->stream));
        } else {
            if (!c->upload_f32) {
                PG_CUDA_TRY(cudaMalloc((void **)&c->upload_f32, sizeof(float) * (size_t)PG_CUDA_UPLOAD_ELEMS));
                PG_CUDA_TRY(cudaHostAlloc((void **)&c->upload_host, sizeof(float) * (size_t)PG_CUDA_UPLOAD_ELEMS,
                                          cudaHostAllocDefault));
            }
            for (int64_t i = 0; i < nr; i++)
                pg_dequantize_row(p->dtype, src + (size_t)i * p->row_bytes, c->upload_host + i * cols, cols);
            PG_CUDA_TRY(cudaMemcpyAsync(c->upload_f32, c->upload_host, (size_t)(nr * cols) * 4,
                                        cudaMemcpyHostToDevice, c->stream));
            PG_TRY(pg_cuda_f32_to_bf16(d, c->upload_f32, nr * cols, c->stream));
        }
        // The host staging buffers are reused by the next chunk.
        PG_CUDA_TRY(cudaStreamSynchronize(c->stream));
    }
    return 0;
}

// A weight of FP8 / int4 parts (one type), kept as stored: the parts' rows
// back to back, then (FP8) their row scales, f32 [rows], 256-byte aligned,
// in the same allocation (the CPU's layout: pg_weight.data and .scales).
static int upload_quant(CudaCtx *c, const pg_weight *parts, int n_parts, int64_t rows, pg_bweight **out) {
    const int dtype = parts[0].dtype;
    const int64_t cols = parts[0].cols;
    const size_t rb = pg_dtype_row_bytes(dtype, cols);
    const bool fp8 = dtype == PG_DTYPE_FP8_E4M3;
    for (int i = 0; i < n_parts; i++) {
        if (parts[i].dtype != dtype)
            return pg_err_set(PG_EUNSUPP, "cuda weight: parts of types %s and %s in one weight",
                              pg_dtype_name(dtype), pg_dtype_name(parts[i].dtype));
        PG_ARG(rb > 0 && parts[i].row_bytes >= rb && (!fp8 || parts[i].scales),
               "cuda weight: %s part %d: %lld columns, row bytes %zu%s", pg_dtype_name(dtype), i, (long long)cols,
               parts[i].row_bytes, fp8 && !parts[i].scales ? ", no row scales" : "");
    }
    const int64_t elems = rows * cols;
    if (c->qscratch && elems > c->qscratch_elems)
        return pg_err_set(PG_EUNSUPP,
                          "cuda weight: a %lldx%lld %s weight uploaded after the dequantization scratch was sized "
                          "for %lld elements",
                          (long long)rows, (long long)cols, pg_dtype_name(dtype), (long long)c->qscratch_elems);
    const size_t data_bytes = (size_t)rows * rb, scale_off = (data_bytes + 255) / 256 * 256;
    const size_t bytes = fp8 ? scale_off + sizeof(float) * (size_t)rows : data_bytes;
    CudaWeight *w = (CudaWeight *)calloc(1, sizeof *w);
    if (!w) return pg_err_set(PG_ENOMEM, "cuda weight: out of host memory");
    w->base.rows = rows, w->base.cols = cols, w->base.dtype = dtype, w->base.bytes = bytes;
    cudaError_t e = cudaMalloc(&w->data, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        free(w);
        return pg_err_set(PG_ENOMEM, "cuda: a %lldx%lld %s weight needs %.2f MiB of device memory, %.2f GiB are free",
                          (long long)rows, (long long)cols, pg_dtype_name(dtype), (double)bytes / (1 << 20),
                          (double)f / (1 << 30));
    }
    if (fp8) w->scales = (float *)((char *)w->data + scale_off);
    int64_t row0 = 0;
    for (int i = 0; i < n_parts && e == cudaSuccess; i++) {
        const pg_weight *p = &parts[i];
        if (p->rows > 0)
            e = cudaMemcpy2DAsync((char *)w->data + (size_t)row0 * rb, rb, p->data, p->row_bytes, rb, (size_t)p->rows,
                                  cudaMemcpyHostToDevice, c->stream);
        if (e == cudaSuccess && fp8 && p->rows > 0)
            e = cudaMemcpyAsync(w->scales + row0, p->scales, sizeof(float) * (size_t)p->rows, cudaMemcpyHostToDevice,
                                c->stream);
        row0 += p->rows;
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(w->data);
        free(w);
        return pg_err_set(PG_EIO, "cuda: %s weight upload: %s", pg_dtype_name(dtype), cudaGetErrorString(e));
    }
    if (elems > c->qmax_elems) c->qmax_elems = elems;
    *out = &w->base;
    return 0;
}

static int cu_weight_upload(pg_backend *b, const pg_weight *parts, int n_parts, pg_bweight **out) {
    *out = nullptr;
    CudaCtx *c = ctx_of(b);
    PG_ARG(n_parts >= 1 && n_parts <= 3, "cuda weight: %d parts", n_parts);
    int64_t rows = 0;
    bool quant = false;
    for (int i = 0; i < n_parts; i++) {
        PG_ARG(parts[i].data && parts[i].cols == parts[0].cols && pg_dtype_block_elems(parts[i].dtype) > 0,
               "cuda weight: part %d is %lldx%lld of type %s", i, (long long)parts[i].rows,
               (long long)parts[i].cols, pg_dtype_name(parts[i].dtype));
        // paged's quantized types run as stored (qgemv.cu), never through
        // the bf16 conversion below, which would drop FP8's scales. FP8
        // needs the e4m3 conversions of sm_89 and newer.
        if (parts[i].dtype == PG_DTYPE_FP8_E4M3) {
            int major = 0, minor = 0;
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device);
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device);
            if (major * 10 + minor < 89)
                return pg_err_set(PG_EUNSUPP,
                                  "cuda weight: %s weights need compute capability 8.9 or newer; device %d (%s) is "
                                  "sm_%d%d: use --device cpu or a bf16 / int4 checkpoint",
                                  pg_dtype_name(parts[i].dtype), c->device, c->desc, major, minor);
        }
        quant |= is_quant(parts[i].dtype);
        rows += parts[i].rows;
    }
    PG_ARG(parts[0].cols <= PG_CUDA_UPLOAD_ELEMS, "cuda weight: %lld columns", (long long)parts[0].cols);
    PG_CUDA_TRY(cudaSetDevice(c->device));
    if (quant) return upload_quant(c, parts, n_parts, rows, out); // refuses mixed types
    CudaWeight *w;
    PG_TRY(new_weight(rows, parts[0].cols, PG_DTYPE_BF16, 2, &w));
    int64_t row0 = 0;
    for (int i = 0; i < n_parts; i++) {
        int rc = upload_part(c, (bf16 *)w->data, row0, &parts[i]);
        if (rc < 0) {
            cudaFree(w->data);
            free(w);
            return rc;
        }
        row0 += parts[i].rows;
    }
    *out = &w->base;
    return 0;
}

static int cu_weight_random(pg_backend *b, const pg_rand_window *win, int n_win, uint64_t key, float std,
                            float fill, pg_bweight **out) {
    *out = nullptr;
    int64_t rows;
    PG_TRY(pg_rand_windows_rows(win, n_win, "cuda", &rows));
    const int64_t cols = win[0].cols;
    CudaCtx *c = ctx_of(b);
    PG_CUDA_TRY(cudaSetDevice(c->device));
    CudaWeight *w;
    PG_TRY(new_weight(rows, cols, PG_DTYPE_BF16, 2, &w));
    bf16 *dst = (bf16 *)w->data;
    for (int p = 0; p < n_win; p++) {
        const int64_t n = win[p].rows * cols;
        if (n == 0) continue;
        if (std > 0)
            init_normal_kernel<<<fill_grid(n), 256, 0, c->stream>>>(dst, win[p].rows, cols, win[p].row0, win[p].col0,
                                                                    win[p].full_cols, key, std);
        else
            fill_kernel<<<fill_grid(n), 256, 0, c->stream>>>(dst, n, fill);
        dst += n;
    }
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cudaFree(w->data);
        free(w);
        return pg_err_set(PG_EIO, "cuda: random weights: %s", cudaGetErrorString(e));
    }
    *out = &w->base;
    return 0;
}

static int cu_vector_f32(pg_backend *b, const float *v, int64_t n, pg_bweight **out) {
    *out = nullptr;
    CudaCtx *c = ctx_of(b);
    PG_CUDA_TRY(cudaSetDevice(c->device));
    CudaWeight *w;
    PG_TRY(new_weight(1, n, PG_DTYPE_F32, 4, &w));
    cudaError_t e = cudaMemcpyAsync(w->data, v, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cudaFree(w->data);
        free(w);
        return pg_err_set(PG_EIO, "cuda: vector upload: %s", cudaGetErrorString(e));
    }
    *out = &w->base;
    return 0;
}

static void cu_weight_free(pg_backend *b, pg_bweight *bw) {
    (void)b;
    if (!bw) return;
    CudaWeight *w = (CudaWeight *)bw;
    if (!w->offloaded) cudaFree(w->data);
    free(w);
}

// --- weight offload --------------------------------------------------------------------------
// A weight is one allocation (its row scales inside it), so it moves as one
// block and a slot holds it at any 256-byte aligned offset.

static size_t cu_weight_pack_bytes(pg_backend *b, const pg_bweight *bw) {
    (void)b;
    const CudaWeight *w = (const CudaWeight *)bw;
    return w->pack ? w->pack : w->base.bytes;
}

static int cu_weight_offload(pg_backend *b, pg_bweight *bw, void *host) {
    CudaCtx *c = ctx_of(b);
    CudaWeight *w = (CudaWeight *)bw;
    PG_ARG(!w->offloaded, "cuda: weight offloaded twice");
    if (!w->pack) w->pack = w->base.bytes;
    // weight_random and the conversions wrote it on the compute stream.
    PG_CUDA_TRY(cudaStreamSynchronize(c->stream));
    PG_CUDA_TRY(cudaMemcpy(host, w->data, w->pack, cudaMemcpyDeviceToHost));
    const size_t scales_off = w->scales ? (size_t)((char *)w->scales - (char *)w->data) : 0;
    PG_CUDA_TRY(cudaFree(w->data));
    w->data = nullptr;
    w->scales = w->scales ? (float *)(uintptr_t)scales_off : nullptr; // an offset until weight_point
    w->offloaded = true;
    w->base.bytes = 0;
    return 0;
}

static int cu_weight_point(pg_backend *b, pg_bweight *bw, void *dst) {
    (void)b;
    CudaWeight *w = (CudaWeight *)bw;
    PG_ARG(w->offloaded, "cuda: weight_point on a weight that is not offloaded");
    PG_ARG(((uintptr_t)dst & 255) == 0, "cuda: weight slot %p is not 256-byte aligned", dst);
    const size_t scales_off = w->scales ? (w->data ? (size_t)((char *)w->scales - (char *)w->data)
                                                   : (size_t)(uintptr_t)w->scales)
                                        : 0;
    w->data = dst;
    if (w->scales) w->scales = (float *)((char *)dst + scales_off);
    return 0;
}

// The copy waits for the compute work queued so far (the slot's previous
// layer may still read it), then runs beside what compute does next.
static int cu_stream_in(pg_backend *b, void *dst, const void *src_host, size_t bytes, int slot) {
    CudaCtx *c = ctx_of(b);
    PG_CUDA_TRY(cudaEventRecord(c->ev_compute, c->stream));
    PG_CUDA_TRY(cudaStreamWaitEvent(c->copy_stream, c->ev_compute, 0));
    if (bytes)
        PG_CUDA_TRY(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, c->copy_stream));
    PG_CUDA_TRY(cudaEventRecord(c->ev_in[slot & 1], c->copy_stream));
    return 0;
}

static int cu_stream_in_wait(pg_backend *b, int slot) {
    CudaCtx *c = ctx_of(b);
    PG_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->ev_in[slot & 1], 0));
    return 0;
}

// --- KV cache -------------------------------------------------------------------------------

// bf16 native (2 bytes) or fp8 e4m3 (1): the types cu_kv_create takes.
static size_t cu_kv_block_bytes(pg_backend *b, int32_t n_layers, pg_kv_shape s) {
    (void)b;
    return pg_kv_block_bytes(n_layers, s, false);
}

static void cu_kv_free(pg_backend *b, pg_bkv *bkv) {
    (void)b;
    if (!bkv) return;
    CudaKv *kv = (CudaKv *)bkv;
    cudaFree(kv->mem);
    cudaFree(kv->ptrs_dev);
    cudaFree(kv->host_ptrs_dev);
    if (kv->host) cudaFreeHost(kv->host);
    free(kv->base.k);
    free(kv->base.v);
    free(kv);
}

static int cu_kv_create(pg_backend *b, int32_t n_layers, pg_kv_shape s, int32_t n_host_blocks,
                        pg_bkv **out) {
    *out = nullptr;
    CudaCtx *c = ctx_of(b);
    PG_ARG(n_layers > 0 && s.n_blocks > 0 && n_host_blocks >= 0, "cuda KV cache: %d layers, %d blocks",
           n_layers, s.n_blocks);
    if (s.dtype != PG_KV_BF16 && s.dtype != PG_KV_FP8_E4M3)
        return pg_err_set(PG_EUNSUPP,
                          "cuda KV cache: %s elements are CPU-only (the CUDA kernels read bf16 or fp8 e4m3)",
                          pg_kv_dtype_name(s.dtype));
    PG_ARG(s.block_size >= 8 && (s.block_size & (s.block_size - 1)) == 0,
           "cuda KV cache: block size %d (a power of two >= 8)", s.block_size);
    if (s.head_dim != 64 && s.head_dim != 128)
        return pg_err_set(PG_EUNSUPP,
                          "cuda: head_dim %d (the CUDA attention kernels are built for 64 and 128)",
                          s.head_dim);
    PG_CUDA_TRY(cudaSetDevice(c->device));
    CudaKv *kv = (CudaKv *)calloc(1, sizeof *kv);
    if (!kv) return pg_err_set(PG_ENOMEM, "cuda KV cache: out of host memory");
    kv->base.shape = s;
    kv->base.n_layers = n_layers;
    kv->base.n_host_blocks = n_host_blocks;
    kv->block_bytes = pg_kv_layer_block_bytes(s, false);
    kv->layer_bytes = (size_t)s.n_blocks * kv->block_bytes;
    const size_t total = 2 * (size_t)n_layers * kv->layer_bytes;
    kv->base.k = (void **)calloc((size_t)n_layers, sizeof(void *));
    kv->base.v = (void **)calloc((size_t)n_layers, sizeof(void *));
    void **ptrs = (void **)malloc(sizeof(void *) * 2 * (size_t)n_layers);
    int rc = 0;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaError_t e = kv->base.k && kv->base.v && ptrs ? cudaMalloc((void **)&kv->mem, total) : cudaErrorMemoryAllocation;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        kv->mem = nullptr;
        const size_t per_block = cu_kv_block_bytes(b, n_layers, s);
        int64_t fit = (int64_t)(free_b > ((size_t)256 << 20) ? free_b - ((size_t)256 << 20) : 0) / (int64_t)per_block;
        rc = pg_err_set(PG_ENOMEM,
                        "KV cache of %d blocks (%.2f GiB) does not fit in the %.2f GiB of free device "
                        "memory; at most about %lld blocks (%lld tokens) would",
                        s.n_blocks, (double)total / (1 << 30), (double)free_b / (1 << 30), (long long)fit,
                        (long long)fit * s.block_size);
        goto fail;
    }
    // Finite values in never-written slots (the P.V product reads them times 0).
    if ((e = cudaMemsetAsync(kv->mem, 0, total, c->stream)) != cudaSuccess) goto cuda_fail;
    for (int32_t l = 0; l < n_layers; l++) {
        kv->base.k[l] = ptrs[l] = kv->mem + (size_t)(2 * l) * kv->layer_bytes;
        kv->base.v[l] = ptrs[n_layers + l] = kv->mem + (size_t)(2 * l + 1) * kv->layer_bytes;
    }
    if ((e = cudaMalloc((void **)&kv->ptrs_dev, sizeof(void *) * 2 * (size_t)n_layers)) != cudaSuccess ||
        (e = cudaMemcpyAsync(kv->ptrs_dev, ptrs, sizeof(void *) * 2 * (size_t)n_layers,
                             cudaMemcpyHostToDevice, c->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->stream)) != cudaSuccess)
        goto cuda_fail;
    kv->base.bytes = total;
    if (n_host_blocks > 0) {
        const size_t hb = (size_t)n_host_blocks * cu_kv_block_bytes(b, n_layers, s);
        // Mapped: the swap kernel reads and writes it from the device.
        if (cudaHostAlloc((void **)&kv->host, hb, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
            (void)cudaGetLastError();
            kv->host = nullptr;
            rc = pg_err_set(PG_ENOMEM,
                            "swap space of %d blocks (%.2f GiB of pinned host memory) cannot be "
                            "allocated; lower --swap-space",
                            n_host_blocks, (double)hb / (1 << 30));
            goto fail;
        }
        kv->base.host_bytes = hb;
        const size_t host_layer = (size_t)n_host_blocks * kv->block_bytes;
        char *hdev = nullptr;
        if ((e = cudaHostGetDevicePointer((void **)&hdev, kv->host, 0)) != cudaSuccess) goto cuda_fail;
        for (int32_t l = 0; l < n_layers; l++) {
            ptrs[l] = hdev + (size_t)(2 * l) * host_layer;
            ptrs[n_layers + l] = hdev + (size_t)(2 * l + 1) * host_layer;
        }
        if ((e = cudaMalloc((void **)&kv->host_ptrs_dev, sizeof(void *) * 2 * (size_t)n_layers)) != cudaSuccess ||
            (e = cudaMemcpyAsync(kv->host_ptrs_dev, ptrs, sizeof(void *) * 2 * (size_t)n_layers,
                                 cudaMemcpyHostToDevice, c->stream)) != cudaSuccess ||
            (e = cudaStreamSynchronize(c->stream)) != cudaSuccess)
            goto cuda_fail;
    }
    free(ptrs);
    *out = &kv->base;
    return 0;
cuda_fail:
    rc = pg_err_set(PG_EIO, "cuda KV cache: %s", cudaGetErrorString(e));
fail:
    free(ptrs);
    cu_kv_free(b, &kv->base);
    return rc;
}

// Swaps. The host mirror has the device layout, [2 n_layers][n_host_blocks]
// [block], so a run of consecutive blocks (from and to both consecutive)
// is one cudaMemcpyAsync per layer and K/V, on the copy stream after
// everything the compute stream queued and before what it queues next.
// Evicted prefix blocks are rarely consecutive: at llama3-8b-shape that is
// 64 copies of 16-32 KB per block, ~2 us each on the copy engine and on the
// host, which the compute stream waits for. So many short runs go through
// one move_blocks launch per SWAP_CAP pairs on the compute stream instead,
// the SMs reading or writing the mapped host mirror over PCIe.
// PAGED_CUDA_SWAP=kernel|memcpy forces one way (the comparison);
// auto takes the kernel when there are more than 4 runs.
static int swap_by_memcpy(CudaCtx *c, CudaKv *kv, const int32_t *pairs, int32_t n, bool to_host) {
    PG_CUDA_TRY(cudaEventRecord(c->ev_compute, c->stream));
    PG_CUDA_TRY(cudaStreamWaitEvent(c->copy_stream, c->ev_compute, 0));
    const int32_t L2 = 2 * kv->base.n_layers;
    const size_t bb = kv->block_bytes, host_layer = (size_t)kv->base.n_host_blocks * bb;
    for (int32_t i = 0; i < n;) {
        const int32_t from = pairs[2 * i], to = pairs[2 * i + 1];
        int32_t run = 1;
        while (i + run < n && pairs[2 * (i + run)] == from + run && pairs[2 * (i + run) + 1] == to + run)
            run++;
        for (int32_t t = 0; t < L2; t++) {
            char *dev = kv->mem + (size_t)t * kv->layer_bytes;
            char *host = kv->host + (size_t)t * host_layer;
            if (to_host)
                PG_CUDA_TRY(cudaMemcpyAsync(host + (size_t)to * bb, dev + (size_t)from * bb, (size_t)run * bb,
                                            cudaMemcpyDeviceToHost, c->copy_stream));
            else
                PG_CUDA_TRY(cudaMemcpyAsync(dev + (size_t)to * bb, host + (size_t)from * bb, (size_t)run * bb,
                                            cudaMemcpyHostToDevice, c->copy_stream));
        }
        i += run;
    }
    PG_CUDA_TRY(cudaEventRecord(c->ev_copy, c->copy_stream));
    PG_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->ev_copy, 0));
    return 0;
}

static int swap_by_kernel(CudaCtx *c, CudaKv *kv, const int32_t *pairs, int32_t n, bool to_host) {
    const void *const *src = (const void *const *)(to_host ? kv->ptrs_dev : kv->host_ptrs_dev);
    void *const *dst = to_host ? kv->host_ptrs_dev : kv->ptrs_dev;
    for (int32_t done = 0; done < n;) {
        const int32_t chunk = n - done < SWAP_CAP ? n - done : SWAP_CAP;
        const int slot = c->swap_slot;
        c->swap_slot ^= 1;
        PG_CUDA_TRY(cudaEventSynchronize(c->ev_swap[slot])); // its last reader, two launches ago
        memcpy(c->swap_pairs[slot], pairs + 2 * (size_t)done, (size_t)chunk * 8);
        int32_t *dpairs = nullptr;
        PG_CUDA_TRY(cudaHostGetDevicePointer((void **)&dpairs, c->swap_pairs[slot], 0));
        PG_TRY(pg_cuda_move_blocks(src, dst, 2 * kv->base.n_layers, dpairs, chunk, (int64_t)kv->block_bytes,
                                   c->stream));
        PG_CUDA_TRY(cudaEventRecord(c->ev_swap[slot], c->stream));
        done += chunk;
    }
    return 0;
}

static int cu_kv_swap(pg_backend *b, pg_bkv *bkv, const int32_t *pairs, int32_t n, bool to_host) {
    CudaCtx *c = ctx_of(b);
    CudaKv *kv = (CudaKv *)bkv;
    if (n == 0) return 0;
    PG_ARG(kv->host, "cuda: swap requested but there is no swap space");
    int32_t runs = 0;
    for (int32_t i = 0; i < n; i++)
        runs += i == 0 || pairs[2 * i] != pairs[2 * i - 2] + 1 || pairs[2 * i + 1] != pairs[2 * i - 1] + 1;
    const bool kernel = c->swap_mode == SWAP_KERNEL || (c->swap_mode == SWAP_AUTO && runs > 4);
    return kernel ? swap_by_kernel(c, kv, pairs, n, to_host) : swap_by_memcpy(c, kv, pairs, n, to_host);
}

// Copy-on-write: every layer's K and V of each pair in one launch per chunk
// of pairs staged through pinned memory.
static int cu_kv_copy(pg_backend *b, pg_bkv *bkv, const int32_t *pairs, int32_t n) {
    CudaCtx *c = ctx_of(b);
    CudaKv *kv = (CudaKv *)bkv;
    const int32_t L = kv->base.n_layers;
    for (int32_t done = 0; done < n;) {
        const int32_t chunk = n - done < PAIRS_CAP ? n - done : PAIRS_CAP;
        memcpy(c->pairs_host, pairs + 2 * (size_t)done, (size_t)chunk * 8);
        PG_CUDA_TRY(cudaMemcpyAsync(c->pairs_dev, c->pairs_host, (size_t)chunk * 8, cudaMemcpyHostToDevice,
                                    c->stream));
        PG_TRY(pg_cuda_move_blocks((const void *const *)kv->ptrs_dev, kv->ptrs_dev, 2 * L, c->pairs_dev, chunk,
                                   (int64_t)kv->block_bytes, c->stream));
        PG_CUDA_TRY(cudaStreamSynchronize(c->stream)); // the pinned pairs are reused by the next chunk
        done += chunk;
    }
    return 0;
}

// --- graphs ---------------------------------------------------------------------------------

static int cu_graph_begin(pg_backend *b) {
    PG_CUDA_TRY(cudaStreamBeginCapture(ctx_of(b)->stream, cudaStreamCaptureModeRelaxed));
    return 0;
}

// Ends the capture (always), instantiates and uploads the graph (its device
// memory is taken, and measured, now; its first replay does not pay for it).
static int cu_graph_end(pg_backend *b, void **out) {
    CudaCtx *c = ctx_of(b);
    *out = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (e == cudaSuccess && graph) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e == cudaSuccess && exec) e = cudaGraphUpload(exec, c->stream);
    if (e != cudaSuccess || !exec) {
        (void)cudaGetLastError();
        if (exec) cudaGraphExecDestroy(exec);
        return pg_err_set(PG_EIO, "cuda graph: %s", cudaGetErrorString(e));
    }
    *out = exec;
    return 0;
}

static int cu_graph_launch(pg_backend *b, void *g) {
    PG_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g, ctx_of(b)->stream));
    return 0;
}

static void cu_graph_free(pg_backend *b, void *g) {
    (void)b;
    if (g) cudaGraphExecDestroy((cudaGraphExec_t)g);
}

static size_t cu_attn_ws(pg_backend *b, int32_t max_seqs, int32_t nh, int32_t nkv, int32_t hd, int32_t len) {
    (void)b;
    return pg_cuda_decode_workspace_size(max_seqs, nh, nkv, hd, len);
}

static size_t cu_sample_ws(pg_backend *b, int32_t max_seqs, int32_t vocab) {
    (void)b;
    return pg_cuda_sample_workspace_size(max_seqs, vocab);
}

// --- layer ops ------------------------------------------------------------------------------

static int cu_embed(pg_backend *b, pg_tensor out, const int32_t *ids, const pg_bweight *table, int32_t id0) {
    if (table->dtype != PG_DTYPE_BF16)
        return pg_err_set(PG_EUNSUPP, "cuda embed: a %s table (the embedding stays bf16)", pg_dtype_name(table->dtype));
    return pg_cuda_embed_shard(out.data, wdata(table), ids, out.rows, table->cols, table->rows, id0,
                               ctx_of(b)->stream);
}

static int cu_argmax_rows(pg_backend *b, pg_argmax *out, pg_tensor x) {
    return pg_cuda_argmax_rows(out, x.data, x.dtype, x.rows, x.cols, x.stride, ctx_of(b)->stream);
}

static int cu_argmax_pick(pg_backend *b, pg_sample_out *out, const pg_argmax *cand, int32_t n_ranks, int32_t n,
                          int32_t ids_per_rank) {
    return pg_cuda_argmax_pick(out, cand, n_ranks, n, ids_per_rank, ctx_of(b)->stream);
}

static int cu_topk_rows(pg_backend *b, pg_argmax *out, pg_tensor x, int32_t k, const pg_argmax *cand,
                        int32_t n_ranks, const pg_sample_params *params, int32_t col0) {
    return pg_cuda_topk_rows(out, x.data, x.dtype, x.rows, x.cols, x.stride, k, cand, n_ranks, params, col0,
                             ctx_of(b)->stream);
}

static int cu_topk_scatter(pg_backend *b, pg_tensor logits, const pg_argmax *cand, int32_t n_ranks, int32_t k) {
    return pg_cuda_topk_scatter(logits.data, logits.dtype, logits.rows, logits.cols, logits.stride, cand, n_ranks,
                                k, ctx_of(b)->stream);
}

static int cu_bind_thread(pg_backend *b) {
    PG_CUDA_TRY(cudaSetDevice(ctx_of(b)->device));
    return 0;
}

static int cu_copy(pg_backend *b, pg_tensor dst, pg_tensor src) {
    PG_ARG(dst.rows == src.rows && dst.cols == src.cols && dst.dtype == src.dtype,
           "cuda copy: %lldx%lld into %lldx%lld", (long long)src.rows, (long long)src.cols, (long long)dst.rows,
           (long long)dst.cols);
    if (src.rows == 0 || src.cols == 0) return 0;
    const size_t el = src.dtype == PG_DTYPE_F32 ? 4 : 2;
    PG_CUDA_TRY(cudaMemcpy2DAsync(dst.data, (size_t)dst.stride * el, src.data, (size_t)src.stride * el,
                                  (size_t)src.cols * el, (size_t)src.rows, cudaMemcpyDeviceToDevice,
                                  ctx_of(b)->stream));
    return 0;
}

static int cu_gather(pg_backend *b, pg_tensor out, pg_tensor x, const int32_t *rows) {
    PG_ARG(x.stride == x.cols && out.stride == out.cols, "cuda gather: contiguous rows only");
    return pg_cuda_embed(out.data, x.data, rows, out.rows, x.cols, x.rows, ctx_of(b)->stream);
}

static int cu_rmsnorm(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *w, float eps) {
    PG_ARG(x.stride == x.cols && out.stride == out.cols, "cuda rmsnorm: contiguous rows only");
    return pg_cuda_add_rmsnorm(out.data, x.data, nullptr, wdata(w), x.rows, x.cols, eps, ctx_of(b)->stream);
}

// Small batches take the weight-streaming GEMV; a shape it declines
// (PG_EUNSUPP) and larger batches take cuBLASLt.
static int gemm(CudaCtx *c, void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, int64_t rows,
                int64_t n, int64_t k, int accumulate) {
    if (rows <= c->gemv_rows) {
        int rc = pg_cuda_gemv_bf16(out, ldo, x, ldx, w, rows, n, k, accumulate, c->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    return pg_cuda_gemm_bf16(c->gemm, out, ldo, x, ldx, w, rows, n, k, accumulate, c->gemm_ws,
                             PG_CUDA_GEMM_WORKSPACE, c->stream);
}

// The same for a quantized weight (FP8 / int4): pg_cuda_qgemv for small
// batches (a shape it declines falls through), else the weight dequantized
// into the bf16 scratch and cuBLASLt.
static int qgemm(CudaCtx *c, void *out, int64_t ldo, const void *x, int64_t ldx, const pg_bweight *bw, int64_t rows,
                 int accumulate) {
    const CudaWeight *w = (const CudaWeight *)bw;
    const int64_t n = bw->rows, k = bw->cols;
    if (rows <= c->qgemv_rows) {
        int rc = pg_cuda_qgemv(out, ldo, x, ldx, w->data, w->scales, bw->dtype, rows, n, k, accumulate, c->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    if (rows == 0) return 0;
    if (!c->qscratch) {
        // Once, for the largest quantized matrix: every quantized weight is
        // uploaded before the first step (upload_quant refuses a larger one
        // afterwards), so a captured graph never sees this pointer change.
        const int64_t elems = c->qmax_elems > n * k ? c->qmax_elems : n * k;
        cudaError_t e = cudaMalloc((void **)&c->qscratch, sizeof(bf16) * (size_t)elems);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            c->qscratch = nullptr;
            return pg_err_set(PG_ENOMEM, "cuda: %.2f MiB for the dequantized weight scratch: %s",
                              (double)elems * 2 / (1 << 20), cudaGetErrorString(e));
        }
        c->qscratch_elems = elems;
        PG_LOGI("cuda: %.1f MiB bf16 scratch for quantized weights in large batches (%lld elements)",
                (double)elems * 2 / (1 << 20), (long long)elems);
    }
    PG_ARG(n * k <= c->qscratch_elems, "cuda linear: a %lldx%lld weight over the %lld-element scratch", (long long)n,
           (long long)k, (long long)c->qscratch_elems);
    PG_TRY(pg_cuda_qdequant_bf16(c->qscratch, w->data, w->scales, bw->dtype, n, k, c->stream));
    return pg_cuda_gemm_bf16(c->gemm, out, ldo, x, ldx, c->qscratch, rows, n, k, accumulate, c->gemm_ws,
                             PG_CUDA_GEMM_WORKSPACE, c->stream);
}

static int cu_linear(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                     const pg_bweight *w, const pg_bweight *bias, bool accumulate, pg_tensor scratch) {
    CudaCtx *c = ctx_of(b);
    const int64_t rows = x.rows, n = w->rows, k = w->cols;
    PG_ARG(!(norm && accumulate), "cuda linear: a norm and accumulate in one call");
    if (is_quant(w->dtype)) {
        // No fused-norm variant: add_rmsnorm into scratch, then the product.
        if (norm) {
            PG_TRY(pg_cuda_add_rmsnorm(scratch.data, x.data, nullptr, wdata(norm), rows, k, eps, c->stream));
            PG_TRY(qgemm(c, out.data, out.stride, scratch.data, k, w, rows, 0));
        } else {
            PG_TRY(qgemm(c, out.data, out.stride, x.data, x.stride, w, rows, accumulate ? 1 : 0));
        }
    } else if (norm) {
        // out = RMSNorm(x) * norm . w^T: the GEMV with the norm in its
        // prologue for small batches, else add_rmsnorm into scratch and the
        // GEMM (the same numbers either way).
        int rc = PG_EUNSUPP;
        if (rows <= c->gemv_rows)
            rc = pg_cuda_gemv_rmsnorm_bf16(out.data, out.stride, x.data, x.stride, wdata(norm), eps, wdata(w),
                                           rows, n, k, c->stream);
        if (rc == PG_EUNSUPP) {
            PG_TRY(pg_cuda_add_rmsnorm(scratch.data, x.data, nullptr, wdata(norm), rows, k, eps, c->stream));
            rc = gemm(c, out.data, out.stride, scratch.data, k, wdata(w), rows, n, k, 0);
        }
        PG_TRY(rc);
    } else {
        PG_TRY(gemm(c, out.data, out.stride, x.data, x.stride, wdata(w), rows, n, k, accumulate ? 1 : 0));
    }
    if (bias) PG_TRY(pg_cuda_add_bias(out.data, out.stride, wdata(bias), rows, n, c->stream));
    return 0;
}

// h = silu(gate) * up of RMSNorm(x) * norm through the fused [gate|up]
// weight: one GEMV for small batches, else add_rmsnorm, the GEMM into gu
// and silu_mul.
static int cu_gate_up_silu(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                           const pg_bweight *w, pg_tensor sxn, pg_tensor sgu) {
    CudaCtx *c = ctx_of(b);
    const int64_t rows = x.rows, H = x.cols, ffn = w->rows / 2;
    if (is_quant(w->dtype)) {
        PG_TRY(pg_cuda_add_rmsnorm(sxn.data, x.data, nullptr, wdata(norm), rows, H, eps, c->stream));
        PG_TRY(qgemm(c, sgu.data, sgu.stride, sxn.data, sxn.stride, w, rows, 0));
        return pg_cuda_silu_mul(h.data, sgu.data, rows, ffn, c->stream);
    }
    if (rows <= c->gemv_rows) {
        int rc = pg_cuda_gemv_rmsnorm_silu_bf16(h.data, h.stride, x.data, x.stride, wdata(norm), eps, wdata(w),
                                                rows, ffn, H, c->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    PG_TRY(pg_cuda_add_rmsnorm(sxn.data, x.data, nullptr, wdata(norm), rows, H, eps, c->stream));
    PG_TRY(gemm(c, sgu.data, sgu.stride, sxn.data, sxn.stride, wdata(w), rows, 2 * ffn, H, 0));
    return pg_cuda_silu_mul(h.data, sgu.data, rows, ffn, c->stream);
}

static int cu_head_rmsnorm(pg_backend *b, pg_tensor x, int32_t n_heads, const pg_bweight *w, float eps) {
    return pg_cuda_head_rmsnorm(x.data, x.stride, n_heads, (int32_t)w->cols, wdata(w), eps, x.rows,
                                ctx_of(b)->stream);
}

static int cu_rope_kv_write(pg_backend *b, pg_tensor q, pg_tensor k, pg_tensor v, const int32_t *pos,
                            const int32_t *slots, int32_t n_heads, const pg_bweight *inv_freq, void *k_cache,
                            void *v_cache, pg_kv_shape shape) {
    PG_ARG(inv_freq->dtype == PG_DTYPE_F32, "cuda rope: inv_freq must be f32 (vector_f32)");
    return pg_cuda_rope_kv_write(q.data, q.stride, k.data, k.stride, v.data, v.stride, pos, slots,
                                 (int32_t)q.rows, n_heads, (const float *)wdata(inv_freq), k_cache, v_cache,
                                 shape, ctx_of(b)->stream);
}

// Decode sequences (rows [0, n_decode)) through the split-K decode kernel,
// prefill chunks through the varlen prefill kernel.
static int cu_attention(pg_backend *b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab, const void *k_cache,
                        const void *v_cache, pg_kv_shape shape, int32_t n_heads, float scale) {
    CudaCtx *c = ctx_of(b);
    const int32_t n_dec = ab->n_decode, n_pre = ab->n_seqs - ab->n_decode;
    const int64_t q_dim = (int64_t)n_heads * shape.head_dim;
    PG_ARG(out.stride == q_dim, "cuda attention: the output rows must be contiguous");
    if (n_dec > 0)
        PG_TRY(pg_cuda_paged_decode_attention(out.data, q.data, q.stride, k_cache, v_cache, shape,
                                              ab->block_tables, ab->bt_stride, ab->seq_lens, n_dec, n_heads,
                                              scale, ab->max_decode_ctx, ab->workspace, ab->workspace_bytes,
                                              c->stream));
    if (n_pre > 0)
        PG_TRY(pg_cuda_paged_prefill_attention(
            (bf16 *)out.data + (size_t)n_dec * q_dim, (const bf16 *)q.data + (size_t)n_dec * q.stride,
            q.stride, k_cache, v_cache, shape, ab->block_tables + (size_t)n_dec * ab->bt_stride, ab->bt_stride,
            ab->cu_q, ab->start_pos + n_dec, n_pre, n_heads, scale, ab->max_prefill_q, c->stream));
    return 0;
}

static int cu_sample(pg_backend *b, pg_sample_out *out, pg_tensor logits, const pg_sample_params *params,
                     const int32_t *tokens, void *ws, size_t ws_bytes) {
    return pg_cuda_sample(out, logits.data, PG_CUDA_BF16, logits.stride, (int32_t)logits.rows,
                          (int32_t)logits.cols, params, tokens, ws, ws_bytes, ctx_of(b)->stream);
}

static int cu_feed_tokens(pg_backend *b, int32_t *tokens, const pg_sample_out *prev, const int32_t *pairs,
                          int32_t n) {
    return pg_cuda_feed_tokens(tokens, prev, pairs, n, ctx_of(b)->stream);
}

static int cu_read_f32(pg_backend *b, pg_tensor t, int64_t n, float *out) {
    CudaCtx *c = ctx_of(b);
    PG_ARG(n >= 0 && n <= t.rows, "cuda read: %lld rows of %lld", (long long)n, (long long)t.rows);
    if (n == 0) return 0;
    // A view's last row ends at its columns, not at the stride (a column
    // view of a wider buffer, as the K and V of the fused QKV rows).
    const size_t count = (size_t)(n - 1) * (size_t)t.stride + (size_t)t.cols;
    float *tmp = nullptr;
    if (t.dtype == PG_DTYPE_F32) {
        PG_CUDA_TRY(cudaMemcpy2DAsync(out, (size_t)t.cols * 4, t.data, (size_t)t.stride * 4, (size_t)t.cols * 4,
                                      (size_t)n, cudaMemcpyDeviceToHost, c->stream));
        PG_CUDA_TRY(cudaStreamSynchronize(c->stream));
        return 0;
    }
    PG_CUDA_TRY(cudaMalloc((void **)&tmp, count * sizeof(float)));
    int rc = pg_cuda_bf16_to_f32(tmp, t.data, (int64_t)count, c->stream);
    cudaError_t e = cudaSuccess;
    if (rc == 0) // rows of `stride` on the device, of `cols` in `out`
        e = cudaMemcpy2DAsync(out, (size_t)t.cols * sizeof(float), tmp, (size_t)t.stride * sizeof(float),
                              (size_t)t.cols * sizeof(float), (size_t)n, cudaMemcpyDeviceToHost, c->stream);
    if (rc == 0 && e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    cudaFree(tmp);
    if (rc < 0) return rc;
    PG_CUDA_TRY(e);
    return 0;
}

// --- life cycle -----------------------------------------------------------------------------

static void cu_destroy(pg_backend *b) {
    if (!b) return;
    CudaCtx *c = ctx_of(b);
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream) cudaStreamSynchronize(c->stream);
        if (c->copy_stream) cudaStreamSynchronize(c->copy_stream);
        pg_cuda_gemm_destroy(c->gemm);
        cudaFree(c->gemm_ws);
        cudaFree(c->upload_f32);
        cudaFree(c->qscratch);
        cudaFree(c->pairs_dev);
        if (c->upload_host) cudaFreeHost(c->upload_host);
        if (c->pairs_host) cudaFreeHost(c->pairs_host);
        for (int i = 0; i < 2; i++) {
            if (c->swap_pairs[i]) cudaFreeHost(c->swap_pairs[i]);
            if (c->ev_swap[i]) cudaEventDestroy(c->ev_swap[i]);
        }
        for (int i = 0; i < 2; i++)
            if (c->ev_done[i]) cudaEventDestroy(c->ev_done[i]);
        if (c->ev_compute) cudaEventDestroy(c->ev_compute);
        if (c->ev_copy) cudaEventDestroy(c->ev_copy);
        for (int i = 0; i < 2; i++)
            if (c->ev_in[i]) cudaEventDestroy(c->ev_in[i]);
        if (c->stream) cudaStreamDestroy(c->stream);
        if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
        free(c);
    }
    free(b);
}

extern "C" int pg_backend_cuda_probe(char *why, size_t cap) {
    int n = pg_cuda_device_count();
    if (n <= 0) snprintf(why, cap, "no CUDA device found (no NVIDIA driver, or no GPU visible)");
    return n;
}

extern "C" int pg_backend_cuda_attn_workspace(int32_t max_seqs, int32_t n_heads, int32_t n_kv_heads,
                                              int32_t head_dim, int32_t max_len, size_t *bytes) {
    if (pg_cuda_device_count() <= 0) return 0;
    *bytes = pg_cuda_decode_workspace_size(max_seqs, n_heads, n_kv_heads, head_dim, max_len);
    return 1;
}

// --- the three tables (kernels/backend.h) ---------------------------------------

static const pg_backend_dev cu_dev = {
    .destroy = cu_destroy,
    .bind_thread = cu_bind_thread,
    .describe = cu_describe,
    .mem_info = cu_mem_info,
    .alloc = cu_alloc,
    .free = cu_free,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .upload = cu_upload,
    .download = cu_download,
    .record = cu_record,
    .wait = cu_wait,
    .sync = cu_sync,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_free = cu_graph_free,
};

static const pg_backend_store cu_store = {
    .runs_in_place = cu_runs_in_place,
    .weight_upload = cu_weight_upload,
    .weight_random = cu_weight_random,
    .vector_f32 = cu_vector_f32,
    .weight_free = cu_weight_free,
    .weight_pack_bytes = cu_weight_pack_bytes,
    .weight_offload = cu_weight_offload,
    .weight_point = cu_weight_point,
    .stream_in = cu_stream_in,
    .stream_in_wait = cu_stream_in_wait,
    .kv_block_bytes = cu_kv_block_bytes,
    .kv_create = cu_kv_create,
    .kv_free = cu_kv_free,
    .kv_swap = cu_kv_swap,
    .kv_copy = cu_kv_copy,
};

static const pg_backend_ops cu_ops = {
    .attn_workspace_bytes = cu_attn_ws,
    .sample_workspace_bytes = cu_sample_ws,
    .embed = cu_embed,
    .copy = cu_copy,
    .gather = cu_gather,
    .rmsnorm = cu_rmsnorm,
    .linear = cu_linear,
    .gate_up_silu = cu_gate_up_silu,
    .head_rmsnorm = cu_head_rmsnorm,
    .rope_kv_write = cu_rope_kv_write,
    .attention = cu_attention,
    .sample = cu_sample,
    .argmax_rows = cu_argmax_rows,
    .argmax_pick = cu_argmax_pick,
    .topk_rows = cu_topk_rows,
    .topk_scatter = cu_topk_scatter,
    .feed_tokens = cu_feed_tokens,
    .read_f32 = cu_read_f32,
};

extern "C" int pg_backend_cuda_create(int device, pg_backend **out) {
    *out = nullptr;
    PG_CUDA_TRY(cudaSetDevice(device));
    CudaCtx *c = (CudaCtx *)calloc(1, sizeof *c);
    pg_backend *b = (pg_backend *)calloc(1, sizeof *b);
    if (!c || !b) {
        free(c), free(b);
        return pg_err_set(PG_ENOMEM, "cuda backend: out of host memory");
    }
    b->ctx = c;
    c->device = device;
    int rc = 0;
    cudaError_t e;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_copy, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_done[0], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_done[1], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_in[0], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_in[1], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaMalloc((void **)&c->gemm_ws, PG_CUDA_GEMM_WORKSPACE)) != cudaSuccess ||
        (e = cudaMalloc((void **)&c->pairs_dev, (size_t)PAIRS_CAP * 8)) != cudaSuccess ||
        (e = cudaHostAlloc((void **)&c->pairs_host, (size_t)PAIRS_CAP * 8, cudaHostAllocDefault)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_swap[0], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_swap[1], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaHostAlloc((void **)&c->swap_pairs[0], (size_t)SWAP_CAP * 8, cudaHostAllocMapped | cudaHostAllocPortable)) !=
            cudaSuccess ||
        (e = cudaHostAlloc((void **)&c->swap_pairs[1], (size_t)SWAP_CAP * 8, cudaHostAllocMapped | cudaHostAllocPortable)) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        rc = pg_err_set(PG_EIO, "cuda backend: streams, events and staging buffers: %s", cudaGetErrorString(e));
        goto fail;
    }
    if ((rc = pg_cuda_gemm_create(&c->gemm)) < 0) goto fail;
    {
        const char *senv = getenv("PAGED_CUDA_SWAP");
        c->swap_mode = senv && !strcmp(senv, "kernel") ? SWAP_KERNEL : senv && !strcmp(senv, "memcpy") ? SWAP_MEMCPY
                                                                                                       : SWAP_AUTO;
        const char *genv = getenv("PAGED_CUDA_GEMV");
        c->gemv_rows = genv && genv[0] ? atoi(genv) : 2;
        if (c->gemv_rows < 0) c->gemv_rows = 0;
        if (c->gemv_rows > PG_CUDA_GEMV_MAX_M) c->gemv_rows = PG_CUDA_GEMV_MAX_M;
        const char *qenv = getenv("PAGED_CUDA_QGEMV");
        c->qgemv_rows = qenv && qenv[0] ? atoi(qenv) : PG_CUDA_QGEMV_MAX_M;
        if (c->qgemv_rows < 0) c->qgemv_rows = 0;
        if (c->qgemv_rows > PG_CUDA_QGEMV_MAX_M) c->qgemv_rows = PG_CUDA_QGEMV_MAX_M;
    }
    if (pg_cuda_device_describe(c->desc, sizeof c->desc) < 0) snprintf(c->desc, sizeof c->desc, "cuda");
    {
        const char *fenv = getenv("PAGED_CUDA_FAULT");
        c->fault_at = fenv && fenv[0] ? atoll(fenv) : 0;
    }
    // Every weight upload and random init synchronizes before it returns,
    // so no kernel that writes a weight can still run when a GEMV starts:
    // the ring GEMV may load its first weight pieces before its PDL wait
    // (docs/cuda_kernels.md, GEMV).
    pg_cuda_gemv_preload_set(1);
    b->name = "cuda";
    b->caps = pg_backend_cuda_caps();
    b->dev = &cu_dev;
    b->store = &cu_store;
    b->ops = &cu_ops;
    *out = b;
    return 0;
fail:
    cu_destroy(b);
    return rc;
}
