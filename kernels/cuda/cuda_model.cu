// kernels/cuda/cuda_model.cu - the Llama forward pass on one GPU: device
// weights, paged KV cache, workspace, one step = moves + forward + sampling.
//
// Contract and life cycle: kernels/cuda/cuda_model.h. Design notes:
// docs/cuda_runner.md. Every op is a launcher of kernels/cuda/cuda_ops.h on
// one compute stream; swap copies run on their own stream, ordered with
// events. Activations are bf16; the residual stream x is bf16 and the O and
// down projections accumulate into it inside the GEMM (beta = 1).
//
// CUDA graphs: a step whose sequences all decode is padded to a batch
// bucket B (powers of two up to max_seqs) and a context bucket C (powers of
// two from 256 up to max_model_len; it bounds the decode split plan, which a
// graph bakes in). The embedding and every layer of such a step replay one
// graph per (B, C), captured after the first eager step of that shape; the
// gather, final norm, LM head and sampler stay eager (their sizes follow the
// real batch). Pad rows read token 0 at position 0, write no KV (slot -1) and
// attend to one key of block 0, the pool's never-allocated null block.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_model.h"
extern "C" {
#include "common/log.h"
}

namespace {

// --- small helpers --------------------------------------------------------------------

constexpr size_t ALIGN = 256;

size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

// Carves aligned sub-buffers out of one allocation (sizes first, then bases).
struct Carver {
    size_t used = 0;
    char *base = nullptr;
    template <typename T> T *take(size_t count) {
        size_t off = align_up(used, ALIGN);
        used = off + count * sizeof(T);
        return base ? reinterpret_cast<T *>(base + off) : nullptr;
    }
};

struct Layer {
    bf16 *attn_norm; // [hidden]
    bf16 *ffn_norm;  // [hidden]
    bf16 *qkv;       // [(n_heads + 2 n_kv) head_dim][hidden]
    bf16 *o;         // [hidden][n_heads head_dim]
    bf16 *gu;        // [2 ffn][hidden]
    bf16 *down;      // [hidden][ffn]
};

// Packs host arrays into pinned memory at 16-byte aligned offsets; the same
// offsets address the device copy after one upload.
struct Packer {
    char *host = nullptr, *dev = nullptr;
    size_t cap = 0, used = 0;
    bool overflow = false;
    template <typename T> const T *put(const T *src, size_t count) {
        size_t off = align_up(used, 16), bytes = count * sizeof(T);
        if (off + bytes > cap) {
            overflow = true;
            return nullptr;
        }
        if (bytes) memcpy(host + off, src, bytes);
        used = off + bytes;
        return reinterpret_cast<const T *>(dev + off);
    }
};

// --- dummy weights --------------------------------------------------------------------

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// w[i] = std * N(0, 1) by Box-Muller on 2 x 24 bits of splitmix64(key, i).
__global__ void init_normal_kernel(bf16 *w, int64_t n, uint64_t key, float std) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint64_t r = splitmix64(key ^ splitmix64((uint64_t)i));
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

// --- the model ------------------------------------------------------------------------------

struct pg_cuda_model {
    pg_cuda_model_shape sh;
    int64_t q_dim, kv_dim, qkv_dim;
    int device;
    cudaStream_t stream;      // compute
    cudaStream_t copy_stream; // swaps
    cudaEvent_t ev_compute, ev_copy;
    pg_cuda_gemm *gemm;
    // Steps of at most this many rows take the GEMV kernels (gemv.cu), larger
    // ones cuBLASLt. Default 2: on the H200 the GEMV wins at m = 1-2 and
    // loses at m >= 4 (bench_cuda_gemv). PAGED_CUDA_GEMV=N sets it
    // (0 = cuBLASLt only, at most PG_CUDA_GEMV_MAX_M).
    int64_t gemv_rows;

    // Weights: one allocation.
    char *wbase;
    size_t wbytes;
    bf16 *emb, *lm_head, *final_norm; // [vocab][hidden], same or own, [hidden]
    Layer *layers;                    // host array [n_layers] of device pointers
    float *inv_freq;                  // device [head_dim / 2]
    float *upload_f32;                // device scratch [PG_CUDA_UPLOAD_ELEMS], freed by prepare

    // Workspace: one allocation sized by prepare() for `lim`.
    pg_cuda_model_limits lim;
    bool prepared;
    char *ws;
    size_t ws_bytes;
    bf16 *x;           // [T][hidden] residual stream
    bf16 *xn;          // [T][hidden] normalized
    bf16 *qkv;         // [T][qkv_dim]
    bf16 *attn;        // [T][q_dim]
    bf16 *gu;          // [T][2 ffn]
    bf16 *h;           // [T][ffn]
    bf16 *lg_in;       // [S][hidden] sampled rows
    bf16 *logits;      // [S][ld_logits]
    int64_t ld_logits; // vocab rounded up to 8 (16-byte rows for cuBLASLt and the sampler)
    void *gemm_ws;     // PG_CUDA_GEMM_WORKSPACE
    size_t gemm_ws_bytes;
    void *dec_ws; // split-K decode partials
    size_t dec_ws_bytes;
    void *samp_ws; // sampler rows
    size_t samp_ws_bytes;
    pg_cuda_sample_out *out_dev; // [S]
    char *in_dev;                // packed step inputs, device
    char *in_host;               // ... and their pinned host image (the one in use)
    size_t in_cap;
    pg_cuda_sample_out *out_host; // pinned [S] (the one in use)
    int32_t last_n_sample;
    // Async steps (step_begin / step_end): two pinned input images and two
    // output buffers, alternating per begun step, so a step can be packed
    // while the one before still runs and its results wait to be read. The
    // image of step N is reused by step N + 2, which begins only after step
    // N has ended (at most two steps open).
    char *in_host_buf[2];
    pg_cuda_sample_out *out_host_buf[2];
    cudaEvent_t ev_done[2]; // the step's results are in its output buffer
    int next_buf;           // buffer of the next begun step
    struct OpenStep {
        int buf;
        int32_t n_sample;
    } open[2]; // begun, not ended, oldest first
    int n_open;
    int64_t workspace_measured;

    // CUDA graphs for decode steps, [n_bbuckets][n_cbuckets]: captured at
    // start-up (pg_cuda_model_capture_graphs) or after a bucket's first step.
    pg_cuda_graph_mode graph_mode;
    bool graphs_on;        // graph_mode != OFF and PAGED_CUDA_GRAPHS != 0
    int64_t graph_reserve; // bytes planned for every bucket's graph (prepare's probe)
    // Batch buckets 1, 2, 4, ... < max_seqs, max_seqs; context bounds 256,
    // 512, ... < max_model_len, max_model_len.
    int32_t bbuckets[16], n_bbuckets;
    int32_t cbuckets[32], n_cbuckets;
    cudaGraphExec_t *graph_exec; // [n_bbuckets * n_cbuckets]
    int8_t *graph_state;         // 0 none yet, 1 ready, -1 capture failed (stay eager)
    int64_t graph_bytes;
    int32_t n_graphs;
    // Padded host copies of a decode step: [max_seqs], g_bt [max_seqs][g_max_bt].
    int32_t *g_tok, *g_pos, *g_slots, *g_lens, *g_start, *g_bt;
    int32_t g_max_bt;

    // PAGED_CUDA_TIMING=1: device time of the layers and of the tail per
    // decode step (events), and host time per step, logged at free.
    bool timing;
    cudaEvent_t t_ev[3];
    double t_layers_ms, t_tail_ms, t_host_ms;
    int64_t t_steps;

