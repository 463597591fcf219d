// engine/llama.c - the Llama forward pass over a mixed prefill/decode batch.
#include "engine/llama.h"

#include <math.h>
#include <string.h>

#include "common/err.h"

// --- KV cache ---------------------------------------------------------------------

size_t pg_kv_cache_bytes_per_block(const pg_model_config *c, int32_t block_size) {
    // K and V, every layer, f32.
    return (size_t)2 * (size_t)c->n_layers * (size_t)block_size * (size_t)c->n_kv_heads *
           (size_t)c->head_dim * sizeof(float);
}

int pg_kv_cache_create(const pg_model_config *c, int32_t n_blocks, int32_t block_size,
                       pg_kv_cache **out) {
    *out = NULL;
    if (n_blocks <= 0 || block_size <= 0)
        return pg_err_set(PG_EINVAL, "KV cache needs a positive block count and size");
    pg_kv_cache *kv = pg_xcalloc(1, sizeof *kv);
    kv->shape = (pg_kv_shape){n_blocks, block_size, c->n_kv_heads, c->head_dim, PG_KV_BF16}; // f32 on the CPU
    kv->n_layers = c->n_layers;
    kv->k = pg_xcalloc((size_t)c->n_layers, sizeof(float *));
    kv->v = pg_xcalloc((size_t)c->n_layers, sizeof(float *));
    size_t n = (size_t)n_blocks * (size_t)block_size * (size_t)c->n_kv_heads * (size_t)c->head_dim;
    for (int32_t l = 0; l < c->n_layers; l++) {
        // calloc: untouched pages cost nothing until blocks are used.
        kv->k[l] = calloc(n, sizeof(float));
        kv->v[l] = calloc(n, sizeof(float));
        if (!kv->k[l] || !kv->v[l]) {
            pg_kv_cache_free(kv);
            return pg_err_set(PG_ENOMEM, "KV cache: cannot allocate %d blocks (%zu MiB)", n_blocks,
                              pg_kv_cache_bytes_per_block(c, block_size) * (size_t)n_blocks >> 20);
        }
    }
    *out = kv;
    return 0;
}

void pg_kv_cache_free(pg_kv_cache *kv) {
    if (!kv) return;
    for (int32_t l = 0; l < kv->n_layers; l++) {
        free(kv->k[l]);
        free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv);
}

// --- workspace --------------------------------------------------------------------

static void grow(float **p, size_t n) {
    free(*p);
    *p = pg_xmalloc(n * sizeof(float));
}

static void workspace_reserve(pg_fwd_workspace *ws, const pg_model_config *c, int32_t n_tokens,
                              int32_t n_logits) {
    if (n_tokens > ws->cap_tokens) {
        size_t n = (size_t)n_tokens;
        size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * (size_t)c->head_dim;
        grow(&ws->x, n * (size_t)c->hidden);
        grow(&ws->xn, n * (size_t)c->hidden);
        grow(&ws->qkv, n * qkv);
        grow(&ws->q, n * (size_t)c->n_heads * (size_t)c->head_dim);
        grow(&ws->k, n * (size_t)c->n_kv_heads * (size_t)c->head_dim);
        grow(&ws->v, n * (size_t)c->n_kv_heads * (size_t)c->head_dim);
        grow(&ws->gate_up, n * 2 * (size_t)c->ffn);
        grow(&ws->h, n * (size_t)c->ffn);
        ws->cap_tokens = n_tokens;
    }
    if (n_logits > ws->cap_logits) {
        grow(&ws->logits_in, (size_t)n_logits * (size_t)c->hidden);
        ws->cap_logits = n_logits;
    }
}

void pg_fwd_workspace_free(pg_fwd_workspace *ws) {
    free(ws->x);
    free(ws->xn);
    free(ws->qkv);
    free(ws->q);
    free(ws->k);
    free(ws->v);
    free(ws->gate_up);
    free(ws->h);
    free(ws->logits_in);
    memset(ws, 0, sizeof *ws);
}

