// kernels/cuda/cuda_ops.h - the CUDA kernels of the backend, as a C ABI.
//
// Every launcher takes device pointers, sizes and a stream (a cudaStream_t
// passed as void *, so C11 code includes this header without CUDA headers;
// NULL is the legacy default stream). A launcher only enqueues work: it
// returns 0, or a negative PG_E* code (common/err.h) after pg_err_set():
//   PG_EINVAL  bad argument (null pointer, negative size, workspace too small)
//   PG_EUNSUPP valid but not built (head_dim other than 64/128, block size
//              not a power of two)
//   PG_EIO     a CUDA or cuBLAS call failed (launch error, sticky device
//              error); the message names the call.
// Launchers never synchronize and never exit(). Errors of a kernel that
// fail asynchronously surface at the caller's next synchronization.
//
// Programmatic Dependent Launch (sm_90+, on unless PAGED_CUDA_PDL=0): the
// GEMV launchers, pg_cuda_rope_kv_write, pg_cuda_add_rmsnorm,
// pg_cuda_rmsnorm_add, pg_cuda_embed and decode v2/v4 (the defaults) may
// start their kernel while the previous kernel on the stream drains; the
// kernel waits for that kernel's completion before it reads or writes any
// buffer (the GEMV only prefetches its weight into L2 first), so stream
// order holds as before for every argument.
// Details: kernels/cuda/cuda_common.cuh, docs/cuda_kernels.md.
//
// Numbers: activations, the KV cache and weights are bf16 (stored as
// uint16_t bit patterns, __nv_bfloat16 on the device); every kernel
// accumulates in fp32 (the sampler's sums in fp64). The KV cache may be
// fp8 e4m3 instead (pg_kv_shape.dtype = PG_KV_FP8_E4M3, 1 byte per element,
// scale 1.0, saturating round-to-nearest-even writes, exact conversion to
// f16/bf16 on reads): pg_cuda_rope_kv_write, decode v2 and v4 (the default
// where it applies) and both prefill versions take it.
//
// Layouts (row-major, innermost last):
//   q            [n_tokens][q_stride]: head h at q + t*q_stride + h*head_dim,
//                so q may be a column range of a fused QKV row
//   attn out     [n_tokens][n_heads][head_dim] contiguous
//   KV cache     one tensor per layer for K and one for V:
//                [n_blocks][block_size][n_kv_heads][head_dim] (pg_kv_shape);
//                token `pos` of a sequence lives in slot
//                block_table[pos / block_size] * block_size + pos % block_size
//   block tables [n_seqs][bt_stride] int32 (rows padded; entries past a
//                sequence's length are never read)
// Query head h reads KV head h / (n_heads / n_kv_heads).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h> // getenv (pg_cuda_fi_prefill_requested)
#include <string.h>

