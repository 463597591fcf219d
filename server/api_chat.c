// server/api_chat.c - POST /v1/chat/completions.
//
// Messages are rendered with the model's chat template (text/template/
// chat_template.h), tokenized, and generated as one engine request with n
// sequences. With tools (server/tool_calls.h) the template sees them and
// each choice's text goes through the tool-call parser when the response
// is written (server/api_format.c).
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/app.h"
#include "server/gen_job.h"
#include "server/tool_calls.h"

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
    gen_job *j = gen_job_new(a, r, API_CHAT, &c->p, 1, "chatcmpl-");
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
    if (app_check_model(a, c->p.model, &c->p.lora_id, &e) < 0) goto fail;
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
