// server/cmd_serve.c - `paged serve`: flags, the loop, signals, start-up
// line and graceful shutdown.
//
// One libuv loop thread runs HTTP, validation, tokenization, detokenization
// and stop strings; the engine thread runs the model. The engine's notify
// callback is uv_async_send; the async callback drains every event.
//
// SIGTERM / SIGINT / SIGHUP: stop accepting, answer new requests 503, let
// running requests finish for up to --shutdown-timeout seconds, then abort
// what is left, close everything and exit 0. A second signal skips the wait.
// SIGHUP drains too (there is no configuration to reload): a hangup - the
// terminal or a supervisor going away - must not cut streams mid-way, which
// the default action (terminate at once) did. systemd stops with SIGTERM.
//
// Watchdog: twice a second the loop thread reads the engine's health. A
// failed step (a device error) or a step running longer than
// --step-timeout (a hung device, a deadlock) is fatal: every request in
// flight gets a 500 (or an error event and [DONE] when streaming), /health
// and new requests get 503, and about a second later the process exits
// with code 70 without joining the engine thread (it may never return), so
// a supervisor restarts it.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "server/app.h"
#include "common/parse.h"
#include "server/engine_options.h"
#include "server/cli_flags.h"
#include "server/commands.h"
#include "server/gen_job.h"
#include "server/tls.h"

#define SERVE_DEFAULT_MAX_WAITING 1024
#define SERVE_DEFAULT_STEP_TIMEOUT_S 300
#define EXIT_ENGINE_FAILED 70 // sysexits' EX_SOFTWARE

static const char *usage =
    "usage: paged serve [options]\n"
    "Run the OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions,\n"
    "/v1/models, /tokenize, /detokenize, /health, /version, /metrics, /openapi.json,\n"
    "and a chat page at /).\n"
    "Server:\n"
    "  --host HOST                   address to bind (default 127.0.0.1)\n"
    "  --port N                      port (default 8000)\n"
    "  --api-key KEY                 require Authorization: Bearer KEY on every route but\n"
    "                                /health (default: $PAGED_API_KEY; none when unset)\n"
    "  --served-model-name NAME      the model id clients use (default: the model file name)\n"
    "  --ssl-certfile FILE           serve HTTPS with this PEM certificate chain\n"
    "  --ssl-keyfile FILE            its private key (PEM; default: from --ssl-certfile)\n"
    "  --ssl-ca-certs FILE           require client certificates signed by these CAs (PEM)\n"
    "  --step-timeout S              a model step running longer than S seconds means the\n"
    "                                device hung: fail requests, exit 70 (default 300; 0: off)\n"
    "  --shutdown-timeout S          on SIGTERM/SIGINT/SIGHUP, seconds running requests may take\n"
    "                                to finish before they are aborted (default 30)\n"
    "  --no-webui                    no chat page at / (404)\n"
    "  --metrics-compat vllm         /metrics also exposes vLLM's names (vllm:...) for the\n"
    "                                families vLLM has, next to the paged: ones\n"
    "CORS (off unless --allowed-origins is given; lists are a,b or JSON '[\"a\",\"b\"]'):\n"
    "  --allowed-origins LIST        origins browsers may call from (\"*\": any)\n"
    "  --allowed-methods LIST        methods a preflight allows (default \"*\")\n"
    "  --allowed-headers LIST        request headers a preflight allows (default \"*\")\n"
    "HTTP limits:\n"
    "  --max-request-line BYTES      request URL (default 8K) -> 414\n"
    "  --max-header-bytes BYTES      header block (default 64K) -> 431\n"
    "  --max-headers N               header count (default 100) -> 431\n"
    "  --max-body-bytes BYTES        request body (default 2M) -> 413\n"
    "  --header-timeout S            headers must arrive within S seconds (default 30) -> 408\n"
    "  --body-timeout S              body must arrive within S seconds of the headers\n"
    "                                (default 60) -> 408\n"
    "  --keep-alive-timeout S        idle keep-alive connections close after S (default 75)\n"
    "  --write-timeout S             a client that reads nothing for S seconds while output\n"
    "                                is pending is dropped (default 60)\n"
    "  --max-output-buffer BYTES     unsent output per connection before the client is\n"
    "                                dropped (default 4M; reading stops at 256K)\n"
    "  --max-connections N           open connections (default 4096)\n"
    "  --max-buffered-body-bytes B   request body bytes buffered over all connections\n"
    "                                (default 256M) -> 503 + Retry-After\n"
    "Request limits:\n"
    "  --max-n N                     n per request (default 128, at most --max-num-seqs)\n"
    "  --max-sequences N             prompts x n per request (default 256)\n"
    "  --max-stop-strings N          stop strings per request (default 16)\n"
    "  --max-stop-string-bytes N     bytes per stop string (default 256)\n"
    "  --max-logprobs N              logprobs / top_logprobs cap (default 20)\n"
    "  --default-max-tokens N        chat max_tokens when a request sets none: the rest of\n"
    "                                the context, capped at N (default 4096; 0 = no cap)\n";

