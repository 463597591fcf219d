// engine/model/model_config.h - the architecture of a Llama-family model.
//
// Filled from GGUF metadata (llama.* keys) or a Hugging Face config.json
// (plus generation_config.json); everything the forward pass and the memory
// planner need to know about shapes lives here.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

struct gguf_file;

#define PG_MAX_EOS_IDS 8
#define PG_MAX_LAYERS 1024 // pg_config_validate's bound

typedef enum { PG_ROPE_SCALING_NONE = 0, PG_ROPE_SCALING_LLAMA3 = 1, PG_ROPE_SCALING_LINEAR = 2 } pg_rope_scaling;

typedef struct pg_model_config {
    char arch[32];          // "llama", "mistral", "qwen2", "qwen3" (engine/model/llama.c); "mixtral",
                            //   "qwen3moe" (engine/model/moe.c; a GGUF Mixtral is "llama" with experts);
                            //   "gemma2", "gemma3" (engine/model/gemma.c)
    char name[128];         // for logs and /v1/models
    int32_t vocab_size;
    int32_t hidden;         // model dimension
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t ffn;            // intermediate size of the MLP
    int32_t max_pos;        // max_position_embeddings / context_length
    float rms_eps;
    float rope_theta;
    int32_t rope_dim;       // rotated dimensions (= head_dim for Llama)
    pg_rope_scaling rope_scaling;
    float rope_factor;
    float rope_low_freq_factor, rope_high_freq_factor;
    int32_t rope_orig_max_pos;
    bool tie_embeddings;    // LM head shares the token embedding
    bool qkv_bias;          // Q, K and V projections have biases (Qwen2, Llama attention_bias)
    bool qk_norm;           // per-head RMSNorm of q and k before RoPE (Qwen3)
    // Mixture of experts (Mixtral, Qwen3-MoE; docs/moe.md); n_experts 0: dense.
    // Layer l's FFN is the experts' when pg_config_layer_is_moe(c, l), else
    // the dense SwiGLU of width ffn.
    int32_t n_experts;      // experts per MoE layer (num_local_experts / num_experts)
    int32_t n_experts_used; // top-k (num_experts_per_tok)
    int32_t moe_ffn;        // one expert's intermediate size (Mixtral: intermediate_size)
    int32_t moe_step;       // every moe_step-th layer is MoE (Qwen3-MoE decoder_sparse_step; 1)
    // Qwen3-MoE's mlp_only_layers: bit l set, layer l keeps the dense SwiGLU
    // whatever moe_step says (pg_config_layer_is_moe); has_mlp_only: any set.
    uint8_t mlp_only[PG_MAX_LAYERS / 8];
    bool has_mlp_only;
    bool moe_renorm;        // top-k weights renormalised to sum 1 (Mixtral: always; Qwen3-MoE: norm_topk_prob)
    int32_t sliding_window; // Mistral's attention window (0 = none); max model length is capped to it
    // Gemma 3 (engine/model/gemma.c; docs/gemma3.md): local layers attend
    // within a window of swa_window positions with RoPE base
    // rope_local_theta (no scaling); the others (global) over the whole
    // context with rope_theta and its scaling.
    int32_t swa_window;     // the local layers' window; 0: no local layers
    uint8_t swa_layers[PG_MAX_LAYERS / 8]; // bit l set: layer l is local (pg_config_layer_is_local)
    float rope_local_theta;
    float attn_scalar;      // attention scale attn_scalar^-0.5 (query_pre_attn_scalar); 0: head_dim
    // Gemma 2's soft-capping: s -> cap * tanh(s / cap) of every attention
    // score (after the scale) and of every final logit; 0: none.
    float attn_softcap, final_softcap;
    float embed_scale;      // the embedding multiplied by it (Gemma: sqrt(hidden)); 0: none
    float norm_add;         // added to every stored RMSNorm weight at load: Gemma's Hugging Face
                            //   weights w mean x * (1 + w) (llama.cpp's GGUF stores 1 + w: 0)
    int32_t bos_id;         // -1 when none
    int32_t n_eos;
    int32_t eos_ids[PG_MAX_EOS_IDS];
    // Generation defaults (generation_config.json), 0/neg when unset.
    float default_temperature, default_top_p;
    int32_t default_top_k;
    // A pre-quantized int4 checkpoint (config.json's quantization_config,
    // engine/model/int4_ckpt.c): PG_QUANT_AWQ or PG_QUANT_GPTQ (engine/model/model.h),
    // PG_QUANT_NONE otherwise; its group size (128 or 64); and what is added
    // to each stored zero (1 for GPTQ's v1 format, which stores z - 1).
    int32_t ckpt_quant, ckpt_group, ckpt_zero_offset;
} pg_model_config;

int pg_config_from_gguf(const struct gguf_file *f, pg_model_config *c);
// `dir` holds config.json and optionally generation_config.json.
int pg_config_from_hf_dir(const char *dir, pg_model_config *c);
// The same from a config.json file anywhere (no generation_config.json);
// the model is named after the file (without ".json").
int pg_config_from_hf_file(const char *config_path, pg_model_config *c);
// Checks shapes are consistent (heads divide hidden, GQA ratio integral...).
int pg_config_validate(const pg_model_config *c);
// Whether layer l's feed-forward is a mixture of experts.
static inline bool pg_config_layer_is_moe(const pg_model_config *c, int32_t l) {
    return c->n_experts > 0 && (l + 1) % c->moe_step == 0 && !(c->mlp_only[l / 8] >> (l % 8) & 1);
}
// Whether some layer of a mixture-of-experts model has the dense FFN.
static inline bool pg_config_has_dense_ffn(const pg_model_config *c) {
    return c->n_experts <= 0 || c->moe_step > 1 || c->has_mlp_only;
}
// Gemma 2 and 3 (engine/model/gemma.c): four norms a layer, GeGLU, the
// embedding scaled, local and global layers.
static inline bool pg_config_is_gemma(const pg_model_config *c) {
    return !strcmp(c->arch, "gemma2") || !strcmp(c->arch, "gemma3");
}
// Whether layer l is a sliding-window (local) layer (Gemma 3).
static inline bool pg_config_layer_is_local(const pg_model_config *c, int32_t l) {
    return c->swa_window > 0 && (c->swa_layers[l / 8] >> (l % 8) & 1);
}
// Marks layer l local (every pattern-th layer global, the rest local:
// pattern 6 for Gemma 3's GGUF files and older configs).
static inline void pg_config_set_local(pg_model_config *c, int32_t l, bool local) {
    if (local) c->swa_layers[l / 8] |= (uint8_t)(1u << (l % 8));
    else c->swa_layers[l / 8] &= (uint8_t)~(1u << (l % 8));
}
// Parameters per token: every weight (total) and those one token reads
// (active: the dense ones and n_experts_used of each MoE layer's experts).
void pg_config_params(const pg_model_config *c, int64_t *total, int64_t *active);
// Fills inv_freq[rope_dim / 2] with the rotary inverse frequencies,
// including Llama-3 frequency scaling when configured.
void pg_config_rope_inv_freq(const pg_model_config *c, float *inv_freq);
// The same for Gemma's local layers: base rope_local_theta, unscaled.
void pg_config_rope_inv_freq_local(const pg_model_config *c, float *inv_freq);
