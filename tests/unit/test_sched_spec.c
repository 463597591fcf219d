// tests/unit/test_sched_spec.c - the scheduler's part of speculative
// decoding (scheduler/sched_spec.c): a draft planned as a chunk of 1 + k
// tokens, the kept tokens appended one event each, the rejected drafts'
// slots back in the pool (and never in the prefix cache), acceptance cut at
// EOS, stop ids and max_tokens, the proposer's limit, who may speculate
// (min_tokens, the backoff), n > 1 (each choice drafts from its own
// history, is verified and gives back its rejected slots on its own) and
// async scheduling. A fake proposer and a fake runner; sched_check after
// every call. (A file of its own:
// test_sched.c is past the size rule.)
#include "tests/unit/sched_test_util.h"

#define BS 4

// The proposer: proposes draft[0 .. n_draft) (cut at limit) to everyone,
// or with `follow` last + 1, last + 2, ... after the history's last token
// (so that sequences with different outputs get different drafts), and
// records the calls (the last tokens of up to 16 histories).
typedef struct proposer {
    int32_t draft[PG_MAX_DRAFT];
    int32_t n_draft;
    bool follow;
    int32_t calls, last_limit, last_n;
    int32_t seen_last[16];
} proposer;

static int32_t fake_propose(void *ctx, const int32_t *history, int32_t n, int32_t limit, int32_t *out) {
    proposer *p = ctx;
    if (p->calls < 16) p->seen_last[p->calls] = history[n - 1];
    p->calls++;
    p->last_limit = limit;
    p->last_n = n;
    int32_t k = p->n_draft < limit ? p->n_draft : limit;
    for (int32_t i = 0; i < k; i++) out[i] = p->follow ? history[n - 1] + 1 + i : p->draft[i];
    return k;
}

#define SCHED_TEST_PROPOSER proposer
#include "tests/unit/sched_test_util.h" // the harness

static harness *h_new_budget(int32_t k, int32_t max_running, int32_t num_blocks, int32_t tokens) {
    sched_spec_config spec = {.num_tokens = k, .max_running_seqs = max_running, .propose = fake_propose};
    return h_new_spec(spec, num_blocks, tokens);
}

static harness *h_new(int32_t k, int32_t max_running, int32_t num_blocks) {
    return h_new_budget(k, max_running, num_blocks, 64);
}

// Sampling parameters with the given temperature and max_tokens.
static pg_sampling_params h_sp(int32_t max_tokens, float temp) {
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = temp;
    sp.max_tokens = max_tokens;
    return sp;
}

// Adds request `id`: prompt 100, 101, ... of n_prompt tokens.
static void h_add_sp(harness *h, int64_t id, int32_t n_prompt, int32_t eos, const pg_sampling_params *sp) {
    sched_t_add(h->s, id, 100, n_prompt, eos, sp);
}

// A request with a presence penalty.
static void h_add_pen(harness *h, int64_t id, int32_t n_prompt, int32_t max_tokens, int32_t eos, float temp,
                      float presence_penalty) {
    pg_sampling_params sp = h_sp(max_tokens, temp);
    sp.presence_penalty = presence_penalty;
    h_add_sp(h, id, n_prompt, eos, &sp);
}

static void h_add(harness *h, int64_t id, int32_t n_prompt, int32_t max_tokens, int32_t eos, float temp) {
    h_add_pen(h, id, n_prompt, max_tokens, eos, temp, 0.0f);
}

// A request of n choices, seeded.
static void h_add_n(harness *h, int64_t id, int32_t n_prompt, int32_t max_tokens, int32_t eos, float temp,
                    int32_t n, uint64_t seed) {
    pg_sampling_params sp = h_sp(max_tokens, temp);
    sp.n = n;
    sp.seed = seed;
    sp.has_seed = true;
    h_add_sp(h, id, n_prompt, eos, &sp);
}

