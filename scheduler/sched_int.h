// scheduler/sched_int.h - the scheduler's state, shared by sched.c
// (planning, the public API), sched_req.c (the containers, the end of
// sequences and requests), sched_update.c (a step's results) and
// sched_spec.c (speculative decoding: drafts in the plan, their
// verification's tokens back). Internal.
#pragma once
#include "common/clock.h"
#include "common/err.h"
#include "scheduler/sched.h"

typedef enum { RQ_WAITING, RQ_RUNNING, RQ_SWAPPED, RQ_FINISHED } rq_state;

struct req;

typedef struct seq {
    struct req *rq;     // its request
    int32_t index;      // in the request, 0..n-1
    int64_t seq_id;     // request id * SCHED_MAX_N + index
    int32_t *hist;      // [hist_cap] prompt then output; grows only in
    int32_t n_hist;     //   sched_update, when no plan points into it
    int32_t hist_cap;   //   (<= n_prompt + max_tokens)
    int32_t n_computed; // positions with KV written (table.n_tokens outside a step)
    int32_t n_sched;    // tokens in the plan in flight
    uint64_t rng_seed;
    kvp_table table;
    sched_finish_reason finish;  // NONE while live
    sched_finish_reason pending; // finish asked for while in flight
    bool unres;                  // hist[n_hist - 1] is PG_TOKEN_PENDING (advanced, not resolved)
    bool stopping;               // that token reaches a length limit: not scheduled again
    int32_t stop_token;
    bool ev_end;                 // ended since its request's events were last emitted
    const pg_seq_output *ev_out; // token sampled in this update, or NULL
    int32_t ev_ntok;             // tokens of ev_out to emit (> 1: a verified draft)
    // Speculative decoding (sched_spec.c): draft[0] is the last token and
    // draft[1 .. n_draft] the proposal, the plan entry's tokens; n_draft is
    // that of the plan in flight, spec_held that of the advanced step
    // (its slots are in the table, not yet in n_computed, until resolved).
    int32_t *draft;              // [PG_MAX_DRAFT + 1], allocated on first use
    int32_t n_draft;
    int32_t spec_held;
    int32_t spec_misses;         // drafts in a row with nothing accepted
    int32_t spec_skip;           // steps left without proposing (after a miss)
    int32_t spec_len;            // draft length, in 1/16 tokens (0: none yet: k)
} seq;

typedef struct req {
    int64_t id;
    void *owner;        // sched_request.owner: the caller's, never read here
    pg_sampling_params sp;
    int32_t prio;       // key: priority (priority policy) or 0
    int64_t arrival_ns; // key
    uint64_t order;     // key: admission counter
    int32_t eos_id;     // -1 when none or ignore_eos
    int32_t lora_id;    // sched_request.lora_id (0: the base model)
    int32_t n_prompt;
    int32_t n;      // sequences
    int32_t n_live; // not finished
    int32_t lead;   // sequence computing the prompt before the fork
    bool forked;    // live sequences hold their own tables
    rq_state state;
    int32_t qpos;          // index in its heap or in running[]
    bool in_flight;        // has entries in the plan in flight
    bool abort_pending;    // aborted while in flight
    bool usage_cached_set; // cached_tokens recorded (first admission)
    sched_usage usage;
    seq seqs[]; // [n]
} req;

typedef struct rheap {
    req **v; // [n]
    int32_t n, cap;
} rheap;

typedef struct idmap {
    int64_t *keys; // [mask + 1]
    req **vals;    // [mask + 1], NULL = empty slot
    uint64_t mask;
    int32_t n;
} idmap;

typedef struct evbuf {
    sched_event *v; // [n]
    int32_t n, cap;
} evbuf;

typedef struct budget {
    int32_t tokens, seqs;
} budget;

