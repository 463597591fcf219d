// engine/model/model.h - the model: its config, its weights as backend
// handles, and its forward, on any backend.
//
// Llama 2/3/3.1, Mistral, Qwen2/2.5 (QKV bias) and Qwen3 (per-head q/k
// RMSNorm) are one family (engine/model/llama.c), Mixtral and Qwen3-MoE
// another (engine/model/moe.c); each is one layer loop over the shared
// helpers of engine/model/layers.h, selected by the config
// (engine/model/family.h). Weights are backend handles (kernels/backend.h)
// made once at load from a GGUF file, a Hugging Face directory or random
// values; the forward enqueues fused ops on the backend: the CPU and CUDA
// backends run the same code.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/model/model_config.h"
#include "kernels/backend.h"
#include "kernels/comm/comm.h"

typedef struct pg_model_layer {
    pg_bweight *attn_norm; // [hidden]
    pg_bweight *qkv;       // [(n_heads + 2 n_kv_heads) head_dim][hidden]: Q rows, then K, then V
    pg_bweight *qkv_bias;  // [(n_heads + 2 n_kv_heads) head_dim] (Qwen2), else NULL
    pg_bweight *q_norm;    // [head_dim] per-head RMSNorm of q (Qwen3), else NULL
    pg_bweight *k_norm;    // [head_dim] per-head RMSNorm of k (Qwen3), else NULL
    pg_bweight *o;         // [hidden][n_heads head_dim]
    pg_bweight *ffn_norm;  // [hidden] (Gemma: pre_feedforward_layernorm)
    pg_bweight *post_attn_norm; // [hidden] Gemma: the attention output's norm before the residual add
    pg_bweight *post_ffn_norm;  // [hidden] Gemma: the MLP output's norm before the residual add
    pg_bweight *gate_up;   // [2 ffn][hidden]: gate rows, then up
    pg_bweight *down;      // [hidden][ffn]
    // A mixture-of-experts layer (pg_config_layer_is_moe) has these instead
    // of gate_up and down: the router, whole on every rank, and every
    // expert's slice of this rank's columns; under expert parallelism the
    // rank's experts whole and NULL for the others (moe_ffn skips them).
    pg_bweight *router;    // [n_experts][hidden]
    pg_bweight **exp_gate_up; // [n_experts], each [2 moe_ffn][hidden]: gate rows, then up
    pg_bweight **exp_down;    // [n_experts], each [hidden][moe_ffn]
} pg_model_layer;

// This rank's part of the model under tensor parallelism (Megatron-style,
// docs/tensor_parallel.md): query heads, FFN columns and vocabulary rows
// split evenly; KV heads split, or replicated (one per rank) when the model
// has fewer KV heads than ranks. Without tensor parallelism: rank 0 of 1,
// everything whole.
typedef struct pg_model_shard {
    int32_t rank, size;
    int32_t n_heads, n_kv_heads; // this rank's query and KV heads
    int32_t head0, kv_head0;     // the model's first query / KV head this rank holds
    int32_t ffn, ffn0;           // FFN columns [ffn0, ffn0 + ffn)
    int32_t moe_ffn, moe_ffn0;   // every expert's columns [moe_ffn0, moe_ffn0 + moe_ffn) (EP: all)
    int32_t exp0, n_exp;         // the experts held [exp0, exp0 + n_exp) (without EP: all)
    bool expert_parallel;        // --enable-expert-parallel on a model with experts: whole
                                 //   experts per rank, not column slices (docs/moe.md)
    bool moe_alltoall;           // --all2all-backend alltoall: expert parallelism's shares
                                 //   combined by all-to-all (engine/model/moe_a2a.c)
    int32_t vocab, vocab0;       // vocabulary rows [vocab0, vocab0 + vocab)
    bool comm;                   // the forward's collectives run (size > 1, or a
                                 //   communicator named for one rank)
} pg_model_shard;

// The shard of rank `rank` of `size`; PG_EINVAL naming the numbers when the
// model cannot be split so (heads, KV heads, FFN, experts or vocabulary not
// divisible). expert_parallel: a model's experts split whole across the
// ranks instead of by columns; ignored for a model without experts (as
// vLLM does; shard.expert_parallel then stays false).
int pg_model_shard_plan(const pg_model_config *c, int32_t rank, int32_t size, bool expert_parallel,
                        pg_model_shard *out);