// The output of sampled entry ps: a plain one `token`, one with drafts
// what a runner whose argmaxes are target[0 .. k] gives (greedy
// verification).
static void h_answer(pg_seq_output *o, const pg_plan_seq *ps, int32_t token, const int32_t *target) {
    memset(o, 0, sizeof *o);
    o->seq_id = ps->seq_id;
    o->token = token;
    if (ps->n_draft == 0) return;
    const int32_t k = ps->n_draft, *d = ps->tokens + ps->n_tokens - k;
    int32_t a = 0;
    while (a < k && d[a] == target[a]) a++;
    o->n_draft = k;
    o->n_accepted = a;
    for (int32_t j = 0; j <= a; j++) o->spec_tokens[j] = target[j];
    o->token = target[0];
}

typedef struct answer_one {
    int32_t token;
    const int32_t *target;
} answer_one;

static void answer_one_fn(pg_seq_output *o, const pg_plan_seq *ps, void *ctx) {
    const answer_one *a = ctx;
    h_answer(o, ps, a->token, a->target);
}

// Answers every sampled entry (h_answer) and updates.
static const sched_events *h_update(harness *h, int32_t token, const int32_t *target) {
    return h_update_with(h, answer_one_fn, &(answer_one){token, target});
}

static void answer_n_fn(pg_seq_output *o, const pg_plan_seq *ps, void *ctx) {
    const int32_t(*target)[PG_MAX_DRAFT + 1] = ctx;
    const int32_t *t = target[ps->seq_id % SCHED_MAX_N];
    h_answer(o, ps, t[0], t);
}

// n > 1: answers each sampled entry with the targets of its sequence index
// (target[index][0] for a plain one) and updates.
static const sched_events *h_update_n(harness *h, const int32_t (*target)[PG_MAX_DRAFT + 1]) {
    return h_update_with(h, answer_n_fn, (void *)target);
}

// Events of sequence `index` in ev.
static int32_t n_events_of(const sched_events *ev, int32_t index) {
    int32_t n = 0;
    for (int32_t i = 0; i < ev->n; i++) n += ev->ev[i].seq_index == index;
    return n;
}

static sched_stats stats(harness *h) {
    sched_stats st;
    sched_stats_get(h->s, &st);
    return st;
}

// Prefill of a 7-token prompt, first token 7: history 8, 7 computed.
static void prefill(harness *h, int64_t id, int32_t max_tokens, int32_t eos) {
    h_add(h, id, 7, max_tokens, eos, 0.0f);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 1);
    assert_int_equal(p->seqs[0].n_draft, 0);
    assert_int_equal(h_update(h, 7, NULL)->n, 1);
}

static void test_draft_planned_as_chunk(void **state) {
    (void)state;
    harness *h = h_new(4, 0, 32);
    h->prop = (proposer){.draft = {1, 2, 3, 4}, .n_draft = 4};
    prefill(h, 1, 20, -1);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(h->prop.last_n, 8); // the whole history, last token included
    assert_int_equal(p->n_seqs, 1);
    const pg_plan_seq *s = &p->seqs[0];
    assert_int_equal(s->n_tokens, 5);
    assert_int_equal(s->n_draft, 4);
    assert_int_equal(s->start_pos, 7);
    assert_true(s->sample);
    const int32_t want[5] = {7, 1, 2, 3, 4};
    assert_memory_equal(s->tokens, want, sizeof want);
    assert_int_equal(s->n_blocks, 3); // positions 0 .. 11
    assert_int_equal(p->n_tokens, 5);
    // All accepted plus the bonus: five tokens, five events in order.
    const int32_t target[5] = {1, 2, 3, 4, 9};
    const sched_events *ev = h_update(h, 0, target);
    assert_int_equal(ev->n, 5);
    for (int32_t j = 0; j < 5; j++) {
        assert_true(ev->ev[j].has_token);
        assert_int_equal(ev->ev[j].out.token, target[j]);
        assert_int_equal(ev->ev[j].n_generated, 2 + j);
        assert_int_equal(ev->ev[j].finish, SCHED_FINISH_NONE);
    }
    assert_int_equal(ev->ev[4].usage.completion_tokens, 6);
    sched_stats st = stats(h);
    assert_int_equal(st.n_spec_drafts, 1);
    assert_int_equal(st.n_spec_draft_tokens, 4);
    assert_int_equal(st.n_spec_accepted, 4);
    assert_int_equal(st.n_spec_accepted_pos[3], 1);
    // The next plan starts at the bonus token, every draft's KV kept.
    p = h_step(h);
    assert_int_equal(p->seqs[0].start_pos, 12);
    assert_int_equal(p->seqs[0].tokens[0], 9);
    h_update(h, 0, (const int32_t[]){1, 2, 3, 4, 5});
    h_free(h);
}

