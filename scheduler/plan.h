// scheduler/plan.h - the contract between the scheduler and the runner.
//
// The scheduler produces a pg_batch_plan each step and consumes a
// pg_step_output; it knows nothing of tensors. The runner (engine/) needs
// nothing but the plan to execute a step. All pointers in a plan are owned
// by the scheduler and stay valid until sched_update() (or sched_advance())
// for that step.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#define PG_MAX_LOGPROBS 20
#define PG_MAX_STOP_IDS 64
#define PG_MAX_LOGIT_BIAS 300  // OpenAI's limit on logit_bias entries
// Speculative decoding (docs/speculative_decoding.md): draft tokens one plan
// entry carries at most (num_speculative_tokens), so a step emits up to
// PG_MAX_DRAFT + 1 tokens per sequence.
#define PG_MAX_DRAFT 16

// Sampling parameters of one request (vLLM's names and defaults).
typedef struct pg_sampling_params {
    float temperature;        // 0 = greedy
    float top_p;              // 1 = off
    int32_t top_k;            // 0 or -1 = off
    float min_p;              // 0 = off
    float repetition_penalty; // 1 = off; over prompt and output tokens
    float presence_penalty;   // 0 = off; over output tokens
    float frequency_penalty;  // 0 = off; over output tokens
    uint64_t seed;            // used when has_seed
    bool has_seed;
    int32_t n;                // parallel samples
    int32_t max_tokens;
    int32_t min_tokens;       // EOS and stop ids are masked until reached
    bool ignore_eos;
    int32_t logprobs;         // -1 = none, 0..PG_MAX_LOGPROBS top entries
    int32_t n_stop_ids;
    int32_t stop_ids[PG_MAX_STOP_IDS];
    // logit_bias: added to the logits before sampling (after penalties).
    // The arrays belong to whoever submitted the request (the engine keeps
    // its copy until the request finishes); the scheduler copies only the
    // pointers.
    int32_t n_logit_bias;
    const int32_t *bias_ids;  // [n_logit_bias]
    const float *bias_values; // [n_logit_bias]
    // A token mask per step (a grammar, allowed_token_ids) that the engine
    // computes from the previous step's token: such a request never runs
    // ahead (sched_can_run_ahead).
    bool constrained;
    // Prompt logprobs (vLLM's prompt_logprobs; echo with logprobs): for
    // every prompt position p >= 1 the logprob and rank of prompt token p
    // under the logits at p - 1, and the top prompt_logprobs entries
    // (0..PG_MAX_LOGPROBS). Such a request computes every prompt position:
    // it takes no prefix-cache hits. A flag, so a zeroed struct asks none.
    bool want_prompt_logprobs;
    int32_t prompt_logprobs;
} pg_sampling_params;

// Fills `p` with the defaults: temperature 1, top_p 1, top_k off, n 1,
// max_tokens 16, logprobs -1, no penalties, no seed.
void pg_sampling_params_default(pg_sampling_params *p);

// A decode entry's token under async scheduling (sched_advance): the token
// this sequence sampled in the step before, not known when the plan was
// made. The runner takes it from that step's output (matched by seq_id);
// it appears only as the single token of an entry whose sequence sampled in
// the previous step. Penalty histories never hold it (sched_can_run_ahead).
#define PG_TOKEN_PENDING (-1)

// One sequence scheduled in a step: a prefill chunk or one decode token.
typedef struct pg_plan_seq {
    int64_t seq_id;
    const int32_t *tokens;     // [n_tokens] token ids to run this step
    int32_t n_tokens;
    int32_t start_pos;         // position of tokens[0] (= computed tokens)
    const int32_t *block_table;// [n_blocks][plan kv_groups] KV block ids covering
    int32_t n_blocks;          //   positions [0, start_pos + n_tokens): group g's
                               //   block for positions [i bs, (i + 1) bs) at
                               //   [i * kv_groups + g]; 0 where a windowed group
                               //   dropped it (before every query's window)
    bool sample;               // sample a token after the last position
    // For sampling (valid when sample): the parameters, the whole token
    // history (prompt then output) for penalties, and how many tokens this
    // sequence has sampled so far (the seeded RNG's counter).
    const pg_sampling_params *sp;
    const int32_t *history;    // [n_history]
    int32_t n_history;
    int32_t n_prompt;          // history[0..n_prompt) is the prompt
    int32_t n_generated;
    uint64_t rng_seed;         // per-sequence seed (request seed, or random)
    bool mask_eos;             // min_tokens not reached: EOS/stop ids banned
    int32_t eos_id;            // -1 when none
    // Prompt logprobs (sp->want_prompt_logprobs): rows [0, n_prompt_lp) of
    // this entry are scored; row t (position start_pos + t) at the prompt
    // token history[start_pos + t + 1]. 0 = none (also past the prompt).
    // history, n_history and sp are valid whenever n_prompt_lp > 0.
    int32_t n_prompt_lp;
    // The tokens this sample may take (valid when sample): bit t & 31 of
    // word t >> 5, plan->mask_words words (tokens past them are not
    // allowed); NULL: any. An entry with drafts has n_draft + 1 masks one
    // after another, row t's (after the first t drafts) at t * mask_words. The engine sets it (sched_set_masks) from a
    // grammar, allowed_token_ids and bad_words after sched_step, so the
    // plan alone carries it to every rank and node, as vLLM's scheduler
    // output carries the grammar bitmask.
    const uint32_t *mask;
    // The LoRA adapter of this sequence's rows (docs/lora.md): 0 = the base
    // model, i = the runner's adapter slot i - 1 (sched_request.lora_id).
    int32_t lora_id;
    // Speculative decoding: tokens[n_tokens - n_draft .. n_tokens) are
    // draft tokens proposed after tokens[n_tokens - n_draft - 1] (the
    // sequence's last token); sample is set. The runner samples each of the
    // last n_draft + 1 rows as plain decoding would at its position (row t:
    // seed counter n_generated + t, penalty history extended by the first t
    // drafts), keeps the longest prefix of the drafts that matches them plus
    // the next row's token (pg_spec_verify_greedy) and returns those tokens
    // in the entry's output (pg_seq_output.spec_tokens). 0 = a plain entry.
    int32_t n_draft;
} pg_plan_seq;