typedef struct serve {
    srv_app app;
    uv_signal_t sigterm, sigint, sighup;
    uv_timer_t drain_timer;
    uv_timer_t watchdog;
    double step_timeout_s;        // 0: no step timeout (failed steps are still fatal)
    bool fatal;                   // the engine failed: exiting with EXIT_ENGINE_FAILED
    uint64_t drain_deadline_ms;   // when running requests are aborted
    uint64_t abort_deadline_ms;   // when we stop waiting for the aborts
    double shutdown_timeout_s;
    bool aborted, finishing;
    int signals;
} serve;

// --- engine wake-ups ---------------------------------------------------------------

static void on_engine_notify(void *ctx) {
    srv_app *a = ctx;
    uv_async_send(&a->async);  // the one thread-safe libuv call
}

static void on_async(uv_async_t *h) {
    srv_app *a = h->data;
    // After an engine failure its requests were failed here; later events
    // (if it ever wakes) name jobs that may be gone.
    if (a->engine && !a->engine_failed) gen_drain_events(a);
}

// --- HTTP hooks --------------------------------------------------------------------

static void on_error_body(int status, const char *msg, sbuf *out, void *ctx) {
    api_error e;
    api_err(&e, status, NULL, "%s", msg);
    api_error_json(&e, out);
}

static void on_response(const char *route, int status, void *ctx) {
    srv_app *a = ctx;
    srv_metrics_http(&a->metrics, route, status);
}

// --- shutdown ---------------------------------------------------------------------

static void on_handle_closed(uv_handle_t *h) {}

static void close_engine(srv_app *a);

static void on_http_closed(void *arg) {
    serve *s = arg;
    srv_app *a = &s->app;
    a->http = NULL;
    // Tokenizations on the thread pool use the engine's tokenizer: the
    // engine goes when the last one is done.
    if (a->n_tokenizing > 0)
        a->on_tokenize_idle = close_engine;
    else
        close_engine(a);
}

static void close_engine(srv_app *a) {
    serve *s = (serve *)a;  // app is the first member
    a->on_tokenize_idle = NULL;
    // The engine thread is joined before the async handle it wakes goes away;
    // a failed engine is left to the process exit (its thread may be stuck).
    if (!s->fatal) {
        pg_engine_destroy(a->engine);
        a->engine = NULL;
        gen_free_all(a);
    }
    uv_close((uv_handle_t *)&s->watchdog, on_handle_closed);
    uv_close((uv_handle_t *)&a->async, on_handle_closed);
    uv_close((uv_handle_t *)&s->sigterm, on_handle_closed);
    uv_close((uv_handle_t *)&s->sigint, on_handle_closed);
    uv_close((uv_handle_t *)&s->sighup, on_handle_closed);
    uv_close((uv_handle_t *)&s->drain_timer, on_handle_closed);
}

static void finish(serve *s) {
    if (s->finishing) return;
    s->finishing = true;
    uv_timer_stop(&s->drain_timer);
    PG_LOGI("paged serve: stopped");
    srv_http_close(s->app.http, on_http_closed, s);
}

