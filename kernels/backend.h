// kernels/backend.h - the backend interface: device, memory, weights, KV
// cache, fused layer ops, step synchronisation and graph capture (C ABI).
//
// The model (engine/model/: one builder per family over shared layer helpers) and the runner
// (engine/runner/runner.c, one for every device) call only this table; the CPU
// backend (kernels/cpu/backend_cpu.c, the reference) and the CUDA backend
// (kernels/cuda/backend_cuda.cu, CUDA C++ behind this C ABI) implement it.
// Design and the choices against ggml's and vLLM's splits: docs/backend.md.
//
// Execution model. Ops enqueue work in call order on the backend's one
// compute stream and return at once on the GPU (asynchronous); the CPU
// backend runs each op before it returns (synchronous). Pointers an op
// takes are in the backend's memory (device memory on the GPU, host memory
// on the CPU) unless a comment says "host". Errors are returned as negative
// PG_E* codes with pg_err_set() (common/err.h); a device error that
// surfaces later is returned by the next wait/sync.
//
// Activations are tensor views in the backend's activation type
// (pg_backend.act_dtype: f32 on the CPU, bf16 on CUDA); weights are
// backend handles made once at load by weight_upload or weight_random,
// which convert a stored type or keep it (runs_in_place says which types a
// backend runs as stored, so quantized weights need not be dequantized).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "kernels/kernels.h"  // pg_weight, pg_kv_shape, pg_matmul_mode
#include "kernels/sampling.h" // pg_sample_params, pg_sample_out

