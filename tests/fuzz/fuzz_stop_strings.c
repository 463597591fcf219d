// tests/fuzz/fuzz_stop_strings.c - fuzz target for incremental stop-string
// matching (server/stop_strings.c), which every streamed response runs on
// model output that a client steers.
//
// Input: byte 0: bits 0-1 + 1 = number of stop strings, bit 2 include_stop;
// then the stop strings, each ended by a 0xFF byte (empty ones are skipped);
// then the text. The text is fed in pieces whose lengths come from the text
// bytes themselves (so the fuzzer controls the split), and again one byte
// at a time. Checked on every input:
//   - both feeds give the same output and the same match (the split of the
//     text into tokens must not change the answer);
//   - the output is a prefix of the text; without a match it is the whole
//     text (after flush);
//   - with a match: no stop string occurs in the output (without
//     include_stop), or the output ends with a stop string and none
//     completes earlier (with it); a match implies a stop string occurs.
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/stop_strings.h"

#define CHECK(c)                                                                     \
    do {                                                                             \
        if (!(c)) {                                                                  \
            fprintf(stderr, "fuzz_stop_strings: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                                 \
        }                                                                            \
    } while (0)

static bool occurs(const char *hay, size_t n, const char *needle, size_t k) {
    return k <= n && memmem(hay, n, needle, k) != NULL;
}

static bool run(const char *const *stops, const size_t *lens, int n, bool include, const char *text,
                size_t len, bool bytewise, sbuf *out) {
    stop_matcher m;
    stop_matcher_init(&m, stops, lens, n, include);
    bool hit = false;
    size_t i = 0;
    while (i < len) {
        size_t k = bytewise ? 1 : 1 + ((unsigned char)text[i] % 7);
        if (k > len - i) k = len - i;
        hit = stop_matcher_feed(&m, text + i, k, out) || hit;
        i += k;
    }
    if (!hit) stop_matcher_flush(&m, out);
    stop_matcher_free(&m);
    return hit;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int want = (data[0] & 3) + 1;
    bool include = data[0] & 4;
    const char *stops[4];
    size_t lens[4];
    int n = 0;
    size_t p = 1;
    for (int s = 0; s < want && p < size; s++) {
        const uint8_t *end = memchr(data + p, 0xFF, size - p);
        size_t l = end ? (size_t)(end - (data + p)) : size - p;
        if (l > 0 && l <= 64) {
            char *c = malloc(l + 1);
            memcpy(c, data + p, l);
            c[l] = 0;
            stops[n] = c;
            lens[n++] = l;
        }
        p += l + (end ? 1 : 0);
    }
    const char *text = (const char *)data + p;
    size_t len = size - p;
    sbuf a = {0}, b = {0};
    bool hit_a = run(stops, lens, n, include, text, len, false, &a);
    bool hit_b = run(stops, lens, n, include, text, len, true, &b);
    CHECK(hit_a == hit_b);
    CHECK(a.len == b.len && (a.len == 0 || !memcmp(a.p, b.p, a.len)));
    CHECK(a.len <= len && (a.len == 0 || !memcmp(a.p, text, a.len)));
    bool any = false;
    for (int i = 0; i < n; i++) any = any || occurs(text, len, stops[i], lens[i]);
    if (!hit_a) {
        CHECK(!any);
        CHECK(a.len == len);
    } else {
        CHECK(any);
        if (!include) {
            for (int i = 0; i < n; i++) CHECK(!occurs(a.p, a.len, stops[i], lens[i]));
        } else {
            bool ends = false;
            for (int i = 0; i < n; i++) {
                ends = ends || (a.len >= lens[i] && !memcmp(a.p + a.len - lens[i], stops[i], lens[i]));
                if (a.len > 0) CHECK(!occurs(a.p, a.len - 1, stops[i], lens[i]));
            }
            CHECK(ends);
        }
    }
    sbuf_free(&a);
    sbuf_free(&b);
    for (int i = 0; i < n; i++) free((void *)stops[i]);
    return 0;
}
