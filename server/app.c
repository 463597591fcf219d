// server/app.c - helpers shared by the routes: JSON responses, errors,
// tokenization, chat rendering, ids, and draining engine events.
#include "server/app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

void app_send_json(srv_req *r, int status, const char *json, size_t len) {
    srv_resp_send(r, status, "application/json", NULL, json ? json : "", json ? len : 0);
}

void app_send_error(srv_req *r, const api_error *e) {
    sbuf b = {0};
    api_error_json(e, &b);
    const char *extra = e->status == 401   ? "WWW-Authenticate: Bearer\r\n"
                        : e->status == 503 ? "Retry-After: 1\r\n"
                                           : NULL;
    srv_resp_send(r, e->status, "application/json", extra, b.p, b.len);
    sbuf_free(&b);
}

void app_send_error_msg(srv_req *r, int status, const char *param, const char *msg) {
    api_error e;
    api_err(&e, status, param, "%s", msg);
    app_send_error(r, &e);
}

// --- tokenization -------------------------------------------------------------------
// Small prompts are encoded on the loop thread (microseconds); large ones on
// libuv's thread pool (the tokenizer is immutable and thread-safe), so a
// 500 KB prompt never stalls the other streams.

#define TOKENIZE_INLINE_BYTES (16u << 10)

typedef struct tok_batch {
    uv_work_t work;
    srv_app *a;
    srv_req *req;              // NULL once the client left
    const char *const *texts;  // [n] borrowed from ctx
    const size_t *lens;
    int n;
    bool add_bos;
    const char *param;
    int32_t **ids;             // [n] results
    int32_t *counts;
    int failed;                // index + 1 of a text that failed
    char err[256];
    app_tok_cb cb;
    void *ctx;
} tok_batch;

// Encodes texts[i] into ids[i]; any thread.
static void tok_run(tok_batch *b) {
    const pg_tokenizer *tok = b->a->tok;
    for (int i = 0; i < b->n && !b->failed; i++) {
        int got = pg_tokenizer_encode_alloc(tok, b->texts[i], b->lens[i], b->add_bos, true, &b->ids[i]);
        if (got < 0) {
            snprintf(b->err, sizeof b->err, "%s", pg_err_msg());
            b->failed = i + 1;
            break;
        }
        b->counts[i] = got;
    }
}

static void tok_finish(tok_batch *b) {
    api_error e, *err = NULL;
    if (b->failed || !b->req) {
        if (b->failed) {
            api_err(&e, 400, b->param, "cannot tokenize the input: %s", b->err);
            err = &e;
        }
        for (int i = 0; i < b->n; i++) free(b->ids[i]), b->ids[i] = NULL;
    }
    b->cb(b->a, b->req, b->ctx, err || !b->req ? NULL : b->ids, b->counts, err);
    free(b->ids);
    free(b->counts);
    free(b);
}

static void tok_work(uv_work_t *w) { tok_run((tok_batch *)w); }

static void tok_on_abort(srv_req *r, void *ud) { ((tok_batch *)ud)->req = NULL; }

static void tok_after(uv_work_t *w, int status) {
    tok_batch *b = (tok_batch *)w;
    srv_app *a = b->a;
    if (b->req) {
        b->req->on_abort = NULL;
        b->req->ud = NULL;
    }
    tok_finish(b);
    // The tokenizer belongs to the engine: shutdown waits for this.
    if (--a->n_tokenizing == 0 && a->on_tokenize_idle) a->on_tokenize_idle(a);
}

void app_tokenize_async(srv_app *a, srv_req *r, const char *const *texts, const size_t *lens, int n,
                        bool add_bos, const char *param, app_tok_cb cb, void *ctx) {
    tok_batch *b = pg_xcalloc(1, sizeof *b);
    b->a = a;
    b->req = r;
    b->texts = texts;
    b->lens = lens;
    b->n = n;
    b->add_bos = add_bos;
    b->param = param;
    b->ids = pg_xcalloc((size_t)(n ? n : 1), sizeof(int32_t *));
    b->counts = pg_xcalloc((size_t)(n ? n : 1), sizeof(int32_t));
    b->cb = cb;
    b->ctx = ctx;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        // No token is longer than the longest vocabulary entry: a text with
        // more bytes than that times the model length can never fit.
        size_t lim = (size_t)a->lim.max_model_len * (size_t)pg_tokenizer_max_token_bytes(a->tok) + 64;
        if (lens[i] > lim) {
            api_error e;
            api_err(&e, 400, param,
                    "This model's maximum context length is %d tokens. However, your request is "
                    "%zu bytes long. Please reduce the length of the input.",
                    a->lim.max_model_len, lens[i]);
            cb(a, r, ctx, NULL, NULL, &e);
            free(b->ids);
            free(b->counts);
            free(b);
            return;
        }
        total += lens[i];
    }
    if (total <= TOKENIZE_INLINE_BYTES) {
        tok_run(b);
        tok_finish(b);
        return;
    }
    r->on_abort = tok_on_abort;
    r->ud = b;
    int rc = uv_queue_work(a->loop, &b->work, tok_work, tok_after);
    if (rc < 0) {  // no thread pool: encode here
        r->on_abort = NULL;
        r->ud = NULL;
        tok_run(b);
        tok_finish(b);
        return;
    }
    a->n_tokenizing++;
}

