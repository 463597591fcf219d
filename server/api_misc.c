// server/api_misc.c - the small routes: /health, /version, /v1/models,
// /tokenize, /detokenize, /metrics (the chat page and /openapi.json are
// in webui.c and openapi.c).
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "server/api_format.h"
#include "server/app.h"

#ifndef PAGED_VERSION
#define PAGED_VERSION "0.1.0"
#endif

static void send_cjson(srv_req *r, int status, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    app_send_json(r, status, s, strlen(s));
    free(s);
    cJSON_Delete(o);
}

void api_health(srv_app *a, srv_req *r) { srv_resp_send(r, 200, NULL, NULL, "", 0); }

void api_version(srv_app *a, srv_req *r) {
    static const char body[] = "{\"version\":\"" PAGED_VERSION "\"}";
    app_send_json(r, 200, body, sizeof body - 1);
}

typedef struct {
    srv_app *a;
    cJSON *data;
} lora_listing;

static void list_lora(void *ctx, const char *name, const char *path) {
    lora_listing *ll = ctx;
    cJSON *l = cJSON_CreateObject();
    cJSON_AddStringToObject(l, "id", name);
    cJSON_AddStringToObject(l, "object", "model");
    cJSON_AddNumberToObject(l, "created", (double)ll->a->created);
    cJSON_AddStringToObject(l, "owned_by", "paged");
    cJSON_AddStringToObject(l, "root", path);
    cJSON_AddStringToObject(l, "parent", ll->a->served_name);
    cJSON_AddNumberToObject(l, "max_model_len", ll->a->lim.max_model_len);
    cJSON_AddArrayToObject(l, "permission");
    cJSON_AddItemToArray(ll->data, l);
}

void api_models(srv_app *a, srv_req *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", a->served_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)a->created);
    cJSON_AddStringToObject(m, "owned_by", "paged");
    cJSON_AddStringToObject(m, "root", a->model_path);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", a->lim.max_model_len);
    // vLLM's --quantization name ("none" for weights as stored).
    cJSON_AddStringToObject(m, "quantization", a->quantization ? a->quantization : "none");
    cJSON_AddArrayToObject(m, "permission");
    cJSON_AddItemToArray(data, m);
    // LoRA adapters, as vLLM lists them: the base model as their parent.
    lora_listing ll = {a, data};
    pg_engine_lora_list(a->engine, list_lora, &ll);
    send_cjson(r, 200, o);
}

void api_metrics(srv_app *a, srv_req *r) {
    pg_engine_stats st;
    pg_engine_stats_get(a->engine, &st);
    srv_metrics_refresh(&a->metrics, &st, srv_http_num_connections(a->http), a->n_jobs + a->n_tokenizing);
    if (a->metrics.lora_info) {
        char run[1024], wait[1024];
        pg_engine_lora_names(a->engine, st.sched.lora_running_mask, run, sizeof run);
        pg_engine_lora_names(a->engine, st.sched.lora_waiting_mask, wait, sizeof wait);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        srv_metrics_lora(&a->metrics, run, wait, (double)ts.tv_sec + ts.tv_nsec * 1e-9);
    }
    sbuf b = {0};
    srv_metrics_render(&a->metrics, a->metrics_vllm, &b);
    srv_resp_send(r, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.p ? b.p : "", b.len);
    sbuf_free(&b);
}

static int check_model_field(srv_app *a, const cJSON *body, api_error *e) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (!model || cJSON_IsNull(model)) return 0;
    if (!cJSON_IsString(model)) return api_err(e, 400, "model", "model must be a string");
    return app_check_model(a, model->valuestring, NULL, e);
}

// --- /tokenize and /detokenize ------------------------------------------------------
// Each is a pure function from the request body to the response body, so
// that app_run_off_loop can run it on the thread pool: a 10^6-id request
// spends 100+ ms in JSON and the tokenizer, which on the loop thread would
// stall every stream.

// Appends the decimal ids as a JSON array body: cJSON would spend ~1 us per
// number, and a prompt may have 10^6 tokens.
static void put_ids(sbuf *b, const int32_t *ids, int n) {
    sbuf_puts(b, "[");
    for (int i = 0; i < n; i++) {
        char num[16], *q = num + sizeof num;
        uint32_t v = (uint32_t)ids[i];  // ids are >= 0
        do *--q = (char)('0' + v % 10); while (v /= 10);
        if (i) *--q = ',';
        sbuf_append(b, q, (size_t)(num + sizeof num - q));
    }
    sbuf_puts(b, "]");
}

