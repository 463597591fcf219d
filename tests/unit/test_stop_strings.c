// tests/unit/test_stop_strings.c - the incremental stop-string matcher:
// matches across piece boundaries, holds back only possible prefixes, never
// leaks a stop string, and agrees with a whole-text search for every way
// of splitting the text.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/api_common.h"
#include "server/stop_strings.h"

typedef struct {
    const char *stops[8];
    size_t lens[8];
    int n;
} stops_t;

static stops_t mk(int n, ...) {
    stops_t s = {{0}, {0}, n};
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        s.stops[i] = va_arg(ap, const char *);
        s.lens[i] = strlen(s.stops[i]);
    }
    va_end(ap);
    return s;
}

// Feeds `pieces` (NULL-terminated) and returns the whole output (caller frees);
// *matched tells whether a stop string ended it.
static char *run(const stops_t *s, bool include, const char *const *pieces, bool *matched) {
    stop_matcher m;
    stop_matcher_init(&m, s->stops, s->lens, s->n, include);
    sbuf out = {0};
    *matched = false;
    for (int i = 0; pieces[i]; i++) {
        size_t before = out.len;
        if (stop_matcher_feed(&m, pieces[i], strlen(pieces[i]), &out)) *matched = true;
        // Every emitted piece is valid UTF-8 when the input pieces are.
        assert_true(api_utf8_valid(out.p ? out.p + before : "", out.len - before));
    }
    if (!*matched) stop_matcher_flush(&m, &out);
    stop_matcher_free(&m);
    return sbuf_steal(&out, NULL);
}

static void test_no_stops_passes_everything(void **state) {
    stops_t s = mk(0);
    const char *p[] = {"Hello", " world", NULL};
    bool matched;
    char *out = run(&s, false, p, &matched);
    assert_string_equal(out, "Hello world");
    assert_false(matched);
    free(out);
}

static void test_stop_inside_one_piece(void **state) {
    stops_t s = mk(1, "STOP");
    const char *p[] = {"Hello STOP world", NULL};
    bool matched;
    char *out = run(&s, false, p, &matched);
    assert_string_equal(out, "Hello ");
    assert_true(matched);
    free(out);
}

static void test_stop_across_pieces_never_leaks(void **state) {
    stops_t s = mk(1, "STOP");
    stop_matcher m;
    stop_matcher_init(&m, s.stops, s.lens, s.n, false);
    sbuf out = {0};
    assert_false(stop_matcher_feed(&m, "Hello S", 7, &out));
    assert_string_equal(sbuf_str(&out), "Hello ");  // "S" held back
    assert_false(stop_matcher_feed(&m, "TO", 2, &out));
    assert_string_equal(sbuf_str(&out), "Hello ");  // "STO" held back
    assert_true(stop_matcher_feed(&m, "P!", 2, &out));
    assert_string_equal(sbuf_str(&out), "Hello ");
    assert_true(m.matched);
    assert_int_equal(m.match_index, 0);
    // Later text is dropped.
    assert_true(stop_matcher_feed(&m, "more", 4, &out));
    assert_string_equal(sbuf_str(&out), "Hello ");
    sbuf_free(&out);
    stop_matcher_free(&m);
}

static void test_held_prefix_released_when_it_diverges(void **state) {
    stops_t s = mk(1, "abc");
    stop_matcher m;
    stop_matcher_init(&m, s.stops, s.lens, s.n, false);
    sbuf out = {0};
    assert_false(stop_matcher_feed(&m, "xa", 2, &out));
    assert_string_equal(sbuf_str(&out), "x");
    assert_false(stop_matcher_feed(&m, "bd", 2, &out));
    assert_string_equal(sbuf_str(&out), "xabd");
    assert_false(stop_matcher_feed(&m, "ab", 2, &out));
    assert_string_equal(sbuf_str(&out), "xabd");
    stop_matcher_flush(&m, &out);  // the sequence ended: held text comes out
    assert_string_equal(sbuf_str(&out), "xabdab");
    sbuf_free(&out);
    stop_matcher_free(&m);
}

static void test_include_stop_keeps_it(void **state) {
    stops_t s = mk(1, "STOP");
    const char *p[] = {"Hello ST", "OP and more", NULL};
    bool matched;
    char *out = run(&s, true, p, &matched);
    assert_string_equal(out, "Hello STOP");
    assert_true(matched);
    free(out);
}

