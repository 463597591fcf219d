// scheduler/sched_spec.c - speculative decoding in the scheduler
// (docs/speculative_decoding.md): which sequences get a draft, how much of
// the step it may take, and what happens to the tokens its verification
// kept. The guess comes from the caller (sched_spec_config.propose, per
// sequence while the step is planned, or propose_batch, once per step for
// every speculating sequence after it is planned: spec_batch_fill) and the
// verification from the runner, so this file only counts slots and tokens.
//
// A decoding sequence has its last token in the history, not yet computed
// (position H - 1 for a history of H). With a draft d[0 .. k) it is planned
// as the chunk [last, d0 .. d(k-1)] at positions H - 1 .. H - 1 + k, which
// gives the target's view after the last token and after each draft. The
// runner keeps a drafts (0 <= a <= k) and adds its own token, so the
// history grows by a + 1 and the positions H - 1 .. H - 1 + a hold KV of
// accepted tokens: n_computed becomes H + a, the new history length minus
// one, exactly as after a + 1 plain steps. The slots beyond are dropped
// (kvp_table_truncate): the next step writes those positions again with
// the right tokens, and kvp_table_commit only ever hashes computed
// positions, so no block holding a rejected token reaches the prefix cache.
#include <stdlib.h>

#include "common/err.h"
#include "scheduler/sched_int.h"

static int32_t min32(int32_t a, int32_t b) { return a < b ? a : b; }

static int32_t spec_max_seqs(const sched *s) {
    int32_t m = s->cfg.spec.max_running_seqs;
    return m > 0 ? m : SCHED_SPEC_DEFAULT_MAX_SEQS;
}

// Requests whose output the runner's verification reproduces token for
// token (runner_spec.c: each row draws what plain decoding would draw at its
// position): greedy or sampled, seeded or not, with a logit_bias (the same
// at every position), penalties (each row's history holds the drafts before
// it), logprobs (each token carries its row's) and masks (each row has
// its own); any n: each sequence of an n > 1 request drafts from its own
// history and is verified with its own seed (request seed + index) at its
// own counters, so each choice is what it would be without drafts. Only
// min_tokens' ban keeps a sequence from drafting (until it is reached).
static bool spec_eligible(const sched *s, const req *r, const seq *q) {
    const pg_sampling_params *sp = &r->sp;
    // Penalties are fine: the runner extends a draft row's penalty history
    // by the drafts before it (engine/runner/runner.c fill_params).
    // So are logprobs: each emitted token carries its own row's
    // (pg_seq_output.spec_rows); and masks (structured outputs, allowed
    // and bad words): the engine gives each draft row the mask after the
    // drafts before it (engine/engine_masks.c).
    return s->cfg.spec.num_tokens > 0 && r->state == RQ_RUNNING && q->finish == SCHED_FINISH_NONE &&
           q->n_hist - r->n_prompt >= sp->min_tokens;
}

// Sampled rows are bounded by max_num_seqs (the runner's logit rows and
// sampler are sized for it): a draft of k takes k rows beyond its
// sequence's own. Drafts get only rows no sequence could take this step -
// those of the running sequences and of every waiting or swapped one are
// set aside - so a guess never delays anyone's admission. Above the
// backoff (spec_max_seqs running sequences) nobody speculates.
void spec_step_begin(sched *s) {
    s->spec_rows = 0;
    if (s->cfg.spec.num_tokens <= 0 || s->running_seqs > spec_max_seqs(s)) return;
    int32_t spare = s->cfg.max_num_seqs - s->running_seqs;
    const rheap *heaps[2] = {&s->waiting, &s->swapped};
    for (int32_t h = 0; h < 2; h++)
        for (int32_t i = 0; i < heaps[h]->n && spare > 0; i++) spare -= heaps[h]->v[i]->n_live;
    s->spec_rows = spare > 0 ? spare : 0;
}

// Miss backoff: a draft of which nothing was accepted cost its rows for
// nothing (on a compute-bound CPU nearly a step per row), and the next one
// from the same text is likely no better. After m such drafts in a row the
// sequence decodes plainly for 2^m - 1 steps (at most SPEC_MAX_SKIP); any
// accepted token resets m.
#define SPEC_MAX_SKIP 31

