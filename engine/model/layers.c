// engine/model/layers.c - the shared layer helpers (engine/model/layers.h):
// blocks of a transformer layer as ops of kernels/backend.h, with tensor
// parallelism inside them.
#include "engine/model/layers.h"

#include <math.h>
#include <stdlib.h>

#include "common/err.h"

void pg_step_views_make(const pg_model *m, const pg_fwd_buffers *bufs, int64_t n, pg_step_views *v) {
    const int64_t hd = m->cfg.head_dim;
    const int64_t q_dim = (int64_t)m->shard.n_heads * hd, kv_dim = (int64_t)m->shard.n_kv_heads * hd;
    v->n = n;
    v->x = pg_tensor_view(bufs->x, 0, n, 0, bufs->x.cols);
    v->xn = pg_tensor_view(bufs->xn, 0, n, 0, bufs->xn.cols);
    v->qkv = pg_tensor_view(bufs->qkv, 0, n, 0, bufs->qkv.cols);
    v->q = pg_tensor_view(v->qkv, 0, n, 0, q_dim);
    v->k = pg_tensor_view(v->qkv, 0, n, q_dim, kv_dim);
    v->v = pg_tensor_view(v->qkv, 0, n, q_dim + kv_dim, kv_dim);
    v->attn = pg_tensor_view(bufs->attn, 0, n, 0, q_dim);
    v->gu = pg_tensor_view(bufs->gu, 0, n, 0, bufs->gu.cols);
    v->h = pg_tensor_view(bufs->h, 0, n, 0, bufs->h.cols);
    v->moe_ws = bufs->moe_ws;
    v->moe_ws_bytes = bufs->moe_ws_bytes;
}

int pg_layer_all_reduce(const pg_model *m, pg_tensor x) {
    if (!m->comm) return 0;
    return m->comm->all_reduce_sum(m->comm, x.data, x.rows * x.stride, x.dtype);
}

int pg_layer_embed(const pg_model *m, pg_tensor x, const int32_t *tokens) {
    PG_TRY(m->be->ops->embed(m->be, x, tokens, m->tok_emb, m->shard.vocab0));
    return pg_layer_all_reduce(m, x);
}

int pg_layer_row_linear(const pg_model *m, pg_tensor x, pg_tensor in, const pg_bweight *w, pg_tensor scratch) {
    // Rank 0 adds its part to the stream, the others write theirs over it;
    // the all-reduce then sums stream and parts.
    const bool residual = m->shard.rank == 0;
    PG_TRY(m->be->ops->linear(m->be, x, in, NULL, 0.0f, w, NULL, residual, scratch));
    return pg_layer_all_reduce(m, x);
}

// Calibration: the largest |x| per KV head of this step's rotated K and V
// rows (read back synchronously; only the start-up calibration sets
// bufs->kv_amax), into amax [2][n_kv_heads].
static int kv_amax(const pg_model *m, pg_tensor k, pg_tensor v, int64_t n, float *amax) {
    const int32_t nkv = m->shard.n_kv_heads;
    const int64_t hd = m->cfg.head_dim, w = (int64_t)nkv * hd;
    float *row = pg_xmalloc(sizeof(float) * (size_t)(n * w));
    int rc = 0;
    for (int t = 0; t < 2 && rc == 0; t++) {
        if ((rc = m->be->ops->read_f32(m->be, t == 0 ? k : v, n, row)) < 0) break;
        for (int64_t i = 0; i < n * w; i++) {
            const float a = fabsf(row[i]);
            float *mx = &amax[t * nkv + (i % w) / hd];
            if (a > *mx) *mx = a;
        }
    }
    free(row);
    return rc;
}

int pg_layer_row_linear_norm(const pg_model *m, pg_tensor x, pg_tensor in, const pg_bweight *w,
                             const pg_bweight *norm, pg_tensor scratch) {
    // Neither a norm nor accumulate: linear leaves its scratch alone, so
    // the product may go to it.
    PG_TRY(m->be->ops->linear(m->be, scratch, in, NULL, 0.0f, w, NULL, false, scratch));
    PG_TRY(pg_layer_all_reduce(m, scratch));
    return m->be->ops->rmsnorm_add(m->be, x, scratch, norm, m->cfg.rms_eps);
}

