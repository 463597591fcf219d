// engine/model/layers.c - the shared layer helpers (engine/model/layers.h):
// blocks of a transformer layer as ops of kernels/backend.h, with tensor
// parallelism inside them.
#include "engine/model/layers.h"

#include <math.h>
#include <stdlib.h>

#include "common/err.h"
#include "engine/model/lora_adapter.h" // PG_LORA_Q ...

void pg_step_views_make(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_step_views *v) {
    const int64_t n = s->n_tokens;
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
    v->lora_rows = m->lora.n_slots > 0 ? s->lora_rows : NULL;
    v->lora_rows_dev = v->lora_rows && m->lora.dev_table ? s->lora_rows_dev : NULL;
    v->lora_split = v->lora_rows_dev && s->lora_dev_rows > 0 && s->lora_dev_rows < n ? s->lora_dev_rows : 0;
    v->lora_ws = bufs->lora_ws;
    v->lora_ws_bytes = bufs->lora_ws_bytes;
}

// LoRA of the n projections module, module + 1, ... of layer l, which read
// `in` and write adjacent column ranges of out (cols[p] each: Q|K|V,
// gate|up, or one), over the step's rows: each row's adapter adds scale *
// (in . A^T) . B^T (rows without one untouched). With the rows in backend
// memory (a graph step) one graph-safe launch pair covers the n, and reads
// rmsnorm(in, norm) when norm is given; else one lora_apply each (norm
// must be NULL: the caller normed `in`). A split step (v->lora_split) runs
// its first rows the graph-safe way and the rest by lora_apply.
static int layer_lora(const pg_model *m, const pg_step_views *v, int32_t l, int module, int n, const int64_t *cols,
                      pg_tensor out, pg_tensor in, const pg_bweight *norm) {
    const pg_model_lora *lo = &m->lora;
    int64_t r0 = 0; // the first row lora_apply takes
    if (v->lora_rows_dev) {
        PG_ARG(!norm || !v->lora_split, "LoRA: a split step takes normed rows");
        const pg_lora_dev_slot *tabs[PG_LORA_DEV_MAX_PROJ];
        for (int p = 0; p < n; p++) tabs[p] = pg_model_lora_dev_slots(lo, l, module + p);
        const int64_t nd = v->lora_split ? v->lora_split : out.rows;
        PG_TRY(m->be->ops->lora_apply_dev(m->be, pg_tensor_view(out, 0, nd, 0, out.cols),
                                          pg_tensor_view(in, 0, nd, 0, in.cols), norm, m->cfg.rms_eps,
                                          v->lora_rows_dev, tabs, lo->n_slots, cols, n, lo->max_rank, v->lora_ws,
                                          v->lora_ws_bytes));
        if (!v->lora_split) return 0;
        r0 = nd;
    }
    PG_ARG(!norm, "LoRA: a fused norm needs the graph-safe op");
    const int64_t rows = out.rows - r0;
    const pg_tensor x = pg_tensor_view(in, r0, rows, 0, in.cols);
    for (int p = 0, c0 = 0; p < n; c0 += (int)cols[p], p++)
        PG_TRY(m->be->ops->lora_apply(m->be, pg_tensor_view(out, r0, rows, c0, cols[p]), x, v->lora_rows + r0,
                                      pg_model_lora_slots(lo, l, module + p), lo->n_slots, v->lora_ws,
                                      v->lora_ws_bytes));
    return 0;
}

int pg_layer_all_reduce(const pg_model *m, pg_tensor x) {
    if (!m->comm) return 0;
    return m->comm->all_reduce_sum(m->comm, x.data, x.rows * x.stride, x.dtype);
}

int pg_layer_embed(const pg_model *m, pg_tensor x, const int32_t *tokens) {
    PG_TRY(m->be->ops->embed(m->be, x, tokens, m->tok_emb, m->shard.vocab0));
    return pg_layer_all_reduce(m, x);
}

