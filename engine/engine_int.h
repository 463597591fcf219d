// engine/engine_int.h - the engine's state, shared by engine.c (the engine
// thread and its queues) and setup.c (device choice, model, KV sizing, the
// memory log). Internal.
#pragma once
#include <pthread.h>
#include <stdbool.h>

#include "engine/engine.h"
#include "engine/dist/executor.h"
#include "engine/runner/runner.h"

// A submission: a new request, an abort or an early finish of one sequence.
typedef enum { SUB_ADD, SUB_ABORT, SUB_FINISH_SEQ, SUB_LORA } sub_kind;

// A LoRA load or unload (engine/engine_lora.c), waited for by its caller.
typedef struct lora_cmd {
    const char *name, *path; // path NULL: unload
    int rc;                  // the outcome, with err, once done
    char err[400];
    bool done;               // guarded by pg_engine.mu
} lora_cmd;

// What a LoRA slot holds (guarded by pg_engine.lora_mu): uid 0 when empty.
typedef struct eng_lora {
    int64_t uid;
    char *name, *path;
} eng_lora;

// What a request carries beyond the scheduler's view (engine/engine_masks.c):
// its logit_bias arrays (the scheduler's sp points at them), its grammar
// and one matcher per sequence, and its allowed-token mask.
typedef struct req_masks {
    int32_t *bias_ids;
    float *bias_values;
    struct pg_grammar *grammar;   // a reference, or NULL
    struct pg_matcher **m;        // [n] created on first use
    int32_t n;
    uint32_t *allowed;            // [words] or NULL
    int32_t n_bad;                // bad_words sequences (engine.h)
    int32_t *bad_off;             // [n_bad + 1]
    int32_t *bad_ids;
} req_masks;

typedef struct sub {
    sub_kind kind;
    int64_t id;
    int32_t seq_index;
    pg_gen_request req;   // SUB_ADD: prompt points to memory owned by the sub
    req_masks *x;         // SUB_ADD: owned, NULL when the request has none
    int64_t held_ns;      // SUB_ADD: when it was first held for its grammar (0: not held)
    bool lora_wait;       // SUB_ADD: held until a LoRA slot can take its adapter
    bool aborted;         // SUB_ADD held for a slot: its abort came meanwhile
    lora_cmd *lora;       // SUB_LORA: the caller's
    struct sub *next;
} sub;

// Per live request on the engine side: what it carries beyond the
// scheduler's view. engine.c allocates one at admission and hands it to the
// scheduler as the request's owner (sched_request.owner), which keeps it
// with the request and returns it in every event (sched_event.owner) and by
// id (sched_request_owner): the scheduler's id map is the only one. Freed
// by engine.c with the request's last event (req_finished), or at stop.
typedef struct live {
    int64_t id;
    void *user;           // the submitter's (pg_gen_request.user), into every pg_gen_event
    req_masks *x;         // owned, may be NULL
    // Prompt logprobs (engine/engine_prompt_logprobs.c): [n_prompt] by
    // position as the steps score them, until handed to the first event
    // with a token; NULL when not asked for or handed over.
    pg_prompt_logprob *plp;
    int32_t n_prompt;
    int32_t lora_slot;    // its adapter's slot, -1: the base model (an unload waits for none)
} live;

struct pg_engine {
    pg_engine_config cfg;
    pg_executor *exec;           // every rank's backend, model shard and runner
    struct pg_draft *draft;      // speculative decoding's draft model (engine/draft_model.h), or NULL
    pg_backend *backend;         // rank 0's (borrowed from exec)
    const pg_model *model;       // rank 0's shard: the config, the format (borrowed)
    pg_tokenizer *tok;
    pg_chat_template *chat;
    sched *sched;
    bool async;                  // plan step N + 1 while step N runs (sched.h, async scheduling)
    int32_t max_model_len;
    int32_t kv_blocks;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    sub *subs_head, *subs_tail;  // guarded by mu
    // Requests whose grammar is still precomputing its masks (engine thread
    // only): admitted when it is done, as vLLM holds a request until its
    // grammar is compiled, so the first tokens do not pay for cold masks.
    sub *held;
    bool held_wake;              // guarded by mu: a held request's grammar is done (its hook ran)
    int64_t next_id;             // guarded by mu

    // Events published by the engine thread, drained by pg_engine_poll.
    pthread_mutex_t ev_mu;
    pg_gen_event *events;
    int n_events, cap_events, ev_head;
    pg_engine_notify_fn notify;
    void *notify_ctx;

    uint32_t *mask_buf;          // [cap_masks * mask_words] this step's token masks, a row per
                                 //   sampled position (a draft's n_draft + 1 one after another)
    const uint32_t **mask_ptr;   // [cap_masks] by plan sequence: its first row
    int32_t cap_masks, mask_words;
    int32_t *mask_hist;          // [cap_mask_hist] a draft's output and drafts (bad words)
    int32_t cap_mask_hist;

