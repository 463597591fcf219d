// engine/model/llama.c - the Llama family's builder: Llama 2/3/3.1, Mistral,
// Qwen2 (QKV bias) and Qwen3 (per-head q/k RMSNorm), one layer loop over
// the shared helpers (engine/model/layers.h), the differences being the
// layers' weights the config asks for:
//
//   x = emb[tokens]
//   per layer:  qkv = RMSNorm(x) * attn_norm . Wqkv^T (+ bias)     (Qwen2: bias)
//               q, k = per-head RMSNorm(q, k)                      (Qwen3)
//               q, k = RoPE(q, k); cache[slots] = k, v
//               attn = paged causal attention(q, cache)
//               x += attn . Wo^T                                   (residual folded in)
//               h = silu(g) * u, [g | u] = RMSNorm(x) * ffn_norm . Wgu^T
//               x += h . Wdown^T
//
// The logits (final norm, LM head, the tensor-parallel exchanges) are the
// model's head, shared by every family: engine/model/model.c.
#include "common/err.h"
#include "engine/model/family.h"
#include "engine/model/layers.h"

static int llama_forward_layers(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs, const pg_fwd_step *s) {
    if (s->n_tokens == 0) return 0;
    pg_step_views v;
    pg_step_views_make(m, bufs, s, &v);
    // --cpu-offload-gb: the first two offloaded layers' copies start now,
    // each later one once the layer two before it is queued (its slot).
    PG_TRY(pg_model_offload_prefetch(m, 0));
    PG_TRY(pg_model_offload_prefetch(m, 1));
    PG_TRY(pg_layer_embed(m, v.x, s->tokens));
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        PG_TRY(pg_model_offload_wait(m, l));
        PG_TRY(pg_layer_attention(m, l, kv, bufs, s, &v));
        PG_TRY(pg_layer_ffn_swiglu(m, l, &v));
        PG_TRY(pg_model_offload_prefetch(m, l + 2));
    }
    return 0;
}

const pg_model_family pg_llama_family = {.name = "llama", .forward_layers = llama_forward_layers};
