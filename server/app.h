// server/app.h - the state of `paged serve` shared by the routes.
//
// One srv_app lives on the loop thread. It owns the HTTP server, the async
// handle the engine wakes, the live generation jobs and the metrics. The
// engine is reached only through pg_engine_submit / abort / finish_seq /
// poll.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "engine/engine.h"
#include "server/api_common.h"
#include "server/cors.h"
#include "server/http_conn.h"
#include "server/serve_metrics.h"

struct gen_job;

typedef struct srv_app {
    uv_loop_t *loop;
    pg_engine *engine;
    const pg_tokenizer *tok;
    const pg_chat_template *chat;  // NULL: /v1/chat/completions answers 400
    pg_struct_vocab *grammar_vocab;  // the vocabulary trie for structured outputs
    pg_grammar_cache *grammars;      // compiled grammars shared by requests
    srv_http *http;
    uv_async_t async;              // woken by the engine's notify callback
    api_limits lim;
    char *served_name;             // the model id clients name
    bool lora_runtime;             // /v1/load_lora_adapter and /v1/unload_lora_adapter answer
    char *model_path;
    const char *quantization;      // "none", "fp8", "int4" (pg_engine_quantization)
    char *api_key;                 // NULL: no authentication
    size_t api_key_len;
    int64_t created;               // unix time at start (for /v1/models)
    bool draining;                 // SIGTERM: new requests get 503
    bool engine_failed;            // the watchdog found the engine failed or hung: 503, exiting
    char engine_failure[320];      // why, for the 503s and 500s
    bool no_webui;                 // --no-webui: / answers 404
    bool metrics_vllm;             // --metrics-compat vllm: /metrics adds the vllm: names
    srv_cors cors;                 // --allowed-origins ...: off unless origins are given
    struct gen_job *jobs;          // live generation jobs (doubly linked)
    int n_jobs;
    int n_tokenizing;              // tokenizations and off-loop routes on the thread pool
    int n_off_loop;                // app_run_off_loop items among them
    void (*on_tokenize_idle)(struct srv_app *a);  // called when n_tokenizing drops to 0
    uint64_t next_id;              // for response ids
    uint64_t id_salt;
    srv_metrics metrics;
    pg_gen_event *evbuf;           // poll buffer
    int evcap;
} srv_app;

// Routes a complete request (auth, 404, 405, 503 while draining).
void srv_route(srv_req *r, void *app);

// Responses with a JSON body.
void app_send_json(srv_req *r, int status, const char *json, size_t len);
void app_send_error(srv_req *r, const api_error *e);
void app_send_error_msg(srv_req *r, int status, const char *param, const char *msg);

// Tokenizes texts[0..n) (BOS when `add_bos` and the model has one, special
// tokens parsed). Small inputs are encoded at once, large ones on libuv's
// thread pool so the loop never stalls. `cb` runs on the loop thread exactly
// once, maybe before this returns:
//   - r NULL: the client left meanwhile (ids NULL); free ctx, answer nothing;
//   - err set (400, e.g. a text that can never fit the model): ids NULL;
//   - else ids[i] (malloc'd: the callback keeps or frees each) and counts[i].
// The arrays themselves are freed after cb returns. `texts`, `lens` and
// `param` must stay valid until cb (they belong to ctx).
typedef void (*app_tok_cb)(srv_app *a, srv_req *r, void *ctx, int32_t **ids, const int32_t *counts,
                           const api_error *err);
void app_tokenize_async(srv_app *a, srv_req *r, const char *const *texts, const size_t *lens, int n,
                        bool add_bos, const char *param, app_tok_cb cb, void *ctx);

// A whole route as a pure function of the request body: fills `out` with
// the JSON response body and returns 0, or returns -1 with `e` set. Runs on
// any thread: it may read `a`'s immutable fields (tokenizer, chat template,
// limits, names) and nothing else.
typedef int (*app_work_fn)(srv_app *a, const char *body, size_t len, sbuf *out, api_error *e);

// At most this many app_run_off_loop items queued or running: more get 503
// with Retry-After (each holds a copy of its body, up to --max-body-bytes).
#define APP_MAX_OFF_LOOP 32

// Answers `r` with fn(body): bodies up to 16 KB at once on the loop thread,
// larger ones on libuv's thread pool (the body is copied first, so the
// connection may go away meanwhile: the answer is then dropped). Shutdown
// waits for these like tokenizations (they use the engine's tokenizer).
void app_run_off_loop(srv_app *a, srv_req *r, app_work_fn fn);
// The same, always on the pool, whatever the body's size: for fn that wait
// (a LoRA load waits for the engine thread's next pause between steps).
void app_run_on_pool(srv_app *a, srv_req *r, app_work_fn fn);

// Renders chat messages (m->json) with the model's template, with `tools`
// (a JSON array or NULL) and chat_template_kwargs `kwargs` (object or
// NULL); 400 without a template or when the template refuses.
int app_render_chat(srv_app *a, const api_messages *m, const cJSON *tools, const cJSON *kwargs,
                    bool add_generation_prompt, char **out, api_error *e);
// Whether a rendered chat prompt is tokenized with BOS added (not when the
// template writes BOS itself, as Jinja templates do).
bool app_chat_add_bos(const srv_app *a);

// Checks the "model" field against the served name (404 when unknown).
// A request's "model": the served model (or its path; NULL: the served
// model) sets *lora_id 0, a LoRA adapter loaded now its id
// (pg_engine_lora_find); anything else is a 404. lora_id may be NULL (the
// caller needs no adapter).
int app_check_model(srv_app *a, const char *model, int64_t *lora_id, api_error *e);

// "cmpl-..." style ids: prefix + 24 hex digits, unique per process.
void app_new_id(srv_app *a, const char *prefix, char *out, size_t cap);

// Route handlers.
void api_completions(srv_app *a, srv_req *r);
void api_chat_completions(srv_app *a, srv_req *r);
void api_models(srv_app *a, srv_req *r);
void api_tokenize(srv_app *a, srv_req *r);
void api_detokenize(srv_app *a, srv_req *r);
void api_health(srv_app *a, srv_req *r);
void api_version(srv_app *a, srv_req *r);
void api_metrics(srv_app *a, srv_req *r);
void api_load_lora(srv_app *a, srv_req *r);   // server/api_lora.c
void api_unload_lora(srv_app *a, srv_req *r);