static void test_partial_acceptance_frees_rejected_slots(void **state) {
    (void)state;
    harness *h = h_new(4, 0, 32);
    h->prop = (proposer){.draft = {1, 2, 3, 4}, .n_draft = 4};
    prefill(h, 1, 20, -1);
    const int32_t before = free_blocks(h); // two blocks: positions 0 .. 7
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->seqs[0].n_blocks, 3);
    assert_int_equal(free_blocks(h), before - 1);
    // Nothing accepted: the target's own token only; position 7 (the last
    // token) is computed, 8 .. 11 held rejected drafts: their block goes.
    const sched_events *ev = h_update(h, 0, (const int32_t[]){5, 0, 0, 0, 0});
    assert_int_equal(ev->n, 1);
    assert_int_equal(ev->ev[0].out.token, 5);
    assert_int_equal(free_blocks(h), before);
    assert_int_equal(stats(h).kv.num_used, 2);
    // Only the full blocks of computed positions reach the prefix cache:
    // block 1 (positions 4 .. 7, the last token's KV included), never the
    // rejected drafts' block.
    assert_int_equal(stats(h).kv.num_cached, 2);
    // A draft with nothing accepted: the next step decodes plainly (the
    // miss backoff), position 8.
    p = h_step(h);
    assert_int_equal(p->seqs[0].n_draft, 0);
    assert_int_equal(p->seqs[0].start_pos, 8);
    h_update(h, 6, NULL);
    // Two accepted of four: positions 10 .. 11 hold 1, 2; the target's
    // 7 follows at 12, so 12 of 14 slots stay (3 blocks).
    p = h_step(h);
    assert_int_equal(p->seqs[0].start_pos, 9);
    assert_int_equal(p->seqs[0].n_draft, 4);
    assert_int_equal(p->seqs[0].n_blocks, 4); // positions 9 .. 13
    ev = h_update(h, 0, (const int32_t[]){1, 2, 7, 0, 0});
    assert_int_equal(ev->n, 3);
    assert_int_equal(ev->ev[2].out.token, 7);
    assert_int_equal(ev->ev[2].n_generated, 6);
    assert_int_equal(stats(h).kv.num_used, 3);
    assert_int_equal(stats(h).kv.num_cached, 2);
    sched_stats st = stats(h);
    assert_int_equal(st.n_spec_drafts, 2);
    assert_int_equal(st.n_spec_draft_tokens, 8);
    assert_int_equal(st.n_spec_accepted, 2);
    assert_int_equal(st.n_spec_accepted_pos[0], 1);
    assert_int_equal(st.n_spec_accepted_pos[1], 1);
    assert_int_equal(st.n_spec_accepted_pos[2], 0);
    h_free(h);
}

static void test_acceptance_stops_at_eos(void **state) {
    (void)state;
    harness *h = h_new(4, 0, 32);
    h->prop = (proposer){.draft = {1, 99, 3, 4}, .n_draft = 4};
    const int32_t all = free_blocks(h);
    prefill(h, 1, 20, 99);
    h_step(h);
    // Everything accepted, but the second token is EOS: the rest is cut.
    const sched_events *ev = h_update(h, 0, (const int32_t[]){1, 99, 3, 4, 5});
    assert_int_equal(ev->n, 2);
    assert_int_equal(ev->ev[0].out.token, 1);
    assert_int_equal(ev->ev[0].finish, SCHED_FINISH_NONE);
    assert_int_equal(ev->ev[1].out.token, 99);
    assert_int_equal(ev->ev[1].finish, SCHED_FINISH_STOP);
    assert_int_equal(ev->ev[1].stop_token, 99);
    assert_true(ev->ev[1].req_finished);
    assert_int_equal(ev->ev[1].usage.completion_tokens, 3);
    assert_int_equal(free_blocks(h), all);
    assert_false(sched_has_work(h->s));
    h_free(h);
}

