// server/gen_job.c - generation jobs: engine submissions, events,
// detokenization, stop strings, and when the response goes out (its JSON
// comes from server/api_format.c).
#include "server/gen_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "server/api_format.h"
#include "server/sse.h"

// --- life cycle ------------------------------------------------------------------

gen_job *gen_job_new(srv_app *a, srv_req *r, api_kind kind, api_params *p, int n_prompts,
                     const char *id_prefix) {
    gen_job *j = pg_xcalloc(1, sizeof *j);
    j->app = a;
    j->req = r;
    j->kind = kind;
    j->p = *p;
    memset(p, 0, sizeof *p);
    j->created = (int64_t)time(NULL);
    j->arrival_ns = r->start_ns ? r->start_ns : pg_now_ns();
    app_new_id(a, id_prefix, j->id, sizeof j->id);
    j->n_subs = n_prompts;
    j->subs = pg_xcalloc((size_t)n_prompts, sizeof(gen_sub));
    int n = j->p.sp.n;
    j->n_choices = n_prompts * n;
    j->choices = pg_xcalloc((size_t)j->n_choices, sizeof(gen_choice));
    for (int i = 0; i < n_prompts; i++) {
        gen_sub *s = &j->subs[i];
        s->job = j;
        s->index = i;
        s->engine_id = -1;
        s->sp = j->p.sp;
        for (int k = 0; k < n; k++) {
            gen_choice *c = &j->choices[i * n + k];
            c->index = i * n + k;
            c->sub = s;
            c->seq = k;
            c->stop_string = -1;
            c->stop_token = -1;
            pg_detok_init(&c->detok, a->tok, j->p.skip_special_tokens);
            stop_matcher_init(&c->stop, (const char *const *)j->p.stop, j->p.stop_lens, j->p.n_stop,
                              j->p.include_stop_str);
        }
    }
    return j;
}

void gen_job_set_prompt(gen_job *j, int i, int32_t *ids, int32_t n_ids, char *text,
                        const pg_sampling_params *sp) {
    gen_sub *s = &j->subs[i];
    free(s->ids);
    free(s->text);
    s->ids = ids;
    s->n_ids = n_ids;
    s->text = text;
    s->sp = *sp;
}

static void job_free(gen_job *j) {
    for (int i = 0; i < j->n_choices; i++) {
        gen_choice *c = &j->choices[i];
        stop_matcher_free(&c->stop);
        sbuf_free(&c->text);
        sbuf_free(&c->delta);
        free(c->lps);
    }
    for (int i = 0; i < j->n_subs; i++) {
        free(j->subs[i].ids);
        free(j->subs[i].text);
        free(j->subs[i].plp);
    }
    free(j->subs);
    free(j->choices);
    api_params_free(&j->p);
    free(j);
}

void gen_job_discard(gen_job *j) { job_free(j); }

static void job_unlink_free(gen_job *j) {
    srv_app *a = j->app;
    if (j->prev)
        j->prev->next = j->next;
    else
        a->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    a->n_jobs--;
    job_free(j);
}

static void job_abort_engine(gen_job *j) {
    for (int i = 0; i < j->n_subs; i++)
        if (j->subs[i].live) pg_engine_abort(j->app->engine, j->subs[i].engine_id);
}

// The connection died before the response ended.
static void job_on_abort(srv_req *r, void *ud) {
    gen_job *j = ud;
    j->req = NULL;
    job_abort_engine(j);
    if (j->n_live == 0) job_unlink_free(j);
}

void gen_job_start(gen_job *j) {
    srv_app *a = j->app;
    j->next = a->jobs;
    if (a->jobs) a->jobs->prev = j;
    a->jobs = j;
    a->n_jobs++;
    j->req->on_abort = job_on_abort;
    j->req->ud = j;
    for (int i = 0; i < j->n_subs; i++) {
        gen_sub *s = &j->subs[i];
        pg_gen_request gr = {.prompt = s->ids, .n_prompt = s->n_ids, .sp = s->sp,
                             .priority = j->p.priority, .user = s,
                             .grammar = j->p.grammar,  // the engine takes its own reference
                             .allowed_ids = j->p.allowed_ids, .n_allowed = j->p.n_allowed,
                             .bad_off = j->p.bad_off, .bad_ids = j->p.bad_ids,
                             .n_bad = j->p.n_bad_seqs, .lora_id = j->p.lora_id};
        gr.sp.n_logit_bias = j->p.n_logit_bias;  // copied by the engine
        gr.sp.bias_ids = j->p.bias_ids;
        gr.sp.bias_values = j->p.bias_values;
        s->engine_id = pg_engine_submit(a->engine, &gr);
        s->live = true;
        j->n_live++;
    }
}

void gen_abort_all(srv_app *a) {
    for (gen_job *j = a->jobs; j; j = j->next) job_abort_engine(j);
}

// --- responses --------------------------------------------------------------------

static void ensure_stream(gen_job *j) {
    if (j->headers_sent || !j->req) return;
    j->headers_sent = true;
    sse_begin(j->req);
    api_format_stream_start(j);
}