#ifdef __cplusplus
extern "C" {
#endif

// A 2-D view of activations: rows of `cols` elements of `dtype` (PG_DTYPE_F32
// or PG_DTYPE_BF16), `stride` elements apart (>= cols).
typedef struct pg_tensor {
    void *data;
    int32_t dtype;
    int64_t rows, cols, stride;
} pg_tensor;

// Row range [r0, r0 + n) and column range [c0, c0 + nc) of t (a view into
// the same memory).
pg_tensor pg_tensor_view(pg_tensor t, int64_t r0, int64_t n, int64_t c0, int64_t nc);

// A weight the backend holds: a matrix [rows][cols] (one row per output
// feature), or a vector (rows = 1: norms, biases, rotary frequencies).
// Made by weight_upload / weight_random; the backend allocates a larger
// struct with this at its start.
typedef struct pg_bweight {
    int64_t rows, cols;
    int32_t dtype; // the type the backend runs it in (pg_dtype)
    size_t bytes;  // backend memory it takes
} pg_bweight;

// The paged KV cache of every layer, in backend memory, plus its host swap
// blocks. k[l] and v[l] are [n_blocks][block_size][n_kv_heads][head_dim] of
// the shape's element type (PG_KV_*: the native type, fp8 on CUDA; f32,
// f16, bf16 or q8_0 rows on the CPU).
typedef struct pg_bkv {
    pg_kv_shape shape;
    int32_t n_layers;
    int32_t n_host_blocks;
    void **k, **v;     // host arrays [n_layers] of backend pointers
    size_t bytes;      // backend memory of the device blocks
    size_t host_bytes; // host memory of the swap blocks
} pg_bkv;

// One step's attention layout, the same for every layer. Sequences with one
// query (decode) come first: sequence s < n_decode owns row s; sequence s
// >= n_decode owns rows [n_decode + cu_q[s - n_decode], n_decode +
// cu_q[s - n_decode + 1]) at positions start_pos[s] + i. Arrays are in
// backend memory; the maxima are host values (they fix the kernels' plans,
// which a captured graph keeps).
typedef struct pg_attn_batch {
    int32_t n_seqs, n_decode;
    const int32_t *block_tables; // [n_seqs][bt_stride]
    int32_t bt_stride;
    const int32_t *seq_lens;     // [n_seqs] keys after this step (start_pos + queries)
    const int32_t *start_pos;    // [n_seqs]
    const int32_t *cu_q;         // [n_seqs - n_decode + 1], relative to row n_decode
    int32_t max_decode_ctx;      // bounds seq_lens of the decode sequences
    int32_t max_prefill_q;       // bounds the queries of a prefill sequence
    void *workspace;             // attn_workspace_bytes() for the step's limits
    size_t workspace_bytes;
    // Host copies of start_pos and cu_q, valid while the step's forward is
    // issued, or NULL: a kernel planned on the host (CUDA's FlashInfer
    // prefill, the default on Hopper) reads them; without them the
    // backend runs its own kernel.
    const int32_t *host_start_pos, *host_cu_q;
} pg_attn_batch;

// Rows [row0, row0 + rows) x columns [col0, col0 + cols) of a virtual
// matrix `full_cols` wide: element (i, j) is the generator's element
// (row0 + i) * full_cols + col0 + j (weight_random).
typedef struct pg_rand_window {
    int64_t rows, cols;
    int64_t row0, col0, full_cols;
} pg_rand_window;

// The total rows of windows that share one column count and lie inside
// their virtual matrices; PG_EINVAL naming `who` and the window otherwise.
int pg_rand_windows_rows(const pg_rand_window *w, int n, const char *who, int64_t *rows);

// A row's largest value and its column (argmax_rows; topk_rows' entries).
typedef struct pg_argmax {
    float value;
    int32_t index;
} pg_argmax;
// The largest k of topk_rows: a row that wants more gathers the logits.
#define PG_TOPK_EXCHANGE_MAX 64

// One adapter's low-rank pair for one projection (lora_apply): the
// product adds scale * (x . a^T) . b^T, a [rank][in] and b [out][rank]
// (PEFT's lora_A and lora_B), rank = a->rows. a NULL: the adapter leaves
// this projection alone (rows of the slot get nothing added).
typedef struct pg_lora_slot {
    const pg_bweight *a, *b;
    float scale; // lora_alpha / r, or / sqrt(r) with rsLoRA
} pg_lora_slot;

// One entry of a slot table in backend memory (lora_table_write,
// lora_apply_dev): a slot's pair in the backend's own addressing. The
// engine sizes and addresses tables of them, never reads one.
typedef struct pg_lora_dev_slot {
    const void *a, *b; // NULL a: the slot leaves this projection alone
    int32_t rank;
    float scale;
} pg_lora_dev_slot;
#define PG_LORA_DEV_MAX_PROJ 3

// lora_apply's argument checks, one rule for every backend ("who" names the
// op in messages: "cpu lora_apply"): out has x's rows; each row's slot is
// in [-1, n_slots); each slot a row names with an A has A [rank >= 1][x
// cols] and B [out cols][rank]. Slots no row names are not looked at.
// *max_rank: the largest rank named (0: no row has work). PG_EINVAL with
// the row or slot otherwise.
int pg_lora_check(const char *who, pg_tensor out, pg_tensor x, const int32_t *row_slot, const pg_lora_slot *slots,
                  int32_t n_slots, int64_t *max_rank);

typedef struct pg_backend pg_backend;

// What a kind of backend can do, known without making one: `paged plan`
// (engine/memplan.c) plans for a GPU that need not be on this machine, so
// it asks the kind (pg_backend_cpu_caps, pg_backend_cuda_caps) what a live
// backend answers through be->caps, instead of rules copied beside it.
typedef struct pg_backend_caps {
    int32_t act_dtype;       // activations: PG_DTYPE_F32 (CPU) or PG_DTYPE_BF16 (CUDA)
    int32_t kv_native;       // the KV cache's native element type, for messages
                             //   (PG_DTYPE_F32 on the CPU, PG_DTYPE_BF16 on CUDA)
    bool weights_borrow;     // weight_upload keeps pointers into the host data, which
                             //   must outlive the weight (CPU); else it copies (CUDA)
    bool measures_memory;    // mem_info tracks what allocations and kernels take, so the
                             //   runner's profiling forward means something (CUDA)
    bool has_graphs;         // graph_begin/graph_end capture (CUDA)
    bool attn_window;        // attention takes a sliding window (CPU, CUDA); else window must be 0
    // Weights stored in `dtype` run as stored when true (no conversion at
    // load); the rest become weight_dtype at upload. CPU: every GGUF block
    // type and paged's FP8 / int4 (kernels/cpu/matmul.c); CUDA: bf16, FP8
    // e4m3 and int4 (kernels/cuda/qgemv.cu), the rest dequantized to bf16.
    bool (*runs_in_place)(int dtype);
    int32_t weight_dtype;    // what a weight it does not run in place becomes
    int32_t vector_bytes;    // bytes per element of norms and biases
} pg_backend_caps;

const pg_backend_caps *pg_backend_cpu_caps(void);
// Always linked (kernels/cuda/cuda_caps.c), also in a build without CUDA.
const pg_backend_caps *pg_backend_cuda_caps(void);


// The backend interface in three tables, as ggml separates devices,
// buffers and compute: `dev` (the device, its memory, copies, events and
// graph capture), `store` (what lives in backend memory across steps: the
// weights, their offload, the KV cache and its swaps), and `ops` (the
// compute of a step at the fused granularity the GPU runs). Each backend
// fills three static tables; callers say which part they use
// (be->ops->linear(be, ...)). Every function takes the backend itself.
typedef struct pg_backend_dev {
    void (*destroy)(pg_backend *b);
    // Makes this backend's device the calling thread's (CUDA: cudaSetDevice;
    // nothing on the CPU). Tensor-parallel workers call it before their
    // rank's work, so that every allocation and launch goes to the rank's GPU.
    int (*bind_thread)(pg_backend *b);

    // One line: the device's name and size ("NVIDIA H200, 132 SMs, ...").
    void (*describe)(pg_backend *b, char *out, size_t cap);
    // Bytes of device memory free and in total (host memory on the CPU).
    int (*mem_info)(pg_backend *b, int64_t *free_bytes, int64_t *total_bytes);
    // Device memory (16-byte aligned, contents undefined); PG_ENOMEM saying
    // the size when it does not fit.
    int (*alloc)(pg_backend *b, size_t bytes, void **out);
    void (*free)(pg_backend *b, void *p);
    // Host memory the device copies to and from at full speed (pinned).
    int (*host_alloc)(pg_backend *b, size_t bytes, void **out);
    void (*host_free)(pg_backend *b, void *p);
    // Stream-ordered copies host -> backend and backend -> host; the host
    // buffer must stay untouched until a later wait covers the copy.
    int (*upload)(pg_backend *b, void *dst, const void *src_host, size_t bytes);
    int (*download)(pg_backend *b, void *dst_host, const void *src, size_t bytes);
    // Marks the work queued so far as event `slot` (0 or 1); wait blocks the
    // host until that work is done (device errors surface here).
    int (*record)(pg_backend *b, int slot);
    int (*wait)(pg_backend *b, int slot);
    int (*sync)(pg_backend *b);

    // --- graphs ------------------------------------------------------------------
    // Records every op queued between begin and end into a graph that
    // graph_launch replays with the same arguments (the same buffers; their
    // contents may change). PG_EUNSUPP without graphs. A failed capture
    // leaves the stream usable.
    int (*graph_begin)(pg_backend *b);
    int (*graph_end)(pg_backend *b, void **graph);
    int (*graph_launch)(pg_backend *b, void *graph);
    void (*graph_free)(pg_backend *b, void *graph);

    // Op profiling (kernels/backend_prof.h, PAGED_PROFILE_OPS=1): a ring of
    // PG_PROF_MARKS stamps. timer_mark stamps slot i (< PG_PROF_MARKS) of the
    // compute timeline when all that was issued before it has run (CUDA: an
    // event on the compute stream; the CPU: the clock, its ops being
    // synchronous); timer_read waits for the n-th stamp from slot i0 and
    // writes ms[j] = stamp (i0 + j + 1) - stamp (i0 + j), slots taken modulo
    // PG_PROF_MARKS, for j < n - 1. NULL: the backend cannot be profiled.
    int (*timer_mark)(pg_backend *b, int32_t i);
    int (*timer_read)(pg_backend *b, int32_t i0, int32_t n, float *ms);
} pg_backend_dev;

// Stamps in timer_mark's ring (kernels/backend_prof.c reads them back
// before it wraps).
#define PG_PROF_MARKS 4096

typedef struct pg_backend_store {
    // --- weights ---------------------------------------------------------------
    // True when weights stored in `dtype` run as stored (no conversion at load).
    bool (*runs_in_place)(pg_backend *b, int dtype);
    // A weight from host matrices concatenated along the output dimension
    // (Q|K|V, gate|up): parts[i] are [rows_i][cols] of one cols; types the
    // backend does not run in place are converted (CUDA: dequantized to
    // bf16). A vector is one part of rows = 1. PG_EINVAL for mismatched
    // parts, PG_ENOMEM when it does not fit. See weights_borrow.
    int (*weight_upload)(pg_backend *b, const pg_weight *parts, int n_parts, pg_bweight **out);
    // A weight of random values made on the device: N(0, std^2) from a
    // counter-based generator keyed by (key, element) when std > 0, else
    // every element `fill` (norms). The same key gives the same values on
    // every backend (to bf16 rounding). The weight is the windows' rows
    // concatenated (one cols); a window is a block of a larger virtual
    // matrix, so a tensor-parallel shard gets exactly its slice of the
    // values the whole tensor would have.
    int (*weight_random)(pg_backend *b, const pg_rand_window *windows, int n_windows, uint64_t key,
                         float std, float fill, pg_bweight **out);
    // An f32 vector kept in f32 on every backend (rotary frequencies, whose
    // angles need the precision; norms and biases go through weight_upload).
    int (*vector_f32)(pg_backend *b, const float *v, int64_t n, pg_bweight **out);
    void (*weight_free)(pg_backend *b, pg_bweight *w);

    // --- weight offload (--cpu-offload-gb: engine/model/model_offload.c) --------------
    // Bytes of backend memory w takes as one block (its data and any row
    // scales): what weight_offload moves and a device slot must hold.
    size_t (*weight_pack_bytes)(pg_backend *b, const pg_bweight *w);
    // Moves w out of backend memory: its contents are copied to `host` (host
    // memory of weight_pack_bytes(w) bytes, which the caller keeps while w
    // lives) and its own backend memory is freed; w->bytes becomes 0. Until
    // weight_point gives it an address w must not be used. Synchronous.
    int (*weight_offload)(pg_backend *b, pg_bweight *w, void *host);
    // From now on ops read offloaded weight w at dst (backend memory of
    // weight_pack_bytes(w) bytes, 256-byte aligned), which holds w only once
    // stream_in has copied w's host block there.
    int (*weight_point)(pg_backend *b, pg_bweight *w, void *dst);
    // Copies `bytes` from src_host (host_alloc memory) to dst on the copy
    // stream, after the compute work queued so far (which may still read
    // dst), as copy `slot` (0 or 1); compute work queued after
    // stream_in_wait(slot) sees the copy. Both are captured into graphs like
    // every other op. (The CPU copies at once and waits for nothing.)
    int (*stream_in)(pg_backend *b, void *dst, const void *src_host, size_t bytes, int slot);
    int (*stream_in_wait)(pg_backend *b, int slot);

    // --- KV cache ----------------------------------------------------------------
    // Bytes of one block over `n_layers` layers, K and V, in shape.dtype.
    size_t (*kv_block_bytes)(pg_backend *b, int32_t n_layers, pg_kv_shape shape);
    // shape.n_blocks device blocks of every layer (zeroed: never-written slots
    // hold finite values) and n_host_blocks host blocks for swapping.
    // PG_ENOMEM saying what would fit.
    int (*kv_create)(pg_backend *b, int32_t n_layers, pg_kv_shape shape, int32_t n_host_blocks,
                     pg_bkv **out);
    void (*kv_free)(pg_backend *b, pg_bkv *kv);
    // Whole-block moves of every layer: swap (device block pairs[2i] -> host
    // block pairs[2i + 1] when to_host, else host -> device), ordered after
    // the compute work queued so far and before what follows; copies
    // (device -> device, copy-on-write; a destination is never another
    // pair's source). pairs: host int32 [n][2].
    int (*kv_swap)(pg_backend *b, pg_bkv *kv, const int32_t *pairs, int32_t n, bool to_host);
    int (*kv_copy)(pg_backend *b, pg_bkv *kv, const int32_t *pairs, int32_t n);
    // Device -> host block copies that nothing of the step being queued
    // reads or writes (the host tier's copies ahead, scheduler/plan.h
    // n_swap_out_ahead): ordered after the work queued so far, they may run
    // beside the work queued next; work queued after kv_swap_join waits for
    // them. Both NULL where a backend has nothing to overlap (the runner
    // then runs them as kv_swap).
    int (*kv_swap_ahead)(pg_backend *b, pg_bkv *kv, const int32_t *pairs, int32_t n);
    int (*kv_swap_join)(pg_backend *b);
} pg_backend_store;

typedef struct pg_backend_ops {
    // --- workspace sizes -----------------------------------------------------------
    // Bytes attention wants for any step of up to max_seqs sequences of up to
    // max_len keys (split-K partials); 0 when it needs none.
    size_t (*attn_workspace_bytes)(pg_backend *b, int32_t max_seqs, int32_t n_heads,
                                   int32_t n_kv_heads, int32_t head_dim, int32_t max_len);
    size_t (*sample_workspace_bytes)(pg_backend *b, int32_t max_seqs, int32_t vocab);

    // --- layer ops -----------------------------------------------------------------
    // out[i] = table[ids[i] - id0] for i < out.rows (ids in backend memory;
    // an id outside [id0, id0 + table rows) gives a zero row). The token
    // embedding; id0 is a vocabulary shard's first id (tensor parallelism).
    int (*embed)(pg_backend *b, pg_tensor out, const int32_t *ids, const pg_bweight *table, int32_t id0);
    // dst = src (views of one shape and dtype, any strides).
    int (*copy)(pg_backend *b, pg_tensor dst, pg_tensor src);
    // out[i] = x[rows[i]] for i < out.rows (rows in backend memory).
    int (*gather)(pg_backend *b, pg_tensor out, pg_tensor x, const int32_t *rows);
    // out[i] = x[i] * rsqrt(mean(x[i]^2) + eps) * w; out may be x.
    int (*rmsnorm)(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *w, float eps);
    // out[i][0:w.rows] = xn[i] . w^T (+ bias) with xn = norm ? RMSNorm(x[i]) *
    // norm : x[i], for i < x.rows; accumulate adds into out instead (the
    // residual folded into the product; then norm must be NULL). scratch:
    // [x.rows][max(x.cols, w.rows)] for the normalised rows or the product.
    int (*linear)(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                  const pg_bweight *w, const pg_bweight *bias, bool accumulate, pg_tensor scratch);
    // A hint, never a change to any result: a step of `rows` rows will read
    // w soon, after work that leaves memory bandwidth idle (RoPE and
    // attention before O at batch 1); the backend may start moving w closer
    // (CUDA: into L2 under PAGED_CUDA_L2_PREFETCH=1, kernels/cuda/l2_prefetch.cu).
    // NULL: no such thing (CPU).
    int (*prefetch)(pg_backend *b, const pg_bweight *w, int64_t rows);
    // h[i] = silu(g) * u where [g | u] = RMSNorm(x[i]) * norm . w^T, w the
    // fused [gate | up] weight [2 ffn][hidden]. scratch_xn [x.rows][hidden],
    // scratch_gu [x.rows][2 ffn].
    int (*gate_up_silu)(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                        const pg_bweight *w, pg_tensor scratch_xn, pg_tensor scratch_gu);
    // h[i][j] = silu(gu[i][j]) * gu[i][ffn + j] for j < ffn = h.cols: the
    // activation of gate_up_silu alone, for callers that add to the gate
    // and up products first (LoRA, docs/lora.md). h and gu contiguous
    // (a single row may have any stride). NULL in a backend without it:
    // callers check (the engine refuses LoRA there).
    int (*silu_mul)(pg_backend *b, pg_tensor h, pg_tensor gu);
    // Gemma's GeGLU: as gate_up_silu with h[i] = gelu_tanh(g) * u, gelu_tanh
    // the tanh approximation (PyTorch's approximate="tanh"). NULL in a
    // backend without Gemma's ops (CUDA for now): callers check.
    int (*gate_up_gelu)(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                        const pg_bweight *w, pg_tensor scratch_xn, pg_tensor scratch_gu);
    // Gemma's post-norms: x[i] += RMSNorm(y[i]) * w, for i < x.rows (y the
    // block's output, already summed across ranks). x and y must not
    // overlap. NULL with gate_up_gelu.
    int (*rmsnorm_add)(pg_backend *b, pg_tensor x, pg_tensor y, const pg_bweight *w, float eps);
    // x *= s in place (Gemma's embedding scale sqrt(hidden), s rounded to the
    // activation type first, as transformers multiplies in the model's
    // dtype). NULL with gate_up_gelu.
    int (*scale)(pg_backend *b, pg_tensor x, float s);
    // Gemma 2's soft-capping: x = cap * tanh(x / cap) in place (its final
    // logits), and attention whose every score s (after the scale) becomes
    // softcap * tanh(s / softcap) before the softmax (otherwise `attention`).
    // NULL: not run here (the loader refuses such a model).
    int (*softcap)(pg_backend *b, pg_tensor x, float cap);
    int (*attention_softcap)(pg_backend *b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab,
                             const void *k_cache, const void *v_cache, pg_kv_shape shape, int32_t n_heads,
                             float scale, int32_t window, float softcap);
    // Mixture-of-experts feed-forward (Mixtral, Qwen3-MoE; docs/moe.md):
    // for i < x.rows, with xn = norm ? RMSNorm(x[i]) * norm : x[i],
    // p = softmax(xn . router^T) over the n_experts experts, S = the top_k
    // experts by p (ties to the lower expert id), w_e = p_e / sum_{S} p when
    // renorm, else p_e:
    //   out[i][0:hidden] = sum_{e in S} w_e * down[e] . (silu(g) * u),
    //   [g | u] = xn . gate_up[e]^T,
    // summed in ascending expert order in f32 (the same result for any
    // thread count). accumulate adds into out instead (the residual folded
    // in, as linear); out may be x. router [n_experts][hidden]; gate_up and
    // down are host arrays [n_experts] of weights, gate_up[e] the fused
    // [gate | up] [2 ffn][hidden] and down[e] [hidden][ffn], of any type
    // the backend runs (the same as linear's). Experts no row chose cost
    // nothing. Expert parallelism: gate_up[e] and down[e] both NULL mark an
    // expert not held here; routing and w_e are unchanged (every expert
    // competes), its terms are left out of the sum, so the outputs over a
    // partition of the experts sum to the whole's (the all-reduce's job);
    // ffn is the first held expert's. workspace: moe_workspace_bytes for at
    // least x.rows rows.
    // NULL in a backend without MoE (CUDA for now): callers check.
    int (*moe_ffn)(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                   const pg_bweight *router, const pg_bweight *const *gate_up,
                   const pg_bweight *const *down, int32_t n_experts, int32_t top_k, bool renorm,
                   bool accumulate, void *workspace, size_t workspace_bytes);
    // Bytes moe_ffn wants for up to max_rows rows of this shape; NULL with moe_ffn.
    size_t (*moe_workspace_bytes)(pg_backend *b, int32_t max_rows, int32_t hidden, int32_t ffn,
                                  int32_t n_experts, int32_t top_k);
    // Batched multi-adapter LoRA (Punica's SGMV; docs/lora.md): for i <
    // x.rows with s = row_slot[i] >= 0 and slots[s].a non-NULL,
    //   out[i][0:out.cols] += slots[s].scale * (x[i] . a^T) . b^T,
    // the shrink rounded to f32 before the expand, f32 throughout (the
    // same bits for any thread count); rows with slot -1 are left as they
    // are. out and x may be views with any stride (out a column slice of a
    // fused Q|K|V or gate|up output) but must not overlap; a [rank][x.cols],
    // b [out.cols][rank], of any type linear runs.
    // row_slot: host [x.rows] in [-1, n_slots). Slots no row names cost
    // nothing. workspace: lora_workspace_bytes for at least x.rows rows.
    // NULL in a backend without LoRA: callers check. CUDA: bf16 rows and
    // adapters, and not under graph capture (PG_EUNSUPP; graph steps take
    // lora_apply_dev below: kernels/cuda/cuda_ops.h).
    int (*lora_apply)(pg_backend *b, pg_tensor out, pg_tensor x, const int32_t *row_slot,
                      const pg_lora_slot *slots, int32_t n_slots, void *workspace, size_t workspace_bytes);
    // Bytes lora_apply wants for up to max_rows rows, n_slots slots of rank
    // <= max_rank, in_cols -> out_cols; NULL with lora_apply.
    size_t (*lora_workspace_bytes)(pg_backend *b, int32_t max_rows, int32_t in_cols, int32_t out_cols,
                                   int32_t max_rank, int32_t n_slots);
    // Graph-safe LoRA (docs/lora.md "Graph-safe LoRA"; the CPU's is the
    // reference: the norm, then lora_apply). lora_apply's product for n_proj (1 to
    // PG_LORA_DEV_MAX_PROJ) projections that read the same x and write
    // adjacent column ranges of out (projection p: cols[p] columns after
    // those of projections < p; Q|K|V, gate|up), with every value a graph
    // would bake in kept in backend memory: row_slot [x.rows] and each
    // tables[p] (n_slots entries that lora_table_write wrote; rows name
    // slots below n_slots) are backend
    // memory, read when the work runs, so a captured graph serves any mix
    // of slots and any adapter loaded after the capture. max_rank: the
    // largest rank a slot may hold (the workspace and the launches depend
    // on it alone). norm: the adapters read rmsnorm(x, norm, eps) instead
    // of x (the norm a fused base product applied; NULL: x as it is), so
    // the normed rows need not be written out. workspace:
    // lora_workspace_bytes for at least x.rows rows.
    int (*lora_apply_dev)(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                          const int32_t *row_slot, const pg_lora_dev_slot *const *tables, int32_t n_slots,
                          const int64_t *cols, int32_t n_proj, int32_t max_rank, void *workspace,
                          size_t workspace_bytes);
    // Writes n host slots into the backend table dst (n entries) in the
    // form lora_apply_dev reads, after the work queued so far (which may
    // read the old entries) has finished; not under capture. The adapters
    // must be of a type lora_apply_dev runs (else PG_EUNSUPP naming it).
    int (*lora_table_write)(pg_backend *b, pg_lora_dev_slot *dst, const pg_lora_slot *src, int64_t n);
    // Per-head RMSNorm in place (Qwen3's q/k norm): each of the n_heads
    // head_dim-wide column groups of every row of x, weight w [head_dim].
    int (*head_rmsnorm)(pg_backend *b, pg_tensor x, int32_t n_heads, const pg_bweight *w, float eps);
    // Rotary embedding (rotate-half, as Hugging Face) of q [n][n_heads *
    // head_dim] and k [n][n_kv_heads * head_dim] in place at positions pos[i]
    // with inv_freq [head_dim / 2]; then rotated k and v go to the cache of
    // one layer at slots[i] (block * block_size + offset; < 0 skips the write).
    int (*rope_kv_write)(pg_backend *b, pg_tensor q, pg_tensor k, pg_tensor v, const int32_t *pos,
                         const int32_t *slots, int32_t n_heads, const pg_bweight *inv_freq,
                         void *k_cache, void *v_cache, pg_kv_shape shape);
    // Causal attention over the paged cache of one layer for the step's
    // sequences: out [rows][n_heads * head_dim] from q (same rows); query
    // head h reads KV head h / (n_heads / n_kv_heads). window > 0: sliding
    // window attention (Gemma's local layers), the query at position p sees
    // the keys at positions (p - window, p] only; 0: every earlier key.
    // q is the layer's to spend: a backend may overwrite its rows (CUDA's
    // FlashInfer fp8 prefill writes the prefill rows' e4m3 codes in place).
    int (*attention)(pg_backend *b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab,
                     const void *k_cache, const void *v_cache, pg_kv_shape shape, int32_t n_heads,
                     float scale, int32_t window);
    // One token per row of logits [n][vocab] (the view's columns), with
    // kernels/sampling.h's rules; logits are not modified. params [n], out
    // [n] and tokens (the histories and ban lists params point into) in
    // backend memory; workspace: sample_workspace_bytes.
    int (*sample)(pg_backend *b, pg_sample_out *out, pg_tensor logits, const pg_sample_params *params,
                  const int32_t *tokens, void *workspace, size_t workspace_bytes);
    // Greedy sampling over a vocabulary split across tensor-parallel ranks,
    // without gathering the logits: each rank takes its rows' maxima, the
    // ranks exchange them (n_ranks x rows pairs), and each picks the best.
    // out[i] = the largest value of row i of x and its column, ties to the
    // lower column (the sampler's greedy rule).
    int (*argmax_rows)(pg_backend *b, pg_argmax *out, pg_tensor x);
    // out[i].token = r * ids_per_rank + cand[r * n + i].index for the rank r
    // whose cand[r * n + i].value is largest (ties to the lower r, which
    // holds the lower ids), logprob 0, n_top 0; for i < n.
    int (*argmax_pick)(pg_backend *b, pg_sample_out *out, const pg_argmax *cand, int32_t n_ranks, int32_t n,
                       int32_t ids_per_rank);
    // Top-k sampling over a split vocabulary without gathering the logits
    // (docs/tensor_parallel.md): each rank keeps its rows' best k entries in
    // the sampler's own order, the ranks exchange them (n_ranks x rows x k
    // pairs), and every rank samples from a row that holds only those.
    // out[i * k + j], j < k = the j-th entry of row i of x in the order of
    // the sampler's candidates (kernels/cpu/sampling.c): larger scaled value
    // s = (x - mx_i) * (1 / T_i) (float ops in that order), then lower
    // column; mx_i = the largest cand[r * n + i].value over r < n_ranks (the
    // ranks' row maxima, argmax_rows), T_i = params[i].temperature, scaled
    // by 1 where that is <= 0 or params[i].top_k == 1 (a greedy row: the
    // order of x). value = the raw x, index = col0 + column; index -1 where
    // the row has fewer than k columns. n = x.rows.
    int (*topk_rows)(pg_backend *b, pg_argmax *out, pg_tensor x, int32_t k, const pg_argmax *cand,
                     int32_t n_ranks, const pg_sample_params *params, int32_t col0);
    // Row i of logits ([n][cols], n = logits.rows) = -inf everywhere but
    // logits[i][c.index] = c.value for every c = cand[(r * n + i) * k + j]
    // (r < n_ranks, j < k) with 0 <= c.index < cols: the sampler then sees
    // exactly the candidates the ranks kept.
    int (*topk_scatter)(pg_backend *b, pg_tensor logits, const pg_argmax *cand, int32_t n_ranks, int32_t k);
    // tokens[pairs[2i]] = prev[pairs[2i + 1]].token for i < n (async
    // scheduling: a step's inputs from the previous step's samples).
    int (*feed_tokens)(pg_backend *b, int32_t *tokens, const pg_sample_out *prev,
                       const int32_t *pairs, int32_t n);
    // Reads rows [0, n) of t as f32 into out[n][t.cols] (host): tests and
    // pg_runner_last_logits. Synchronous.
    int (*read_f32)(pg_backend *b, pg_tensor t, int64_t n, float *out);
} pg_backend_ops;

struct pg_backend {
    const char *name;              // "cpu", "cuda"
    void *ctx;                     // the backend's state
    const pg_backend_caps *caps;   // what it can do (pg_backend_cpu_caps / _cuda_caps)
    const pg_backend_dev *dev;     // device and memory
    const pg_backend_store *store; // weights, KV cache, offload, swap
    const pg_backend_ops *ops;     // the compute of a step
};

// The CPU backend with `n_threads` threads (0 = all online CPUs) and the
// given numerics (kernels/kernels.h).
int pg_backend_cpu_create(int n_threads, pg_matmul_mode mode, pg_backend **out);

// The CUDA backend on device `device`. In a build without nvcc
// (kernels/cuda/cuda_stub.c) it fails with PG_EUNSUPP "built without CUDA".
int pg_backend_cuda_create(int device, pg_backend **out);
// The number of usable CUDA devices; 0 with `why` saying why not ("built
// without CUDA", no device). Never fails.
int pg_backend_cuda_probe(char *why, size_t cap);
// The decode-attention workspace the CUDA backend sizes for these shapes
// on this machine's GPU (the function its runner calls: it depends on the
// SM count), for the memory planner: 1 and *bytes set when a device is
// visible, 0 otherwise (no CUDA, no device).
int pg_backend_cuda_attn_workspace(int32_t max_seqs, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                   int32_t max_len, size_t *bytes);

#ifdef __cplusplus
}
#endif