static void test_acceptance_stops_at_max_tokens(void **state) {
    (void)state;
    harness *h = h_new(8, 0, 32);
    h->prop = (proposer){.draft = {1, 2, 3, 4, 5, 6, 7, 8}, .n_draft = 8};
    const int32_t all = free_blocks(h);
    prefill(h, 1, 4, -1); // one token out, three to go
    const pg_batch_plan *p = h_step(h);
    // A draft of k may emit k + 1: the proposer is asked for two at most.
    assert_int_equal(h->prop.last_limit, 2);
    assert_int_equal(p->seqs[0].n_draft, 2);
    const sched_events *ev = h_update(h, 0, (const int32_t[]){1, 2, 3});
    assert_int_equal(ev->n, 3);
    assert_int_equal(ev->ev[2].out.token, 3);
    assert_int_equal(ev->ev[2].finish, SCHED_FINISH_LENGTH);
    assert_int_equal(ev->ev[2].n_generated, 4);
    assert_int_equal(free_blocks(h), all);
    h_free(h);
}

// After m drafts in a row with nothing accepted, 2^m - 1 plain steps;
// an accepted token resets the count.
static void test_miss_backoff(void **state) {
    (void)state;
    harness *h = h_new(2, 0, 64);
    h->prop = (proposer){.draft = {1, 2}, .n_draft = 2};
    prefill(h, 1, 200, -1);
    const int32_t miss[3] = {5, 0, 0}, hit[3] = {1, 5, 0};
    char pattern[40] = {0};
    for (int32_t i = 0; i < 16; i++) {
        const pg_batch_plan *p = h_step(h);
        bool draft = p->seqs[0].n_draft > 0;
        pattern[i] = draft ? 'D' : '.';
        // Misses until step 11, then hits.
        h_update(h, 5, i < 11 ? miss : hit);
    }
    assert_string_equal(pattern, "D.D...D.......DD");
    h_free(h);
}

static void test_who_speculates(void **state) {
    (void)state;
    // Sampling (temperature 1) gets drafts (the runner's rows draw what
    // plain decoding would); so does a presence penalty (the runner extends
    // each row's penalty history by the drafts before it).
    for (int32_t pen = 0; pen < 2; pen++) {
        harness *h = h_new(4, 0, 64);
        h->prop = (proposer){.draft = {1, 2}, .n_draft = 2};
        h_add_pen(h, 1, 7, 20, -1, 1.0f, pen ? 0.5f : 0.0f);
        h_step(h);
        h_update(h, 7, NULL);
        const pg_batch_plan *p = h_step(h);
        assert_int_equal(p->seqs[0].n_draft, 2);
        assert_int_equal(h->prop.calls, 1);
        h_update(h, 0, (const int32_t[]){1, 0, 0});
        h_free(h);
    }
    // Backoff: three running sequences over a limit of two: none; two: both.
    harness *h = h_new(4, 2, 64);
    h->prop = (proposer){.draft = {1, 2}, .n_draft = 2};
    for (int64_t id = 1; id <= 3; id++) h_add(h, id, 7, 20, -1, 0.0f);
    h_step(h);
    h_update(h, 7, NULL);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 3);
    for (int32_t i = 0; i < 3; i++) assert_int_equal(p->seqs[i].n_draft, 0);
    h_update(h, 7, NULL);
    assert_int_equal(sched_abort(h->s, 3), 0);
    p = h_step(h);
    assert_int_equal(p->n_seqs, 2);
    for (int32_t i = 0; i < 2; i++) assert_int_equal(p->seqs[i].n_draft, 2);
    h_update(h, 0, (const int32_t[]){1, 0, 0});
    h_free(h);
}

