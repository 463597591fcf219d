// engine/engine.c - the engine thread.
#include "engine/engine.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "engine/gguf.h"
#include "engine/llama_dummy.h"
#include "engine/runner.h"
#include "engine/runner_cuda.h"

#define DEFAULT_CPU_KV_BYTES ((int64_t)2 << 30)
#define DEFAULT_GPU_MEMORY_UTILIZATION 0.9
#define DEFAULT_GPU_SWAP_BYTES ((int64_t)4 << 30) // --preemption-mode swap without --swap-space (vLLM's)

// A submission: a new request, an abort or an early finish of one sequence.
typedef enum { SUB_ADD, SUB_ABORT, SUB_FINISH_SEQ } sub_kind;

typedef struct sub {
    sub_kind kind;
    int64_t id;
    int32_t seq_index;
    pg_gen_request req;   // SUB_ADD: prompt points to memory owned by the sub
    struct sub *next;
} sub;

// Per live request on the engine side: the submitter's pointer.
typedef struct live {
    int64_t id;
    void *user;
    struct live *next;
} live;

#define LIVE_BUCKETS 1024

struct pg_engine {
    pg_engine_config cfg;
    pg_llama *model;
    pg_backend *backend;
    pg_tokenizer *tok;
    pg_chat_template *chat;
    pg_runner *runner;           // CPU
    pg_cuda_runner *cuda;        // GPU (then runner and backend are NULL)
    sched *sched;
    bool async;                  // plan step N + 1 while step N runs (sched.h, async scheduling)
    int32_t max_model_len;
    int32_t kv_blocks;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    sub *subs_head, *subs_tail;  // guarded by mu
    int64_t next_id;             // guarded by mu

    // Events published by the engine thread, drained by pg_engine_poll.
    pthread_mutex_t ev_mu;
    pg_gen_event *events;
    int n_events, cap_events, ev_head;
    pg_engine_notify_fn notify;
    void *notify_ctx;

    live *live[LIVE_BUCKETS];    // engine thread only

    pthread_mutex_t stats_mu;
    pg_engine_stats stats;
    int64_t mem_polled_ns; // engine thread: when device memory was last read (GPU)
    int64_t last_end_ns;   // engine thread: when the last step was finished (busy time)
};

void pg_engine_config_default(pg_engine_config *c) {
    memset(c, 0, sizeof *c);
    c->device = "cpu";
    sched_config_default(&c->sched);
}

// --- live request map (engine thread) --------------------------------------------

static void live_put(pg_engine *e, int64_t id, void *user) {
    live *l = pg_xmalloc(sizeof *l);
    l->id = id;
    l->user = user;
    l->next = e->live[id % LIVE_BUCKETS];
    e->live[id % LIVE_BUCKETS] = l;
}

