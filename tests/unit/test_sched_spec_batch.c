// tests/unit/test_sched_spec_batch.c - speculative decoding with the
// batched proposer (sched_spec_config.propose_batch, scheduler/sched_spec.c
// spec_batch_fill): one call per step for every speculating sequence; each
// plan entry planned with its limit provisionally and trimmed to what came
// (tokens, KV slots back; none at all: a plain decode); the same plans,
// tokens and events as the per-sequence proposer gives for the same
// answers, n > 1 included. A fake proposer and a fake runner; sched_check
// after every call. (test_sched_spec.c tests the per-sequence path.)
#include "tests/unit/sched_test_util.h"

#define BS 4

// The answer both proposers give: `want` tokens last + 1, last + 2, ...
// after the history's last token (cut at limit), with want = last mod 5
// (mode 0), or want = fixed (mode 1).
typedef struct proposer {
    int32_t mode, fixed;
    // Batched calls: their count, items per call, and per item what came.
    int32_t calls, items, short_items, empty_items, max_items;
    int32_t last_limit[16], last_got[16], last_n_items;
} proposer;

static int32_t answer(proposer *p, const int32_t *history, int32_t n, int32_t limit, int32_t *out) {
    const int32_t last = history[n - 1];
    int32_t want = p->mode == 0 ? last % 5 : p->fixed;
    int32_t k = want < limit ? want : limit;
    for (int32_t i = 0; i < k; i++) out[i] = last + 1 + i;
    return k;
}

static int32_t fake_propose(void *ctx, const int32_t *history, int32_t n, int32_t limit, int32_t *out) {
    return answer(ctx, history, n, limit, out);
}

static void fake_propose_batch(void *ctx, sched_propose_item *items, int32_t n_items) {
    proposer *p = ctx;
    p->calls++;
    p->items += n_items;
    p->last_n_items = n_items;
    if (n_items > p->max_items) p->max_items = n_items;
    for (int32_t i = 0; i < n_items; i++) {
        sched_propose_item *it = &items[i];
        assert_true(it->limit >= 1);
        it->got = answer(p, it->history, it->n, it->limit, it->out);
        p->short_items += it->got > 0 && it->got < it->limit;
        p->empty_items += it->got == 0;
        if (i < 16) {
            p->last_limit[i] = it->limit;
            p->last_got[i] = it->got;
        }
    }
}

#define SCHED_TEST_PROPOSER proposer
#include "tests/unit/sched_test_util.h" // the harness

static harness *h_new(bool batch, int32_t k, int32_t num_blocks, int32_t tokens) {
    sched_spec_config spec = {.num_tokens = k};
    if (batch)
        spec.propose_batch = fake_propose_batch;
    else
        spec.propose = fake_propose;
    return h_new_spec(spec, num_blocks, tokens);
}

static void h_add(harness *h, int64_t id, int32_t n_prompt, int32_t max_tokens, int32_t n) {
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = n > 1 ? 0.7f : 0.0f;
    sp.max_tokens = max_tokens;
    sp.n = n;
    sp.seed = 5;
    sp.has_seed = n > 1;
    sched_t_add(h->s, id, 100 + 10 * (int32_t)id, n_prompt, -1, &sp);
}

// The runner: a plain entry gets bonus(entry); one with k drafts keeps
// a = (start_pos + seq_id) mod (k + 1) of them, then bonus.
static int32_t bonus(const pg_plan_seq *ps) {
    return 200 + (int32_t)((ps->start_pos * 7 + ps->seq_id) % 50);
}

static void runner_answer(pg_seq_output *o, const pg_plan_seq *ps, void *ctx) {
    (void)ctx;
    o->token = bonus(ps);
    if (ps->n_draft == 0) return;
    const int32_t k = ps->n_draft, *d = ps->tokens + ps->n_tokens - k;
    const int32_t a = (int32_t)((ps->start_pos + ps->seq_id) % (k + 1));
    o->n_draft = k;
    o->n_accepted = a;
    for (int32_t j = 0; j < a; j++) o->spec_tokens[j] = d[j];
    o->spec_tokens[a] = bonus(ps);
    o->token = o->spec_tokens[0];
}

static const sched_events *h_update(harness *h) { return h_update_with(h, runner_answer, NULL); }

