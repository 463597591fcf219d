// server/api_completions.c - POST /v1/completions (OpenAI's legacy text
// completions, with vLLM's extra sampling fields).
//
// A prompt is a string, a list of strings, a list of token ids or a list of
// lists of ids; each prompt becomes one engine request with n sequences,
// and choice i * n + k is sequence k of prompt i.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/app.h"
#include "server/gen_job.h"
#include "server/sse.h"

// --- formatting ---------------------------------------------------------------------

static int64_t utf8_chars(const char *s, size_t n) {
    int64_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

// The echoed prompt's entries of the legacy logprobs (echo + logprobs):
// one per prompt token, the first with null logprob and null top_logprobs
// (nothing scores it), the others from the engine's prompt logprobs;
// text_offset counts the tokens' characters from 0, and c->fmt_offset
// continues from there for the generated tokens (vLLM's offsets).
static void prompt_entries(gen_job *j, gen_choice *c, cJSON *toks, cJSON *lps, cJSON *tops,
                           cJSON *offs, sbuf *t) {
    const pg_tokenizer *tok = j->app->tok;
    const gen_sub *s = c->sub;
    int64_t off = 0;
    for (int32_t p = 0; p < s->n_ids; p++) {
        const pg_prompt_logprob *e = p > 0 && s->plp ? &s->plp[p] : NULL;
        sbuf_reset(t);
        gen_token_text(tok, s->ids[p], t);
        cJSON_AddItemToArray(toks, cJSON_CreateString(sbuf_str(t)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += utf8_chars(t->p ? t->p : "", t->len);
        if (!e) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(gen_logprob(e->logprob)));
        cJSON *top = cJSON_CreateObject();
        int n_top = e->n_top < j->p.logprobs ? e->n_top : j->p.logprobs;
        for (int i = 0; i < n_top; i++) {
            sbuf_reset(t);
            gen_token_text(tok, e->top_ids[i], t);
            if (!cJSON_GetObjectItemCaseSensitive(top, sbuf_str(t)))
                cJSON_AddNumberToObject(top, sbuf_str(t), gen_logprob(e->top_logprobs[i]));
        }
        sbuf_reset(t);
        gen_token_text(tok, s->ids[p], t);
        if (!cJSON_GetObjectItemCaseSensitive(top, sbuf_str(t)))
            cJSON_AddNumberToObject(top, sbuf_str(t), gen_logprob(e->logprob));
        cJSON_AddItemToArray(tops, top);
    }
    c->fmt_offset = off;
}

// OpenAI's legacy logprobs object for c->lps[0..n_lps), after the echoed
// prompt's entries when `with_prompt`: tokens, token_logprobs,
// top_logprobs (token text -> logprob, the sampled token always included)
// and text_offset (characters into the choice's text).
static cJSON *logprobs_json(gen_job *j, gen_choice *c, bool with_prompt) {
    if (j->p.logprobs < 0) return cJSON_CreateNull();
    const pg_tokenizer *tok = j->app->tok;
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    sbuf t = {0};
    if (with_prompt) prompt_entries(j, c, toks, lps, tops, offs, &t);
    for (int k = 0; k < c->n_lps; k++) {
        const pg_seq_output *so = &c->lps[k];
        sbuf_reset(&t);
        gen_token_text(tok, so->token, &t);
        cJSON_AddItemToArray(toks, cJSON_CreateString(sbuf_str(&t)));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(gen_logprob(so->logprob)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)c->fmt_offset));
        c->fmt_offset += utf8_chars(t.p ? t.p : "", t.len);
        cJSON *top = cJSON_CreateObject();
        int n_top = so->n_top < j->p.logprobs ? so->n_top : j->p.logprobs;
        for (int i = 0; i < n_top; i++) {
            sbuf_reset(&t);
            gen_token_text(tok, so->top_ids[i], &t);
            if (!cJSON_GetObjectItemCaseSensitive(top, sbuf_str(&t)))
                cJSON_AddNumberToObject(top, sbuf_str(&t), gen_logprob(so->top_logprobs[i]));
        }
        sbuf_reset(&t);
        gen_token_text(tok, so->token, &t);
        if (!cJSON_GetObjectItemCaseSensitive(top, sbuf_str(&t)))
            cJSON_AddNumberToObject(top, sbuf_str(&t), gen_logprob(so->logprob));
        cJSON_AddItemToArray(tops, top);
    }
    sbuf_free(&t);
    return o;
}

