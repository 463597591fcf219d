// kernels/cuda/prefill_flashinfer.cu - FlashInfer's sm90 paged prefill
// (FA3-style: wgmma, TMA for Q, producer/consumer warp specialization) as
// the prefill kernel of the attention op, over our paged KV cache in place
// (issue 29; docs/cuda_kernels.md, "FlashInfer's prefill in the runner"):
// the default on compute 9.x since session 21 (PAGED_CUDA_PREFILL=paged
// selects ours). bf16 caches here; fp8 caches (PAGED_CUDA_FI_FP8=0: ours)
// in prefill_fp8_flashinfer.cu after the same plan.
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
// pg_cuda_fi_prefill_plan_bytes of the attention workspace on the compute
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
extern "C" bool pg_cuda_fi_prefill_available(void) { return false; }
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

#include "kernels/cuda/prefill_flashinfer_int.cuh"

using namespace flashinfer;

namespace {

// additional_params of FlashInfer's bf16 config (no fp8) and its default
// variants: the kernel reads these fields by name.
struct Bf16Extra {
    uint32_t *maybe_prefix_len_ptr;
    uint16_t *maybe_token_pos_in_items_ptr;
    uint16_t *maybe_max_item_len_ptr;
    float *maybe_scale_v;
    double logits_soft_cap;
    double sm_scale;
    double scale_v_scalar;
    int64_t token_pos_in_items_len;
};
using Bf16Params = pg_fi::PagedParams<cutlass::bfloat16_t, cutlass::bfloat16_t, Bf16Extra>;

// One instantiation per head_dim, window (LEFT_SLIDING_WINDOW) and
// variant (StandardAttention, or LogitsSoftCap for Gemma 2's soft-capped
// scores), each with both SAME_SCHEDULE_FOR_ALL_HEADS values (the plan picks).
template <int HD, bool WIN, typename Variant>
cudaError_t launch(Bf16Params &p, bool same_schedule, cudaStream_t st) {
    if (same_schedule)
        return BatchPrefillWithPagedKVCacheDispatched<HD, HD, MaskMode::kCausal, WIN, true, Variant, Bf16Params>(
            p, /*enable_pdl=*/false, st);
    return BatchPrefillWithPagedKVCacheDispatched<HD, HD, MaskMode::kCausal, WIN, false, Variant, Bf16Params>(
        p, /*enable_pdl=*/false, st);
}

template <int HD>
cudaError_t launch_hd(Bf16Params &p, bool window, bool softcap, bool same_schedule, cudaStream_t st) {
    if (window)
        return softcap ? launch<HD, true, LogitsSoftCap>(p, same_schedule, st)
                       : launch<HD, true, StandardAttention>(p, same_schedule, st);
    return softcap ? launch<HD, false, LogitsSoftCap>(p, same_schedule, st)
                   : launch<HD, false, StandardAttention>(p, same_schedule, st);
}

cudaError_t launch_bf16(const pg_fi::Launch &l, cudaStream_t st) {
    Bf16Params p;
    memset(&p, 0, sizeof p);
    pg_fi::fill_common(p, l);
    p.q_stride_n = l.q_stride; // the fused QKV row's stride
    p.additional_params.sm_scale = l.scale;
    p.additional_params.logits_soft_cap = l.softcap > 0.0f ? l.softcap : 0.0; // s -> cap * tanh(s / cap)
    p.additional_params.scale_v_scalar = 1.0;
    const bool win = l.window > 0, cap = l.softcap > 0.0f;
    switch (l.head_dim) {
    case 64: return launch_hd<64>(p, win, cap, l.same_schedule, st);
    case 128: return launch_hd<128>(p, win, cap, l.same_schedule, st);
    default: return launch_hd<256>(p, win, cap, l.same_schedule, st); // Gemma 3 270M-12B
    }
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
    bool fp8;       // fp8 KV through FlashInfer's fp8 kernel (PAGED_CUDA_FI_FP8=0: not)
    bool announced; // the first launch of each kind is logged (tests/gpu/run_gpu_tests.sh looks for it)
    bool announced_fp8;
};

extern "C" bool pg_cuda_fi_prefill_built(void) { return true; }

extern "C" bool pg_cuda_fi_prefill_available(void) {
    int major = 0, dev = 0;
    const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    major == 9;
    (void)cudaGetLastError();
    return ok;
}

extern "C" int pg_cuda_fi_prefill_create(pg_cuda_fi_prefill **out) {
    *out = nullptr;
    if (!pg_cuda_fi_prefill_available())
        return pg_err_set(PG_EUNSUPP, "cuda: FlashInfer's sm90 prefill needs a compute capability 9.x device");
    pg_cuda_fi_prefill *fi = new (std::nothrow) pg_cuda_fi_prefill();
    if (!fi) return pg_err_set(PG_ENOMEM, "cuda: FlashInfer prefill: out of host memory");
    fi->fp8 = pg_cuda_fi_fp8_requested();
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
    const bool f8 = kv.dtype == PG_KV_FP8_E4M3;
    if (!fi || !host_cu_q || !host_start_pos || (kv.dtype != PG_KV_BF16 && !(f8 && fi->fp8)) ||
        !pg_cuda_head_dim_ok(kv.head_dim) || n_heads % kv.n_kv_heads || n_seqs <= 0 ||
        (f8 && !pg_fi::fp8_supports(kv.head_dim, n_heads, kv.softcap)))
        return PG_EUNSUPP;
    const size_t region = pg_cuda_fi_prefill_plan_bytes(n_heads);
    if (!ws || ws_bytes < pg_cuda_fi_prefill_ws_bytes(n_heads)) return PG_EUNSUPP;
    cudaStream_t st = (cudaStream_t)stream;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return PG_EUNSUPP; // the host plan would not be replayed
    }
    const int32_t total = host_cu_q[n_seqs];
    // The plan's work items: one per 128-row (192 at head_dim 64; 128 at 256) query
    // tile of each sequence, per head unless there are more than 4,096 a
    // head (then one schedule for all heads). The region holds 4,096 a
    // head; a step with more (over 500k query rows) runs our kernel.
    {
        const int64_t tile = kv.head_dim == 64 ? 192 : 128;
        int64_t per_head = 0;
        for (int32_t s = 0; s < n_seqs; s++) per_head += (host_cu_q[s + 1] - host_cu_q[s] + tile - 1) / tile;
        if (per_head > (int64_t)PG_CUDA_FI_MAX_WORKS_PER_HEAD * n_heads) return PG_EUNSUPP;
    }

