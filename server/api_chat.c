// server/api_chat.c - POST /v1/chat/completions.
//
// Messages are rendered with the model's chat template (engine/
// chat_template.h), tokenized, and generated as one engine request with n
// sequences. With tools (server/tool_calls.h) each choice's text goes
// through the tool-call parser: streamed as content deltas, then per call
// a chunk with its id and name and chunks with argument text; whole
// responses carry message.tool_calls. Either way finish_reason is
// "tool_calls" when the model called a tool.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/app.h"
#include "server/gen_job.h"
#include "server/sse.h"
#include "server/tool_calls.h"

// --- formatting ---------------------------------------------------------------------

static cJSON *token_bytes_json(const pg_tokenizer *tok, int32_t id) {
    char small[256];
    int n = pg_tokenizer_token_bytes(tok, id, small, sizeof small);
    char *buf = small;
    if (n > (int)sizeof small) {
        buf = pg_xmalloc((size_t)n);
        n = pg_tokenizer_token_bytes(tok, id, buf, n);
    }
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)buf[i]));
    if (buf != small) free(buf);
    return arr;
}

static cJSON *entry_json(const pg_tokenizer *tok, int32_t id, float lp, sbuf *t) {
    cJSON *o = cJSON_CreateObject();
    sbuf_reset(t);
    gen_token_text(tok, id, t);
    cJSON_AddStringToObject(o, "token", sbuf_str(t));
    cJSON_AddNumberToObject(o, "logprob", gen_logprob(lp));
    cJSON_AddItemToObject(o, "bytes", token_bytes_json(tok, id));
    return o;
}

// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
static cJSON *logprobs_json(gen_job *j, gen_choice *c) {
    if (j->p.logprobs < 0) return cJSON_CreateNull();
    const pg_tokenizer *tok = j->app->tok;
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    sbuf t = {0};
    for (int k = 0; k < c->n_lps; k++) {
        const pg_seq_output *so = &c->lps[k];
        cJSON *e = entry_json(tok, so->token, so->logprob, &t);
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        int n_top = so->n_top < j->p.logprobs ? so->n_top : j->p.logprobs;
        for (int i = 0; i < n_top; i++)
            cJSON_AddItemToArray(tops, entry_json(tok, so->top_ids[i], so->top_logprobs[i], &t));
        cJSON_AddItemToArray(content, e);
    }
    sbuf_free(&t);
    return o;
}

static bool parsing_tools(const gen_job *j) { return j->p.tools && j->p.tools->choice != TC_CHOICE_NONE; }

// "stop" becomes "tool_calls" when the choice called a tool (OpenAI's reason).
static const char *finish_with_calls(const char *finish, bool called) {
    return called && finish && !strcmp(finish, "stop") ? "tool_calls" : finish;
}

static void add_finish(gen_job *j, const gen_choice *c, cJSON *ch, const char *finish) {
    if (!finish) {
        cJSON_AddNullToObject(ch, "finish_reason");
        return;
    }
    cJSON_AddStringToObject(ch, "finish_reason", finish);
    if (!strcmp(finish, "tool_calls")) {
        cJSON_AddNullToObject(ch, "stop_reason");
        return;
    }
    if (c->stop_string >= 0) {
        cJSON_AddStringToObject(ch, "stop_reason", j->p.stop[c->stop_string]);
        return;
    }
    const pg_sampling_params *sp = &c->sub->sp;
    for (int i = 0; c->stop_token >= 0 && i < sp->n_stop_ids; i++)
        if (sp->stop_ids[i] == c->stop_token) {
            cJSON_AddNumberToObject(ch, "stop_reason", c->stop_token);
            return;
        }
    cJSON_AddNullToObject(ch, "stop_reason");
}

static void stream_start(gen_job *j) {
    // OpenAI sends the role first, one chunk per choice.
    for (int i = 0; i < j->n_choices; i++) {
        cJSON *o = gen_chunk_new(j);
        cJSON *chs = cJSON_AddArrayToObject(o, "choices");
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", j->choices[i].index);
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        cJSON_AddItemToArray(chs, ch);
        sse_send_json(j->req, o);
        cJSON_Delete(o);
    }
}