// --- whole routes on the thread pool --------------------------------------------------

typedef struct off_loop {
    uv_work_t work;
    srv_app *a;
    srv_req *req;              // NULL once the client left
    app_work_fn fn;
    char *body;                // a copy: the connection's buffer may go first
    size_t len;
    int rc;
    sbuf out;
    api_error err;
} off_loop;

static void off_loop_work(uv_work_t *w) {
    off_loop *o = (off_loop *)w;
    o->rc = o->fn(o->a, o->body, o->len, &o->out, &o->err);
}

static void off_loop_on_abort(srv_req *r, void *ud) { ((off_loop *)ud)->req = NULL; }

static void off_loop_answer(srv_req *r, int rc, const sbuf *out, const api_error *e) {
    if (rc < 0)
        app_send_error(r, e);
    else
        app_send_json(r, 200, out->p, out->len);
}

static void off_loop_after(uv_work_t *w, int status) {
    off_loop *o = (off_loop *)w;
    srv_app *a = o->a;
    if (o->req) {
        o->req->on_abort = NULL;
        o->req->ud = NULL;
        off_loop_answer(o->req, o->rc, &o->out, &o->err);
    }
    sbuf_free(&o->out);
    free(o->body);
    free(o);
    a->n_off_loop--;
    if (--a->n_tokenizing == 0 && a->on_tokenize_idle) a->on_tokenize_idle(a);
}

void app_run_off_loop(srv_app *a, srv_req *r, app_work_fn fn) {
    if (r->body_len <= TOKENIZE_INLINE_BYTES) {
        sbuf out = {0};
        api_error e;
        int rc = fn(a, r->body, r->body_len, &out, &e);
        off_loop_answer(r, rc, &out, &e);
        sbuf_free(&out);
        return;
    }
    app_run_on_pool(a, r, fn);
}

void app_run_on_pool(srv_app *a, srv_req *r, app_work_fn fn) {
    if (a->n_off_loop >= APP_MAX_OFF_LOOP) {
        app_send_error_msg(r, 503, NULL, "the server is busy: too many large requests in progress");
        return;
    }
    off_loop *o = pg_xcalloc(1, sizeof *o);
    o->a = a;
    o->req = r;
    o->fn = fn;
    o->len = r->body_len;
    o->body = pg_xmalloc(o->len + 1);
    memcpy(o->body, r->body, o->len);
    o->body[o->len] = 0;
    if (uv_queue_work(a->loop, &o->work, off_loop_work, off_loop_after) < 0) {
        free(o->body);
        free(o);
        app_send_error_msg(r, 503, NULL, "the server is busy: no worker thread");
        return;
    }
    r->on_abort = off_loop_on_abort;
    r->ud = o;
    a->n_off_loop++;
    a->n_tokenizing++;
}

int app_render_chat(srv_app *a, const api_messages *m, const cJSON *tools, const cJSON *kwargs,
                    bool add_generation_prompt, char **out, api_error *e) {
    *out = NULL;
    if (!a->chat)
        return api_err(e, 400, "messages",
                       "this model has no chat template paged can render; start the server with "
                       "--chat-template chatml|llama3|llama2|mistral");
    pg_chat_render_opts o = {.tools = tools, .kwargs = kwargs, .add_generation_prompt = add_generation_prompt};
    if (pg_chat_template_render(a->chat, m->json, &o, out) < 0)
        return api_err(e, 400, "messages", "%s", pg_err_msg());
    return 0;
}

bool app_chat_add_bos(const srv_app *a) {
    return pg_tokenizer_add_bos(a->tok) && !(a->chat && pg_chat_template_renders_bos(a->chat));
}

int app_check_model(srv_app *a, const char *model, int64_t *lora_id, api_error *e) {
    if (lora_id) *lora_id = 0;
    if (!model || !strcmp(model, a->served_name) || !strcmp(model, a->model_path)) return 0;
    const int64_t uid = pg_engine_lora_find(a->engine, model);
    if (uid > 0) {
        if (lora_id) *lora_id = uid;
        return 0;
    }
    return api_err(e, 404, "model", "The model `%.200s` does not exist.", model);
}

void app_new_id(srv_app *a, const char *prefix, char *out, size_t cap) {
    // splitmix64 over a per-process salt and a counter: unique and not
    // guessable across restarts.
    uint64_t z = a->id_salt + 0x9E3779B97F4A7C15ull * ++a->next_id;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)z,
             (unsigned long long)(a->next_id & 0xffffffffu));
}
