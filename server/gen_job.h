// server/gen_job.h - one HTTP generation request in flight: its engine
// submissions, per-choice detokenization and stop strings, and when the
// response (streamed or whole) goes out; server/api_format.h writes its JSON.
//
// A job submits one engine request per prompt (each with n sequences) and
// registers a gen_sub as that request's pg_gen_request.user. Engine events
// come back on the loop thread (gen_drain_events -> gen_on_event), in order
// per request, ending with one req_finished event per engine request.
//
// Ownership: the app owns live jobs. A job is freed when both (a) every
// engine request has delivered its final event and (b) it no longer holds
// the HTTP request (its response ended, or the client went away and the
// connection called on_abort, which aborts the engine requests). Nothing
// the engine may still name (the gen_sub pointers) is freed before (a).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "server/api_common.h"
#include "server/app.h"
#include "server/sbuf.h"
#include "server/stop_strings.h"

typedef struct gen_job gen_job;
typedef struct gen_sub gen_sub;

// One output sequence (an OpenAI "choice").
typedef struct gen_choice {
    int index;                 // choice index in the response: prompt * n + sequence
    gen_sub *sub;
    int32_t seq;               // sequence index within the engine request
    pg_detok detok;
    stop_matcher stop;
    sbuf text;                 // whole output (non-streamed responses)
    sbuf delta;                // output of the current event (streamed)
    pg_seq_output *lps;        // logprobs not yet emitted (all, when not streaming)
    int n_lps, cap_lps;
    int64_t fmt_offset;        // api_format's state (completions text_offset)
    int32_t n_tokens;          // tokens accepted into the output
    double cum_logprob;        // sum of the sampled tokens' logprobs (best_of ranks by it)
    bool finished;
    bool echo_sent;            // streamed completions: the echoed prompt's chunk went out
    const char *finish_reason; // "stop", "length", "abort", "error"
    int stop_string;           // index into params.stop that matched, or -1
    int32_t stop_token;        // EOS / stop token id that ended it, or -1
    int64_t first_token_ns, last_token_ns;
} gen_choice;

// One engine request: one prompt with n sequences.
struct gen_sub {
    gen_job *job;
    int index;                 // prompt index
    int64_t engine_id;
    bool live;                 // submitted, final event not yet received
    bool got_token;
    int32_t *ids;              // prompt token ids (owned)
    int32_t n_ids;
    char *text;                // prompt text for echo (owned, may be NULL)
    pg_sampling_params sp;
    sched_usage usage;         // final in the req_finished event
    // Prompt logprobs (sp.want_prompt_logprobs), from the engine's first
    // event with a token: plp[p] for positions 1 .. n_ids - 1 (owned).
    pg_prompt_logprob *plp;
};

struct gen_job {
    srv_app *app;
    srv_req *req;              // NULL once the response ended or the client left
    api_kind kind;             // the route, which picks the output's shape (server/api_format.h)
    api_params p;
    char id[64];
    int64_t created;           // unix seconds
    int64_t arrival_ns;
    gen_sub *subs;             // [n_subs]
    int n_subs, n_live;
    gen_choice *choices;       // [n_subs * p.sp.n]
    int n_choices;
    int best_n;                // best_of: choices returned per prompt (0 = all of them)
    bool headers_sent, failed;
    gen_job *prev, *next;      // the app's live jobs
};

// A new job for `r` with `n_prompts` prompts; takes `p` (its contents are
// moved, *p is zeroed). Prompts are set with gen_job_set_prompt before start.
gen_job *gen_job_new(srv_app *a, srv_req *r, api_kind kind, api_params *p, int n_prompts,
                     const char *id_prefix);
// Prompt i: takes `ids` and `text` (may be NULL); `sp` is its parameters
// (max_tokens resolved for this prompt's length).
void gen_job_set_prompt(gen_job *j, int i, int32_t *ids, int32_t n_ids, char *text,
                        const pg_sampling_params *sp);
// Frees a job that was never started (validation failed after creation).
void gen_job_discard(gen_job *j);
// Submits every prompt and hands the job to the app.
void gen_job_start(gen_job *j);

// One engine event (loop thread).
void gen_on_event(srv_app *a, const pg_gen_event *ev);

// Drains every pending engine event into gen_on_event (the async callback).
void gen_drain_events(srv_app *a);

// Aborts every engine request of every live job (shutdown timeout).
void gen_abort_all(srv_app *a);
// The engine failed (the watchdog): every live job fails with a 500 (or an
// error event and [DONE] when its stream started) carrying `msg`, as if
// each engine request had ended with an error; the engine is not asked
// anything, and its later events must not be delivered.
void gen_fail_all(srv_app *a, const char *msg);
// Frees every job, live or not: only after the engine is destroyed and the
// connections are closed (end of shutdown).
void gen_free_all(srv_app *a);
