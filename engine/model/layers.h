// engine/model/layers.h - the shared layer helpers every model family's
// builder is written in (llama.cpp's build_norm / build_attn / build_ffn
// idea): each is one block of a transformer layer at the fused granularity
// of kernels/backend.h, and tensor parallelism lives here, in the helpers,
// as vLLM keeps it in its parallel linear layers (column-parallel products
// need nothing; a row-parallel product adds its part to the residual
// stream on rank 0 only and all-reduces; the vocabulary-parallel embedding
// all-reduces), never in a family's layer loop.
//
// A family (engine/model/family.h) is one file whose forward is a loop over
// these; a new family (Gemma's GeGLU and sliding windows, a mixture of
// experts) adds the helpers it needs here, beside these.
#pragma once
#include <stdint.h>

#include "engine/model/model.h"

// One step's activations, as views of the runner's buffers for its n rows;
// made once per step (pg_step_views_make) and shared by every layer.
typedef struct pg_step_views {
    int64_t n;        // tokens of the step
    pg_tensor x;      // [n][hidden] the residual stream
    pg_tensor xn;     // [n][hidden] scratch of the fused norms and products
    pg_tensor qkv;    // [n][(heads + 2 kv heads) head_dim] this rank's
    pg_tensor q, k, v; // column views of qkv
    pg_tensor attn;   // [n][heads head_dim]
    pg_tensor gu;     // [n][2 ffn] this rank's gate | up
    pg_tensor h;      // [n][ffn]
    void *moe_ws;     // the backend's moe_ffn workspace (MoE models), and its bytes
    size_t moe_ws_bytes;
    // LoRA (docs/lora.md): each row's adapter slot, host [n] (NULL: no row
    // has one, and every helper runs its plain fused form), and the
    // lora_apply workspace.
    const int32_t *lora_rows;
    const int32_t *lora_rows_dev; // the same in backend memory (graph steps): lora_apply_dev; else NULL
    // > 0: a split eager step (pg_fwd_step lora_dev_rows): rows [0,
    // lora_split) through lora_apply_dev, the rest through lora_apply, both
    // over the normed rows (no fused norm).
    int64_t lora_split;
    void *lora_ws;
    size_t lora_ws_bytes;
} pg_step_views;

void pg_step_views_make(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_step_views *v);

// The residual stream summed across ranks (each rank added its partial
// product; rank 0 also kept the stream): a no-op without tensor parallelism.
int pg_layer_all_reduce(const pg_model *m, pg_tensor x);

// Expert parallelism's combine by all-to-all (engine/model/moe_a2a.c): x +=
// the step's MoE output, each row's shares sent to the rank owning the row,
// then the rows back to every rank; bit for bit pg_layer_ffn_moe's result.
// init makes the model's (empty) buffers; free releases them.
int pg_layer_ffn_moe_alltoall(const pg_model *m, int32_t l, const pg_step_views *v);
int pg_moe_a2a_init(pg_model *m);
void pg_moe_a2a_free(pg_model *m);

// Vocabulary-parallel embedding: x = emb[tokens] from this rank's rows
// (zero for tokens outside them), summed across ranks.
int pg_layer_embed(const pg_model *m, pg_tensor x, const int32_t *tokens);

// Row-parallel product into the residual stream: x += in . w^T summed over
// the ranks' input slices (rank 0 keeps the stream, the others write their
// part over it, then the all-reduce).
int pg_layer_row_linear(const pg_model *m, pg_tensor x, pg_tensor in, const pg_bweight *w, pg_tensor scratch);

// How a family's attention block differs from Llama's (pg_layer_attention_with).
typedef struct pg_attn_opts {
    float scale;                 // the scores' scale (Llama: head_dim^-0.5)
    int32_t window;              // sliding window (kernels/backend.h attention); 0: none
    const pg_bweight *inv_freq;  // the RoPE frequencies (Gemma's local layers: their own)
    const pg_bweight *post_norm; // Gemma: x += RMSNorm(attn . Wo^T) * post_norm; NULL: x += attn . Wo^T
    float softcap;               // Gemma 2: scores soft-capped (backend attention_softcap); 0: none
    bool lc_gemma;               // Gemma: the KV shape's lc_gemma (kernels/kernels.h)
} pg_attn_opts;

// Row-parallel product, then a norm before the residual add (Gemma's
// post-norms): y = in . w^T summed across ranks into scratch, then
// x += RMSNorm(y) * norm on every rank. The norm needs the whole sum, so
// unlike pg_layer_row_linear the stream cannot ride along in the reduce.
int pg_layer_row_linear_norm(const pg_model *m, pg_tensor x, pg_tensor in, const pg_bweight *w,
                             const pg_bweight *norm, pg_tensor scratch);

// The attention block of layer l with pre-norm: qkv = RMSNorm(x) . Wqkv^T
// (+ bias; column-parallel: this rank's heads), per-head q/k RMSNorm when
// the layer has it, RoPE with the KV cache write, paged causal attention,
// and x += attn . Wo^T (row-parallel); with LoRA rows, each projection's
// adapters add their products (the norm then runs apart from the product,
// whose input the adapters read too). bufs carries the fp8 KV scales and
// the calibration's maxima (engine/runner/runner_kv_scales.c).
int pg_layer_attention(const pg_model *m, int32_t l, pg_bkv *kv, const pg_fwd_buffers *bufs,
                       const pg_fwd_step *s, const pg_step_views *v);
// The same with a family's scale, window, RoPE table and post-norm.
int pg_layer_attention_with(const pg_model *m, int32_t l, pg_bkv *kv, const pg_fwd_buffers *bufs,
                            const pg_fwd_step *s, const pg_step_views *v, const pg_attn_opts *o);

// The SwiGLU feed-forward block of layer l with pre-norm:
// h = silu(g) * u, [g | u] = RMSNorm(x) . Wgu^T (column-parallel), then
// x += h . Wdown^T (row-parallel); with LoRA rows the adapters of gate and
// up add theirs before the activation, down's after.
int pg_layer_ffn_swiglu(const pg_model *m, int32_t l, const pg_step_views *v);

// Gemma's GeGLU feed-forward block of layer l with pre- and post-norm:
// h = gelu_tanh(g) * u, [g | u] = RMSNorm(x) . Wgu^T (column-parallel),
// then x += RMSNorm(h . Wdown^T) * post_ffn_norm (pg_layer_row_linear_norm).
int pg_layer_ffn_geglu(const pg_model *m, int32_t l, const pg_step_views *v);

// The mixture-of-experts feed-forward block of layer l with pre-norm
// (kernels/backend.h moe_ffn): the router whole on every rank, so every
// rank picks the same experts; each rank runs its slice of every chosen
// expert's columns and adds its part to the stream as a row-parallel
// product does (rank 0 keeps the stream), then the all-reduce.
int pg_layer_ffn_moe(const pg_model *m, int32_t l, const pg_step_views *v);
