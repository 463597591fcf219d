// server/stop_strings.c - incremental stop-string matcher with hold-back.
#include "server/stop_strings.h"

#include <string.h>

void stop_matcher_init(stop_matcher *m, const char *const *stops, const size_t *lens, int n_stops,
                       bool include_stop) {
    memset(m, 0, sizeof *m);
    m->stops = stops;
    m->lens = lens;
    m->n_stops = n_stops;
    m->include_stop = include_stop;
    m->match_index = -1;
    for (int i = 0; i < n_stops; i++)
        if (lens[i] > m->max_len) m->max_len = lens[i];
}

void stop_matcher_free(stop_matcher *m) { sbuf_free(&m->held); }

// The stop string that completes first in s[0..n) - earliest end, ties to
// the earliest start (the longest: "ab" wins over "b" ending at the same
// byte) - and its position, or -1 when none. By end rather than by start
// so the answer does not depend on how the text was split into tokens:
// with stops "abcd" and "bc", "bc" completes first whether "abcd" arrives
// in one piece or byte by byte (found by tests/fuzz/fuzz_stop_strings.c).
static long find_first(const stop_matcher *m, const char *s, size_t n, int *which) {
    long best = -1;
    size_t best_end = 0;
    for (int i = 0; i < m->n_stops; i++) {
        size_t l = m->lens[i];
        if (l == 0 || l > n) continue;
        const char *p = memmem(s, n, m->stops[i], l);
        if (!p) continue;
        long pos = p - s;
        size_t end = (size_t)pos + l;
        if (best < 0 || end < best_end || (end == best_end && pos < best)) {
            best = pos;
            best_end = end;
            *which = i;
        }
    }
    return best;
}

// Length of the longest suffix of s[0..n) that is a proper prefix of some
// stop string (a stop string that may still complete with more text).
static size_t held_suffix(const stop_matcher *m, const char *s, size_t n) {
    size_t lim = m->max_len ? m->max_len - 1 : 0;
    if (lim > n) lim = n;
    for (size_t k = lim; k > 0; k--) {
        const char *tail = s + n - k;
        for (int i = 0; i < m->n_stops; i++)
            if (m->lens[i] > k && !memcmp(m->stops[i], tail, k)) return k;
    }
    return 0;
}

bool stop_matcher_feed(stop_matcher *m, const char *text, size_t len, sbuf *out) {
    if (m->matched) return true;
    if (m->n_stops == 0) {
        sbuf_append(out, text, len);
        return false;
    }
    sbuf_append(&m->held, text, len);
    const char *s = sbuf_str(&m->held);
    size_t n = m->held.len;
    // The held text holds no complete stop string (it would have matched
    // before), so a match must end in the new bytes; searching all of it is
    // cheap: it is at most max_len - 1 + len bytes.
    int which = -1;
    long pos = find_first(m, s, n, &which);
    if (pos >= 0) {
        size_t end = (size_t)pos + (m->include_stop ? m->lens[which] : 0);
        sbuf_append(out, s, end);
        sbuf_free(&m->held);
        m->matched = true;
        m->match_index = which;
        return true;
    }
    size_t keep = held_suffix(m, s, n);
    sbuf_append(out, s, n - keep);
    sbuf_consume(&m->held, n - keep);
    return false;
}

void stop_matcher_flush(stop_matcher *m, sbuf *out) {
    if (!m->matched && m->held.len) sbuf_append(out, m->held.p, m->held.len);
    sbuf_reset(&m->held);
}