#ifdef __cplusplus
extern "C" { // the project's C headers carry no guards of their own
#endif

#include "common/err.h"
#include "kernels/kernels.h"  // pg_kv_shape
#include "kernels/sampling.h" // pg_sample_params, pg_sample_out

// Element types of pg_cuda_sample's logits and the conversion kernels.
enum { PG_CUDA_F32 = 0, PG_CUDA_BF16 = 1 };

// --- device ---------------------------------------------------------------------

// The number of CUDA devices the runtime sees; 0 without a driver or a
// device (never fails).
int pg_cuda_device_count(void);

// Fills `name` (NUL-terminated, at most `cap` bytes) with the current
// device's name, multiprocessor count, memory and compute capability.
int pg_cuda_device_describe(char *name, size_t cap);

// --- attention --------------------------------------------------------------------
//
// Every launcher below also reads two fields of `kv` (pg_kv_shape): a
// sliding window (kv.window > 0: the query at position p attends only to
// the keys (p - window, p]; keys before that are never read, so their
// blocks may have been given back, docs/kv_layer_groups.md) and Gemma 2's
// soft-capping (kv.softcap > 0: each score s, after the scale, becomes
// softcap * tanh(s / softcap)). Both 0: plain causal attention.

// Paged decode attention: one query token per sequence (the last of its
// context). out[s][n_heads][head_dim] from q row s; sequence s attends to
// its seq_lens[s] (>= 1) keys, causally complete. FlashAttention-2 style
// on tensor cores (mma.sync m16n8k16, fp32 accumulate, online softmax):
// one CTA reads each KV tile once for all query heads of a GQA group, with
// 16-byte cp.async loads; long contexts and small batches are split over
// CTAs (flash decoding) and the last CTA of each (sequence, KV head) to
// finish combines the splits through `workspace` (one launch; per-device
// arrival counters, so split launches on one device must not overlap in
// time: one stream per device, as the runner has).
// head_dim 64 or 128; block_size a power of two >= 8; any GQA ratio.
// `max_seq_len` (host) bounds seq_lens and fixes the split plan; the plan
// needs pg_cuda_decode_workspace_size(n_seqs, ...) bytes of workspace (0
// when no split is chosen). A smaller workspace makes fewer splits (never
// an error), so a workspace sized for the largest batch serves any batch.
// Kernel: v4 (below) where it applies (GQA group <= 8, compute capability
// >= 8.9), both KV dtypes; v2 otherwise.
int pg_cuda_paged_decode_attention(void *out, const void *q, int64_t q_stride,
                                   const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                   const int32_t *block_tables, int32_t bt_stride,
                                   const int32_t *seq_lens, int32_t n_seqs, int32_t n_heads,
                                   float scale, int32_t max_seq_len, void *workspace,
                                   size_t workspace_bytes, void *stream);

// Bytes of workspace the decode plan wants for any batch of up to
// `max_seqs` sequences of up to `max_seq_len` tokens on the current device.
size_t pg_cuda_decode_workspace_size(int32_t max_seqs, int32_t n_heads, int32_t n_kv_heads,
                                     int32_t head_dim, int32_t max_seq_len);
// The split plan's units: keys per KV tile (a split is whole tiles) and the
// most splits of one (sequence, KV head).
#define PG_CUDA_DECODE_TILE_KEYS 64
#define PG_CUDA_DECODE_MAX_SPLITS 256
// Workspace of a split plan with `n_items` (sequence, head, split) partials:
// head_dim output floats and one softmax sum each, plus 256 bytes to align
// the start. Inline and free of CUDA so the memory planner
// (engine/memplan.c) bounds pg_cuda_decode_workspace_size without a GPU.
static inline size_t pg_cuda_decode_split_ws_bytes(int64_t n_items, int32_t head_dim) {
    return (size_t)n_items * (size_t)(head_dim + 1) * sizeof(float) + 256;
}

// The same contract through numbered versions, for tests and benchmarks:
// 2 = the tensor-core split-K kernel above with the GQA group as 16 mma rows
// (the default where 4 does not apply); 4 = keys on the mma's M side and the
// group's heads on N (fp8 fragments straight from the e4m3 tile), same
// splits and workspace as 2; PG_EUNSUPP for a GQA group > 8 or compute
// capability < 8.9. Versions 1 (CUDA cores, the baseline) and 3 (persistent,
// measured slower) are not in the library: PG_EUNSUPP here; they live in
// bench/cuda/ for the benchmark and the kernel test (docs/cuda_kernels.md).
int pg_cuda_paged_decode_attention_v(int version, void *out, const void *q, int64_t q_stride,
                                     const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                     const int32_t *block_tables, int32_t bt_stride,
                                     const int32_t *seq_lens, int32_t n_seqs, int32_t n_heads,
                                     float scale, int32_t max_seq_len, void *workspace,
                                     size_t workspace_bytes, void *stream);

// Paged prefill attention for chunked prefill, variable length, causal,
// one launch: sequence s owns query rows [cu_q[s], cu_q[s+1]) at positions
// start_pos[s] + i and attends to keys [0, start_pos[s] + i] through its
// block table (earlier chunks and this chunk, already written to the cache
// by pg_cuda_rope_kv_write). cu_q and start_pos are device arrays of
// n_seqs + 1 and n_seqs; `max_q_len` (host) bounds cu_q[s+1] - cu_q[s].
// Rows (query, head of the GQA group) are packed 64 to a CTA; tensor cores
// (mma.sync m16n8k16 bf16), fp32 accumulate. A decode sequence (one query)
// is a valid member of the batch. head_dim 64 or 128.
int pg_cuda_paged_prefill_attention(void *out, const void *q, int64_t q_stride,
                                    const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                    const int32_t *block_tables, int32_t bt_stride,
                                    const int32_t *cu_q, const int32_t *start_pos, int32_t n_seqs,
                                    int32_t n_heads, float scale, int32_t max_q_len, void *stream);

// The same through numbered versions (tests, benchmarks): 1 = 64 rows per
// CTA, one 16-row m-tile per warp, q fragments in registers; 2 = 128 rows
// per CTA, two m-tiles per warp sharing each K/V fragment, q in shared memory.
int pg_cuda_paged_prefill_attention_v(int version, void *out, const void *q, int64_t q_stride,
                                      const void *k_cache, const void *v_cache, pg_kv_shape kv,
                                      const int32_t *block_tables, int32_t bt_stride,
                                      const int32_t *cu_q, const int32_t *start_pos, int32_t n_seqs,
                                      int32_t n_heads, float scale, int32_t max_q_len, void *stream);

// FlashInfer's sm90 paged prefill (prefill_flashinfer.cu; FA3-style) as the
// prefill half of the attention op: the default where it runs (a build with
// FlashInfer's headers, a compute 9.x device), PAGED_CUDA_PREFILL=paged
// selects ours (pg_cuda_fi_prefill_requested; docs/cuda_kernels.md). The
// same contract as pg_cuda_paged_prefill_attention over the same cache, but
// its plan is made on the host: host_cu_q [n_seqs + 1] and host_start_pos
// [n_seqs] are host copies of the device arrays (block_tables stays device).
// ws: the first pg_cuda_fi_prefill_ws_bytes(n_heads) bytes hold the plan's
// device image (stream-ordered, kept for every call of one step). kv.window
// and kv.softcap as pg_cuda_paged_prefill_attention takes them. PG_EUNSUPP,
// with nothing launched, for what this build does not run (no FlashInfer
// headers, fp8 KV with PAGED_CUDA_FI_FP8=0 or with a soft-cap, head_dim
// other than 64, 128 or 256, stream capture, no host arrays or workspace): the
// caller runs pg_cuda_paged_prefill_attention instead. fp8 KV: q's prefill
// rows are overwritten (their e4m3 codes, in place; the layer reads q no
// more after attention).
#define PG_CUDA_FI_MAX_WORKS_PER_HEAD 4096
typedef struct pg_cuda_fi_prefill pg_cuda_fi_prefill;
bool pg_cuda_fi_prefill_built(void);
// Built with the headers and the current device is compute 9.x: the one
// test of "FlashInfer can run here" (create, and the workspace it adds).
bool pg_cuda_fi_prefill_available(void);
// PG_EUNSUPP where pg_cuda_fi_prefill_available() is false.
int pg_cuda_fi_prefill_create(pg_cuda_fi_prefill **out);
void pg_cuda_fi_prefill_destroy(pg_cuda_fi_prefill *fi);
int pg_cuda_fi_prefill_run(pg_cuda_fi_prefill *fi, void *out, const void *q, int64_t q_stride,
                           const void *k_cache, const void *v_cache, pg_kv_shape kv,
                           const int32_t *block_tables, int32_t bt_stride, const int32_t *host_cu_q,
                           const int32_t *host_start_pos, int32_t n_seqs, int32_t n_heads, float scale,
                           void *ws, size_t ws_bytes, void *stream);
// The plan's device image: seven int32 arrays of up to 4,096 work items a
// query head, the per-SM index (at most 1,024 SMs) and FlashInfer's 16-byte
// alignments, rounded to 256.
static inline size_t pg_cuda_fi_prefill_plan_bytes(int32_t n_heads) {
    if (n_heads <= 0) return 0;
    const size_t b = (size_t)7 * 4 * PG_CUDA_FI_MAX_WORKS_PER_HEAD * (size_t)n_heads + 4 * 1025 + 8 * 16;
    return (b + 255) / 256 * 256;
}
// The workspace head FlashInfer's prefill takes: the plan image, then (fp8
// KV) Q's per-head scales and their reduction, 2 x n_heads floats rounded
// to 256. Inline and free of CUDA, so the memory planner sizes it without
// a GPU (3.7 MB at 32 heads).
static inline size_t pg_cuda_fi_prefill_ws_bytes(int32_t n_heads) {
    if (n_heads <= 0) return 0;
    return pg_cuda_fi_prefill_plan_bytes(n_heads) + ((size_t)8 * (size_t)n_heads + 255) / 256 * 256;
}
// fp8 e4m3 KV caches' prefill through FlashInfer's fp8 kernel too (Q
// quantized to e4m3 in place, a dynamic scale per head;
// prefill_fp8_flashinfer.cu): the default since session 21;
// PAGED_CUDA_FI_FP8=0 keeps paged's kernel for them.
static inline bool pg_cuda_fi_fp8_requested(void) {
    const char *e = getenv("PAGED_CUDA_FI_FP8");
    return !e || !e[0] || atoi(e) != 0;
}
// PAGED_CUDA_PREFILL, read in one place: unset or empty (DEFAULT) and
// "flashinfer" (NAMED_FLASHINFER) ask for FlashInfer's kernel (the default
// since session 21), "paged" for ours; the backend warns of any other value
// (OTHER) and keeps the default. Free of CUDA (the planner's estimate
// without a GPU counts the plan image when asked).
typedef enum {
    PG_CUDA_PREFILL_DEFAULT,
    PG_CUDA_PREFILL_NAMED_FLASHINFER,
    PG_CUDA_PREFILL_PAGED,
    PG_CUDA_PREFILL_OTHER,
} pg_cuda_prefill_choice;
static inline pg_cuda_prefill_choice pg_cuda_prefill_env(void) {
    const char *e = getenv("PAGED_CUDA_PREFILL");
    if (!e || !e[0]) return PG_CUDA_PREFILL_DEFAULT;
    if (!strcmp(e, "flashinfer")) return PG_CUDA_PREFILL_NAMED_FLASHINFER;
    return strcmp(e, "paged") ? PG_CUDA_PREFILL_OTHER : PG_CUDA_PREFILL_PAGED;
}
static inline bool pg_cuda_fi_prefill_requested(void) { return pg_cuda_prefill_env() != PG_CUDA_PREFILL_PAGED; }

// The head dims the CUDA attention kernels are built for: 64, 128 and 256
// (Gemma 3 270M-12B; checked on an H100 in session 23: docs/gemma3.md).
// One predicate for every kernel's argument check (attention.cu,
// prefill_flashinfer.cu, prefill_fp8_flashinfer.cu) and one refusal for the
// backend's KV cache and `paged plan` (engine/memplan.c), which ask the
// same question before loading. Free of CUDA.
static inline bool pg_cuda_head_dim_ok(int32_t head_dim) {
    return head_dim == 64 || head_dim == 128 || head_dim == 256;
}
static inline int pg_cuda_head_dim_check(int32_t head_dim) {
    if (!pg_cuda_head_dim_ok(head_dim))
        return pg_err_set(PG_EUNSUPP, "cuda: head_dim %d (the CUDA attention kernels are built for 64, 128 and 256)",
                          head_dim);
    return 0;
}

// --- element-wise -------------------------------------------------------------------

// RoPE (rotate-half, as Hugging Face Llama) fused with the KV-cache write.
// For token i < m at position pos[i]: every head of q (row i at q + i*q_stride,
// n_heads x head_dim) and of k (row at k + i*k_stride, n_kv x head_dim) is
// rotated in place with angles pos[i] * inv_freq[j] (fp32, inv_freq device
// [head_dim/2]); then rotated k and v (row at v + i*v_stride) are written to
// slot slots[i] of the caches. slots[i] < 0 skips the write (padding).
// kv.dtype PG_KV_FP8_E4M3: the caches take e4m3 (k from the fp32 rotation,
// v from bf16; saturating at +-448) of x / s with s the KV head's scale in
// kv.scales (device [2][n_kv], K's then V's; null: 1); q and k in place
// stay bf16. The attention launchers apply the same kv.scales.
int pg_cuda_rope_kv_write(void *q, int64_t q_stride, void *k, int64_t k_stride, const void *v,
                          int64_t v_stride, const int32_t *pos, const int32_t *slots, int32_t m,
                          int32_t n_heads, const float *inv_freq, void *k_cache, void *v_cache,
                          pg_kv_shape kv, void *stream);

// Fused residual add + RMSNorm over rows of `dim`:
//   if residual: x[i] = bf16(x[i] + residual[i])  (x is the residual stream)
//   out[i] = bf16(x[i] * rsqrt(mean(x[i]^2) + eps) * w)
// w is bf16 [dim]. out may equal x (then x keeps the normalized value).
int pg_cuda_add_rmsnorm(void *out, void *x, const void *residual, const void *w, int64_t m,
                        int64_t dim, float eps, void *stream);

// Bias add in place (Qwen2's QKV bias, after the projection):
// out[i][j] = bf16(out[i][j] + bias[j]) for i < m, j < n; out [m][ldo] bf16
// (columns past n untouched), bias bf16 [n] (fp32 add, one rounding).
// ldo >= n; m == 0 does nothing. A plain launch.
int pg_cuda_add_bias(void *out, int64_t ldo, const void *bias, int64_t m, int64_t n, void *stream);

// Per-head RMSNorm in place (Qwen3's q_norm/k_norm): for row i < m and head
// h < n_heads, the head_dim values v at x + i*stride + h*head_dim become
// bf16(v * rsqrt(mean(v^2) + eps) * w[d]), w bf16 [head_dim] (shared by
// every head); fp32 sums. head_dim <= 256, even; stride >= n_heads *
// head_dim (x may be the q or k columns of a fused QKV row; the rest of the
// row is untouched). Apply it before pg_cuda_rope_kv_write, as Qwen3 norms q
// and k before RoPE. m == 0 does nothing. A plain launch.
int pg_cuda_head_rmsnorm(void *x, int64_t stride, int32_t n_heads, int32_t head_dim, const void *w,
                         float eps, int64_t m, void *stream);

// out[m][ffn] = silu(gate_up[m][0:ffn]) * gate_up[m][ffn:2ffn] (a fused
// [gate|up] row, as the fused gate/up GEMM writes it).
int pg_cuda_silu_mul(void *out, const void *gate_up, int64_t m, int64_t ffn, void *stream);

// --- Gemma's ops (gemma_ops.cu; docs/gemma3.md) -------------------------------------------
//
// bf16 rows on the device, f32 arithmetic, one bf16 rounding of each result
// unless said otherwise (the CPU versions: kernels/cpu/gemma_ops.c). Every
// launcher checks its pointers (PG_EINVAL, nothing written), takes any
// alignment (a 16-byte path where rows allow it, else a scalar one with the
// same arithmetic) and does nothing for m == 0. The transcendental ones use
// the device's tanhf, which may differ from the host's in the last f32 bit.

// The embedding scale, in place: x[i][j] = bf16(x[i][j] * bf16(s)) for
// i < m, j < n; rows ld >= n elements apart, columns past n untouched. s is
// rounded to bf16 first, as transformers multiplies Gemma's embeddings by
// embed_scale.to(weight.dtype) (sqrt(640) = 25.3 becomes 25.25). n > 0,
// m >= 0. A plain launch.
int pg_cuda_scale(void *x, int64_t ld, int64_t m, int64_t n, float s, void *stream);

// Gemma's post-norms: for each row i < m, with x and y contiguous [m][dim],
//   n = bf16(y[i] * rsqrt(mean(y[i]^2) + eps) * w)   (w bf16 [dim], already 1 + w)
//   x[i] = bf16(x[i] + n)                             (f32 add of the bf16 n)
// n equals pg_cuda_add_rmsnorm(n, y, NULL, w, m, dim, eps) bit for bit (the
// same f32 sum of squares in the same order, 1 / sqrtf). y is not written
// and may not alias x (y == x is PG_EINVAL). dim <= 2^20. Launched with PDL
// as pg_cuda_add_rmsnorm.
int pg_cuda_rmsnorm_add(void *x, const void *y, const void *w, int64_t m, int64_t dim, float eps,
                        void *stream);

// GeGLU: out[m][ffn] = bf16(gelu_tanh(g) * u), [g | u] = the row of
// gate_up [m][2 ffn] (pg_cuda_silu_mul's layout and roundings), with
// PyTorch's gelu(approximate="tanh") in f32 as pg_cpu_gelu_tanh writes it:
// 0.5 x (1 + tanhf(beta (x + 0.044715 x x x))), beta = (float)(sqrt(2/pi)),
// every product and sum rounded (no fma). A plain launch.
int pg_cuda_gelu_mul(void *out, const void *gate_up, int64_t m, int64_t ffn, void *stream);

// The logit soft-cap (Gemma 2), in place: x[i][j] = bf16(cap * tanhf(x[i][j]
// * (1 / cap))) for i < m, j < n, 1 / cap in f32 (pg_cpu_softcap); rows ld
// >= n apart, columns past n untouched. cap > 0 (else PG_EINVAL, NaN
// included). A plain launch.
int pg_cuda_softcap(void *x, int64_t ld, int64_t m, int64_t n, float cap, void *stream);

// --- Mixture-of-experts feed-forward (moe.cu; docs/moe.md) ---------------------------------
//
// For every row i < m of x (bf16 [m][hidden], contiguous), xn = norm ?
// bf16(RMSNorm(x[i]) * norm) : x[i]; p = softmax(xn . router^T) over the
// n_experts experts in f32; S = the top_k experts by p, ties to the lower
// id; w_e = p_e / sum_S p when renorm, else p_e; then
//   out[i] = bf16([x[i] +] sum_{e in S, ascending e} w_e * y_e),
//   y_e = bf16(down[e] . h),  h = bf16(silu(g) * u),  [g | u] = xn . gate_up[e]^T,
// products in f32. Weights are bf16, row-major as linear's: router
// [n_experts][hidden], gate_up[e] [2 ffn][hidden] (gate rows, then up),
// down[e] [hidden][ffn]. gate_up and down are HOST arrays [n_experts] of
// device pointers; both NULL marks an expert another rank holds (expert
// parallelism: it still competes in routing, its terms are left out).
// accumulate adds the residual x (out = x + sum); out may be x. Graph-safe:
// no host synchronisation, launch shapes depend on m only. Limits:
// n_experts <= PG_CUDA_MOE_MAX_EXPERTS, top_k <= 16 and <= n_experts,
// hidden and ffn multiples of 8; else PG_EINVAL. ws: at least
// pg_cuda_moe_workspace_size(m, ...) bytes, 256-byte aligned.
#define PG_CUDA_MOE_MAX_EXPERTS 512
int pg_cuda_moe_ffn(void *out, const void *x, int64_t m, int64_t hidden, int64_t ffn, const void *norm,
                    float eps, const void *router, const void *const *gate_up, const void *const *down,
                    int32_t n_experts, int32_t top_k, int renorm, int accumulate, void *ws, size_t ws_bytes,
                    void *stream);
// The same with FP8 experts (weight-only, W8A16): gate_up[e] and down[e]
// are e4m3 bytes [rows][cols], row-major, each row's values times its f32
// scale in gate_up_scales[e][row] / down_scales[e][row] (the CUDA backend's
// FP8 weight layout); the router stays bf16. The e4m3 values convert to
// bf16 exactly, the products accumulate in f32 and each output column is
// multiplied by its row's scale before the rounding, so the result is the
// bf16 contract's over the dequantized weights. Same limits and workspace.
int pg_cuda_moe_ffn_fp8(void *out, const void *x, int64_t m, int64_t hidden, int64_t ffn, const void *norm,
                        float eps, const void *router, const void *const *gate_up,
                        const float *const *gate_up_scales, const void *const *down,
                        const float *const *down_scales, int32_t n_experts, int32_t top_k, int renorm,
                        int accumulate, void *ws, size_t ws_bytes, void *stream);
size_t pg_cuda_moe_workspace_size(int64_t max_rows, int64_t hidden, int64_t ffn, int32_t n_experts,
                                  int32_t top_k);
// Tests: the routing of the last pg_cuda_moe_ffn over ws for m rows of
// that shape, copied to the host after a sync of the stream: sel [m][top_k]
// the chosen experts best first, w [m][top_k] their weights (after renorm).
int pg_cuda_moe_routing(int32_t *sel, float *w, const void *ws, int64_t m, int64_t hidden, int64_t ffn,
                        int32_t n_experts, int32_t top_k, void *stream);

// --- LoRA (lora.cu; docs/lora.md) -----------------------------------------------------------
//
// Batched multi-adapter LoRA, in Punica's BGMV shape (one CTA per row) or,
// with PAGED_CUDA_LORA_SGMV=1, grouped by adapter (SGMV's idea; slower as
// written: lora.cu, docs/lora.md): for every row i < m with
// s = row_slot[i] >= 0 and slots[s].a non-NULL,
//   t = x[i] . a_s^T                      (f32, rank values, rounded to f32)
//   out[i][j] = bf16(out[i][j] + scale_s * sum_r t[r] * b_s[j][r])   j < out_cols
// in f32. Rows with slot -1 or an `a` NULL are not written (bit for bit),
// nor are columns past out_cols (out is a view: ldo >= out_cols, e.g. the K
// slice of a fused Q|K|V row; x likewise ldx >= in). out and x must not
// overlap. a_s bf16 [rank][in], b_s bf16 [out_cols][rank], row-major. A
// row's values depend only on that row and its adapter, in a fixed order:
// the same bits in any batch.
//
// Staging: the rows' slots are copied into ws and sorted there by slot
// into tiles of up to PG_CUDA_LORA_TILE_ROWS rows of one adapter (which
// the grouped shape's CTAs take, sharing each load of the adapter's
// matrices between a tile's rows). pg_cuda_lora_stage does it
// for a row_slot array; in the grouped shape pg_cuda_lora_apply with
// staged = 1 trusts that ws holds the staging of the same row_slot (every
// projection of a step has the same rows: the CUDA backend stages once a
// step), with staged = 0 it stages itself.
//
// row_slot and slots are HOST arrays, read before the call returns: the
// slots' pointers, ranks and scales travel as a kernel parameter (at most
// PG_CUDA_LORA_MAX_SLOTS slots), the rows' slots are staged by copy kernels
// whose parameters carry them (no host buffer outlives the call, no
// synchronisation). Because those values are baked into the launches,
// neither call is graph-safe: under stream capture both return PG_EUNSUPP
// without enqueueing anything (graph steps take pg_cuda_lora_apply_dev,
// below; the runner runs the others eagerly).
// Limits: rank <= PG_CUDA_LORA_MAX_RANK (else PG_EUNSUPP), dtype
// PG_DTYPE_BF16 for every slot a row names (else PG_EUNSUPP: the CUDA
// backend's weight_upload turns f32/f16 adapters into bf16; FP8/int4
// adapters are not run), row_slot[i] in [-1, n_slots) (else PG_EINVAL).
// Slots no row names are not looked at. Nothing to do (m == 0, every row
// -1 or `a` NULL) returns 0 with no launch and needs no workspace.
// ws: at least pg_cuda_lora_workspace_size(m, in, max rank named) bytes,
// 4-byte aligned.
#define PG_CUDA_LORA_MAX_SLOTS 64
#define PG_CUDA_LORA_MAX_RANK 64
#define PG_CUDA_LORA_TILE_ROWS 32 // rows of one adapter sharing each weight load
#define PG_CUDA_LORA_KSPLIT 2048  // the shrink's k per CTA; the expand sums the parts
#define PG_CUDA_LORA_MAX_PROJ 3   // projections of one pg_cuda_lora_apply_dev (below)
typedef struct pg_cuda_lora_slot {
    const void *a, *b; // device; a NULL: the adapter leaves this projection alone
    int32_t rank;      // a's rows = b's columns
    int32_t dtype;     // PG_DTYPE_* of a and b (both), PG_DTYPE_BF16 to run
    float scale;
} pg_cuda_lora_slot;
int pg_cuda_lora_stage(const int32_t *row_slot, int64_t m, int32_t n_slots, void *ws, size_t ws_bytes,
                       void *stream);
int pg_cuda_lora_apply(void *out, int64_t ldo, const void *x, int64_t ldx, int64_t m, int64_t in,
                       int64_t out_cols, const int32_t *row_slot, const pg_cuda_lora_slot *slots,
                       int32_t n_slots, void *ws, size_t ws_bytes, int staged, void *stream);
// PAGED_CUDA_LORA_SGMV=1: the grouped shape (read at each call). Only the
// grouped shape uses what pg_cuda_lora_stage wrote; BGMV stages its rows in
// every call (-1 where the slot has no `a` for the projection) and ignores
// `staged`.
static inline bool pg_cuda_lora_grouped(void) {
    const char *e = getenv("PAGED_CUDA_LORA_SGMV");
    return e && atoi(e) != 0;
}
// Long runs of one adapter through cuBLASLt (lora_runs.cu; docs/lora.md
// "Runs of one adapter through cuBLASLt"; the backend's eager lora_apply
// takes it with min_run 16, PAGED_CUDA_LORA_GEMM_RUNS=N): every run of at least min_run consecutive
// rows naming one slot whose a and b are bf16, rank a multiple of 8 (and
// in, out_cols, the strides multiples of 8, the pointers 16-byte aligned)
// gets t = bf16(x . a^T), t = bf16(scale * t), out = bf16(out + t . b^T)
// by two pg_cuda_gemm_bf16 calls on g; the other rows go to
// pg_cuda_lora_apply (staged = 0) with the run rows set to -1. Run rows
// differ from BGMV's by t's two bf16 roundings (BGMV keeps t in f32).
// Eager only (PG_EUNSUPP under stream capture). ws: as pg_cuda_lora_apply's,
// and room for a run's t [len][rank] bf16 after the staging region (a
// run that does not fit goes to pg_cuda_lora_apply).
struct pg_cuda_gemm; // the GEMM section, below
int pg_cuda_lora_apply_runs(struct pg_cuda_gemm *g, void *gemm_ws, size_t gemm_ws_bytes, int64_t min_run, void *out,
                            int64_t ldo, const void *x, int64_t ldx, int64_t m, int64_t in, int64_t out_cols,
                            const int32_t *row_slot, const pg_cuda_lora_slot *slots, int32_t n_slots, void *ws,
                            size_t ws_bytes, void *stream);
// Layout: the rows' slots (int8), the sorted rows (int32), the tiles (8
// bytes each, at most one per TILE_ROWS rows plus one per slot), each
// rounded up to 256 bytes, then the shrink's f32 parts [k splits][m][rank].
// Inline and free of CUDA so the memory planner (engine/memplan.c) sizes it
// without a GPU, as pg_cuda_sample_workspace_size.
static inline size_t pg_cuda_lora_stage_size(int64_t max_rows) {
    if (max_rows <= 0) return 0;
    const size_t m = (size_t)max_rows;
    const size_t tiles = (m + PG_CUDA_LORA_TILE_ROWS - 1) / PG_CUDA_LORA_TILE_ROWS + PG_CUDA_LORA_MAX_SLOTS;
    return (m + 255) / 256 * 256 + (4 * m + 255) / 256 * 256 + (8 * tiles + 255) / 256 * 256;
}
// pg_cuda_lora_apply_dev's (below): its shrink's parts, [chunks of
// PG_CUDA_LORA_DEV_KCHUNK columns][rows][projections][max rank] floats,
// then a float per row (the inverse RMS).
#define PG_CUDA_LORA_DEV_KCHUNK 1024
static inline size_t pg_cuda_lora_dev_workspace_size(int64_t rows, int64_t in, int32_t n_proj, int32_t max_rank) {
    if (rows <= 0 || in <= 0) return 0;
    const size_t chunks = ((size_t)in + PG_CUDA_LORA_DEV_KCHUNK - 1) / PG_CUDA_LORA_DEV_KCHUNK;
    return (chunks * (size_t)rows * (size_t)n_proj * (size_t)max_rank + (size_t)rows) * sizeof(float);
}
// Enough for both ops over rows of up to max_in columns: the stage, then
// the larger of the grouped shrink's parts and the graph-safe op's for
// PG_CUDA_LORA_MAX_PROJ projections (the latter, always).
static inline size_t pg_cuda_lora_workspace_size(int64_t max_rows, int64_t max_in, int32_t max_rank) {
    if (max_rows <= 0 || max_rank <= 0 || max_in <= 0) return 0;
    return pg_cuda_lora_stage_size(max_rows) +
           pg_cuda_lora_dev_workspace_size(max_rows, max_in, PG_CUDA_LORA_MAX_PROJ, max_rank);
}

// Graph-safe LoRA (lora_graph.cu; docs/lora.md "Graph-safe LoRA"): the
// batched product above with every value a launch would bake in kept in
// device memory instead, so that a captured graph serves any mix of
// adapters and any adapter loaded later:
//   - row_slot_dev: DEVICE int32 [m], each row's slot (-1: none; a
//     graph bucket's pad rows are -1); the runner uploads it with the
//     step's other inputs;
//   - tables[p]: DEVICE arrays of n_slots (1 to PG_CUDA_LORA_MAX_SLOTS)
//     pg_cuda_lora_dev_slot, one per projection p < n_proj
//     (engine/model/lora.c writes them with pg_cuda_lora_table_write
//     whenever a slot changes); a slot's entry with a NULL `a` leaves that
//     projection alone; the host array of the n_proj pointers travels by
//     value.
// Up to PG_CUDA_LORA_MAX_PROJ projections that read the same x and write
// adjacent column ranges of out run in one shrink and one expand launch:
// projection p owns out's columns [c0_p, c0_p + cols[p]) with c0_0 = 0
// (Q|K|V: q_dim, kv_dim, kv_dim; gate|up: ffn, ffn). For each row i with
// s = row_slot_dev[i] >= 0 and tables[p][s].a non-NULL:
//   xn = x[i] * norm_w * rsqrt(mean(x[i]^2) + eps)   (norm_w bf16 [in]; NULL: xn = x[i])
//   t = xn . a^T (f32), out[i][c0_p + j] = bf16(out + scale * t . b[j]),
// in f32 (the norm is the RMSNorm a fused base product applied to x, so
// the caller need not write the normed rows out: the shrink reads x and
// w, and one of its CTAs per row takes the sum of squares). The shrink
// runs in chunks of PG_CUDA_LORA_DEV_KCHUNK columns, one CTA each, whose
// parts the expand sums in order. Sums in a fixed order: a row's values
// depend only on it and its adapter; they differ from pg_cuda_lora_apply's
// by the order of the shrink's f32 sums. max_rank: the
// largest rank any slot may hold (--max-lora-rank; the kernels' t stride
// and grid do not depend on which adapters the rows name); an entry of a
// larger rank is cut to max_rank (the loader refuses such adapters).
// Nothing here reads host memory after the call or synchronises: safe
// under stream capture. Launched with PDL, the shrink reads x (and the
// rows, tables, adapters and norm) before it waits for the kernel queued
// right before it: that kernel must not write x (the base product before
// it writes out, never x; lora_graph.cu). ws: at least pg_cuda_lora_dev_workspace_size(m,
// in, n_proj, max_rank) bytes (pg_cuda_lora_workspace_size(m, in,
// max_rank) is enough), 4-byte aligned.
typedef struct pg_cuda_lora_dev_slot {
    const void *a, *b; // device bf16; a NULL: this projection is left alone
    int32_t rank;
    float scale;
} pg_cuda_lora_dev_slot;
int pg_cuda_lora_apply_dev(void *out, int64_t ldo, const void *x, int64_t ldx, int64_t m, int64_t in,
                           const void *norm_w, float eps, const int64_t *cols, int32_t n_proj,
                           const int32_t *row_slot_dev, const pg_cuda_lora_dev_slot *const *tables, int32_t n_slots,
                           int32_t max_rank, void *ws, size_t ws_bytes, void *stream);
// Calls of at least this many rows take the tiled shape (lora_tiles.cu;
// docs/lora.md "Tiles of one adapter on the tensor cores"): the rows
// grouped by slot into tiles of 16 on the device, each tile's shrink on the
// tensor cores (mma.sync, bf16 in, f32 sums; with a norm, x * w split into
// bf16 hi + lo) and its expand reading each row of B once for the tile.
// The same contract, workspace and values within the same bound (sums in
// another order: a row's bits depend on the shape, not on the batch).
// PAGED_CUDA_LORA_TILES=N sets it at the first call (48 by default; 0:
// never); set >= 0 changes it, < 0 only reads it. Returns the value before.
int64_t pg_cuda_lora_dev_tile_rows(int64_t set);
// Calls of at most this many rows take the fused shape instead, checked
// before the tiles (lora_fused.cu; docs/lora.md "One launch a group for
// small steps"): one kernel, no workspace read or written, each CTA of the
// expand computing the t values of its row itself (all of x against its
// projections' whole A, before its PDL wait), then, after the wait, adding
// t . b to out. The same contract (the workspace is still checked) and
// values within the same bound; sums in another fixed order (a row's bits
// depend on the shape, not on the batch). PAGED_CUDA_LORA_FUSED=N sets it
// at the first call, 0 (never) by default; set >= 0 changes it, < 0 only
// reads it. Returns the value before.
int64_t pg_cuda_lora_dev_fused_rows(int64_t set);
// Writes n host entries to the device table dst, after the work queued on
// `stream` so far (steps that read the old entries) has finished: a
// synchronous copy, for adapter loads and evictions, never under capture.
int pg_cuda_lora_table_write(pg_cuda_lora_dev_slot *dst, const pg_cuda_lora_dev_slot *src, int64_t n,
                             void *stream);

// Row gather: out[i][0:dim] = table[ids[i]][0:dim] for i < m; an id outside
// [0, n_rows) gives a zero row. Embedding lookup, and the gather of the
// last hidden state of each sampled sequence before the LM head.
// Tensor-parallel greedy sampling (argmax.cu; kernels/backend.h argmax_rows
// and argmax_pick): out[i] = (max, column) of row i of x ([rows][ld],
// f32 or bf16; ties to the lower column); and the winner across ranks of
// cand [n_ranks][n] (ties to the lower rank), as pg_sample_out tokens.
struct pg_argmax;
struct pg_sample_out;
int pg_cuda_argmax_rows(struct pg_argmax *out, const void *x, int dtype, int64_t rows, int64_t cols, int64_t ld,
                        void *stream);
int pg_cuda_argmax_pick(struct pg_sample_out *out, const struct pg_argmax *cand, int32_t n_ranks, int32_t n,
                        int32_t ids_per_rank, void *stream);
// Tensor-parallel top-k (argmax.cu; kernels/backend.h topk_rows and
// topk_scatter): out [rows][k] = row i's best k entries of x ([rows][ld],
// f32 or bf16) in the sampler's order (larger s = (x - mx_i) * (1 / T_i),
// then lower column; mx_i the largest of cand [n_ranks][rows], scale 1 for
// greedy params), value = raw x, index = col0 + column, (-inf, -1) past
// cols; 1 <= k <= PG_TOPK_EXCHANGE_MAX. And rows of logits ([rows][ld]) set
// to -inf but for the entries of cand [n_ranks][rows][k] whose index is in
// [0, cols). cand, params and out in device memory.
int pg_cuda_topk_rows(struct pg_argmax *out, const void *x, int dtype, int64_t rows, int64_t cols, int64_t ld,
                      int32_t k, const struct pg_argmax *cand, int32_t n_ranks,
                      const struct pg_sample_params *params, int32_t col0, void *stream);
int pg_cuda_topk_scatter(void *logits, int dtype, int64_t rows, int64_t cols, int64_t ld,
                         const struct pg_argmax *cand, int32_t n_ranks, int32_t k, void *stream);

// A CUDA backend's compute stream (a cudaStream_t) and device, for the
// NCCL communicator (comm_nccl.cu), which enqueues on that stream.
struct pg_backend;
void *pg_cuda_backend_stream(struct pg_backend *b);
int pg_cuda_backend_device(struct pg_backend *b);

int pg_cuda_embed(void *out, const void *table, const int32_t *ids, int64_t m, int64_t dim,
                  int64_t n_rows, void *stream);
// The same with table row r holding id id0 + r (a vocabulary shard): ids
// outside [id0, id0 + n_rows) give zero rows.
int pg_cuda_embed_shard(void *out, const void *table, const int32_t *ids, int64_t m, int64_t dim,
                        int64_t n_rows, int32_t id0, void *stream);

// Block copies for every layer's K and V at once: for each pair p < n_pairs
// and tensor t < n_tensors, block pairs[2p] of src[t] -> block pairs[2p+1]
// of dst[t]. src, dst: device arrays of n_tensors pointers (a KV cache's K
// pointers then V pointers, kernels/cuda/backend_cuda.cu); copy-on-write
// passes the device cache as both, a swap the device cache and its host
// mirror (pinned and mapped: the kernel reads or writes it over PCIe).
// pairs: device-readable int32 [n_pairs][2] (the layout of pg_block_move);
// block_bytes = block_size * n_kv_heads * head_dim * bytes per element.
// The pairs are copied in parallel: a destination must not be the source
// of another pair of the same call (copy-on-write targets are fresh blocks,
// swaps cross between two pools).
int pg_cuda_move_blocks(const void *const *src, void *const *dst, int32_t n_tensors, const int32_t *pairs,
                        int32_t n_pairs, int64_t block_bytes, void *stream);

// out[n] = bf16(in[n]) (round to nearest even; NaN stays NaN).
int pg_cuda_f32_to_bf16(void *out, const float *in, int64_t n, void *stream);
// out[n] = f32(in[n]) (exact).
int pg_cuda_bf16_to_f32(float *out, const void *in, int64_t n, void *stream);

// --- GEMM (cuBLASLt) ----------------------------------------------------------------

// A cuBLASLt handle and a cache of matmul descriptors and heuristic picks
// per shape. Use one per thread (or per stream); not thread-safe.
typedef struct pg_cuda_gemm pg_cuda_gemm;

// The workspace cuBLASLt is given in the benchmarks and tests (32 MiB, as
// NVIDIA recommends for Hopper); any size works, larger allows more algos.
#define PG_CUDA_GEMM_WORKSPACE ((size_t)32 << 20)

int pg_cuda_gemm_create(pg_cuda_gemm **out);
void pg_cuda_gemm_destroy(pg_cuda_gemm *g);

// out[i][j] = sum_k x[i][k] * w[j][k] (+ out[i][j] when `accumulate`) for
// i < m, j < n: bf16 x [m][ldx], bf16 w [n][k] (a weight matrix as stored:
// one row per output feature), bf16 out [m][ldo] (so several weights can
// fill column ranges of one output, and `accumulate` adds into the residual
// stream). fp32 accumulate. The first call for a shape asks cuBLASLt's
// heuristic; later calls reuse the cached descriptors and algorithm.
// workspace: device memory of workspace_bytes, used by this stream only.
int pg_cuda_gemm_bf16(pg_cuda_gemm *g, void *out, int64_t ldo, const void *x, int64_t ldx,
                      const void *w, int64_t m, int64_t n, int64_t k, int accumulate,
                      void *workspace, size_t workspace_bytes, void *stream);

// W8A8 on Hopper's FP8 tensor cores (docs/fp8_gemm.md): out[i][j] =
// bf16(bf16(sum_t e4m3(xq[i][t]) * e4m3(w[j][t])) * xscales[i] * wscales[j])
// (+ out[i][j] when `accumulate`): cuBLASLt's e4m3 product with f32
// accumulation (fast_accum: the tensor core's own accumulator throughout,
// faster and less exact) rounded to bf16, then pg_cuda_fp8_rescale. xq
// e4m3 [m][ldx] with f32 xscales [m] (pg_cuda_quant_rows_fp8's output); w
// e4m3 [n][k] with f32 wscales [n] (PG_DTYPE_FP8_E4M3 as stored); out bf16
// [m][ldo]. With `accumulate` the raw sums need tmp: m * n * 2 bytes of
// device memory (else they are written into out). PG_EUNSUPP when k or ldx
// is not a multiple of 16, ldo not of 8, tmp is too small, or cuBLASLt has
// no algorithm (not Hopper or later): the caller falls back to the
// dequantized bf16 product.
int pg_cuda_gemm_fp8(pg_cuda_gemm *g, void *out, int64_t ldo, const void *xq, int64_t ldx,
                     const float *xscales, const void *w, const float *wscales, int64_t m, int64_t n,
                     int64_t k, int accumulate, int fast_accum, void *tmp, size_t tmp_bytes,
                     void *workspace, size_t workspace_bytes, void *stream);

// The same product in one pass (gemm_fp8_cutlass.cu): a CUTLASS sm90
// kernel with both scales in its epilogue, out[i][j] = bf16(xscales[i] *
// (wscales[j] * sum_t e4m3(xq[i][t]) * e4m3(w[j][t])) (+ out[i][j] when
// `accumulate`, in f32)), one rounding; xq contiguous [m][k]. PG_EUNSUPP
// when built without CUTLASS's headers, k not a multiple of 16, n or ldo not
// of 8, a pointer misaligned (16 bytes; wscales too), or the workspace is
// too small.
int pg_cuda_gemm_fp8_cutlass(void *out, int64_t ldo, const void *xq, const float *xscales, const void *w,
                             const float *wscales, int64_t m, int64_t n, int64_t k, int accumulate,
                             void *workspace, size_t workspace_bytes, void *stream);

// The same product in one of the kernel's tile configurations, for the
// sweep (bench_cuda_gemm_fp8 --sweep) and the tests: cfg 0 ..
// (pg_cuda_gemm_fp8_cutlass is cfg 0, swizzle 1, raster 0), swizzle the
// persistent tile scheduler's max swizzle size (1, 2, 4, 8), raster its
// order over D's tiles (0 CUTLASS's heuristic, 1 along m, 2 along n).
// PG_EUNSUPP (with a message) for an unknown cfg, a shape or alignment the
// configuration cannot implement, or swizzle/raster other than 1/0 on a
// configuration without a persistent scheduler; PG_EINVAL for another
// swizzle or raster. pg_cuda_gemm_fp8_cutlass_cfg_name: the configuration's
// name ("c2 64x128x128 1x1 ws": tile, cluster, and " coop" for a persistent
// grid that takes the knobs or " ws" for one CTA per tile that takes none),
// NULL past the last (and for every cfg when built without CUTLASS).
int pg_cuda_gemm_fp8_cutlass_cfg(int cfg, int swizzle, int raster, void *out, int64_t ldo, const void *xq,
                                 const float *xscales, const void *w, const float *wscales, int64_t m, int64_t n,
                                 int64_t k, int accumulate, void *workspace, size_t workspace_bytes, void *stream);
const char *pg_cuda_gemm_fp8_cutlass_cfg_name(int cfg);
// The configuration, swizzle and raster the model's W8A8 products run for
// m tokens, n output channels and a reduction of k (PAGED_CUDA_FP8_CUTLASS=2):
// the winners of bench_cuda_gemm_fp8 --sweep
// (gemm_fp8_cutlass.cu, docs/fp8_gemm.md). Returns 0 with *cfg set, or -1
// where cuBLASLt + rescale won (the caller takes pg_cuda_gemm_fp8).
int pg_cuda_gemm_fp8_cutlass_pick(int64_t m, int64_t n, int64_t k, int *cfg, int *swizzle, int *raster);

// The W8A8 epilogue (act_quant.cu): out[i][j] = bf16(raw[i][j] * xscales[i]
// * wscales[j]) (f32 products in that order; + out[i][j] when
// `accumulate`, in f32 before the rounding). raw bf16 [m][ldr] may be out
// itself (ldr == ldo) when not accumulating.
int pg_cuda_fp8_rescale(void *out, int64_t ldo, const void *raw, int64_t ldr, const float *xscales,
                        const float *wscales, int64_t m, int64_t n, int accumulate, void *stream);

// Dynamic per-token FP8 quantization of bf16 x [rows][ldx] (act_quant.cu):
// scales[i] = max|x[i]| / 448 (1 for a zero row), q[i][t] = e4m3(x[i][t] *
// (1 / scales[i])), rounded to nearest even and saturating: bit for bit
// pg_quantize_row_fp8 (kernels/dtype.c) on the row's f32 values. q e4m3
// [rows][ldq], ldq >= k.
int pg_cuda_quant_rows_fp8(void *q, int64_t ldq, float *scales, const void *x, int64_t ldx, int64_t rows,
                           int64_t k, void *stream);

// The quantization fused into what makes the activations (act_quant.cu),
// each equal bit for bit to its unfused chain:
//   pg_cuda_rmsnorm_quant_fp8 = pg_cuda_add_rmsnorm (no residual) into a
//     bf16 row, then pg_cuda_quant_rows_fp8 of it; x bf16 [m][dim]
//     contiguous, w bf16 [dim]; x is not modified and no bf16 row is kept.
//   pg_cuda_silu_mul_quant_fp8 = pg_cuda_silu_mul into h (bf16 [m][ffn],
//     written: the op's output), then pg_cuda_quant_rows_fp8 of h;
//     gate_up bf16 [m][2 ffn].
// q e4m3 [m][ldq], scales f32 [m]. PG_EUNSUPP (the caller runs the chain)
// when dim or ffn is not a multiple of 8, a row is not 16-byte aligned, or
// dim > 32768.
int pg_cuda_rmsnorm_quant_fp8(void *q, int64_t ldq, float *scales, const void *x, const void *w, int64_t m,
                              int64_t dim, float eps, void *stream);
int pg_cuda_silu_mul_quant_fp8(void *h, void *q, int64_t ldq, float *scales, const void *gate_up, int64_t m,
                               int64_t ffn, void *stream);

// --- GEMV (small m, weight streaming) -------------------------------------------------

// The largest m the GEMV launchers take (kernels templated on m = 1..8).
#define PG_CUDA_GEMV_MAX_M 8

// pg_cuda_gemm_bf16's contract for 1 <= m <= PG_CUDA_GEMV_MAX_M without
// cuBLASLt: out[i][j] = sum_k x[i][k] * w[j][k] (+ out[i][j] when
// `accumulate`), bf16 in and out, fp32 accumulate. A persistent kernel that
// reads each weight byte once with 16-byte loads (docs/cuda_kernels.md).
// PG_EUNSUPP (the caller falls back to pg_cuda_gemm_bf16) when m >
// PG_CUDA_GEMV_MAX_M, k or ldx is not a multiple of 8, x or w is not 16-byte
// aligned, or m * k * 2 bytes of x exceed a CTA's shared memory (227 KB on
// Hopper: k <= 14528 at m = 8). out must not overlap x. m == 0 does nothing.
int pg_cuda_gemv_bf16(void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, int64_t m,
                      int64_t n, int64_t k, int accumulate, void *stream);

// out[i][j] = sum_k xn[i][k] * w[j][k] with xn = pg_cuda_add_rmsnorm's
// output for x (no residual; norm_w bf16 [k], 16-byte aligned): the same
// fp32 sum of squares in the same order, rounded to bf16, so it equals
// add_rmsnorm then pg_cuda_gemv_bf16 bit for bit. x is not modified. The
// limits of pg_cuda_gemv_bf16, and k <= 32768.
int pg_cuda_gemv_rmsnorm_bf16(void *out, int64_t ldo, const void *x, int64_t ldx,
                              const void *norm_w, float eps, const void *w, int64_t m, int64_t n,
                              int64_t k, void *stream);

// The fused gate/up product: w is the fused [gate|up] weight [2 ffn][k];
// out[i][j] = bf16(silu(g) * u) for j < ffn, with g = bf16(xn[i] . w[j]) and
// u = bf16(xn[i] . w[ffn + j]) (xn as above): add_rmsnorm, pg_cuda_gemv_bf16
// over the 2 ffn rows and pg_cuda_silu_mul in one pass (bit for bit), without
// the [m][2 ffn] intermediate. out is [m][ldo], ldo >= ffn. The limits of
// pg_cuda_gemv_rmsnorm_bf16.
int pg_cuda_gemv_rmsnorm_silu_bf16(void *out, int64_t ldo, const void *x, int64_t ldx,
                                   const void *norm_w, float eps, const void *w, int64_t m,
                                   int64_t ffn, int64_t k, void *stream);

// The three launchers above for FP8 weights (PG_DTYPE_FP8_E4M3 as stored:
// w e4m3 [n][k], 16-byte aligned, wscale f32 [n], NORM_SILU [2 ffn]):
// weight-only, x bf16, each e4m3 value exact in f32, the row's f32 sum
// times wscale[j], then (+ out, accumulating) rounded to bf16; the fused
// ones equal add_rmsnorm, pg_cuda_gemv_fp8 [and pg_cuda_silu_mul] bit for
// bit. Their limits, and k a multiple of 16 (else PG_EUNSUPP: the caller
// falls back to pg_cuda_qgemv). The decode path for FP8 weights
// (docs/fp8_gemm.md, "Small batches").
int pg_cuda_gemv_fp8(void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, const float *wscale,
                     int64_t m, int64_t n, int64_t k, int accumulate, void *stream);
int pg_cuda_gemv_rmsnorm_fp8(void *out, int64_t ldo, const void *x, int64_t ldx, const void *norm_w, float eps,
                             const void *w, const float *wscale, int64_t m, int64_t n, int64_t k, void *stream);
int pg_cuda_gemv_rmsnorm_silu_fp8(void *out, int64_t ldo, const void *x, int64_t ldx, const void *norm_w,
                                  float eps, const void *w, const float *wscale, int64_t m, int64_t ffn, int64_t k,
                                  void *stream);

// Which GEMV kernel the launchers above use, for benchmarks and tests
// (process-wide, from the next launch; a captured graph keeps its kernel):
// 0 the register kernel, 1-4 the ring kernels (weights staged through shared
// memory with cp.async; docs/cuda_kernels.md, "GEMV"), -1 back to
// PAGED_CUDA_GEMV_KERNEL or, without it, the default: kind 2 (kind 1 for
// FP8 weights) while pg_cuda_gemv_preload_set(1) is in force, else kind 0. Returns the previous
// kind (-1: the default).
int pg_cuda_gemv_kernel_set(int kind);

// The caller's promise, process-wide: from now on no weight passed to a GEMV
// launcher is written by a kernel that may still be running when the GEMV is
// launched (weights are written at load, then the device is synchronized).
// With it (1) the default kernel is the ring kernel, which starts copying its
// first weight pieces into shared memory before pg_pdl_wait(), while the
// previous kernel of the stream still runs (3 us per W1 layer); without it
// (0, the default) the register kernel only prefetches them into L2 there.
// The model sets it once its weights are uploaded. Returns the previous
// setting.
int pg_cuda_gemv_preload_set(int on);

// --- L2 prefetch (l2_prefetch.cu) ----------------------------------------------------------

// Asks the L2 to fetch [p, p + bytes) (cp.async.bulk.prefetch.L2, sm_90; a
// hint: nothing is written or waited for), then waits for the kernel before
// it on the stream, so the chain's order holds for the kernel after it. A
// PDL launch of one CTA: issued after a product, it starts while that
// product runs, and the bytes stream in while the next kernels (RoPE,
// attention at batch 1) leave HBM idle. Ends inside 16-byte boundaries are
// left out. bytes == 0 launches nothing. Below sm_90 only the wait runs.
int pg_cuda_l2_prefetch(const void *p, size_t bytes, void *stream);

// --- quantized weights: FP8 e4m3 per row, int4 groups (qgemv.cu) -------------------------
//
// Weights in paged's own types as the host stores them (kernels/dtype.h,
// docs/quantization.md "CUDA"), dtype a pg_dtype:
//   PG_DTYPE_FP8_E4M3  w [n][k] bytes of e4m3, scales f32 [n] (w[j][t] = e4m3 * scales[j])
//   PG_DTYPE_INT4_G128 w [n][k / 128] blocks of 68 bytes, scales unused (NULL)
//   PG_DTYPE_INT4_G64  w [n][k / 64] blocks of 36 bytes, scales unused
// int4 weights 4-byte aligned (every block is), k a multiple of the group.
// Compiled, not yet run on a GPU: tests/gpu/test_cuda_kernels -k qgemv / -k qgemm.

// The largest m pg_cuda_qgemv takes (kernels templated on m = 1..8).
#define PG_CUDA_QGEMV_MAX_M 8

// pg_cuda_gemv_bf16's contract for a quantized weight: out[i][j] =
// sum_t x[i][t] * w[j][t] (+ out[i][j] when `accumulate`), bf16 x and out,
// the weight dequantized in registers (weight-only: x is not quantized),
// f32 accumulation, one pass over the weight's bytes. PG_EUNSUPP (the
// caller falls back to pg_cuda_qdequant_bf16 + pg_cuda_gemm_bf16) when m >
// PG_CUDA_QGEMV_MAX_M, k or ldx is not a multiple of 8, x is not 16-byte
// aligned, an fp8 k is not a multiple of 16 or w not 16-byte aligned, or m *
// k * 2 bytes of x exceed a CTA's shared memory. m == 0 does nothing.
int pg_cuda_qgemv(void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, const float *scales,
                  int dtype, int64_t m, int64_t n, int64_t k, int accumulate, void *stream);

// out bf16 [n][k] (contiguous) = the weight dequantized: bf16(e4m3(q) *
// scales[j]) or bf16((q - z) * d), one rounding each: pg_dequantize_row's
// f32 value (times the row scale for fp8, an f32 product) rounded to
// nearest even, bit for bit. For the large-batch path: this, then
// pg_cuda_gemm_bf16 on `out`.
int pg_cuda_qdequant_bf16(void *out, const void *w, const float *scales, int dtype, int64_t n, int64_t k,
                          void *stream);

// --- sampling -----------------------------------------------------------------------

// Parameters and results: pg_sample_params, pg_sample_out (kernels/sampling.h).

// The columns of the sampler's per-row buffers: the vocabulary rounded up
// to 64.
static inline size_t pg_cuda_sample_vocab_pad(int32_t vocab) { return ((size_t)vocab + 63) / 64 * 64; }
// Device workspace for n sequences over a vocabulary of `vocab`: per row
// the processed logits (f32) and their counters (u32) over the padded
// vocabulary, plus 256 bytes to align the start. Inline and free of CUDA
// so the memory planner (engine/memplan.c) sizes it without a GPU.
static inline size_t pg_cuda_sample_workspace_size(int32_t n, int32_t vocab) {
    if (n <= 0 || vocab <= 0) return 0;
    return (size_t)n * pg_cuda_sample_vocab_pad(vocab) * (sizeof(float) + sizeof(uint32_t)) + 256;
}

// Samples one token per row of logits [n][ld_logits] (PG_CUDA_F32 or
// PG_CUDA_BF16; the first `vocab` columns are used; they are not modified),
// with kernels/sampling.h's rules and order (kernels/cpu/sampling.c): logprobs from the raw logits;
// then repetition/presence/frequency penalties, banned ids, greedy when
// temperature <= 0 or top_k == 1; else temperature, a window of 30 nats,
// top-k, top-p, min-p over the candidates sorted by logit (ties by lower id)
// and a draw u = pg_sampler_uniform(seed, n_generated) walked down that
// order. Given the same fp32 logits it returns the CPU sampler's token
// (differences only when u falls within ~1e-12 of a boundary).
// tokens: device int32 holding every sequence's history and ban list.
int pg_cuda_sample(pg_sample_out *out, const void *logits, int logits_dtype, int64_t ld_logits,
                   int32_t n, int32_t vocab, const pg_sample_params *params,
                   const int32_t *tokens, void *workspace, size_t workspace_bytes, void *stream);

// Async scheduling: tokens[pairs[2i]] = prev[pairs[2i + 1]].token for i < n,
// i.e. a step's decode inputs taken from the previous step's sampler output
// on the device (the host did not know them when it packed the step).
// Rows and sample indices are the caller's to validate. A plain launch.
int pg_cuda_feed_tokens(int32_t *tokens, const pg_sample_out *prev, const int32_t *pairs,
                        int32_t n, void *stream);

#ifdef __cplusplus
}
#endif
