// server/api_misc.c - the small routes: /health, /version, /v1/models,
// /tokenize, /detokenize, /metrics.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/app.h"
#include "server/gen_job.h"

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
    cJSON_AddArrayToObject(m, "permission");
    cJSON_AddItemToArray(data, m);
    send_cjson(r, 200, o);
}

void api_metrics(srv_app *a, srv_req *r) {
    pg_engine_stats st;
    pg_engine_stats_get(a->engine, &st);
    srv_metrics_refresh(&a->metrics, &st, srv_http_num_connections(a->http), a->n_jobs + a->n_tokenizing);
    sbuf b = {0};
    met_render(a->metrics.reg, &b);
    srv_resp_send(r, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.p ? b.p : "", b.len);
    sbuf_free(&b);
}

static int check_model_field(srv_app *a, const cJSON *body, api_error *e) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (!model || cJSON_IsNull(model)) return 0;
    if (!cJSON_IsString(model)) return api_err(e, 400, "model", "model must be a string");
    return app_check_model(a, model->valuestring, e);
}

// vLLM's /tokenize: {"prompt": text} or {"messages": [...]}, with
// add_special_tokens, add_generation_prompt and return_token_strs.
typedef struct tokenize_pending {
    char *text;
    size_t len;
    bool strs;
} tokenize_pending;

static void tokenize_done(srv_app *a, srv_req *r, void *ctx, int32_t **ids, const int32_t *counts,
                          const api_error *err) {
    tokenize_pending *t = ctx;
    if (r && err) app_send_error(r, err);
    if (r && !err) {
        // Written by hand: cJSON would spend ~1 us per number, and a prompt
        // may have 100k tokens.
        int n = counts[0];
        sbuf b = {0};
        sbuf_reserve(&b, (size_t)n * 7 + 128);
        sbuf_printf(&b, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":[", n, a->lim.max_model_len);
        for (int i = 0; i < n; i++) {
            char num[16], *q = num + sizeof num;
            uint32_t v = (uint32_t)ids[0][i];  // ids are >= 0
            do *--q = (char)('0' + v % 10); while (v /= 10);
            if (i) *--q = ',';
            sbuf_append(&b, q, (size_t)(num + sizeof num - q));
        }
        sbuf_puts(&b, "],\"token_strs\":");
        if (t->strs) {
            sbuf tok = {0};
            sbuf_puts(&b, "[");
            for (int i = 0; i < n; i++) {
                sbuf_reset(&tok);
                gen_token_text(a->tok, ids[0][i], &tok);
                if (i) sbuf_puts(&b, ",");
                api_json_string(&b, sbuf_str(&tok), tok.len);
            }
            sbuf_puts(&b, "]");
            sbuf_free(&tok);
        } else {
            sbuf_puts(&b, "null");
        }
        sbuf_puts(&b, "}");
        app_send_json(r, 200, b.p, b.len);
        sbuf_free(&b);
    }
    if (ids) free(ids[0]);
    free(t->text);
    free(t);
}

void api_tokenize(srv_app *a, srv_req *r) {
    api_error e;
    cJSON *body = NULL;
    api_messages msgs = {0};
    tokenize_pending *t = pg_xcalloc(1, sizeof *t);
    if (api_parse_body(r->body, r->body_len, &body, &e) < 0) goto fail;
    if (check_model_field(a, body, &e) < 0) goto fail;
    bool special = true, gen_prompt = true;
    if (api_get_bool(body, "add_special_tokens", &special, &e) < 0 ||
        api_get_bool(body, "add_generation_prompt", &gen_prompt, &e) < 0 ||
        api_get_bool(body, "return_token_strs", &t->strs, &e) < 0)
        goto fail;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_GetObjectItemCaseSensitive(body, "messages")) {
        if (api_parse_messages(body, &msgs, &e) < 0 || app_render_chat(a, &msgs, NULL, NULL, gen_prompt, &t->text, &e) < 0)
            goto fail;
    } else if (cJSON_IsString(prompt)) {
        t->text = pg_xstrdup(prompt->valuestring);
    } else {
        api_err(&e, 400, "prompt", "prompt must be a string (or give messages)");
        goto fail;
    }
    t->len = strlen(t->text);
    bool add_bos = msgs.json ? app_chat_add_bos(a) : pg_tokenizer_add_bos(a->tok);
    api_messages_free(&msgs);
    cJSON_Delete(body);
    app_tokenize_async(a, r, (const char *const *)&t->text, &t->len, 1,
                       special && add_bos, "prompt", tokenize_done, t);
    return;
fail:
    app_send_error(r, &e);
    free(t->text);
    free(t);
    api_messages_free(&msgs);
    cJSON_Delete(body);
}

void api_detokenize(srv_app *a, srv_req *r) {
    api_error e;
    cJSON *body = NULL;
    int32_t *ids = NULL;
    char *text = NULL;
    if (api_parse_body(r->body, r->body_len, &body, &e) < 0) goto fail;
    if (check_model_field(a, body, &e) < 0) goto fail;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(body, "tokens");
    if (!cJSON_IsArray(toks)) {
        api_err(&e, 400, "tokens", "tokens must be a list of token ids");
        goto fail;
    }
    int n = cJSON_GetArraySize(toks), i = 0;
    ids = pg_xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    const cJSON *it;
    cJSON_ArrayForEach(it, toks) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v) || v < 0 || v >= a->lim.vocab_size) {
            api_err(&e, 400, "tokens", "token ids must be integers in [0, %d)", a->lim.vocab_size);
            goto fail;
        }
        ids[i++] = (int32_t)v;
    }
    if (pg_tokenizer_decode(a->tok, ids, n, false, &text) < 0) {
        api_err(&e, 400, "tokens", "cannot decode the tokens");
        goto fail;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", text);
    send_cjson(r, 200, o);
    goto out;
fail:
    app_send_error(r, &e);
out:
    free(ids);
    free(text);
    cJSON_Delete(body);
}