// Columns [c0, c0 + n) of w (a row-parallel share; LoRA's A): a view for a vector,
// else the rows copied into *copy (the caller frees it; NULL if none); the shape only
// without data. Off a block boundary: PG_EINVAL, worded to follow the tensor's name.
int pg_model_slice_cols(pg_weight *w, int64_t c0, int64_t n, void **copy);
// Undoes llama.cpp's Q/K row interleaving head by head (its GGUF converter
// permutes a "llama" model's q and k rows, and a LoRA adapter's lora_b rows
// of them, for GGML's rope): returns a malloc'd copy of w's rows in Hugging
// Face's order, w->data pointed at it; the caller owns the copy.
void *pg_model_unpermute_rows(pg_weight *w, int32_t n_heads);

// --cpu-offload-gb (engine/model/model_offload.c): the first n_layers layers'
// weights live in host memory (pinned on the GPU) and are copied into one
// of two device slots before they run, layer l into slot l % 2, the next
// layer's copy running beside the current layer's compute (double
// buffering). Every offloaded weight always reads at the same slot address,
// so captured graphs replay the copies with the rest.
typedef struct pg_model_offload {
    int32_t n_layers;     // layers [0, n_layers) are offloaded; 0: none
    void *slot[2];        // backend memory of slot_bytes each (slot[1] NULL for one layer)
    size_t slot_bytes;
    int64_t slots_bytes;  // both slots: the device memory offload takes (in weight_bytes)
    void **host;          // [n_layers] each layer's weights, packed in the slot layout
    size_t *bytes;        // [n_layers] bytes of host[l]
    int64_t host_bytes;   // the host copies in total
    double h2d_gbps;      // host-to-device copy rate measured at load (0: not measured)
} pg_model_offload;

// LoRA adapters served beside the base model (engine/model/lora.c,
// docs/lora.md): n_slots slots, slot i serving the plan's lora_id i + 1,
// each adapter's pairs uploaded as this rank's slices (column-parallel
// projections: B's rows; row-parallel ones: A's columns), in one table per
// (layer, module) as kernels/backend.h lora_apply takes it. Slots are
// filled at load (pg_model_load_opts.lora_dirs) or later
// (pg_model_lora_set: vLLM's runtime loading).
#define PG_LORA_MODULES 7 // q, k, v, o, gate, up, down (engine/model/lora_adapter.h)
#define PG_MODEL_LORA_RANK_CAP 64 // pg_model_load_opts.max_lora_rank 0's
struct pg_lora_slot_res;
typedef struct pg_model_lora {
    int32_t n_slots;      // slots (loaded or empty); 0: no LoRA
    int32_t max_rank;     // the largest rank a slot may take (the workspace is sized for it)
    pg_lora_slot *table;  // [n_layers][PG_LORA_MODULES][n_slots]; .a NULL: the slot leaves the module alone
    struct pg_lora_slot_res *res; // [n_slots] what each slot holds (lora.c)
    // The same table in backend memory, in the form lora_apply_dev reads
    // (rewritten whole whenever a slot changes), where the backend has that
    // op (CUDA: the decode graphs' LoRA); NULL elsewhere.
    pg_lora_dev_slot *dev_table;
} pg_model_lora;

// Layer l's table for module `module` (PG_LORA_MODULES of them), n_slots entries.
static inline const pg_lora_slot *pg_model_lora_slots(const pg_model_lora *lo, int32_t l, int module) {
    return lo->table + ((size_t)l * PG_LORA_MODULES + (size_t)module) * (size_t)lo->n_slots;
}

// The same in the backend's table.
static inline const pg_lora_dev_slot *pg_model_lora_dev_slots(const pg_model_lora *lo, int32_t l, int module) {
    return lo->dev_table + ((size_t)l * PG_LORA_MODULES + (size_t)module) * (size_t)lo->n_slots;
}