    // KV cache: K of layer l at kv + 2l * layer_bytes, V at (2l + 1) * layer_bytes;
    // each [n_blocks][block_size][n_kv][head_dim] bf16.
    char *kv;
    int32_t n_blocks;
    size_t block_bytes, layer_bytes;
    void **kv_ptrs_dev; // [2][n_layers]: K pointers then V pointers
    char *host_kv;      // pinned [2 n_layers][n_host_blocks][block_bytes] (the device layout)
    int32_t n_host_blocks;
};

extern "C" int pg_cuda_built(void) {
    return 1;
}

extern "C" size_t pg_cuda_model_kv_block_bytes(const pg_cuda_model_shape *s, int32_t block_size) {
    return (size_t)2 * (size_t)s->n_layers * (size_t)block_size * (size_t)s->n_kv_heads *
           (size_t)s->head_dim * (s->kv_dtype == PG_KV_FP8_E4M3 ? 1 : sizeof(bf16));
}

// Device address and shape of weight w (of `layer` for the per-layer ones);
// null (and 0 x 0) for an unknown id or layer.
static bf16 *weight_ptr(const pg_cuda_model *m, pg_cuda_weight_id w, int32_t layer, int64_t *rows,
                        int64_t *cols) {
    const bool per_layer = w >= PG_CUDA_W_ATTN_NORM;
    pg_cuda_weight_shape(&m->sh, w, rows, cols);
    if (per_layer && (layer < 0 || layer >= m->sh.n_layers)) {
        *rows = *cols = 0;
        return nullptr;
    }
    const Layer *L = per_layer ? &m->layers[layer] : nullptr;
    switch (w) {
    case PG_CUDA_W_EMB: return m->emb;
    case PG_CUDA_W_LM_HEAD: return m->lm_head;
    case PG_CUDA_W_FINAL_NORM: return m->final_norm;
    case PG_CUDA_W_ATTN_NORM: return L->attn_norm;
    case PG_CUDA_W_FFN_NORM: return L->ffn_norm;
    case PG_CUDA_W_QKV: return L->qkv;
    case PG_CUDA_W_O: return L->o;
    case PG_CUDA_W_GATE_UP: return L->gu;
    case PG_CUDA_W_DOWN: return L->down;
    }
    return nullptr;
}

extern "C" void pg_cuda_model_weight_dims(const pg_cuda_model *m, pg_cuda_weight_id w,
                                          int64_t *rows, int64_t *cols) {
    weight_ptr(m, w, 0, rows, cols);
}

// Carves the weights (sizes only when c.base is null).
static void carve_weights(pg_cuda_model *m, Carver &c) {
    const pg_cuda_model_shape *s = &m->sh;
    const size_t H = (size_t)s->hidden;
    m->emb = c.take<bf16>((size_t)s->vocab * H);
    m->lm_head = s->tie_embeddings ? m->emb : c.take<bf16>((size_t)s->vocab * H);
    m->final_norm = c.take<bf16>(H);
    for (int32_t l = 0; l < s->n_layers; l++) {
        Layer *L = &m->layers[l];
        L->attn_norm = c.take<bf16>(H);
        L->ffn_norm = c.take<bf16>(H);
        L->qkv = c.take<bf16>((size_t)m->qkv_dim * H);
        L->o = c.take<bf16>(H * (size_t)m->q_dim);
        L->gu = c.take<bf16>(2 * (size_t)s->ffn * H);
        L->down = c.take<bf16>(H * (size_t)s->ffn);
    }
}

extern "C" int pg_cuda_model_create(const pg_cuda_model_shape *shape, const float *inv_freq,
                                    int device, pg_cuda_model **out) {
    *out = nullptr;
    PG_ARG(shape && inv_freq, "cuda model: null argument");
    const pg_cuda_model_shape *s = shape;
    PG_ARG(s->vocab > 0 && s->hidden > 0 && s->n_layers > 0 && s->n_heads > 0 &&
               s->n_kv_heads > 0 && s->ffn > 0 && s->n_heads % s->n_kv_heads == 0,
           "cuda model: bad shape");
    PG_ARG(s->kv_dtype == PG_KV_BF16 || s->kv_dtype == PG_KV_FP8_E4M3, "cuda model: KV cache dtype %d",
           s->kv_dtype);
    if (s->head_dim != 64 && s->head_dim != 128)
        return pg_err_set(
            PG_EUNSUPP,
            "cuda model: head_dim %d (the CUDA attention kernels are built for 64 and 128)",
            s->head_dim);
    PG_CUDA_TRY(cudaSetDevice(device));
    pg_cuda_model *m = (pg_cuda_model *)calloc(1, sizeof *m);
    if (!m) return pg_err_set(PG_ENOMEM, "cuda model: out of host memory");
    m->sh = *s;
    m->device = device;
    m->q_dim = (int64_t)s->n_heads * s->head_dim;
    m->kv_dim = (int64_t)s->n_kv_heads * s->head_dim;
    m->qkv_dim = m->q_dim + 2 * m->kv_dim;
    m->layers = (Layer *)calloc((size_t)s->n_layers, sizeof(Layer));
    int rc = 0;
    Carver c;
    size_t free_b = 0, total_b = 0;
    cudaError_t e;
    if (!m->layers) {
        rc = pg_err_set(PG_ENOMEM, "cuda model: out of host memory");
        goto fail;
    }
    if ((e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&m->copy_stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&m->ev_compute, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&m->ev_copy, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&m->ev_done[0], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&m->ev_done[1], cudaEventDisableTiming)) != cudaSuccess) {
        rc = pg_err_set(PG_EIO, "cuda model: streams/events: %s", cudaGetErrorString(e));
        goto fail;
    }
    if ((rc = pg_cuda_gemm_create(&m->gemm)) < 0) goto fail;
    {
        const char *genv = getenv("PAGED_CUDA_GEMV");
        m->gemv_rows = genv && genv[0] ? atoi(genv) : 2;
        if (m->gemv_rows < 0) m->gemv_rows = 0;
        if (m->gemv_rows > PG_CUDA_GEMV_MAX_M) m->gemv_rows = PG_CUDA_GEMV_MAX_M;
    }
    carve_weights(m, c); // sizes
    m->wbytes = align_up(c.used, ALIGN);
    cudaMemGetInfo(&free_b, &total_b);
    if ((e = cudaMalloc((void **)&m->wbase, m->wbytes)) != cudaSuccess) {
        (void)cudaGetLastError();
        rc = pg_err_set(PG_ENOMEM,
                        "cuda model: the weights need %.2f GiB of device memory, %.2f GiB are free",
                        (double)m->wbytes / (1 << 30), (double)free_b / (1 << 30));
        goto fail;
    }
    c = Carver();
    c.base = m->wbase;
    carve_weights(m, c);
    if ((e = cudaMalloc((void **)&m->inv_freq, sizeof(float) * (size_t)(s->head_dim / 2))) !=
            cudaSuccess ||
        (e = cudaMemcpyAsync(m->inv_freq, inv_freq, sizeof(float) * (size_t)(s->head_dim / 2),
                             cudaMemcpyHostToDevice, m->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(m->stream)) != cudaSuccess) {
        rc = pg_err_set(PG_EIO, "cuda model: inv_freq: %s", cudaGetErrorString(e));
        goto fail;
    }
    *out = m;
    return 0;
fail:
    pg_cuda_model_free(m);
    return rc;
}

extern "C" void pg_cuda_model_free(pg_cuda_model *m) {
    if (!m) return;
    cudaSetDevice(m->device);
    if (m->stream) cudaStreamSynchronize(m->stream);
    if (m->timing && m->t_steps > 0)
        PG_LOGI("cuda timing over %lld decode steps: layers %.3f ms, tail (LM head + sampling) "
                "%.3f ms on the device; "
                "%.3f ms per step on the host (pack, launch, wait)",
                (long long)m->t_steps, m->t_layers_ms / (double)m->t_steps,
                m->t_tail_ms / (double)m->t_steps, m->t_host_ms / (double)m->t_steps);
    for (int i = 0; i < 3; i++)
        if (m->t_ev[i]) cudaEventDestroy(m->t_ev[i]);
    if (m->copy_stream) cudaStreamSynchronize(m->copy_stream);
    pg_cuda_gemm_destroy(m->gemm);
    cudaFree(m->wbase);
    cudaFree(m->inv_freq);
    cudaFree(m->upload_f32);
    cudaFree(m->ws);
    cudaFree(m->kv);
    cudaFree(m->kv_ptrs_dev);
    for (int32_t i = 0; m->graph_state && i < m->n_bbuckets * m->n_cbuckets; i++)
        if (m->graph_state[i] == 1) cudaGraphExecDestroy(m->graph_exec[i]);
    free(m->graph_exec);
    free(m->graph_state);
    free(m->g_tok), free(m->g_pos), free(m->g_slots), free(m->g_lens), free(m->g_start),
        free(m->g_bt);
    for (int i = 0; i < 2; i++) {
        cudaFreeHost(m->in_host_buf[i]);
        cudaFreeHost(m->out_host_buf[i]);
        if (m->ev_done[i]) cudaEventDestroy(m->ev_done[i]);
    }
    cudaFreeHost(m->host_kv);
    if (m->ev_compute) cudaEventDestroy(m->ev_compute);
    if (m->ev_copy) cudaEventDestroy(m->ev_copy);
    if (m->stream) cudaStreamDestroy(m->stream);
    if (m->copy_stream) cudaStreamDestroy(m->copy_stream);
    free(m->layers);
    free(m);
}

// --- weights ---------------------------------------------------------------------------------

extern "C" int pg_cuda_model_upload_rows(pg_cuda_model *m, pg_cuda_weight_id w, int32_t layer,
                                         int64_t row0, int64_t n_rows, const void *src,
                                         int src_dtype) {
    int64_t rows, cols;
    bf16 *dst = weight_ptr(m, w, layer, &rows, &cols);
    PG_ARG(dst && src, "upload: weight %d of layer %d does not exist", (int)w, layer);
    PG_ARG(row0 >= 0 && n_rows >= 0 && row0 + n_rows <= rows, "upload: rows [%lld, %lld) of %lld",
           (long long)row0, (long long)(row0 + n_rows), (long long)rows);
    PG_ARG(n_rows * cols <= PG_CUDA_UPLOAD_ELEMS, "upload: %lld elements in one call",
           (long long)(n_rows * cols));
    if (n_rows == 0) return 0;
    if (w == PG_CUDA_W_LM_HEAD && m->sh.tie_embeddings) return 0; // it is the embedding
    PG_CUDA_TRY(cudaSetDevice(m->device));
    const int64_t n = n_rows * cols;
    dst += row0 * cols;
    // Every copy goes on the compute stream: a plain cudaMemcpy from pageable
    // memory may return before its DMA lands, and the non-blocking stream
    // would not wait for it (the conversion read stale staging data).
    if (src_dtype == PG_CUDA_BF16) {
        PG_CUDA_TRY(
            cudaMemcpyAsync(dst, src, (size_t)n * sizeof(bf16), cudaMemcpyHostToDevice, m->stream));
        PG_CUDA_TRY(cudaStreamSynchronize(m->stream));
        return 0;
    }
    PG_ARG(src_dtype == PG_CUDA_F32, "upload: source type %d", src_dtype);
    if (!m->upload_f32)
        PG_CUDA_TRY(
            cudaMalloc((void **)&m->upload_f32, sizeof(float) * (size_t)PG_CUDA_UPLOAD_ELEMS));
    PG_CUDA_TRY(cudaMemcpyAsync(m->upload_f32, src, (size_t)n * sizeof(float),
                                cudaMemcpyHostToDevice, m->stream));
    PG_TRY(pg_cuda_f32_to_bf16(dst, m->upload_f32, n, m->stream));
    PG_CUDA_TRY(cudaStreamSynchronize(m->stream));
    return 0;
}

extern "C" int pg_cuda_model_init_random(pg_cuda_model *m, uint64_t seed, float std) {
    PG_CUDA_TRY(cudaSetDevice(m->device));
    const pg_cuda_model_shape *s = &m->sh;
    uint64_t tensor = 0;
    auto normal = [&](bf16 *p, int64_t n) -> int {
        // A distinct stream of numbers per tensor: key = f(seed, tensor index).
        uint64_t key = seed * 0x9e3779b97f4a7c15ull + (++tensor) * 0xd1b54a32d192ed03ull;
        init_normal_kernel<<<fill_grid(n), 256, 0, m->stream>>>(p, n, key, std);
        PG_CUDA_LAUNCHED("init_normal_kernel");
        return 0;
    };
    auto ones = [&](bf16 *p, int64_t n) -> int {
        fill_kernel<<<fill_grid(n), 256, 0, m->stream>>>(p, n, 1.0f);
        PG_CUDA_LAUNCHED("fill_kernel");
        return 0;
    };
    const int64_t H = s->hidden;
    PG_TRY(normal(m->emb, (int64_t)s->vocab * H));
    if (!s->tie_embeddings) PG_TRY(normal(m->lm_head, (int64_t)s->vocab * H));
    PG_TRY(ones(m->final_norm, H));
    for (int32_t l = 0; l < s->n_layers; l++) {
        Layer *L = &m->layers[l];
        PG_TRY(ones(L->attn_norm, H));
        PG_TRY(ones(L->ffn_norm, H));
        PG_TRY(normal(L->qkv, m->qkv_dim * H));
        PG_TRY(normal(L->o, H * m->q_dim));
        PG_TRY(normal(L->gu, 2 * (int64_t)s->ffn * H));
        PG_TRY(normal(L->down, H * s->ffn));
    }
    PG_CUDA_TRY(cudaStreamSynchronize(m->stream));
    return 0;
}

// --- workspace ---------------------------------------------------------------------------------

// Bytes of packed step inputs at the limits (each array padded to 16 bytes).
static size_t input_capacity(const pg_cuda_model_limits *l) {
    const size_t T = (size_t)l->max_tokens, S = (size_t)l->max_seqs;
    // The profiling step's prefill sequence may be longer than max_model_len.
    const int32_t longest = l->max_model_len > l->max_tokens ? l->max_model_len : l->max_tokens;
    const size_t max_bt = (size_t)((longest + l->block_size - 1) / l->block_size) + 1;
    size_t n = 0;
    n += 3 * (T * 4 + 16);                                    // tokens, pos, slots
    n += S * max_bt * 4 + 16;                                 // block tables
    n += 3 * (S * 4 + 16) + 4 + 16;                           // seq_lens, start_pos, cu_q (+1)
    n += S * 4 + 16;                                          // sample rows
    n += S * sizeof(pg_cuda_sample_params) + 16;              // params
    n += S * ((size_t)l->max_model_len + 64 + 1) * 4 + 16;    // histories and ban lists
    n += S * 2 * 4 + 16;                                      // fed tokens (row, sample) pairs
    return align_up(n, 4096) + align_up(2 * S * 2 * 4, 4096); // + copy-on-write pairs at the end
}

// The copy-pair region at the end of the input buffer: 2 max_seqs pairs.
static size_t pair_region_bytes(const pg_cuda_model *m) {
    return align_up(2 * (size_t)m->lim.max_seqs * 2 * 4, 4096);
}

// Carves the workspace (sizes only when c.base is null).
static void carve_workspace(pg_cuda_model *m, Carver &c) {
    const pg_cuda_model_shape *s = &m->sh;
    const size_t T = (size_t)m->lim.max_tokens, S = (size_t)m->lim.max_seqs, H = (size_t)s->hidden;
    m->x = c.take<bf16>(T * H);
    m->xn = c.take<bf16>(T * H);
    m->qkv = c.take<bf16>(T * (size_t)m->qkv_dim);
    m->attn = c.take<bf16>(T * (size_t)m->q_dim);
    m->gu = c.take<bf16>(T * 2 * (size_t)s->ffn);
    m->h = c.take<bf16>(T * (size_t)s->ffn);
    m->lg_in = c.take<bf16>(S * H);
    m->ld_logits = ((int64_t)s->vocab + 7) / 8 * 8;
    m->logits = c.take<bf16>(S * (size_t)m->ld_logits);
    m->gemm_ws = c.take<char>(m->gemm_ws_bytes);
    m->dec_ws = m->dec_ws_bytes ? c.take<char>(m->dec_ws_bytes) : nullptr;
    m->samp_ws = c.take<char>(m->samp_ws_bytes);
    m->out_dev = c.take<pg_cuda_sample_out>(S);
    m->in_dev = c.take<char>(m->in_cap);
}

static int forward_and_sample(pg_cuda_model *m, const pg_cuda_step *s, bool moves_done,
                              pg_cuda_sample_out *out);
static void probe_graph_memory(pg_cuda_model *m);

extern "C" int pg_cuda_model_set_graph_mode(pg_cuda_model *m, pg_cuda_graph_mode mode) {
    PG_ARG(!m->prepared, "cuda model: graph mode set after prepare");
    PG_ARG(mode == PG_CUDA_GRAPHS_STARTUP || mode == PG_CUDA_GRAPHS_OFF ||
               mode == PG_CUDA_GRAPHS_LAZY,
           "cuda model: graph mode %d", (int)mode);
    m->graph_mode = mode;
    return 0;
}

// Graph buckets and the padded host arrays of a decode step (m->lim set).
static int setup_graphs(pg_cuda_model *m) {
    const char *env = getenv("PAGED_CUDA_GRAPHS");
    if (env && env[0] == '0') m->graph_mode = PG_CUDA_GRAPHS_OFF;
    m->graphs_on = m->graph_mode != PG_CUDA_GRAPHS_OFF;
    const int32_t S = m->lim.max_seqs, bs = m->lim.block_size;
    for (int32_t b = 1; b < S && m->n_bbuckets < 15; b *= 2) m->bbuckets[m->n_bbuckets++] = b;
    m->bbuckets[m->n_bbuckets++] = S;
    for (int64_t c = 256; c < m->lim.max_model_len && m->n_cbuckets < 31; c *= 2)
        m->cbuckets[m->n_cbuckets++] = (int32_t)c;
    m->cbuckets[m->n_cbuckets++] = m->lim.max_model_len;
    m->g_max_bt = (m->lim.max_model_len + bs - 1) / bs;
    const size_t ng = (size_t)m->n_bbuckets * (size_t)m->n_cbuckets;
    m->graph_exec = (cudaGraphExec_t *)calloc(ng, sizeof(cudaGraphExec_t));
    m->graph_state = (int8_t *)calloc(ng, 1);
    m->g_tok = (int32_t *)calloc((size_t)S, 4), m->g_pos = (int32_t *)calloc((size_t)S, 4);
    m->g_slots = (int32_t *)calloc((size_t)S, 4), m->g_lens = (int32_t *)calloc((size_t)S, 4);
    m->g_start = (int32_t *)calloc((size_t)S, 4);
    m->g_bt = (int32_t *)calloc((size_t)S * (size_t)m->g_max_bt, 4);
    if (!m->graph_exec || !m->graph_state || !m->g_tok || !m->g_pos || !m->g_slots || !m->g_lens ||
        !m->g_start || !m->g_bt)
        return pg_err_set(PG_ENOMEM, "cuda model: out of host memory");
    return 0;
}

extern "C" int pg_cuda_model_prepare(pg_cuda_model *m, const pg_cuda_model_limits *lim) {
    PG_ARG(!m->prepared, "cuda model: prepared twice");
    PG_ARG(lim->max_tokens > 0 && lim->max_seqs > 0 && lim->max_model_len > 0 &&
               lim->block_size >= 8 && (lim->block_size & (lim->block_size - 1)) == 0,
           "cuda model: limits %d tokens, %d seqs, len %d, block %d (a power of two >= 8)",
           lim->max_tokens, lim->max_seqs, lim->max_model_len, lim->block_size);
    PG_CUDA_TRY(cudaSetDevice(m->device));
    const pg_cuda_model_shape *sh = &m->sh;
    m->lim = *lim;
    if (m->lim.max_seqs > m->lim.max_tokens)
        m->lim.max_seqs = m->lim.max_tokens; // a sequence has >= 1 token
    const int32_t T = m->lim.max_tokens, S = m->lim.max_seqs, bs = m->lim.block_size;
    PG_TRY(setup_graphs(m));
    cudaFree(m->upload_f32); // loading is over
    m->upload_f32 = nullptr;
    PG_CUDA_TRY(cudaDeviceSynchronize());
    // Weights are final and the device is idle: GEMVs may start reading them
    // before their PDL wait (the ring kernel; docs/cuda_kernels.md, GEMV).
    // Before the profiling step and any graph capture, which keep the kernel.
    pg_cuda_gemv_preload_set(1);
    size_t free0, total;
    PG_CUDA_TRY(cudaMemGetInfo(&free0, &total));

    m->gemm_ws_bytes = PG_CUDA_GEMM_WORKSPACE;
    m->dec_ws_bytes = pg_cuda_decode_workspace_size(S, sh->n_heads, sh->n_kv_heads, sh->head_dim,
                                                    m->lim.max_model_len);
    m->samp_ws_bytes = pg_cuda_sample_workspace_size(S, sh->vocab);
    m->in_cap = input_capacity(&m->lim);
    Carver c;
    carve_workspace(m, c);
    m->ws_bytes = align_up(c.used, ALIGN);
    cudaError_t e = cudaMalloc((void **)&m->ws, m->ws_bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pg_err_set(
            PG_ENOMEM,
            "cuda model: the workspace for %d tokens / %d sequences per step needs "
            "%.2f GiB, %.2f GiB are free; lower --max-num-batched-tokens or --max-num-seqs",
            T, S, (double)m->ws_bytes / (1 << 30), (double)free0 / (1 << 30));
    }
    c = Carver();
    c.base = m->ws;
    carve_workspace(m, c);
    for (int i = 0; i < 2; i++) {
        PG_CUDA_TRY(cudaHostAlloc((void **)&m->in_host_buf[i], m->in_cap, cudaHostAllocDefault));
        PG_CUDA_TRY(cudaHostAlloc((void **)&m->out_host_buf[i], sizeof(pg_cuda_sample_out) * (size_t)S,
                                  cudaHostAllocDefault));
    }
    m->in_host = m->in_host_buf[0];
    m->out_host = m->out_host_buf[0];

    // --- the profiling step: every kernel path at the largest size -------------------
    // n_dec decode sequences of 16 context tokens (they share one block, so
    // their cache writes race; the values do not matter), then one prefill
    // sequence with the remaining tokens from position 0. Every sequence
    // samples; one asks for logprobs and one for top-p sampling.
    const int32_t n_dec = S > 1 ? S - 1 : 0, n_pre_tok = T - n_dec;
    const int32_t pre_blocks = (n_pre_tok + bs - 1) / bs;
    const int32_t tmp_blocks = pre_blocks + 2;
    const int32_t bt_stride = pre_blocks > 1 ? pre_blocks : 1;
    const int32_t n_seqs = n_dec + (n_pre_tok > 0 ? 1 : 0);
    // Host arrays for the step (freed below).
    int32_t *tok = (int32_t *)calloc((size_t)T, 4), *pos = (int32_t *)calloc((size_t)T, 4),
            *slots = (int32_t *)calloc((size_t)T, 4),
            *bt = (int32_t *)calloc((size_t)n_seqs * bt_stride, 4),
            *lens = (int32_t *)calloc((size_t)n_seqs, 4),
            *start = (int32_t *)calloc((size_t)n_seqs, 4),
            *rows = (int32_t *)calloc((size_t)n_seqs, 4);
    int32_t cu[2] = {0, n_pre_tok};
    pg_cuda_sample_params *pp = (pg_cuda_sample_params *)calloc((size_t)n_seqs, sizeof *pp);
    int rc = 0;
    pg_cuda_step st;
    memset(&st, 0, sizeof st);
    if (!tok || !pos || !slots || !bt || !lens || !start || !rows || !pp) {
        rc = pg_err_set(PG_ENOMEM, "cuda model: out of host memory");
        goto done;
    }
    for (int32_t i = 0; i < n_dec; i++) {
        tok[i] = i % sh->vocab;
        pos[i] = 15;
        slots[i] = 1 * bs + 15;
        bt[(size_t)i * bt_stride] = 1;
        lens[i] = 16;
        start[i] = 15;
        rows[i] = i;
    }
    for (int32_t t = 0; t < n_pre_tok; t++) {
        tok[n_dec + t] = (7 * t) % sh->vocab;
        pos[n_dec + t] = t;
        slots[n_dec + t] = (2 + t / bs) * bs + t % bs;
    }
    if (n_pre_tok > 0) {
        for (int32_t b = 0; b < pre_blocks; b++) bt[(size_t)n_dec * bt_stride + b] = 2 + b;
        lens[n_dec] = n_pre_tok;
        start[n_dec] = 0;
        rows[n_dec] = T - 1;
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        pp[i].temperature = 0.0f;
        pp[i].top_p = 1.0f;
        pp[i].repetition_penalty = 1.0f;
        pp[i].logprobs = -1;
        pp[i].seed = (uint64_t)i;
    }
    pp[0].logprobs = 5;
    if (n_seqs > 1) {
        pp[1].temperature = 0.8f;
        pp[1].top_p = 0.9f;
    }
    // A temporary KV pool for the step; the real one is sized afterwards.
    m->block_bytes = (size_t)bs * (size_t)sh->n_kv_heads * (size_t)sh->head_dim *
                     (sh->kv_dtype == PG_KV_FP8_E4M3 ? 1 : sizeof(bf16));
    m->n_blocks = tmp_blocks;
    m->layer_bytes = (size_t)tmp_blocks * m->block_bytes;
    if ((e = cudaMalloc((void **)&m->kv, 2 * (size_t)sh->n_layers * m->layer_bytes)) !=
            cudaSuccess ||
        (e = cudaMemsetAsync(m->kv, 0, 2 * (size_t)sh->n_layers * m->layer_bytes, m->stream)) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        rc = pg_err_set(PG_ENOMEM, "cuda model: profiling KV cache: %s", cudaGetErrorString(e));
        goto done;
    }
    st.n_tokens = T;
    st.tokens = tok;
    st.pos = pos;
    st.slots = slots;
    st.n_seqs = n_seqs;
    st.n_decode = n_dec;
    st.block_tables = bt;
    st.bt_stride = bt_stride;
    st.seq_lens = lens;
    st.start_pos = start;
    st.cu_q = cu;
    st.max_decode_ctx = 16;
    st.max_prefill_q = n_pre_tok;
    st.n_sample = n_seqs;
    st.sample_rows = rows;
    st.params = pp;
    st.sample_tokens = tok;
    st.n_sample_tokens = 1;
    // Twice: the first loads kernels and creates cuBLASLt plans, the second
    // shows the steady state is reached (and is what a capture would see).
    for (int it = 0; it < 2 && rc == 0; it++) rc = forward_and_sample(m, &st, true, m->out_host);
    if (rc < 0) {
        pg_err_wrap(rc, "cuda model: profiling step (%d tokens, %d sequences): ", T, n_seqs);
        goto done;
    }
    if (m->graphs_on) probe_graph_memory(m); // on the temporary pool; never an error
done:
    cudaFree(m->kv);
    m->kv = nullptr;
    m->n_blocks = 0;
    free(tok), free(pos), free(slots), free(bt), free(lens), free(start), free(rows), free(pp);
    if (rc < 0) return rc;
    size_t free1;
    PG_CUDA_TRY(cudaDeviceSynchronize());
    PG_CUDA_TRY(cudaMemGetInfo(&free1, &total));
    m->workspace_measured = (int64_t)free0 - (int64_t)free1;
    if (m->workspace_measured < (int64_t)m->ws_bytes) m->workspace_measured = (int64_t)m->ws_bytes;
    m->prepared = true;

    const char *env = getenv("PAGED_CUDA_TIMING");
    if (env && env[0] == '1') {
        m->timing = true;
        for (int i = 0; i < 3; i++) PG_CUDA_TRY(cudaEventCreate(&m->t_ev[i]));
    }
    return 0;
}

// --- KV cache ----------------------------------------------------------------------------------

extern "C" int pg_cuda_model_alloc_kv(pg_cuda_model *m, int32_t n_blocks, int32_t n_host_blocks) {
    PG_ARG(m->prepared && !m->kv, "cuda model: alloc_kv before prepare, or twice");
    PG_ARG(n_blocks >= 2 && n_host_blocks >= 0, "cuda model: %d KV blocks", n_blocks);
    PG_CUDA_TRY(cudaSetDevice(m->device));
    const pg_cuda_model_shape *sh = &m->sh;
    const size_t per_block = pg_cuda_model_kv_block_bytes(sh, m->lim.block_size);
    m->block_bytes = (size_t)m->lim.block_size * (size_t)sh->n_kv_heads * (size_t)sh->head_dim *
                     (sh->kv_dtype == PG_KV_FP8_E4M3 ? 1 : sizeof(bf16));
    m->layer_bytes = (size_t)n_blocks * m->block_bytes;
    const size_t total_kv = 2 * (size_t)sh->n_layers * m->layer_bytes;
    size_t free_b, total_b;
    PG_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    cudaError_t e = cudaMalloc((void **)&m->kv, total_kv);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        m->kv = nullptr;
        int64_t fit = (int64_t)(free_b > ((size_t)256 << 20) ? free_b - ((size_t)256 << 20) : 0) /
                      (int64_t)per_block;
        return pg_err_set(
            PG_ENOMEM,
            "KV cache of %d blocks (%.2f GiB) does not fit in the %.2f GiB of free device "
            "memory; at most about %lld blocks (%lld tokens) would",
            n_blocks, (double)total_kv / (1 << 30), (double)free_b / (1 << 30), (long long)fit,
            (long long)fit * m->lim.block_size);
    }
    PG_CUDA_TRY(
        cudaMemsetAsync(m->kv, 0, total_kv, m->stream)); // finite values in never-written slots
    m->n_blocks = n_blocks;
    void **ptrs = (void **)malloc(sizeof(void *) * 2 * (size_t)sh->n_layers);
    if (!ptrs) return pg_err_set(PG_ENOMEM, "cuda model: out of host memory");
    for (int32_t l = 0; l < sh->n_layers; l++) {
        ptrs[l] = m->kv + (size_t)(2 * l) * m->layer_bytes;
        ptrs[sh->n_layers + l] = m->kv + (size_t)(2 * l + 1) * m->layer_bytes;
    }
    e = cudaMalloc((void **)&m->kv_ptrs_dev, sizeof(void *) * 2 * (size_t)sh->n_layers);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(m->kv_ptrs_dev, ptrs, sizeof(void *) * 2 * (size_t)sh->n_layers,
                            cudaMemcpyHostToDevice, m->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(m->stream);
    free(ptrs);
    PG_CUDA_TRY(e);
    if (n_host_blocks > 0) {
        size_t hb = (size_t)n_host_blocks * per_block;
        e = cudaHostAlloc((void **)&m->host_kv, hb, cudaHostAllocDefault);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            m->host_kv = nullptr;
            return pg_err_set(PG_ENOMEM,
                              "swap space of %d blocks (%.2f GiB of pinned host memory) cannot be "
                              "allocated; lower --swap-space",
                              n_host_blocks, (double)hb / (1 << 30));
        }
        m->n_host_blocks = n_host_blocks;
    }
    PG_CUDA_TRY(cudaStreamSynchronize(m->stream));
    return 0;
}

