// kernels/cuda/backend_cuda_int.cuh - the CUDA backend's state, shared by its
// three files: backend_cuda.cu (the device: memory, copies, events, graphs,
// life cycle), backend_cuda_store.cu (weights, their offload, the KV cache
// and its swaps) and backend_cuda_ops.cu (a step's ops). Private to them.
#pragma once
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

namespace pgcu {

// h's rows already quantized in qscratch by the SiLU * mul before down
// (backend_cuda_ops.cu, fp8_gemm): the next product over h skips its
// quantization. Any other use of the scratch clears it.
struct Fp8Ready {
    const void *h;
    int64_t rows, k;
};

struct CudaCtx {
    int device;
    cudaStream_t stream;      // compute
    cudaStream_t copy_stream; // swaps
    cudaEvent_t ev_compute, ev_copy, ev_done[2];
    // The host tier's copies ahead (cu_kv_swap_ahead): a stream of their
    // own (the copy stream may hold a weight stream-in the step waits for),
    // started after ev_ahead_from on the compute stream; cu_kv_swap_join
    // makes the compute stream wait for ev_ahead.
    cudaStream_t ahead_stream;
    cudaEvent_t ev_ahead_from, ev_ahead;
    bool ahead_pending;
    cudaEvent_t *prof_ev; // [PG_PROF_MARKS] timer_mark's events, each created on first use
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
    // FP8 weights in larger steps (docs/fp8_gemm.md): the activations
    // quantized per token into qscratch and the W8A8 product on the FP8
    // tensor cores (pg_cuda_gemm_fp8), instead of the dequantized weight
    // and the bf16 product. PAGED_CUDA_FP8_GEMM=0 turns it off (the bf16
    // path, for comparison); off for good if cuBLASLt has no algorithm.
    // PAGED_CUDA_FP8_FAST=1: cuBLASLt's fast accumulation.
    // PAGED_CUDA_FP8_CUTLASS=2: the products take the one-pass CUTLASS
    // kernel (gemm_fp8_cutlass.cu: both scales and, for O and down, the
    // residual in its epilogue) in the configuration
    // pg_cuda_gemm_fp8_cutlass_pick gives the shape, or cuBLASLt + rescale
    // where the sweep found that faster (fewer than 256 rows); to become
    // the default since session 19 (docs/fp8_gemm.md). =1: CUTLASS in
    // PAGED_CUDA_FP8_CUTLASS_CFG's configuration (c0 without it) for every
    // shape, to measure one end to end; =0: cuBLASLt + rescale for every
    // shape.
    int fp8_cutlass_cfg;
    // FP8 weights in steps of at most qgemv_rows rows take gemv.cu's FP8
    // GEMV (the bf16 GEMV's ring, PDL and fused RMSNorm / SiLU; W1 3.66
    // against 3.81 ms with qgemv.cu's on an H100, docs/fp8_gemm.md);
    // PAGED_CUDA_FP8_GEMV=0 takes qgemv.cu's, for comparison.
    bool fp8_gemm, fp8_fast, fp8_gemv;
    int fp8_cutlass;
    Fp8Ready fp8_ready;
    // PAGED_CUDA_L2_PREFETCH=1: the prefetch op (the model's hint before
    // RoPE and attention) issues O's weight to the L2 in steps the GEMV
    // runs (l2_prefetch.cu); off by default until measured.
    bool l2_prefetch;
    // PAGED_CUDA_PREFILL=flashinfer: prefill chunks through FlashInfer's
    // sm90 kernel (prefill_flashinfer.cu), its plan's device image at the
    // head of the attention workspace; NULL (the default, or where it
    // cannot run): our pg_cuda_paged_prefill_attention.
    pg_cuda_fi_prefill *fi_prefill;
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
    // LoRA (cu_lora_apply): the rows' slots last staged into lora_ws for
    // lora_m rows (host copy, int8): every projection of a step names the
    // same rows, so the step stages them once (pg_cuda_lora_stage) and the
    // projections find them there. The workspace is LoRA's alone
    // (engine/runner/runner.c), so what it holds stays valid until the
    // next stage.
    const void *lora_ws;
    int64_t lora_m, lora_cap;
    int8_t *lora_staged;
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

inline CudaCtx *ctx_of(pg_backend *b) {
    return (CudaCtx *)b->ctx;
}

inline const void *wdata(const pg_bweight *w) {
    return ((const CudaWeight *)w)->data;
}

// paged's quantized types, which the CUDA backend keeps as stored.
inline bool is_quant(int dtype) {
    return dtype == PG_DTYPE_FP8_E4M3 || pg_dtype_is_int4(dtype);
}

} // namespace pgcu
using namespace pgcu;

// The tables of kernels/backend.h that the other two files define.
extern const pg_backend_store pg_cuda_store_table;
extern const pg_backend_ops pg_cuda_ops_table;