    // The plan: kept while its inputs are the same (every layer of a step),
    // compared in place (no key is built on the per-layer path).
    const int32_t head[6] = {n_seqs, bt_stride, n_heads, kv.n_kv_heads, kv.head_dim, kv.block_size};
    const size_t nk = 6 + 2 * (size_t)n_seqs + 1;
    const bool same = fi->have_plan && fi->plan_dev == ws && fi->key.size() == nk &&
                      !memcmp(fi->key.data(), head, sizeof head) &&
                      !memcmp(fi->key.data() + 6, host_cu_q, sizeof(int32_t) * ((size_t)n_seqs + 1)) &&
                      !memcmp(fi->key.data() + 7 + n_seqs, host_start_pos, sizeof(int32_t) * (size_t)n_seqs);
    if (!same) {
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
        fi->key.assign(head, head + 6);
        fi->key.insert(fi->key.end(), host_cu_q, host_cu_q + n_seqs + 1);
        fi->key.insert(fi->key.end(), host_start_pos, host_start_pos + n_seqs);
        fi->plan_dev = ws;
        fi->have_plan = true;
    }

    const PrefillPlanSM90Info &pl = fi->plan;
    pg_fi::Launch l;
    l.out = out;
    l.q = q;
    l.q_stride = q_stride;
    l.k_cache = k_cache;
    l.v_cache = v_cache;
    l.block_tables = block_tables;
    l.rows = total;
    l.n_heads = n_heads;
    l.n_kv = kv.n_kv_heads;
    l.head_dim = kv.head_dim;
    l.block_size = kv.block_size;
    l.window = kv.window;
    l.softcap = kv.softcap;
    l.scale = scale;
    l.kv_scales = f8 ? kv.scales : nullptr;
    l.q_scales = (float *)((char *)ws + region);
    l.q_amax = l.q_scales + n_heads;
    l.plan = (char *)ws;
    l.qo_tile_indices_off = pl.qo_tile_indices_offset;
    l.qo_indptr_off = pl.qo_indptr_offset;
    l.kv_indptr_off = pl.kv_indptr_offset;
    l.qo_len_off = pl.qo_len_offset;
    l.kv_len_off = pl.kv_len_offset;
    l.head_indices_off = pl.head_indices_offset;
    l.work_indptr_off = pl.work_indptr_offset;
    l.batch_indices_off = pl.batch_indices_offset;
    l.same_schedule = pl.same_schedule_for_all_heads;
    cudaError_t e;
    try {
        e = f8 ? pg_fi::launch_fp8(l, st) : launch_bf16(l, st);
    } catch (const std::exception &ex) {
        return pg_err_set(PG_EIO, "cuda prefill (flashinfer): %s", ex.what());
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pg_err_set(PG_EIO, "cuda prefill (flashinfer): %s", cudaGetErrorString(e));
    }
    bool &said = f8 ? fi->announced_fp8 : fi->announced;
    if (!said) {
        said = true;
        PG_LOGI("cuda: FlashInfer prefill ran (first %s launch: %d sequences, %d query rows, head_dim %d, window %d, "
                "soft-cap %g)", f8 ? "fp8 KV" : "bf16 KV", n_seqs, total, kv.head_dim, kv.window, (double)kv.softcap);
    }
    return 0;
}

#endif // PG_HAVE_FLASHINFER
