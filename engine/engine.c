// engine/engine.c - the engine thread and its two queues (submissions in,
// events out). Set-up (device, model, KV sizing) is engine/setup.c.
#include "engine/engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/draft_model.h"
#include "engine/engine_int.h"
#include "text/grammar/structured.h"

void pg_engine_config_default(pg_engine_config *c) {
    memset(c, 0, sizeof *c);
    // device NULL: "auto" (pg_engine_config_device)
    c->swap_bytes = -1; // the default (pg_host_kv_blocks)
    sched_config_default(&c->sched);
}

// --- per-request state (engine thread) ---------------------------------------------

// A request's engine-side state, owned by the scheduler's entry for it
// (sched_request.owner) until its last event: the one request map is the
// scheduler's.
static live *live_new(const sub *s) {
    live *l = pg_xcalloc(1, sizeof *l);  // fields other modules add start zeroed
    l->id = s->id;
    l->user = s->req.user;
    l->x = s->x;
    l->lora_slot = -1;
    eng_plp_start(l, &s->req);
    return l;
}

static void live_free(live *l) {
    if (!l) return;
    eng_masks_free(l->x);
    free(l->plp);
    free(l);
}

// sched_for_each_owner's callback at stop.
static void live_free_owner(void *owner, void *ctx) {
    (void)ctx;
    live_free(owner);
}

// --- events ---------------------------------------------------------------------

static void publish(pg_engine *e, const pg_gen_event *evs, int n) {
    if (n == 0) return;
    pthread_mutex_lock(&e->ev_mu);
    if (e->ev_head > 0 && e->ev_head == e->n_events) e->n_events = e->ev_head = 0;
    if (e->n_events + n > e->cap_events) {
        // Compact, then grow.
        if (e->n_events > e->ev_head)  // (events is NULL before the first publish)
            memmove(e->events, e->events + e->ev_head, sizeof(pg_gen_event) * (size_t)(e->n_events - e->ev_head));
        e->n_events -= e->ev_head;
        e->ev_head = 0;
        if (e->n_events + n > e->cap_events) {
            e->cap_events = (e->n_events + n) * 2;
            e->events = pg_xrealloc(e->events, sizeof(pg_gen_event) * (size_t)e->cap_events);
        }
    }
    memcpy(e->events + e->n_events, evs, sizeof(pg_gen_event) * (size_t)n);
    int64_t now = pg_now_ns();
    for (int i = 0; i < n; i++) e->events[e->n_events + i].publish_ns = now;
    e->n_events += n;
    pthread_mutex_unlock(&e->ev_mu);
    if (e->notify) e->notify(e->notify_ctx);
}

int pg_engine_poll(pg_engine *e, pg_gen_event *out, int cap) {
    pthread_mutex_lock(&e->ev_mu);
    int n = e->n_events - e->ev_head;
    if (n > cap) n = cap;
    if (n > 0) memcpy(out, e->events + e->ev_head, sizeof(pg_gen_event) * (size_t)n);
    e->ev_head += n;
    pthread_mutex_unlock(&e->ev_mu);
    return n;
}

static void reject(pg_engine *e, const sub *s, int code, const char *msg) {
    pg_gen_event ge;
    memset(&ge, 0, sizeof ge);
    ge.ev.req_id = s->id;
    ge.ev.finish = SCHED_FINISH_ERROR;
    ge.ev.stop_token = -1;
    ge.ev.req_finished = true;
    ge.ev.usage.prompt_tokens = s->req.n_prompt;
    ge.user = s->req.user;
    ge.error_code = code;
    snprintf(ge.error, sizeof ge.error, "%s", msg);
    publish(e, &ge, 1);
}

// --- the engine thread -------------------------------------------------------------

// The longest a request waits for its grammar's precomputation: its own
// bound is 2 s (text/grammar/structured.h); past this the masks are built on use.
#define GRAMMAR_HOLD_NS ((int64_t)3000 * 1000000)