extern "C" void pg_cuda_model_mem(const pg_cuda_model *m, pg_cuda_mem_stats *out) {
    memset(out, 0, sizeof *out);
    cudaSetDevice(m->device);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    out->total = (int64_t)total_b;
    out->free = (int64_t)free_b;
    out->weights = (int64_t)m->wbytes;
    out->kv = m->kv ? 2 * (int64_t)m->sh.n_layers * (int64_t)m->layer_bytes : 0;
    out->workspace = m->workspace_measured;
    out->workspace_buffers = (int64_t)m->ws_bytes;
    out->graphs = m->graph_bytes;
    out->n_graphs = m->n_graphs;
    if (m->graphs_on && m->graph_reserve > m->graph_bytes)
        out->graphs_reserved = m->graph_reserve - m->graph_bytes;
    out->other = out->total - out->free - out->weights - out->kv - out->workspace - out->graphs;
    if (out->other < 0) out->other = 0;
    out->host_swap = (int64_t)m->n_host_blocks *
                     (int64_t)pg_cuda_model_kv_block_bytes(&m->sh, m->lim.block_size);
    if (pg_cuda_device_describe(out->device, sizeof out->device) < 0)
        snprintf(out->device, sizeof out->device, "cuda");
}

// --- a step ------------------------------------------------------------------------------------

