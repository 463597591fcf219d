// tests/unit/test_draft_replay.c - the replay draft (engine/draft_replay.h):
// recorded tokens replace the draft's at the request's output positions,
// only for a recorded prompt whose output so far is the recorded one and
// only up to the recorded end; the error rate makes about that share of
// positions wrong, never the recorded id, the same whatever the draft
// length or how often a position is proposed; bad files are one line
// naming the file and the reason.
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/draft_replay.h"

#define VOCAB 1000

// Writes `text` to a fresh temporary file; its path into path.
static void write_tmp(char path[64], const char *text) {
    snprintf(path, 64, "/tmp/test_draft_replay_XXXXXX");
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static pg_replay *load(const char *text, double rate, uint64_t seed) {
    char path[64];
    write_tmp(path, text);
    const pg_replay_config c = {.path = path, .error_rate = rate, .seed = seed, .vocab_size = VOCAB};
    pg_replay *r = NULL;
    const int rc = pg_replay_load(&c, &r);
    unlink(path);
    if (rc < 0) fail_msg("pg_replay_load: %s", pg_err_msg());
    return r;
}

// Two recorded requests (as paged generate writes them, extra keys and
// all), a failed one and a blank line.
static const char *two =
    "{\"index\":0,\"text\":\"a\",\"prompt_ids\":[5,6,7],\"output_ids\":[10,11,12,13],\"tpot_ms\":1}\n"
    "\n"
    "{\"index\":1,\"error\":\"too long\",\"prompt_tokens\":9}\n"
    "{\"index\":2,\"prompt_ids\":[5,6],\"output_ids\":[20,21]}\n";

static void test_replaces_recorded_positions(void **state) {
    (void)state;
    pg_replay *r = load(two, 0, 0);
    int32_t reqs;
    int64_t toks;
    pg_replay_size(r, &reqs, &toks);
    assert_int_equal(reqs, 2);
    assert_int_equal(toks, 6);
    // Prompt 5 6 7 with one output token (10) so far: 11 12 13 replayed,
    // the fourth position is past the recording and stays the draft's.
    const int32_t h1[] = {5, 6, 7, 10};
    int32_t out[4] = {900, 901, 902, 903};
    assert_int_equal(pg_replay_apply(r, h1, 4, 3, out, 4), 3);
    assert_int_equal(out[0], 11);
    assert_int_equal(out[1], 12);
    assert_int_equal(out[2], 13);
    assert_int_equal(out[3], 903);
    // The prompt 5 6 (a prefix of the first): its own recording.
    const int32_t h2[] = {5, 6};
    int32_t out2[2] = {900, 901};
    assert_int_equal(pg_replay_apply(r, h2, 2, 2, out2, 2), 2);
    assert_int_equal(out2[0], 20);
    assert_int_equal(out2[1], 21);
    // Unknown prompt, an output that left the recording, the recording
    // done, no prompt length: the draft's tokens stand.
    const int32_t h3[] = {5, 6, 8, 10};
    const int32_t h4[] = {5, 6, 7, 99};
    const int32_t h5[] = {5, 6, 7, 10, 11, 12, 13};
    int32_t o[2] = {900, 901};
    assert_int_equal(pg_replay_apply(r, h3, 4, 3, o, 2), 0);
    assert_int_equal(pg_replay_apply(r, h4, 4, 3, o, 2), 0);
    assert_int_equal(pg_replay_apply(r, h5, 7, 3, o, 2), 0);
    assert_int_equal(pg_replay_apply(r, h1, 4, 0, o, 2), 0);
    assert_int_equal(o[0], 900);
    assert_int_equal(o[1], 901);
    int64_t replaced, wrong;
    pg_replay_counts(r, &replaced, &wrong);
    assert_int_equal(replaced, 5);
    assert_int_equal(wrong, 0);
    pg_replay_free(r);
}

// One request of n recorded tokens (i % 997 + 1).
static char *long_file(int32_t n) {
    char *s = malloc((size_t)n * 8 + 64);
    int len = sprintf(s, "{\"prompt_ids\":[1,2,3],\"output_ids\":[");
    for (int32_t i = 0; i < n; i++) len += sprintf(s + len, "%s%d", i ? "," : "", i % 997 + 1);
    sprintf(s + len, "]}\n");
    return s;
}

// Proposes position by position (got 1): which positions came out wrong.
static int32_t wrong_positions(pg_replay *r, int32_t n, bool *wrong) {
    int32_t *h = malloc(sizeof(int32_t) * (size_t)(n + 3));
    h[0] = 1, h[1] = 2, h[2] = 3;
    int32_t count = 0;
    for (int32_t p = 0; p < n; p++) {
        int32_t t = -1;
        assert_int_equal(pg_replay_apply(r, h, 3 + p, 3, &t, 1), 1);
        const int32_t rec = p % 997 + 1;
        assert_true(t >= 0 && t < VOCAB);
        wrong[p] = t != rec;
        count += wrong[p];
        h[3 + p] = rec; // the target keeps the recorded token
    }
    free(h);
    return count;
}

static void test_error_rate(void **state) {
    (void)state;
    enum { N = 4000 };
    char *text = long_file(N);
    static bool w1[N], w2[N], w3[N];
    pg_replay *a = load(text, 0.5, 7), *b = load(text, 0.5, 7), *c = load(text, 0.5, 8), *all = load(text, 1, 7);
    const int32_t n1 = wrong_positions(a, N, w1);
    print_message("rate 0.5: %d of %d positions wrong\n", n1, N);
    assert_true(n1 > N * 0.46 && n1 < N * 0.54);
    assert_int_equal(wrong_positions(b, N, w2), n1);
    assert_memory_equal(w1, w2, sizeof w1); // the same seed: the same positions
    wrong_positions(c, N, w3);
    assert_memory_not_equal(w1, w3, sizeof w1);
    assert_int_equal(wrong_positions(all, N, w3), N);
    int64_t replaced, wrong;
    pg_replay_counts(a, &replaced, &wrong);
    assert_int_equal(replaced, N);
    assert_int_equal(wrong, n1);
    // A draft of 8 from position 100 decides its positions as the single
    // proposals did (the position, not the call, decides).
    int32_t h[103] = {1, 2, 3};
    for (int32_t p = 0; p < 100; p++) h[3 + p] = p % 997 + 1;
    int32_t out[8];
    assert_int_equal(pg_replay_apply(a, h, 103, 3, out, 8), 8);
    for (int32_t i = 0; i < 8; i++) assert_int_equal(out[i] != (100 + i) % 997 + 1, w1[100 + i]);
    pg_replay_free(a);
    pg_replay_free(b);
    pg_replay_free(c);
    pg_replay_free(all);
    free(text);
}

// A file refused: the message names it and holds `reason`.
static void refused(const char *text, const char *reason) {
    char path[64];
    write_tmp(path, text);
    const pg_replay_config c = {.path = path, .error_rate = 0, .vocab_size = VOCAB};
    pg_replay *r = (pg_replay *)1;
    assert_true(pg_replay_load(&c, &r) < 0);
    unlink(path);
    assert_null(r);
    print_message("refused: %s\n", pg_err_msg());
    assert_non_null(strstr(pg_err_msg(), path));
    if (!strstr(pg_err_msg(), reason)) fail_msg("\"%s\" does not say \"%s\"", pg_err_msg(), reason);
    assert_null(strchr(pg_err_msg(), '\n'));
}

static void test_bad_files(void **state) {
    (void)state;
    refused("{\"prompt_ids\":[1],\"output_ids\":[2]}\n{\"prompt_ids\":[1],\n", "line 2 is not a JSON object");
    refused("[1, 2]\n", "line 1 is not a JSON object");
    refused("{\"index\":0,\"text\":\"x\"}\n", "line 1 has no \"prompt_ids\" and \"output_ids\"");
    refused("{\"prompt_ids\":[1],\"output_ids\":[1000]}\n", "below the vocabulary's 1000");
    refused("{\"prompt_ids\":[],\"output_ids\":[1]}\n", "line 1: \"prompt_ids\"");
    refused("{\"prompt_ids\":[1],\"output_ids\":[-1]}\n", "line 1: \"prompt_ids\"");
    refused("{\"prompt_ids\":[1],\"output_ids\":\"3 4\"}\n", "line 1: \"prompt_ids\"");
    refused("", "no request to replay");
    refused("{\"error\":\"x\"}\n\n", "no request to replay");
    const pg_replay_config c = {.path = "/nonexistent/replay.jsonl", .vocab_size = VOCAB};
    pg_replay *r;
    assert_true(pg_replay_load(&c, &r) < 0);
    print_message("refused: %s\n", pg_err_msg());
    assert_non_null(strstr(pg_err_msg(), "replay file /nonexistent/replay.jsonl: No such file"));
    const pg_replay_config bad_rate = {.path = "/nonexistent/replay.jsonl", .error_rate = 1.5, .vocab_size = VOCAB};
    assert_true(pg_replay_load(&bad_rate, &r) < 0);
    assert_non_null(strstr(pg_err_msg(), "replay_error_rate 1.5"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replaces_recorded_positions),
        cmocka_unit_test(test_error_rate),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
