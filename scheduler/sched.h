// scheduler/sched.h - continuous-batching scheduler (vLLM v1 style).
//
// The engine thread drives it:
//
//     sched_add_request / sched_abort / sched_finish_seq   (any time)
//     sched_step(s, &plan)          -> pg_batch_plan for the runner
//     runner executes plan          -> pg_step_output
//     sched_update(s, &out, &ev)    -> per-sequence token / finish events
//
// or, to plan a step while the previous one runs, sched_update split into
// sched_advance and sched_resolve (async scheduling, below).
//
// Speculative decoding (sched_spec_config, scheduler/sched_spec.c): a
// decoding sequence (any sampling, any n: each choice from its own
// history) whose caller proposes k tokens is planned as a
// chunk of 1 + k tokens (its last token, then the drafts) with
// pg_plan_seq.n_draft = k; its output carries the tokens the runner's
// verification kept (1 .. k + 1), appended here one by one under the stop
// rules, one event each; the slots of rejected drafts go back to the pool.
//
// Model: a request has n sequences (parallel sampling). Each sequence has a
// token history (prompt then output) and a count of computed tokens (KV
// written). There are no prefill/decode phases: every step spends a token
// budget (max_num_batched_tokens) and a sequence cap (max_num_seqs) on the
// running requests first (in priority order), then on swapped requests
// (swap-in), then on waiting ones; a sequence gets as many tokens as
// remain to compute, or a chunk (chunked prefill). A chunk that does not
// reach the end of the history does not sample.
//
// Parallel sampling: the request's first live sequence (the lead) computes
// the prompt but its last token; then the request forks: every live
// sequence shares the lead's blocks, computes the last prompt token itself
// and samples with its own seed (request seed + index). The shared partial
// block is copied on write.
//
// Preemption: when a running request cannot get blocks, the running request
// with the largest (priority, arrival) key is preempted - by recompute
// (blocks dropped; history = prompt + output is recomputed later, generation
// then continues where it stopped) or by swap (blocks copied to host). A
// swapped request returns before any waiting request is admitted; no request
// is admitted or swapped in during a step that preempted.
//
// Ids: seq_id = request id * SCHED_MAX_N + sequence index.
//
// Not thread-safe: every call from one thread (the engine loop).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "kvpool/kvpool.h"
#include "scheduler/plan.h"

#define SCHED_MAX_N      256 // sequences per request (seq_id encoding)
// long_prefill_token_threshold's default: a quarter of the step budget,
// rounded down to whole blocks (at least one block).
#define SCHED_LONG_PREFILL_AUTO (-1)
#define SCHED_MAX_REQ_ID ((int64_t)1 << 54)

typedef struct sched sched;

typedef enum sched_policy {
    SCHED_POLICY_FCFS = 0,     // by arrival time
    SCHED_POLICY_PRIORITY = 1, // by (priority, arrival); lower priority value first
} sched_policy;

typedef enum sched_preempt_mode {
    SCHED_PREEMPT_RECOMPUTE = 0, // drop the blocks, recompute later (default)
    SCHED_PREEMPT_SWAP = 1,      // copy the blocks to host; recompute when host is full
} sched_preempt_mode;

// Speculative decoding (docs/speculative_decoding.md). The scheduler plans
// drafts and keeps what their verification accepted; the guess itself comes
// from the caller (the engine's n-gram proposer), through `propose`, so the
// scheduler stays below the engine: propose(ctx, history, n, limit, out)
// writes up to min(num_tokens, limit) tokens to follow history[0 .. n) to
// out (room for num_tokens) and returns how many (0: no guess).
typedef int32_t (*sched_propose_fn)(void *ctx, const int32_t *history, int32_t n, int32_t limit,
                                    int32_t *out);

// The batched form (a draft model proposes for every sequence in one pass):
// each item is one sequence's history[0 .. n), the tokens it may take
// (limit >= 1) and where they go (out, room for limit); the callee sets
// got (0 .. limit; 0: no guess, a plain decode). When propose_batch is set
// the scheduler plans each speculating sequence with `limit` drafts
// provisionally, calls it once per sched_step after the planning loop with
// every such sequence, and trims each plan entry by limit - got (tokens,
// rows and KV slots back); propose is then not called.
typedef struct sched_propose_item {
    const int32_t *history;
    int32_t n;
    int32_t limit;
    int32_t *out;
    int32_t got;
    int32_t n_prompt; // history[0 .. n_prompt) is the prompt (0: not said): the
                      //   replay draft matches requests by it (engine/draft_replay.h)
} sched_propose_item;
typedef void (*sched_propose_batch_fn)(void *ctx, sched_propose_item *items, int32_t n_items);

// Backoff: no speculation while more sequences than this run (the step is
// then compute-bound and checking drafts costs what it saves).
#define SCHED_SPEC_DEFAULT_MAX_SEQS 8