// A block move: from -> to (device<->host swaps, or device copy for COW).
typedef struct {
    int32_t from, to;
} pg_block_move;

// A runner's check of a plan's moves: every `from` in [0, n_from) and every
// `to` in [0, n_to); else PG_EINVAL naming `what` ("swap-out", "copy", ...).
int pg_block_moves_check(const pg_block_move *mv, int32_t n, int32_t n_from, int32_t n_to,
                         const char *what);

typedef struct pg_batch_plan {
    int32_t n_seqs;
    pg_plan_seq *seqs;         // [n_seqs]
    int32_t n_tokens;          // sum of seqs[i].n_tokens
    // Moves to perform before the forward, in this order: swap-out
    // (device -> host), swap-in (host -> device), copies (device -> device).
    int32_t n_swap_out, n_swap_in, n_copies;
    // The last n_swap_out_ahead swap-outs are the host tier's copies ahead
    // of eviction (kvpool.h, kvp_take_tier_moves): nothing of this plan
    // writes their device or host blocks, so they may run at any time
    // after the earlier plans' work and before the next plan's moves.
    int32_t n_swap_out_ahead;
    const pg_block_move *swap_out;
    const pg_block_move *swap_in;
    const pg_block_move *copies;
    int32_t mask_words;        // uint32 words of each seqs[i].mask (0 when none has one)
    // KV layer groups (kvpool/kvpool.h): block tables per sequence, 0 or 1
    // for one; the runner's layout must have as many.
    int32_t kv_groups;
} pg_batch_plan;

// What the runner returns for each sequence with sample = true.
typedef struct pg_seq_output {
    int64_t seq_id;
    int32_t token;
    float logprob;             // log-softmax of the sampled token (raw logits)
    int32_t n_top;             // sp->logprobs entries when requested
    int32_t top_ids[PG_MAX_LOGPROBS];
    float top_logprobs[PG_MAX_LOGPROBS];
    // An entry with drafts (pg_plan_seq.n_draft > 0): the drafts kept
    // (n_accepted) and the tokens emitted, spec_tokens[0 .. n_accepted]
    // (the kept drafts then the target's own), with their log-softmax;
    // token and logprob are spec_tokens[0] and spec_logprobs[0]. A plain
    // entry has n_draft 0 and uses token alone.
    int32_t n_draft;
    int32_t n_accepted;
    int32_t spec_tokens[PG_MAX_DRAFT + 1];
    float spec_logprobs[PG_MAX_DRAFT + 1];
    // The same tokens each as a plain output (token, logprob, top entries
    // of its own row), [n_accepted + 1], in the runner's memory, valid as
    // long as this output; NULL for a plain entry.
    const struct pg_seq_output *spec_rows;
} pg_seq_output;

// One scored prompt position (pg_plan_seq.n_prompt_lp).
typedef struct pg_prompt_logprob {
    int64_t seq_id;
    int32_t pos;               // the prompt position scored (>= 1): the logits at pos - 1
    int32_t token;             // the prompt token at pos
    float logprob;             // its log-softmax (raw logits)
    int32_t rank;              // 1 + the tokens with a greater logit (vLLM's rank)
    int32_t n_top;             // sp->prompt_logprobs entries, most likely first
    int32_t top_ids[PG_MAX_LOGPROBS];
    float top_logprobs[PG_MAX_LOGPROBS];
} pg_prompt_logprob;

typedef struct pg_step_output {
    int32_t n;
    pg_seq_output *outs;       // [n], in plan order of the sampled sequences
    int32_t n_prompt_lp;       // scored prompt positions, plan order then position
    const pg_prompt_logprob *prompt_lp; // [n_prompt_lp]; the scheduler ignores them
} pg_step_output;
