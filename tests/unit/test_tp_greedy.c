// tests/unit/test_tp_greedy.c - the CPU backend's tensor-parallel sampling
// exchanges (kernels/backend.h): a vocabulary split into rank slices.
// Greedy (argmax_rows, argmax_pick): each slice's row maxima and the pick
// across ranks, against the greedy token of the whole row (the first
// maximum), with planted ties inside a slice and across slices. Top-k
// (topk_rows, topk_scatter): each slice's k best in the sampler's order, the
// row rebuilt from every rank's, and the seeded sampler on it against the
// sampler on the whole row, token for token, with planted ties of raw and
// of scaled values.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "kernels/backend.h"
#include "kernels/cpu/sampling.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24) * 8.0f - 4.0f;
}

static void check(pg_backend *b, int ranks, int rows, int per) {
    const int vocab = ranks * per;
    float *full = malloc(sizeof(float) * (size_t)rows * vocab);
    for (int i = 0; i < rows * vocab; i++) full[i] = rnd();
    for (int i = 0; i < rows; i += 2) { // ties: the maximum twice, in one slice or in two
        float *row = full + (size_t)i * vocab, mx = row[0];
        for (int j = 1; j < vocab; j++) mx = row[j] > mx ? row[j] : mx;
        row[(int)(rng % (uint64_t)vocab)] = mx;
        row[(int)((rng >> 20) % (uint64_t)vocab)] = mx;
    }
    pg_argmax *cand = malloc(sizeof(pg_argmax) * (size_t)ranks * rows);
    float *slice = malloc(sizeof(float) * (size_t)rows * per);
    for (int k = 0; k < ranks; k++) {
        for (int i = 0; i < rows; i++)
            memcpy(slice + (size_t)i * per, full + (size_t)i * vocab + (size_t)k * per, sizeof(float) * (size_t)per);
        pg_tensor t = {slice, PG_DTYPE_F32, rows, per, per};
        assert_int_equal(b->ops->argmax_rows(b, cand + (size_t)k * rows, t), 0);
    }
    pg_sample_out *out = malloc(sizeof(pg_sample_out) * (size_t)rows);
    assert_int_equal(b->ops->argmax_pick(b, out, cand, ranks, rows, per), 0);
    for (int i = 0; i < rows; i++) {
        const float *row = full + (size_t)i * vocab;
        int best = 0;
        for (int j = 1; j < vocab; j++)
            if (row[j] > row[best]) best = j;
        assert_int_equal(out[i].token, best);
        assert_int_equal(out[i].n_top, 0);
    }
    free(full), free(cand), free(slice), free(out);
}

static void test_greedy_across_ranks_is_the_whole_rows_greedy(void **state) {
    (void)state;
    pg_backend *b;
    assert_int_equal(pg_backend_cpu_create(1, PG_MATMUL_EXACT, &b), 0);
    check(b, 1, 5, 100);
    check(b, 2, 17, 64);
    check(b, 3, 33, 1000);
    check(b, 8, 64, 257);
    b->dev->destroy(b);
}