typedef struct sched_spec_config {
    int32_t num_tokens;       // drafts per step at most, 1 .. PG_MAX_DRAFT; 0 = off
    int32_t max_running_seqs; // backoff (above); 0 = SCHED_SPEC_DEFAULT_MAX_SEQS
    // Adaptive draft length (sched_spec.c spec_note_result): each sequence
    // asks for about as many tokens as its drafts have been accepting, plus
    // one, within 1 .. num_tokens. true: always num_tokens (the old rule).
    bool fixed_length;
    sched_propose_fn propose; // required when num_tokens > 0, unless propose_batch is set
    sched_propose_batch_fn propose_batch; // NULL: per sequence (propose)
    void *ctx;                // of either
} sched_spec_config;

typedef struct sched_config {
    int32_t num_blocks;                   // device KV blocks incl. the null block 0
    int32_t num_host_blocks;              // host swap blocks (0 = none)
    int32_t block_size;                   // tokens per block (16)
    bool enable_prefix_caching;           // true
    bool enable_host_kv_cache;            // false; host tier: evicted prefix blocks kept in host blocks
    bool host_kv_reused_only;             // false; the tier keeps only blocks hit since cached
    bool host_kv_ahead;                   // false; the tier copies blocks ahead of eviction (kvp_config.host_tier_ahead)
    int32_t max_num_batched_tokens;       // token budget per step (2048)
    int32_t max_num_seqs;                 // sequences per step, and live sequences running (256)
    int32_t max_model_len;                // prompt + max_tokens limit (required, > 0)
    bool enable_chunked_prefill;          // true; off: a sequence's pending tokens go in one step
    int32_t long_prefill_token_threshold; // per-request prefill cap per step, see below
    sched_policy policy;                  // FCFS
    sched_preempt_mode preemption_mode;   // RECOMPUTE
    int32_t max_waiting;                  // waiting + swapped requests admitted (0 = unlimited)
    uint64_t seed;                        // seeds requests that bring none
    int64_t (*now_ns)(void *ctx);         // clock for timestamps (NULL = pg_now_ns)
    void *now_ctx;
    sched_spec_config spec;               // speculative decoding (off)
    // KV layer groups (kvpool/kvpool.h, docs/kv_layer_groups.md): block
    // tables per sequence (0 or 1: one) and each group's window in
    // positions (0: every earlier key). A windowed group's blocks that no
    // query will see again are freed before each step is planned.
    int32_t kv_groups;
    int32_t kv_group_window[KVP_MAX_GROUPS];
} sched_config;

// A request as submitted. Everything is copied.
typedef struct sched_request {
    int64_t id;                   // caller's, unique among live requests, [0, 2^54)
    const int32_t *prompt;        // [n_prompt] token ids
    int32_t n_prompt;             // >= 1
    const pg_sampling_params *sp; // n, max_tokens, min_tokens, stop ids, seed, ...
    int32_t priority;             // lower = served first (priority policy only)
    int64_t arrival_ns;           // same clock as sched_config.now_ns
    int32_t eos_id;               // -1 when none
    // The caller's per-request data (the engine's: its masks, prompt
    // logprobs and the submitter's pointer), kept with the request and
    // handed back in its events, by sched_request_owner and by
    // sched_for_each_owner; never read or freed here. NULL: none.
    void *owner;
    // The LoRA adapter slot the request runs with (0: the base model; slot
    // i + 1), handed to the runner in its plan entries (pg_plan_seq.lora_id).
    int32_t lora_id;
    // Mixed into the request's prefix-cache hashes (kvp_table_set_salt; 0:
    // none): the engine gives each adapter loaded its own, so no adapter
    // reuses another's KV, even one that held the same slot before.
    uint64_t cache_salt;
} sched_request;

typedef enum sched_finish_reason {
    SCHED_FINISH_NONE = 0, // still running
    SCHED_FINISH_STOP,     // EOS, a stop token id, or sched_finish_seq (stop string)
    SCHED_FINISH_LENGTH,   // max_tokens or max_model_len reached
    SCHED_FINISH_ABORT,    // sched_abort (client gone)
    SCHED_FINISH_ERROR,    // the step failed (sched_update with no output)
} sched_finish_reason;

// The OpenAI finish_reason of a finished sequence ("stop", "length",
// "abort", "error"); NULL for SCHED_FINISH_NONE.
const char *sched_finish_name(sched_finish_reason r);

// Per request counts and times, final in the event with req_finished.
typedef struct sched_usage {
    int32_t prompt_tokens;
    int32_t completion_tokens; // over all sequences
    int32_t cached_tokens;     // prompt tokens found in the prefix cache at first admission
    int32_t n_preemptions;
    int64_t arrival_ns;
    int64_t first_scheduled_ns; // 0 = never scheduled
    int64_t first_token_ns;     // 0 = no token yet
    int64_t finish_ns;          // 0 = running
} sched_usage;