static void test_async_resolves_before_a_draft(void **state) {
    (void)state;
    harness *h = h_new(4, 0, 32);
    h->prop = (proposer){.draft = {1, 2}, .n_draft = 2};
    h_add(h, 1, 7, 20, -1, 0.0f);
    h_step(h);
    assert_int_equal(sched_advance(h->s), 0);
    h_check(h);
    // The proposal starts from the token in flight: the engine resolves first.
    assert_false(sched_can_run_ahead(h->s));
    pg_step_output out = {.n = 1, .outs = h->outs};
    memset(h->outs, 0, sizeof h->outs[0]);
    h->outs[0] = (pg_seq_output){.seq_id = h->plan->seqs[0].seq_id, .token = 7};
    assert_int_equal(sched_resolve(h->s, &out, &h->ev), 0);
    h_check(h);
    // A draft in flight, advanced: its slots are held until the resolve.
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->seqs[0].n_draft, 2);
    assert_int_equal(sched_advance(h->s), 0);
    h_check(h);
    h->outs[0] = (pg_seq_output){.seq_id = p->seqs[0].seq_id, .token = 1, .n_draft = 2, .n_accepted = 1,
                                 .spec_tokens = {1, 6}};
    assert_int_equal(sched_resolve(h->s, &out, &h->ev), 0);
    h_check(h);
    assert_int_equal(h->ev.n, 2);
    assert_int_equal(h->ev.ev[1].out.token, 6);
    h_free(h);
}