    // Health, read by pg_engine_health_get (the server's watchdog).
    _Atomic int64_t busy_since_ns; // when the oldest unfinished step began (0: none)
    bool failed;                   // guarded by stats_mu: a step failed
    char fail_reason[200];         // guarded by stats_mu

    // Fault injection (PAGED_FAULT_INJECT, for tests): at the fault_step-th
    // step with work the engine thread stalls for fault_seconds or fails it.
    enum { FAULT_NONE, FAULT_STALL, FAULT_FAIL } fault;
    int64_t fault_step, steps_with_work;
    double fault_seconds;

    // LoRA slots (engine/engine_lora.c): their adapters, by slot.
    pthread_mutex_t lora_mu;
    pthread_cond_t lora_cv;      // with mu: a lora_cmd is done
    eng_lora *lora;              // [n_lora_slots]
    int32_t n_lora_slots;
    int64_t lora_next_uid;
    int64_t *lora_used_ns;       // [n_lora_slots] the last admission that used each slot (LRU)
    eng_lora *lora_parked;       // [lora_known_cap] adapters known but in no slot
    int32_t n_lora_parked, lora_known_cap;

    pthread_mutex_t stats_mu;
    pg_engine_stats stats;
    int64_t mem_polled_ns; // engine thread: when device memory was last read
    int64_t last_end_ns;   // engine thread: when the last step was finished (busy time)
};

// setup.c: everything pg_engine_create does before the thread starts.
int eng_setup(pg_engine *e);
// setup.c: device memory into e->stats (engine thread or set-up).
void eng_stats_memory(pg_engine *e); // every rank's memory as of the last pg_executor_mem_refresh

// --- token masks (engine/engine_masks.c) ----------------------------------------

// The copies a submission keeps (logit_bias, grammar reference, allowed ids,
// with req->sp's bias pointers moved to them); NULL when it needs none.
req_masks *eng_masks_from_request(const pg_engine *e, pg_gen_request *req);
void eng_masks_free(req_masks *x);
// The live entry of a request id (its scheduler owner), or NULL once the
// scheduler has ended it (sched_request_owner).
live *eng_live_find(pg_engine *e, int64_t id);
// Fills the runner's masks for the plan's constrained sequences.
void eng_masks_fill(pg_engine *e, const pg_batch_plan *plan);
// Advances the matchers by a resolved step's tokens, read from its events
// (the owner of each: requests that finished in the step are already gone
// from the scheduler's map); a sequence whose grammar is complete is
// finished (finish_reason "stop").
void eng_masks_advance(pg_engine *e, const sched_events *evs);

// --- prompt logprobs (engine/engine_prompt_logprobs.c) --------------------------

// A new live request: its accumulator when req asks for prompt logprobs.
void eng_plp_start(live *l, const pg_gen_request *req);
// A step's scored prompt positions into their requests' accumulators;
// before sched_resolve, which ends (and forgets) the requests that finish
// in the step.
void eng_plp_store(pg_engine *e, const pg_step_output *out);
// Hands l's prompt logprobs (l: the event's owner) to its first event with a token.
void eng_plp_attach(live *l, pg_gen_event *g);

// --- LoRA adapters (engine/engine_lora.c) ---------------------------------------

// The slots after set-up: the adapters of --lora-modules in slots 0..n-1.
void eng_lora_init(pg_engine *e);
void eng_lora_free(pg_engine *e);
// Engine thread: a load or unload between steps; marks it done.
void eng_lora_apply(pg_engine *e, lora_cmd *c);

// Engine thread: the slot of adapter id `uid` (0: the base model: -1), -3
// when it is known but in no slot (eng_lora_make_resident), or -2 when it is
// not known any more (unloaded).
int32_t eng_lora_slot(pg_engine *e, int64_t uid);
// Engine thread, at admission, for an adapter eng_lora_slot found parked
// (-3): loads it into a free slot or the least recently used idle one and
// sets *slot; *slot -1 when every slot serves live requests (the request
// waits); < 0 when the load failed.
int eng_lora_make_resident(pg_engine *e, int64_t uid, int32_t *slot);
// After set-up: the adapters named beyond the slots are read once, so a bad
// directory is refused at start naming its file.
int eng_lora_check(pg_engine *e);

// Appends a submission to the engine thread's queue and wakes it (e->mu
// held): engine.c's requests and engine_lora.c's LoRA commands.
static inline void eng_enqueue_locked(pg_engine *e, sub *s) {
    if (e->subs_tail)
        e->subs_tail->next = s;
    else
        e->subs_head = s;
    e->subs_tail = s;
    pthread_cond_signal(&e->cv);
}