// vLLM's /tokenize: {"prompt": text} or {"messages": [...]}, with
// add_special_tokens, add_generation_prompt and return_token_strs.
static int tokenize_body(srv_app *a, const char *json, size_t json_len, sbuf *out, api_error *e) {
    cJSON *body = NULL;
    api_messages msgs = {0};
    char *text = NULL;
    int32_t *ids = NULL;
    int rc = -1;
    bool special = true, gen_prompt = true, strs = false;
    if (api_parse_body(json, json_len, &body, e) < 0) goto out;
    if (check_model_field(a, body, e) < 0) goto out;
    if (api_get_bool(body, "add_special_tokens", &special, e) < 0 ||
        api_get_bool(body, "add_generation_prompt", &gen_prompt, e) < 0 ||
        api_get_bool(body, "return_token_strs", &strs, e) < 0)
        goto out;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_GetObjectItemCaseSensitive(body, "messages")) {
        if (api_parse_messages(body, &msgs, e) < 0 || app_render_chat(a, &msgs, NULL, NULL, gen_prompt, &text, e) < 0)
            goto out;
    } else if (cJSON_IsString(prompt)) {
        text = pg_xstrdup(prompt->valuestring);
    } else {
        api_err(e, 400, "prompt", "prompt must be a string (or give messages)");
        goto out;
    }
    size_t len = strlen(text);
    // No token is longer than the longest vocabulary entry: a text with
    // more bytes than that times the model length can never fit.
    size_t lim = (size_t)a->lim.max_model_len * (size_t)pg_tokenizer_max_token_bytes(a->tok) + 64;
    if (len > lim) {
        api_err(e, 400, "prompt",
                "This model's maximum context length is %d tokens. However, your request is "
                "%zu bytes long. Please reduce the length of the input.",
                a->lim.max_model_len, len);
        goto out;
    }
    // A Jinja template writes BOS itself: then it is not added again.
    bool bos = special && (msgs.json ? app_chat_add_bos(a) : pg_tokenizer_add_bos(a->tok));
    int n = pg_tokenizer_encode_alloc(a->tok, text, len, bos, true, &ids);
    if (n < 0) {
        api_err(e, 400, "prompt", "cannot tokenize the input: %s", pg_err_msg());
        goto out;
    }
    sbuf_reserve(out, (size_t)n * 7 + 128);
    sbuf_printf(out, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":", n, a->lim.max_model_len);
    put_ids(out, ids, n);
    sbuf_puts(out, ",\"token_strs\":");
    if (strs) {
        sbuf tok = {0};
        sbuf_puts(out, "[");
        for (int i = 0; i < n; i++) {
            sbuf_reset(&tok);
            api_format_token_text(a->tok, ids[i], &tok);
            if (i) sbuf_puts(out, ",");
            api_json_string(out, sbuf_str(&tok), tok.len);
        }
        sbuf_puts(out, "]");
        sbuf_free(&tok);
    } else {
        sbuf_puts(out, "null");
    }
    sbuf_puts(out, "}");
    rc = 0;
out:
    free(ids);
    free(text);
    api_messages_free(&msgs);
    cJSON_Delete(body);
    return rc;
}

// vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}.
static int detokenize_body(srv_app *a, const char *json, size_t json_len, sbuf *out, api_error *e) {
    cJSON *body = NULL;
    int32_t *ids = NULL;
    char *text = NULL;
    int rc = -1;
    if (api_parse_body(json, json_len, &body, e) < 0) goto out;
    if (check_model_field(a, body, e) < 0) goto out;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(body, "tokens");
    if (!cJSON_IsArray(toks)) {
        api_err(e, 400, "tokens", "tokens must be a list of token ids");
        goto out;
    }
    int n = cJSON_GetArraySize(toks), i = 0;
    ids = pg_xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    const cJSON *it;
    cJSON_ArrayForEach(it, toks) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v) || v < 0 || v >= a->lim.vocab_size) {
            api_err(e, 400, "tokens", "token ids must be integers in [0, %d)", a->lim.vocab_size);
            goto out;
        }
        ids[i++] = (int32_t)v;
    }
    // pg_detok_feed rather than pg_tokenizer_decode: a byte token may
    // decode to NUL, and the text must not end there (it is sent as \u0000).
    pg_detok d;
    pg_detok_init(&d, a->tok, false);
    int cap = 64 + pg_tokenizer_max_token_bytes(a->tok);
    text = pg_xmalloc((size_t)cap);
    sbuf txt = {0};
    for (int k = 0; k <= n; k++) {
        int got = k < n ? pg_detok_feed(&d, ids[k], text, cap) : pg_detok_flush(&d, text, cap);
        if (got < 0) {
            sbuf_free(&txt);
            api_err(e, 400, "tokens", "cannot decode the tokens");
            goto out;
        }
        sbuf_append(&txt, text, (size_t)got);
    }
    sbuf_puts(out, "{\"prompt\":");
    api_json_string(out, txt.p ? txt.p : "", txt.len);
    sbuf_puts(out, "}");
    sbuf_free(&txt);
    rc = 0;
out:
    free(ids);
    free(text);
    cJSON_Delete(body);
    return rc;
}

void api_tokenize(srv_app *a, srv_req *r) { app_run_off_loop(a, r, tokenize_body); }

void api_detokenize(srv_app *a, srv_req *r) { app_run_off_loop(a, r, detokenize_body); }
