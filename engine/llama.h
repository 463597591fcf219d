// engine/llama.h - the Llama-family model: weights, paged KV cache, forward.
//
// The forward pass takes a flattened batch of tokens from several sequences
// (prefill chunks and decode tokens mixed) and runs every op through the
// backend table of kernels/kernels.h, so the CPU and CUDA backends share it.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/model_config.h"
#include "kernels/kernels.h"

// A linear layer whose output features may come from up to three stored
// matrices concatenated along the output dimension (Q|K|V, gate|up): the
// loader fuses them into one part where the storage allows it.
typedef struct pg_linear {
    int n_parts;
    pg_weight parts[3];
    int64_t out_features;   // sum of parts[i].rows
} pg_linear;

typedef struct pg_llama_layer {
    const float *attn_norm; // [hidden]
    const float *ffn_norm;  // [hidden]
    pg_linear qkv;          // [(n_heads + 2 n_kv_heads) head_dim][hidden]
    pg_linear o;            // [hidden][n_heads head_dim]
    pg_linear gate_up;      // [2 ffn][hidden]
    pg_linear down;         // [hidden][ffn]
} pg_llama_layer;

typedef struct pg_llama {
    pg_model_config cfg;
    pg_weight tok_emb;      // [vocab][hidden]
    pg_weight lm_head;      // [vocab][hidden]; the same data as tok_emb when tied
    const float *final_norm;// [hidden]
    pg_llama_layer *layers; // [n_layers]
    float *inv_freq;        // [head_dim / 2] rotary inverse frequencies
    // Everything the loader allocated (converted or re-ordered weights), freed with the model.
    void **owned;
    int n_owned, cap_owned;
    void *source;           // the mapped file(s) the weights point into
    void (*source_close)(void *);
    size_t weight_bytes;    // bytes of weight storage used by the forward
} pg_llama;

// The paged KV cache: per layer one K and one V tensor of
// [n_blocks][block_size][n_kv_heads][head_dim] f32.
typedef struct pg_kv_cache {
    pg_kv_shape shape;
    int32_t n_layers;
    float **k, **v;         // [n_layers] -> [n_blocks * block_size * n_kv_heads * head_dim]
} pg_kv_cache;

// Loads a GGUF file or a Hugging Face directory (config.json +
// model.safetensors[.index.json]); weights stay in the mapping where their
// type allows. Errors name the file and the reason.
int pg_llama_load(const char *path, pg_llama **out);
void pg_llama_free(pg_llama *m);

int pg_kv_cache_create(const pg_model_config *c, int32_t n_blocks, int32_t block_size,
                       pg_kv_cache **out);
void pg_kv_cache_free(pg_kv_cache *kv);
size_t pg_kv_cache_bytes_per_block(const pg_model_config *c, int32_t block_size);

// One forward step. Tokens of all sequences are flattened; seqs[i] says
// which rows belong to sequence i and where its cache blocks are.
typedef struct pg_fwd_batch {
    int32_t n_tokens;
    const int32_t *tokens;  // [n_tokens]
    const int32_t *pos;     // [n_tokens] absolute positions
    const int32_t *slots;   // [n_tokens] cache slot = block * block_size + offset
    int32_t n_seqs;
    const pg_attn_seq *seqs;// [n_seqs]
    int32_t n_logits;
    const int32_t *logit_rows; // [n_logits] rows whose logits are computed
} pg_fwd_batch;

// Activation buffers, grown on demand and reused across steps.
typedef struct pg_fwd_workspace {
    int32_t cap_tokens, cap_logits;
    float *x, *xn, *qkv, *q, *k, *v, *gate_up, *h, *logits_in;
} pg_fwd_workspace;

void pg_fwd_workspace_free(pg_fwd_workspace *ws);

// Runs the batch and writes logits[n_logits][vocab].
int pg_llama_forward(const pg_llama *m, pg_backend *be, pg_kv_cache *kv, pg_fwd_workspace *ws,
                     const pg_fwd_batch *batch, float *logits);
