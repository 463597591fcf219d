// server/stop_strings.h - incremental stop-string matching on detokenized text.
//
// Text arrives in pieces (one detokenized token at a time). The matcher
// passes text through as soon as it cannot be the start of a stop string,
// and holds back the longest tail that is a proper prefix of some stop
// string, so a stop string split across tokens is still found and never
// leaks into a stream. When a stop string matches, the output ends right
// before it (or right after it with include_stop), and everything after is
// dropped. When stop strings overlap, the one that completes first wins
// (earliest end, then earliest start), whatever the token boundaries.
//
// Stop strings are byte strings; with valid UTF-8 input and stop strings
// the emitted pieces are valid UTF-8 (a hold-back starts at a stop string's
// first byte, a character boundary).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "server/sbuf.h"

typedef struct stop_matcher {
    const char *const *stops;   // borrowed: [n_stops] NUL-terminated, non-empty
    const size_t *lens;         // borrowed: [n_stops] lengths
    int n_stops;
    size_t max_len;             // longest stop string
    bool include_stop;          // keep the matched stop string in the output
    sbuf held;                  // text received but not yet emitted
    bool matched;               // a stop string matched: the output has ended
    int match_index;            // which one (valid when matched)
} stop_matcher;

// `stops` and `lens` must outlive the matcher. n_stops may be 0 (the
// matcher then passes everything through).
void stop_matcher_init(stop_matcher *m, const char *const *stops, const size_t *lens, int n_stops,
                       bool include_stop);
void stop_matcher_free(stop_matcher *m);

// Feeds `len` bytes; appends what can be emitted now to `out`. Returns true
// when a stop string matched (now or before: later feeds append nothing).
bool stop_matcher_feed(stop_matcher *m, const char *text, size_t len, sbuf *out);

// End of the sequence: appends the held-back text (no stop string can
// complete any more).
void stop_matcher_flush(stop_matcher *m, sbuf *out);
