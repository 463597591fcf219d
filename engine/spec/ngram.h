// engine/spec/ngram.h - the n-gram prompt-lookup proposer of speculative
// decoding (docs/speculative_decoding.md): guesses a sequence's next tokens
// by finding its last few tokens earlier in its own history (prompt then
// output) and copying what followed them there. No model, no allocation;
// the verifier (engine/spec/verify.h) decides what of the guess is kept.
//
// The rule is vLLM's (vllm/v1/spec_decode/ngram_proposer.py), so acceptance
// rates can be compared with it request for request:
//   - the n-gram is the history's suffix of length n, tried for the longest
//     n in [min_n, max_n] that occurs earlier in the history (an occurrence
//     starting before the suffix does; it may overlap the suffix);
//   - of that n-gram's earlier occurrences, the earliest (lowest start):
//     it has the longest continuation before the history ends, so the
//     proposal is cut short least often;
//   - the proposal is the up to k tokens that follow that occurrence, fewer
//     when the history ends first (at least one, since it starts earlier).
// One pass of the KMP failure function over the reversed history finds it
// in O(n) time with O(max_n) stack memory.
#pragma once
#include <stdint.h>

#define PG_NGRAM_MAX_N 64 // longest n-gram (bounds the failure table on the stack)
#define PG_NGRAM_MAX_K 64 // most tokens proposed per step

typedef struct pg_ngram_config {
    int32_t min_n; // shortest n-gram that counts as a match, >= 1
    int32_t max_n; // longest n-gram tried, min_n .. PG_NGRAM_MAX_N
    int32_t k;     // tokens proposed at most (num_speculative_tokens), 1 .. PG_NGRAM_MAX_K
} pg_ngram_config;

// 0, or PG_EINVAL with a message (pg_err_msg) naming the bad field.
int pg_ngram_config_check(const pg_ngram_config *c);

// Proposes up to min(c->k, limit) tokens to follow tokens[0 .. n) into
// out (room for c->k) and returns how many (0: no proposal: no match, or
// n < min_n, or limit <= 0). `limit` is the caller's room left (the
// context length or max_tokens still open). c must pass
// pg_ngram_config_check (checked: a bad config is a bug here).
int32_t pg_ngram_propose(const pg_ngram_config *c, const int32_t *tokens, int32_t n, int32_t limit,
                         int32_t *out);