static void same_plan(const pg_batch_plan *a, const pg_batch_plan *b) {
    assert_int_equal(a->n_seqs, b->n_seqs);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_int_equal(a->n_copies, b->n_copies);
    for (int32_t i = 0; i < a->n_seqs; i++) {
        const pg_plan_seq *x = &a->seqs[i], *y = &b->seqs[i];
        assert_int_equal(x->seq_id, y->seq_id);
        assert_int_equal(x->n_tokens, y->n_tokens);
        assert_int_equal(x->n_draft, y->n_draft);
        assert_int_equal(x->start_pos, y->start_pos);
        assert_int_equal(x->sample, y->sample);
        assert_int_equal(x->n_blocks, y->n_blocks);
        assert_memory_equal(x->tokens, y->tokens, sizeof(int32_t) * (size_t)x->n_tokens);
    }
}

static void same_events(const sched_events *a, const sched_events *b) {
    assert_int_equal(a->n, b->n);
    for (int32_t i = 0; i < a->n; i++) {
        const sched_event *x = &a->ev[i], *y = &b->ev[i];
        assert_int_equal(x->req_id, y->req_id);
        assert_int_equal(x->seq_index, y->seq_index);
        assert_int_equal(x->has_token, y->has_token);
        assert_int_equal(x->out.token, y->out.token);
        assert_int_equal(x->n_generated, y->n_generated);
        assert_int_equal(x->finish, y->finish);
    }
}

// Three single requests and one of three choices, side by side with the
// per-sequence proposer: every step the same plan (entries, tokens, KV
// blocks), the same events and the same free blocks; the batched proposer
// is called once per step that has a speculating sequence, with all of
// them, some answered short and some not at all.
static void test_batch_same_as_per_sequence(void **state) {
    (void)state;
    harness *a = h_new(false, 4, 128, 64), *b = h_new(true, 4, 128, 64);
    for (int32_t side = 0; side < 2; side++) {
        harness *h = side ? b : a;
        h_add(h, 1, 7, 30, 1);
        h_add(h, 2, 5, 30, 1);
        h_add(h, 3, 9, 30, 1);
        h_add(h, 4, 6, 30, 3);
    }
    int32_t steps_with_drafts = 0;
    for (int32_t step = 0; step < 24; step++) {
        const int32_t calls_before = b->prop.calls;
        const pg_batch_plan *pa = h_step(a), *pb = h_step(b);
        same_plan(pa, pb);
        assert_int_equal(free_blocks(a), free_blocks(b));
        int32_t drafts = 0;
        for (int32_t i = 0; i < pb->n_seqs; i++) drafts += pb->seqs[i].n_draft > 0;
        steps_with_drafts += drafts > 0;
        assert_true(b->prop.calls - calls_before <= 1); // one call per step at most
        const sched_events *ea = h_update(a), *eb = h_update(b);
        same_events(ea, eb);
        assert_int_equal(free_blocks(a), free_blocks(b));
    }
    assert_true(steps_with_drafts > 0);
    assert_true(b->prop.max_items >= 4);   // sequences of several requests, choices included
    assert_true(b->prop.short_items > 0);  // got < limit
    assert_true(b->prop.empty_items > 0);  // got == 0: a plain decode
    sched_stats sa, sb;
    sched_stats_get(a->s, &sa);
    sched_stats_get(b->s, &sb);
    assert_int_equal(sa.n_spec_drafts, sb.n_spec_drafts);
    assert_int_equal(sa.n_spec_draft_tokens, sb.n_spec_draft_tokens);
    assert_int_equal(sa.n_spec_accepted, sb.n_spec_accepted);
    h_free(a);
    h_free(b);
}

// Prefill of a 7-token prompt (id 1: 110 .. 116), first token 7: history
// 8, 7 computed, two blocks.
static void prefill(harness *h) {
    h_add(h, 1, 7, 20, 1);
    const int32_t calls = h->prop.calls;
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->seqs[0].n_draft, 0);
    assert_int_equal(h->prop.calls, calls); // a prefill proposes nothing
    h_update(h);
}

// A short answer: the entry keeps 1 + got tokens, the KV slots beyond are
// back in the pool before the runner sees the plan.
static void test_batch_trim_returns_slots(void **state) {
    (void)state;
    harness *h = h_new(true, 4, 32, 64);
    h->prop = (proposer){.mode = 1, .fixed = 1};
    prefill(h);
    const int32_t before = free_blocks(h); // positions 0 .. 7
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(h->prop.calls, 1);
    assert_int_equal(h->prop.last_n_items, 1);
    assert_int_equal(h->prop.last_limit[0], 4);
    assert_int_equal(h->prop.last_got[0], 1);
    const pg_plan_seq *e = &p->seqs[0];
    assert_int_equal(e->n_tokens, 2);
    assert_int_equal(e->n_draft, 1);
    assert_int_equal(p->n_tokens, 2);
    assert_int_equal(e->n_blocks, 3); // positions 0 .. 8 (0 .. 11 before the trim)
    assert_int_equal(free_blocks(h), before - 1);
    assert_int_equal(e->tokens[1], e->tokens[0] + 1);
    h_update(h);
    h_free(h);
}