// pg_layer_row_linear with the LoRA of projection `module` of layer l when
// v has LoRA rows (v NULL: none): each rank adds its adapters' part (its
// slice of A's columns) before the all-reduce, as it adds its product's.
static int row_linear(const pg_model *m, const pg_step_views *v, int32_t l, int module, pg_tensor x, pg_tensor in,
                      const pg_bweight *w, pg_tensor scratch) {
    // Rank 0 adds its part to the stream, the others write theirs over it;
    // the all-reduce then sums stream and parts.
    const bool residual = m->shard.rank == 0;
    PG_TRY(m->be->ops->linear(m->be, x, in, NULL, 0.0f, w, NULL, residual, scratch));
    if (v && v->lora_rows) PG_TRY(layer_lora(m, v, l, module, 1, &x.cols, x, in, NULL));
    return pg_layer_all_reduce(m, x);
}

int pg_layer_row_linear(const pg_model *m, pg_tensor x, pg_tensor in, const pg_bweight *w, pg_tensor scratch) {
    return row_linear(m, NULL, 0, 0, x, in, w, scratch);
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
    const pg_attn_opts o = {.scale = 1.0f / sqrtf((float)m->cfg.head_dim), .inv_freq = m->inv_freq,
                            .window = m->attn_window};
    return pg_layer_attention_with(m, l, kv, bufs, s, v, &o);
}

int pg_layer_attention_with(const pg_model *m, int32_t l, pg_bkv *kv, const pg_fwd_buffers *bufs,
                            const pg_fwd_step *s, const pg_step_views *v, const pg_attn_opts *o) {
    const pg_model_config *c = &m->cfg;
    const pg_model_shard *sh = &m->shard;
    const pg_model_layer *L = &m->layers[l];
    pg_backend *be = m->be;
    const int64_t qkv_cols[3] = {v->q.cols, v->k.cols, v->v.cols};
    if (v->lora_rows_dev && !v->lora_split) {
        // A graph step: the product keeps its fused norm, and the adapters'
        // shrink applies the same norm to x as it reads it.
        PG_TRY(be->ops->linear(be, v->qkv, v->x, L->attn_norm, c->rms_eps, L->qkv, L->qkv_bias, false, v->xn));
        PG_TRY(layer_lora(m, v, l, PG_LORA_Q, 3, qkv_cols, v->qkv, v->x, L->attn_norm));
    } else if (v->lora_rows) {
        // The adapters read the normed rows too: the norm into xn first,
        // then the product without one (which, neither normalising nor
        // accumulating, writes straight into qkv: the scratch is not used).
        PG_TRY(be->ops->rmsnorm(be, v->xn, v->x, L->attn_norm, c->rms_eps));
        PG_TRY(be->ops->linear(be, v->qkv, v->xn, NULL, 0.0f, L->qkv, L->qkv_bias, false, v->gu));
        PG_TRY(layer_lora(m, v, l, PG_LORA_Q, 3, qkv_cols, v->qkv, v->xn, NULL));
    } else {
        PG_TRY(be->ops->linear(be, v->qkv, v->x, L->attn_norm, c->rms_eps, L->qkv, L->qkv_bias, false, v->xn));
    }
    // O is the next weight read, after RoPE and attention, which leave the
    // memory idle at small batches: the backend may start moving it now (a
    // hint: backend.h prefetch).
    if (be->ops->prefetch) PG_TRY(be->ops->prefetch(be, L->o, v->n));
    if (L->q_norm) {
        PG_TRY(be->ops->head_rmsnorm(be, v->q, sh->n_heads, L->q_norm, c->rms_eps));
        PG_TRY(be->ops->head_rmsnorm(be, v->k, sh->n_kv_heads, L->k_norm, c->rms_eps));
    }
    pg_kv_shape ks = kv->shape;
    ks.lc_gemma = o->lc_gemma;
    if (bufs->kv_scales && ks.dtype == PG_KV_FP8_E4M3)
        ks.scales = bufs->kv_scales + (size_t)l * 2 * (size_t)sh->n_kv_heads;
    // Layer groups: this layer's copy of the slots and block tables, and its
    // KV tensor (engine/model/model.h pg_kv_layout).
    const int32_t *slots = s->slots;
    pg_attn_batch ab = s->attn;
    int32_t kl = l;
    if (s->kv_layout) {
        const int32_t g = s->kv_layout->group[l];
        slots += (size_t)g * (size_t)s->n_tokens;
        ab.block_tables += (size_t)g * (size_t)ab.n_seqs * (size_t)ab.bt_stride;
        kl = s->kv_layout->slot[l];
    }
    PG_TRY(be->ops->rope_kv_write(be, v->q, v->k, v->v, s->pos, slots, sh->n_heads, o->inv_freq, kv->k[kl], kv->v[kl],
                             ks));
    if (bufs->kv_amax)
        PG_TRY(kv_amax(m, v->k, v->v, v->n, bufs->kv_amax + (size_t)l * 2 * (size_t)sh->n_kv_heads));
    if (o->softcap > 0) // Gemma 2 (the loader checked the backend has it)
        PG_TRY(be->ops->attention_softcap(be, v->attn, v->q, &ab, kv->k[kl], kv->v[kl], ks, sh->n_heads, o->scale,
                                          o->window, o->softcap));
    else
        PG_TRY(be->ops->attention(be, v->attn, v->q, &ab, kv->k[kl], kv->v[kl], ks, sh->n_heads, o->scale,
                                  o->window));
    if (o->post_norm) return pg_layer_row_linear_norm(m, v->x, v->attn, L->o, o->post_norm, v->xn);
    return row_linear(m, v, l, PG_LORA_O, v->x, v->attn, L->o, v->xn);
}