struct pg_model;
struct pg_model_load_opts;
// Loads o's adapters into m->lora, each rank its share (pg_model_load calls
// it last); errors name the adapter's file. Frees them (pg_model_free).
int pg_model_lora_load(struct pg_model *m, const struct pg_model_load_opts *o);
void pg_model_lora_free(struct pg_model *m);
// Fills slot `slot` with the adapter in `dir` (NULL: empties it), replacing
// what it held; errors name the adapter's file and leave the slot empty.
// Only between steps: no step in flight may use the slot.
int pg_model_lora_set(struct pg_model *m, int32_t slot, const char *dir);
// The widest input or output of a LoRA projection on shard sh (hidden, its q
// >= its k, v, or its FFN): the runner's and `paged plan`'s lora_apply workspace.
static inline int32_t pg_model_lora_width(const pg_model_config *c, const pg_model_shard *sh) {
    const int32_t H = c->hidden, q = sh->n_heads * c->head_dim, f = sh->ffn;
    return H > q ? (H > f ? H : f) : (q > f ? q : f);
}

typedef struct pg_model {
    pg_model_config cfg;
    const struct pg_model_family *family; // its layers' builder (engine/model/family.h)
    int32_t attn_window;     // pg_model_attn_window: the Llama family's sliding window (0: none)
    pg_model_shard shard;
    pg_comm *comm;           // borrowed; NULL without tensor parallelism
    pg_backend *be;          // borrowed: outlives the model
    pg_bweight *tok_emb;     // [vocab][hidden]
    pg_bweight *lm_head;     // [vocab][hidden]; the same handle as tok_emb when tied
    pg_bweight *final_norm;  // [hidden]
    pg_bweight *inv_freq;    // [head_dim / 2] rotary inverse frequencies (f32 values)
    pg_bweight *inv_freq_local; // the same for Gemma's local layers (rope_local_theta), else NULL
    pg_model_layer *layers;  // [n_layers]
    int64_t weight_bytes;    // backend memory of every weight (offload: resident ones and the slots)
    pg_model_offload offload;
    char format[64];         // how the weights were stored: "gguf q4_1", "safetensors bf16", "dummy"
    int32_t quantization;    // PG_QUANT_* applied at load (PG_QUANT_NONE: as stored)
    int32_t layer_dtype;     // the type layer 0's Q|K|V runs in (after quantization)
    int32_t layer_dtypes[4]; // layer 0's Q|K|V, O, gate|up, down types (int4: g128 or g64 by shape)
    int64_t layer_bytes[4];  // one layer's Q|K|V, O, gate|up, down in backend memory (rank's shard)
    pg_model_lora lora;      // LoRA adapters (n_slots 0: none)
    struct pg_moe_a2a *moe_a2a; // the all-to-all combine's host buffers (shard.moe_alltoall; else NULL)
    // fp8 KV: the checkpoint's K and V scales per layer, host [n_layers][2]
    // (one value per tensor, as vLLM's k_scale / v_scale); NULL when the
    // checkpoint has none (the runner then calibrates: engine/runner/runner_kv_scales.c).
    float *kv_scales;
    // What the backend may point into (weights_borrow): the mapped file(s)
    // and the host copies the loader made (re-ordered GGUF Q/K rows).
    void *source;
    void (*source_close)(void *);
    void **owned;
    int n_owned, cap_owned;
} pg_model;

typedef struct pg_model_load_opts {
    const char *path;       // GGUF file or Hugging Face directory (unused for dummy)
    bool dummy;             // random weights (N(0, dummy_std^2), norms 1) of the shape in hf_config
    const char *hf_config;  // config.json (file or directory) for dummy weights
    uint64_t dummy_seed;
    float dummy_std;        // 0 = 0.02
    // Tensor parallelism: this rank's shard is read (only its slices of each
    // tensor), and the forward's collectives go through comm (borrowed;
    // comm->size ranks, this one comm->rank). NULL: the whole model.
    pg_comm *comm;
    // Online quantization of the layers' matrices (PG_QUANT_*; engine/model/model_quant.c).
    int32_t quantization;
    // --cpu-offload-gb: layers from the first on move to host memory as they
    // load until at least this many bytes of weights have (vLLM's rule);
    // 0: none. Per rank under tensor parallelism.
    int64_t cpu_offload_bytes;
    // LoRA adapters (PEFT directories) loaded beside the model, slot i for
    // lora_dirs[i]; ranks above max_lora_rank are refused (0: PG_MODEL_LORA_RANK_CAP, for
    // tools that load directly; the engine always passes --max-lora-rank's, engine/engine.h).
    const char *const *lora_dirs;
    int32_t n_lora;
    int32_t lora_slots;     // slots in all (>= n_lora; the rest start empty); 0: n_lora
    int32_t max_lora_rank;
    // --enable-expert-parallel: under tensor parallelism each rank holds
    // (and reads) only its block of whole experts (pg_model_shard_plan).
    bool expert_parallel;
    // --all2all-backend alltoall: with expert_parallel, each row's expert
    // shares go only to the rank that owns the row, by all-to-all, instead
    // of the all-reduce of every row (docs/moe.md); the cpu and tcp
    // communicators only (host memory). Refused without expert_parallel.
    bool moe_alltoall;
} pg_model_load_opts;

