// engine/model/model.c - the model's forward as the runner calls it: the
// layers through the model's family (engine/model/family.h: one builder
// file per family over the shared layer helpers of engine/model/layers.h),
// then the head every family shares: the logit rows' final norm and LM
// head, with the tensor-parallel exchanges of greedy and top-k sampling.
//
// Every step is one op of kernels/backend.h at the fused granularity the
// GPU runs (the backend picks GEMV or GEMM, fuses the norm into the GEMV's
// prologue, ...), so no model file has device code or copies.
#include "engine/model/model.h"

#include "engine/model/family.h"

#include <stdlib.h>

#include "common/err.h"

int pg_model_forward_layers(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs,
                            const pg_fwd_step *s) {
    return m->family->forward_layers(m, kv, bufs, s);
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
    PG_TRY(be->ops->gather(be, g, x, s->logit_rows));
    PG_TRY(be->ops->rmsnorm(be, g, g, m->final_norm, c->rms_eps));
    if (!m->comm) return be->ops->linear(be, logits, g, NULL, 0.0f, m->lm_head, NULL, false, g);
    // This rank's vocabulary slice, then every rank's side by side: each
    // rank samples from all the logits, and the same values give the same
    // token on every rank (docs/tensor_parallel.md).
    pg_tensor part = pg_tensor_view(bufs->lg_part, 0, ns, 0, sh->vocab);
    part.stride = sh->vocab; // contiguous [ns][vocab slice]: what the all-gather moves
    PG_TRY(be->ops->linear(be, part, g, NULL, 0.0f, m->lm_head, NULL, false, g));
    const size_t el = part.dtype == PG_DTYPE_F32 ? 4 : 2, bytes = (size_t)ns * (size_t)sh->vocab * el;
    PG_TRY(m->comm->all_gather(m->comm, part.data, bufs->lg_all, bytes));
    for (int32_t r = 0; r < sh->size; r++) {
        pg_tensor src = {(char *)bufs->lg_all + (size_t)r * bytes, part.dtype, ns, sh->vocab, sh->vocab};
        PG_TRY(be->ops->copy(be, pg_tensor_view(logits, 0, ns, (int64_t)r * sh->vocab, sh->vocab), src));
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
    PG_TRY(be->ops->gather(be, g, x, s->logit_rows));
    PG_TRY(be->ops->rmsnorm(be, g, g, m->final_norm, c->rms_eps));
    *part = pg_tensor_view(bufs->lg_part, 0, ns, 0, sh->vocab);
    part->stride = sh->vocab;
    PG_TRY(be->ops->linear(be, *part, g, NULL, 0.0f, m->lm_head, NULL, false, g));
    // Rank r's maxima at cand + r * ns: the all-gather's layout.
    PG_TRY(be->ops->argmax_rows(be, bufs->cand + (size_t)sh->rank * (size_t)ns, *part));
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
    return m->be->ops->argmax_pick(m->be, out, bufs->cand, sh->size, (int32_t)ns, sh->vocab);
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
    PG_TRY(be->ops->topk_rows(be, mine, part, k, bufs->cand, sh->size, params, sh->vocab0));
    PG_TRY(m->comm->all_gather(m->comm, mine, bufs->topk, sizeof(pg_argmax) * (size_t)ns * (size_t)k));
    return be->ops->topk_scatter(be, pg_tensor_view(bufs->logits, 0, ns, 0, m->cfg.vocab_size), bufs->topk, sh->size, k);
}
