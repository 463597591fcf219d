// tests/unit/test_tp_greedy.c - the CPU backend's tensor-parallel greedy
// ops (kernels/backend.h argmax_rows, argmax_pick): a vocabulary split into
// rank slices, each slice's row maxima, the pick across ranks, against the
// greedy token of the whole row (the first maximum), with planted ties
// inside a slice and across slices.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

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
        assert_int_equal(b->argmax_rows(b, cand + (size_t)k * rows, t), 0);
    }
    pg_sample_out *out = malloc(sizeof(pg_sample_out) * (size_t)rows);
    assert_int_equal(b->argmax_pick(b, out, cand, ranks, rows, per), 0);
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
    b->destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_across_ranks_is_the_whole_rows_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