// Swap copies on the copy stream (ordered by the caller with events). The
// host mirror has the device layout, [2 n_layers][n_host_blocks][block], so
// a run of consecutive blocks (from and to both consecutive) is one copy per
// layer and K/V.
static int swap_blocks(pg_cuda_model *m, const int32_t *pairs, int32_t n, bool to_host) {
    const int32_t L2 = 2 * m->sh.n_layers;
    const size_t bb = m->block_bytes, host_layer = (size_t)m->n_host_blocks * bb;
    for (int32_t i = 0; i < n;) {
        const int32_t from = pairs[2 * i], to = pairs[2 * i + 1];
        int32_t run = 1;
        while (i + run < n && pairs[2 * (i + run)] == from + run &&
               pairs[2 * (i + run) + 1] == to + run)
            run++;
        for (int32_t t = 0; t < L2; t++) {
            char *dev = m->kv + (size_t)t * m->layer_bytes;
            char *host = m->host_kv + (size_t)t * host_layer;
            if (to_host)
                PG_CUDA_TRY(cudaMemcpyAsync(host + (size_t)to * bb, dev + (size_t)from * bb,
                                            (size_t)run * bb, cudaMemcpyDeviceToHost,
                                            m->copy_stream));
            else
                PG_CUDA_TRY(cudaMemcpyAsync(dev + (size_t)to * bb, host + (size_t)from * bb,
                                            (size_t)run * bb, cudaMemcpyHostToDevice,
                                            m->copy_stream));
        }
        i += run;
    }
    return 0;
}