static void on_drain_tick(uv_timer_t *t) {
    serve *s = t->data;
    srv_app *a = &s->app;
    uint64_t now = uv_now(a->loop);
    if (a->n_jobs == 0 && a->n_tokenizing == 0 && srv_http_num_connections(a->http) == 0) {
        finish(s);
        return;
    }
    if (!s->aborted && now >= s->drain_deadline_ms) {
        PG_LOGW("paged serve: shutdown timeout: aborting %d running requests", a->n_jobs);
        s->aborted = true;
        gen_abort_all(a);
        s->abort_deadline_ms = now + 5000;
    }
    // After the abort the jobs end at once, but their last events and the
    // terminating chunk are still queued on the connections (flushed in the
    // loop's idle phase, after this timer): closing now would cut a stream
    // short of its [DONE] at a chunk boundary, which clients read as a clean
    // end. The connections close themselves once written (draining), so wait
    // for that above, up to the abort deadline.
    if (s->aborted && now >= s->abort_deadline_ms) finish(s);
}

static void on_signal(uv_signal_t *h, int signum) {
    serve *s = h->data;
    srv_app *a = &s->app;
    if (s->finishing) return;
    if (++s->signals == 1) {
        PG_LOGI("paged serve: %s: draining %d requests (up to %.0f s)", strsignal(signum), a->n_jobs,
                s->shutdown_timeout_s);
        a->draining = true;
        srv_http_drain(a->http);
        s->drain_deadline_ms = uv_now(a->loop) + (uint64_t)(s->shutdown_timeout_s * 1000);
        uv_timer_start(&s->drain_timer, on_drain_tick, 0, 20);
    } else if (!s->aborted) {
        PG_LOGW("paged serve: second signal: aborting %d requests", a->n_jobs);
        s->drain_deadline_ms = uv_now(a->loop);
    }
}

// --- watchdog -----------------------------------------------------------------------

static void on_fatal_exit(uv_timer_t *t) {
    serve *s = t->data;
    finish(s);
}

static void on_watchdog(uv_timer_t *t) {
    serve *s = t->data;
    srv_app *a = &s->app;
    if (s->fatal || s->finishing) return;
    pg_engine_health h;
    pg_engine_health_get(a->engine, &h);
    char why[256];
    if (h.failed)
        snprintf(why, sizeof why, "a model step failed (%s)", h.reason);
    else if (s->step_timeout_s > 0 && h.step_age_ns > (int64_t)(s->step_timeout_s * 1e9))
        snprintf(why, sizeof why, "a model step has not finished in %.0f s (a hung device or a deadlock)",
                 (double)h.step_age_ns * 1e-9);
    else
        return;
    PG_LOGE("paged serve: engine failed: %s; failing %d requests, /health 503, exiting with code %d", why,
            a->n_jobs, EXIT_ENGINE_FAILED);
    s->fatal = true;
    a->engine_failed = true;
    snprintf(a->engine_failure, sizeof a->engine_failure, "the engine failed: %s; the server is restarting", why);
    a->draining = true;
    gen_fail_all(a, a->engine_failure);
    // The listener stays open until the exit, so health probes see the 503.
    // A second for the error responses to be written, then out.
    uv_timer_stop(&s->drain_timer);
    uv_timer_start(&s->drain_timer, on_fatal_exit, 1000, 0);
}

// --- flags ------------------------------------------------------------------------

typedef struct serve_flags {
    const char *host;
    int port;
    const char *api_key;
    const char *served_name;
    const char *ssl_certfile, *ssl_keyfile, *ssl_ca_certs;
    double shutdown_timeout, step_timeout;
    bool no_webui, metrics_vllm;
    srv_cors cors;
    srv_http_limits http;
    api_limits api;
} serve_flags;

static int parse_seconds(const char *v, uint64_t *ms) {
    double d;
    PG_TRY(pg_parse_float(v, 0.001, 1e7, &d));
    *ms = (uint64_t)(d * 1000);
    return 0;
}

