// kernels/cuda/prefill_flashinfer.cu - FlashInfer's sm90 paged prefill
// (FA3-style: wgmma, TMA for Q, producer/consumer warp specialization) as
// the prefill kernel of the attention op, over our paged KV cache in place
// (issue 29; docs/cuda_kernels.md, "FlashInfer's prefill in the runner").
//
// Why a library: bench/cuda/bench_fi_prefill measured this kernel at
// 1.89-2.17x our pg_cuda_paged_prefill_attention (v2) on an H100, with the
// same error against an fp32 reference; FlashInfer is what vLLM and SGLang
// ship for this, and its header library comes from PyPI's flashinfer-python
// (deploy/quickstart.sh puts it in .venv; tools/nvcc_or_stub.sh compiles
// this file with FlashInfer's own sm90 JIT flags). Without the headers this
// file builds the PG_EUNSUPP stub below, and the op keeps our kernel.
//
// How it reads our cache: one layer's K and V are [n_blocks][block_size]
// [n_kv][head_dim] bf16 (FlashInfer's NHD page layout) and the padded block
// tables [n_seqs][bt_stride] are its kv_indices as they are, with
// kv_indptr[s] = s * bt_stride: no gather, no copy. Causal is bottom-right
// aligned (query i of a chunk of q_len over kv_len keys sees the keys up to
// kv_len - q_len + i), which is our start_pos + i, so chunked prefill and
// prefix-cache hits need nothing more.
//
// The plan (PrefillSM90Plan, host, 0.25-1 ms) runs once per step: the op is
// called once per layer with the same batch, and a plan is kept while its
// inputs (the host copies of cu_q and start_pos, the shape) do not change.
// It writes a pinned host image and copies it into the first
// pg_cuda_fi_prefill_ws_bytes of the attention workspace on the compute
// stream, so the copy is ordered after the previous step's kernels that
// read the last plan. Two host images alternate; an event per image says
// when its copy has left, before the host writes it again.
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h" // first: its extern "C" block takes common/err.h
extern "C" {
#include "common/log.h"
}

#ifndef PG_HAVE_FLASHINFER

extern "C" bool pg_cuda_fi_prefill_built(void) { return false; }
extern "C" int pg_cuda_fi_prefill_create(pg_cuda_fi_prefill **out) {
    *out = nullptr;
    return pg_err_set(PG_EUNSUPP, "cuda: built without FlashInfer's headers (pip install flashinfer-python)");
}
extern "C" void pg_cuda_fi_prefill_destroy(pg_cuda_fi_prefill *fi) { (void)fi; }
extern "C" int pg_cuda_fi_prefill_run(pg_cuda_fi_prefill *fi, void *out, const void *q, int64_t q_stride,
                                      const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                      const int32_t *block_tables, int32_t bt_stride, const int32_t *host_cu_q,
                                      const int32_t *host_start_pos, int32_t n_seqs, int32_t n_heads, float scale,
                                      void *ws, size_t ws_bytes, void *stream) {
    (void)fi, (void)out, (void)q, (void)q_stride, (void)k_cache, (void)v_cache, (void)kv, (void)block_tables;
    (void)bt_stride, (void)host_cu_q, (void)host_start_pos, (void)n_seqs, (void)n_heads, (void)scale, (void)ws;
    (void)ws_bytes, (void)stream;
    return PG_EUNSUPP;
}

#else

#include <cuda_runtime.h>

#include <exception>
#include <vector>

#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/cutlass_utils.cuh>

using namespace flashinfer;

namespace {

// What FlashInfer's batch_prefill_sm90_customize_config.jinja generates for
// bf16 Q/K/V/O, int32 ids and its default (no fp8) variant: the kernel
// reads these fields by name.
struct PagedParams {
    using DTypeQ = cutlass::bfloat16_t;
    using DTypeKV = cutlass::bfloat16_t;
    using DTypeO = cutlass::bfloat16_t;
    using IdType = int32_t;
    DTypeQ *q_ptr;
    DTypeKV *k_ptr;
    DTypeKV *v_ptr;
    DTypeO *o_ptr;
    float *lse_ptr;

    IdType *qo_tile_indices;
    IdType *qo_indptr;
    IdType *kv_indptr;
    IdType *kv_indices;
    IdType *qo_lens;
    IdType *kv_lens;
    IdType *head_indices;
    IdType *work_indptr;
    IdType *batch_indices;