int pg_layer_attention(const pg_model *m, int32_t l, pg_bkv *kv, const pg_fwd_buffers *bufs,
                       const pg_fwd_step *s, const pg_step_views *v) {
    const pg_attn_opts o = {.scale = 1.0f / sqrtf((float)m->cfg.head_dim), .inv_freq = m->inv_freq};
    return pg_layer_attention_with(m, l, kv, bufs, s, v, &o);
}

int pg_layer_attention_with(const pg_model *m, int32_t l, pg_bkv *kv, const pg_fwd_buffers *bufs,
                            const pg_fwd_step *s, const pg_step_views *v, const pg_attn_opts *o) {
    const pg_model_config *c = &m->cfg;
    const pg_model_shard *sh = &m->shard;
    const pg_model_layer *L = &m->layers[l];
    pg_backend *be = m->be;
    PG_TRY(be->ops->linear(be, v->qkv, v->x, L->attn_norm, c->rms_eps, L->qkv, L->qkv_bias, false, v->xn));
    if (L->q_norm) {
        PG_TRY(be->ops->head_rmsnorm(be, v->q, sh->n_heads, L->q_norm, c->rms_eps));
        PG_TRY(be->ops->head_rmsnorm(be, v->k, sh->n_kv_heads, L->k_norm, c->rms_eps));
    }
    pg_kv_shape ks = kv->shape;
    if (bufs->kv_scales && ks.dtype == PG_KV_FP8_E4M3)
        ks.scales = bufs->kv_scales + (size_t)l * 2 * (size_t)sh->n_kv_heads;
    PG_TRY(be->ops->rope_kv_write(be, v->q, v->k, v->v, s->pos, s->slots, sh->n_heads, o->inv_freq, kv->k[l], kv->v[l],
                             ks));
    if (bufs->kv_amax)
        PG_TRY(kv_amax(m, v->k, v->v, v->n, bufs->kv_amax + (size_t)l * 2 * (size_t)sh->n_kv_heads));
    PG_TRY(be->ops->attention(be, v->attn, v->q, &s->attn, kv->k[l], kv->v[l], ks, sh->n_heads, o->scale,
                              o->window));
    if (o->post_norm) return pg_layer_row_linear_norm(m, v->x, v->attn, L->o, o->post_norm, v->xn);
    return pg_layer_row_linear(m, v->x, v->attn, L->o, v->xn);
}

int pg_layer_ffn_swiglu(const pg_model *m, int32_t l, const pg_step_views *v) {
    const pg_model_layer *L = &m->layers[l];
    PG_TRY(m->be->ops->gate_up_silu(m->be, v->h, v->x, L->ffn_norm, m->cfg.rms_eps, L->gate_up, v->xn, v->gu));
    return pg_layer_row_linear(m, v->x, v->h, L->down, v->xn);
}

int pg_layer_ffn_geglu(const pg_model *m, int32_t l, const pg_step_views *v) {
    const pg_model_layer *L = &m->layers[l];
    PG_TRY(m->be->ops->gate_up_gelu(m->be, v->h, v->x, L->ffn_norm, m->cfg.rms_eps, L->gate_up, v->xn, v->gu));
    return pg_layer_row_linear_norm(m, v->x, v->h, L->down, L->post_ffn_norm, v->xn);
}

int pg_layer_ffn_moe(const pg_model *m, int32_t l, const pg_step_views *v) {
    const pg_model_layer *L = &m->layers[l];
    const pg_model_config *c = &m->cfg;
    const bool residual = m->shard.rank == 0;
    PG_TRY(m->be->ops->moe_ffn(m->be, v->x, v->x, L->ffn_norm, c->rms_eps, L->router,
                               (const pg_bweight *const *)L->exp_gate_up, (const pg_bweight *const *)L->exp_down,
                               c->n_experts, c->n_experts_used, c->moe_renorm, residual, v->moe_ws,
                               v->moe_ws_bytes));
    return pg_layer_all_reduce(m, v->x);
}