// One event: a sequence got a token and/or finished.
typedef struct sched_event {
    int64_t req_id;
    void *owner;                // the request's sched_request.owner (also in its last event)
    int32_t seq_index;          // 0 .. n-1
    bool has_token;             // `out` holds a new token (token, logprob, top logprobs)
    pg_seq_output out;          // copy of the runner's output for this sequence
    int32_t n_generated;        // output tokens of this sequence so far
    sched_finish_reason finish; // NONE while the sequence runs
    int32_t stop_token;         // EOS / stop id that finished it (token included above), or -1
    bool req_finished;          // last event of the request: usage is final
    sched_usage usage;          // the request's usage so far
} sched_event;

// Events of one sched_update, grouped by request, sequence index ascending.
// The array is owned by the scheduler and valid until the next sched_update.
typedef struct sched_events {
    int32_t n;
    const sched_event *ev; // [n]
} sched_events;

typedef struct sched_stats {
    int32_t n_running, n_waiting, n_swapped; // requests
    int32_t n_running_seqs;                  // live sequences of running requests
    int64_t n_steps;
    int64_t n_admitted, n_rejected, n_finished, n_aborted;
    int64_t n_preempt_recompute, n_preempt_swap;
    int64_t n_swap_out_blocks, n_swap_in_blocks, n_cow_copies;
    kvp_stats kv; // device/host usage, prefix hits
    // Speculative decoding (vLLM's spec_decode counters): verified drafts,
    // their tokens, the tokens accepted, and acceptances by draft position.
    int64_t n_spec_drafts, n_spec_draft_tokens, n_spec_accepted;
    int64_t n_spec_accepted_pos[PG_MAX_DRAFT];
    // LoRA slots in use (vLLM's lora_requests_info): bit i set when a
    // running (resp. waiting or swapped) request has lora_id i + 1. Slots
    // past 64 are not reported.
    uint64_t lora_running_mask, lora_waiting_mask;
} sched_stats;

// Long prompts and fairness (vLLM's long_prefill_token_threshold): while
// any other request is live (running, waiting or swapped), one sequence
// gets at most long_prefill_token_threshold prefill tokens per step, so
// the rest of the budget serves running decodes and short prompts every
// step instead of after the whole prefill. Alone, a prompt takes the whole
// budget. > 0: that many tokens; 0: no cap; SCHED_LONG_PREFILL_AUTO (the
// default): max_num_batched_tokens / 4 in whole blocks, at least a block.
// Aborts take effect between steps, so the step budget bounds how long a
// client that left keeps a prefill running: size max_num_batched_tokens so
// one step stays short on the device (docs/scheduler.md: on the CPU a
// step of a few hundred milliseconds, e.g. 256 tokens for the default
// model on 2 cores, not the GPU's 2048).
//
// Defaults (vLLM's where they exist): block_size 16, prefix caching on,
// 2048 batched tokens, 256 seqs, chunked prefill on, FCFS, recompute,
// long prefill cap auto (512 of 2048).
// num_blocks and max_model_len are left 0: the caller sets them.
void sched_config_default(sched_config *c);
// The numbers of those defaults, for what else states them (the engine's
// fallback block size, its --help).
#define SCHED_DEFAULT_BLOCK_SIZE 16
#define SCHED_DEFAULT_MAX_NUM_BATCHED_TOKENS 2048
#define SCHED_DEFAULT_MAX_NUM_SEQS 256

// Creates a scheduler and its block pool. PG_EINVAL on a bad config.
int sched_create(const sched_config *cfg, sched **out);

// Frees everything, live requests included (no events), but not their
// owners (sched_for_each_owner first).
void sched_destroy(sched *s);

// Admits a request to the waiting queue. Returns 0, or a negative code with
// the reason in pg_err_msg(): PG_EINVAL for a request that can never run
// (bad parameters, prompt + max_tokens beyond max_model_len, more KV blocks
// than the whole pool, a prompt that does not fit one step with chunked
// prefill off, a duplicate id), PG_ENOSPC when the queue is full
// (max_waiting).
int sched_add_request(sched *s, const sched_request *req);

// Aborts request `id` wherever it is. Its blocks return to the pool now, or
// - if it is in the plan in flight - at the next sched_update (which drops
// its output). Its finish events (ABORT) come with the next sched_update.
// PG_ENOTFOUND if no live request has this id (already finished: harmless).
int sched_abort(sched *s, int64_t id);

