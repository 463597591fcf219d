// engine/model/layer_tensors.c - the table of a layer's stored tensors
// (engine/model/layer_tensors_int.h).
#include "engine/model/layer_tensors_int.h"

#include <stdio.h>
#include <string.h>

// NEED_GEMMA: Gemma's post-norms, and its name for the FFN's pre-norm
// (Hugging Face's post_attention_layernorm is Llama's FFN norm but Gemma's
// attention post-norm); NEED_NOT_GEMMA: every other family's.
typedef enum { NEED_ALWAYS, NEED_QKV_BIAS, NEED_QK_NORM, NEED_DENSE_FFN, NEED_MOE, NEED_GEMMA, NEED_NOT_GEMMA } need;

// One stored tensor of a layer: the weight it is part `part` of.
typedef struct {
    pg_lt_field field;
    int part;
    const char *gguf, *hf; // names with %d for the layer
    pg_lt_dim rows, cols;  // the stored shape, from the config
    need need;
    int unpermute;         // GGUF "llama": head count whose rows to re-order (1 = q, 2 = k)
} layer_tensor;

static const layer_tensor LAYER[] = {
    {F_ATTN_NORM, 0, "blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", DIM_ONE, DIM_HIDDEN, NEED_ALWAYS, 0},
    {F_QKV, 0, "blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", DIM_Q, DIM_HIDDEN, NEED_ALWAYS, 1},
    {F_QKV, 1, "blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", DIM_KV, DIM_HIDDEN, NEED_ALWAYS, 2},
    {F_QKV, 2, "blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", DIM_KV, DIM_HIDDEN, NEED_ALWAYS, 0},
    {F_QKV_BIAS, 0, "blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias", DIM_ONE, DIM_Q, NEED_QKV_BIAS, 0},
    {F_QKV_BIAS, 1, "blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias", DIM_ONE, DIM_KV, NEED_QKV_BIAS, 0},
    {F_QKV_BIAS, 2, "blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias", DIM_ONE, DIM_KV, NEED_QKV_BIAS, 0},
    {F_Q_NORM, 0, "blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight", DIM_ONE, DIM_HEAD, NEED_QK_NORM, 0},
    {F_K_NORM, 0, "blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight", DIM_ONE, DIM_HEAD, NEED_QK_NORM, 0},
    {F_O, 0, "blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", DIM_HIDDEN, DIM_Q, NEED_ALWAYS, 0},
    {F_POST_ATTN_NORM, 0, "blk.%d.post_attention_norm.weight", "model.layers.%d.post_attention_layernorm.weight", DIM_ONE, DIM_HIDDEN, NEED_GEMMA, 0},
    {F_FFN_NORM, 0, "blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", DIM_ONE, DIM_HIDDEN, NEED_NOT_GEMMA, 0},
    {F_FFN_NORM, 0, "blk.%d.ffn_norm.weight", "model.layers.%d.pre_feedforward_layernorm.weight", DIM_ONE, DIM_HIDDEN, NEED_GEMMA, 0},
    {F_GATE_UP, 0, "blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", DIM_FFN, DIM_HIDDEN, NEED_DENSE_FFN, 0},
    {F_GATE_UP, 1, "blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", DIM_FFN, DIM_HIDDEN, NEED_DENSE_FFN, 0},
    {F_DOWN, 0, "blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", DIM_HIDDEN, DIM_FFN, NEED_DENSE_FFN, 0},
    {F_POST_FFN_NORM, 0, "blk.%d.post_ffw_norm.weight", "model.layers.%d.post_feedforward_layernorm.weight", DIM_ONE, DIM_HIDDEN, NEED_GEMMA, 0},
};
#define N_LAYER ((int)(sizeof LAYER / sizeof LAYER[0]))

// A MoE layer's router and one expert's tensors. Hugging Face names differ
// by architecture (Mixtral's block_sparse_moe with w1 = gate, w3 = up,
// w2 = down; Qwen3-MoE's mlp); the second %d is the expert. GGUF's are
// llama.cpp's stacked tensors, one per layer.
typedef struct {
    pg_lt_field field;
    int part;
    const char *gguf, *mixtral, *qwen;
    pg_lt_dim rows, cols;
} moe_tensor;

static const moe_tensor ROUTER = {F_ROUTER, 0, "blk.%d.ffn_gate_inp.weight",
                                  "model.layers.%d.block_sparse_moe.gate.weight", "model.layers.%d.mlp.gate.weight",
                                  DIM_EXPERTS, DIM_HIDDEN};
static const moe_tensor EXPERT[] = {
    {F_EXP_GATE_UP, 0, "blk.%d.ffn_gate_exps.weight", "model.layers.%d.block_sparse_moe.experts.%d.w1.weight",
     "model.layers.%d.mlp.experts.%d.gate_proj.weight", DIM_MOE_FFN, DIM_HIDDEN},
    {F_EXP_GATE_UP, 1, "blk.%d.ffn_up_exps.weight", "model.layers.%d.block_sparse_moe.experts.%d.w3.weight",
     "model.layers.%d.mlp.experts.%d.up_proj.weight", DIM_MOE_FFN, DIM_HIDDEN},
    {F_EXP_DOWN, 0, "blk.%d.ffn_down_exps.weight", "model.layers.%d.block_sparse_moe.experts.%d.w2.weight",
     "model.layers.%d.mlp.experts.%d.down_proj.weight", DIM_HIDDEN, DIM_MOE_FFN},
};