    struct AdditionalParams {
        uint32_t *maybe_prefix_len_ptr;
        uint16_t *maybe_token_pos_in_items_ptr;
        uint16_t *maybe_max_item_len_ptr;
        float *maybe_scale_v;
        double logits_soft_cap;
        double sm_scale;
        double scale_v_scalar;
        int64_t token_pos_in_items_len;
    } additional_params;

    int64_t q_stride_n;
    int64_t k_stride_n;
    int64_t v_stride_n;
    int64_t o_stride_n;
    int64_t q_stride_h;
    int64_t k_stride_h;
    int64_t v_stride_h;
    int64_t o_stride_h;
    int64_t nnz_qo;
    int64_t k_page_stride;
    int64_t v_page_stride;

    int head_dim;
    int num_qo_heads;
    int num_kv_heads;
    int group_size;
    int page_size;
    int window_left;

    bool causal;
};

// One instantiation per head_dim, window (LEFT_SLIDING_WINDOW) and
// variant (StandardAttention, or LogitsSoftCap for Gemma 2's soft-capped
// scores), each with both SAME_SCHEDULE_FOR_ALL_HEADS values (the plan picks).
template <int HD, bool WIN, typename Variant>
cudaError_t launch(PagedParams &p, bool same_schedule, cudaStream_t st) {
    if (same_schedule)
        return BatchPrefillWithPagedKVCacheDispatched<HD, HD, MaskMode::kCausal, WIN, true, Variant, PagedParams>(
            p, /*enable_pdl=*/false, st);
    return BatchPrefillWithPagedKVCacheDispatched<HD, HD, MaskMode::kCausal, WIN, false, Variant, PagedParams>(
        p, /*enable_pdl=*/false, st);
}

template <int HD>
cudaError_t launch_hd(PagedParams &p, bool window, bool softcap, bool same_schedule, cudaStream_t st) {
    if (window)
        return softcap ? launch<HD, true, LogitsSoftCap>(p, same_schedule, st)
                       : launch<HD, true, StandardAttention>(p, same_schedule, st);
    return softcap ? launch<HD, false, LogitsSoftCap>(p, same_schedule, st)
                   : launch<HD, false, StandardAttention>(p, same_schedule, st);
}

} // namespace

struct pg_cuda_fi_prefill {
    // Two pinned host images of the plan's int arrays, each with the event
    // recorded after its copy to the device.
    void *host[2];
    size_t host_bytes;
    cudaEvent_t copied[2];
    int next;
    // The last plan and what it was made from.
    bool have_plan;
    PrefillPlanSM90Info plan;
    std::vector<int32_t> key; // n_seqs, bt_stride, n_heads, n_kv, head_dim, block_size, cu_q..., start_pos...
    void *plan_dev;           // the device image the plan was copied to
    std::vector<int32_t> qo_indptr, kv_indptr, kv_len;
    bool announced; // the first launch is logged (tests/gpu/run_gpu_tests.sh looks for it)
};

extern "C" bool pg_cuda_fi_prefill_built(void) { return true; }

extern "C" int pg_cuda_fi_prefill_create(pg_cuda_fi_prefill **out) {
    *out = nullptr;
    int major = 0, dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return pg_err_set(PG_EIO, "cuda: FlashInfer prefill: no device");
    }
    if (major != 9)
        return pg_err_set(PG_EUNSUPP, "cuda: FlashInfer's sm90 prefill needs compute capability 9.x (this is %d.x)",
                          major);
    pg_cuda_fi_prefill *fi = new (std::nothrow) pg_cuda_fi_prefill();
    if (!fi) return pg_err_set(PG_ENOMEM, "cuda: FlashInfer prefill: out of host memory");
    for (int i = 0; i < 2; i++) {
        if (cudaEventCreateWithFlags(&fi->copied[i], cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            pg_cuda_fi_prefill_destroy(fi);
            return pg_err_set(PG_EIO, "cuda: FlashInfer prefill: events");
        }
    }
    *out = fi;
    return 0;
}

extern "C" void pg_cuda_fi_prefill_destroy(pg_cuda_fi_prefill *fi) {
    if (!fi) return;
    for (int i = 0; i < 2; i++) {
        if (fi->copied[i]) {
            cudaEventSynchronize(fi->copied[i]);
            cudaEventDestroy(fi->copied[i]);
        }
        if (fi->host[i]) cudaFreeHost(fi->host[i]);
    }
    delete fi;
}