// --- forward ----------------------------------------------------------------------

static void linear(pg_backend *be, float *out, const float *x, int64_t m, const pg_linear *lin) {
    int64_t off = 0;
    for (int i = 0; i < lin->n_parts; i++) {
        be->matmul(be, out + off, lin->out_features, x, m, &lin->parts[i]);
        off += lin->parts[i].rows;
    }
}

int pg_llama_forward(const pg_llama *m, pg_backend *be, pg_kv_cache *kv, pg_fwd_workspace *ws,
                     const pg_fwd_batch *b, float *logits) {
    const pg_model_config *c = &m->cfg;
    const int64_t n = b->n_tokens, hd = c->head_dim, dim = c->hidden;
    const int64_t q_dim = (int64_t)c->n_heads * hd, kv_dim = (int64_t)c->n_kv_heads * hd;
    const int64_t qkv_dim = q_dim + 2 * kv_dim;
    if (n <= 0) return 0;
    for (int64_t i = 0; i < n; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size)
            return pg_err_set(PG_EINVAL, "token id %d outside the vocabulary", b->tokens[i]);
    workspace_reserve(ws, c, b->n_tokens, b->n_logits);
    const float scale = 1.0f / sqrtf((float)hd);

    be->embed(be, ws->x, b->tokens, n, &m->tok_emb);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const pg_llama_layer *L = &m->layers[l];
        // Attention block.
        be->rmsnorm(be, ws->xn, ws->x, L->attn_norm, n, dim, c->rms_eps);
        linear(be, ws->qkv, ws->xn, n, &L->qkv);
        // Q, K, V are column ranges of each qkv row; the rope/cache op and
        // attention read them with the row stride, so split them out first.
        float *q = ws->q, *k = ws->k, *v = ws->v;
        for (int64_t i = 0; i < n; i++) {
            memcpy(q + i * q_dim, ws->qkv + i * qkv_dim, sizeof(float) * (size_t)q_dim);
            memcpy(k + i * kv_dim, ws->qkv + i * qkv_dim + q_dim, sizeof(float) * (size_t)kv_dim);
            memcpy(v + i * kv_dim, ws->qkv + i * qkv_dim + q_dim + kv_dim, sizeof(float) * (size_t)kv_dim);
        }
        be->rope_kv_write(be, q, k, v, b->pos, b->slots, n, c->n_heads, m->inv_freq, kv->k[l],
                          kv->v[l], kv->shape);
        // Attention reads q and writes its output into the (now free) qkv buffer.
        be->attention(be, ws->qkv, q, b->seqs, b->n_seqs, c->n_heads, scale, kv->k[l], kv->v[l],
                      kv->shape);
        linear(be, ws->xn, ws->qkv, n, &L->o);
        be->add(be, ws->x, ws->xn, n, dim);
        // MLP block.
        be->rmsnorm(be, ws->xn, ws->x, L->ffn_norm, n, dim, c->rms_eps);
        linear(be, ws->gate_up, ws->xn, n, &L->gate_up);
        be->silu_mul(be, ws->h, ws->gate_up, n, c->ffn);
        linear(be, ws->xn, ws->h, n, &L->down);
        be->add(be, ws->x, ws->xn, n, dim);
    }
    // Only the rows that sample need the final norm and the LM head.
    for (int32_t i = 0; i < b->n_logits; i++)
        memcpy(ws->logits_in + (int64_t)i * dim, ws->x + (int64_t)b->logit_rows[i] * dim,
               sizeof(float) * (size_t)dim);
    be->rmsnorm(be, ws->logits_in, ws->logits_in, m->final_norm, b->n_logits, dim, c->rms_eps);
    be->matmul(be, logits, c->vocab_size, ws->logits_in, b->n_logits, &m->lm_head);
    return 0;
}