// Nothing proposed: the entry is a plain one-token decode of the last token.
static void test_batch_empty_answer_is_plain_decode(void **state) {
    (void)state;
    harness *h = h_new(true, 4, 32, 64);
    h->prop = (proposer){.mode = 1, .fixed = 0};
    prefill(h);
    const int32_t before = free_blocks(h);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(h->prop.calls, 1);
    const pg_plan_seq *e = &p->seqs[0];
    assert_int_equal(e->n_tokens, 1);
    assert_int_equal(e->n_draft, 0);
    assert_true(e->sample);
    assert_int_equal(e->start_pos, 7);
    assert_int_equal(e->n_blocks, 2);
    assert_int_equal(p->n_tokens, 1);
    assert_int_equal(free_blocks(h), before);
    const sched_events *ev = h_update(h);
    assert_int_equal(ev->n, 1);
    sched_stats st;
    sched_stats_get(h->s, &st);
    assert_int_equal(st.n_spec_drafts, 0);
    h_free(h);
}

// The provisional draft takes `limit` of the token budget while the step is
// planned (a request after it gets what is left), and the trim gives the
// unused ones back to the plan: 8 tokens, the decoding request drafts up to
// 4 (5 tokens), a waiting prompt gets the 3 left; the answer of 2 leaves a
// plan of 3 + 3.
static void test_batch_budget(void **state) {
    (void)state;
    harness *h = h_new(true, 4, 64, 8);
    h->prop = (proposer){.mode = 1, .fixed = 2};
    prefill(h);
    h_add(h, 2, 6, 20, 1);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 2);
    assert_int_equal(h->prop.last_limit[0], 4);
    assert_int_equal(p->seqs[0].n_tokens, 3);
    assert_int_equal(p->seqs[0].n_draft, 2);
    assert_int_equal(p->seqs[1].n_tokens, 3);
    assert_false(p->seqs[1].sample);
    assert_int_equal(p->n_tokens, 6);
    h_update(h);
    h_free(h);
}

// The adaptive draft length (sched_spec.c spec_note_result) bounds the
// provisional reservation: each step's item asks for the sequence's
// length, which the test follows from the kept drafts (all n kept: at
// least n + 1; 0 < a < n kept: half way to a + 1, in 1/16 tokens; none:
// unchanged; within 1 .. 4), and a draft after one that kept fewer than it offered asks
// for less than k.
static void test_batch_limit_follows_acceptance(void **state) {
    (void)state;
    harness *h = h_new(true, 4, 64, 64);
    h->prop = (proposer){.mode = 1, .fixed = 4};
    h_add(h, 1, 7, 200, 1);
    h_step(h);
    h_update(h); // the prefill
    int32_t len = 4 * 16, skip = 0, misses = 0, shorter = 0, drafts = 0;
    for (int32_t step = 0; step < 30; step++) {
        const int32_t calls = h->prop.calls;
        const pg_batch_plan *p = h_step(h);
        if (p->n_seqs == 0) break;
        const pg_plan_seq *e = &p->seqs[0];
        if (skip > 0) { // the miss backoff: no item this step
            assert_int_equal(h->prop.calls, calls);
            assert_int_equal(e->n_draft, 0);
            skip--;
            h_update(h);
            continue;
        }
        const int32_t want = (len + 8) / 16 < 1 ? 1 : (len + 8) / 16;
        const int32_t room = 200 - 1 - e->n_generated; // max_tokens
        assert_int_equal(h->prop.calls, calls + 1);
        assert_int_equal(h->prop.last_limit[0], want < room ? want : room);
        shorter += h->prop.last_limit[0] < 4;
        const int32_t n = e->n_draft, a = (int32_t)((e->start_pos + e->seq_id) % (n + 1));
        drafts++;
        h_update(h);
        const int32_t x = (a + 1 < 4 ? a + 1 : 4) * 16;
        len = a >= n ? (len > x ? len : x) : a > 0 ? (len + x) / 2 : len;
        if (a > 0) {
            misses = 0;
        } else {
            misses += misses < 5;
            skip = (1 << misses) - 1;
        }
    }
    assert_true(drafts >= 5);
    assert_true(shorter > 0);
    h_free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_same_as_per_sequence),
        cmocka_unit_test(test_batch_trim_returns_slots),
        cmocka_unit_test(test_batch_empty_answer_is_plain_decode),
        cmocka_unit_test(test_batch_budget),
        cmocka_unit_test(test_batch_limit_follows_acceptance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