// Adaptive draft length: a draft row costs nearly a plain step on this CPU
// (0.3-0.6 of one) whether or not it is kept, so a sequence whose drafts
// break off after a tokens should not keep asking for k. Each sequence
// keeps a length L (in 1/16 tokens, starting at k) and asks for round(L)
// tokens, within 1 .. k:
// - a draft of n tokens all accepted: the run may go on past it, so L
//   becomes at least n + 1 (at most k): the next draft may be one longer;
// - a draft that kept 0 < a < n: the run broke after a, so L moves half
//   way to a + 1 (an exponential moving average, weight 1/2): drafts that
//   keep one token shrink it 5 -> 4 -> 3 -> 2 and keep it at 2, and one
//   partial draft among full ones costs a draft or two of shorter length,
//   then full ones grow it back by one each;
// - a miss (nothing kept) leaves L alone: it says the guess was wrong, not
//   how long a right one runs (n-gram drafts on code are mostly all or
//   nothing), and the miss backoff (above) already skips steps after it.
// The length only decides how many tokens a draft may take, never which,
// so the output is unchanged.
#define SPEC_LEN_ONE 16 // seq.spec_len units per token

static int32_t spec_length(const sched *s, const seq *q) {
    const int32_t k = s->cfg.spec.num_tokens;
    if (s->cfg.spec.fixed_length || q->spec_len <= 0) return k;
    const int32_t len = (q->spec_len + SPEC_LEN_ONE / 2) / SPEC_LEN_ONE;
    return len < 1 ? 1 : len > k ? k : len;
}

static void spec_note_result(const sched *s, seq *q, int32_t n_draft, int32_t accepted) {
    const int32_t k = s->cfg.spec.num_tokens;
    const int32_t len = q->spec_len > 0 ? q->spec_len : k * SPEC_LEN_ONE;
    const int32_t x = (accepted + 1 < k ? accepted + 1 : k) * SPEC_LEN_ONE;
    if (accepted >= n_draft) q->spec_len = len > x ? len : x;
    else if (accepted > 0) q->spec_len = (len + x) / 2;
    if (accepted > 0) {
        q->spec_misses = 0;
        return;
    }
    if (q->spec_misses < 5) q->spec_misses++;
    int32_t skip = (1 << q->spec_misses) - 1;
    q->spec_skip = skip < SPEC_MAX_SKIP ? skip : SPEC_MAX_SKIP;
}

int32_t spec_propose(sched *s, req *r, seq *q, int32_t left) {
    q->n_draft = 0;
    if (s->spec_rows <= 0 || q->unres || !spec_eligible(s, r, q)) return 0;
    if (q->spec_skip > 0) {
        q->spec_skip--;
        return 0;
    }
    // Room: the sequence's draft length (spec_length), every emitted token
    // within max_tokens (a draft of k may emit k + 1), every written
    // position within max_model_len, the step's token budget (the last
    // token takes one) and the spare rows.
    const int32_t n_gen = q->n_hist - r->n_prompt;
    int32_t limit = min32(spec_length(s, q), r->sp.max_tokens - n_gen - 1);
    limit = min32(limit, s->cfg.max_model_len - q->n_hist);
    limit = min32(limit, left - 1);
    limit = min32(limit, s->spec_rows);
    if (limit <= 0) return 0;
    if (!q->draft) q->draft = pg_xmalloc(sizeof(int32_t) * (PG_MAX_DRAFT + 1));
    int32_t k = limit; // batched: provisional, spec_batch_fill trims it
    if (!s->cfg.spec.propose_batch) {
        k = s->cfg.spec.propose(s->cfg.spec.ctx, q->hist, q->n_hist, limit, q->draft + 1);
        if (k <= 0) return 0;
        k = min32(k, limit);
    }
    q->draft[0] = q->hist[q->n_hist - 1];
    q->n_draft = k;
    s->spec_rows -= k;
    return k;
}

