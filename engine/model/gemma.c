// engine/model/gemma.c - the Gemma 2 and 3 family's builder
// (Gemma2ForCausalLM, Gemma3ForCausalLM, GGUF "gemma2", "gemma3";
// docs/gemma3.md): Llama's layer with four norms, GeGLU, and local
// (sliding-window) layers between global ones:
//
//   x = emb[tokens] * sqrt(hidden)
//   per layer:  qkv = RMSNorm(x) * attn_norm . Wqkv^T
//               q, k = per-head RMSNorm(q, k)   (Gemma 3)
//               q, k = RoPE(q, k)          (local: base rope_local_theta; global: rope_theta, scaled)
//               attn = paged causal attention, scale query_pre_attn_scalar^-0.5,
//                      local layers within the last swa_window positions,
//                      Gemma 2: scores soft-capped, s -> cap tanh(s / cap)
//               x += RMSNorm(attn . Wo^T) * post_attn_norm
//               h = gelu_tanh(g) * u, [g | u] = RMSNorm(x) * ffn_norm . Wgu^T
//               x += RMSNorm(h . Wdown^T) * post_ffn_norm
//
// Every norm weight here is the 1 + w Gemma multiplies by (the loader adds
// the 1 to Hugging Face's w; llama.cpp's GGUF stores 1 + w). The head (final
// norm, the tied LM head; Gemma 2's logits soft-capped too) is the shared
// one of engine/model/model.c.
#include <math.h>

#include "common/err.h"
#include "engine/model/family.h"
#include "engine/model/layers.h"

static int gemma_forward_layers(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs, const pg_fwd_step *s) {
    if (s->n_tokens == 0) return 0;
    const pg_model_config *c = &m->cfg;
    pg_step_views v;
    pg_step_views_make(m, bufs, s, &v);
    PG_TRY(pg_model_offload_prefetch(m, 0));
    PG_TRY(pg_model_offload_prefetch(m, 1));
    PG_TRY(pg_layer_embed(m, v.x, s->tokens));
    PG_TRY(m->be->ops->scale(m->be, v.x, c->embed_scale));
    const float scalar = c->attn_scalar > 0 ? c->attn_scalar : (float)c->head_dim;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const bool local = pg_config_layer_is_local(c, l);
        const pg_attn_opts o = {.scale = 1.0f / sqrtf(scalar),
                                .window = local ? c->swa_window : 0,
                                .inv_freq = local ? m->inv_freq_local : m->inv_freq,
                                .post_norm = m->layers[l].post_attn_norm,
                                .softcap = c->attn_softcap,
                                .lc_gemma = true};
        PG_TRY(pg_model_offload_wait(m, l));
        PG_TRY(pg_layer_attention_with(m, l, kv, bufs, s, &v, &o));
        PG_TRY(pg_layer_ffn_geglu(m, l, &v));
        PG_TRY(pg_model_offload_prefetch(m, l + 2));
    }
    return 0;
}

const pg_model_family pg_gemma_family = {.name = "gemma", .forward_layers = gemma_forward_layers};