// Ends the HTTP side of a failed job: an error response, or an error event
// when the stream has begun. Other engine requests of the job are aborted.
static void job_fail(gen_job *j, int status, const char *msg) {
    if (j->failed) return;
    j->failed = true;
    job_abort_engine(j);
    if (!j->req) return;
    api_error e;
    api_err(&e, status, NULL, "%s", msg);
    srv_req *r = j->req;
    j->req = NULL;
    if (!j->headers_sent) {
        app_send_error(r, &e);
        return;
    }
    sbuf b = {0};
    sbuf_puts(&b, "data: ");
    api_error_json(&e, &b);
    sbuf_puts(&b, "\n\ndata: [DONE]\n\n");
    srv_resp_write(r, b.p, b.len);
    sbuf_free(&b);
    srv_resp_end(r);
}

static void job_complete(gen_job *j) {
    if (j->req && !j->failed) {
        if (j->p.stream) {
            ensure_stream(j);
            srv_req *r = j->req;
            if (j->p.include_usage) api_format_stream_usage(j);
            sse_send_done(r);
            j->req = NULL;
            srv_resp_end(r);
        } else {
            srv_req *r = j->req;
            j->req = NULL;
            sbuf b = {0};
            api_format_response(j, &b);
            app_send_json(r, 200, b.p, b.len);
            sbuf_free(&b);
        }
    }
    if (!j->req) job_unlink_free(j);
}

// --- events ----------------------------------------------------------------------

static void choice_add_lp(gen_choice *c, const pg_seq_output *o) {
    if (c->n_lps == c->cap_lps) {
        c->cap_lps = c->cap_lps ? c->cap_lps * 2 : 16;
        c->lps = pg_xrealloc(c->lps, sizeof(pg_seq_output) * (size_t)c->cap_lps);
    }
    c->lps[c->n_lps++] = *o;
}

// Text for the choice's output goes to `delta` when streaming, else `text`.
static sbuf *choice_sink(gen_job *j, gen_choice *c) { return j->p.stream ? &c->delta : &c->text; }

static void choice_finish(gen_job *j, gen_choice *c, const char *reason) {
    c->finished = true;
    c->finish_reason = reason;
    srv_metrics *m = &j->app->metrics;
    srv_metrics_finished(m, reason);
    if (c->n_tokens > 1 && c->last_token_ns > c->first_token_ns)
        met_observe(m->tpot, (double)(c->last_token_ns - c->first_token_ns) * 1e-9 / (c->n_tokens - 1));
}

// A new token for choice `c`: logprobs, text, stop strings.
static void choice_token(gen_job *j, gen_choice *c, const sched_event *ev, int64_t now) {
    srv_app *a = j->app;
    gen_sub *s = c->sub;
    if (!s->got_token) {
        s->got_token = true;
        met_observe(a->metrics.ttft, (double)(now - j->arrival_ns) * 1e-9);
        met_inc(a->metrics.prompt_tokens, s->n_ids);
    }
    if (j->p.echo_only) return; // max_tokens 0: the engine's one token is not part of the answer
    c->n_tokens++;
    met_inc(a->metrics.generation_tokens, 1);
    if (c->last_token_ns) met_observe(a->metrics.itl, (double)(now - c->last_token_ns) * 1e-9);
    if (!c->first_token_ns) c->first_token_ns = now;
    c->last_token_ns = now;
    if (j->p.logprobs >= 0) choice_add_lp(c, &ev->out);
    c->cum_logprob += ev->out.logprob;
    // EOS / stop token ids end the output without appearing in it (unless
    // include_stop_str_in_output), as in vLLM.
    int32_t tok = ev->out.token;
    bool is_stop_token = ev->finish == SCHED_FINISH_STOP && ev->stop_token == tok;
    if (is_stop_token && !j->p.include_stop_str) return;
    char piece[4096];
    int cap = (int)sizeof piece;
    char *buf = piece;
    int need = 3 * pg_tokenizer_max_token_bytes(a->tok) + 16;
    if (need > cap) buf = pg_xmalloc((size_t)(cap = need));
    int n = pg_detok_feed(&c->detok, tok, buf, cap);
    if (n > 0 && stop_matcher_feed(&c->stop, buf, (size_t)n, choice_sink(j, c))) {
        c->stop_string = c->stop.match_index;
        choice_finish(j, c, "stop");
        if (ev->finish == SCHED_FINISH_NONE) pg_engine_finish_seq(a->engine, s->engine_id, c->seq);
    }
    if (buf != piece) free(buf);
}

// The engine finished the sequence: flush held-back bytes and text.
static void choice_end(gen_job *j, gen_choice *c, const sched_event *ev) {
    char tail[64];
    int n = pg_detok_flush(&c->detok, tail, sizeof tail);
    sbuf *sink = choice_sink(j, c);
    if (n > 0 && stop_matcher_feed(&c->stop, tail, (size_t)n, sink)) {
        c->stop_string = c->stop.match_index;
        choice_finish(j, c, "stop");
        return;
    }
    stop_matcher_flush(&c->stop, sink);
    if (j->p.echo_only) { // no output at all: max_tokens 0 reached
        choice_finish(j, c, "length");
        return;
    }
    c->stop_token = ev->stop_token;
    choice_finish(j, c, sched_finish_name(ev->finish));
}

