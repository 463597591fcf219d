// engine/spec/ngram.c - the n-gram prompt-lookup proposer (engine/spec/ngram.h).
#include "engine/spec/ngram.h"

#include "common/err.h"

int pg_ngram_config_check(const pg_ngram_config *c) {
    PG_ARG(c->min_n >= 1, "speculative n-gram: min_n %d, must be >= 1", c->min_n);
    PG_ARG(c->max_n >= c->min_n, "speculative n-gram: max_n %d below min_n %d", c->max_n, c->min_n);
    PG_ARG(c->max_n <= PG_NGRAM_MAX_N, "speculative n-gram: max_n %d above %d", c->max_n,
           PG_NGRAM_MAX_N);
    PG_ARG(c->k >= 1 && c->k <= PG_NGRAM_MAX_K, "speculative n-gram: k %d, must be 1 .. %d", c->k,
           PG_NGRAM_MAX_K);
    return 0;
}

// Where the match is: the n-gram's length and the start of its earliest
// earlier occurrence in the history (len 0: none).
typedef struct {
    int32_t len;
    int32_t start;
} ngram_match;

// Reading the history backwards, r[i] = tokens[n - 1 - i], the suffix of
// length v becomes the prefix r[0 .. v), and an earlier occurrence of it
// starting at s becomes an occurrence of that prefix ending at
// i = n - 1 - s >= 1. KMP's failure function walks every i once keeping
// `cur`, the longest prefix (capped at max_n) ending at i: so any prefix of
// length v ends at i exactly when cur >= v there. The longest cur seen is
// the match length; the last i where it is seen, the earliest start.
// fail[j] is the failure function of the prefix r[0 .. j], needed only for
// j < max_n because cur never exceeds max_n.
static ngram_match longest_earliest(const int32_t *tokens, int32_t n, int32_t max_n) {
    int32_t fail[PG_NGRAM_MAX_N];
    for (int32_t j = 0; j < max_n && j < n; j++) fail[j] = 0;
#define R(i) tokens[n - 1 - (i)]
    ngram_match m = {0, 0};
    int32_t cur = 0;
    for (int32_t i = 1; i < n;) {
        if (R(cur) == R(i)) {
            cur++;
            // >=: a later i (an earlier start) of the same length wins.
            if (cur >= m.len) {
                m.len = cur;
                m.start = n - 1 - i;
            }
            if (i < max_n) fail[i] = cur;
            // Longer prefixes are never wanted: fall back as on a mismatch
            // so the table stays within max_n.
            if (cur == max_n) cur = fail[max_n - 1];
            i++;
        } else if (cur > 0) {
            cur = fail[cur - 1];
        } else {
            i++;
        }
    }
#undef R
    return m;
}

int32_t pg_ngram_propose(const pg_ngram_config *c, const int32_t *tokens, int32_t n, int32_t limit,
                         int32_t *out) {
    PG_CHECK(pg_ngram_config_check(c) == 0);
    int32_t k = c->k < limit ? c->k : limit;
    if (n < c->min_n || k <= 0) return 0;
    ngram_match m = longest_earliest(tokens, n, c->max_n);
    if (m.len < c->min_n) return 0;
    int32_t from = m.start + m.len; // <= n - 1: the occurrence starts before the suffix
    int32_t avail = n - from;
    int32_t count = k < avail ? k : avail;
    for (int32_t i = 0; i < count; i++) out[i] = tokens[from + i];
    return count;
}