// --quantization (vLLM's flag): the layers' linear weights quantized at
// load from their stored type. fp8: e4m3 with per-row scales (W8A8 on the
// CPU's quant numerics); int4: group 128 with scales and zero points
// (weight-only). Formats: kernels/dtype.h, docs/quantization.md.
enum { PG_QUANT_NONE = 0, PG_QUANT_FP8 = 1, PG_QUANT_INT4 = 2,
       // Not flags: the quality comparison's reference and GGUF types made
       // the same way (tests/tools/quant_quality.c).
       PG_QUANT_BF16 = 3, PG_QUANT_Q8_0 = 4, PG_QUANT_Q4_0 = 5,
       // Pre-quantized int4 checkpoints, repacked at load into INT4_G128 /
       // _G64 (engine/model/int4_ckpt.c): inferred from config.json, and accepted
       // as flags that must then match it.
       PG_QUANT_AWQ = 6, PG_QUANT_GPTQ = 7 };
// "none", "fp8", "int4", "awq", "gptq"; "unknown" otherwise.
const char *pg_quantization_name(int q);
// Parses one of those names; PG_EINVAL naming the choices otherwise.
int pg_quantization_parse(const char *s, int *out);
// True for awq and gptq: the checkpoint's format, not a quantization made at load.
static inline bool pg_quantization_is_checkpoint(int q) { return q == PG_QUANT_AWQ || q == PG_QUANT_GPTQ; }
// The weight type of a quantization (PG_DTYPE_FP8_E4M3, _INT4_G128); -1 for none.
int pg_quantization_dtype(int q);
// Bytes of a rows x cols matrix quantized so (scales included); -1 for none.
int64_t pg_quantized_bytes(int q, int64_t rows, int64_t cols);
// Replaces *w by its quantization (its data dequantized row by row first):
// new memory in *data_out and *scales_out (NULL when the type has no row
// scales, or when w already is in that type and is left as it is), which
// the caller owns. PG_EINVAL for a shape the format cannot hold (int4:
// columns not a multiple of 128), PG_EUNSUPP for an FP8 source.
int pg_quantize_weight(int q, const char *name, pg_weight *w, void **data_out, float **scales_out);

// Reads the config and makes every weight on `be` (which must outlive the
// model). Errors name the file and the reason: a missing tensor, a shape
// that disagrees with the config, a type the backend cannot hold.
int pg_model_load(const pg_model_load_opts *o, pg_backend *be, pg_model **out);


// The sliding window a Llama-family model's attention runs with on a
// backend of `caps` (Mistral's and Mixtral's sliding_window where the
// backend's attention takes a window; 0: none). A model with a
// sliding_window the attention does not run is capped to it instead (its
// max model length: engine/setup.c, engine/memplan.c).
int32_t pg_model_attn_window(const pg_model_config *c, const pg_backend_caps *caps);

// KV layer groups (docs/kv_layer_groups.md; vLLM's hybrid KV cache
// manager). Layers that attend over different spans keep different block
// tables: the full-attention layers one per group of n_slots layers, the
// sliding-window layers (Gemma 3's local layers, Mistral's) one per group
// whose blocks fall out of the window and are freed. Every group takes its
// blocks from the one pool, and a block holds n_slots layers' K and V:
// layer l's KV tensor is slot[l], shared with the layers of the same slot
// in the other groups, whose blocks are never the same ones. One group of
// every layer with no window is the plain cache (slot[l] = l).
#define PG_MAX_KV_GROUPS 16 // = KVP_MAX_GROUPS (kvpool/kvpool.h)
struct pg_kv_layout {
    int32_t n_groups;                  // block tables per sequence (>= 1)
    int32_t n_slots;                   // KV tensors: the layers one block holds
    int32_t window[PG_MAX_KV_GROUPS];  // group g's window (0: every earlier key)
    int32_t n_layers;
    int16_t group[PG_MAX_LAYERS];      // layer l's group
    int16_t slot[PG_MAX_LAYERS];       // layer l's KV tensor
};
typedef struct pg_kv_layout pg_kv_layout;