// One chunk of choice c with `delta` (taken) and, when lps, its logprobs.
static void send_delta(gen_job *j, gen_choice *c, cJSON *d, bool lps, const char *finish) {
    cJSON *o = gen_chunk_new(j);
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    cJSON_AddItemToObject(ch, "delta", d);
    cJSON_AddItemToObject(ch, "logprobs", lps ? logprobs_json(j, c) : cJSON_CreateNull());
    add_finish(j, c, ch, finish);
    cJSON_AddItemToArray(chs, ch);
    sse_send_json(j->req, o);
    cJSON_Delete(o);
}

// Streaming with tools: the parser decides what of the new text is content
// and what is a tool call.
static void stream_chunk_tools(gen_job *j, gen_choice *c, const char *finish) {
    tc_stream *s = tools_stream(j->p.tools, c->index);
    tc_delta td = {0};
    tc_stream_feed(s, c->delta.p ? c->delta.p : "", c->delta.len, finish != NULL, &td);
    bool lps_sent = false;
    if (td.content.len > 0) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "content", sbuf_str(&td.content));
        send_delta(j, c, d, true, NULL);
        lps_sent = true;
    }
    for (int i = 0; i < td.n_calls; i++) {
        const tc_delta_call *tc = &td.calls[i];
        for (int part = 0; part < 2; part++) {
            if (part == 0 && !tc->name) continue;
            if (part == 1 && tc->args.len == 0) continue;
            cJSON *d = cJSON_CreateObject();
            cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls");
            cJSON *call = cJSON_CreateObject();
            cJSON_AddNumberToObject(call, "index", tc->index);
            cJSON *fn;
            if (part == 0) {  // the name first, with the call's id
                cJSON_AddStringToObject(call, "id", tc->id);
                cJSON_AddStringToObject(call, "type", "function");
                fn = cJSON_AddObjectToObject(call, "function");
                cJSON_AddStringToObject(fn, "name", tc->name);
                cJSON_AddStringToObject(fn, "arguments", "");
            } else {
                fn = cJSON_AddObjectToObject(call, "function");
                cJSON_AddStringToObject(fn, "arguments", sbuf_str(&tc->args));
            }
            cJSON_AddItemToArray(arr, call);
            send_delta(j, c, d, !lps_sent, NULL);
            lps_sent = true;
        }
    }
    if (finish)
        send_delta(j, c, cJSON_CreateObject(), !lps_sent, finish_with_calls(finish, tc_stream_n_calls(s) > 0));
    tc_delta_free(&td);
}

static void stream_chunk(gen_job *j, gen_choice *c, const char *finish) {
    if (parsing_tools(j)) {
        stream_chunk_tools(j, c, finish);
        return;
    }
    cJSON *o = gen_chunk_new(j);
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    if (c->delta.len > 0 || !finish) cJSON_AddStringToObject(d, "content", sbuf_str(&c->delta));
    cJSON_AddItemToObject(ch, "logprobs", logprobs_json(j, c));
    add_finish(j, c, ch, finish);
    cJSON_AddItemToArray(chs, ch);
    sse_send_json(j->req, o);
    cJSON_Delete(o);
}

