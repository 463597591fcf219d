// kernels/cuda/cuda_model.h - a Llama-family model on one CUDA device, as a C ABI.
//
// The device half of the CUDA runner (engine/runner_cuda.c is the host half):
// bf16 weights with Q|K|V and gate|up fused into one matrix each, the paged
// KV cache (plus its pinned host swap mirror), one workspace sized at start
// for the largest step, and the forward pass of one flattened batch followed
// by GPU sampling. Everything is allocated in create / prepare / alloc_kv;
// a step allocates nothing, so a running server cannot fail for memory.
//
// Life cycle:
//   pg_cuda_model_create        weights (uninitialised), streams, cuBLASLt
//   pg_cuda_model_upload_rows   ... per weight, in chunks (or init_random)
//   pg_cuda_model_prepare       workspace + one profiling forward at the
//                               largest step: measures the peak
//   pg_cuda_model_mem           how much is left for the KV cache
//   pg_cuda_model_alloc_kv      KV pool + host swap blocks
//   pg_cuda_model_step          per engine step (or step_begin + step_end)
//   pg_cuda_model_free
//
// In a build without nvcc, kernels/cuda/cuda_stub.c provides these symbols:
// pg_cuda_built() is 0, pg_cuda_device_count() is 0 and every other call
// fails with PG_EUNSUPP "built without CUDA".
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_ops.h" // pg_cuda_sample_params, pg_cuda_sample_out