// The layout of config `c`: with `groups` (the attention runs windows:
// backend caps attn_window) and a layer with a window, the layer types
// (window 0 first, then each window) cut into groups of the smallest
// type's layer count (raised until at most PG_MAX_KV_GROUPS groups);
// otherwise the plain one group, window 0.
void pg_kv_layout_make(const pg_model_config *c, bool groups, pg_kv_layout *out);
// The window a layer of `c` attends over when the attention runs windows
// (Gemma 3's local layers: swa_window; Mistral's and Mixtral's every layer:
// sliding_window; else 0).
int32_t pg_config_layer_window(const pg_model_config *c, int32_t l);

// The bytes of rank `rank` of `size`'s weights on a backend of `caps`
// (kernels/backend.h: what it runs as stored, what it converts the rest
// to, its vector type; random weights are bf16), and the
// model's config, read from the headers only (the GGUF tensor table, the
// safetensors headers, config.json): the loader's table, names, shape
// checks and tensor-parallel slicing, without touching a weight. The
// loader's errors (a missing tensor, a shape, a split off a block boundary).
// With o->cpu_offload_bytes, *bytes is what stays on the device (the
// resident weights and the slots) and *off (when not NULL) what moves.
// *quant_max_elems (when not NULL): the elements of the largest (fused)
// matrix that stays quantized (FP8, int4), for the CUDA backend's bf16
// dequantize scratch of large batches; 0 for none.
typedef struct pg_offload_plan {
    int32_t n_layers;   // layers offloaded
    int64_t host_bytes; // their host copies (the slot layout: 256-byte aligned weights)
    int64_t slot_bytes; // one device slot (the largest of those layers)
    int32_t n_slots;    // 2, or 1 for one layer, 0 for none
} pg_offload_plan;
int pg_model_weight_plan(const pg_model_load_opts *o, int32_t rank, int32_t size, const pg_backend_caps *caps,
                         pg_model_config *cfg, int64_t *bytes, pg_offload_plan *off, int64_t *quant_max_elems);
void pg_model_free(pg_model *m);
// The config of o's model and the stored type of its layer 0's Q
// projection (else of its token embedding; -1 for dummy weights or none),
// from the headers only, as pg_model_load reads them (its errors: a missing
// file, --quantization against the checkpoint's): what the nodes of a
// multi-node group compare (engine/dist/node_config.h).
int pg_model_identity(const pg_model_load_opts *o, pg_model_config *cfg, int32_t *weight_dtype);

// The weights of layer L in a fixed order (norms, Q|K|V, bias, q/k norms, O,
// FFN norm, gate|up, down, Gemma's post-norms), those it has; returns how
// many (at most PG_LAYER_WEIGHTS_MAX).
#define PG_LAYER_WEIGHTS_MAX 11
int pg_model_layer_weights(const pg_model_layer *L, pg_bweight **out);
// The same and then a mixture-of-experts layer's router and its experts'
// gate|up and down (those this rank holds, by expert id), in a new array
// (*out, freed by the caller); returns how many.
int pg_model_layer_all_weights(const pg_model_layer *L, int32_t n_experts, pg_bweight ***out);
// Offload (engine/model/model_offload.c), for the loader: layer l (the next one
// after those offloaded so far) moves to host memory; then, once every
// layer has loaded, finish allocates the slots, points the offloaded
// weights at them and measures the copy rate (logged).
int pg_model_offload_layer(pg_model *m, int32_t l);
int pg_model_offload_finish(pg_model *m);
// Frees the slots and the host copies (pg_model_free calls it).
void pg_model_offload_free(pg_model *m);
// For the forward: starts the copy of offloaded layer l into its slot
// (nothing when l is not offloaded), and makes the compute work queued
// next wait for it.
int pg_model_offload_prefetch(const pg_model *m, int32_t l);
int pg_model_offload_wait(const pg_model *m, int32_t l);

