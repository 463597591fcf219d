// engine/draft_model.h - the draft-model proposer of speculative decoding
// (docs/speculative_decoding.md, vLLM's "draft_model" method): a smaller
// model of the target's vocabulary guesses each sequence's next k tokens
// greedily; the target verifies them in one step (engine/spec/verify.h),
// so what is emitted is the target's alone, whatever the draft says.
//
// The draft has its own runner on the target's (rank 0) backend and its own
// KV blocks with prefix caching: a proposal looks the sequence's history up
// in that cache, computes only what is not there (the tokens accepted since
// the last proposal, and the partial last block), then decodes k tokens one
// at a time, and leaves every full block it wrote in the cache for the next
// proposal of the same sequence (or of another with the same prefix). So
// the proposer keeps no state per sequence and needs no word when one ends:
// the cache's LRU forgets it. The scheduler asks once per step for every
// speculating sequence (sched_spec_config.propose_batch, scheduler/sched.h),
// as vLLM batches its draft: the catch-up prefills of all of them go in
// the same runner steps (packed up to the step's token limit), then each
// of the k - 1 decode steps runs every sequence still drafting, so S
// sequences cost about k draft steps, not S x k.
#pragma once
#include <stdint.h>

#include "engine/model/model.h"
#include "engine/runner/runner.h"
#include "scheduler/sched.h"

typedef struct pg_draft pg_draft;

typedef struct pg_draft_config {
    const char *model_path;   // GGUF file or Hugging Face directory
    int32_t k;                // tokens proposed at most (num_speculative_tokens)
    int32_t max_model_len;    // the target's: the longest history proposed for
    int32_t vocab_size;       // the target's: the draft's must be the same
    int32_t block_size;       // the draft's KV blocks (0: 16)
    int64_t kv_tokens;        // KV positions the draft keeps (0: 2 x max_model_len, at least 4096)
    int32_t kv_dtype;         // the target's KV type (PG_KV_*; 0: the backend's native)
    int32_t max_seqs;         // sequences in one draft step: the speculation backoff's
                              //   max_running_seqs (0: SCHED_SPEC_DEFAULT_MAX_SEQS)
    // The replay draft (engine/draft_replay.h; a measuring tool): with a
    // file, the proposals are rewritten with its recorded tokens.
    const char *replay_path;  // NULL or "": off
    double replay_error_rate; // a replayed token is made wrong with this probability
    uint64_t replay_seed;
} pg_draft_config;

// What the draft allocates, for `paged plan` as for pg_draft_create: its
// runner's limits (max_seqs sequences, steps of up to 256 tokens, no
// graphs, the target's KV type) and its KV blocks (kv_tokens, or 2 x max_model_len and
// at least 4096 positions: room for a few speculating sequences' histories;
// at least one history and its drafts), the null block included.
pg_runner_config pg_draft_runner_config(const pg_draft_config *c);
int32_t pg_draft_kv_blocks(const pg_draft_config *c);

// Loads the draft model on backend `be` (the target's) and sizes its
// runner and KV; PG_EINVAL naming the file when its vocabulary differs
// from the target's, or naming the replay file when it cannot be used.
int pg_draft_create(const pg_draft_config *c, pg_backend *be, pg_draft **out);
void pg_draft_free(pg_draft *d);

// For each item, up to min(k, limit) greedy tokens of the draft to follow
// history[0 .. n) into out (room for limit), their count in got (0 when
// the draft's KV cannot hold the history next to the others' or the
// forward fails: no proposal, never an error). Items beyond max_seqs go in
// further groups of steps. The scheduler's propose_batch.
void pg_draft_propose_batch(pg_draft *d, sched_propose_item *items, int32_t n);
// The same for one history; returns got.
int32_t pg_draft_propose(pg_draft *d, const int32_t *history, int32_t n, int32_t limit, int32_t *out);

// Proposals made, positions the draft computed for them (prefill of what
// its cache did not hold plus the decoded drafts) and the runner steps
// that took (fewer than positions when sequences share steps): tests read
// them.
void pg_draft_counts(const pg_draft *d, int64_t *proposals, int64_t *positions, int64_t *steps);
// The replay draft's file, or NULL when it is off.
struct pg_replay *pg_draft_replay(pg_draft *d);