int64_t pg_lt_dim_size(const pg_model_config *c, pg_lt_dim d) {
    switch (d) {
    case DIM_ONE: return 1;
    case DIM_HIDDEN: return c->hidden;
    case DIM_Q: return (int64_t)c->n_heads * c->head_dim;
    case DIM_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case DIM_FFN: return c->ffn;
    case DIM_HEAD: return c->head_dim;
    case DIM_VOCAB: return c->vocab_size;
    case DIM_EXPERTS: return c->n_experts;
    case DIM_MOE_FFN: return c->moe_ffn;
    }
    return 0;
}

bool pg_lt_shard_range(const pg_model_config *c, const pg_model_shard *sh, pg_lt_dim d, int64_t *lo, int64_t *n) {
    const int64_t hd = c->head_dim;
    switch (d) {
    case DIM_Q: *lo = sh->head0 * hd, *n = sh->n_heads * hd; return true;
    case DIM_KV: *lo = sh->kv_head0 * hd, *n = sh->n_kv_heads * hd; return true;
    case DIM_FFN: *lo = sh->ffn0, *n = sh->ffn; return true;
    case DIM_MOE_FFN: *lo = sh->moe_ffn0, *n = sh->moe_ffn; return !sh->expert_parallel; // EP: whole experts
    case DIM_VOCAB: *lo = sh->vocab0, *n = sh->vocab; return true;
    default: return false;
    }
}

static bool needed(const pg_model_config *c, int32_t l, need n) {
    switch (n) {
    case NEED_ALWAYS: return true;
    case NEED_QKV_BIAS: return c->qkv_bias;
    case NEED_QK_NORM: return c->qk_norm;
    case NEED_DENSE_FFN: return !pg_config_layer_is_moe(c, l);
    case NEED_MOE: return pg_config_layer_is_moe(c, l);
    case NEED_GEMMA: return pg_config_is_gemma(c);
    case NEED_NOT_GEMMA: return !pg_config_is_gemma(c);
    }
    return false;
}

pg_bweight **pg_lt_field_ptr(pg_model_layer *L, pg_lt_field f, int32_t expert) {
    switch (f) {
    case F_ATTN_NORM: return &L->attn_norm;
    case F_QKV: return &L->qkv;
    case F_QKV_BIAS: return &L->qkv_bias;
    case F_Q_NORM: return &L->q_norm;
    case F_K_NORM: return &L->k_norm;
    case F_O: return &L->o;
    case F_FFN_NORM: return &L->ffn_norm;
    case F_GATE_UP: return &L->gate_up;
    case F_DOWN: return &L->down;
    case F_ROUTER: return &L->router;
    case F_EXP_GATE_UP: return &L->exp_gate_up[expert];
    case F_EXP_DOWN: return &L->exp_down[expert];
    case F_POST_ATTN_NORM: return &L->post_attn_norm;
    case F_POST_FFN_NORM: return &L->post_ffn_norm;
    default: return NULL;
    }
}

int pg_layer_tensors_max(const pg_model_config *c) {
    return N_LAYER + 1 + 3 * (c->n_experts > 0 ? c->n_experts : 0);
}

// A MoE tensor of layer l (expert -1: the router).
static void moe_item(const pg_model_config *c, bool gguf, int32_t l, const moe_tensor *t, int32_t expert,
                     pg_layer_tensor *o) {
    const bool mixtral = !strcmp(c->arch, "mixtral");
    const char *fmt = gguf ? t->gguf : mixtral ? t->mixtral : t->qwen;
    *o = (pg_layer_tensor){.field = t->field, .part = t->part, .expert = expert,
                           .rows = pg_lt_dim_size(c, t->rows), .cols = pg_lt_dim_size(c, t->cols),
                           .rows_dim = t->rows, .cols_dim = t->cols};
    o->stored_rows = o->rows;
    if (expert < 0 || !gguf) {
        snprintf(o->name, sizeof o->name, fmt, l, expert);
    } else { // llama.cpp's stacked experts: this one's block of rows
        snprintf(o->name, sizeof o->name, fmt, l);
        o->stored_rows = o->rows * c->n_experts;
        o->row0 = o->rows * expert;
    }
}

int pg_layer_tensors(const pg_model_config *c, const pg_model_shard *sh, bool gguf, int32_t l,
                     pg_layer_tensor *out) {
    int n = 0;
    for (int t = 0; t < N_LAYER; t++) {
        const layer_tensor *lt = &LAYER[t];
        if (!needed(c, l, lt->need)) continue;
        pg_layer_tensor *o = &out[n++];
        *o = (pg_layer_tensor){.field = lt->field, .part = lt->part, .expert = -1,
                               .rows = pg_lt_dim_size(c, lt->rows), .cols = pg_lt_dim_size(c, lt->cols),
                               .rows_dim = lt->rows, .cols_dim = lt->cols, .unpermute = lt->unpermute,
                               .vector = lt->rows == DIM_ONE, .norm = lt->rows == DIM_ONE && lt->field != F_QKV_BIAS};
        o->stored_rows = o->rows;
        snprintf(o->name, sizeof o->name, gguf ? lt->gguf : lt->hf, l);
    }
    if (!needed(c, l, NEED_MOE)) return n;
    moe_item(c, gguf, l, &ROUTER, -1, &out[n++]);
    // Only the experts this rank holds (expert parallelism: its block; the
    // others are never looked at, so never read).
    const int32_t e0 = sh ? sh->exp0 : 0, e1 = sh ? sh->exp0 + sh->n_exp : c->n_experts;
    for (int32_t e = e0; e < e1; e++)
        for (size_t t = 0; t < sizeof EXPERT / sizeof EXPERT[0]; t++) moe_item(c, gguf, l, &EXPERT[t], e, &out[n++]);
    return n;
}
