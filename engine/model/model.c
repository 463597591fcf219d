// engine/model/model.c - the Llama-family forward pass: the one place a
// transformer layer is written.
//
//   x = emb[tokens]
//   per layer:  qkv = RMSNorm(x) * attn_norm . Wqkv^T (+ bias)     (Qwen2: bias)
//               q, k = per-head RMSNorm(q, k)                      (Qwen3)
//               q, k = RoPE(q, k); cache[slots] = k, v
//               attn = paged causal attention(q, cache)
//               x += attn . Wo^T                                   (residual folded in)
//               h = silu(g) * u, [g | u] = RMSNorm(x) * ffn_norm . Wgu^T
//               x += h . Wdown^T
//   logits = RMSNorm(x[logit rows]) * final_norm . Wlm^T
//
// Every step is one op of kernels/backend.h at the fused granularity the
// GPU runs (the backend picks GEMV or GEMM, fuses the norm into the GEMV's
// prologue, ...), so this file has no device code and no copies.
#include "engine/model/model.h"

#include <math.h>
#include <stdlib.h>

#include "common/err.h"

// The residual stream summed across ranks (each rank added its partial
// product; rank 0 also kept the stream): a no-op without tensor parallelism.
static int reduce(const pg_model *m, pg_tensor x) {
    if (!m->comm) return 0;
    return m->comm->all_reduce_sum(m->comm, x.data, x.rows * x.stride, x.dtype);
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
        if ((rc = m->be->read_f32(m->be, t == 0 ? k : v, n, row)) < 0) break;
        for (int64_t i = 0; i < n * w; i++) {
            const float a = fabsf(row[i]);
            float *mx = &amax[t * nkv + (i % w) / hd];
            if (a > *mx) *mx = a;
        }
    }
    free(row);
    return rc;
}

int pg_model_forward_layers(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs,
                            const pg_fwd_step *s) {
    const pg_model_config *c = &m->cfg;
    const pg_model_shard *sh = &m->shard;
    pg_backend *be = m->be;
    const int64_t n = s->n_tokens, hd = c->head_dim;
    const int64_t q_dim = (int64_t)sh->n_heads * hd, kv_dim = (int64_t)sh->n_kv_heads * hd;
    if (n == 0) return 0;
    const float scale = 1.0f / sqrtf((float)hd);
    pg_tensor x = pg_tensor_view(bufs->x, 0, n, 0, bufs->x.cols);
    pg_tensor xn = pg_tensor_view(bufs->xn, 0, n, 0, bufs->xn.cols);
    pg_tensor qkv = pg_tensor_view(bufs->qkv, 0, n, 0, bufs->qkv.cols);
    pg_tensor q = pg_tensor_view(qkv, 0, n, 0, q_dim);
    pg_tensor k = pg_tensor_view(qkv, 0, n, q_dim, kv_dim);
    pg_tensor v = pg_tensor_view(qkv, 0, n, q_dim + kv_dim, kv_dim);
    pg_tensor attn = pg_tensor_view(bufs->attn, 0, n, 0, q_dim);
    pg_tensor gu = pg_tensor_view(bufs->gu, 0, n, 0, bufs->gu.cols);
    pg_tensor h = pg_tensor_view(bufs->h, 0, n, 0, bufs->h.cols);
    // Row-parallel products: rank 0 adds its part to the stream, the others
    // write theirs over it; the all-reduce then sums stream and parts.
    const bool residual = sh->rank == 0;

    // --cpu-offload-gb: the first two offloaded layers' copies start now,
    // each later one once the layer two before it is queued (its slot).
    PG_TRY(pg_model_offload_prefetch(m, 0));
    PG_TRY(pg_model_offload_prefetch(m, 1));
    PG_TRY(be->embed(be, x, s->tokens, m->tok_emb, sh->vocab0));
    PG_TRY(reduce(m, x));
    for (int32_t l = 0; l < c->n_layers; l++) {
        const pg_model_layer *L = &m->layers[l];
        PG_TRY(pg_model_offload_wait(m, l));
        // Attention block.
        PG_TRY(be->linear(be, qkv, x, L->attn_norm, c->rms_eps, L->qkv, L->qkv_bias, false, xn));
        if (L->q_norm) {
            PG_TRY(be->head_rmsnorm(be, q, sh->n_heads, L->q_norm, c->rms_eps));
            PG_TRY(be->head_rmsnorm(be, k, sh->n_kv_heads, L->k_norm, c->rms_eps));
        }
        pg_kv_shape ks = kv->shape;
        if (bufs->kv_scales && ks.dtype == PG_KV_FP8_E4M3)
            ks.scales = bufs->kv_scales + (size_t)l * 2 * (size_t)sh->n_kv_heads;
        PG_TRY(be->rope_kv_write(be, q, k, v, s->pos, s->slots, sh->n_heads, m->inv_freq, kv->k[l], kv->v[l], ks));
        if (bufs->kv_amax) PG_TRY(kv_amax(m, k, v, n, bufs->kv_amax + (size_t)l * 2 * (size_t)sh->n_kv_heads));
        PG_TRY(be->attention(be, attn, q, &s->attn, kv->k[l], kv->v[l], ks, sh->n_heads, scale));
        PG_TRY(be->linear(be, x, attn, NULL, 0.0f, L->o, NULL, residual, xn));
        PG_TRY(reduce(m, x));
        // MLP block.
        PG_TRY(be->gate_up_silu(be, h, x, L->ffn_norm, c->rms_eps, L->gate_up, xn, gu));
        PG_TRY(be->linear(be, x, h, NULL, 0.0f, L->down, NULL, residual, xn));
        PG_TRY(reduce(m, x));
        PG_TRY(pg_model_offload_prefetch(m, l + 2));
    }
    return 0;
}

