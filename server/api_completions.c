// server/api_completions.c - POST /v1/completions (OpenAI's legacy text
// completions, with vLLM's extra sampling fields).
//
// A prompt is a string, a list of strings, a list of token ids or a list of
// lists of ids; each prompt becomes one engine request with n sequences,
// and choice i * n + k is sequence k of prompt i (server/api_format.c
// writes them).
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/app.h"
#include "server/gen_job.h"

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
    gen_job *j = gen_job_new(a, r, API_COMPLETION, &c->p, c->n_ps, "cmpl-");
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
    if (app_check_model(a, c->p.model, &c->p.lora_id, &e) < 0) goto fail;
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
