// engine/llama_load.c - building a pg_llama from a GGUF file or a Hugging
// Face directory.
//
// Weights stay in the file mapping (zero copy) unless they must change:
//  - norms are converted to f32;
//  - GGUF Q and K matrices are stored with each head's rows interleaved for
//    llama.cpp's "normal" RoPE (rows 2i, 2i+1 form a rotating pair); the
//    forward uses the Hugging Face rotate-half layout (rows i, i + d/2), so
//    the loader puts rows back in that order (a row copy, valid for any
//    block-quantized type since blocks run along rows).
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "kernels/dtype.h"
#include "engine/gguf.h"
#include "engine/llama.h"
#include "engine/llama_load_int.h"

// --- ownership helpers ------------------------------------------------------------

void *pg_llama_own(pg_llama *m, void *p) {
    if (m->n_owned == m->cap_owned) {
        m->cap_owned = m->cap_owned ? 2 * m->cap_owned : 64;
        m->owned = pg_xrealloc(m->owned, sizeof(void *) * (size_t)m->cap_owned);
    }
    m->owned[m->n_owned++] = p;
    return p;
}

void pg_llama_free(pg_llama *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->inv_freq);
    if (m->source_close) m->source_close(m->source);
    free(m);
}

// --- GGUF --------------------------------------------------------------------------

static int gguf_weight(const gguf_file *f, const char *name, int64_t rows, int64_t cols,
                       pg_weight *w) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) return pg_err_set(PG_EFORMAT, "%s: tensor '%s' is missing", f->path, name);
    int64_t t_rows = t->n_dims >= 2 ? (int64_t)t->dims[1] : 1;
    for (uint32_t d = 2; d < t->n_dims; d++) t_rows *= (int64_t)t->dims[d];
    if ((int64_t)t->dims[0] != cols || t_rows != rows)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' is %lldx%lld, expected %lldx%lld", f->path,
                          name, (long long)t_rows, (long long)t->dims[0], (long long)rows,
                          (long long)cols);
    *w = (pg_weight){.data = t->data, .dtype = (int)t->type, .rows = rows, .cols = cols,
                     .row_bytes = pg_dtype_row_bytes((int)t->type, cols)};
    return 0;
}

// A 1-D weight as f32 (converted into memory the model owns if needed).
static int gguf_vector(pg_llama *m, const gguf_file *f, const char *name, int64_t n,
                       const float **out) {
    pg_weight w;
    PG_TRY(gguf_weight(f, name, 1, n, &w));
    if (w.dtype == PG_DTYPE_F32) {
        *out = w.data;
        return 0;
    }
    float *v = pg_llama_own(m, pg_xmalloc(sizeof(float) * (size_t)n));
    pg_dequantize_row(w.dtype, w.data, v, n);
    *out = v;
    return 0;
}

// Undoes llama.cpp's Q/K row interleaving head by head (see the file comment).
static void unpermute_rows(pg_llama *m, pg_weight *w, int32_t n_heads) {
    int64_t hd = w->rows / n_heads, half = hd / 2;
    char *dst = pg_llama_own(m, pg_xmalloc(w->row_bytes * (size_t)w->rows));
    const char *src = w->data;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(dst + (size_t)(h * hd + s * half + i) * w->row_bytes,
                       src + (size_t)(h * hd + 2 * i + s) * w->row_bytes, w->row_bytes);
    w->data = dst;
}

static void close_gguf(void *p) { gguf_close(p); }

void pg_linear_init(pg_linear *lin, int n, const pg_weight *parts) {
    lin->n_parts = n;
    lin->out_features = 0;
    for (int i = 0; i < n; i++) {
        lin->parts[i] = parts[i];
        lin->out_features += parts[i].rows;
    }
}