// vLLM's stop_reason: the stop string, or the stop_token_ids entry that
// ended the choice; null for EOS and length.
static void add_stop_reason(gen_job *j, const gen_choice *c, cJSON *choice) {
    if (c->stop_string >= 0) {
        cJSON_AddStringToObject(choice, "stop_reason", j->p.stop[c->stop_string]);
        return;
    }
    const pg_sampling_params *sp = &c->sub->sp;
    for (int i = 0; c->stop_token >= 0 && i < sp->n_stop_ids; i++)
        if (sp->stop_ids[i] == c->stop_token) {
            cJSON_AddNumberToObject(choice, "stop_reason", c->stop_token);
            return;
        }
    cJSON_AddNullToObject(choice, "stop_reason");
}

// with_prompt: the choice's text starts with the echoed prompt (its
// logprobs first, and prompt_logprobs when asked, as vLLM's first chunk).
static cJSON *choice_json(gen_job *j, gen_choice *c, const char *text, const char *finish,
                          bool with_prompt) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    cJSON_AddStringToObject(ch, "text", text);
    cJSON_AddItemToObject(ch, "logprobs", logprobs_json(j, c, with_prompt && j->p.echo));
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    if (finish)
        add_stop_reason(j, c, ch);
    else
        cJSON_AddNullToObject(ch, "stop_reason");
    // vLLM's field on the choice (never streamed: k > 0 is refused there).
    if (with_prompt && j->p.prompt_logprobs >= 0 && !j->p.stream)
        cJSON_AddItemToObject(ch, "prompt_logprobs",
                              gen_prompt_logprobs_json(j, c->sub, j->p.prompt_logprobs));
    return ch;
}

// Streamed echo: the prompt as the choice's first chunk, with its logprobs
// when asked (then it waits for the engine's first event, which brings them).
static void send_echo(gen_job *j, gen_choice *c) {
    const char *text = c->sub->text ? c->sub->text : "";
    c->fmt_offset = utf8_chars(text, strlen(text));
    c->echo_sent = true;
    cJSON *o = gen_chunk_new(j);
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    int saved = c->n_lps;
    c->n_lps = 0;
    cJSON_AddItemToArray(chs, choice_json(j, c, text, NULL, true));
    c->n_lps = saved;
    sse_send_json(j->req, o);
    cJSON_Delete(o);
}

static void stream_start(gen_job *j) {
    // Without logprobs every echo goes out now; with them each waits for its
    // prompt's logprobs (stream_chunk).
    if (!j->p.echo || j->p.logprobs >= 0) return;
    for (int i = 0; i < j->n_choices; i++) send_echo(j, &j->choices[i]);
}

static void stream_chunk(gen_job *j, gen_choice *c, const char *finish) {
    if (j->p.echo && !c->echo_sent) send_echo(j, c);
    cJSON *o = gen_chunk_new(j);
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToArray(chs, choice_json(j, c, sbuf_str(&c->delta), finish, false));
    sse_send_json(j->req, o);
    cJSON_Delete(o);
}

static int cmp_rank(const void *a, const void *b) {
    const gen_choice *x = *(gen_choice *const *)a, *y = *(gen_choice *const *)b;
    if (x->cum_logprob != y->cum_logprob) return x->cum_logprob > y->cum_logprob ? -1 : 1;
    return x->index - y->index;
}

static void full_response(gen_job *j, sbuf *out) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->app->served_name);
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    sbuf text = {0};
    // best_of: per prompt, the n best of its best_of sequences, renumbered.
    int keep = j->n_subs > 0 ? j->n_choices / j->n_subs : 1;  // sequences per prompt
    gen_choice **order = pg_xmalloc(sizeof(gen_choice *) * (size_t)(j->n_choices > 0 ? j->n_choices : 1));
    for (int i = 0; i < j->n_choices; i++) order[i] = &j->choices[i];
    int want = j->best_n > 0 ? j->best_n : keep;
    if (want < keep)
        for (int s = 0; s < j->n_subs; s++) qsort(order + s * keep, (size_t)keep, sizeof *order, cmp_rank);
    for (int i = 0; i < j->n_choices; i++) {
        if (i % keep >= want) continue;
        gen_choice *c = order[i];
        c->index = i / keep * want + i % keep;
        sbuf_reset(&text);
        if (j->p.echo && c->sub->text) {
            sbuf_puts(&text, c->sub->text);
            c->fmt_offset = utf8_chars(c->sub->text, strlen(c->sub->text));
        }
        sbuf_append(&text, c->text.p ? c->text.p : "", c->text.len);
        cJSON_AddItemToArray(chs, choice_json(j, c, sbuf_str(&text), c->finish_reason, true));
    }
    free(order);
    sbuf_free(&text);
    cJSON_AddItemToObject(o, "usage", gen_usage_json(j));
    char *s = cJSON_PrintUnformatted(o);
    sbuf_puts(out, s);
    free(s);
    cJSON_Delete(o);
}

static const gen_ops COMPLETION_OPS = {
    .chunk_object = "text_completion",
    .stream_start = stream_start,
    .stream_chunk = stream_chunk,
    .full_response = full_response,
};