int pg_model_forward_logits(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s) {
    const pg_model_config *c = &m->cfg;
    const pg_model_shard *sh = &m->shard;
    pg_backend *be = m->be;
    const int64_t ns = s->n_logits;
    if (ns == 0) return 0;
    pg_tensor x = pg_tensor_view(bufs->x, 0, s->n_tokens, 0, bufs->x.cols);
    pg_tensor g = pg_tensor_view(bufs->lg_in, 0, ns, 0, bufs->lg_in.cols);
    pg_tensor logits = pg_tensor_view(bufs->logits, 0, ns, 0, c->vocab_size);
    // Only the rows that sample need the final norm and the LM head.
    PG_TRY(be->gather(be, g, x, s->logit_rows));
    PG_TRY(be->rmsnorm(be, g, g, m->final_norm, c->rms_eps));
    if (!m->comm) return be->linear(be, logits, g, NULL, 0.0f, m->lm_head, NULL, false, g);
    // This rank's vocabulary slice, then every rank's side by side: each
    // rank samples from all the logits, and the same values give the same
    // token on every rank (docs/tensor_parallel.md).
    pg_tensor part = pg_tensor_view(bufs->lg_part, 0, ns, 0, sh->vocab);
    part.stride = sh->vocab; // contiguous [ns][vocab slice]: what the all-gather moves
    PG_TRY(be->linear(be, part, g, NULL, 0.0f, m->lm_head, NULL, false, g));
    const size_t el = part.dtype == PG_DTYPE_F32 ? 4 : 2, bytes = (size_t)ns * (size_t)sh->vocab * el;
    PG_TRY(m->comm->all_gather(m->comm, part.data, bufs->lg_all, bytes));
    for (int32_t r = 0; r < sh->size; r++) {
        pg_tensor src = {(char *)bufs->lg_all + (size_t)r * bytes, part.dtype, ns, sh->vocab, sh->vocab};
        PG_TRY(be->copy(be, pg_tensor_view(logits, 0, ns, (int64_t)r * sh->vocab, sh->vocab), src));
    }
    return 0;
}

// The LM head of this rank's vocabulary slice for the sampled rows, each
// row's maximum and the exchange of those: bufs->cand holds every rank's.
static int head_maxima(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_tensor *part) {
    const pg_model_config *c = &m->cfg;
    const pg_model_shard *sh = &m->shard;
    pg_backend *be = m->be;
    const int64_t ns = s->n_logits;
    pg_tensor x = pg_tensor_view(bufs->x, 0, s->n_tokens, 0, bufs->x.cols);
    pg_tensor g = pg_tensor_view(bufs->lg_in, 0, ns, 0, bufs->lg_in.cols);
    PG_TRY(be->gather(be, g, x, s->logit_rows));
    PG_TRY(be->rmsnorm(be, g, g, m->final_norm, c->rms_eps));
    *part = pg_tensor_view(bufs->lg_part, 0, ns, 0, sh->vocab);
    part->stride = sh->vocab;
    PG_TRY(be->linear(be, *part, g, NULL, 0.0f, m->lm_head, NULL, false, g));
    // Rank r's maxima at cand + r * ns: the all-gather's layout.
    PG_TRY(be->argmax_rows(be, bufs->cand + (size_t)sh->rank * (size_t)ns, *part));
    return m->comm->all_gather(m->comm, bufs->cand + (size_t)sh->rank * (size_t)ns, bufs->cand,
                               sizeof(pg_argmax) * (size_t)ns);
}

int pg_model_forward_greedy(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_sample_out *out) {
    const pg_model_shard *sh = &m->shard;
    const int64_t ns = s->n_logits;
    PG_ARG(m->comm, "pg_model_forward_greedy without tensor parallelism");
    if (ns == 0) return 0;
    pg_tensor part;
    PG_TRY(head_maxima(m, bufs, s, &part));
    return m->be->argmax_pick(m->be, out, bufs->cand, sh->size, (int32_t)ns, sh->vocab);
}

int pg_model_forward_topk(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s,
                          const pg_sample_params *params, int32_t k) {
    const pg_model_shard *sh = &m->shard;
    pg_backend *be = m->be;
    const int64_t ns = s->n_logits;
    PG_ARG(m->comm && bufs->topk, "pg_model_forward_topk without tensor parallelism");
    PG_ARG(k >= 1 && k <= PG_TOPK_EXCHANGE_MAX, "pg_model_forward_topk: k %d", k);
    if (ns == 0) return 0;
    pg_tensor part;
    PG_TRY(head_maxima(m, bufs, s, &part));
    // The maxima give every row's mx, so each rank orders its slice by the
    // sampler's own scaled values: the k best of the union of every rank's
    // k best are the k best of the whole row, float ties included.
    pg_argmax *mine = bufs->topk + (size_t)sh->rank * (size_t)ns * (size_t)k;
    PG_TRY(be->topk_rows(be, mine, part, k, bufs->cand, sh->size, params, sh->vocab0));
    PG_TRY(m->comm->all_gather(m->comm, mine, bufs->topk, sizeof(pg_argmax) * (size_t)ns * (size_t)k));
    return be->topk_scatter(be, pg_tensor_view(bufs->logits, 0, ns, 0, m->cfg.vocab_size), bufs->topk, sh->size, k);
}
