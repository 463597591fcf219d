// engine/model/moe.c - the mixture-of-experts family's builder: Mixtral
// (8 experts, top 2) and Qwen3-MoE (128 experts, top 8, per-head q/k
// RMSNorm, norm_topk_prob), Llama's attention with a feed-forward of
// experts (docs/moe.md):
//
//   x = emb[tokens]
//   per layer:  x += attention(RMSNorm(x))                   (as Llama's: layers.h)
//               MoE layer:  xn = RMSNorm(x) * ffn_norm
//                           p = softmax(xn . Wrouter^T); S = top-k experts of p
//                           x += sum_{e in S} w_e down_e(silu(gate_e(xn)) * up_e(xn))
//               else:       x += the dense SwiGLU (Qwen3-MoE's decoder_sparse_step)
//
// Tensor parallelism: each rank holds a slice of every expert's columns
// (engine/model/model_shard.c) and the router whole, so the ranks route
// alike and the experts' down products sum as a row-parallel product's.
// Expert parallelism (--enable-expert-parallel): each rank holds whole
// experts instead, the others NULL; the same layer code, the same sum.
#include "common/err.h"
#include "engine/model/family.h"
#include "engine/model/layers.h"

static int moe_forward_layers(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs, const pg_fwd_step *s) {
    if (s->n_tokens == 0) return 0;
    pg_step_views v;
    pg_step_views_make(m, bufs, s, &v);
    // --cpu-offload-gb: as Llama's (a layer's experts travel with it).
    PG_TRY(pg_model_offload_prefetch(m, 0));
    PG_TRY(pg_model_offload_prefetch(m, 1));
    PG_TRY(pg_layer_embed(m, v.x, s->tokens));
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        PG_TRY(pg_model_offload_wait(m, l));
        PG_TRY(pg_layer_attention(m, l, kv, bufs, s, &v));
        if (pg_config_layer_is_moe(&m->cfg, l))
            PG_TRY(pg_layer_ffn_moe(m, l, &v));
        else
            PG_TRY(pg_layer_ffn_swiglu(m, l, &v));
        PG_TRY(pg_model_offload_prefetch(m, l + 2));
    }
    return 0;
}

const pg_model_family pg_moe_family = {.name = "moe", .forward_layers = moe_forward_layers};