static void full_response(gen_job *j, sbuf *out) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->app->served_name);
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < j->n_choices; i++) {
        gen_choice *c = &j->choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", c->index);
        cJSON *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        const char *finish = c->finish_reason;
        if (parsing_tools(j)) {
            char *content;
            cJSON *calls;
            tools_parse_output(j->p.tools, sbuf_str(&c->text), &content, &calls);
            if (content) cJSON_AddStringToObject(m, "content", content);
            else cJSON_AddNullToObject(m, "content");
            if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
            finish = finish_with_calls(finish, calls != NULL);
            free(content);
        } else {
            cJSON_AddStringToObject(m, "content", sbuf_str(&c->text));
        }
        cJSON_AddItemToObject(ch, "logprobs", logprobs_json(j, c));
        add_finish(j, c, ch, finish);
        cJSON_AddItemToArray(chs, ch);
    }
    cJSON_AddItemToObject(o, "usage", gen_usage_json(j));
    // vLLM puts a chat request's prompt logprobs on the response, not a choice.
    if (j->p.prompt_logprobs >= 0 && j->n_subs > 0)
        cJSON_AddItemToObject(o, "prompt_logprobs", gen_prompt_logprobs_json(j, &j->subs[0], j->p.prompt_logprobs));
    char *s = cJSON_PrintUnformatted(o);
    sbuf_puts(out, s);
    free(s);
    cJSON_Delete(o);
}

static const gen_ops CHAT_OPS = {
    .chunk_object = "chat.completion.chunk",
    .stream_start = stream_start,
    .stream_chunk = stream_chunk,
    .full_response = full_response,
};

// --- the route ----------------------------------------------------------------------

typedef struct chat_pending {
    api_params p;
    char *prompt;          // the rendered conversation
    size_t len;
} chat_pending;

static void chat_tokenized(srv_app *a, srv_req *r, void *ctx, int32_t **ids, const int32_t *counts,
                           const api_error *err) {
    chat_pending *c = ctx;
    api_error e;
    if (!r) goto out;  // the client left
    if (err) {
        app_send_error(r, err);
        goto out;
    }
    if (api_check_length(&a->lim, API_CHAT, counts[0], &c->p, &e) < 0) {
        app_send_error(r, &e);
        goto out;
    }
    pg_sampling_params sp = c->p.sp;
    gen_job *j = gen_job_new(a, r, API_CHAT, &CHAT_OPS, &c->p, 1, "chatcmpl-");
    gen_job_set_prompt(j, 0, ids[0], counts[0], NULL, &sp);
    ids[0] = NULL;
    gen_job_start(j);
out:
    if (ids) free(ids[0]);
    api_params_free(&c->p);
    free(c->prompt);
    free(c);
}

void api_chat_completions(srv_app *a, srv_req *r) {
    api_error e;
    cJSON *body = NULL;
    chat_pending *c = pg_xcalloc(1, sizeof *c);
    api_messages msgs = {0};
    bool gen_prompt = true;
    if (api_parse_body(r->body, r->body_len, &body, &e) < 0) goto fail;
    if (api_parse_params(body, API_CHAT, &a->lim, &c->p, &e) < 0) goto fail;
    if (app_check_model(a, c->p.model, &e) < 0) goto fail;
    if (api_compile_grammar(a->grammars, &c->p, &e) < 0) goto fail;
    api_tokenize_bad_words(a->tok, &c->p);
    if (api_parse_messages(body, &msgs, &e) < 0) goto fail;
    if (api_get_bool(body, "add_generation_prompt", &gen_prompt, &e) < 0) goto fail;
    if (c->p.tools && a->chat) {
        tools_set_format(c->p.tools, pg_chat_template_source(a->chat));
        // [TOOL_CALLS] and <|python_tag|> are special tokens: keep them in the text.
        if (tools_need_special_tokens(c->p.tools)) c->p.skip_special_tokens = false;
    }
    if (app_render_chat(a, &msgs, c->p.tools ? c->p.tools->tools : NULL, c->p.chat_template_kwargs,
                        gen_prompt, &c->prompt, &e) < 0)
        goto fail;
    api_messages_free(&msgs);
    cJSON_Delete(body);
    c->len = strlen(c->prompt);
    app_tokenize_async(a, r, (const char *const *)&c->prompt, &c->len, 1, app_chat_add_bos(a),
                       "messages", chat_tokenized, c);
    return;
fail:
    app_send_error(r, &e);
    api_messages_free(&msgs);
    api_params_free(&c->p);
    free(c->prompt);
    free(c);
    cJSON_Delete(body);
}