static void test_first_completed_stop_wins(void **state) {
    // The stop string that completes first wins, whatever the split: "lo"
    // ends at byte 5, before "llo w" (which starts earlier) ends at 7.
    stops_t s = mk(3, "world", "lo", "llo w");
    const char *p[] = {"Hello world", NULL};
    bool matched;
    char *out = run(&s, false, p, &matched);
    assert_string_equal(out, "Hel");
    free(out);
    const char *p2[] = {"H", "e", "l", "l", "o", " ", "w", NULL};
    out = run(&s, false, p2, &matched);
    assert_string_equal(out, "Hel");
    free(out);
    // Same end: the earlier start (the longer one).
    stops_t u = mk(2, "bc", "abc");
    const char *p3[] = {"xabcd", NULL};
    out = run(&u, false, p3, &matched);
    assert_string_equal(out, "x");
    free(out);
    stops_t t = mk(2, "ab", "abc");
    stop_matcher m;
    stop_matcher_init(&m, t.stops, t.lens, t.n, true);
    sbuf o = {0};
    assert_true(stop_matcher_feed(&m, "xabcd", 5, &o));
    assert_string_equal(sbuf_str(&o), "xab");  // "ab" completes before "abc"
    assert_int_equal(m.match_index, 0);
    sbuf_free(&o);
    stop_matcher_free(&m);
}

static void test_self_overlapping_stop(void **state) {
    // "aab" in "aaab": the hold-back must keep "aa", not restart at "a".
    stops_t s = mk(1, "aab");
    const char *p[] = {"a", "a", "a", "b", "c", NULL};
    bool matched;
    char *out = run(&s, false, p, &matched);
    assert_string_equal(out, "a");
    assert_true(matched);
    free(out);
}

static void test_utf8_stop_strings(void **state) {
    stops_t s = mk(1, "é!");
    const char *p[] = {"caf", "é", " ok é", "!", NULL};
    bool matched;
    char *out = run(&s, false, p, &matched);
    assert_string_equal(out, "café ok ");
    assert_true(matched);
    free(out);
}

// Splitting the text at every position (two cuts) gives the same output as
// a search over the whole text.
static void test_every_split_matches_whole_text(void **state) {
    const char *texts[] = {"The answer is 42.\nUser: next", "abababcab", "no stop here at all",
                           "xxSTOPyySTOP", "ééé<|end|>tail"};
    stops_t s = mk(4, "\nUser:", "abc", "STOP", "<|end|>");
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        const char *text = texts[t];
        size_t n = strlen(text);
        // Reference: earliest match over the whole text.
        size_t cut = n;
        for (int i = 0; i < s.n; i++) {
            const char *q = strstr(text, s.stops[i]);
            if (q && (size_t)(q - text) < cut) cut = (size_t)(q - text);
        }
        for (size_t a = 0; a <= n; a++)
            for (size_t b = a; b <= n; b++) {
                char p1[64], p2[64], p3[64];
                memcpy(p1, text, a), p1[a] = 0;
                memcpy(p2, text + a, b - a), p2[b - a] = 0;
                memcpy(p3, text + b, n - b), p3[n - b] = 0;
                stop_matcher m;
                stop_matcher_init(&m, s.stops, s.lens, s.n, false);
                sbuf out = {0};
                bool hit = stop_matcher_feed(&m, p1, a, &out);
                hit = stop_matcher_feed(&m, p2, b - a, &out) || hit;
                hit = stop_matcher_feed(&m, p3, n - b, &out) || hit;
                if (!hit) stop_matcher_flush(&m, &out);
                assert_int_equal(hit, cut < n);
                assert_int_equal(out.len, cut);
                assert_memory_equal(out.p ? out.p : "", text, cut);
                sbuf_free(&out);
                stop_matcher_free(&m);
            }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_stops_passes_everything),
        cmocka_unit_test(test_stop_inside_one_piece),
        cmocka_unit_test(test_stop_across_pieces_never_leaks),
        cmocka_unit_test(test_held_prefix_released_when_it_diverges),
        cmocka_unit_test(test_include_stop_keeps_it),
        cmocka_unit_test(test_first_completed_stop_wins),
        cmocka_unit_test(test_self_overlapping_stop),
        cmocka_unit_test(test_utf8_stop_strings),
        cmocka_unit_test(test_every_split_matches_whole_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
