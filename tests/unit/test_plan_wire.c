// tests/unit/test_plan_wire.c - a step plan as the bytes node 0 sends its
// followers (engine/dist/plan_wire.h): a plan with every kind of field
// (prefill and decode entries, two KV layer groups, sampling parameters
// with logit bias, a history, masks for a draft entry, all three move
// lists with copies ahead among the swap-outs) decodes to an equal plan;
// a cut short or padded buffer, and move counts that cannot be, are
// PG_EFORMAT.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <string.h>

#include "common/err.h"
#include "engine/dist/plan_wire.h"

enum { WORDS = 3 };

typedef struct fixture {
    pg_sampling_params sp;
    int32_t bias_ids[2];
    float bias_values[2];
    int32_t tok0[5], tok1[3], bt0[2 * 2], bt1[3 * 2], hist1[40];
    uint32_t masks1[3 * WORDS]; // entry 1: 2 drafts, 3 rows of masks
    pg_plan_seq seqs[2];
    pg_block_move out[3], in[1], cp[1];
    pg_batch_plan plan;
} fixture;

static void make(fixture *f) {
    memset(f, 0, sizeof *f);
    pg_sampling_params_default(&f->sp);
    f->sp.temperature = 0.7f;
    f->sp.n_logit_bias = 2;
    f->bias_ids[0] = 11, f->bias_ids[1] = 29;
    f->bias_values[0] = -3.5f, f->bias_values[1] = 2.0f;
    f->sp.bias_ids = f->bias_ids;
    f->sp.bias_values = f->bias_values;
    for (int i = 0; i < 5; i++) f->tok0[i] = 100 + i;
    for (int i = 0; i < 3; i++) f->tok1[i] = 200 + i;
    for (int i = 0; i < 4; i++) f->bt0[i] = 7 + i;
    for (int i = 0; i < 6; i++) f->bt1[i] = 20 + i;
    for (int i = 0; i < 40; i++) f->hist1[i] = i * 3;
    for (int i = 0; i < 3 * WORDS; i++) f->masks1[i] = 0x9e3779b9u * (uint32_t)(i + 1);
    // A prefill chunk (no sampling parameters, no history) and a decode
    // entry with two drafts, sampled, with masks.
    f->seqs[0] = (pg_plan_seq){.seq_id = 5, .tokens = f->tok0, .n_tokens = 5, .start_pos = 16,
                               .block_table = f->bt0, .n_blocks = 2, .lora_id = 2};
    f->seqs[1] = (pg_plan_seq){.seq_id = 9, .tokens = f->tok1, .n_tokens = 3, .start_pos = 37,
                               .block_table = f->bt1, .n_blocks = 3, .sample = true, .sp = &f->sp,
                               .history = f->hist1, .n_history = 40, .n_prompt = 30, .n_generated = 8,
                               .rng_seed = 0x1234567890abcdefull, .mask_eos = true, .eos_id = 2,
                               .mask = f->masks1, .n_draft = 2};
    f->out[0] = (pg_block_move){3, 0};
    f->out[1] = (pg_block_move){4, 1};
    f->out[2] = (pg_block_move){12, 5}; // the copy ahead
    f->in[0] = (pg_block_move){2, 30};
    f->cp[0] = (pg_block_move){8, 31};
    f->plan = (pg_batch_plan){.n_seqs = 2, .seqs = f->seqs, .n_tokens = 8, .n_swap_out = 3, .n_swap_in = 1,
                              .n_copies = 1, .n_swap_out_ahead = 1, .swap_out = f->out, .swap_in = f->in,
                              .copies = f->cp, .mask_words = WORDS, .kv_groups = 2};
}

static void assert_moves(const pg_block_move *a, const pg_block_move *b, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(a[i].from, b[i].from);
        assert_int_equal(a[i].to, b[i].to);
    }
}