// Finishes one sequence of a request early with `reason` (a stop string
// matched: SCHED_FINISH_STOP), same timing rules as sched_abort. The request
// finishes when its last sequence does. PG_ENOTFOUND / PG_EINVAL on unknown
// request or index, or an already finished sequence.
int sched_finish_seq(sched *s, int64_t id, int32_t seq_index, sched_finish_reason reason);

// Plans the next step. *plan is owned by the scheduler, valid until
// sched_update; it may have n_seqs 0 (still pass it to sched_update: the
// runner may be skipped, with an empty output). PG_EINVAL if the previous
// plan was not updated.
int sched_step(sched *s, const pg_batch_plan **plan);

// The token masks of the plan just made (before the runner begins it):
// masks[i] for plan->seqs[i] (NULL: none; ignored where the entry does not
// sample), `words` uint32 words each. The plan carries them to the runner
// (pg_plan_seq.mask, pg_batch_plan.mask_words); the caller owns them, and
// they must stay valid until the runner has begun the step. The engine
// computes them from the tokens resolved so far (a constrained request
// never runs ahead: sched_can_run_ahead). PG_EINVAL without a plan in
// flight.
int sched_set_masks(sched *s, const uint32_t *const *masks, int32_t words);

// Consumes the runner's output for the plan in flight: advances computed
// tokens, appends sampled tokens, applies stop rules, frees finished
// requests, and returns this step's events (and those of aborts since the
// last update) in *ev. `out` NULL means the step failed: every request in
// the plan finishes with SCHED_FINISH_ERROR. An output that does not match
// the plan (count or seq ids) is treated the same and returns PG_EINVAL;
// the scheduler stays consistent either way. Same as sched_advance then
// sched_resolve.
int sched_update(sched *s, const pg_step_output *out, sched_events *ev);

// Async scheduling (vLLM v1's): the engine plans step N+1 while the device
// still runs step N. The loop is
//
//     sched_step(N) -> runner begins N -> sched_advance
//     sched_step(N+1) -> runner begins N+1 -> runner ends N
//       -> sched_resolve(N) -> sched_advance -> sched_step(N+2) ...
//
// sched_advance: the runner has taken the plan in flight (it reads none of
// its memory after this). Computed tokens advance; each sampled sequence
// gets PG_TOKEN_PENDING as its newest history token, which the next plan
// passes to the runner as that sequence's decode input (the runner takes
// it from this step's output); a sequence whose token reaches max_tokens or
// max_model_len is not scheduled again. Ends the plan's in-flight state
// (aborts and finishes asked for while in flight take effect; their
// events wait for sched_resolve). PG_EINVAL without a plan in flight or
// with an advanced step not yet resolved.
int sched_advance(sched *s);

// The output of the advanced step (NULL: it failed): fills in the tokens,
// applies the stop rules, offers the written blocks to the prefix cache and
// returns the events, as sched_update does. A sequence that stops here
// while it is in the next plan ends now (blocks back to the pool: the
// device runs steps in order, so their next owner writes after that step);
// that plan's entry for it is ignored and its output dropped. A failed
// step ends its requests with SCHED_FINISH_ERROR (also those in the next
// plan). The checks and return value are sched_update's.
int sched_resolve(sched *s, const pg_step_output *out, sched_events *ev);

// Whether the next plan may be made before sched_resolve: false when a
// sequence awaiting its token samples with a repetition, presence or
// frequency penalty (the runner reads the history, which lacks that token),
// is constrained (its token mask follows from that token) or would propose
// a draft (the proposal starts from that token), then the engine resolves
// first. True with nothing advanced.
bool sched_can_run_ahead(const sched *s);

// The owner of live request `id` (sched_request.owner), or NULL when no
// request has this id or it has finished: once its last event
// (req_finished) is out, even while a plan still holds it, and once an
// abort or early finish has ended it (at once, or at sched_advance when it
// is in flight), its events still to come carrying the owner. O(1).
void *sched_request_owner(const sched *s, int64_t id);

// Calls fn(owner, ctx) once for every request whose last event has not been
// handed out: the live requests, and those ended by sched_abort or
// sched_finish_seq whose final event waits for the next sched_update. For
// the caller to free what it owns before sched_destroy (which hands out
// no events). fn must not call the scheduler.
void sched_for_each_owner(sched *s, void (*fn)(void *owner, void *ctx), void *ctx);

// Whether a step would do anything: live requests or undelivered events.
bool sched_has_work(const sched *s);

void sched_stats_get(const sched *s, sched_stats *out);

// The block pool (read-only use: stats, tests).
const kvp_pool *sched_pool(const sched *s);

// Verifies every invariant: each block's ref count equals the tables that
// hold it, free lists and prefix-cache map are consistent, queues and
// request states agree, running sequences within max_num_seqs. 0 or
// PG_EINVAL with the first violation. O(blocks + requests); for tests.
int sched_check(const sched *s);