// Small batches (rows <= gemv_rows) take the weight-streaming GEMV; a shape
// it declines (PG_EUNSUPP) and larger batches take cuBLASLt.
static int gemm(pg_cuda_model *m, bf16 *out, int64_t ldo, const bf16 *x, int64_t ldx, const bf16 *w,
                int64_t rows, int64_t n, int64_t k, int accumulate) {
    if (rows <= m->gemv_rows) {
        int rc = pg_cuda_gemv_bf16(out, ldo, x, ldx, w, rows, n, k, accumulate, m->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    return pg_cuda_gemm_bf16(m->gemm, out, ldo, x, ldx, w, rows, n, k, accumulate, m->gemm_ws,
                             m->gemm_ws_bytes, m->stream);
}

// out = RMSNorm(x) * norm_w . w^T over the residual stream x [rows][hidden]:
// the GEMV with the norm in its prologue for small batches, else
// add_rmsnorm into xn and the GEMM (the same numbers either way).
static int norm_gemm(pg_cuda_model *m, bf16 *out, int64_t ldo, const bf16 *norm_w, const bf16 *w,
                     int64_t rows, int64_t n) {
    const int64_t H = m->sh.hidden;
    if (rows <= m->gemv_rows) {
        int rc = pg_cuda_gemv_rmsnorm_bf16(out, ldo, m->x, H, norm_w, m->sh.rms_eps, w, rows, n, H,
                                           m->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    PG_TRY(pg_cuda_add_rmsnorm(m->xn, m->x, nullptr, norm_w, rows, H, m->sh.rms_eps, m->stream));
    return gemm(m, out, ldo, m->xn, H, w, rows, n, H, 0);
}

// h = silu(gate) * up of RMSNorm(x) * norm_w through the fused [gate|up]
// weight: one GEMV for small batches, else add_rmsnorm, the GEMM into gu
// and silu_mul.
static int norm_gate_up_silu(pg_cuda_model *m, const bf16 *norm_w, const bf16 *gu_w, int64_t rows) {
    const int64_t H = m->sh.hidden, ffn = m->sh.ffn;
    if (rows <= m->gemv_rows) {
        int rc = pg_cuda_gemv_rmsnorm_silu_bf16(m->h, ffn, m->x, H, norm_w, m->sh.rms_eps, gu_w, rows,
                                                ffn, H, m->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    PG_TRY(pg_cuda_add_rmsnorm(m->xn, m->x, nullptr, norm_w, rows, H, m->sh.rms_eps, m->stream));
    PG_TRY(gemm(m, m->gu, 2 * ffn, m->xn, H, gu_w, rows, 2 * ffn, H, 0));
    return pg_cuda_silu_mul(m->h, m->gu, rows, ffn, m->stream);
}

// Device addresses of one step's packed inputs.
struct DevIn {
    const int32_t *tok, *pos, *slots, *bt, *lens, *start, *cu, *rows, *stok, *feed;
    const pg_cuda_sample_params *params;
};

// Packs the step's host arrays into the pinned image and uploads them in one
// copy. The offsets depend only on the array sizes, so two steps of the same
// shape (a graph bucket) get the same device addresses.
static int pack_inputs(pg_cuda_model *m, const pg_cuda_step *s, DevIn *d) {
    const int32_t n = s->n_tokens, n_pre = s->n_seqs - s->n_decode;
    PG_ARG(n <= m->lim.max_tokens && s->n_seqs <= m->lim.max_seqs &&
               s->n_sample <= m->lim.max_seqs && s->n_decode >= 0 && n_pre >= 0,
           "cuda step: %d tokens / %d sequences (%d decode) beyond the limits %d / %d", n,
           s->n_seqs, s->n_decode, m->lim.max_tokens, m->lim.max_seqs);
    Packer pk;
    pk.host = m->in_host;
    pk.dev = m->in_dev;
    pk.cap = m->in_cap - pair_region_bytes(m); // the end holds copy-on-write pairs
    d->tok = pk.put(s->tokens, (size_t)n);
    d->pos = pk.put(s->pos, (size_t)n);
    d->slots = pk.put(s->slots, (size_t)n);
    d->bt = pk.put(s->block_tables, (size_t)s->n_seqs * (size_t)s->bt_stride);
    d->lens = pk.put(s->seq_lens, (size_t)s->n_seqs);
    d->start = pk.put(s->start_pos, (size_t)s->n_seqs);
    d->cu = pk.put(s->cu_q, (size_t)(n_pre + 1));
    d->rows = pk.put(s->sample_rows, (size_t)s->n_sample);
    d->params = pk.put(s->params, (size_t)s->n_sample);
    d->stok = pk.put(s->sample_tokens, (size_t)s->n_sample_tokens);
    // Last: no graph reads it, so the addresses above stay a graph bucket's.
    d->feed = pk.put(s->feed, 2 * (size_t)s->n_feed);
    if (pk.overflow)
        return pg_err_set(PG_EINVAL,
                          "cuda step: inputs exceed the %zu bytes sized at start (block tables of "
                          "stride %d, %d history tokens)",
                          pk.cap, s->bt_stride, s->n_sample_tokens);
    PG_CUDA_TRY(cudaMemcpyAsync(m->in_dev, m->in_host, pk.used, cudaMemcpyHostToDevice, m->stream));
    return 0;
}

// The embedding and every layer: what a decode graph captures.
static int run_layers(pg_cuda_model *m, const pg_cuda_step *s, const DevIn &d) {
    const pg_cuda_model_shape *sh = &m->sh;
    const int32_t n = s->n_tokens, n_dec = s->n_decode, n_pre = s->n_seqs - s->n_decode;
    if (n == 0) return 0;
    cudaStream_t stream = m->stream;
    const int64_t H = sh->hidden, q_dim = m->q_dim, qkv_dim = m->qkv_dim, ffn = sh->ffn;
    const float scale = 1.0f / sqrtf((float)sh->head_dim);
    const pg_kv_shape kvs = {m->n_blocks, m->lim.block_size, sh->n_kv_heads, sh->head_dim, sh->kv_dtype};
    PG_TRY(pg_cuda_embed(m->x, m->emb, d.tok, n, H, sh->vocab, stream));
    for (int32_t l = 0; l < sh->n_layers; l++) {
        const Layer *L = &m->layers[l];
        void *kc = m->kv + (size_t)(2 * l) * m->layer_bytes,
             *vc = m->kv + (size_t)(2 * l + 1) * m->layer_bytes;
        PG_TRY(norm_gemm(m, m->qkv, qkv_dim, L->attn_norm, L->qkv, n, qkv_dim));
        PG_TRY(pg_cuda_rope_kv_write(m->qkv, qkv_dim, m->qkv + q_dim, qkv_dim,
                                     m->qkv + q_dim + m->kv_dim, qkv_dim, d.pos, d.slots, n,
                                     sh->n_heads, m->inv_freq, kc, vc, kvs, stream));
        if (n_dec > 0)
            PG_TRY(pg_cuda_paged_decode_attention(
                m->attn, m->qkv, qkv_dim, kc, vc, kvs, d.bt, s->bt_stride, d.lens, n_dec,
                sh->n_heads, scale, s->max_decode_ctx, m->dec_ws, m->dec_ws_bytes, stream));
        if (n_pre > 0)
            PG_TRY(pg_cuda_paged_prefill_attention(
                m->attn + (size_t)n_dec * q_dim, m->qkv + (size_t)n_dec * qkv_dim, qkv_dim, kc, vc,
                kvs, d.bt + (size_t)n_dec * s->bt_stride, s->bt_stride, d.cu, d.start + n_dec,
                n_pre, sh->n_heads, scale, s->max_prefill_q, stream));
        PG_TRY(gemm(m, m->x, H, m->attn, q_dim, L->o, n, H, q_dim, 1));
        PG_TRY(norm_gate_up_silu(m, L->ffn_norm, L->gu, n));
        PG_TRY(gemm(m, m->x, H, m->h, ffn, L->down, n, H, ffn, 1));
    }
    return 0;
}

// Gather of the sampled rows, final norm, LM head, sampling, and the copy
// of the results to `host` (pinned); does not wait.
static int enqueue_tail(pg_cuda_model *m, const pg_cuda_step *s, const DevIn &d,
                        pg_cuda_sample_out *host) {
    const pg_cuda_model_shape *sh = &m->sh;
    const int32_t ns = s->n_sample;
    const int64_t H = sh->hidden;
    cudaStream_t stream = m->stream;
    if (ns > 0) {
        PG_TRY(pg_cuda_embed(m->lg_in, m->x, d.rows, ns, H, s->n_tokens,
                             stream)); // gather the sampled rows
        PG_TRY(pg_cuda_add_rmsnorm(m->lg_in, m->lg_in, nullptr, m->final_norm, ns, H, sh->rms_eps,
                                   stream));
        PG_TRY(gemm(m, m->logits, m->ld_logits, m->lg_in, H, m->lm_head, ns, sh->vocab, H, 0));
        PG_TRY(pg_cuda_sample(m->out_dev, m->logits, PG_CUDA_BF16, m->ld_logits, ns, sh->vocab,
                              d.params, s->n_sample_tokens ? d.stok : d.tok, m->samp_ws,
                              m->samp_ws_bytes, stream));
        PG_CUDA_TRY(cudaMemcpyAsync(host, m->out_dev, sizeof(pg_cuda_sample_out) * (size_t)ns,
                                    cudaMemcpyDeviceToHost, stream));
    }
    return 0;
}

// enqueue_tail, then waits for the results (the end of an eager step).
static int run_tail(pg_cuda_model *m, const pg_cuda_step *s, const DevIn &d,
                    pg_cuda_sample_out *out) {
    const int32_t ns = s->n_sample;
    PG_TRY(enqueue_tail(m, s, d, m->out_host));
    PG_CUDA_TRY(cudaStreamSynchronize(m->stream));
    if (ns > 0 && out != m->out_host)
        memcpy(out, m->out_host, sizeof(pg_cuda_sample_out) * (size_t)ns);
    m->last_n_sample = ns;
    return 0;
}

// The forward + sampling of one step, eager (start-up profiling, tests).
static int forward_and_sample(pg_cuda_model *m, const pg_cuda_step *s, bool moves_done,
                              pg_cuda_sample_out *out) {
    (void)moves_done;
    DevIn d;
    PG_TRY(pack_inputs(m, s, &d));
    PG_TRY(run_layers(m, s, d));
    return run_tail(m, s, d, out);
}

// A decode-only step padded to its graph bucket: *ps describes the padded
// batch (host arrays in m->g_*), *slot the graph of (B, C). False when the
// step is no graph candidate.
static bool graph_step(pg_cuda_model *m, const pg_cuda_step *s, pg_cuda_step *ps, int32_t *slot) {
    if (!m->graphs_on || s->n_seqs <= 0 || s->n_decode != s->n_seqs || s->n_tokens != s->n_seqs)
        return false;
    int32_t bi = 0, ci = 0;
    while (bi < m->n_bbuckets - 1 && m->bbuckets[bi] < s->n_seqs) bi++;
    while (ci < m->n_cbuckets - 1 && m->cbuckets[ci] < s->max_decode_ctx) ci++;
    const int32_t B = m->bbuckets[bi], C = m->cbuckets[ci], bs = m->lim.block_size;
    if (B < s->n_seqs || C < s->max_decode_ctx) return false;
    *slot = bi * m->n_cbuckets + ci;
    if (m->graph_state[*slot] < 0) return false;
    const int32_t stride = (C + bs - 1) / bs, n = s->n_seqs;
    if (stride < s->bt_stride) return false;
    memcpy(m->g_tok, s->tokens, sizeof(int32_t) * (size_t)n);
    memcpy(m->g_pos, s->pos, sizeof(int32_t) * (size_t)n);
    memcpy(m->g_slots, s->slots, sizeof(int32_t) * (size_t)n);
    memcpy(m->g_lens, s->seq_lens, sizeof(int32_t) * (size_t)n);
    memcpy(m->g_start, s->start_pos, sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++)
        memcpy(m->g_bt + (size_t)i * stride, s->block_tables + (size_t)i * s->bt_stride,
               sizeof(int32_t) * (size_t)((s->seq_lens[i] + bs - 1) / bs));
    for (int32_t i = n; i < B; i++) { // pad rows: one key of the null block, no KV write
        m->g_tok[i] = 0, m->g_pos[i] = 0, m->g_slots[i] = -1, m->g_lens[i] = 1, m->g_start[i] = 0;
        m->g_bt[(size_t)i * stride] = 0;
    }
    *ps = *s;
    ps->n_tokens = ps->n_seqs = ps->n_decode = B;
    ps->tokens = m->g_tok, ps->pos = m->g_pos, ps->slots = m->g_slots;
    ps->seq_lens = m->g_lens, ps->start_pos = m->g_start;
    ps->block_tables = m->g_bt, ps->bt_stride = stride;
    ps->max_decode_ctx = C;
    return true;
}

// Captures run_layers for the padded step (the stream is idle; inputs stay
// at the addresses `d` names for every step of this bucket). A failure
// leaves the bucket eager for good; it is never an error of the step.
static void capture_graph(pg_cuda_model *m, const pg_cuda_step *ps, const DevIn &d, int32_t slot) {
    size_t f0 = 0, f1 = 0, t = 0;
    cudaMemGetInfo(&f0, &t);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeRelaxed);
    int rc = e == cudaSuccess ? run_layers(m, ps, d) : PG_EIO;
    if (e == cudaSuccess) e = cudaStreamEndCapture(m->stream, &graph);
    if (rc == 0 && e == cudaSuccess && graph) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    // Upload now: the graph's device memory is taken (and measured) here, and
    // its first replay does not pay for it.
    if (rc == 0 && e == cudaSuccess && exec) e = cudaGraphUpload(exec, m->stream);
    if (rc == 0 && e == cudaSuccess && exec) e = cudaStreamSynchronize(m->stream);
    if (rc < 0 || e != cudaSuccess || !exec) {
        (void)cudaGetLastError();
        if (exec) cudaGraphExecDestroy(exec);
        exec = nullptr;
        m->graph_state[slot] = -1;
        PG_LOGW("cuda graph for %d decode sequences, context <= %d: capture failed (%s); that "
                "bucket runs eagerly",
                ps->n_seqs, ps->max_decode_ctx, rc < 0 ? pg_err_msg() : cudaGetErrorString(e));
        return;
    }
    m->graph_exec[slot] = exec;
    m->graph_state[slot] = 1;
    m->n_graphs++;
    cudaMemGetInfo(&f1, &t);
    if (f0 > f1) m->graph_bytes += (int64_t)(f0 - f1);
}

// The decode step of bucket (bi, ci) made of pad rows only (token 0,
// position 0, no KV write, one key of the null block 0): what start-up
// capture records. A real step of the bucket (graph_step) puts its rows in
// the same host arrays, so pack_inputs gives it the same device addresses.
static void pad_step(pg_cuda_model *m, int32_t bi, int32_t ci, pg_cuda_step *ps) {
    static const int32_t zero = 0;
    const int32_t B = m->bbuckets[bi], C = m->cbuckets[ci], bs = m->lim.block_size;
    const int32_t stride = (C + bs - 1) / bs;
    for (int32_t i = 0; i < B; i++) {
        m->g_tok[i] = 0, m->g_pos[i] = 0, m->g_slots[i] = -1, m->g_lens[i] = 1, m->g_start[i] = 0;
        m->g_bt[(size_t)i * stride] = 0;
    }
    memset(ps, 0, sizeof *ps);
    ps->n_tokens = ps->n_seqs = ps->n_decode = B;
    ps->tokens = m->g_tok, ps->pos = m->g_pos, ps->slots = m->g_slots;
    ps->seq_lens = m->g_lens, ps->start_pos = m->g_start;
    ps->block_tables = m->g_bt, ps->bt_stride = stride;
    ps->cu_q = &zero;
    ps->max_decode_ctx = C;
    ps->sample_tokens = m->g_tok; // n_sample 0: nothing sampled
}

// Graphs are captured after the KV pool is sized, so their memory is
// planned before it: on prepare's temporary pool, a few captures of the
// largest bucket (one warm-up step first) are measured and destroyed; the
// reserve covers every bucket, lazily captured ones too, with a margin.
// cudaMemGetInfo counts 2 MiB pages, hence several probes. Failures only
// log: the reserve falls back to 8 MiB per graph.
static void probe_graph_memory(pg_cuda_model *m) {
    constexpr int N_PROBE = 8;
    const int64_t n_all = (int64_t)m->n_bbuckets * m->n_cbuckets;
    int64_t per = (int64_t)8 << 20;
    cudaGraphExec_t ex[N_PROBE] = {};
    int n_ok = 0;
    size_t f0 = 0, f1 = 0, t = 0;
    pg_cuda_step ps;
    pad_step(m, m->n_bbuckets - 1, m->n_cbuckets - 1, &ps);
    DevIn d;
    int rc = pack_inputs(m, &ps, &d);
    if (rc == 0) rc = run_layers(m, &ps, d);
    cudaError_t e = rc == 0 ? cudaStreamSynchronize(m->stream) : cudaSuccess;
    if (rc == 0 && e == cudaSuccess) e = cudaMemGetInfo(&f0, &t);
    for (int i = 0; rc == 0 && e == cudaSuccess && i < N_PROBE; i++) {
        cudaGraph_t graph = nullptr;
        e = cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeRelaxed);
        if (e != cudaSuccess) break;
        rc = run_layers(m, &ps, d);
        e = cudaStreamEndCapture(m->stream, &graph);
        if (rc == 0 && e == cudaSuccess) e = cudaGraphInstantiate(&ex[i], graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (rc == 0 && e == cudaSuccess) e = cudaGraphUpload(ex[i], m->stream);
        if (rc == 0 && e == cudaSuccess) e = cudaStreamSynchronize(m->stream);
        if (rc == 0 && e == cudaSuccess) n_ok++;
    }
    if (n_ok == N_PROBE && cudaMemGetInfo(&f1, &t) == cudaSuccess)
        per = f0 > f1 ? (int64_t)((f0 - f1) / N_PROBE) : 0;
    else
        PG_LOGW("cuda graphs: the memory probe failed (%s); reserving %lld MiB per graph",
                rc < 0 ? pg_err_msg() : cudaGetErrorString(e), (long long)(per >> 20));
    (void)cudaGetLastError();
    for (int i = 0; i < N_PROBE; i++)
        if (ex[i]) cudaGraphExecDestroy(ex[i]);
    // The probe sees 2 MiB pages: on the H200 at llama3-8b-shape it measured
    // 0.5 MiB per graph where 90 captures took 0.93 MiB each. Hence a floor of
    // 1 MiB per graph and a 1.5x margin.
    if (per < ((int64_t)1 << 20)) per = (int64_t)1 << 20;
    m->graph_reserve = per * n_all + per * n_all / 2 + ((int64_t)16 << 20);
    PG_LOGI("cuda graphs: %.2f MiB per graph measured; %.1f MiB reserved for %lld buckets",
            (double)per / (1 << 20), (double)m->graph_reserve / (1 << 20), (long long)n_all);
}

extern "C" int pg_cuda_model_capture_graphs(pg_cuda_model *m) {
    PG_ARG(m->prepared && m->kv, "cuda model: capture_graphs before alloc_kv");
    if (!m->graphs_on || m->graph_mode != PG_CUDA_GRAPHS_STARTUP) return 0;
    PG_CUDA_TRY(cudaSetDevice(m->device));
    // Context buckets up to the start-up bound; larger ones on first use.
    int32_t max_ctx = m->lim.max_model_len, n_ci = 0;
    const char *env = getenv("PAGED_CUDA_GRAPH_STARTUP_CTX");
    if (env && atoi(env) > 0) max_ctx = atoi(env);
    while (n_ci < m->n_cbuckets && (n_ci == 0 || m->cbuckets[n_ci] <= max_ctx)) n_ci++;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int64_t bytes0 = m->graph_bytes;
    const int32_t n0 = m->n_graphs;
    for (int32_t bi = 0; bi < m->n_bbuckets; bi++)
        for (int32_t ci = 0; ci < n_ci; ci++) {
            const int32_t slot = bi * m->n_cbuckets + ci;
            if (m->graph_state[slot] != 0) continue;
            pg_cuda_step ps;
            pad_step(m, bi, ci, &ps);
            DevIn d;
            PG_TRY(pack_inputs(m, &ps, &d));
            // One eager step per batch bucket at the smallest and the largest
            // context (GEMM plans of this batch size, both decode paths: one
            // pass and split + reduce), so the capture loads no kernel.
            if (ci == 0 || ci == n_ci - 1) PG_TRY(run_layers(m, &ps, d));
            PG_CUDA_TRY(cudaStreamSynchronize(m->stream)); // idle stream; the host image is reused
            capture_graph(m, &ps, d, slot);
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs =
        (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    char more[96] = "";
    if (n_ci < m->n_cbuckets)
        snprintf(more, sizeof more, "; contexts above %d captured on first use",
                 m->cbuckets[n_ci - 1]);
    PG_LOGI("cuda graphs: %d captured in %.2f s, %.1f MiB (batch buckets 1..%d x context buckets "
            "%d..%d%s)",
            m->n_graphs - n0, secs, (double)(m->graph_bytes - bytes0) / (1 << 20),
            m->bbuckets[m->n_bbuckets - 1], m->cbuckets[0], m->cbuckets[n_ci - 1], more);
    if (m->graph_reserve > 0 && m->graph_bytes > m->graph_reserve)
        PG_LOGW("cuda graphs: %.1f MiB captured, above the %.1f MiB reserved for them",
                (double)m->graph_bytes / (1 << 20), (double)m->graph_reserve / (1 << 20));
    return 0;
}

extern "C" int pg_cuda_model_step_begin(pg_cuda_model *m, const pg_cuda_step *s) {
    PG_ARG(m->kv, "cuda step: no KV cache (alloc_kv first)");
    PG_ARG(m->n_open < 2, "cuda step: two steps begun and not ended");
    PG_ARG(s->n_feed >= 0 && s->n_feed <= s->n_tokens && (s->n_feed == 0 || s->feed),
           "cuda step: %d fed tokens", s->n_feed);
    PG_CUDA_TRY(cudaSetDevice(m->device));
    // This step's host image and output buffer: the ones step N - 2 used,
    // which has ended (n_open < 2), so its copies are done.
    const int buf = m->next_buf;
    m->in_host = m->in_host_buf[buf];
    m->out_host = m->out_host_buf[buf];
    if (s->n_swap_out || s->n_swap_in) {
        PG_ARG(m->host_kv, "cuda step: swap requested but there is no swap space");
        // The copy stream starts after everything the compute stream queued.
        PG_CUDA_TRY(cudaEventRecord(m->ev_compute, m->stream));
        PG_CUDA_TRY(cudaStreamWaitEvent(m->copy_stream, m->ev_compute, 0));
        PG_TRY(swap_blocks(m, s->swap_out, s->n_swap_out, true));
        PG_TRY(swap_blocks(m, s->swap_in, s->n_swap_in, false));
        PG_CUDA_TRY(cudaEventRecord(m->ev_copy, m->copy_stream));
        PG_CUDA_TRY(cudaStreamWaitEvent(m->stream, m->ev_copy, 0));
    }
    // Copy-on-write copies: pairs go through a small packed upload of their own,
    // in chunks that fit the input buffer's pair region.
    for (int32_t done = 0; done < s->n_copies;) {
        int32_t chunk = s->n_copies - done;
        const int32_t cap = (int32_t)(pair_region_bytes(m) / 8);
        if (chunk > cap) chunk = cap;
        // The pair list goes at the end of the input buffer, a region the
        // step inputs (packed from the start) never reach.
        int32_t *hp = (int32_t *)(m->in_host + m->in_cap - pair_region_bytes(m));
        int32_t *dp = (int32_t *)(m->in_dev + m->in_cap - pair_region_bytes(m));
        memcpy(hp, s->copies + 2 * (size_t)done, (size_t)chunk * 8);
        PG_CUDA_TRY(cudaMemcpyAsync(dp, hp, (size_t)chunk * 8, cudaMemcpyHostToDevice, m->stream));
        PG_TRY(pg_cuda_copy_blocks(m->kv_ptrs_dev, m->kv_ptrs_dev + m->sh.n_layers, m->sh.n_layers,
                                   dp, chunk, (int64_t)m->block_bytes, m->stream));
        PG_CUDA_TRY(cudaStreamSynchronize(m->stream)); // the host image is reused by the next chunk
        done += chunk;
    }
    if (s->n_tokens > 0 || s->n_sample > 0) {
        pg_cuda_step padded;
        int32_t slot = -1;
        const bool g = graph_step(m, s, &padded, &slot);
        const pg_cuda_step *run = g ? &padded : s;
        DevIn d;
        // PAGED_CUDA_TIMING: one step at a time (the events are shared), timed
        // from packing to the results.
        const bool timed = m->timing && s->n_seqs == s->n_decode;
        struct timespec h0, h1;
        if (timed) {
            PG_CUDA_TRY(cudaStreamSynchronize(m->stream));
            clock_gettime(CLOCK_MONOTONIC, &h0);
        }
        PG_TRY(pack_inputs(m, run, &d));
        // Tokens sampled by the step before (async scheduling), straight
        // from its sampler output, which that step's copy to the host has
        // already read in stream order and this step's sampler overwrites later.
        if (s->n_feed > 0) PG_TRY(pg_cuda_feed_tokens((int32_t *)d.tok, m->out_dev, d.feed, s->n_feed, m->stream));
        if (timed) PG_CUDA_TRY(cudaEventRecord(m->t_ev[0], m->stream));
        if (g && m->graph_state[slot] == 1)
            PG_CUDA_TRY(cudaGraphLaunch(m->graph_exec[slot], m->stream));
        else
            PG_TRY(run_layers(m, run, d));
        if (timed) PG_CUDA_TRY(cudaEventRecord(m->t_ev[1], m->stream));
        PG_TRY(enqueue_tail(m, run, d, m->out_host));
        if (timed) {
            float ta = 0, tb = 0;
            PG_CUDA_TRY(cudaEventRecord(m->t_ev[2], m->stream));
            PG_CUDA_TRY(cudaEventSynchronize(m->t_ev[2]));
            cudaEventElapsedTime(&ta, m->t_ev[0], m->t_ev[1]);
            cudaEventElapsedTime(&tb, m->t_ev[1], m->t_ev[2]);
            clock_gettime(CLOCK_MONOTONIC, &h1);
            m->t_layers_ms += ta, m->t_tail_ms += tb;
            m->t_host_ms +=
                (double)(h1.tv_sec - h0.tv_sec) * 1e3 + (double)(h1.tv_nsec - h0.tv_nsec) * 1e-6;
            m->t_steps++;
        }
        // First eager step of this bucket: capture it for the next ones. The
        // capture wants an idle stream; this step then ends synchronously.
        if (g && m->graph_state[slot] == 0) {
            PG_CUDA_TRY(cudaStreamSynchronize(m->stream));
            capture_graph(m, run, d, slot);
        }
    }
    PG_CUDA_TRY(cudaEventRecord(m->ev_done[buf], m->stream));
    m->open[m->n_open++] = {buf, s->n_sample};
    m->next_buf = buf ^ 1;
    return 0;
}

extern "C" int pg_cuda_model_step_end(pg_cuda_model *m, pg_cuda_sample_out *out) {
    PG_ARG(m->n_open > 0, "cuda step: no step begun");
    const pg_cuda_model::OpenStep o = m->open[0];
    m->open[0] = m->open[1];
    m->n_open--;
    PG_CUDA_TRY(cudaSetDevice(m->device));
    PG_CUDA_TRY(cudaEventSynchronize(m->ev_done[o.buf]));
    if (o.n_sample > 0 && out != m->out_host_buf[o.buf])
        memcpy(out, m->out_host_buf[o.buf], sizeof(pg_cuda_sample_out) * (size_t)o.n_sample);
    m->last_n_sample = o.n_sample;
    return 0;
}

extern "C" int pg_cuda_model_step(pg_cuda_model *m, const pg_cuda_step *s,
                                  pg_cuda_sample_out *out) {
    PG_ARG(m->n_open == 0, "cuda step: a begun step is not ended");
    PG_TRY(pg_cuda_model_step_begin(m, s));
    return pg_cuda_model_step_end(m, out);
}

extern "C" int pg_cuda_model_last_logits(pg_cuda_model *m, float *out, int32_t n) {
    PG_ARG(n >= 0 && n <= m->last_n_sample, "last_logits: %d rows, the last step sampled %d", n,
           m->last_n_sample);
    if (n == 0) return 0;
    PG_CUDA_TRY(cudaSetDevice(m->device));
    const size_t count = (size_t)n * (size_t)m->ld_logits, V = (size_t)m->sh.vocab;
    float *tmp = nullptr;
    PG_CUDA_TRY(cudaMalloc((void **)&tmp, count * sizeof(float)));
    int rc = pg_cuda_bf16_to_f32(tmp, m->logits, (int64_t)count, m->stream);
    cudaError_t e = cudaSuccess;
    if (rc == 0) // rows of ld_logits on the device, of vocab in `out`
        e = cudaMemcpy2DAsync(out, V * sizeof(float), tmp, (size_t)m->ld_logits * sizeof(float),
                              V * sizeof(float), (size_t)n, cudaMemcpyDeviceToHost, m->stream);
    if (rc == 0 && e == cudaSuccess) e = cudaStreamSynchronize(m->stream);
    cudaFree(tmp);
    if (rc < 0) return rc;
    PG_CUDA_TRY(e);
    return 0;
}
