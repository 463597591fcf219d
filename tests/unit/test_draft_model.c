// tests/unit/test_draft_model.c - the draft-model proposer
// (engine/draft_model.h) on the default model: a batch of histories
// proposes what each proposes alone (greedy), in fewer runner steps (the
// catch-up prefills packed together, one decode step per draft position
// for all), with the same positions computed; the next proposal takes the
// cached prefix; a history the draft's KV cannot hold next to the others
// gets no draft while the others do. Skipped (visibly) when models/ has no
// default model.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/draft_model.h"
#include "kernels/backend.h"
#include "tests/unit/gguf_writer.h"

#define K 4
#define N_SEQ 3

static char model_path[4096];
static bool have_model;

static int setup(void **state) {
    (void)state;
    have_model = tw_repo_path("models/SmolLM2-135M-Instruct.Q4_1.gguf", model_path, sizeof model_path);
    return 0;
}

static pg_draft *draft_new(pg_backend *be, int32_t max_model_len, int64_t kv_tokens) {
    const pg_draft_config c = {.model_path = model_path, .k = K, .max_model_len = max_model_len,
                               .vocab_size = 49152, .kv_tokens = kv_tokens};
    pg_draft *d;
    if (pg_draft_create(&c, be, &d)) fail_msg("pg_draft_create: %s", pg_err_msg());
    return d;
}

// A history of n tokens: a repeated phrase (so the draft has something to
// follow) with a per-sequence start.
static void history(int32_t *h, int32_t n, int32_t seq) {
    static const int32_t phrase[] = {504, 2365, 314, 260, 1329, 2838, 28, 30, 1030, 253, 6421, 29, 1110};
    const int32_t m = (int32_t)(sizeof phrase / sizeof phrase[0]);
    for (int32_t i = 0; i < n; i++) h[i] = phrase[(i + 3 * seq) % m] + (i % (7 + seq) == 0 ? 11 : 0);
}

static void test_batch_same_as_single(void **state) {
    (void)state;
    if (!have_model) {
        print_message("SKIP: models/SmolLM2-135M-Instruct.Q4_1.gguf not present\n");
        skip();
    }
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(2, PG_MATMUL_DEFAULT, &be), 0);
    pg_draft *single = draft_new(be, 512, 0), *batch = draft_new(be, 512, 0);
    // Lengths 40, 23 and 300: the prefills (363 positions) take two steps
    // of 256 together.
    static int32_t hist[N_SEQ][512];
    int32_t len[N_SEQ] = {40, 23, 300};
    for (int32_t s = 0; s < N_SEQ; s++) history(hist[s], len[s], s);
    int64_t steps_single = 0, steps_batch = 0;
    for (int32_t round = 0; round < 2; round++) {
        int32_t want[N_SEQ][K], got[N_SEQ][K], n_want[N_SEQ];
        int64_t p0, pos0, st0, p1, pos1, st1;
        pg_draft_counts(single, &p0, &pos0, &st0);
        for (int32_t s = 0; s < N_SEQ; s++) n_want[s] = pg_draft_propose(single, hist[s], len[s], K, want[s]);
        pg_draft_counts(single, &p1, &pos1, &st1);
        const int64_t pos_single = pos1 - pos0;
        steps_single = st1 - st0;
        sched_propose_item items[N_SEQ];
        for (int32_t s = 0; s < N_SEQ; s++) items[s] = (sched_propose_item){hist[s], len[s], K, got[s], -1, 0};
        pg_draft_counts(batch, &p0, &pos0, &st0);
        pg_draft_propose_batch(batch, items, N_SEQ);
        pg_draft_counts(batch, &p1, &pos1, &st1);
        steps_batch = st1 - st0;
        for (int32_t s = 0; s < N_SEQ; s++) {
            assert_int_equal(items[s].got, K);
            assert_int_equal(n_want[s], K);
            assert_memory_equal(got[s], want[s], sizeof(int32_t) * K);
        }
        assert_int_equal(p1 - p0, N_SEQ);
        assert_int_equal(pos1 - pos0, pos_single); // the same work, in fewer steps
        print_message("round %d: %lld positions; %lld steps alone, %lld batched\n", round, (long long)pos_single,
                      (long long)steps_single, (long long)steps_batch);
        if (round == 0) {
            // Everything computed: prefills of 363 and three drafts' 3 each.
            assert_int_equal(pos_single, 363 + N_SEQ * (K - 1));
            assert_int_equal(steps_single, 1 + 1 + 2 + N_SEQ * (K - 1));
            assert_int_equal(steps_batch, 2 + (K - 1));
        } else {
            // The cached prefix: only the partial last blocks and the drafts.
            assert_true(pos_single < 3 * 16 + 2 * N_SEQ * K);
            assert_int_equal(steps_batch, 1 + (K - 1));
        }
        // Accept the first two drafts and a token of the target's.
        for (int32_t s = 0; s < N_SEQ; s++) {
            hist[s][len[s]] = want[s][0];
            hist[s][len[s] + 1] = want[s][1];
            hist[s][len[s] + 2] = 77;
            len[s] += 3;
        }
    }
    pg_draft_free(single);
    pg_draft_free(batch);
    be->dev->destroy(be);
}

// The draft's KV holds one history of 300 (of 324 positions): the second
// of the batch gets no draft, the first and third (short) do.
static void test_batch_out_of_blocks(void **state) {
    (void)state;
    if (!have_model) {
        print_message("SKIP: models/SmolLM2-135M-Instruct.Q4_1.gguf not present\n");
        skip();
    }
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(2, PG_MATMUL_DEFAULT, &be), 0);
    pg_draft *d = draft_new(be, 320, 1);
    static int32_t hist[N_SEQ][320];
    const int32_t len[N_SEQ] = {300, 300, 8};
    for (int32_t s = 0; s < N_SEQ; s++) history(hist[s], len[s], s);
    int32_t out[N_SEQ][K];
    sched_propose_item items[N_SEQ];
    for (int32_t s = 0; s < N_SEQ; s++) items[s] = (sched_propose_item){hist[s], len[s], K, out[s], -1, 0};
    pg_draft_propose_batch(d, items, N_SEQ);
    assert_int_equal(items[0].got, K);
    assert_int_equal(items[1].got, 0);
    assert_int_equal(items[2].got, K);
    int64_t proposals, positions, steps;
    pg_draft_counts(d, &proposals, &positions, &steps);
    assert_int_equal(proposals, 2);
    assert_int_equal(positions, 308 + 2 * (K - 1));
    pg_draft_free(d);
    be->dev->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_same_as_single),
        cmocka_unit_test(test_batch_out_of_blocks),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