// True when `s` should wait for its grammar's background precomputation.
static bool grammar_pending(const sub *s) {
    if (s->kind != SUB_ADD || !s->x || !s->x->grammar) return false;
    if (s->held_ns && pg_now_ns() - s->held_ns > GRAMMAR_HOLD_NS) return false;
    pg_grammar_precompute st;
    pg_grammar_precompute_stats(s->x->grammar, &st);
    return st.started && !st.done;
}

// A held request's grammar finished its precomputation
// (pg_grammar_precompute_notify, on that thread): the loop looks again.
static void held_wake(void *arg) {
    pg_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    e->held_wake = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

// The grammar hooks of the held requests (none may be set while e->mu is
// held: held_wake takes it on the precomputing thread, under its lock).
static void held_hooks(pg_engine *e, bool on) {
    for (sub *s = e->held; s; s = s->next)
        if (s->x && s->x->grammar) pg_grammar_precompute_notify(s->x->grammar, on ? held_wake : NULL, on ? e : NULL);
}

// The scheduler ends a sequence at one EOS id; a model with more (Llama 3's
// generation_config [128001, 128008, 128009], a GGUF's end-of-turn token,
// Gemma's <end_of_turn>) ends it at the others too, as vLLM does: they join
// the request's stop ids (banned alike until min_tokens, not shown in the
// text, finish_reason "stop").
static void add_eos_stops(const pg_engine *e, pg_sampling_params *sp) {
    const pg_model_config *c = &e->model->cfg;
    if (sp->ignore_eos) return;
    for (int32_t k = 1; k < c->n_eos && sp->n_stop_ids < PG_MAX_STOP_IDS; k++) {
        bool have = c->eos_ids[k] == c->eos_ids[0];
        for (int32_t j = 0; j < sp->n_stop_ids && !have; j++) have = sp->stop_ids[j] == c->eos_ids[k];
        if (!have) sp->stop_ids[sp->n_stop_ids++] = c->eos_ids[k];
    }
}

static void apply_submissions(pg_engine *e, sub *list) {
    while (list) {
        sub *s = list;
        list = s->next;
        if (s->kind == SUB_ABORT) {
            // A held request that is aborted goes in first, so that its
            // abort ends it the usual way (one final event).
            for (sub **h = &e->held; *h; h = &(*h)->next)
                if ((*h)->id == s->id) {
                    sub *held = *h;
                    *h = held->next;
                    held->next = NULL;
                    held->held_ns = -GRAMMAR_HOLD_NS; // admit now
                    held->aborted = true;             // (or end it, if it waits for a LoRA slot)
                    apply_submissions(e, held);
                    break;
                }
        }
        if (s->kind == SUB_ADD && s->held_ns >= 0 && grammar_pending(s)) {
            if (!s->held_ns) s->held_ns = pg_now_ns();
            s->next = e->held;
            e->held = s;
            continue;
        }
        // Admitted after a hold: its grammar's hook goes (held_hooks sets
        // it again for any request still held on the same grammar).
        if (s->kind == SUB_ADD && s->held_ns != 0) pg_grammar_precompute_notify(s->x->grammar, NULL, NULL);
        if (s->kind == SUB_ADD) {
            // Its adapter's slot now (engine/engine_lora.c): gone if it was
            // unloaded after the request named it; an adapter in no slot is
            // brought into one, or the request waits (held) until a slot has
            // no live request.
            int32_t slot = eng_lora_slot(e, s->req.lora_id);
            int lrc = 0;
            if (slot == -3) {
                lrc = eng_lora_make_resident(e, s->req.lora_id, &slot);
                if (lrc == 0 && slot == -1 && !s->aborted) {
                    s->lora_wait = true;
                    s->next = e->held;
                    e->held = s;
                    continue;
                }
                if (lrc == 0 && slot == -1) lrc = pg_err_set(PG_EINVAL, "aborted while waiting for a LoRA slot");
            }
            s->lora_wait = false;
            add_eos_stops(e, &s->req.sp);
            live *l = live_new(s); // takes s->x
            l->lora_slot = slot;
            sched_request r = {.id = s->id, .prompt = s->req.prompt, .n_prompt = s->req.n_prompt,
                               .sp = &s->req.sp, .priority = s->req.priority,
                               .arrival_ns = pg_now_ns(),
                               .eos_id = e->model->cfg.n_eos ? e->model->cfg.eos_ids[0] : -1,
                               .owner = l, .lora_id = slot + 1, .cache_salt = (uint64_t)s->req.lora_id};
            int rc = lrc < 0     ? lrc
                     : slot == -2 ? pg_err_set(PG_EINVAL, "the LoRA adapter this request names was unloaded")
                                  : sched_add_request(e->sched, &r);
            if (rc < 0) {
                reject(e, s, rc, pg_err_msg());
                live_free(l);
            }
            free((void *)s->req.prompt);
        } else if (s->kind == SUB_LORA) {
            eng_lora_apply(e, s->lora);
        } else if (s->kind == SUB_ABORT) {
            sched_abort(e->sched, s->id); // unknown id: already finished, harmless
        } else {
            sched_finish_seq(e->sched, s->id, s->seq_index, SCHED_FINISH_STOP);
        }
        free(s);
    }
}

// One step from begin to resolve. The engine thread alternates two of them:
// under async scheduling step N + 1 is begun before step N is finished.
typedef struct open_step {
    bool begun;        // the runner has it (an end follows)
    bool failed;       // begin failed: resolved with no output
    int32_t n_seqs;    // the plan's sequences and tokens (statistics)
    int32_t n_tokens;
    int64_t t_begin;
} open_step;

// --- health and fault injection ------------------------------------------------------

static void busy_set(pg_engine *e, int64_t since_ns) { atomic_store(&e->busy_since_ns, since_ns); }

static void mark_failed(pg_engine *e, const char *why) {
    pthread_mutex_lock(&e->stats_mu);
    if (!e->failed) snprintf(e->fail_reason, sizeof e->fail_reason, "%s", why);
    e->failed = true;
    pthread_mutex_unlock(&e->stats_mu);
}

static bool stopping(pg_engine *e) {
    pthread_mutex_lock(&e->mu);
    bool s = e->stop;
    pthread_mutex_unlock(&e->mu);
    return s;
}

// PAGED_FAULT_INJECT (engine.h). 0, or PG_EINVAL naming the variable.
static int fault_parse(pg_engine *e) {
    const char *v = getenv("PAGED_FAULT_INJECT");
    if (!v || !*v) return 0;
    char kind[16];
    long long n = 0;
    double secs = 3600;
    int got = sscanf(v, "%15[a-z]:%lld:%lf", kind, &n, &secs);
    bool stall = got >= 2 && !strcmp(kind, "stall"), fail = got == 2 && !strcmp(kind, "fail");
    if ((!stall && !fail) || n < 1 || !(secs > 0))
        return pg_err_set(PG_EINVAL, "PAGED_FAULT_INJECT='%s': expected stall:N[:SECONDS] or fail:N", v);
    e->fault = stall ? FAULT_STALL : FAULT_FAIL;
    e->fault_step = n;
    e->fault_seconds = secs;
    PG_LOGW("fault injection: step %lld will %s", n, stall ? "stall" : "fail");
    return 0;
}

// The injected fault of this step, if it is the one: true when it failed.
static bool fault_hit(pg_engine *e) {
    if (e->fault == FAULT_NONE || ++e->steps_with_work != e->fault_step) return false;
    if (e->fault == FAULT_FAIL) {
        pg_err_set(PG_EIO, "fault injection: step %lld failed", (long long)e->fault_step);
        return true;
    }
    PG_LOGW("fault injection: stalling step %lld for %.0f s", (long long)e->fault_step, e->fault_seconds);
    int64_t end = pg_now_ns() + (int64_t)(e->fault_seconds * 1e9);
    while (pg_now_ns() < end && !stopping(e)) nanosleep(&(struct timespec){0, 20000000}, NULL);
    return false;
}

// Gives the plan to the runner: the GPU queues it, the CPU runs it now.
static void step_begin(pg_engine *e, const pg_batch_plan *plan, open_step *st) {
    st->begun = st->failed = false;
    st->n_seqs = plan->n_seqs;
    st->n_tokens = plan->n_tokens;
    st->t_begin = pg_now_ns();
    // A plan may hold only block moves (a swap-out with nothing
    // scheduled): those run too.
    if (plan->n_seqs == 0 && plan->n_swap_out == 0 && plan->n_swap_in == 0 && plan->n_copies == 0)
        return;
    if (fault_hit(e)) {
        PG_LOGE("step failed: %s", pg_err_msg());
        mark_failed(e, pg_err_msg());
        st->failed = true;
        return;
    }
    if (pg_executor_begin(e->exec, plan) < 0) {
        PG_LOGE("step failed: %s", pg_err_msg());
        mark_failed(e, pg_err_msg());
        st->failed = true; // every request of the plan finishes with an error
        return;
    }
    st->begun = true;
}

// Waits for the step's outputs, hands them to the scheduler and publishes
// the events; statistics.
static void step_finish(pg_engine *e, open_step *st, pg_gen_event **out, int *cap_out) {
    pg_step_output so = {0};
    const pg_step_output *sop = &so;
    if (st->failed) {
        sop = NULL;
    } else if (st->begun && pg_executor_end(e->exec, &so) < 0) {
        PG_LOGE("step failed: %s", pg_err_msg());
        mark_failed(e, pg_err_msg());
        sop = NULL;
    }
    int64_t t1 = pg_now_ns();
    // Memory for /metrics: lazily captured graphs and other processes move
    // the numbers (read at most once a second).
    bool gm_new = t1 - e->mem_polled_ns >= 1000000000LL;
    if (gm_new) {
        if (pg_executor_mem_refresh(e->exec) < 0) PG_LOGW("device memory: %s", pg_err_msg());
        e->mem_polled_ns = t1;
    }
    // Before the resolve: it ends the requests that finish in this step,
    // and the scheduler's map forgets them (their events keep the owner).
    if (sop) eng_plp_store(e, sop);
    sched_events evs;
    if (sched_resolve(e->sched, sop, &evs) < 0) PG_LOGE("scheduler update: %s", pg_err_msg());
    eng_masks_advance(e, &evs);  // before the loop below frees the finished requests' state
    if (evs.n > *cap_out) {
        *cap_out = evs.n * 2;
        *out = pg_xrealloc(*out, sizeof(pg_gen_event) * (size_t)*cap_out);
    }
    for (int i = 0; i < evs.n; i++) {
        pg_gen_event *g = &(*out)[i];
        memset(g, 0, sizeof *g);
        g->ev = evs.ev[i];
        g->ev.owner = NULL; // the engine's, freed below with the last event: not the poller's
        live *l = evs.ev[i].owner;
        eng_plp_attach(l, g);
        g->user = l ? l->user : NULL;
        if (evs.ev[i].req_finished) live_free(l); // the request's last event
        if (evs.ev[i].finish == SCHED_FINISH_ERROR) {
            g->error_code = PG_EINVAL;
            snprintf(g->error, sizeof g->error, "the model step failed");
        }
    }
    publish(e, *out, evs.n);

    pthread_mutex_lock(&e->stats_mu);
    sched_stats_get(e->sched, &e->stats.sched);
    if (st->n_seqs > 0) {
        // Busy time without double counting overlapped steps.
        int64_t from = st->t_begin > e->last_end_ns ? st->t_begin : e->last_end_ns;
        e->stats.steps++;
        e->stats.busy_seconds += (double)(t1 - from) * 1e-9;
        e->stats.tokens_sampled += so.n;
        e->stats.prompt_tokens_computed += st->n_tokens;
    }
    e->last_end_ns = t1;
    if (gm_new) eng_stats_memory(e);
    pthread_mutex_unlock(&e->stats_mu);
}

// The loop. Synchronous: plan N, begin N, advance, finish N. Async (the
// GPU by default): plan N + 1 and begin it while step N runs, then finish
// N, so the device always has the next step queued; a penalty (the
// runner reads the history) or a step with nothing to run finishes first.
static void *engine_main(void *arg) {
    pg_engine *e = arg;
    pg_gen_event *out = NULL;
    int cap_out = 0;
    open_step steps[2];
    memset(steps, 0, sizeof steps);
    open_step *prev = NULL; // begun, not finished
    int cur_i = 0;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->subs_head && !sched_has_work(e->sched)) {
            if (!e->held) {
                pthread_cond_wait(&e->cv, &e->mu);
                continue;
            }
            // Held requests: their grammars' hooks wake the loop (held_wake);
            // else the earliest end of a hold does.
            if (e->held_wake) break;
            // A request waiting for a LoRA slot: with no work left every
            // slot is idle, so it goes in now.
            bool lora_wait = false;
            for (sub *s = e->held; s; s = s->next) lora_wait |= s->lora_wait;
            if (lora_wait) break;
            int64_t until = INT64_MAX;
            for (sub *s = e->held; s; s = s->next)
                if (s->held_ns + GRAMMAR_HOLD_NS < until) until = s->held_ns + GRAMMAR_HOLD_NS;
            const int64_t left = until - pg_now_ns() + 1000000; // past the deadline by a millisecond
            if (left <= 0) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)(left / 1000000000);
            ts.tv_nsec += (long)(left % 1000000000);
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
            break;
        }
        e->held_wake = false;
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        sub *list = e->subs_head;
        e->subs_head = e->subs_tail = NULL;
        pthread_mutex_unlock(&e->mu);
        // Held requests whose grammar is ready go first (they came first).
        sub *ready = e->held;
        e->held = NULL;
        apply_submissions(e, ready);
        apply_submissions(e, list);
        held_hooks(e, true);
        if (prev && !sched_can_run_ahead(e->sched)) {
            step_finish(e, prev, &out, &cap_out);
            prev = NULL;
            busy_set(e, 0);
        }

        const pg_batch_plan *plan;
        if (sched_step(e->sched, &plan) < 0) {
            PG_LOGE("scheduler: %s", pg_err_msg());
            continue;
        }
        // Snapshot now too, so /metrics shows the requests of a long step
        // as running while it executes.
        pthread_mutex_lock(&e->stats_mu);
        sched_stats_get(e->sched, &e->stats.sched);
        pthread_mutex_unlock(&e->stats_mu);
        open_step *cur = &steps[cur_i];
        cur_i ^= 1;
        eng_masks_fill(e, plan);
        // The watchdog's clock: from the begin of the oldest unfinished step.
        if (!prev) busy_set(e, pg_now_ns());
        step_begin(e, plan, cur);
        if (prev) {
            step_finish(e, prev, &out, &cap_out); // the step before, while this one runs
            busy_set(e, cur->t_begin);
        }
        prev = NULL;
        if (sched_advance(e->sched) < 0) PG_LOGE("scheduler advance: %s", pg_err_msg());
        if (e->async && cur->begun) {
            prev = cur;
        } else {
            step_finish(e, cur, &out, &cap_out);
            busy_set(e, 0);
        }
    }
    if (prev) step_finish(e, prev, &out, &cap_out); // nothing left running on the device
    busy_set(e, 0);
    free(out);
    return NULL;
}