// One row set split over `ranks`: the sampler on the rebuilt rows gives the
// whole rows' tokens for every seed, and each rank's entries are the first
// of its slice in the sampler's order.
static void check_topk(pg_backend *b, int ranks, int rows, int per, int k, float temp, float top_p, float min_p) {
    const int vocab = ranks * per;
    float *full = malloc(sizeof(float) * (size_t)rows * vocab);
    for (int i = 0; i < rows * vocab; i++) full[i] = rnd();
    for (int i = 0; i < rows; i++) {
        float *row = full + (size_t)i * vocab;
        // Equal raw values across slices, and neighbours one ulp apart that
        // the scaling by 1/T may round to one scaled value.
        for (int t = 0; t < 6; t++) {
            int a = (int)(rng % (uint64_t)vocab), c = (int)((rng >> 24) % (uint64_t)vocab);
            row[c] = t & 1 ? nextafterf(row[a], -INFINITY) : row[a];
            rnd();
        }
    }
    pg_argmax *cand = malloc(sizeof(pg_argmax) * (size_t)ranks * rows);
    pg_argmax *tk = malloc(sizeof(pg_argmax) * (size_t)ranks * rows * k);
    float *slice = malloc(sizeof(float) * (size_t)ranks * rows * per);
    pg_sample_params *params = calloc((size_t)rows, sizeof *params);
    for (int i = 0; i < rows; i++)
        params[i] = (pg_sample_params){.temperature = i % 7 == 3 ? 0.0f : temp, .top_p = top_p, .min_p = min_p,
                                       .repetition_penalty = 1.0f, .top_k = i % 5 == 4 ? 1 : k - i % 3 >= 2 ? k - i % 3 : k,
                                       .logprobs = -1, .seed = 1000u + (uint64_t)i, .n_generated = i};
    for (int r = 0; r < ranks; r++) {
        float *sl = slice + (size_t)r * rows * per;
        for (int i = 0; i < rows; i++)
            memcpy(sl + (size_t)i * per, full + (size_t)i * vocab + (size_t)r * per, sizeof(float) * (size_t)per);
        pg_tensor t = {sl, PG_DTYPE_F32, rows, per, per};
        assert_int_equal(b->ops->argmax_rows(b, cand + (size_t)r * rows, t), 0);
    }
    for (int r = 0; r < ranks; r++) {
        pg_tensor t = {slice + (size_t)r * rows * per, PG_DTYPE_F32, rows, per, per};
        assert_int_equal(b->ops->topk_rows(b, tk + (size_t)r * rows * k, t, k, cand, ranks, params, r * per), 0);
    }
    float *rebuilt = malloc(sizeof(float) * (size_t)rows * vocab);
    pg_tensor lt = {rebuilt, PG_DTYPE_F32, rows, vocab, vocab};
    assert_int_equal(b->ops->topk_scatter(b, lt, tk, ranks, k), 0);
    pg_sampler *smp;
    assert_int_equal(pg_sampler_create(vocab, &smp), 0);
    float *copy = malloc(sizeof(float) * (size_t)vocab);
    for (int i = 0; i < rows; i++) {
        const float *row = full + (size_t)i * vocab;
        float mx = row[0];
        for (int j = 1; j < vocab; j++) mx = row[j] > mx ? row[j] : mx;
        const pg_sample_params *p = &params[i];
        const float inv_t = p->temperature <= 0.0f || p->top_k == 1 ? 1.0f : 1.0f / p->temperature;
        // Each rank's entries: in order, from its slice, and no entry of the
        // slice outside them comes before the last one.
        for (int r = 0; r < ranks; r++) {
            const pg_argmax *e = tk + ((size_t)r * rows + i) * k;
            for (int t = 0; t < k && t < per; t++) {
                assert_true(e[t].index >= r * per && e[t].index < (r + 1) * per);
                assert_true(e[t].value == row[e[t].index]);
                const float st = (e[t].value - mx) * inv_t;
                if (t > 0) {
                    const float sp = (e[t - 1].value - mx) * inv_t;
                    assert_true(sp > st || (sp == st && e[t - 1].index < e[t].index));
                }
            }
            for (int t = per; t < k; t++) assert_int_equal(e[t].index, -1);
        }
        for (int rep = 0; rep < 4; rep++) {
            pg_sample_params q = *p;
            q.seed += 7919u * (uint64_t)rep;
            pg_sample_out a, c;
            memcpy(copy, row, sizeof(float) * (size_t)vocab);
            pg_sampler_sample(smp, &q, NULL, copy, &a);
            memcpy(copy, rebuilt + (size_t)i * vocab, sizeof(float) * (size_t)vocab);
            pg_sampler_sample(smp, &q, NULL, copy, &c);
            if (a.token != c.token) print_message("ranks %d row %d k %d top_k %d T %g: %d vs %d\n", ranks, i, k, q.top_k, q.temperature, a.token, c.token);
            assert_int_equal(a.token, c.token);
        }
    }
    pg_sampler_free(smp);
    free(full), free(cand), free(tk), free(slice), free(params), free(rebuilt), free(copy);
}

static void test_topk_across_ranks_samples_the_whole_rows_token(void **state) {
    (void)state;
    pg_backend *b;
    assert_int_equal(pg_backend_cpu_create(1, PG_MATMUL_EXACT, &b), 0);
    check_topk(b, 1, 9, 300, 8, 0.8f, 1.0f, 0.0f);
    check_topk(b, 2, 17, 500, 50, 1.0f, 0.9f, 0.0f);
    check_topk(b, 3, 12, 1000, 20, 1.3f, 1.0f, 0.05f);
    check_topk(b, 4, 8, 40, 64, 0.7f, 0.95f, 0.0f); // slices shorter than k: entries -1
    check_topk(b, 8, 16, 257, 64, 2.0f, 0.8f, 0.1f);
    check_topk(b, 2, 6, 64, 2, 0.5f, 1.0f, 0.0f);
    b->dev->destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_across_ranks_is_the_whole_rows_greedy),
        cmocka_unit_test(test_topk_across_ranks_samples_the_whole_rows_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
