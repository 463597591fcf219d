// engine/runner/runner_prompt_logprobs.c - prompt logprobs: scoring the rows of
// prefill chunks at the prompt's own next tokens.
//
// A plan entry with n_prompt_lp > 0 wants, for each of its first
// n_prompt_lp rows (position p), the log-softmax of the logits at p taken
// at the prompt token p + 1, its rank and the top-k. After the layers the
// runner runs those rows through the final norm and the LM head in slices
// of max_seqs rows, the capacity of the logits buffer the sampled rows use
// (so a 4,000-token prompt never needs 4,000 x vocab logits at once), and
// scores each slice with the backend's sampler in its forced mode
// (kernels/sampling.h), which both samplers implement. The scores go to a
// device array of max_num_batched_tokens entries, come back with one copy
// per step, and leave pg_runner_end as pg_step_output.prompt_lp. The
// slices run before the sampled rows' tail, so the logits buffer holds the
// sampled rows' logits afterwards (pg_runner_last_logits).
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/runner/runner_int.h"

// The per-step input image: rows [T] then params [T], 16-byte aligned.
static size_t params_offset(int32_t max_tokens) {
    return ((size_t)max_tokens * sizeof(int32_t) + 15) / 16 * 16;
}

size_t runner_plp_in_bytes(int32_t max_tokens) {
    return params_offset(max_tokens) + (size_t)max_tokens * sizeof(pg_sample_params);
}

size_t runner_plp_out_bytes(int32_t max_tokens) {
    return (size_t)max_tokens * sizeof(pg_sample_out);
}

int runner_plp_alloc(pg_runner *r) {
    pg_backend *be = r->be;
    const size_t T = (size_t)r->max_tokens;
    for (int i = 0; i < 2; i++) {
        PG_TRY(be->dev->host_alloc(be, runner_plp_in_bytes(r->max_tokens), (void **)&r->plp_in_host[i]));
        PG_TRY(be->dev->host_alloc(be, runner_plp_out_bytes(r->max_tokens), (void **)&r->plp_host[i]));
        r->plp_seq[i] = pg_xcalloc(T, sizeof(int64_t));
        r->plp_pos[i] = pg_xcalloc(T, sizeof(int32_t));
    }
    r->plp_outs = pg_xcalloc(T, sizeof(pg_prompt_logprob));
    return 0;
}

void runner_plp_free(pg_runner *r) {
    for (int i = 0; i < 2; i++) {
        if (r->plp_in_host[i]) r->be->dev->host_free(r->be, r->plp_in_host[i]);
        if (r->plp_host[i]) r->be->dev->host_free(r->be, r->plp_host[i]);
        free(r->plp_seq[i]);
        free(r->plp_pos[i]);
    }
    free(r->plp_outs);
}

int runner_plp_collect(pg_runner *r, const pg_batch_plan *p, int buf) {
    int32_t n = 0;
    int32_t *rows = (int32_t *)r->plp_in_host[buf];
    pg_sample_params *pp = (pg_sample_params *)(r->plp_in_host[buf] + params_offset(r->max_tokens));
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pg_plan_seq *s = &p->seqs[i];
        if (s->n_prompt_lp <= 0) continue;
        if (s->n_prompt_lp > s->n_tokens || !s->sp || !s->history ||
            (int64_t)s->start_pos + s->n_prompt_lp >= s->n_history)
            return pg_err_set(PG_EINVAL, "plan: sequence %lld scores %d prompt rows of %d (history %d)",
                              (long long)s->seq_id, s->n_prompt_lp, s->n_tokens, s->n_history);
        int32_t k = s->sp->prompt_logprobs;
        k = k < 0 ? 0 : k > PG_MAX_LOGPROBS ? PG_MAX_LOGPROBS : k;
        for (int32_t t = 0; t < s->n_prompt_lp; t++, n++) {
            const int32_t pos = s->start_pos + t;
            rows[n] = r->row0[i] + t;
            memset(&pp[n], 0, sizeof pp[n]);
            pp[n].forced = 1;
            pp[n].forced_token = s->history[pos + 1];
            pp[n].logprobs = k;
            r->plp_seq[buf][n] = s->seq_id;
            r->plp_pos[buf][n] = pos + 1;
        }
    }
    r->n_plp = n; // check_plan bounds the plan's tokens by max_tokens, so n fits
    return 0;
}

int runner_plp_enqueue(pg_runner *r, int32_t n_tokens, int buf) {
    const int32_t n = r->n_plp;
    if (n == 0) return 0;
    pg_backend *be = r->be;
    const int32_t *rows = (const int32_t *)r->plp_in_dev;
    const pg_sample_params *params = (const pg_sample_params *)(r->plp_in_dev + params_offset(r->max_tokens));
    PG_TRY(be->dev->upload(be, r->plp_in_dev, r->plp_in_host[buf], sizeof(int32_t) * (size_t)n));
    PG_TRY(be->dev->upload(be, (void *)params, r->plp_in_host[buf] + params_offset(r->max_tokens),
                      sizeof(pg_sample_params) * (size_t)n));
    const int32_t S = r->max_seqs; // rows of bufs.lg_in / bufs.logits and of the sampler workspace
    for (int32_t off = 0; off < n; off += S) {
        const int32_t m = n - off < S ? n - off : S;
        pg_fwd_step fs = {.n_tokens = n_tokens, .n_logits = m, .logit_rows = rows + off};
        PG_TRY(pg_model_forward_logits(r->model, &r->bufs, &fs));
        pg_tensor logits = pg_tensor_view(r->bufs.logits, 0, m, 0, r->bufs.logits.cols);
        // Forced rows read no history: any valid pointer does for tokens.
        PG_TRY(be->ops->sample(be, r->plp_out_dev + off, logits, params + off, rows, r->samp_ws,
                          r->samp_ws_bytes));
    }
    return be->dev->download(be, r->plp_host[buf], r->plp_out_dev, sizeof(pg_sample_out) * (size_t)n);
}

void runner_plp_output(pg_runner *r, int buf, int32_t n, pg_step_output *out) {
    for (int32_t j = 0; j < n; j++) {
        const pg_sample_out *so = &r->plp_host[buf][j];
        pg_prompt_logprob *o = &r->plp_outs[j];
        memset(o, 0, sizeof *o);
        o->seq_id = r->plp_seq[buf][j];
        o->pos = r->plp_pos[buf][j];
        o->token = so->token;
        o->logprob = so->logprob;
        o->rank = so->rank;
        o->n_top = runner_copy_top(so, o->top_ids, o->top_logprobs);
    }
    out->n_prompt_lp = n;
    out->prompt_lp = r->plp_outs;
}