static void test_round_trip(void **state) {
    (void)state;
    fixture f;
    make(&f);
    pg_wbuf b = {0};
    pg_plan_encode(&b, &f.plan);
    pg_plan_decoded d;
    assert_int_equal(pg_plan_decode(b.data, b.len, &d), 0);
    const pg_batch_plan *p = &d.plan;
    assert_int_equal(p->n_seqs, 2);
    assert_int_equal(p->n_tokens, 8);
    assert_int_equal(p->kv_groups, 2);
    assert_int_equal(p->mask_words, WORDS);
    assert_int_equal(p->n_swap_out, 3);
    assert_int_equal(p->n_swap_out_ahead, 1);
    assert_int_equal(p->n_swap_in, 1);
    assert_int_equal(p->n_copies, 1);
    assert_moves(p->swap_out, f.out, 3);
    assert_moves(p->swap_in, f.in, 1);
    assert_moves(p->copies, f.cp, 1);
    const pg_plan_seq *s0 = &p->seqs[0], *s1 = &p->seqs[1];
    assert_int_equal(s0->seq_id, 5);
    assert_int_equal(s0->lora_id, 2);
    assert_memory_equal(s0->tokens, f.tok0, sizeof f.tok0);
    assert_memory_equal(s0->block_table, f.bt0, sizeof f.bt0); // 2 blocks x 2 groups
    assert_null(s0->sp);
    assert_null(s0->history);
    assert_null(s0->mask);
    assert_false(s0->sample);
    assert_int_equal(s1->seq_id, 9);
    assert_true(s1->sample && s1->mask_eos);
    assert_int_equal(s1->start_pos, 37);
    assert_int_equal(s1->n_prompt, 30);
    assert_int_equal(s1->n_generated, 8);
    assert_int_equal(s1->eos_id, 2);
    assert_int_equal(s1->n_draft, 2);
    assert_true(s1->rng_seed == 0x1234567890abcdefull);
    assert_memory_equal(s1->tokens, f.tok1, sizeof f.tok1);
    assert_memory_equal(s1->block_table, f.bt1, sizeof f.bt1);
    assert_int_equal(s1->n_history, 40);
    assert_memory_equal(s1->history, f.hist1, sizeof f.hist1);
    assert_non_null(s1->sp);
    assert_true(s1->sp->temperature == 0.7f);
    assert_int_equal(s1->sp->n_logit_bias, 2);
    assert_memory_equal(s1->sp->bias_ids, f.bias_ids, sizeof f.bias_ids);
    assert_memory_equal(s1->sp->bias_values, f.bias_values, sizeof f.bias_values);
    assert_memory_equal(s1->mask, f.masks1, sizeof f.masks1); // n_draft + 1 rows
    pg_plan_decoded_free(&d);
    pg_wbuf_free(&b);
}

// Every prefix of the bytes is not a plan, nor the bytes with one more.
static void test_cut_or_padded_rejected(void **state) {
    (void)state;
    fixture f;
    make(&f);
    pg_wbuf b = {0};
    pg_plan_encode(&b, &f.plan);
    for (size_t len = 0; len < b.len; len++) {
        pg_plan_decoded d;
        if (pg_plan_decode(b.data, len, &d) != PG_EFORMAT) fail_msg("%zu of %zu bytes decoded", len, b.len);
    }
    pg_wbuf_put(&b, "", 1);
    pg_plan_decoded d;
    assert_int_equal(pg_plan_decode(b.data, b.len, &d), PG_EFORMAT);
    pg_wbuf_free(&b);
}

// More copies ahead than swap-outs, or a negative count, is no plan.
static void test_bad_move_counts_rejected(void **state) {
    (void)state;
    int32_t bad_ahead[][2] = {{4, 3}, {-1, 3}};
    for (size_t k = 0; k < sizeof bad_ahead / sizeof bad_ahead[0]; k++) {
        fixture f;
        make(&f);
        f.plan.n_swap_out_ahead = bad_ahead[k][0];
        f.plan.n_swap_out = bad_ahead[k][1];
        pg_wbuf b = {0};
        pg_plan_encode(&b, &f.plan);
        pg_plan_decoded d;
        assert_int_equal(pg_plan_decode(b.data, b.len, &d), PG_EFORMAT);
        assert_non_null(strstr(pg_err_msg(), "move counts"));
        pg_wbuf_free(&b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_cut_or_padded_rejected),
        cmocka_unit_test(test_bad_move_counts_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