int pg_layer_ffn_swiglu(const pg_model *m, int32_t l, const pg_step_views *v) {
    const pg_model_layer *L = &m->layers[l];
    pg_backend *be = m->be;
    if (v->lora_rows) {
        // gate and up take their adapters' products before the activation;
        // a graph step keeps the product's fused norm (the adapters' shrink
        // applies it too), an eager one norms into xn first.
        const int64_t f = m->shard.ffn, cols[2] = {f, f};
        if (v->lora_rows_dev && !v->lora_split) {
            PG_TRY(be->ops->linear(be, v->gu, v->x, L->ffn_norm, m->cfg.rms_eps, L->gate_up, NULL, false, v->xn));
            PG_TRY(layer_lora(m, v, l, PG_LORA_GATE, 2, cols, v->gu, v->x, L->ffn_norm));
        } else {
            PG_TRY(be->ops->rmsnorm(be, v->xn, v->x, L->ffn_norm, m->cfg.rms_eps));
            PG_TRY(be->ops->linear(be, v->gu, v->xn, NULL, 0.0f, L->gate_up, NULL, false, v->qkv)); // scratch unused
            PG_TRY(layer_lora(m, v, l, PG_LORA_GATE, 2, cols, v->gu, v->xn, NULL));
        }
        PG_TRY(be->ops->silu_mul(be, v->h, v->gu));
    } else {
        PG_TRY(be->ops->gate_up_silu(be, v->h, v->x, L->ffn_norm, m->cfg.rms_eps, L->gate_up, v->xn, v->gu));
    }
    return row_linear(m, v, l, PG_LORA_DOWN, v->x, v->h, L->down, v->xn);
}

int pg_layer_ffn_geglu(const pg_model *m, int32_t l, const pg_step_views *v) {
    const pg_model_layer *L = &m->layers[l];
    PG_TRY(m->be->ops->gate_up_gelu(m->be, v->h, v->x, L->ffn_norm, m->cfg.rms_eps, L->gate_up, v->xn, v->gu));
    return pg_layer_row_linear_norm(m, v->x, v->h, L->down, L->post_ffn_norm, v->xn);
}

// Every rank routes every row over every expert; its experts' part (a
// column slice of each, or under expert parallelism its whole experts,
// the others NULL) goes to the stream as a row-parallel product's does.
int pg_layer_ffn_moe(const pg_model *m, int32_t l, const pg_step_views *v) {
    if (m->shard.moe_alltoall) return pg_layer_ffn_moe_alltoall(m, l, v);
    const pg_model_layer *L = &m->layers[l];
    const pg_model_config *c = &m->cfg;
    const bool residual = m->shard.rank == 0;
    PG_TRY(m->be->ops->moe_ffn(m->be, v->x, v->x, L->ffn_norm, c->rms_eps, L->router,
                               (const pg_bweight *const *)L->exp_gate_up, (const pg_bweight *const *)L->exp_down,
                               c->n_experts, c->n_experts_used, c->moe_renorm, residual, v->moe_ws,
                               v->moe_ws_bytes));
    return pg_layer_all_reduce(m, v->x);
}
