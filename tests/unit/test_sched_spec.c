// tests/unit/test_sched_spec.c - the scheduler's part of speculative
// decoding (scheduler/sched_spec.c): a draft planned as a chunk of 1 + k
// tokens, the kept tokens appended one event each, the rejected drafts'
// slots back in the pool (and never in the prefix cache), acceptance cut at
// EOS, stop ids and max_tokens, the proposer's limit, who may speculate
// (greedy, n = 1, the backoff) and async scheduling. A fake proposer and a
// fake runner; sched_check after every call. (A file of its own:
// test_sched.c is past the size rule.)
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "scheduler/sched.h"

#define BS 4

// The proposer: proposes draft[0 .. n_draft) (cut at limit) to everyone,
// and records the calls.
typedef struct proposer {
    int32_t draft[PG_MAX_DRAFT];
    int32_t n_draft;
    int32_t calls, last_limit, last_n;
} proposer;

static int32_t fake_propose(void *ctx, const int32_t *history, int32_t n, int32_t limit, int32_t *out) {
    proposer *p = ctx;
    (void)history;
    p->calls++;
    p->last_limit = limit;
    p->last_n = n;
    int32_t k = p->n_draft < limit ? p->n_draft : limit;
    memcpy(out, p->draft, sizeof(int32_t) * (size_t)k);
    return k;
}

typedef struct harness {
    sched *s;
    proposer prop;
    const pg_batch_plan *plan;
    pg_seq_output outs[64];
    sched_events ev;
} harness;

static harness *h_new(int32_t k, int32_t max_running, int32_t num_blocks) {
    harness *h = calloc(1, sizeof *h);
    sched_config c;
    sched_config_default(&c);
    c.block_size = BS;
    c.num_blocks = num_blocks;
    c.max_model_len = 256;
    c.max_num_batched_tokens = 64;
    c.long_prefill_token_threshold = 0;
    c.spec = (sched_spec_config){.num_tokens = k, .max_running_seqs = max_running,
                                 .propose = fake_propose, .ctx = &h->prop};
    if (sched_create(&c, &h->s)) fail_msg("sched_create: %s", pg_err_msg());
    return h;
}

static void h_free(harness *h) {
    sched_destroy(h->s);
    free(h);
}

static void h_check(harness *h) {
    if (sched_check(h->s)) fail_msg("invariant: %s", pg_err_msg());
}

// A greedy request: prompt 100, 101, ... of n_prompt tokens.
static void h_add_pen(harness *h, int64_t id, int32_t n_prompt, int32_t max_tokens, int32_t eos, float temp,
                      float presence_penalty) {
    int32_t prompt[128];
    for (int32_t i = 0; i < n_prompt; i++) prompt[i] = 100 + i;
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = temp;
    sp.presence_penalty = presence_penalty;
    sp.max_tokens = max_tokens;
    sched_request r = {.id = id, .prompt = prompt, .n_prompt = n_prompt, .sp = &sp, .eos_id = eos};
    assert_int_equal(sched_add_request(h->s, &r), 0);
    h_check(h);
}

static void h_add(harness *h, int64_t id, int32_t n_prompt, int32_t max_tokens, int32_t eos, float temp) {
    h_add_pen(h, id, n_prompt, max_tokens, eos, temp, 0.0f);
}

static const pg_batch_plan *h_step(harness *h) {
    assert_int_equal(sched_step(h->s, &h->plan), 0);
    h_check(h);
    return h->plan;
}

// Answers every sampled entry: a plain one with `token`, one with drafts
// as a runner whose argmaxes are target[0 .. k] would (greedy
// verification), and updates.
static const sched_events *h_update(harness *h, int32_t token, const int32_t *target) {
    pg_step_output out = {.n = 0, .outs = h->outs};
    for (int32_t i = 0; i < h->plan->n_seqs; i++) {
        const pg_plan_seq *ps = &h->plan->seqs[i];
        if (!ps->sample) continue;
        pg_seq_output *o = &h->outs[out.n++];
        memset(o, 0, sizeof *o);
        o->seq_id = ps->seq_id;
        o->token = token;
        if (ps->n_draft == 0) continue;
        const int32_t k = ps->n_draft, *d = ps->tokens + ps->n_tokens - k;
        int32_t a = 0;
        while (a < k && d[a] == target[a]) a++;
        o->n_draft = k;
        o->n_accepted = a;
        for (int32_t j = 0; j <= a; j++) o->spec_tokens[j] = target[j];
        o->token = target[0];
    }
    assert_int_equal(sched_update(h->s, &out, &h->ev), 0);
    h_check(h);
    return &h->ev;
}

static sched_stats stats(harness *h) {
    sched_stats st;
    sched_stats_get(h->s, &st);
    return st;
}

static int32_t free_blocks(harness *h) { return kvp_num_free(sched_pool(h->s)); }

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
    harness *h = h_new(4, 0, 64);
    h->prop = (proposer){.draft = {1, 2}, .n_draft = 2};
    h_add(h, 1, 7, 20, -1, 1.0f);
    h_step(h);
    h_update(h, 7, NULL);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->seqs[0].n_draft, 2);
    assert_int_equal(h->prop.calls, 1);
    h_update(h, 0, (const int32_t[]){1, 0, 0});
    h_free(h);
    h = h_new(4, 0, 64);
    h->prop = (proposer){.draft = {1, 2}, .n_draft = 2};
    h_add_pen(h, 1, 7, 20, -1, 1.0f, 0.5f);
    h_step(h);
    h_update(h, 7, NULL);
    p = h_step(h);
    assert_int_equal(p->seqs[0].n_draft, 2);
    assert_int_equal(h->prop.calls, 1);
    h_update(h, 0, (const int32_t[]){1, 0, 0});
    h_free(h);
    // Backoff: three running sequences over a limit of two: none; two: both.
    h = h_new(4, 2, 64);
    h->prop = (proposer){.draft = {1, 2}, .n_draft = 2};
    for (int64_t id = 1; id <= 3; id++) h_add(h, id, 7, 20, -1, 0.0f);
    h_step(h);
    h_update(h, 7, NULL);
    p = h_step(h);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_planned_as_chunk),
        cmocka_unit_test(test_partial_acceptance_frees_rejected_slots),
        cmocka_unit_test(test_acceptance_stops_at_eos),
        cmocka_unit_test(test_acceptance_stops_at_max_tokens),
        cmocka_unit_test(test_miss_backoff),
        cmocka_unit_test(test_who_speculates),
        cmocka_unit_test(test_async_resolves_before_a_draft),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