static void enqueue(pg_engine *e, sub *s) {
    pthread_mutex_lock(&e->mu);
    eng_enqueue_locked(e, s);
    pthread_mutex_unlock(&e->mu);
}

int64_t pg_engine_submit(pg_engine *e, const pg_gen_request *req) {
    sub *s = pg_xcalloc(1, sizeof *s);
    s->kind = SUB_ADD;
    s->req = *req;
    int32_t *ids = pg_xmalloc(sizeof(int32_t) * (size_t)(req->n_prompt > 0 ? req->n_prompt : 1));
    if (req->n_prompt > 0) memcpy(ids, req->prompt, sizeof(int32_t) * (size_t)req->n_prompt);
    s->req.prompt = ids;
    s->x = eng_masks_from_request(e, &s->req);
    pthread_mutex_lock(&e->mu);
    s->id = e->next_id++;
    pthread_mutex_unlock(&e->mu);
    int64_t id = s->id;
    enqueue(e, s);
    return id;
}

void pg_engine_abort(pg_engine *e, int64_t id) {
    sub *s = pg_xcalloc(1, sizeof *s);
    s->kind = SUB_ABORT;
    s->id = id;
    enqueue(e, s);
}

void pg_engine_finish_seq(pg_engine *e, int64_t id, int32_t seq_index) {
    sub *s = pg_xcalloc(1, sizeof *s);
    s->kind = SUB_FINISH_SEQ;
    s->id = id;
    s->seq_index = seq_index;
    enqueue(e, s);
}