// --- the route ----------------------------------------------------------------------

// A request between validation and submission (while its prompts are
// tokenized, possibly off the loop).
typedef struct cmpl_pending {
    api_params p;
    api_prompt *ps;
    int n_ps;
    const char **texts;    // [n_texts] the prompts given as text
    size_t *lens;
    int *which;            // [n_texts] their prompt index
    int n_texts;
    int best_n;            // best_of: the n asked for (0 = no best_of)
} cmpl_pending;

static void pending_free(cmpl_pending *c) {
    api_params_free(&c->p);
    api_prompts_free(c->ps, c->n_ps);
    free(c->texts);
    free(c->lens);
    free(c->which);
    free(c);
}

// Prompts tokenized: check every length, then submit.
static void cmpl_tokenized(srv_app *a, srv_req *r, void *ctx, int32_t **ids, const int32_t *counts,
                           const api_error *err) {
    cmpl_pending *c = ctx;
    api_error e;
    pg_sampling_params *sps = NULL;
    if (!r) goto out;  // the client left
    if (err) {
        e = *err;
        goto fail;
    }
    for (int k = 0; k < c->n_texts; k++) {
        api_prompt *pr = &c->ps[c->which[k]];
        pr->ids = ids[k];
        pr->n_ids = counts[k];
        ids[k] = NULL;
    }
    sps = pg_xcalloc((size_t)c->n_ps, sizeof *sps);
    for (int i = 0; i < c->n_ps; i++) {
        api_prompt *pr = &c->ps[i];
        if (!pr->text && c->p.echo &&
            pg_tokenizer_decode(a->tok, pr->ids, pr->n_ids, c->p.skip_special_tokens, &pr->text) < 0) {
            api_err(&e, 400, "prompt", "cannot decode the prompt's token ids");
            goto fail;
        }
        api_params each = c->p;  // shallow: only sp changes
        if (api_check_length(&a->lim, API_COMPLETION, pr->n_ids, &each, &e) < 0) goto fail;
        sps[i] = each.sp;
    }
    gen_job *j = gen_job_new(a, r, API_COMPLETION, &COMPLETION_OPS, &c->p, c->n_ps, "cmpl-");
    j->best_n = c->best_n;
    for (int i = 0; i < c->n_ps; i++) {
        api_prompt *pr = &c->ps[i];
        gen_job_set_prompt(j, i, pr->ids, pr->n_ids, j->p.echo ? pr->text : NULL, &sps[i]);
        if (!j->p.echo) free(pr->text);
        pr->ids = NULL;
        pr->text = NULL;
    }
    gen_job_start(j);
    goto out;
fail:
    app_send_error(r, &e);
out:
    free(sps);
    pending_free(c);
}

void api_completions(srv_app *a, srv_req *r) {
    api_error e;
    cJSON *body = NULL;
    cmpl_pending *c = pg_xcalloc(1, sizeof *c);
    if (api_parse_body(r->body, r->body_len, &body, &e) < 0) goto fail;
    if (api_parse_params(body, API_COMPLETION, &a->lim, &c->p, &e) < 0) goto fail;
    if (app_check_model(a, c->p.model, &e) < 0) goto fail;
    if (api_compile_grammar(a->grammars, &c->p, &e) < 0) goto fail;
    // best_of > n: best_of sequences per prompt, the n with the highest
    // cumulative logprob returned (the engine computes the sampled tokens'
    // logprobs for it; the response shows them only when asked).
    if (c->p.best_of > c->p.sp.n) {
        c->best_n = c->p.sp.n;
        c->p.sp.n = c->p.best_of;
        if (c->p.sp.logprobs < 0) c->p.sp.logprobs = 0;
    }
    api_tokenize_bad_words(a->tok, &c->p);
    if (api_parse_prompts(body, &a->lim, c->p.sp.n, &c->ps, &c->n_ps, &e) < 0) goto fail;
    cJSON_Delete(body);
    c->texts = pg_xcalloc((size_t)c->n_ps, sizeof(char *));
    c->lens = pg_xcalloc((size_t)c->n_ps, sizeof(size_t));
    c->which = pg_xcalloc((size_t)c->n_ps, sizeof(int));
    for (int i = 0; i < c->n_ps; i++)
        if (c->ps[i].text) {
            c->texts[c->n_texts] = c->ps[i].text;
            c->lens[c->n_texts] = c->ps[i].text_len;
            c->which[c->n_texts++] = i;
        }
    app_tokenize_async(a, r, c->texts, c->lens, c->n_texts, pg_tokenizer_add_bos(a->tok), "prompt",
                       cmpl_tokenized, c);
    return;
fail:
    app_send_error(r, &e);
    pending_free(c);
    cJSON_Delete(body);
}