// n > 1: after the fork each choice drafts from its own history (the
// prompt at first, then its own output), with its own seed and counter;
// acceptance and the rejected slots are its own; a choice that ends early
// gives its blocks back while the others go on drafting.
static void test_n_choices_draft_on_their_own(void **state) {
    (void)state;
    harness *h = h_new(3, 0, 32);
    h->prop = (proposer){.n_draft = 3, .follow = true};
    const int32_t all = free_blocks(h);
    h_add_n(h, 1, 7, 20, 99, 0.7f, 3, 1000);
    // The lead computes the prompt but its last token: no draft.
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 1);
    assert_int_equal(p->seqs[0].n_tokens, 6);
    assert_false(p->seqs[0].sample);
    assert_int_equal(h_update_n(h, NULL)->n, 0);
    assert_int_equal(h->prop.calls, 0);
    // The fork: each choice computes the last prompt token (position 6)
    // and drafts after it, from the prompt: 107, 108, 109.
    p = h_step(h);
    assert_int_equal(h->prop.calls, 3);
    assert_int_equal(p->n_seqs, 3);
    assert_int_equal(p->n_tokens, 12);
    for (int32_t i = 0; i < 3; i++) {
        const pg_plan_seq *e = &p->seqs[i];
        assert_int_equal(e->seq_id, 1 * SCHED_MAX_N + i);
        assert_int_equal(e->start_pos, 6);
        assert_int_equal(e->n_draft, 3);
        assert_int_equal(e->rng_seed, 1000 + i); // vLLM's child seed
        assert_int_equal(e->n_generated, 0);
        assert_true(e->sample);
        assert_memory_equal(e->tokens, ((const int32_t[]){106, 107, 108, 109}), 4 * sizeof(int32_t));
        assert_int_equal(e->n_blocks, 3); // positions 0 .. 9
    }
    // The shared block of positions 4 .. 5 is copied for two of them (the
    // third keeps it); the prompt's full block stays shared.
    assert_int_equal(p->n_copies, 2);
    // Choice 0 keeps all three and the bonus, choice 1 one, choice 2 none.
    const int32_t t1[3][PG_MAX_DRAFT + 1] = {{107, 108, 109, 110}, {107, 50}, {60}};
    const sched_events *ev = h_update_n(h, t1);
    assert_int_equal(ev->n, 7);
    assert_int_equal(n_events_of(ev, 0), 4);
    assert_int_equal(n_events_of(ev, 1), 2);
    assert_int_equal(n_events_of(ev, 2), 1);
    assert_int_equal(ev->ev[3].out.token, 110);
    assert_int_equal(ev->ev[3].n_generated, 4);
    assert_int_equal(ev->ev[5].out.token, 50);
    assert_int_equal(ev->ev[5].n_generated, 2);
    assert_int_equal(ev->ev[6].out.token, 60);
    assert_int_equal(ev->ev[6].usage.completion_tokens, 7);
    sched_stats st = stats(h);
    assert_int_equal(st.n_spec_drafts, 3);
    assert_int_equal(st.n_spec_draft_tokens, 9);
    assert_int_equal(st.n_spec_accepted, 4);
    assert_int_equal(st.n_spec_accepted_pos[0], 2);
    assert_int_equal(st.n_spec_accepted_pos[1], 1);
    assert_int_equal(st.n_spec_accepted_pos[2], 1);
    // Blocks: the prompt's first, shared; choice 0 its own two (positions
    // 4 .. 11, 10 computed); choices 1 and 2 their own of positions 4 .. 7
    // (8 and 7 computed): the blocks of their rejected drafts went back.
    assert_int_equal(st.kv.num_used, 5);
    assert_int_equal(free_blocks(h), all - 5);
    // Only the prompt's first block is hashed: a step's blocks are offered
    // to the prefix cache before its verification is read, with the
    // positions surely computed (the last token's), so the blocks of
    // accepted drafts wait for the next step's commit and those of
    // rejected ones are never offered.
    assert_int_equal(st.kv.num_cached, 1);
    // Each proposes from its own output; choice 2 missed: it backs off.
    p = h_step(h);
    assert_int_equal(p->n_seqs, 3);
    assert_int_equal(h->prop.calls, 5);
    assert_int_equal(h->prop.seen_last[3], 110);
    assert_int_equal(h->prop.seen_last[4], 50);
    assert_int_equal(p->seqs[0].start_pos, 10);
    assert_int_equal(p->seqs[0].n_generated, 4);
    assert_memory_equal(p->seqs[0].tokens, ((const int32_t[]){110, 111, 112, 113}), 4 * sizeof(int32_t));
    assert_int_equal(p->seqs[1].start_pos, 8);
    assert_int_equal(p->seqs[1].n_generated, 2);
    assert_memory_equal(p->seqs[1].tokens, ((const int32_t[]){50, 51, 52, 53}), 4 * sizeof(int32_t));
    assert_int_equal(p->seqs[2].start_pos, 7);
    assert_int_equal(p->seqs[2].n_draft, 0);
    assert_int_equal(p->seqs[2].n_tokens, 1);
    assert_int_equal(p->seqs[2].tokens[0], 60);
    // Choice 1 ends early: its first draft kept, then EOS (99); its
    // blocks go back, the others go on.
    const int32_t t2[3][PG_MAX_DRAFT + 1] = {{111, 112, 5}, {51, 99}, {61}};
    ev = h_update_n(h, t2);
    assert_int_equal(ev->n, 6);
    assert_int_equal(n_events_of(ev, 0), 3);
    assert_int_equal(n_events_of(ev, 1), 2);
    assert_int_equal(ev->ev[4].out.token, 99);
    assert_int_equal(ev->ev[4].finish, SCHED_FINISH_STOP);
    assert_false(ev->ev[5].req_finished);
    // Now 104 .. 107 (choices 0 and 1, one hash) and 104 .. 106, 60
    // (choice 2) are hashed too; choice 0's 108 .. 111 (its 111 computed
    // only in this step) is not.
    assert_int_equal(stats(h).kv.num_cached, 3);
    // Choice 0: 13 computed (own blocks of 4 .. 15); choice 2: 8 (own
    // block of 4 .. 7); the prompt's first block.
    assert_int_equal(stats(h).kv.num_used, 5);
    p = h_step(h);
    assert_int_equal(p->n_seqs, 2);
    assert_int_equal(p->seqs[0].seq_id, SCHED_MAX_N + 0);
    assert_int_equal(p->seqs[0].start_pos, 13);
    assert_memory_equal(p->seqs[0].tokens, ((const int32_t[]){5, 6, 7, 8}), 4 * sizeof(int32_t));
    assert_int_equal(p->seqs[1].seq_id, SCHED_MAX_N + 2);
    assert_int_equal(p->seqs[1].n_draft, 3); // its one plain step of backoff is over
    const int32_t t3[3][PG_MAX_DRAFT + 1] = {{6, 99}, {0}, {62, 99}};
    ev = h_update_n(h, t3);
    assert_true(ev->ev[ev->n - 1].req_finished);
    assert_int_equal(free_blocks(h), all);
    assert_false(sched_has_work(h->s));
    h_free(h);
}

