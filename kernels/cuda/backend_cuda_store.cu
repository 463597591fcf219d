// kernels/cuda/backend_cuda_store.cu - the CUDA backend's store
// (kernels/backend.h pg_backend_store): weights (uploaded, converted or kept
// as stored, random), their offload to host memory, the KV cache and its
// swaps and copies.
#include "kernels/cuda/backend_cuda_int.cuh"

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

unsigned fill_grid(int64_t n) {
    int64_t g = (n + 255) / 256, cap = (int64_t)pg_cuda_sm_count() * 16;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

} // namespace

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
    if (!bkv) return;
    cudaStreamSynchronize(ctx_of(b)->ahead_stream); // copies ahead still reading it
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
    PG_TRY(pg_cuda_head_dim_check(s.head_dim)); // 64, 128, 256
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
// One cudaMemcpyAsync per run of consecutive pairs, layer and K/V, on `st`.
static int memcpy_runs(CudaKv *kv, const int32_t *pairs, int32_t n, bool to_host, cudaStream_t st) {
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
                                            cudaMemcpyDeviceToHost, st));
            else
                PG_CUDA_TRY(cudaMemcpyAsync(dev + (size_t)to * bb, host + (size_t)from * bb, (size_t)run * bb,
                                            cudaMemcpyHostToDevice, st));
        }
        i += run;
    }
    return 0;
}

static int swap_by_memcpy(CudaCtx *c, CudaKv *kv, const int32_t *pairs, int32_t n, bool to_host) {
    PG_CUDA_TRY(cudaEventRecord(c->ev_compute, c->stream));
    PG_CUDA_TRY(cudaStreamWaitEvent(c->copy_stream, c->ev_compute, 0));
    PG_TRY(memcpy_runs(kv, pairs, n, to_host, c->copy_stream));
    PG_CUDA_TRY(cudaEventRecord(c->ev_copy, c->copy_stream));
    PG_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->ev_copy, 0));
    return 0;
}

// move_blocks launches on `st` (the compute stream, or the copies ahead's).
static int swap_by_kernel(CudaCtx *c, CudaKv *kv, const int32_t *pairs, int32_t n, bool to_host, cudaStream_t st) {
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
        PG_TRY(pg_cuda_move_blocks(src, dst, 2 * kv->base.n_layers, dpairs, chunk, (int64_t)kv->block_bytes, st));
        PG_CUDA_TRY(cudaEventRecord(c->ev_swap[slot], st));
        done += chunk;
    }
    return 0;
}

static bool swap_takes_kernel(const CudaCtx *c, const int32_t *pairs, int32_t n) {
    int32_t runs = 0;
    for (int32_t i = 0; i < n; i++)
        runs += i == 0 || pairs[2 * i] != pairs[2 * i - 2] + 1 || pairs[2 * i + 1] != pairs[2 * i - 1] + 1;
    return c->swap_mode == SWAP_KERNEL || (c->swap_mode == SWAP_AUTO && runs > 4);
}

static int cu_kv_swap(pg_backend *b, pg_bkv *bkv, const int32_t *pairs, int32_t n, bool to_host) {
    CudaCtx *c = ctx_of(b);
    CudaKv *kv = (CudaKv *)bkv;
    if (n == 0) return 0;
    PG_ARG(kv->host, "cuda: swap requested but there is no swap space");
    return swap_takes_kernel(c, pairs, n) ? swap_by_kernel(c, kv, pairs, n, to_host, c->stream)
                                          : swap_by_memcpy(c, kv, pairs, n, to_host);
}

// The host tier's copies ahead (backend.h): on ahead_stream after the
// compute work queued so far, beside the step queued next (a few
// move_blocks CTAs or the copy engine, PCIe-bound either way); the
// compute stream waits for them at cu_kv_swap_join, after the step.
static int cu_kv_swap_ahead(pg_backend *b, pg_bkv *bkv, const int32_t *pairs, int32_t n) {
    CudaCtx *c = ctx_of(b);
    CudaKv *kv = (CudaKv *)bkv;
    if (n == 0) return 0;
    PG_ARG(kv->host, "cuda: swap requested but there is no swap space");
    PG_CUDA_TRY(cudaEventRecord(c->ev_ahead_from, c->stream));
    PG_CUDA_TRY(cudaStreamWaitEvent(c->ahead_stream, c->ev_ahead_from, 0));
    c->ahead_pending = true;
    return swap_takes_kernel(c, pairs, n) ? swap_by_kernel(c, kv, pairs, n, true, c->ahead_stream)
                                          : memcpy_runs(kv, pairs, n, true, c->ahead_stream);
}

static int cu_kv_swap_join(pg_backend *b) {
    CudaCtx *c = ctx_of(b);
    if (!c->ahead_pending) return 0;
    c->ahead_pending = false;
    PG_CUDA_TRY(cudaEventRecord(c->ev_ahead, c->ahead_stream));
    PG_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->ev_ahead, 0));
    return 0;
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

const pg_backend_store pg_cuda_store_table = {
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
    .kv_swap_ahead = cu_kv_swap_ahead,
    .kv_swap_join = cu_kv_swap_join,
};

