// engine/runner/sampler.c - the tensor-parallel sampling exchanges
// (engine/runner/sampler.h).
#include "engine/runner/sampler.h"

#include "common/err.h"

static bool plain(const pg_sample_params *p) {
    return !p->forced && p->logprobs < 0 && p->repetition_penalty == 1.0f && p->presence_penalty == 0 &&
           p->frequency_penalty == 0 && p->n_ban == 0 && p->n_bias == 0 && p->n_mask == 0;
}
static bool plain_greedy(const pg_sample_params *p) { return plain(p) && (p->temperature <= 0 || p->top_k == 1); }

int32_t pg_sampler_exchange_k(const pg_sample_params *params, int32_t n, bool tp) {
    if (!tp) return 0;
    int32_t k = 1;
    for (int32_t i = 0; i < n; i++) {
        const pg_sample_params *p = &params[i];
        if (plain_greedy(p)) continue;
        if (!plain(p) || p->top_k < 2 || p->top_k > PG_TOPK_EXCHANGE_MAX) return 0;
        if (p->top_k > k) k = p->top_k;
    }
    return k;
}

// The LM head of this rank's vocabulary slice for the sampled rows, each
// row's maximum and the exchange of those: bufs->cand holds every rank's.
static int head_maxima(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_tensor *part) {
    const pg_model_shard *sh = &m->shard;
    pg_backend *be = m->be;
    const int64_t ns = s->n_logits;
    PG_TRY(pg_model_head_slice(m, bufs, s, part));
    // Rank r's maxima at cand + r * ns: the all-gather's layout.
    PG_TRY(be->ops->argmax_rows(be, bufs->cand + (size_t)sh->rank * (size_t)ns, *part));
    return m->comm->all_gather(m->comm, bufs->cand + (size_t)sh->rank * (size_t)ns, bufs->cand,
                               sizeof(pg_argmax) * (size_t)ns);
}

int pg_sampler_tp_greedy(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s, pg_sample_out *out) {
    const pg_model_shard *sh = &m->shard;
    const int64_t ns = s->n_logits;
    PG_ARG(m->comm, "pg_sampler_tp_greedy without tensor parallelism");
    if (ns == 0) return 0;
    pg_tensor part;
    PG_TRY(head_maxima(m, bufs, s, &part));
    return m->be->ops->argmax_pick(m->be, out, bufs->cand, sh->size, (int32_t)ns, sh->vocab);
}

int pg_sampler_tp_topk(const pg_model *m, const pg_fwd_buffers *bufs, const pg_fwd_step *s,
                       const pg_sample_params *params, int32_t k) {
    const pg_model_shard *sh = &m->shard;
    pg_backend *be = m->be;
    const int64_t ns = s->n_logits;
    PG_ARG(m->comm && bufs->topk, "pg_sampler_tp_topk without tensor parallelism");
    PG_ARG(k >= 1 && k <= PG_TOPK_EXCHANGE_MAX, "pg_sampler_tp_topk: k %d", k);
    if (ns == 0) return 0;
    pg_tensor part;
    PG_TRY(head_maxima(m, bufs, s, &part));
    // The maxima give every row's mx, so each rank orders its slice by the
    // sampler's own scaled values: the k best of the union of every rank's
    // k best are the k best of the whole row, float ties included.
    pg_argmax *mine = bufs->topk + (size_t)sh->rank * (size_t)ns * (size_t)k;
    PG_TRY(be->ops->topk_rows(be, mine, part, k, bufs->cand, sh->size, params, sh->vocab0));
    PG_TRY(m->comm->all_gather(m->comm, mine, bufs->topk, sizeof(pg_argmax) * (size_t)ns * (size_t)k));
    return be->ops->topk_scatter(be, pg_tensor_view(bufs->logits, 0, ns, 0, m->cfg.vocab_size), bufs->topk, sh->size,
                                 k);
}