static void *live_get(pg_engine *e, int64_t id, bool remove) {
    for (live **p = &e->live[id % LIVE_BUCKETS]; *p; p = &(*p)->next) {
        if ((*p)->id != id) continue;
        live *l = *p;
        void *user = l->user;
        if (remove) {
            *p = l->next;
            free(l);
        }
        return user;
    }
    return NULL;
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

static void apply_submissions(pg_engine *e, sub *list) {
    while (list) {
        sub *s = list;
        list = s->next;
        if (s->kind == SUB_ADD) {
            sched_request r = {.id = s->id, .prompt = s->req.prompt, .n_prompt = s->req.n_prompt,
                               .sp = &s->req.sp, .priority = s->req.priority,
                               .arrival_ns = pg_now_ns(),
                               .eos_id = e->model->cfg.n_eos ? e->model->cfg.eos_ids[0] : -1};
            int rc = sched_add_request(e->sched, &r);
            if (rc < 0)
                reject(e, s, rc, pg_err_msg());
            else
                live_put(e, s->id, s->req.user);
            free((void *)s->req.prompt);
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
    bool begun;        // the runner has it (an end or held outputs follow)
    bool failed;       // begin failed: resolved with no output
    int32_t n_seqs;    // the plan's sequences and tokens (statistics)
    int32_t n_tokens;
    int64_t t_begin;
    pg_seq_output *held; // CPU: the outputs, copied (the runner reuses its buffer)
    int32_t n_held, cap_held;
} open_step;

// Gives the plan to the runner: the GPU queues it; the CPU runs it now and
// its outputs are held until the step is finished.
static void step_begin(pg_engine *e, const pg_batch_plan *plan, open_step *st) {
    st->begun = st->failed = false;
    st->n_seqs = plan->n_seqs;
    st->n_tokens = plan->n_tokens;
    st->n_held = 0;
    st->t_begin = pg_now_ns();
    // A plan may hold only block moves (a swap-out with nothing
    // scheduled): those run too.
    if (plan->n_seqs == 0 && plan->n_swap_out == 0 && plan->n_swap_in == 0 && plan->n_copies == 0)
        return;
    int rc;
    if (e->cuda) {
        rc = pg_cuda_runner_begin(e->cuda, plan);
    } else {
        pg_step_output so = {0, NULL};
        rc = pg_runner_execute(e->runner, plan, &so);
        if (rc == 0 && so.n > st->cap_held) {
            st->cap_held = so.n * 2;
            st->held = pg_xrealloc(st->held, sizeof(pg_seq_output) * (size_t)st->cap_held);
        }
        if (rc == 0 && so.n) memcpy(st->held, so.outs, sizeof(pg_seq_output) * (size_t)so.n);
        st->n_held = so.n;
    }
    if (rc < 0) {
        PG_LOGE("step failed: %s", pg_err_msg());
        st->failed = true; // every request of the plan finishes with an error
        return;
    }
    st->begun = true;
}

// Waits for the step's outputs, hands them to the scheduler and publishes
// the events; statistics.
static void step_finish(pg_engine *e, open_step *st, pg_gen_event **out, int *cap_out) {
    pg_step_output so = {0, NULL};
    const pg_step_output *sop = &so;
    if (st->failed) {
        sop = NULL;
    } else if (st->begun && e->cuda) {
        if (pg_cuda_runner_end(e->cuda, &so) < 0) {
            PG_LOGE("step failed: %s", pg_err_msg());
            sop = NULL;
        }
    } else if (st->begun) {
        so = (pg_step_output){st->n_held, st->held};
    }
    int64_t t1 = pg_now_ns();
    // Memory for /metrics: the CPU workspace grows with the largest step;
    // on the GPU lazily captured graphs and other processes move the
    // numbers (cudaMemGetInfo, read at most once a second).
    pg_cuda_mem_stats gm;
    bool gm_new = e->cuda && t1 - e->mem_polled_ns >= 1000000000LL;
    if (gm_new) {
        pg_cuda_runner_mem(e->cuda, &gm);
        e->mem_polled_ns = t1;
    }
    sched_events evs;
    if (sched_resolve(e->sched, sop, &evs) < 0) PG_LOGE("scheduler update: %s", pg_err_msg());
    if (evs.n > *cap_out) {
        *cap_out = evs.n * 2;
        *out = pg_xrealloc(*out, sizeof(pg_gen_event) * (size_t)*cap_out);
    }
    for (int i = 0; i < evs.n; i++) {
        pg_gen_event *g = &(*out)[i];
        memset(g, 0, sizeof *g);
        g->ev = evs.ev[i];
        g->user = live_get(e, evs.ev[i].req_id, evs.ev[i].req_finished);
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
    if (e->runner) e->stats.workspace_bytes = (int64_t)pg_runner_workspace_bytes(e->runner);
    if (gm_new) {
        e->stats.graph_bytes = gm.graphs;
        e->stats.other_bytes = gm.other;
        e->stats.gpu_free_bytes = gm.free;
        e->stats.workspace_bytes = gm.workspace;
    }
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
        while (!e->stop && !e->subs_head && !sched_has_work(e->sched))
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        sub *list = e->subs_head;
        e->subs_head = e->subs_tail = NULL;
        pthread_mutex_unlock(&e->mu);
        apply_submissions(e, list);
        if (prev && !sched_can_run_ahead(e->sched)) {
            step_finish(e, prev, &out, &cap_out);
            prev = NULL;
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
        step_begin(e, plan, cur);
        if (prev) step_finish(e, prev, &out, &cap_out); // the step before, while this one runs
        prev = NULL;
        if (sched_advance(e->sched) < 0) PG_LOGE("scheduler advance: %s", pg_err_msg());
        if (e->async && cur->begun)
            prev = cur;
        else
            step_finish(e, cur, &out, &cap_out);
    }
    if (prev) step_finish(e, prev, &out, &cap_out); // nothing left running on the device
    free(steps[0].held);
    free(steps[1].held);
    free(out);
    return NULL;
}

static void enqueue(pg_engine *e, sub *s) {
    pthread_mutex_lock(&e->mu);
    if (e->subs_tail)
        e->subs_tail->next = s;
    else
        e->subs_head = s;
    e->subs_tail = s;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int64_t pg_engine_submit(pg_engine *e, const pg_gen_request *req) {
    sub *s = pg_xcalloc(1, sizeof *s);
    s->kind = SUB_ADD;
    s->req = *req;
    int32_t *ids = pg_xmalloc(sizeof(int32_t) * (size_t)(req->n_prompt > 0 ? req->n_prompt : 1));
    if (req->n_prompt > 0) memcpy(ids, req->prompt, sizeof(int32_t) * (size_t)req->n_prompt);
    s->req.prompt = ids;
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

// --- set-up --------------------------------------------------------------------------

static bool is_dummy(const pg_engine_config *c) { return c->load_format && !strcmp(c->load_format, "dummy"); }

// Where the tokenizer (and the model's chat template) come from: --tokenizer,
// else the model file or directory; NULL for a dummy model without one.
static const char *tokenizer_source(const pg_engine *e) {
    if (e->cfg.tokenizer) return e->cfg.tokenizer;
    return is_dummy(&e->cfg) ? NULL : e->cfg.model_path;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int load_tokenizer(pg_engine *e) {
    const char *path = tokenizer_source(e);
    if (!path) {
        // A dummy model without --tokenizer: bytes plus placeholder ids
        // (benchmarks send token ids; generated ids print as <tN>).
        PG_LOGW("no --tokenizer for the dummy model: using a synthetic byte-level tokenizer over its %d ids",
                e->model->cfg.vocab_size);
        return pg_tokenizer_synthetic_bytes(e->model->cfg.vocab_size, &e->tok);
    }
    if (ends_with(path, ".json") && !pg_is_dir(path)) { // a tokenizer.json file
        char *dir = pg_xstrdup(path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        char *tc = pg_path_join(slash ? dir : ".", "tokenizer_config.json");
        int rc = pg_tokenizer_from_hf(path, pg_file_exists(tc) ? tc : NULL, &e->tok);
        free(tc);
        free(dir);
        return rc;
    }
    if (pg_is_dir(path)) {
        char *tj = pg_path_join(path, "tokenizer.json");
        char *tc = pg_path_join(path, "tokenizer_config.json");
        int rc = pg_tokenizer_from_hf(tj, pg_file_exists(tc) ? tc : NULL, &e->tok);
        free(tj);
        free(tc);
        return rc;
    }
    gguf_file *f;
    PG_TRY(gguf_open(path, &f));
    int rc = pg_tokenizer_from_gguf(f, &e->tok);
    gguf_close(f);
    return rc;
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
    int rc;
    const char *dev = cfg->device ? cfg->device : "cpu";
    bool use_cuda = false;
    if (!strcmp(dev, "cuda") || !strcmp(dev, "auto")) {
        char why[160] = "";
        int n_gpu = pg_cuda_runner_probe(why, sizeof why);
        if (n_gpu > 0) {
            use_cuda = true;
        } else if (!strcmp(dev, "cuda")) {
            rc = pg_err_set(PG_EUNSUPP, "--device cuda: %s", why);
            goto fail;
        } else {
            PG_LOGI("--device auto: %s; running on the CPU", why);
        }
    } else if (strcmp(dev, "cpu")) {
        rc = pg_err_set(PG_EUNSUPP, "device '%s' is not known (cpu, cuda, auto)", dev);
        goto fail;
    }
    // KV cache element type: auto = the device's native one (bf16 / f32).
    const char *kvd = cfg->kv_cache_dtype ? cfg->kv_cache_dtype : "auto";
    const bool kv_fp8 = !strcmp(kvd, "fp8");
    if (strcmp(kvd, "auto") && strcmp(kvd, "bf16") && !kv_fp8) {
        rc = pg_err_set(PG_EINVAL, "KV cache dtype '%s' is not known (auto, bf16, fp8)", kvd);
        goto fail;
    }
    if (!use_cuda && strcmp(kvd, "auto")) {
        rc = pg_err_set(PG_EUNSUPP, "--kv-cache-dtype %s needs --device cuda: the CPU backend's KV cache is f32 "
                        "(use auto)", kvd);
        goto fail;
    }
    // Async scheduling: auto = on with the GPU (the host plans the next step
    // while the device runs this one); on the CPU the same thread does both,
    // so it only adds a discarded token per finished sequence.
    const char *asy = cfg->async_scheduling ? cfg->async_scheduling : "auto";
    if (strcmp(asy, "auto") && strcmp(asy, "on") && strcmp(asy, "off")) {
        rc = pg_err_set(PG_EINVAL, "async scheduling '%s' is not known (auto, on, off)", asy);
        goto fail;
    }
    e->async = !strcmp(asy, "on") || (!strcmp(asy, "auto") && use_cuda);
    if (cfg->load_format && strcmp(cfg->load_format, "auto") && !is_dummy(cfg)) {
        rc = pg_err_set(PG_EINVAL, "load format '%s' is not known (auto, dummy)", cfg->load_format);
        goto fail;
    }
    if (is_dummy(cfg)) {
        if (!use_cuda) {
            rc = pg_err_set(PG_EUNSUPP, "--load-format dummy generates its weights on the GPU; it needs "
                            "--device cuda (or auto with a GPU)");
            goto fail;
        }
        if ((rc = pg_llama_dummy(cfg->hf_config, &e->model)) < 0) goto fail;
    } else if ((rc = pg_llama_load(cfg->model_path, &e->model)) < 0) {
        goto fail;
    }
    if ((rc = load_tokenizer(e)) < 0) goto fail;
    if ((rc = pg_chat_template_load(e->cfg.chat_template, tokenizer_source(e), e->tok, &e->chat)) < 0) goto fail;
    if (!use_cuda) {
        if ((rc = pg_backend_cpu_create(cfg->n_threads, &e->backend)) < 0) goto fail;
        e->backend->matmul_mode = cfg->matmul_mode;
    }

    const pg_model_config *mc = &e->model->cfg;
    sched_config sc = cfg->sched;
    if (sc.block_size <= 0) sc.block_size = 16;
    e->max_model_len = cfg->max_model_len > 0 ? cfg->max_model_len : mc->max_pos;
    if (e->max_model_len > mc->max_pos)
        PG_LOGW("max model length %d is beyond the model's %d positions", e->max_model_len, mc->max_pos);
    size_t per_block;
    int64_t kv_bytes;
    pg_cuda_mem_stats gm;
    memset(&gm, 0, sizeof gm);
    if (use_cuda) {
        // Weights and workspace first (the profiling step measures the
        // workspace), then the KV pool from what the utilization leaves.
        pg_cuda_runner_config cc = {
            .device = 0, .block_size = sc.block_size, .max_num_seqs = sc.max_num_seqs,
            .max_num_batched_tokens = sc.max_num_batched_tokens, .max_model_len = e->max_model_len,
            .dummy_weights = is_dummy(cfg), .dummy_seed = 0x5eedull, .dummy_std = 0.02f,
        };
        if (kv_fp8) cc.kv_dtype = PG_KV_FP8_E4M3;
        const char *gmode = cfg->cuda_graphs ? cfg->cuda_graphs : "on";
        if (!strcmp(gmode, "off"))
            cc.graphs = PG_CUDA_GRAPHS_OFF;
        else if (!strcmp(gmode, "lazy"))
            cc.graphs = PG_CUDA_GRAPHS_LAZY;
        else if (strcmp(gmode, "on")) {
            rc = pg_err_set(PG_EINVAL, "cuda graphs '%s' is not known (on, off, lazy)", gmode);
            goto fail;
        }
        if ((rc = pg_cuda_runner_create(e->model, &cc, &e->cuda)) < 0) goto fail;
        pg_cuda_runner_mem(e->cuda, &gm);
        per_block = pg_cuda_runner_kv_bytes_per_block(mc, sc.block_size, cc.kv_dtype);
        double util = cfg->gpu_memory_utilization > 0 ? cfg->gpu_memory_utilization : DEFAULT_GPU_MEMORY_UTILIZATION;
        // Everything in use now (weights, workspace, context, other
        // processes) counts against the utilization budget, as in vLLM, and
        // so do the CUDA graphs captured after the pool is allocated.
        int64_t budget = (int64_t)(util * (double)gm.total) - (gm.total - gm.free) - gm.graphs_reserved;
        kv_bytes = cfg->kv_cache_bytes > 0 ? cfg->kv_cache_bytes : budget;
        if (kv_bytes < (int64_t)per_block * 2) {
            rc = pg_err_set(PG_ENOMEM,
                            "no device memory left for the KV cache: %.2f GiB total, %.2f GiB in use after the "
                            "weights (%.2f GiB) and workspace (%.2f GiB) at --gpu-memory-utilization %.2f; raise "
                            "it, or lower --max-num-batched-tokens / --max-num-seqs",
                            (double)gm.total / (1 << 30), (double)(gm.total - gm.free) / (1 << 30),
                            (double)gm.weights / (1 << 30), (double)gm.workspace / (1 << 30), util);
            goto fail;
        }
    } else {
        per_block = pg_runner_kv_bytes_per_block(e->model, sc.block_size);
        kv_bytes = cfg->kv_cache_bytes > 0 ? cfg->kv_cache_bytes : DEFAULT_CPU_KV_BYTES;
    }
    int64_t kv_blocks64 = cfg->kv_blocks > 0 ? cfg->kv_blocks : kv_bytes / (int64_t)per_block;
    e->kv_blocks = kv_blocks64 > INT32_MAX ? INT32_MAX : (int32_t)kv_blocks64;
    int32_t host_blocks = cfg->swap_bytes > 0 ? (int32_t)(cfg->swap_bytes / (int64_t)per_block) : 0;
    if (sc.preemption_mode == SCHED_PREEMPT_SWAP && host_blocks == 0) {
        host_blocks = e->kv_blocks;
        // On the GPU the device pool is far larger than sensible pinned memory.
        if (use_cuda && (int64_t)host_blocks * (int64_t)per_block > DEFAULT_GPU_SWAP_BYTES)
            host_blocks = (int32_t)(DEFAULT_GPU_SWAP_BYTES / (int64_t)per_block);
    }
    // A pool that cannot hold one sequence of the full model length is a
    // configuration error, reported with what would fit.
    int32_t need = (e->max_model_len + sc.block_size - 1) / sc.block_size + 1;
    if (e->kv_blocks < need) {
        rc = pg_err_set(PG_EINVAL,
                        "KV cache of %d blocks (%d tokens) cannot hold one sequence of max model "
                        "length %d; lower --max-model-len to %d or give the cache at least %zu MiB",
                        e->kv_blocks, (e->kv_blocks - 1) * sc.block_size, e->max_model_len,
                        (e->kv_blocks - 1) * sc.block_size, ((size_t)need * per_block) >> 20);
        goto fail;
    }
    sc.num_blocks = e->kv_blocks;
    sc.num_host_blocks = host_blocks;
    sc.max_model_len = e->max_model_len;
    if (use_cuda) {
        if ((rc = pg_cuda_runner_alloc_kv(e->cuda, e->kv_blocks, host_blocks)) < 0) goto fail;
        pg_cuda_runner_mem(e->cuda, &gm);
    } else {
        pg_runner_config rcfg = {e->kv_blocks, host_blocks, sc.block_size};
        if ((rc = pg_runner_create(e->model, e->backend, &rcfg, &e->runner)) < 0) goto fail;
    }
    if ((rc = sched_create(&sc, &e->sched)) < 0) goto fail;
    e->cfg.sched = sc;
    e->stats.kv_blocks = e->kv_blocks;
    e->stats.block_size = sc.block_size;
    e->stats.kv_bytes = (int64_t)per_block * e->kv_blocks;
    e->stats.weight_bytes = (int64_t)e->model->weight_bytes;
    if (use_cuda) {
        e->stats.on_gpu = true;
        e->stats.weight_bytes = gm.weights;
        e->stats.kv_bytes = gm.kv;
        e->stats.workspace_bytes = gm.workspace;
        e->stats.graph_bytes = gm.graphs;
        e->stats.other_bytes = gm.other;
        e->stats.gpu_total_bytes = gm.total;
        e->stats.gpu_free_bytes = gm.free;
        e->stats.host_swap_bytes = gm.host_swap;
    }
    sched_stats_get(e->sched, &e->stats.sched);
    PG_LOGI("model %s (%s): %d layers, hidden %d, %d/%d heads, vocab %d; weights %.1f MiB",
            mc->name[0] ? mc->name : cfg->model_path, mc->arch, mc->n_layers, mc->hidden, mc->n_heads,
            mc->n_kv_heads, mc->vocab_size, (double)e->model->weight_bytes / (1 << 20));
    if (use_cuda) {
        const double G = 1 << 30;
        PG_LOGI("device %s", gm.device);
        PG_LOGI("device memory: total %.2f GiB = weights %.2f + KV cache %.2f + workspace %.2f (profiled at "
                "%d tokens / %d sequences; buffers %.2f) + graphs %.2f + other %.2f + free %.2f GiB",
                gm.total / G, gm.weights / G, gm.kv / G, gm.workspace / G, sc.max_num_batched_tokens,
                sc.max_num_seqs, gm.workspace_buffers / G, gm.graphs / G, gm.other / G, gm.free / G);
        PG_LOGI("KV cache on cuda: %d blocks x %d tokens = %lld tokens (%.2f GiB, %s, %zu KiB per block); "
                "swap %d blocks (%.2f GiB pinned); max model length %d",
                e->kv_blocks - 1, sc.block_size, (long long)(e->kv_blocks - 1) * sc.block_size, gm.kv / G,
                kv_fp8 ? "fp8 e4m3" : "bf16", per_block >> 10, host_blocks, gm.host_swap / G, e->max_model_len);
    } else {
        PG_LOGI("KV cache on %s: %d blocks x %d tokens = %d tokens (%.1f MiB, f32); swap %d blocks; "
                "max model length %d",
                e->backend->name, e->kv_blocks - 1, sc.block_size, (e->kv_blocks - 1) * sc.block_size,
                (double)e->stats.kv_bytes / (1 << 20), host_blocks, e->max_model_len);
    }
    PG_LOGI("async scheduling %s", e->async ? "on (the next step is planned while one runs)" : "off");
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        rc = pg_err_set(PG_ENOMEM, "cannot start the engine thread");
        goto fail;
    }
    *out = e;
    return 0;
fail:
    pg_engine_destroy(e);
    return rc;
}

void pg_engine_destroy(pg_engine *e) {
    if (!e) return;
    if (e->thread) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    for (sub *s = e->subs_head; s;) {
        sub *n = s->next;
        if (s->kind == SUB_ADD) free((void *)s->req.prompt);
        free(s);
        s = n;
    }
    for (int i = 0; i < LIVE_BUCKETS; i++)
        for (live *l = e->live[i]; l;) {
            live *n = l->next;
            free(l);
            l = n;
        }
    sched_destroy(e->sched);
    pg_runner_free(e->runner);
    pg_cuda_runner_free(e->cuda);
    if (e->backend) e->backend->destroy(e->backend);
    pg_chat_template_free(e->chat);
    pg_tokenizer_free(e->tok);
    pg_llama_free(e->model);
    free(e->events);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->ev_mu);
    pthread_mutex_destroy(&e->stats_mu);
    free(e);
}

const pg_tokenizer *pg_engine_tokenizer(const pg_engine *e) { return e->tok; }
const pg_chat_template *pg_engine_chat_template(const pg_engine *e) { return e->chat; }
const pg_model_config *pg_engine_model_config(const pg_engine *e) { return &e->model->cfg; }
int32_t pg_engine_max_model_len(const pg_engine *e) { return e->max_model_len; }
const char *pg_engine_device_name(const pg_engine *e) { return e->cuda ? "cuda" : e->backend->name; }

void pg_engine_stats_get(pg_engine *e, pg_engine_stats *out) {
    pthread_mutex_lock(&e->stats_mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->stats_mu);
}
