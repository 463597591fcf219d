// engine/runner/runner_spec.c - speculative decoding's rows in the runner
// (docs/speculative_decoding.md): a plan entry with n_draft drafts samples
// its last n_draft + 1 rows, each an ordinary sampled row with the entry's
// parameters, row j with the seed counter n_generated + j, so the sampler,
// its tensor-parallel exchanges and the copy back are the plain ones. At
// the end the rows' tokens are checked against the drafts here, on the
// host: drafts are kept while they equal their row's token, then that
// row's token is emitted (pg_spec_verify_greedy's rule). Row j's logits
// see the history plain decoding would have at that position whenever the
// drafts before it were kept, and its draw uses the same seed and counter,
// so the emitted tokens are exactly plain decoding's, greedy or sampled,
// seeded or not, however the steps are batched: the same text with and
// without speculation. (For a proposer without a model this rule accepts a
// draft d with probability p(d), as the rejection rule with a one-hot
// draft distribution does; a draft model's proposals need that rule,
// pg_spec_verify_sample.) The drafts are copied at begin: the plan is gone
// by the end (sched_advance).
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/runner/runner_int.h"
#include "engine/spec/verify.h"

void runner_spec_alloc(pg_runner *r) {
    const size_t S = (size_t)r->max_seqs;
    for (int b = 0; b < 2; b++) {
        r->spec[b].seq = pg_xcalloc(S, sizeof(int64_t));
        r->spec[b].k = pg_xcalloc(S, sizeof(int32_t));
        r->spec[b].draft = pg_xcalloc(S * PG_MAX_DRAFT, sizeof(int32_t));
        r->spec[b].n_out = 0;
    }
    r->spec_out = pg_xcalloc((size_t)r->max_seqs, sizeof(pg_seq_output));
}

void runner_spec_free(pg_runner *r) {
    for (int b = 0; b < 2; b++) {
        free(r->spec[b].seq);
        free(r->spec[b].k);
        free(r->spec[b].draft);
    }
    free(r->spec_out);
}

int32_t runner_spec_record(pg_runner *r, int buf, const pg_plan_seq *s) {
    struct runner_spec_buf *sb = &r->spec[buf];
    const int32_t k = s->n_draft;
    if (k < 0 || k > PG_MAX_DRAFT || k >= s->n_tokens)
        return pg_err_set(PG_EINVAL, "plan: sequence %lld has %d drafts in %d tokens", (long long)s->seq_id, k,
                          s->n_tokens);
    if (sb->n_out >= r->max_seqs)
        return pg_err_set(PG_EINVAL, "plan: more than %d sampled sequences", r->max_seqs);
    const int32_t e = sb->n_out++;
    sb->seq[e] = s->seq_id;
    sb->k[e] = k;
    if (k) memcpy(sb->draft + (size_t)e * PG_MAX_DRAFT, s->tokens + s->n_tokens - k, sizeof(int32_t) * (size_t)k);
    return k + 1;
}

int32_t runner_spec_output(const pg_runner *r, int buf, int32_t e, int32_t row, const pg_sample_out *so,
                           pg_seq_output *o) {
    const struct runner_spec_buf *sb = &r->spec[buf];
    const int32_t k = sb->k[e];
    if (k == 0) return 1;
    int32_t target[PG_MAX_DRAFT + 1];
    for (int32_t i = 0; i <= k; i++) target[i] = so[i].token;
    pg_spec_result res;
    PG_CHECK(pg_spec_verify_greedy(sb->draft + (size_t)e * PG_MAX_DRAFT, k, target, &res) == 0);
    o->n_draft = k;
    o->n_accepted = res.n_accepted;
    // Accepted drafts equal their rows' tokens, so each emitted token's
    // logprob and top entries are its own row's.
    pg_seq_output *rows = r->spec_out + row;
    for (int32_t i = 0; i < res.n_emitted; i++) {
        o->spec_tokens[i] = res.tokens[i];
        o->spec_logprobs[i] = so[i].logprob;
        pg_seq_output *t = &rows[i];
        memset(t, 0, sizeof *t);
        t->seq_id = o->seq_id;
        t->token = res.tokens[i];
        t->logprob = so[i].logprob;
        t->n_top = runner_copy_top(&so[i], t->top_ids, t->top_logprobs);
    }
    o->spec_rows = rows;
    return k + 1;
}