#ifdef __cplusplus
extern "C" {
#endif

// 1 when this binary holds the CUDA kernels, 0 in a CPU-only build.
int pg_cuda_built(void);

typedef struct pg_cuda_model pg_cuda_model;

typedef struct pg_cuda_model_shape {
    int32_t vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn;
    float rms_eps;
    bool tie_embeddings; // the LM head is the token embedding (one device copy)
    int32_t kv_dtype;    // KV cache elements: PG_KV_BF16 (0) or PG_KV_FP8_E4M3 (1, kernels/kernels.h)
} pg_cuda_model_shape;

// The largest step the scheduler can form; the workspace is sized for it.
typedef struct pg_cuda_model_limits {
    int32_t max_tokens;    // tokens per step (max_num_batched_tokens)
    int32_t max_seqs;      // sequences per step (max_num_seqs)
    int32_t max_model_len; // longest context (decode split plan, block tables)
    int32_t block_size;    // tokens per KV block (a power of two >= 8)
} pg_cuda_model_limits;

// Device memory by category, bytes. other = total - free - the rest (CUDA
// context, cuBLASLt, other processes).
typedef struct pg_cuda_mem_stats {
    int64_t total, free;
    int64_t weights, kv, workspace, graphs, other;
    int64_t host_swap;         // pinned host bytes of the swap mirror
    int64_t workspace_buffers; // of `workspace`, the buffers this module allocated
    int32_t n_graphs;          // CUDA graphs captured so far (decode buckets; `graphs` bytes)
    int64_t graphs_reserved;   // bytes set aside for graphs not captured yet (not in `graphs`;
                               //   part of `free`): the KV budget must leave them free
    char device[160];          // pg_cuda_device_describe()
} pg_cuda_mem_stats;

// Weight tensors, addressed with a layer index (ignored for the global ones).
// Shapes, rows x cols, one row per output feature:
typedef enum pg_cuda_weight_id {
    PG_CUDA_W_EMB = 0,    // [vocab][hidden]
    PG_CUDA_W_LM_HEAD,    // [vocab][hidden] (the embedding when tied)
    PG_CUDA_W_FINAL_NORM, // [1][hidden]
    PG_CUDA_W_ATTN_NORM,  // [1][hidden]
    PG_CUDA_W_FFN_NORM,   // [1][hidden]
    PG_CUDA_W_QKV,        // [(n_heads + 2 n_kv_heads) head_dim][hidden]: Q rows, then K, then V
    PG_CUDA_W_O,          // [hidden][n_heads head_dim]
    PG_CUDA_W_GATE_UP,    // [2 ffn][hidden]: gate rows, then up
    PG_CUDA_W_DOWN,       // [hidden][ffn]
} pg_cuda_weight_id;

// Rows and columns of weight w for a model of this shape, as listed above
// (0 x 0 for an unknown id). The device model and its CPU mock both use it.
static inline void pg_cuda_weight_shape(const pg_cuda_model_shape *s, pg_cuda_weight_id w, int64_t *rows,
                                        int64_t *cols) {
    const int64_t H = s->hidden, hd = s->head_dim;
    *rows = 0, *cols = H;
    switch (w) {
    case PG_CUDA_W_EMB:
    case PG_CUDA_W_LM_HEAD: *rows = s->vocab; break;
    case PG_CUDA_W_FINAL_NORM:
    case PG_CUDA_W_ATTN_NORM:
    case PG_CUDA_W_FFN_NORM: *rows = 1; break;
    case PG_CUDA_W_QKV: *rows = (int64_t)(s->n_heads + 2 * s->n_kv_heads) * hd; break;
    case PG_CUDA_W_O: *rows = H, *cols = (int64_t)s->n_heads * hd; break;
    case PG_CUDA_W_GATE_UP: *rows = 2 * (int64_t)s->ffn; break;
    case PG_CUDA_W_DOWN: *rows = H, *cols = s->ffn; break;
    default: *cols = 0; break;
    }
}

// Host rows per pg_cuda_model_upload_rows call at most: rows * cols <= this.
#define PG_CUDA_UPLOAD_ELEMS ((int64_t)16 << 20)

// Selects device `device`, allocates every weight (one allocation) and the
// streams. `inv_freq` (host, [head_dim / 2]) is copied. Errors: PG_ENOMEM
// with the sizes when the weights do not fit, PG_EIO for CUDA failures,
// PG_EUNSUPP for a head_dim other than 64/128.
int pg_cuda_model_create(const pg_cuda_model_shape *shape, const float *inv_freq, int device,
                         pg_cuda_model **out);
void pg_cuda_model_free(pg_cuda_model *m);

// Rows and columns of a weight (0 rows for an unknown id or layer).
void pg_cuda_model_weight_dims(const pg_cuda_model *m, pg_cuda_weight_id w, int64_t *rows,
                               int64_t *cols);

// Copies n_rows host rows (`src`, PG_CUDA_F32 or PG_CUDA_BF16, rows of
// `cols` elements, packed) to rows [row0, row0 + n_rows) of weight `w` of
// `layer`, converting f32 to bf16 on the device. Synchronous.
// n_rows * cols <= PG_CUDA_UPLOAD_ELEMS.
int pg_cuda_model_upload_rows(pg_cuda_model *m, pg_cuda_weight_id w, int32_t layer, int64_t row0,
                              int64_t n_rows, const void *src, int src_dtype);

// Dummy weights, generated on the device: every matrix N(0, std^2) from a
// counter-based generator keyed by (seed, tensor, element), every norm 1.0.
int pg_cuda_model_init_random(pg_cuda_model *m, uint64_t seed, float std);

// CUDA graphs of decode steps (docs/cuda_runner.md). The default captures
// every (batch, context) bucket in pg_cuda_model_capture_graphs, before
// serving; lazy captures a bucket after its first eager step; off runs
// every step eagerly. PAGED_CUDA_GRAPHS=0 in the environment forces off.
typedef enum pg_cuda_graph_mode {
    PG_CUDA_GRAPHS_STARTUP = 0,
    PG_CUDA_GRAPHS_OFF = 1,
    PG_CUDA_GRAPHS_LAZY = 2,
} pg_cuda_graph_mode;

// Before prepare (which measures what one graph takes and reserves room
// for all of them in `graphs_reserved`).
int pg_cuda_model_set_graph_mode(pg_cuda_model *m, pg_cuda_graph_mode mode);

// Allocates the workspace for `lim`, then runs one forward + sampling at
// the largest step (max_tokens tokens over max_seqs sequences, each
// sampling) on a temporary KV cache, and records the device memory this
// took (buffers, lazily loaded kernels, cuBLASLt) as the workspace.
int pg_cuda_model_prepare(pg_cuda_model *m, const pg_cuda_model_limits *lim);

// Bytes of one KV block over all layers, K and V (2 bytes per element for
// bf16, 1 for fp8: shape->kv_dtype).
size_t pg_cuda_model_kv_block_bytes(const pg_cuda_model_shape *shape, int32_t block_size);

// Allocates n_blocks device KV blocks (zeroed) and n_host_blocks pinned
// host blocks for swapping. PG_ENOMEM, saying what would fit, when the
// device or host memory is short. Call once, after prepare.
int pg_cuda_model_alloc_kv(pg_cuda_model *m, int32_t n_blocks, int32_t n_host_blocks);

// After alloc_kv, before the first step, in the start-up mode: captures
// the decode graph of every batch bucket for every context bucket up to
// PAGED_CUDA_GRAPH_STARTUP_CTX (default max_model_len; larger ones are
// captured on first use), with pad rows only, and logs "cuda graphs: N
// captured in X s, Y MiB". A bucket whose capture fails runs eagerly
// (logged); only a device error of the warm-up steps is an error. A no-op
// in the other modes.
int pg_cuda_model_capture_graphs(pg_cuda_model *m);

void pg_cuda_model_mem(const pg_cuda_model *m, pg_cuda_mem_stats *out);

// One step, as the host runner flattened it. Rows of decode sequences
// (one query each, the last of its context) come first: sequence s <
// n_decode owns row s; sequence s >= n_decode owns rows
// [n_decode + cu_q[s - n_decode], n_decode + cu_q[s - n_decode + 1]).
// All pointers are host memory; the step packs them into one upload.
typedef struct pg_cuda_step {
    int32_t n_tokens;
    const int32_t *tokens, *pos, *slots; // [n_tokens]; slot = block * block_size + offset
    int32_t n_seqs, n_decode;
    const int32_t *block_tables; // [n_seqs][bt_stride]
    int32_t bt_stride;
    const int32_t *seq_lens;             // [n_seqs] context after this step (start_pos + n_q)
    const int32_t *start_pos;            // [n_seqs]
    const int32_t *cu_q;                 // [n_seqs - n_decode + 1], relative to row n_decode
    int32_t max_decode_ctx;              // max seq_lens over decode sequences
    int32_t max_prefill_q;               // max query rows over prefill sequences
    int32_t n_sample;                    // rows that sample (<= max_seqs)
    const int32_t *sample_rows;          // [n_sample] row of each sampled token's hidden state
    const pg_cuda_sample_params *params; // [n_sample]
    const int32_t *sample_tokens;        // history and ban lists the params point into
    int32_t n_sample_tokens;
    // Block moves, done first, in this order: swap-out (device -> host),
    // swap-in (host -> device), copies (device -> device); [n][2] (from, to).
    int32_t n_swap_out, n_swap_in, n_copies;
    const int32_t *swap_out, *swap_in, *copies;
    // Async scheduling: rows whose token is the one the previously begun
    // step sampled, [n_feed][2] (row, index among that step's samples);
    // their entries in `tokens` are placeholders (any valid id).
    int32_t n_feed;
    const int32_t *feed;
} pg_cuda_step;

// Runs the moves, the forward and the sampling; waits for the results and
// writes out[n_sample] (host). Ids and ranges are the caller's to validate
// (engine/runner_cuda.c does); sizes beyond the limits are PG_EINVAL.
// step_begin + step_end with no other step open.
int pg_cuda_model_step(pg_cuda_model *m, const pg_cuda_step *s, pg_cuda_sample_out *out);

// The same in two halves, so the host can prepare step N + 1 while the
// device runs step N: step_begin packs, uploads and queues everything
// (the host arrays of `s` are not read after it returns); step_end waits
// for the oldest begun step and writes its out[n_sample]. At most two
// steps are open (begun, not ended); steps run in the order begun. A step
// with fed tokens (s->feed) reads the sampler output of the step begun
// just before it. Some steps wait inside step_begin (copy-on-write copies,
// a graph captured on first use, PAGED_CUDA_TIMING).
int pg_cuda_model_step_begin(pg_cuda_model *m, const pg_cuda_step *s);
int pg_cuda_model_step_end(pg_cuda_model *m, pg_cuda_sample_out *out);

// For tests: the logits of the last step's sampled rows as f32,
// out[n][vocab] for n <= that step's n_sample.
int pg_cuda_model_last_logits(pg_cuda_model *m, float *out, int32_t n);

#ifdef __cplusplus
}
#endif
