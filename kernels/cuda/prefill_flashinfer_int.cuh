// kernels/cuda/prefill_flashinfer_int.cuh - what the two FlashInfer prefill
// files share (private to them; the public contract is cuda_ops.h's
// pg_cuda_fi_prefill_*): one launch's inputs, the params struct FlashInfer's
// kernels read by field name, and the fp8 half's entry points.
//
// prefill_flashinfer.cu makes the plan and launches the bf16 kernels;
// prefill_fp8_flashinfer.cu quantizes Q and launches the fp8 kernels. Two
// translation units because FlashInfer compiles its bf16 and fp8 sm90
// kernels apart (their headers are not meant to meet in one file), and
// because two files build in parallel. Included only where
// PG_HAVE_FLASHINFER is defined (FlashInfer's headers found).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <flashinfer/cutlass_utils.cuh>

namespace pg_fi {

// One launch: our cache and tables as FlashInfer's NHD pages, and the
// plan's device arrays (offsets into the image at the workspace's head).
struct Launch {
    void *out;          // [rows][n_heads][head_dim] bf16
    const void *q;      // the prefill rows' Q: bf16 [rows][q_stride] (fp8: quantized in place first)
    int64_t q_stride;   // elements of bf16 between rows (the fused QKV row)
    const void *k_cache, *v_cache;
    const int32_t *block_tables;
    int32_t rows, n_heads, n_kv, head_dim, block_size;
    int32_t window;     // ours: > 0, keys (p - window, p]
    float softcap;      // > 0: Gemma 2's soft-capped scores
    float scale;        // the softmax scale
    const float *kv_scales; // fp8: [2][n_kv] K then V scales (null: 1)
    float *q_scales;    // fp8: [n_heads] floats the Q quantization writes
    float *q_amax;      // fp8: [n_heads] floats, its reduction
    char *plan;         // the plan's device image
    // PrefillPlanSM90Info's offsets and schedule
    int64_t qo_tile_indices_off, qo_indptr_off, kv_indptr_off, qo_len_off, kv_len_off, head_indices_off,
        work_indptr_off, batch_indices_off;
    bool same_schedule;
};

// What FlashInfer's batch_prefill_sm90_customize_config.jinja generates:
// the kernels read these fields by name. Extra is the variant's
// additional_params (bf16 and fp8 differ).
template <typename DQ, typename DKV, typename Extra> struct PagedParams {
    using DTypeQ = DQ;
    using DTypeKV = DKV;
    using DTypeO = cutlass::bfloat16_t;
    using IdType = int32_t;
    using AdditionalParams = Extra;
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

    Extra additional_params;

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

// The fields both kinds share, from a launch. Strides are in elements of
// each tensor's type (bf16 or e4m3): Q's row stride is the caller's
// business (fp8 Q sits in place in the bf16 rows, twice as many elements).
template <typename P> void fill_common(P &p, const Launch &l) {
    const int64_t hd = l.head_dim, nkv = l.n_kv;
    p.q_ptr = (typename P::DTypeQ *)l.q;
    p.k_ptr = (typename P::DTypeKV *)l.k_cache;
    p.v_ptr = (typename P::DTypeKV *)l.v_cache;
    p.o_ptr = (cutlass::bfloat16_t *)l.out;
    p.lse_ptr = nullptr;
    p.q_stride_h = hd;
    p.o_stride_n = (int64_t)l.n_heads * hd;
    p.o_stride_h = hd;
    p.k_stride_n = p.v_stride_n = nkv * hd;
    p.k_stride_h = p.v_stride_h = hd;
    p.k_page_stride = p.v_page_stride = (int64_t)l.block_size * nkv * hd;
    p.nnz_qo = l.rows;
    p.num_qo_heads = l.n_heads;
    p.num_kv_heads = (int)nkv;
    p.group_size = l.n_heads / (int)nkv;
    p.page_size = l.block_size;
    // Our window w: the query at position p sees keys (p - w, p]; FlashInfer
    // keeps keys >= p - window_left. Keys it loads before a window (its
    // tiles are 64-192 keys) come from blocks the table may already have
    // dropped to the null block 0, which is zeroed at allocation and never
    // written, so the masked product reads finite values.
    p.window_left = l.window > 0 ? l.window - 1 : -1;
    p.causal = true;
    p.head_dim = (int)hd;
    p.qo_tile_indices = (int32_t *)(l.plan + l.qo_tile_indices_off);
    p.qo_indptr = (int32_t *)(l.plan + l.qo_indptr_off);
    p.kv_indptr = (int32_t *)(l.plan + l.kv_indptr_off);
    p.qo_lens = (int32_t *)(l.plan + l.qo_len_off);
    p.kv_lens = (int32_t *)(l.plan + l.kv_len_off);
    p.head_indices = (int32_t *)(l.plan + l.head_indices_off);
    p.work_indptr = (int32_t *)(l.plan + l.work_indptr_off);
    p.batch_indices = (int32_t *)(l.plan + l.batch_indices_off);
    p.kv_indices = (int32_t *)l.block_tables;
}

// fp8 KV (prefill_fp8_flashinfer.cu): Q's rows quantized to e4m3 in place,
// one dynamic scale per query head (its largest |q| over the launch's rows
// / 448), written to l.q_scales; then FlashInfer's fp8 kernel (e4m3 Q, K,
// V; P quantized to e4m3 by the kernel; K's and V's per-head scales and
// Q's applied to the scores and the output). Head dims 64 and 128, no
// soft-cap (cudaErrorNotSupported, with nothing launched or written, for
// those and for a Q row wider than 24,576 elements). The caller checked
// the rest.
cudaError_t launch_fp8(const Launch &l, cudaStream_t st);
bool fp8_supports(int32_t head_dim, int32_t n_heads, float softcap);

} // namespace pg_fi