int pg_engine_create(const pg_engine_config *cfg, pg_engine_notify_fn notify, void *notify_ctx,
                     pg_engine **out) {
    *out = NULL;
    pg_engine *e = pg_xcalloc(1, sizeof *e);
    e->cfg = *cfg;
    e->notify = notify;
    e->notify_ctx = notify_ctx;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->ev_mu, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    eng_lora_init(e);
    int rc = fault_parse(e);
    if (rc == 0) rc = eng_setup(e);
    if (rc == 0) rc = eng_lora_check(e);
    if (rc == 0 && pthread_create(&e->thread, NULL, engine_main, e) != 0)
        rc = pg_err_set(PG_ENOMEM, "cannot start the engine thread");
    if (rc < 0) {
        pg_engine_destroy(e);
        return rc;
    }
    *out = e;
    return 0;
}

void pg_engine_destroy(pg_engine *e) {
    if (!e) return;
    if (e->thread) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_signal(&e->cv);
        pthread_cond_broadcast(&e->lora_cv); // a LoRA change waited for ends with an error
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    held_hooks(e, false); // no precomputing thread calls into e after this
    sub *lists[2] = {e->subs_head, e->held};
    for (int k = 0; k < 2; k++)
        for (sub *s = lists[k]; s;) {
            sub *n = s->next;
            if (s->kind == SUB_ADD) {
                free((void *)s->req.prompt);
                eng_masks_free(s->x);
            }
            free(s);
            s = n;
        }
    // The requests still live (and those whose last event never came).
    if (e->sched) sched_for_each_owner(e->sched, live_free_owner, NULL);
    sched_destroy(e->sched);
    pg_draft_free(e->draft); // on rank 0's backend: before the executor frees it
    pg_executor_free(e->exec);
    pg_chat_template_free(e->chat);
    pg_tokenizer_free(e->tok);
    eng_lora_free(e);
    for (int i = e->ev_head; i < e->n_events; i++) free(e->events[i].prompt_lp); // never polled
    free(e->events);
    free(e->mask_buf);
    free(e->mask_ptr);
    free(e->mask_hist);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->ev_mu);
    pthread_mutex_destroy(&e->stats_mu);
    free(e);
}

