// engine/model.h - the one model definition of the Llama family, on any
// backend.
//
// Llama 2/3/3.1 (RoPE scaling), Mistral, Qwen2/2.5 (QKV bias) and Qwen3
// (per-head q/k RMSNorm) are one layer loop (engine/model.c) selected by
// config flags (engine/model_config.h). Weights are backend handles
// (kernels/backend.h) made once at load from a GGUF file, a Hugging Face
// directory or random values; the forward enqueues fused ops on the
// backend: the CPU and CUDA backends run the same code.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/model_config.h"
#include "kernels/backend.h"

typedef struct pg_model_layer {
    pg_bweight *attn_norm; // [hidden]
    pg_bweight *qkv;       // [(n_heads + 2 n_kv_heads) head_dim][hidden]: Q rows, then K, then V
    pg_bweight *qkv_bias;  // [(n_heads + 2 n_kv_heads) head_dim] (Qwen2), else NULL
    pg_bweight *q_norm;    // [head_dim] per-head RMSNorm of q (Qwen3), else NULL
    pg_bweight *k_norm;    // [head_dim] per-head RMSNorm of k (Qwen3), else NULL
    pg_bweight *o;         // [hidden][n_heads head_dim]
    pg_bweight *ffn_norm;  // [hidden]
    pg_bweight *gate_up;   // [2 ffn][hidden]: gate rows, then up
    pg_bweight *down;      // [hidden][ffn]
} pg_model_layer;

typedef struct pg_model {
    pg_model_config cfg;
    pg_backend *be;          // borrowed: outlives the model
    pg_bweight *tok_emb;     // [vocab][hidden]
    pg_bweight *lm_head;     // [vocab][hidden]; the same handle as tok_emb when tied
    pg_bweight *final_norm;  // [hidden]
    pg_bweight *inv_freq;    // [head_dim / 2] rotary inverse frequencies (f32 values)
    pg_model_layer *layers;  // [n_layers]
    int64_t weight_bytes;    // backend memory of every weight
    char format[64];         // how the weights were stored: "gguf q4_1", "safetensors bf16", "dummy"
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
} pg_model_load_opts;

// Reads the config and makes every weight on `be` (which must outlive the
// model). Errors name the file and the reason: a missing tensor, a shape
// that disagrees with the config, a type the backend cannot hold.
int pg_model_load(const pg_model_load_opts *o, pg_backend *be, pg_model **out);
void pg_model_free(pg_model *m);

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
} pg_fwd_buffers;

// One step's inputs in backend memory (the runner uploads them).
typedef struct pg_fwd_step {
    int32_t n_tokens;
    const int32_t *tokens, *pos, *slots; // [n_tokens]; slot = block * block_size + offset (< 0: none)
    pg_attn_batch attn;
    int32_t n_logits;
    const int32_t *logit_rows; // [n_logits] rows whose next-token logits are wanted
} pg_fwd_step;

// The embedding and every layer for the step's rows (what a decode graph
// captures): writes the KV cache of the step's slots and leaves the
// residual stream in bufs->x. Enqueued on the backend.
int pg_model_forward_layers(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs,
                            const pg_fwd_step *s);
// The logit rows: gather, final norm, LM head into bufs->logits.
int pg_model_forward_logits(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s);
