// kernels/cuda/backend_cuda.cu - the CUDA backend: kernels/backend.h over
// the launchers of kernels/cuda/cuda_ops.h, on one device. This file holds
// the device (memory, copies, events, graphs, life cycle) and its table;
// the store is backend_cuda_store.cu, the ops backend_cuda_ops.cu.
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
#include "kernels/cuda/backend_cuda_int.cuh"

// For the NCCL communicator (comm_nccl.cu): the compute stream and device.
extern "C" void *pg_cuda_backend_stream(pg_backend *b) {
    return ctx_of(b)->stream;
}
extern "C" int pg_cuda_backend_device(pg_backend *b) {
    return ctx_of(b)->device;
}


namespace {

__global__ void trap_kernel() {
    __trap();
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

// Op profiling (kernels/backend_prof.h): timing events on the compute
// stream. Events between kernels keep programmatic dependent launch from
// overlapping them, so a profiled decode chain runs a little slower.
static int cu_timer_mark(pg_backend *b, int32_t i) {
    CudaCtx *c = ctx_of(b);
    PG_ARG(i >= 0 && i < PG_PROF_MARKS, "timer mark %d", i);
    if (!c->prof_ev) {
        c->prof_ev = (cudaEvent_t *)calloc(PG_PROF_MARKS, sizeof(cudaEvent_t));
        if (!c->prof_ev) return pg_err_set(PG_ENOMEM, "cuda: profiling events");
    }
    if (!c->prof_ev[i]) PG_CUDA_TRY(cudaEventCreate(&c->prof_ev[i]));
    PG_CUDA_TRY(cudaEventRecord(c->prof_ev[i], c->stream));
    return 0;
}

static int cu_timer_read(pg_backend *b, int32_t i0, int32_t n, float *ms) {
    CudaCtx *c = ctx_of(b);
    PG_ARG(c->prof_ev && i0 >= 0 && i0 < PG_PROF_MARKS && n >= 1 && n <= PG_PROF_MARKS, "timer read %d %d", i0, n);
    PG_CUDA_TRY(cudaEventSynchronize(c->prof_ev[(i0 + n - 1) % PG_PROF_MARKS]));
    for (int32_t j = 0; j + 1 < n; j++)
        PG_CUDA_TRY(cudaEventElapsedTime(&ms[j], c->prof_ev[(i0 + j) % PG_PROF_MARKS],
                                         c->prof_ev[(i0 + j + 1) % PG_PROF_MARKS]));
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

static int cu_bind_thread(pg_backend *b) {
    PG_CUDA_TRY(cudaSetDevice(ctx_of(b)->device));
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
        if (c->ahead_stream) cudaStreamSynchronize(c->ahead_stream);
        pg_cuda_gemm_destroy(c->gemm);
        pg_cuda_fi_prefill_destroy(c->fi_prefill);
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
        if (c->ev_ahead_from) cudaEventDestroy(c->ev_ahead_from);
        if (c->ev_ahead) cudaEventDestroy(c->ev_ahead);
        for (int i = 0; c->prof_ev && i < PG_PROF_MARKS; i++)
            if (c->prof_ev[i]) cudaEventDestroy(c->prof_ev[i]);
        free(c->prof_ev);
        free(c->lora_staged);
        for (int i = 0; i < 2; i++)
            if (c->ev_in[i]) cudaEventDestroy(c->ev_in[i]);
        if (c->stream) cudaStreamDestroy(c->stream);
        if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
        if (c->ahead_stream) cudaStreamDestroy(c->ahead_stream);
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
    // The backend's cu_attn_ws adds the same where it made the kernel's state.
    if (pg_cuda_fi_prefill_requested() && pg_cuda_fi_prefill_available())
        *bytes += pg_cuda_fi_prefill_ws_bytes(n_heads);
    return 1;
}

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
    .timer_mark = cu_timer_mark,
    .timer_read = cu_timer_read,
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
        (e = cudaStreamCreateWithFlags(&c->ahead_stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_ahead_from, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->ev_ahead, cudaEventDisableTiming)) != cudaSuccess ||
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
        const char *f8env = getenv("PAGED_CUDA_FP8_GEMM");
        c->fp8_gemm = f8env && f8env[0] ? atoi(f8env) != 0 : true;
        const char *faenv = getenv("PAGED_CUDA_FP8_FAST");
        c->fp8_fast = faenv && faenv[0] ? atoi(faenv) != 0 : false;
        const char *fcenv = getenv("PAGED_CUDA_FP8_CUTLASS");
        // 2 (the default since session 19): CUTLASS c7/c8 with fast
        // accumulation from 256 rows, cuBLASLt + rescale below, by shape
        // (pg_cuda_gemm_fp8_cutlass_pick). W2 1000 x 1000/1000 with an FP8
        // checkpoint, H100, one binary: 14,730 and 14,688 tok/s against
        // 14,088 and 14,049 for 0 (cuBLASLt + rescale everywhere), +4.6%;
        // docs/fp8_gemm.md. A build without CUTLASS falls back to 0's path.
        c->fp8_cutlass = fcenv && fcenv[0] ? atoi(fcenv) : 2;
        if (c->fp8_cutlass < 0 || c->fp8_cutlass > 2) c->fp8_cutlass = 2;
        const char *fccenv = getenv("PAGED_CUDA_FP8_CUTLASS_CFG");
        c->fp8_cutlass_cfg = fccenv && fccenv[0] ? atoi(fccenv) : 0;
        if (c->fp8_cutlass == 1) {
            const char *name = pg_cuda_gemm_fp8_cutlass_cfg_name(c->fp8_cutlass_cfg);
            if (!name) {
                PG_LOGW("cuda: PAGED_CUDA_FP8_CUTLASS_CFG=%s: no such configuration built; c0", fccenv);
                c->fp8_cutlass_cfg = 0;
                name = pg_cuda_gemm_fp8_cutlass_cfg_name(0);
            }
            PG_LOGI("cuda: FP8 products through CUTLASS %s (PAGED_CUDA_FP8_CUTLASS=1)", name ? name : "(not built)");
        }
        const char *fvenv = getenv("PAGED_CUDA_FP8_GEMV");
        c->fp8_gemv = fvenv && fvenv[0] ? atoi(fvenv) != 0 : true;
        const char *l2env = getenv("PAGED_CUDA_L2_PREFETCH");
        c->l2_prefetch = l2env && l2env[0] ? atoi(l2env) != 0 : false;
        if (c->l2_prefetch)
            PG_LOGI("cuda: O's weight goes to the L2 before RoPE and attention in GEMV steps "
                    "(PAGED_CUDA_L2_PREFETCH=1)");
    }
    {
        // FlashInfer's prefill is the default where it runs; asked for by
        // name where it cannot, the start-up says why in a warning.
        const pg_cuda_prefill_choice pf = pg_cuda_prefill_env();
        const bool named = pf == PG_CUDA_PREFILL_NAMED_FLASHINFER;
        if (pf == PG_CUDA_PREFILL_OTHER)
            PG_LOGW("cuda: PAGED_CUDA_PREFILL=%s: expected flashinfer or paged; flashinfer where it runs",
                    getenv("PAGED_CUDA_PREFILL"));
        if (pf == PG_CUDA_PREFILL_PAGED)
            PG_LOGI("cuda: prefill attention through paged's kernel (PAGED_CUDA_PREFILL=paged)");
        else if (pg_cuda_fi_prefill_create(&c->fi_prefill) < 0) {
            if (named) PG_LOGW("cuda: PAGED_CUDA_PREFILL=flashinfer: %s; paged's prefill kernel runs", pg_err_msg());
            else PG_LOGI("cuda: prefill attention through paged's kernel (FlashInfer's: %s)", pg_err_msg());
        } else
            PG_LOGI("cuda: prefill attention through FlashInfer's sm90 kernel (%s; "
                    "PAGED_CUDA_PREFILL=paged for paged's everywhere)",
                    pg_cuda_fi_fp8_requested() ? "bf16 and fp8 KV" : "bf16 KV; paged's for fp8: PAGED_CUDA_FI_FP8=0");
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
    b->store = &pg_cuda_store_table;
    b->ops = &pg_cuda_ops_table;
    *out = b;
    return 0;
fail:
    cu_destroy(b);
    return rc;
}