// Returns 1 when argv[*i] was a serve flag, 0 when unknown, < 0 on a bad value.
static int serve_flag(serve_flags *f, int argc, char **argv, int *i) {
    const char *name = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int64_t n, b;
#define IS(s) (!strcmp(name, s))
    if (IS("--no-webui")) {  // the one flag without a value
        f->no_webui = true;
        return 1;
    }
    if (!(IS("--host") || IS("--port") || IS("--api-key") || IS("--served-model-name") ||
          IS("--ssl-certfile") || IS("--ssl-keyfile") || IS("--ssl-ca-certs") ||
          IS("--shutdown-timeout") || IS("--step-timeout") || IS("--max-request-line") || IS("--max-header-bytes") ||
          IS("--max-headers") || IS("--max-body-bytes") || IS("--header-timeout") ||
          IS("--body-timeout") || IS("--keep-alive-timeout") || IS("--write-timeout") ||
          IS("--max-output-buffer") || IS("--max-connections") || IS("--max-buffered-body-bytes") ||
          IS("--max-n") ||
          IS("--max-sequences") || IS("--max-stop-strings") || IS("--max-stop-string-bytes") ||
          IS("--max-logprobs") || IS("--default-max-tokens") || IS("--metrics-compat") ||
          IS("--allowed-origins") || IS("--allowed-methods") || IS("--allowed-headers")))
        return 0;
    if (!v) return pg_err_set(PG_EINVAL, "%s needs a value", name);
    (*i)++;
    int rc = 0;
    if (IS("--host")) f->host = v;
    else if (IS("--port")) rc = pg_parse_int(v, 0, 65535, &n), f->port = (int)n;
    else if (IS("--api-key")) f->api_key = v;
    else if (IS("--served-model-name")) f->served_name = v;
    else if (IS("--ssl-certfile")) f->ssl_certfile = v;
    else if (IS("--ssl-keyfile")) f->ssl_keyfile = v;
    else if (IS("--ssl-ca-certs")) f->ssl_ca_certs = v;
    else if (IS("--shutdown-timeout")) rc = pg_parse_float(v, 0, 1e6, &f->shutdown_timeout);
    else if (IS("--step-timeout")) rc = pg_parse_float(v, 0, 1e7, &f->step_timeout);
    else if (IS("--metrics-compat")) {
        if (!strcmp(v, "vllm")) f->metrics_vllm = true;
        else rc = pg_err_set(PG_EINVAL, "the only value is vllm, not %s", v);
    }
    else if (IS("--allowed-origins")) rc = srv_cors_set(&f->cors, "origins", v);
    else if (IS("--allowed-methods")) rc = srv_cors_set(&f->cors, "methods", v);
    else if (IS("--allowed-headers")) rc = srv_cors_set(&f->cors, "headers", v);
    else if (IS("--max-request-line")) rc = pg_parse_bytes(v, &b), f->http.max_request_line = (size_t)b;
    else if (IS("--max-header-bytes")) rc = pg_parse_bytes(v, &b), f->http.max_header_bytes = (size_t)b;
    else if (IS("--max-headers")) rc = pg_parse_int(v, 1, 100000, &n), f->http.max_headers = (int)n;
    else if (IS("--max-body-bytes")) rc = pg_parse_bytes(v, &b), f->http.max_body = (size_t)b;
    else if (IS("--header-timeout")) rc = parse_seconds(v, &f->http.header_timeout_ms);
    else if (IS("--body-timeout")) rc = parse_seconds(v, &f->http.body_timeout_ms);
    else if (IS("--keep-alive-timeout")) rc = parse_seconds(v, &f->http.keepalive_timeout_ms);
    else if (IS("--write-timeout")) rc = parse_seconds(v, &f->http.write_timeout_ms);
    else if (IS("--max-output-buffer")) rc = pg_parse_bytes(v, &b), f->http.out_max = (size_t)b;
    else if (IS("--max-connections")) rc = pg_parse_int(v, 1, 1000000, &n), f->http.max_connections = (int)n;
    else if (IS("--max-buffered-body-bytes")) rc = pg_parse_bytes(v, &b), f->http.max_body_total = (size_t)b;
    else if (IS("--max-n")) rc = pg_parse_int(v, 1, SCHED_MAX_N, &n), f->api.max_n = (int32_t)n;
    else if (IS("--max-sequences")) rc = pg_parse_int(v, 1, 1 << 20, &n), f->api.max_seqs = (int32_t)n;
    else if (IS("--max-stop-strings")) rc = pg_parse_int(v, 0, 1024, &n), f->api.max_stop = (int32_t)n;
    else if (IS("--max-stop-string-bytes")) rc = pg_parse_int(v, 1, 1 << 16, &n), f->api.max_stop_len = (int32_t)n;
    else if (IS("--max-logprobs")) rc = pg_parse_int(v, 0, PG_MAX_LOGPROBS, &n), f->api.max_logprobs = (int32_t)n;
    else if (IS("--default-max-tokens")) rc = pg_parse_int(v, 0, INT32_MAX, &n), f->api.default_max_tokens = (int32_t)n;
#undef IS
    if (rc < 0) return pg_err_wrap(PG_EINVAL, "%s: ", name);
    return 1;
}

