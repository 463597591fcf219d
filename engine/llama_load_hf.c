// engine/llama_load_hf.c - a Llama model from a Hugging Face directory:
// config.json (+ generation_config.json) and model.safetensors or the shards
// of model.safetensors.index.json. F32/F16/BF16 matrices stay in the mapping
// (the CPU kernels read unaligned rows); norms are converted to f32.
#include <string.h>

#include "common/err.h"
#include "kernels/dtype.h"
#include "engine/llama.h"
#include "engine/llama_load_int.h"
#include "engine/safetensors.h"

int pg_llama_load_hf(const char *dir, pg_llama *m);

static void close_st(void *p) { pg_st_model_close(p); }

static const pg_st_tensor *find(const pg_st_model *st, const char *name) {
    return pg_st_model_find(st, name, NULL);
}

static int st_weight(const pg_st_model *st, const char *dir, const char *name, int64_t rows,
                     int64_t cols, pg_weight *w) {
    const pg_st_tensor *t = find(st, name);
    if (!t) return pg_err_set(PG_EFORMAT, "%s: tensor '%s' is missing", dir, name);
    if (t->n_dims != 2 || (int64_t)t->dims[0] != cols || (int64_t)t->dims[1] != rows)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]",
                          dir, name, (unsigned long long)t->shape[0],
                          (unsigned long long)(t->n_dims > 1 ? t->shape[1] : 1), (long long)rows,
                          (long long)cols);
    *w = (pg_weight){.data = t->data, .dtype = t->dtype, .rows = rows, .cols = cols,
                     .row_bytes = pg_dtype_row_bytes(t->dtype, cols)};
    return 0;
}

static int st_vector(pg_llama *m, const pg_st_model *st, const char *dir, const char *name,
                     int64_t n, const float **out) {
    const pg_st_tensor *t = find(st, name);
    if (!t) return pg_err_set(PG_EFORMAT, "%s: tensor '%s' is missing", dir, name);
    if ((int64_t)t->n_elems != n)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' has %llu elements, expected %lld", dir, name,
                          (unsigned long long)t->n_elems, (long long)n);
    float *v = pg_llama_own(m, pg_xmalloc(sizeof(float) * (size_t)n));
    pg_dequantize_row(t->dtype, t->data, v, n); // handles unaligned data
    *out = v;
    return 0;
}

int pg_llama_load_hf(const char *dir, pg_llama *m) {
    PG_TRY(pg_config_from_hf_dir(dir, &m->cfg));
    pg_st_model *st;
    PG_TRY(pg_st_model_open(dir, &st));
    m->source = st;
    m->source_close = close_st;
    const pg_model_config *c = &m->cfg;
    const int64_t hd = c->head_dim, q_dim = (int64_t)c->n_heads * hd, kv_dim = (int64_t)c->n_kv_heads * hd;
    PG_TRY(st_weight(st, dir, "model.embed_tokens.weight", c->vocab_size, c->hidden, &m->tok_emb));
    if (c->tie_embeddings || !find(st, "lm_head.weight")) {
        m->lm_head = m->tok_emb;
        m->cfg.tie_embeddings = true;
    } else {
        PG_TRY(st_weight(st, dir, "lm_head.weight", c->vocab_size, c->hidden, &m->lm_head));
    }
    PG_TRY(st_vector(m, st, dir, "model.norm.weight", c->hidden, &m->final_norm));
    m->layers = pg_xcalloc((size_t)c->n_layers, sizeof(pg_llama_layer));
    char name[128];
#define T(suffix) (snprintf(name, sizeof name, "model.layers.%d." suffix, l), name)
    for (int32_t l = 0; l < c->n_layers; l++) {
        pg_llama_layer *L = &m->layers[l];
        pg_weight w[3];
        PG_TRY(st_vector(m, st, dir, T("input_layernorm.weight"), c->hidden, &L->attn_norm));
        PG_TRY(st_vector(m, st, dir, T("post_attention_layernorm.weight"), c->hidden, &L->ffn_norm));
        PG_TRY(st_weight(st, dir, T("self_attn.q_proj.weight"), q_dim, c->hidden, &w[0]));
        PG_TRY(st_weight(st, dir, T("self_attn.k_proj.weight"), kv_dim, c->hidden, &w[1]));
        PG_TRY(st_weight(st, dir, T("self_attn.v_proj.weight"), kv_dim, c->hidden, &w[2]));
        pg_linear_init(&L->qkv, 3, w);
        PG_TRY(st_weight(st, dir, T("self_attn.o_proj.weight"), c->hidden, q_dim, &w[0]));
        pg_linear_init(&L->o, 1, w);
        PG_TRY(st_weight(st, dir, T("mlp.gate_proj.weight"), c->ffn, c->hidden, &w[0]));
        PG_TRY(st_weight(st, dir, T("mlp.up_proj.weight"), c->ffn, c->hidden, &w[1]));
        pg_linear_init(&L->gate_up, 2, w);
        PG_TRY(st_weight(st, dir, T("mlp.down_proj.weight"), c->hidden, c->ffn, &w[0]));
        pg_linear_init(&L->down, 1, w);
    }
#undef T
    m->inv_freq = pg_xmalloc(sizeof(float) * (size_t)(c->head_dim / 2));
    pg_config_rope_inv_freq(c, m->inv_freq);
    return 0;
}