struct sched {
    sched_config cfg;
    kvp_pool *pool;
    int32_t bs;
    int32_t prefill_cap;     // resolved long_prefill_token_threshold (0 = none)
    int32_t prefill_cap_now; // this step's: prefill_cap, or 0 when one request is live
    idmap ids;
    rheap waiting, swapped;
    req **run; // [n_run] running, sorted by key
    int32_t n_run, run_cap;
    int32_t running_seqs; // live sequences of running requests
    uint64_t order;       // next admission counter
    uint64_t rng;         // seeds for unseeded requests
    int64_t now;          // clock at the start of the current call
    // The plan in flight and its scratch.
    bool in_flight;
    bool preempted; // this step preempted someone
    pg_batch_plan plan;
    pg_plan_seq *pseqs; // [max_num_seqs]
    seq **pref;         // [max_num_seqs] plan entry -> sequence
    req **preq;         // [max_num_seqs] distinct requests, plan order
    int32_t n_preq;
    kvp_moves copies, swap_out, swap_in;
    pg_block_move *mv; // [mv_cap] plan's moves: swap-out, swap-in, copies
    int32_t mv_cap;
    kvp_grow_item items[SCHED_MAX_N];
    seq *iseq[SCHED_MAX_N]; // items[i] belongs to iseq[i]
    kvp_table *tabs[SCHED_MAX_N];
    // The advanced step (sched_advance) whose tokens sched_resolve fills in:
    // sampled sequences in plan order and the plan's requests, by id (a
    // request may be aborted and freed in between).
    bool advanced;
    int64_t *ures_seq, *ures_req; // [max_num_seqs] each
    int32_t n_ures_seq, n_ures_req;
    // Events.
    evbuf ev, pending;
    req **dead; // [n_dead] finished during sched_update, freed at its end
    int32_t n_dead, dead_cap;
    sched_stats st; // counters (the queue sizes are filled on demand)
    int32_t spec_rows; // this step's sampled rows left for drafts (sched_spec.c)
    sched_propose_item *spec_items; // [max_num_seqs] propose_batch's items (sched_spec.c)
    int32_t *spec_entry;            // [max_num_seqs] their plan entries
};

// --- small helpers (every file) ----------------------------------------------

static inline int64_t sched_clock(const sched *s) {
    return s->cfg.now_ns ? s->cfg.now_ns(s->cfg.now_ctx) : pg_now_ns();
}

static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline void *grow_array(void *v, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return v;
    int32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    *cap = c;
    return pg_xrealloc(v, elem * (size_t)c);
}

// True when a is served before b.
static inline bool req_before(const req *a, const req *b) {
    if (a->prio != b->prio) return a->prio < b->prio;
    if (a->arrival_ns != b->arrival_ns) return a->arrival_ns < b->arrival_ns;
    return a->order < b->order;
}

// Index of the request's first live sequence (the prompt's owner before the fork).
static inline int32_t first_live(const req *r) {
    for (int32_t i = 0; i < r->n; i++)
        if (r->seqs[i].finish == SCHED_FINISH_NONE) return i;
    return -1;
}

// --- requests (sched_req.c) ---------------------------------------------------

// Containers (a request is in exactly one of them while live; sched.c).
void sched_heap_push(rheap *h, req *r);
void sched_heap_remove(rheap *h, req *r);
void sched_run_insert(sched *s, req *r);
req *sched_idmap_get(const idmap *m, int64_t id);
void sched_idmap_put(idmap *m, int64_t id, req *r);
// A request's end: its events, its unlink from container and map, its
// memory; sched_end_now ends one not in flight (abort / finish_seq).
void sched_emit_events(sched *s, evbuf *b, req *r);
void sched_req_unlink(sched *s, req *r, bool unlink_running);
void sched_req_free(sched *s, req *r);
void sched_end_now(sched *s, req *r, int32_t only_index, sched_finish_reason reason);
// A sampled token: its place in the history, the stop rules, the end of a
// sequence (sched_update.c and sched_spec.c too).
void sched_append_token(req *r, seq *q, int32_t tok);
sched_finish_reason sched_check_stop(const sched *s, const req *r, const seq *q, int32_t tok,
                                     int32_t *stop_token);
void sched_seq_end(sched *s, req *r, seq *q, sched_finish_reason reason, int32_t stop_token);

// --- speculative decoding (sched_spec.c) -------------------------------------

// At the start of a step: the sampled rows drafts may take this step.
void spec_step_begin(sched *s);
// The proposal for decoding sequence q of r (its last token not computed)
// under `left` tokens of budget, into q->draft; returns its length (0: a
// plain decode). Only eligible sequences (min_tokens reached; any n,
// each sequence from its own history) at small batches propose.
int32_t spec_propose(sched *s, req *r, seq *q, int32_t left);
// After the planning loop (propose_batch only): one call proposes for every
// plan entry holding a provisional draft, then each is trimmed to what
// came (its tokens, rows and KV slots beyond given back).
void spec_batch_fill(sched *s);
// A plan's items could not get blocks: drops their drafts (back to plain
// decodes) and returns whether any had one, so the caller retries before
// preempting anyone for a guess.
bool spec_drop(sched *s, int32_t n_items, int32_t *n_tok);
// Whether some sequence awaiting its token would propose next step (it
// needs the real token, so the engine resolves before planning).
bool spec_wants_token(const sched *s, const req *r);
// The advanced step's output o for q (its placeholder holds the first
// token): the emitted tokens in order, each checked by the stop rules as if
// one per step; the rejected drafts' slots go back to the pool. Counts.
void spec_resolve(sched *s, req *r, seq *q, const pg_seq_output *o);