// "models/SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct.Q4_1"
static char *default_served_name(const char *path) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    const char *base = path;
    for (size_t i = 0; i < len; i++)
        if (path[i] == '/') base = path + i + 1;
    size_t n = (size_t)(path + len - base);
    if (n > 5 && !strncmp(base + n - 5, ".gguf", 5)) n -= 5;
    char *s = pg_xmalloc(n + 1);
    memcpy(s, base, n);
    s[n] = 0;
    return s;
}

static uint64_t random_salt(void) {
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&v, sizeof v, 1, f) != 1) v = (uint64_t)pg_now_ns() ^ ((uint64_t)getpid() << 32);
    if (f) fclose(f);
    return v;
}

// --- the command ------------------------------------------------------------------------

int cmd_serve(int argc, char **argv) {
    pg_engine_config cfg;
    pg_engine_config_default(&cfg);
    cfg.model_path = cli_default_model();
    // Bounded by default: a flood of requests queues at most this many in
    // the scheduler (each holds its prompt ids), the rest get 503 +
    // Retry-After at once. --max-waiting 0 lifts the bound.
    cfg.sched.max_waiting = SERVE_DEFAULT_MAX_WAITING;
    serve_flags f = {.host = "127.0.0.1", .port = 8000, .shutdown_timeout = 30,
                     .step_timeout = SERVE_DEFAULT_STEP_TIMEOUT_S};
    srv_http_limits_default(&f.http);
    api_limits_default(&f.api);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s%s", usage, pg_engine_options_help);
            srv_cors_free(&f.cors);
            return 0;
        }
        int r = pg_engine_option(&cfg, argc, argv, &i);
        if (r == 0) r = serve_flag(&f, argc, argv, &i);
        if (r == 0) r = pg_err_set(PG_EINVAL, "unknown flag: %s", argv[i]);
        if (r < 0) {
            fprintf(stderr, "paged serve: %s (see --help)\n", pg_err_msg());
            srv_cors_free(&f.cors);
            return 2;
        }
    }
    srv_cors_finish(&f.cors);
    // An empty key would turn authentication on with a key anyone can send
    // ("Authorization: Bearer "): refused, whether from the flag or the
    // environment (an empty PAGED_API_KEY is usually a missing secret).
    if (f.api_key && !*f.api_key) {
        fprintf(stderr, "paged serve: --api-key is empty; give a non-empty key, or leave the flag out "
                        "to serve without authentication\n");
        return 2;
    }
    if (!f.api_key) {
        const char *env = getenv("PAGED_API_KEY");
        if (env && !*env) {
            fprintf(stderr, "paged serve: PAGED_API_KEY is set but empty; set a key or unset it\n");
            return 2;
        }
        f.api_key = env;
    }
    signal(SIGPIPE, SIG_IGN);  // a closed socket is an error return, not a signal
    // TLS files are checked before the model loads: a typo fails in
    // milliseconds with the file named, not after the weights are read.
    srv_tls_ctx *tls = NULL;
    if ((f.ssl_keyfile || f.ssl_ca_certs) && !f.ssl_certfile) {
        fprintf(stderr, "paged serve: %s needs --ssl-certfile\n", f.ssl_keyfile ? "--ssl-keyfile" : "--ssl-ca-certs");
        return 2;
    }
    if (f.ssl_certfile && srv_tls_ctx_create(f.ssl_certfile, f.ssl_keyfile, f.ssl_ca_certs, &tls) < 0) {
        fprintf(stderr, "paged serve: %s\n", pg_err_msg());
        return 2;
    }

    // A following node of a multi-node tensor-parallel group serves no HTTP:
    // it runs node 0's steps on its ranks until node 0 stops.
    if (cfg.nnodes > 1 && cfg.node_rank > 0) {
        srv_tls_ctx_free(tls);
        srv_cors_free(&f.cors);
        if (pg_engine_follow(&cfg) < 0) {
            fprintf(stderr, "paged serve: %s\n", pg_err_msg());
            return 1;
        }
        return 0;
    }

    serve *s = pg_xcalloc(1, sizeof *s);
    srv_app *a = &s->app;
    uv_loop_t loop;
    uv_loop_init(&loop);
    a->loop = &loop;
    s->shutdown_timeout_s = f.shutdown_timeout;
    s->step_timeout_s = f.step_timeout;
    uv_async_init(&loop, &a->async, on_async);
    a->async.data = a;

    double t0 = pg_now_s();
    if (pg_engine_create(&cfg, on_engine_notify, a, &a->engine) < 0) {
        fprintf(stderr, "paged serve: %s\n", pg_err_msg());
        uv_close((uv_handle_t *)&a->async, NULL);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
        free(s);
        srv_tls_ctx_free(tls);
        srv_cors_free(&f.cors);
        return 1;
    }
    // vLLM's switch for the runtime routes, honoured beside the flag.
    const char *rl = getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
    if (rl && (!strcasecmp(rl, "true") || !strcmp(rl, "1"))) cfg.allow_runtime_lora_updating = cfg.enable_lora;
    a->lora_runtime = cfg.enable_lora && cfg.allow_runtime_lora_updating;
    a->tok = pg_engine_tokenizer(a->engine);
    a->chat = pg_engine_chat_template(a->engine);
    a->model_path = pg_xstrdup(cfg.model_path);
    a->quantization = pg_engine_quantization(a->engine);
    // Random (dummy) weights are named after their config ("llama3-8b-shape"),
    // not after the default model file they never read.
    const bool dummy = cfg.load_format && !strcmp(cfg.load_format, "dummy");
    a->served_name = f.served_name ? pg_xstrdup(f.served_name)
                     : dummy       ? pg_xstrdup(pg_engine_model_config(a->engine)->name)
                                   : default_served_name(cfg.model_path);
    if (f.api_key) {
        a->api_key = pg_xstrdup(f.api_key);
        a->api_key_len = strlen(f.api_key);
    }
    a->no_webui = f.no_webui;
    a->metrics_vllm = f.metrics_vllm;
    a->cors = f.cors;  // the app owns the lists from here
    a->created = (int64_t)time(NULL);
    a->id_salt = random_salt();
    a->lim = f.api;
    const pg_model_config *mc = pg_engine_model_config(a->engine);
    int32_t vocab = pg_tokenizer_vocab_size(a->tok);
    a->lim.vocab_size = mc->vocab_size > 0 && mc->vocab_size < vocab ? mc->vocab_size : vocab;
    a->lim.max_model_len = pg_engine_max_model_len(a->engine);
    int32_t max_seqs = cfg.sched.max_num_seqs > 0 ? cfg.sched.max_num_seqs : 256;
    if (a->lim.max_n > max_seqs) a->lim.max_n = max_seqs;
    if (a->lim.max_n > SCHED_MAX_N) a->lim.max_n = SCHED_MAX_N;
    a->lim.allow_priority = cfg.sched.policy == SCHED_POLICY_PRIORITY;
    srv_metrics_init(&a->metrics, a->served_name, a->lim.max_model_len);
    if (cfg.enable_lora) srv_metrics_lora_enable(&a->metrics, pg_engine_lora_slots(&cfg));
    // Structured outputs: the vocabulary trie once, and a cache of compiled
    // grammars. Compilation runs on the loop thread, so its caps are tighter
    // than the library's defaults (a few ms at worst).
    pg_grammar_limits gl;
    pg_grammar_limits_default(&gl);
    gl.max_input = 256 << 10;
    gl.max_elements = 1 << 18;
    if (pg_struct_vocab_from_tokenizer(a->tok, &a->grammar_vocab) == 0)
        a->grammars = pg_grammar_cache_create(a->grammar_vocab, &gl, 64);
    else
        PG_LOGW("paged serve: structured outputs off: %s", pg_err_msg());

    srv_http_handlers h = {.on_request = srv_route, .error_body = on_error_body,
                           .on_response = on_response, .ctx = a};
    int rc = 0;
    if (srv_http_start(&loop, f.host, f.port, &f.http, &h, &a->http) < 0) {
        fprintf(stderr, "paged serve: %s\n", pg_err_msg());
        rc = 1;
        pg_engine_destroy(a->engine);
        a->engine = NULL;
        uv_close((uv_handle_t *)&a->async, NULL);
        uv_run(&loop, UV_RUN_DEFAULT);
        goto out;
    }
    if (tls) srv_http_set_tls(a->http, tls);
    uv_signal_init(&loop, &s->sigterm);
    uv_signal_init(&loop, &s->sigint);
    uv_signal_init(&loop, &s->sighup);
    uv_timer_init(&loop, &s->drain_timer);
    uv_timer_init(&loop, &s->watchdog);
    s->sigterm.data = s->sigint.data = s->sighup.data = s->drain_timer.data = s->watchdog.data = s;
    uv_timer_start(&s->watchdog, on_watchdog, 500, 500);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sighup, on_signal, SIGHUP);

    pg_engine_stats st;
    pg_engine_stats_get(a->engine, &st);
    int64_t kv_tokens = (int64_t)(st.kv_blocks - 1) * st.block_size;
    // With KV layer groups a block holds one group's layers (the start-up
    // log's "KV layer groups" line says what a sequence takes).
    char groups[96] = "";
    if (st.kv_groups > 1)
        snprintf(groups, sizeof groups, " of %d layers in %d layer groups", st.kv_layers_per_block, st.kv_groups);
    PG_LOGI("paged serve: model %s (%s), device %s, KV cache %d blocks x %d tokens = %lld tokens%s "
            "(%.0f MiB), max model len %d, loaded in %.2f s; listening on %s://%s%s%s:%d%s%s",
            a->served_name,
            cfg.load_format && !strcmp(cfg.load_format, "dummy") ? "dummy weights" : cfg.model_path,
            pg_engine_device_name(a->engine), st.kv_blocks - 1,
            st.block_size, (long long)kv_tokens, groups, (double)st.kv_bytes / (1 << 20), a->lim.max_model_len,
            pg_now_s() - t0, tls ? "https" : "http", strchr(f.host, ':') ? "[" : "", f.host,
            strchr(f.host, ':') ? "]" : "", srv_http_port(a->http), a->api_key ? " (API key required)" : "",
            f.ssl_ca_certs ? " (client certificates required)" : "");
    if (cfg.sched.max_waiting > 0)
        PG_LOGI("paged serve: queues bounded: %d waiting requests, %.0f MiB of request bodies; "
                "beyond them 503 + Retry-After", cfg.sched.max_waiting, (double)f.http.max_body_total / (1 << 20));
    else
        PG_LOGI("paged serve: waiting requests unbounded (--max-waiting 0); request bodies bounded at %.0f MiB",
                (double)f.http.max_body_total / (1 << 20));
    fflush(stderr);

    uv_run(&loop, UV_RUN_DEFAULT);
    if (s->fatal) rc = EXIT_ENGINE_FAILED;
out:
    srv_metrics_free(&a->metrics);
    if (uv_loop_close(&loop) != 0) PG_LOGW("paged serve: handles left open at exit");
    free(a->evbuf);
    pg_grammar_cache_free(a->grammars);
    pg_struct_vocab_free(a->grammar_vocab);
    free(a->served_name);
    free(a->model_path);
    free(a->api_key);
    srv_cors_free(&a->cors);
    free(s);
    srv_tls_ctx_free(tls);
    return rc;
}
