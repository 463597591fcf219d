// tests/unit/test_progress.c - the load progress bar: the rendered line at
// fixed points (empty, half, full, over-full, unknown total, tiny buffer),
// and nothing written when the stream is not a terminal.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "common/progress.h"

static pg_progress at(int64_t done, int64_t total) {
    pg_progress p;
    memset(&p, 0, sizeof p);
    p.label = "loading weights";
    p.total = total;
    p.done = done;
    p.t0_ns = 1000;
    return p;
}

static void test_half_way_with_rate(void **state) {
    (void)state;
    pg_progress p = at(8100000000LL, 16200000000LL);
    char buf[256];
    // 8.1 GB in 3.5 s: 2.3 GB/s; 12 of 24 cells.
    size_t n = pg_progress_render(&p, 1000 + 3500000000LL, buf, sizeof buf);
    assert_string_equal(buf, "loading weights  [############............]  8.1/16.2 GB  2.3 GB/s");
    assert_int_equal(n, strlen(buf));
}

static void test_empty_and_full(void **state) {
    (void)state;
    char buf[256];
    pg_progress p = at(0, 1000000000LL);
    pg_progress_render(&p, 1000, buf, sizeof buf); // no time elapsed: no rate
    assert_string_equal(buf, "loading weights  [........................]  0.0/1.0 GB");
    p = at(1000000000LL, 1000000000LL);
    pg_progress_render(&p, 1000 + 2000000000LL, buf, sizeof buf);
    assert_string_equal(buf, "loading weights  [########################]  1.0/1.0 GB  0.5 GB/s");
    // More than announced (a miscounted total) never overflows the bar.
    p = at(3000000000LL, 1000000000LL);
    pg_progress_render(&p, 1000 + 1000000000LL, buf, sizeof buf);
    assert_non_null(strstr(buf, "[########################]  3.0/1.0 GB  3.0 GB/s"));
}

static void test_unknown_total_and_short_buffer(void **state) {
    (void)state;
    char buf[256];
    pg_progress p = at(500000000LL, 0);
    pg_progress_render(&p, 1000 + 1000000000LL, buf, sizeof buf);
    assert_string_equal(buf, "loading weights  [........................]  0.5/0.0 GB  0.5 GB/s");
    char small[10];
    size_t n = pg_progress_render(&p, 1000, small, sizeof small);
    assert_int_equal(n, 9);
    assert_string_equal(small, "loading w");
    assert_int_equal(pg_progress_render(&p, 1000, small, 0), 0);
}

static void test_not_a_terminal_writes_nothing(void **state) {
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    pg_progress p;
    pg_progress_begin(&p, "loading weights", 100, f);
    assert_false(p.draw);
    pg_progress_add(&p, 60, 1);
    pg_progress_add(&p, 40, 2);
    assert_int_equal(p.done, 100);
    assert_int_equal(p.items, 3);
    double secs = pg_progress_end(&p);
    assert_true(secs >= 0);
    assert_int_equal(ftell(f), 0);
    fclose(f);
    // No stream at all: counts, never draws.
    pg_progress_begin(&p, NULL, 10, NULL);
    pg_progress_add(&p, 5, 1);
    assert_int_equal(p.done, 5);
    pg_progress_end(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_way_with_rate),
        cmocka_unit_test(test_empty_and_full),
        cmocka_unit_test(test_unknown_total_and_short_buffer),
        cmocka_unit_test(test_not_a_terminal_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