static int load_gguf(const char *path, pg_llama *m) {
    gguf_file *f;
    PG_TRY(gguf_open(path, &f));
    m->source = f;
    m->source_close = close_gguf;
    PG_TRY(pg_config_from_gguf(f, &m->cfg));
    const pg_model_config *c = &m->cfg;
    const int64_t hd = c->head_dim, q_dim = (int64_t)c->n_heads * hd, kv_dim = (int64_t)c->n_kv_heads * hd;
    PG_TRY(gguf_weight(f, "token_embd.weight", c->vocab_size, c->hidden, &m->tok_emb));
    if (c->tie_embeddings) {
        m->lm_head = m->tok_emb;
    } else {
        PG_TRY(gguf_weight(f, "output.weight", c->vocab_size, c->hidden, &m->lm_head));
    }
    PG_TRY(gguf_vector(m, f, "output_norm.weight", c->hidden, &m->final_norm));
    m->layers = pg_xcalloc((size_t)c->n_layers, sizeof(pg_llama_layer));
    char name[96];
#define T(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, l), name)
    for (int32_t l = 0; l < c->n_layers; l++) {
        pg_llama_layer *L = &m->layers[l];
        pg_weight w[3];
        PG_TRY(gguf_vector(m, f, T("attn_norm.weight"), c->hidden, &L->attn_norm));
        PG_TRY(gguf_vector(m, f, T("ffn_norm.weight"), c->hidden, &L->ffn_norm));
        PG_TRY(gguf_weight(f, T("attn_q.weight"), q_dim, c->hidden, &w[0]));
        PG_TRY(gguf_weight(f, T("attn_k.weight"), kv_dim, c->hidden, &w[1]));
        PG_TRY(gguf_weight(f, T("attn_v.weight"), kv_dim, c->hidden, &w[2]));
        unpermute_rows(m, &w[0], c->n_heads);
        unpermute_rows(m, &w[1], c->n_kv_heads);
        pg_linear_init(&L->qkv, 3, w);
        PG_TRY(gguf_weight(f, T("attn_output.weight"), c->hidden, q_dim, &w[0]));
        pg_linear_init(&L->o, 1, w);
        PG_TRY(gguf_weight(f, T("ffn_gate.weight"), c->ffn, c->hidden, &w[0]));
        PG_TRY(gguf_weight(f, T("ffn_up.weight"), c->ffn, c->hidden, &w[1]));
        pg_linear_init(&L->gate_up, 2, w);
        PG_TRY(gguf_weight(f, T("ffn_down.weight"), c->hidden, c->ffn, &w[0]));
        pg_linear_init(&L->down, 1, w);
    }
#undef T
    m->inv_freq = pg_xmalloc(sizeof(float) * (size_t)(c->head_dim / 2));
    pg_config_rope_inv_freq(c, m->inv_freq);
    // Llama-3 GGUF files carry the frequency scaling as a tensor of divisors.
    const gguf_tensor *rf = gguf_find_tensor(f, "rope_freqs.weight");
    if (rf) {
        if (rf->type != PG_DTYPE_F32 || rf->dims[0] != (uint64_t)(c->head_dim / 2))
            return pg_err_set(PG_EFORMAT, "%s: rope_freqs.weight has an unexpected shape", path);
        for (int32_t i = 0; i < c->head_dim / 2; i++) m->inv_freq[i] /= ((const float *)rf->data)[i];
    }
    return 0;
}

// --- entry point ------------------------------------------------------------------

static size_t linear_bytes(const pg_linear *lin) {
    size_t n = 0;
    for (int i = 0; i < lin->n_parts; i++) n += lin->parts[i].row_bytes * (size_t)lin->parts[i].rows;
    return n;
}

int pg_llama_load_hf(const char *dir, pg_llama *m);

int pg_llama_load(const char *path, pg_llama **out) {
    *out = NULL;
    pg_llama *m = pg_xcalloc(1, sizeof *m);
    int rc = pg_is_dir(path) ? pg_llama_load_hf(path, m) : load_gguf(path, m);
    if (rc < 0) {
        pg_llama_free(m);
        return rc;
    }
    size_t bytes = m->tok_emb.row_bytes * (size_t)m->tok_emb.rows;
    if (m->lm_head.data != m->tok_emb.data) bytes += m->lm_head.row_bytes * (size_t)m->lm_head.rows;
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        const pg_llama_layer *L = &m->layers[l];
        bytes += linear_bytes(&L->qkv) + linear_bytes(&L->o) + linear_bytes(&L->gate_up) +
                 linear_bytes(&L->down);
    }
    m->weight_bytes = bytes;
    *out = m;
    return 0;
}