// The host images are as large as the device region they fill (fixed by
// the head count), allocated at the first plan that needs them.
static int ensure_host(pg_cuda_fi_prefill *fi, size_t bytes) {
    if (fi->host_bytes >= bytes) return 0;
    for (int i = 0; i < 2; i++) {
        if (fi->host[i]) {
            cudaEventSynchronize(fi->copied[i]);
            cudaFreeHost(fi->host[i]);
            fi->host[i] = nullptr;
        }
    }
    fi->host_bytes = 0;
    for (int i = 0; i < 2; i++) {
        if (cudaHostAlloc(&fi->host[i], bytes, cudaHostAllocDefault) != cudaSuccess) {
            (void)cudaGetLastError();
            return pg_err_set(PG_ENOMEM, "cuda: FlashInfer prefill: %zu bytes of pinned host memory", bytes);
        }
    }
    fi->host_bytes = bytes;
    return 0;
}

extern "C" int pg_cuda_fi_prefill_run(pg_cuda_fi_prefill *fi, void *out, const void *q, int64_t q_stride,
                                      const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                      const int32_t *block_tables, int32_t bt_stride, const int32_t *host_cu_q,
                                      const int32_t *host_start_pos, int32_t n_seqs, int32_t n_heads, float scale,
                                      void *ws, size_t ws_bytes, void *stream) {
    // What this build instantiates; the caller runs our kernel otherwise.
    if (!fi || !host_cu_q || !host_start_pos || kv.dtype != PG_KV_BF16 || (kv.head_dim != 64 && kv.head_dim != 128) ||
        n_heads % kv.n_kv_heads || n_seqs <= 0)
        return PG_EUNSUPP;
    const size_t region = pg_cuda_fi_prefill_ws_bytes(n_heads);
    if (!ws || ws_bytes < region) return PG_EUNSUPP;
    cudaStream_t st = (cudaStream_t)stream;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return PG_EUNSUPP; // the host plan would not be replayed
    }
    const int32_t total = host_cu_q[n_seqs];
    // The plan's work items: one per 128-row (192 at head_dim 64) query
    // tile of each sequence, per head unless there are more than 4,096 a
    // head (then one schedule for all heads). The region holds 4,096 a
    // head; a step with more (over 500k query rows) runs our kernel.
    {
        const int64_t tile = kv.head_dim == 64 ? 192 : 128;
        int64_t per_head = 0;
        for (int32_t s = 0; s < n_seqs; s++) per_head += (host_cu_q[s + 1] - host_cu_q[s] + tile - 1) / tile;
        if (per_head > (int64_t)PG_CUDA_FI_MAX_WORKS_PER_HEAD * n_heads) return PG_EUNSUPP;
    }

    // The plan: kept while its inputs are the same (every layer of a step).
    std::vector<int32_t> key;
    key.reserve(8 + 2 * (size_t)n_seqs);
    key.insert(key.end(), {n_seqs, bt_stride, n_heads, kv.n_kv_heads, kv.head_dim, kv.block_size});
    key.insert(key.end(), host_cu_q, host_cu_q + n_seqs + 1);
    key.insert(key.end(), host_start_pos, host_start_pos + n_seqs);
    if (!fi->have_plan || fi->plan_dev != ws || key != fi->key) {
        PG_TRY(ensure_host(fi, region));
        const int i = fi->next;
        fi->next ^= 1;
        // The copy out of this image two plans ago must have left.
        if (cudaEventSynchronize(fi->copied[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            return pg_err_set(PG_EIO, "cuda: FlashInfer prefill: waiting for a plan's copy");
        }
        fi->qo_indptr.assign(host_cu_q, host_cu_q + n_seqs + 1);
        fi->kv_indptr.resize((size_t)n_seqs + 1);
        fi->kv_len.resize((size_t)n_seqs);
        for (int32_t s = 0; s <= n_seqs; s++) fi->kv_indptr[s] = s * bt_stride;
        for (int32_t s = 0; s < n_seqs; s++) {
            fi->kv_len[s] = host_start_pos[s] + (host_cu_q[s + 1] - host_cu_q[s]);
            if (host_cu_q[s + 1] < host_cu_q[s] || host_start_pos[s] < 0 ||
                (int64_t)fi->kv_len[s] > (int64_t)bt_stride * kv.block_size)
                return pg_err_set(PG_EINVAL, "cuda prefill (flashinfer): sequence %d: %d queries after %d keys, %d "
                                  "blocks of %d", s, host_cu_q[s + 1] - host_cu_q[s], host_start_pos[s], bt_stride,
                                  kv.block_size);
        }
        fi->have_plan = false;
        try {
            cudaError_t e = PrefillSM90Plan<int32_t>(
                nullptr, 0, ws, fi->host[i], region, fi->plan, fi->qo_indptr.data(), fi->kv_indptr.data(),
                fi->kv_len.data(), (uint32_t)total, (uint32_t)n_seqs, (uint32_t)n_heads, (uint32_t)kv.n_kv_heads,
                (uint32_t)kv.head_dim, (uint32_t)kv.head_dim, (uint32_t)kv.block_size, /*causal=*/true,
                /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, st);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                return pg_err_set(PG_EIO, "cuda prefill (flashinfer): plan: %s", cudaGetErrorString(e));
            }
        } catch (const std::exception &ex) {
            return pg_err_set(PG_EINVAL, "cuda prefill (flashinfer): plan: %s", ex.what());
        }
        if (cudaEventRecord(fi->copied[i], st) != cudaSuccess) {
            (void)cudaGetLastError();
            return pg_err_set(PG_EIO, "cuda prefill (flashinfer): event");
        }
        fi->key.swap(key);
        fi->plan_dev = ws;
        fi->have_plan = true;
    }

    PagedParams p;
    memset(&p, 0, sizeof p);
    const int64_t hd = kv.head_dim, nkv = kv.n_kv_heads;
    p.q_ptr = (cutlass::bfloat16_t *)q;
    p.k_ptr = (cutlass::bfloat16_t *)k_cache;
    p.v_ptr = (cutlass::bfloat16_t *)v_cache;
    p.o_ptr = (cutlass::bfloat16_t *)out;
    p.lse_ptr = nullptr;
    p.q_stride_n = q_stride; // the fused QKV row's stride
    p.q_stride_h = hd;
    p.o_stride_n = (int64_t)n_heads * hd;
    p.o_stride_h = hd;
    p.k_stride_n = p.v_stride_n = nkv * hd;
    p.k_stride_h = p.v_stride_h = hd;
    p.k_page_stride = p.v_page_stride = (int64_t)kv.block_size * nkv * hd;
    p.nnz_qo = total;
    p.num_qo_heads = n_heads;
    p.num_kv_heads = (int)nkv;
    p.group_size = n_heads / (int)nkv;
    p.page_size = kv.block_size;
    // Our window w: the query at position p sees keys (p - w, p]; FlashInfer
    // keeps keys >= p - window_left. Keys it loads before a window (its
    // tiles are 64-96 keys) come from blocks the table may already have
    // dropped to the null block 0, which is zeroed at allocation and never
    // written, so the masked product reads finite values.
    p.window_left = kv.window > 0 ? kv.window - 1 : -1;
    p.causal = true;
    p.head_dim = (int)hd;
    char *ib = (char *)ws;
    const PrefillPlanSM90Info &pl = fi->plan;
    p.qo_tile_indices = (int32_t *)(ib + pl.qo_tile_indices_offset);
    p.qo_indptr = (int32_t *)(ib + pl.qo_indptr_offset);
    p.kv_indptr = (int32_t *)(ib + pl.kv_indptr_offset);
    p.qo_lens = (int32_t *)(ib + pl.qo_len_offset);
    p.kv_lens = (int32_t *)(ib + pl.kv_len_offset);
    p.head_indices = (int32_t *)(ib + pl.head_indices_offset);
    p.work_indptr = (int32_t *)(ib + pl.work_indptr_offset);
    p.batch_indices = (int32_t *)(ib + pl.batch_indices_offset);
    p.kv_indices = (int32_t *)block_tables;
    p.additional_params.sm_scale = scale;
    p.additional_params.logits_soft_cap = kv.softcap > 0.0f ? kv.softcap : 0.0; // s -> cap * tanh(s / cap)
    p.additional_params.scale_v_scalar = 1.0;
    cudaError_t e;
    try {
        const bool win = kv.window > 0, cap = kv.softcap > 0.0f, same = pl.same_schedule_for_all_heads;
        e = kv.head_dim == 64 ? launch_hd<64>(p, win, cap, same, st) : launch_hd<128>(p, win, cap, same, st);
    } catch (const std::exception &ex) {
        return pg_err_set(PG_EIO, "cuda prefill (flashinfer): %s", ex.what());
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pg_err_set(PG_EIO, "cuda prefill (flashinfer): %s", cudaGetErrorString(e));
    }
    if (!fi->announced) {
        fi->announced = true;
        PG_LOGI("cuda: FlashInfer prefill ran (first launch: %d sequences, %d query rows, head_dim %d, window %d, "
                "soft-cap %g)", n_seqs, total, kv.head_dim, kv.window, (double)kv.softcap);
    }
    return 0;
}

#endif // PG_HAVE_FLASHINFER