const pg_tokenizer *pg_engine_tokenizer(const pg_engine *e) { return e->tok; }
const pg_chat_template *pg_engine_chat_template(const pg_engine *e) { return e->chat; }
const pg_model_config *pg_engine_model_config(const pg_engine *e) { return &e->model->cfg; }
const char *pg_engine_quantization(const pg_engine *e) { return pg_quantization_name(e->model->quantization); }
int32_t pg_engine_max_model_len(const pg_engine *e) { return e->max_model_len; }
const char *pg_engine_device_name(const pg_engine *e) { return e->backend->name; }

void pg_engine_health_get(pg_engine *e, pg_engine_health *out) {
    memset(out, 0, sizeof *out);
    int64_t since = atomic_load(&e->busy_since_ns);
    if (since > 0) {
        int64_t age = pg_now_ns() - since;
        out->step_age_ns = age > 0 ? age : 1;
    }
    pthread_mutex_lock(&e->stats_mu);
    out->failed = e->failed;
    snprintf(out->reason, sizeof out->reason, "%s", e->fail_reason);
    pthread_mutex_unlock(&e->stats_mu);
}

void pg_engine_stats_get(pg_engine *e, pg_engine_stats *out) {
    pthread_mutex_lock(&e->stats_mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->stats_mu);
}