// The activation buffers of one step, views of the runner's workspace for
// the step's rows (n tokens, s sampled rows); any row count up to the
// capacity they were carved for.
typedef struct pg_fwd_buffers {
    pg_tensor x;      // [n][hidden] the residual stream
    pg_tensor xn;     // [n][hidden] normalised rows / a product before the residual add
    pg_tensor qkv;    // [n][(n_heads + 2 n_kv) head_dim]
    pg_tensor attn;   // [n][n_heads head_dim]
    pg_tensor gu;     // [n][2 ffn]
    pg_tensor h;      // [n][ffn]
    pg_tensor lg_in;  // [s][hidden] the sampled rows' last hidden states
    pg_tensor logits; // [s][vocab] (stride: vocab rounded up to 8)
    // Tensor parallelism (shard.size > 1): this rank's vocabulary slice of
    // the logits [s][shard vocab], and every rank's, gathered [size][s][shard
    // vocab] before they are put side by side in `logits`.
    pg_tensor lg_part;
    void *lg_all;
    pg_argmax *cand; // [size][s]: every rank's row maxima (engine/runner/sampler.c)
    pg_argmax *topk; // [size][s][PG_TOPK_EXCHANGE_MAX]: every rank's best entries (engine/runner/sampler.c)
    // The backend's moe_ffn workspace for n rows (MoE models; else NULL, 0).
    void *moe_ws;
    size_t moe_ws_bytes;
    // The backend's lora_apply workspace for n rows (adapters loaded; else NULL, 0).
    void *lora_ws;
    size_t lora_ws_bytes;
    // fp8 KV scales in backend memory, [n_layers][2][shard n_kv_heads] (K's
    // then V's of each layer): layer l's shape gets kv_scales + 2 l n_kv
    // (pg_kv_shape.scales). NULL: 1.0.
    const float *kv_scales;
    // Calibration (engine/runner/runner_kv_scales.c): when set, the forward reads
    // back each layer's rotated K and V and raises kv_amax, host
    // [n_layers][2][shard n_kv_heads], to their largest |x| per KV head.
    float *kv_amax;
} pg_fwd_buffers;

// One step's inputs in backend memory (the runner uploads them).
typedef struct pg_fwd_step {
    int32_t n_tokens;
    const int32_t *tokens, *pos, *slots; // [n_tokens]; slot = block * block_size + offset (< 0: none)
    pg_attn_batch attn;
    int32_t n_logits;
    const int32_t *logit_rows; // [n_logits] rows whose next-token logits are wanted
    // LoRA: host [n_tokens] each row's adapter slot (-1: none); NULL when
    // no row of the step has one (the forward is then the plain one).
    const int32_t *lora_rows;
    // The same rows in backend memory when the runner uploaded them (a
    // decode graph's step, engine/runner/runner_graphs.c): the forward then
    // runs the graph-safe op (lora_apply_dev) over the model's backend
    // table. NULL: lora_apply over the host rows.
    const int32_t *lora_rows_dev;
    // With lora_rows_dev, 0 < lora_dev_rows < n_tokens splits the step: rows
    // [0, lora_dev_rows) (an eager step's decode rows) take lora_apply_dev,
    // the rest lora_apply over the host rows (its long runs of one adapter
    // through the backend's dense products). 0: every row the graph-safe op.
    int32_t lora_dev_rows;
    // KV layer groups (pg_kv_layout, above): slots and attn.block_tables
    // hold a copy per group, [n_groups][n_tokens] and
    // [n_groups][n_seqs][bt_stride]; layer l uses group group[l]'s and the
    // KV tensor slot[l]. NULL: one group, layer l's tensor l.
    const struct pg_kv_layout *kv_layout;
} pg_fwd_step;

// The embedding and every layer for the step's rows (what a decode graph
// captures): writes the KV cache of the step's slots and leaves the
// residual stream in bufs->x. Enqueued on the backend. Under tensor
// parallelism each rank runs its shard and the residual stream is summed
// across ranks after the embedding and after each row-parallel product, so
// every rank holds the same bufs->x.
int pg_model_forward_layers(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs,
                            const pg_fwd_step *s);
// The logit rows: gather, final norm, LM head into bufs->logits (under
// tensor parallelism each rank's vocabulary slice, gathered so that every
// rank holds every logit and samples the same token).
int pg_model_forward_logits(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s);
// The sampled rows' logits over this rank's vocabulary slice: gather, final
// norm and the LM head's rows [vocab0, vocab0 + vocab) into bufs->lg_part,
// *part its contiguous [n_logits][shard vocab] view. What the tensor-parallel
// exchanges of the sampler (engine/runner/sampler.h) start from.
int pg_model_head_slice(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_tensor *part);
