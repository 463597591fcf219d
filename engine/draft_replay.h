// engine/draft_replay.h - the replay draft: a measuring tool for speculative
// decoding (docs/speculative_decoding.md, "The replay draft"), not a
// proposer for users.
//
// With random weights (the GPU benchmarks' llama3-8b shape) a draft model
// never agrees with the target, so the acceptance rate cannot be chosen and
// the cost of speculation at a given acceptance cannot be measured. The
// replay draft fixes the acceptance: the draft model still runs every
// forward pass (its cost is measured), but the tokens it proposes are
// replaced by what an earlier greedy run of the target emitted at those
// positions (a JSONL file as `paged generate --prompts-file` writes it:
// "prompt_ids" and "output_ids"), each replaced in turn by a wrong token
// with probability error_rate. Greedy verification then keeps every right
// token up to the first wrong one: acceptance 1.0 at rate 0, and each
// draft token right with probability 1 - rate otherwise.
//
// Requests are matched to lines by their prompt token ids (a hash, then the
// ids compared), so the file's order and extra lines do not matter. A
// request the file does not hold, one whose output so far differs from the
// recorded one, and positions past the recorded tokens keep the draft
// model's own proposal.
#pragma once
#include <stdint.h>

typedef struct pg_replay pg_replay;

typedef struct pg_replay_config {
    const char *path;  // the JSONL file
    double error_rate; // 0 .. 1: probability that a replayed token is made wrong
    uint64_t seed;     // which positions are wrong (with the prompt: not the batch)
    int32_t vocab_size; // recorded ids must be below it; wrong ids are drawn from it
} pg_replay_config;

// Reads and indexes the file. PG_EINVAL / PG_EIO with one line naming the
// file and the reason (missing, not JSON at line N, no "output_ids", an id
// outside the vocabulary, no usable line at all). Lines with "error" (a
// failed request of the recording run) are skipped.
int pg_replay_load(const pg_replay_config *c, pg_replay **out);
void pg_replay_free(pg_replay *r);

// Requests (lines) and output tokens held.
void pg_replay_size(const pg_replay *r, int32_t *requests, int64_t *tokens);

// Rewrites out[0 .. got), the draft's proposal to follow history[0 .. n)
// whose first n_prompt tokens are the prompt, with the recorded tokens at
// output positions n - n_prompt .. (each wrong with probability
// error_rate, decided by (seed, prompt, position) alone). Returns the
// tokens replaced; what it does not replace stays the draft's.
int32_t pg_replay_apply(pg_replay *r, const int32_t *history, int32_t n, int32_t n_prompt, int32_t *out,
                        int32_t got);

// Tokens replaced so far, and of those made wrong: tests read them.
void pg_replay_counts(const pg_replay *r, int64_t *replaced, int64_t *wrong);