// Every plan entry with a draft holds a provisional one here (a request
// planned and then not admitted, or preempted, has none in the plan); its
// history stays put until sched_update, so the callee may read it. A
// draft cut to got < limit is what spec_drop does to one cut to 0: fewer
// tokens and rows, and the table truncated to the positions still written
// (the blocks of the cut slots are fresh, never copied or cached).
void spec_batch_fill(sched *s) {
    if (!s->cfg.spec.propose_batch) return;
    int32_t n = 0;
    for (int32_t k = 0; k < s->plan.n_seqs; k++) {
        const pg_plan_seq *ps = &s->pseqs[k];
        if (ps->n_draft <= 0) continue;
        seq *q = s->pref[k];
        s->spec_items[n] = (sched_propose_item){q->hist, q->n_hist, ps->n_draft, q->draft + 1, 0,
                                                q->rq->n_prompt};
        s->spec_entry[n++] = k;
    }
    if (n == 0) return;
    s->cfg.spec.propose_batch(s->cfg.spec.ctx, s->spec_items, n);
    for (int32_t i = 0; i < n; i++) {
        pg_plan_seq *ps = &s->pseqs[s->spec_entry[i]];
        seq *q = s->pref[s->spec_entry[i]];
        const int32_t limit = s->spec_items[i].limit, got = s->spec_items[i].got;
        const int32_t keep = got < 0 ? 0 : got > limit ? limit : got, cut = limit - keep;
        if (cut == 0) continue;
        ps->n_tokens -= cut;
        ps->n_draft = keep;
        if (keep == 0) ps->tokens = q->hist + q->n_computed; // the last token alone
        q->n_draft = keep;
        q->n_sched -= cut;
        s->plan.n_tokens -= cut;
        s->spec_rows += cut;
        kvp_table_truncate(s->pool, &q->table, q->n_computed + q->n_sched);
        ps->block_table = q->table.blocks;
        ps->n_blocks = q->table.n_blocks;
    }
}

bool spec_drop(sched *s, int32_t n_items, int32_t *n_tok) {
    bool any = false;
    for (int32_t i = 0; i < n_items; i++) {
        seq *q = s->iseq[i];
        if (!q->n_draft) continue;
        s->items[i].n_new -= q->n_draft;
        *n_tok -= q->n_draft;
        s->spec_rows += q->n_draft;
        q->n_draft = 0;
        any = true;
    }
    return any;
}

bool spec_wants_token(const sched *s, const req *r) {
    if (s->cfg.spec.num_tokens <= 0 || s->running_seqs > spec_max_seqs(s)) return false;
    for (int32_t i = 0; i < r->n; i++)
        if (spec_eligible(s, r, &r->seqs[i])) return true;
    return false;
}

// The verified tokens of o, or o->token alone when o does not answer a
// draft of k (a runner that did not verify: the step then counts as a
// plain decode, which is still exact).
static int32_t spec_tokens(const pg_seq_output *o, int32_t k, const int32_t **tokens) {
    if (o->n_draft != k || o->n_accepted < 0 || o->n_accepted > k) {
        *tokens = &o->token;
        return 1;
    }
    *tokens = o->spec_tokens;
    return o->n_accepted + 1;
}

void spec_resolve(sched *s, req *r, seq *q, const pg_seq_output *o) {
    const int32_t k = q->spec_held;
    q->spec_held = 0;
    const int32_t *t;
    const int32_t m = spec_tokens(o, k, &t);
    if (!r->usage.first_token_ns) r->usage.first_token_ns = s->now;
    s->st.n_spec_drafts++;
    s->st.n_spec_draft_tokens += k;
    s->st.n_spec_accepted += m - 1;
    for (int32_t i = 0; i < m - 1; i++) s->st.n_spec_accepted_pos[i]++;
    spec_note_result(s, q, k, m - 1);
    // The placeholder holds the first token; the rest follow, each under
    // the stop rules as if it came in a step of its own, so EOS, a stop id
    // or max_tokens in the middle cuts the rest.
    int32_t stop_token, used = 1;
    q->hist[q->n_hist - 1] = t[0];
    sched_finish_reason fin = sched_check_stop(s, r, q, t[0], &stop_token);
    while (fin == SCHED_FINISH_NONE && used < m) {
        sched_append_token(r, q, t[used]);
        fin = sched_check_stop(s, r, q, t[used], &stop_token);
        used++;
    }
    q->ev_out = o;
    q->ev_ntok = used;
    if (fin != SCHED_FINISH_NONE) {
        sched_seq_end(s, r, q, fin, stop_token); // every block back, drafts' included
        return;
    }
    q->n_computed = q->n_hist - 1;
    kvp_table_truncate(s->pool, &q->table, q->n_computed);
}