static void sub_finished(gen_job *j, gen_sub *s, const sched_usage *u) {
    srv_metrics *m = &j->app->metrics;
    s->usage = *u;
    s->live = false;
    j->n_live--;
    if (u->first_scheduled_ns) {
        met_observe(m->queue, (double)(u->first_scheduled_ns - u->arrival_ns) * 1e-9);
        if (u->first_token_ns) {
            met_observe(m->prefill, (double)(u->first_token_ns - u->first_scheduled_ns) * 1e-9);
            if (u->finish_ns) met_observe(m->decode, (double)(u->finish_ns - u->first_token_ns) * 1e-9);
        }
        met_observe(m->prompt_len, u->prompt_tokens);
    }
    int32_t gen = 0;
    for (int k = 0; k < s->sp.n; k++) gen += j->choices[s->index * j->p.sp.n + k].n_tokens;
    met_observe(m->gen_len, gen);
    met_observe(m->e2e, (double)(pg_now_ns() - j->arrival_ns) * 1e-9);
}

void gen_on_event(srv_app *a, const pg_gen_event *ge) {
    gen_sub *s = ge->user;
    // The event's prompt logprobs are ours (engine.h): kept by the sub, else freed.
    if (ge->prompt_lp && s && !s->plp && ge->n_prompt_lp == s->n_ids)
        s->plp = ge->prompt_lp;
    else
        free(ge->prompt_lp);
    if (!s) return;
    gen_job *j = s->job;
    const sched_event *ev = &ge->ev;
    int64_t now = pg_now_ns();
    if (ge->error_code < 0 || ev->finish == SCHED_FINISH_ERROR) {
        // Rejected at admission (queue full, can never fit) or a failed step.
        // The scheduler's admission errors read "request: ..." (400, or 503
        // when the queue is full); anything else is a failed model step.
        const char *msg = ge->error[0] ? ge->error : "the request failed in the engine";
        int status = 500;
        if (ge->error_code == PG_ENOSPC) status = 503;
        else if (!strncmp(msg, "request: ", 9)) status = 400;
        if (!strncmp(msg, "request: ", 9)) msg += 9;
        for (int k = 0; k < j->p.sp.n; k++) {
            gen_choice *c = &j->choices[s->index * j->p.sp.n + k];
            if (!c->finished) choice_finish(j, c, "error");
        }
        job_fail(j, status, msg);
    } else if (ev->seq_index >= 0 && ev->seq_index < j->p.sp.n) {
        gen_choice *c = &j->choices[s->index * j->p.sp.n + ev->seq_index];
        bool was_finished = c->finished;
        if (ev->has_token && !c->finished) choice_token(j, c, ev, now);
        if (ev->finish != SCHED_FINISH_NONE && !c->finished) choice_end(j, c, ev);
        bool finished_now = c->finished && !was_finished;
        if (j->p.stream && j->req && !j->failed &&
            (c->delta.len > 0 || c->n_lps > 0 || finished_now)) {
            ensure_stream(j);
            api_format_stream_chunk(j, c, finished_now ? c->finish_reason : NULL);
            sbuf_reset(&c->delta);
            c->n_lps = 0;
            if (ev->has_token && ge->publish_ns > 0)
                met_observe(a->metrics.frontend, (double)(pg_now_ns() - ge->publish_ns) * 1e-9);
        }
    }
    if (ev->req_finished && s->live) {
        sub_finished(j, s, &ev->usage);
        if (j->n_live == 0) job_complete(j);
    }
}

void gen_fail_all(srv_app *a, const char *msg) {
    gen_job *next;
    for (gen_job *j = a->jobs; j; j = next) {
        next = j->next;
        // The job may be freed by the event of its last live request.
        int live = j->n_live;
        for (int i = 0; live > 0 && i < j->n_subs; i++) {
            gen_sub *s = &j->subs[i];
            if (!s->live) continue;
            live--;
            pg_gen_event ge;
            memset(&ge, 0, sizeof ge);
            ge.user = s;
            ge.ev.req_id = s->engine_id;
            ge.ev.finish = SCHED_FINISH_ERROR;
            ge.ev.stop_token = -1;
            ge.ev.req_finished = true;
            ge.ev.usage = s->usage;
            ge.error_code = PG_EIO;
            snprintf(ge.error, sizeof ge.error, "%s", msg);
            gen_on_event(a, &ge);
        }
    }
}

void gen_free_all(srv_app *a) {
    while (a->jobs) job_unlink_free(a->jobs);
}

void gen_drain_events(srv_app *a) {
    if (!a->evbuf) {
        a->evcap = 256;
        a->evbuf = pg_xmalloc(sizeof(pg_gen_event) * (size_t)a->evcap);
    }
    // uv_async_send coalesces wake-ups: take everything that is there.
    for (;;) {
        int n = pg_engine_poll(a->engine, a->evbuf, a->evcap);
        for (int i = 0; i < n; i++) gen_on_event(a, &a->evbuf[i]);
        if (n < a->evcap) break;
    }
}