// n > 1 under a tight token budget: a choice's draft leaves every later
// sibling its token.
static void test_n_choices_draft_leaves_siblings_their_token(void **state) {
    (void)state;
    harness *h = h_new_budget(4, 0, 64, 6);
    h->prop = (proposer){.n_draft = 4, .follow = true};
    h_add_n(h, 1, 5, 20, -1, 0.0f, 3, 7);
    const pg_batch_plan *p = h_step(h); // the lead: positions 0 .. 3
    assert_int_equal(p->seqs[0].n_tokens, 4);
    h_update_n(h, NULL);
    // Six tokens: choice 0 drafts 6 - 2 - 1 = 3, then 1 and 1.
    p = h_step(h);
    assert_int_equal(p->n_seqs, 3);
    assert_int_equal(p->n_tokens, 6);
    assert_int_equal(p->seqs[0].n_draft, 3);
    assert_int_equal(p->seqs[1].n_draft, 0);
    assert_int_equal(p->seqs[2].n_draft, 0);
    const int32_t t[3][PG_MAX_DRAFT + 1] = {{105, 106, 0}, {7}, {8}};
    const sched_events *ev = h_update_n(h, t);
    assert_int_equal(ev->n, 5);
    assert_int_equal(sched_abort(h->s, 1), 0);
    h_free(h);
}

// Async scheduling with n > 1: a choice awaiting its token that would
// draft next keeps the engine from running ahead.
static void test_n_choices_async(void **state) {
    (void)state;
    harness *h = h_new(2, 0, 32);
    h->prop = (proposer){.n_draft = 2, .follow = true};
    h_add_n(h, 1, 7, 20, -1, 0.0f, 2, 3);
    h_step(h);
    h_update_n(h, NULL);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 2);
    pg_step_output out = {.n = 0, .outs = h->outs};
    for (int32_t i = 0; i < p->n_seqs; i++) // answered before the plan is advanced
        h_answer(&h->outs[out.n++], &p->seqs[i], 0, (const int32_t[]){107, 108, 109});
    assert_int_equal(sched_advance(h->s), 0);
    h_check(h);
    assert_false(sched_can_run_ahead(h->s));
    if (sched_resolve(h->s, &out, &h->ev)) fail_msg("sched_resolve: %s", pg_err_msg());
    h_check(h);
    assert_int_equal(h->ev.n, 6);
    h_free(h);
}

// Answers every sampled entry keeping keep[index] of its drafts (-1: all),
// by seq index: its target repeats the drafts that far, then a token that
// differs from the next draft (7 for a plain entry or after all of them).
static void answer_keep_fn(pg_seq_output *o, const pg_plan_seq *ps, void *ctx) {
    const int32_t *keep = ctx;
    const int32_t k = ps->n_draft, *d = ps->tokens + ps->n_tokens - k;
    const int32_t want = keep[ps->seq_id % SCHED_MAX_N];
    const int32_t a = want < 0 || want > k ? k : want;
    int32_t target[PG_MAX_DRAFT + 1];
    for (int32_t j = 0; j < a; j++) target[j] = d[j];
    target[a] = a < k ? d[a] + 1 : 7;
    h_answer(o, ps, target[0], target);
}

static void h_update_keep(harness *h, const int32_t *keep) {
    h_update_with(h, answer_keep_fn, (void *)keep);
}

// One step of request 1 (one sequence) answered keeping `keep` drafts; its
// draft length (0: a plain step) goes to pattern[i] as a digit.
static void h_step_keep(harness *h, char *pattern, int32_t i, int32_t keep) {
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 1);
    pattern[i] = (char)('0' + p->seqs[0].n_draft);
    h_update_keep(h, (const int32_t[]){keep});
}

// The adaptive draft length (spec_note_result): drafts that keep one token
// shrink it half way to 2 per draft; a miss leaves it (the miss backoff
// skips a step); fully accepted ones grow it by one up to k and no
// further. fixed_length keeps k throughout (the same answers).
static void test_adaptive_length_follows_acceptance(void **state) {
    (void)state;
    for (int32_t fixed = 0; fixed < 2; fixed++) {
        sched_spec_config spec = {.num_tokens = 5, .fixed_length = fixed, .propose = fake_propose};
        harness *h = h_new_spec(spec, 64, 64);
        h->prop = (proposer){.draft = {1, 2, 3, 4, 5}, .n_draft = 5};
        prefill(h, 1, 200, -1);
        char pattern[16] = {0};
        int32_t i = 0;
        for (; i < 5; i++) h_step_keep(h, pattern, i, 1);  // one kept of each
        for (; i < 7; i++) h_step_keep(h, pattern, i, 0);  // a miss, then a plain step
        for (; i < 12; i++) h_step_keep(h, pattern, i, -1); // all kept
        assert_string_equal(pattern, fixed ? "555555055555" : "543222023455");
        // The proposer was asked for the length (nothing else bound it).
        assert_int_equal(h->prop.last_limit, 5);
        h_free(h);
    }
}

// Misses leave a shrunk length alone while the miss backoff still skips
// 1, 3, 7, 15 and 31 steps; a kept token resets the backoff and a fully
// kept draft grows the length. With k = 1 every draft is 1 long (never
// below 1, never above k).
static void test_adaptive_length_floor_and_miss_backoff(void **state) {
    (void)state;
    harness *h = h_new(5, 0, 64);
    h->prop = (proposer){.draft = {1, 2, 3, 4, 5}, .n_draft = 5};
    prefill(h, 1, 200, -1);
    char pattern[80] = {0}, lengths[16] = {0};
    int32_t n_len = 0;
    for (int32_t i = 0; i < 68; i++) {
        h_step_keep(h, pattern, i, i < 4 ? 1 : i < 66 ? 0 : -1); // one kept, misses, all kept
        if (pattern[i] != '0') {
            lengths[n_len++] = pattern[i];
            pattern[i] = 'D';
        } else {
            pattern[i] = '.';
        }
    }
    assert_string_equal(pattern, "DDDDD.D...D.......D...............D...............................DD");
    assert_string_equal(lengths, "54322222223");
    h_free(h);
    h = h_new(1, 0, 64);
    h->prop = (proposer){.draft = {1, 2, 3, 4, 5}, .n_draft = 5};
    prefill(h, 1, 200, -1);
    char one[16] = {0};
    const int32_t keep[12] = {1, -1, 0, 0, -1, -1, 1, 0, 0, 0, 0, -1};
    for (int32_t i = 0; i < 12; i++) h_step_keep(h, one, i, keep[i]);
    assert_string_equal(one, "111011110100");
    h_free(h);
}

// n = 2: each choice has its own length. Choice 0 keeps all its drafts and
// stays at k (4); choice 1 keeps one of each and shrinks (4, 3, 3, 2, 2),
// then keeps all and grows back (2, 3, 4, 4).
static void test_adaptive_length_per_choice(void **state) {
    (void)state;
    harness *h = h_new(4, 0, 128);
    h->prop = (proposer){.n_draft = 4, .follow = true};
    h_add_n(h, 1, 7, 100, -1, 0.0f, 2, 5);
    h_step(h); // the prompt but its last token
    h_update_keep(h, (const int32_t[]){-1, -1});
    char c0[16] = {0}, c1[16] = {0};
    for (int32_t i = 0; i < 9; i++) {
        const pg_batch_plan *p = h_step(h);
        assert_int_equal(p->n_seqs, 2);
        for (int32_t j = 0; j < 2; j++) {
            const pg_plan_seq *e = &p->seqs[j];
            (e->seq_id % SCHED_MAX_N ? c1 : c0)[i] = (char)('0' + e->n_draft);
        }
        h_update_keep(h, (const int32_t[]){-1, i < 5 ? 1 : -1});
    }
    assert_string_equal(c0, "444444444");
    assert_string_equal(c1, "433222344");
    h_free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_planned_as_chunk),
        cmocka_unit_test(test_partial_acceptance_frees_rejected_slots),
        cmocka_unit_test(test_acceptance_stops_at_eos),
        cmocka_unit_test(test_acceptance_stops_at_max_tokens),
        cmocka_unit_test(test_miss_backoff),
        cmocka_unit_test(test_who_speculates),
        cmocka_unit_test(test_async_resolves_before_a_draft),
        cmocka_unit_test(test_n_choices_draft_on_their_own),
        cmocka_unit_test(test_n_choices_draft_leaves_siblings_their_token),
        cmocka_unit_test(test_n_choices_async),
        cmocka_unit_test(test_adaptive_length_follows_acceptance),
        cmocka_unit_test(test_adaptive_length_floor_and_miss_backoff),
        cmocka_unit_test(test_adaptive_length_per_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
