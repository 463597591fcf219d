// server/api_common.c - validation of OpenAI request fields, error JSON.
#include "server/api_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/json_strict.h"
#include "server/tool_calls.h"

// --- errors --------------------------------------------------------------------

int api_err(api_error *e, int status, const char *param, const char *fmt, ...) {
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

const char *api_error_type(int status) {
    if (status == 401) return "authentication_error";
    if (status == 404) return "not_found_error";
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

void api_error_json(const api_error *e, sbuf *out) {
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", api_error_type(e->status));
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    cJSON_AddNumberToObject(err, "code", e->status);
    char *s = cJSON_PrintUnformatted(root);
    sbuf_puts(out, s);
    free(s);
    cJSON_Delete(root);
}

// --- field readers -------------------------------------------------------------

static const char *type_name(const cJSON *it) {
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    return "null";
}

static const cJSON *field(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

int api_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                bool *present, api_error *e) {
    const cJSON *it = field(obj, key);
    if (present) *present = it != NULL;
    if (!it) return 0;
    if (!cJSON_IsNumber(it))
        return api_err(e, 400, key, "%s must be an integer, got %s", key, type_name(it));
    double v = it->valuedouble;
    if (!isfinite(v) || v != floor(v))
        return api_err(e, 400, key, "%s must be an integer", key);
    // 0x1p63: (double)INT64_MAX rounds up to 2^63, which does not fit.
    if (v < (double)lo || v > (double)hi || v >= 0x1p63)
        return api_err(e, 400, key, "%s must be in [%lld, %lld], got %.17g", key, (long long)lo,
                       (long long)hi, v);
    *out = (int64_t)v;
    return 0;
}

// Optional number in [lo, hi] (inclusive unless open_lo).
static int get_float(const cJSON *obj, const char *key, double lo, double hi, bool open_lo,
                     float *out, api_error *e) {
    const cJSON *it = field(obj, key);
    if (!it) return 0;
    if (!cJSON_IsNumber(it))
        return api_err(e, 400, key, "%s must be a number, got %s", key, type_name(it));
    double v = it->valuedouble;
    if (!isfinite(v)) return api_err(e, 400, key, "%s must be a finite number", key);
    if (v < lo || v > hi || (open_lo && v == lo))
        return api_err(e, 400, key, "%s must be in %c%g, %g], got %g", key, open_lo ? '(' : '[',
                       lo, hi, v);
    *out = (float)v;
    return 0;
}

int api_get_bool(const cJSON *obj, const char *key, bool *out, api_error *e) {
    const cJSON *it = field(obj, key);
    if (!it) return 0;
    if (!cJSON_IsBool(it))
        return api_err(e, 400, key, "%s must be a boolean, got %s", key, type_name(it));
    *out = cJSON_IsTrue(it);
    return 0;
}

void api_limits_default(api_limits *l) {
    memset(l, 0, sizeof *l);
    l->vocab_size = INT32_MAX;
    l->max_model_len = 8192;
    l->max_n = 128;
    l->max_seqs = 256;
    l->max_stop = 16;
    l->max_stop_len = 256;
    l->max_logprobs = PG_MAX_LOGPROBS;
    l->default_max_tokens = 4096;
}

// --- parameters ----------------------------------------------------------------

void api_params_free(api_params *p) {
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop);
    free(p->stop_lens);
    free(p->model);
    free(p->guided_json);
    api_tools_free(p->tools);
    cJSON_Delete(p->chat_template_kwargs);
    p->guided_json = NULL;
    p->tools = NULL;
    p->chat_template_kwargs = NULL;
    free(p->grammar_text);
    free(p->bias_ids);
    free(p->bias_values);
    free(p->allowed_ids);
    pg_grammar_unref(p->grammar);
    p->grammar = NULL;
    for (int i = 0; i < p->n_bad_words; i++) free(p->bad_words[i]);
    free(p->bad_words);
    free(p->bad_off);
    free(p->bad_ids);
    p->bad_off = p->bad_ids = NULL;
    p->n_bad_seqs = 0;
    p->stop = NULL;
    p->stop_lens = NULL;
    p->model = NULL;
    p->n_stop = 0;
    p->guided_json = p->grammar_text = NULL;
    p->bias_ids = p->allowed_ids = NULL;
    p->bias_values = NULL;
    p->bad_words = NULL;
    p->n_logit_bias = p->n_allowed = p->n_bad_words = 0;
}

static int add_stop(api_params *p, const cJSON *s, const api_limits *lim, api_error *e) {
    if (!cJSON_IsString(s))
        return api_err(e, 400, "stop", "stop must be a string or a list of strings, got %s",
                       type_name(s));
    size_t n = strlen(s->valuestring);
    if (n == 0) return api_err(e, 400, "stop", "stop strings must not be empty");
    if ((int64_t)n > lim->max_stop_len)
        return api_err(e, 400, "stop", "stop strings must be at most %d bytes, got %zu",
                       lim->max_stop_len, n);
    if (p->n_stop >= lim->max_stop)
        return api_err(e, 400, "stop", "at most %d stop strings are allowed", lim->max_stop);
    p->stop = pg_xrealloc(p->stop, sizeof(char *) * (size_t)(p->n_stop + 1));
    p->stop_lens = pg_xrealloc(p->stop_lens, sizeof(size_t) * (size_t)(p->n_stop + 1));
    p->stop[p->n_stop] = pg_xstrdup(s->valuestring);
    p->stop_lens[p->n_stop++] = n;
    return 0;
}

static int parse_stop(const cJSON *body, const api_limits *lim, api_params *p, api_error *e) {
    const cJSON *st = field(body, "stop");
    if (st && cJSON_IsArray(st)) {
        const cJSON *s;
        cJSON_ArrayForEach(s, st) if (add_stop(p, s, lim, e) < 0) return -1;
    } else if (st && add_stop(p, st, lim, e) < 0) {
        return -1;
    }
    const cJSON *ids = field(body, "stop_token_ids");
    if (ids) {
        if (!cJSON_IsArray(ids))
            return api_err(e, 400, "stop_token_ids", "stop_token_ids must be a list of integers");
        int n = cJSON_GetArraySize(ids);
        if (n > PG_MAX_STOP_IDS)
            return api_err(e, 400, "stop_token_ids", "at most %d stop_token_ids are allowed",
                           PG_MAX_STOP_IDS);
        const cJSON *it;
        cJSON_ArrayForEach(it, ids) {
            double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
            if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v) || v < 0 ||
                v >= lim->vocab_size)
                return api_err(e, 400, "stop_token_ids",
                               "stop_token_ids must be token ids in [0, %d)", lim->vocab_size);
            p->sp.stop_ids[p->sp.n_stop_ids++] = (int32_t)v;
        }
    }
    return 0;
}

// Fields that change what the API promises and that paged does not do: a
// clear 400 rather than a silently different answer.
static int reject_unsupported(const cJSON *body, api_kind kind, api_error *e) {
    static const char *never[] = {"suffix", "guided_whitespace_pattern", NULL};
    for (int i = 0; never[i]; i++)
        if (field(body, never[i]))
            return api_err(e, 400, never[i], "%s is not supported by this server", never[i]);
    bool beam = false;
    if (api_get_bool(body, "use_beam_search", &beam, e) < 0) return -1;
    if (beam) return api_err(e, 400, "use_beam_search", "beam search is not supported");
    if (kind == API_CHAT) {
        // The legacy function-calling fields: refused, not silently ignored
        // (a client relying on them would get plain text back).
        static const char *legacy[] = {"functions", "function_call", NULL};
        for (int i = 0; legacy[i]; i++)
            if (field(body, legacy[i]))
                return api_err(e, 400, legacy[i],
                               "%s (the legacy function-calling API) is not supported by this server",
                               legacy[i]);
    }
    return 0;
}

int api_parse_params(const cJSON *body, api_kind kind, const api_limits *lim, api_params *p,
                     api_error *e) {
    memset(p, 0, sizeof *p);
    pg_sampling_params_default(&p->sp);
    p->logprobs = -1;
    p->prompt_logprobs = -1;
    p->grammar_kind = -1;
    p->skip_special_tokens = true;
    int64_t v;
    bool has;
    pg_sampling_params *sp = &p->sp;

    const cJSON *model = field(body, "model");
    if (model && !cJSON_IsString(model))
        return api_err(e, 400, "model", "model must be a string, got %s", type_name(model));
    if (model) p->model = pg_xstrdup(model->valuestring);
    if (reject_unsupported(body, kind, e) < 0) goto fail;

    if (get_float(body, "temperature", 0, 100, false, &sp->temperature, e) < 0) goto fail;
    if (get_float(body, "top_p", 0, 1, true, &sp->top_p, e) < 0) goto fail;
    if (get_float(body, "min_p", 0, 1, false, &sp->min_p, e) < 0) goto fail;
    if (get_float(body, "presence_penalty", -2, 2, false, &sp->presence_penalty, e) < 0) goto fail;
    if (get_float(body, "frequency_penalty", -2, 2, false, &sp->frequency_penalty, e) < 0) goto fail;
    if (get_float(body, "repetition_penalty", 0, 100, true, &sp->repetition_penalty, e) < 0) goto fail;
    if (api_get_int(body, "top_k", -1, INT32_MAX, &v, &has, e) < 0) goto fail;
    if (has) sp->top_k = v < 0 ? 0 : (int32_t)v;
    // seed: any 64-bit integer, signed or unsigned (2^63 and above as uint64).
    const cJSON *seed = field(body, "seed");
    if (seed && cJSON_IsNumber(seed) && seed->valuedouble >= 0x1p63 && seed->valuedouble < 0x1p64 &&
        seed->valuedouble == floor(seed->valuedouble)) {
        sp->seed = (uint64_t)seed->valuedouble;
        sp->has_seed = true;
    } else {
        if (api_get_int(body, "seed", INT64_MIN, INT64_MAX, &v, &has, e) < 0) goto fail;
        if (has) sp->seed = (uint64_t)v, sp->has_seed = true;
    }
    if (api_get_int(body, "n", 1, lim->max_n, &v, &has, e) < 0) goto fail;
    if (has) sp->n = (int32_t)v;

    // max_tokens; chat prefers max_completion_tokens. The upper bound is
    // checked against the prompt in api_check_length.
    bool has_mct = false;
    if (kind == API_CHAT) {
        if (api_get_int(body, "max_completion_tokens", 1, INT32_MAX, &v, &has_mct, e) < 0) goto fail;
        if (has_mct) sp->max_tokens = (int32_t)v, p->max_tokens_set = true;
    }
    // Completions: max_tokens 0 with echo returns the prompt alone (vLLM).
    if (kind == API_COMPLETION && api_get_bool(body, "echo", &p->echo, e) < 0) goto fail;
    if (api_get_int(body, "max_tokens", kind == API_COMPLETION && p->echo ? 0 : 1, INT32_MAX, &v,
                    &has, e) < 0)
        goto fail;
    if (has && !has_mct) sp->max_tokens = (int32_t)v, p->max_tokens_set = true;
    if (has && !has_mct && v == 0) {
        p->echo_only = true;
        sp->max_tokens = 1;  // one engine step; its token is dropped (server/gen_job.c)
    }
    if (api_get_int(body, "min_tokens", 0, INT32_MAX, &v, &has, e) < 0) goto fail;
    if (has) sp->min_tokens = (int32_t)v;
    if (api_get_bool(body, "ignore_eos", &sp->ignore_eos, e) < 0) goto fail;
    if (api_get_bool(body, "skip_special_tokens", &p->skip_special_tokens, e) < 0) goto fail;
    if (api_get_bool(body, "include_stop_str_in_output", &p->include_stop_str, e) < 0) goto fail;
    if (parse_stop(body, lim, p, e) < 0) goto fail;

    if (kind == API_COMPLETION) {
        if (api_get_int(body, "logprobs", 0, lim->max_logprobs, &v, &has, e) < 0) goto fail;
        if (has) p->logprobs = (int32_t)v;
    } else {
        bool lp = false;
        if (api_get_bool(body, "logprobs", &lp, e) < 0) goto fail;
        if (api_get_int(body, "top_logprobs", 0, lim->max_logprobs, &v, &has, e) < 0) goto fail;
        if (has && !lp) {
            api_err(e, 400, "top_logprobs", "top_logprobs requires logprobs to be true");
            goto fail;
        }
        if (lp) p->logprobs = has ? (int32_t)v : 0;
    }
    sp->logprobs = p->logprobs;

    if (api_get_bool(body, "stream", &p->stream, e) < 0) goto fail;
    const cJSON *so = field(body, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            api_err(e, 400, "stream_options", "stream_options must be an object");
            goto fail;
        }
        if (!p->stream) {
            api_err(e, 400, "stream_options", "stream_options can only be set when stream is true");
            goto fail;
        }
        if (api_get_bool(so, "include_usage", &p->include_usage, e) < 0) goto fail;
    }
    if (api_get_int(body, "priority", INT32_MIN, INT32_MAX, &v, &has, e) < 0) goto fail;
    if (has) {
        if (v != 0 && !lim->allow_priority) {
            api_err(e, 400, "priority",
                    "priority can only be set with --scheduling-policy priority");
            goto fail;
        }
        p->priority = (int32_t)v;
    }
    if (kind == API_CHAT) {
        if (api_parse_tools(body, &p->tools, e) < 0) goto fail;
        char *g = tools_guided_json(p->tools);
        if (g && p->guided_json) {  // one constraint per request
            free(g);
            api_err(e, 400, "tool_choice",
                    "tool_choice 'required' or a named function cannot be combined with another output "
                    "constraint (response_format, guided_json)");
            goto fail;
        }
        if (g) {
            p->guided_json = g;
            p->guided_param = "tool_choice";
        }
        const cJSON *kw = field(body, "chat_template_kwargs");
        if (kw && !cJSON_IsObject(kw)) {
            api_err(e, 400, "chat_template_kwargs", "chat_template_kwargs must be an object");
            goto fail;
        }
        if (kw) p->chat_template_kwargs = cJSON_Duplicate(kw, true);
    }
    const cJSON *user = field(body, "user");
    if (user && !cJSON_IsString(user)) {
        api_err(e, 400, "user", "user must be a string");
        goto fail;
    }
    if (api_parse_guided(body, kind, lim, p, e) < 0) goto fail;
    // What the engine scores: prompt_logprobs (not in a stream: vLLM sends
    // none there, and refuses k > 0), and echo with logprobs, which reports
    // the prompt's tokens too (OpenAI's legacy completions) at logprobs' N.
    int32_t k = p->stream ? -1 : p->prompt_logprobs;
    if (p->echo && p->logprobs > k) k = p->logprobs;
    if (k >= 0) {
        sp->want_prompt_logprobs = true;
        sp->prompt_logprobs = k;
    }
    return 0;
fail:
    api_params_free(p);
    return -1;
}

int api_check_length(const api_limits *lim, api_kind kind, int32_t n_prompt, api_params *p,
                     api_error *e) {
    pg_sampling_params *sp = &p->sp;
    if (n_prompt < 1) return api_err(e, 400, kind == API_CHAT ? "messages" : "prompt", "the prompt is empty");
    if (n_prompt >= lim->max_model_len)
        return api_err(e, 400, kind == API_CHAT ? "messages" : "prompt",
                       "This model's maximum context length is %d tokens. However, your request "
                       "has %d input tokens. Please reduce the length of the input.",
                       lim->max_model_len, n_prompt);
    int64_t room = (int64_t)lim->max_model_len - n_prompt;
    if (!p->max_tokens_set) {
        if (kind == API_COMPLETION) {
            sp->max_tokens = 16;  // OpenAI's legacy default, as vLLM
            if (sp->max_tokens > room) sp->max_tokens = (int32_t)room;
        } else {
            sp->max_tokens = (int32_t)room;
            if (lim->default_max_tokens > 0 && sp->max_tokens > lim->default_max_tokens)
                sp->max_tokens = lim->default_max_tokens;
        }
    } else if ((int64_t)sp->max_tokens > room) {
        return api_err(e, 400, kind == API_CHAT ? "max_completion_tokens" : "max_tokens",
                       "This model's maximum context length is %d tokens. However, you requested "
                       "%lld tokens (%d in the %s, %d in the completion). Please reduce the length "
                       "of the %s or completion.",
                       lim->max_model_len, (long long)n_prompt + sp->max_tokens, n_prompt,
                       kind == API_CHAT ? "messages" : "prompt", sp->max_tokens,
                       kind == API_CHAT ? "messages" : "prompt");
    }
    if (sp->min_tokens > sp->max_tokens)
        return api_err(e, 400, "min_tokens", "min_tokens (%d) must be at most max_tokens (%d)",
                       sp->min_tokens, sp->max_tokens);
    return 0;
}

// --- prompts -------------------------------------------------------------------

void api_prompts_free(api_prompt *ps, int n) {
    if (!ps) return;
    for (int i = 0; i < n; i++) {
        free(ps[i].text);
        free(ps[i].ids);
    }
    free(ps);
}

// A JSON array of token ids into p->ids.
static int parse_ids(const cJSON *arr, const api_limits *lim, api_prompt *p, api_error *e) {
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return api_err(e, 400, "prompt", "the prompt is empty");
    if (n > lim->max_model_len)
        return api_err(e, 400, "prompt",
                       "This model's maximum context length is %d tokens. However, your request "
                       "has %d input tokens. Please reduce the length of the input.",
                       lim->max_model_len, n);
    p->ids = pg_xmalloc(sizeof(int32_t) * (size_t)n);
    p->n_ids = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v))
            return api_err(e, 400, "prompt", "token ids must be integers");
        if (v < 0 || v >= lim->vocab_size)
            return api_err(e, 400, "prompt", "token id %.0f is out of vocabulary (size %d)", v,
                           lim->vocab_size);
        p->ids[p->n_ids++] = (int32_t)v;
    }
    return 0;
}

int api_parse_prompts(const cJSON *body, const api_limits *lim, int32_t n, api_prompt **out,
                      int *n_out, api_error *e) {
    *out = NULL;
    *n_out = 0;
    const cJSON *pr = field(body, "prompt");
    if (!pr) return api_err(e, 400, "prompt", "prompt is required");
    int count = 1;
    bool list = false;  // a list of prompts (strings or id lists)
    if (cJSON_IsArray(pr)) {
        const cJSON *first = pr->child;
        if (!first) return api_err(e, 400, "prompt", "the prompt is empty");
        list = cJSON_IsString(first) || cJSON_IsArray(first);
        if (list) count = cJSON_GetArraySize(pr);
    } else if (!cJSON_IsString(pr)) {
        return api_err(e, 400, "prompt",
                       "prompt must be a string, a list of strings, a list of token ids or a list "
                       "of lists of token ids, got %s",
                       type_name(pr));
    }
    if ((int64_t)count * n > lim->max_seqs)
        return api_err(e, 400, "prompt", "%d prompts with n = %d exceed %d sequences per request",
                       count, n, lim->max_seqs);
    api_prompt *ps = pg_xcalloc((size_t)count, sizeof *ps);
    int rc = 0;
    if (cJSON_IsString(pr)) {
        ps[0].text = pg_xstrdup(pr->valuestring);
        ps[0].text_len = strlen(pr->valuestring);
    } else if (!list) {
        rc = parse_ids(pr, lim, &ps[0], e);
    } else {
        int i = 0;
        const cJSON *it;
        bool strings = cJSON_IsString(pr->child);
        cJSON_ArrayForEach(it, pr) {
            if (strings && cJSON_IsString(it)) {
                ps[i].text = pg_xstrdup(it->valuestring);
                ps[i].text_len = strlen(it->valuestring);
            } else if (!strings && cJSON_IsArray(it)) {
                if ((rc = parse_ids(it, lim, &ps[i], e)) < 0) break;
            } else {
                rc = api_err(e, 400, "prompt",
                             "a list of prompts must hold only strings or only lists of token ids");
                break;
            }
            i++;
        }
    }
    if (rc < 0) {
        api_prompts_free(ps, count);
        return -1;
    }
    *out = ps;
    *n_out = count;
    return 0;
}

// --- messages ------------------------------------------------------------------

void api_messages_free(api_messages *m) {
    cJSON_Delete(m->json);
    for (int i = 0; i < m->n; i++) free(m->owned[i]);
    free(m->owned);
    free(m->msgs);
    memset(m, 0, sizeof *m);
}

static int message_content(const cJSON *c, const char *role, int index, char **out, api_error *e) {
    char param[32];
    snprintf(param, sizeof param, "messages[%d].content", index);
    if (!c || cJSON_IsNull(c)) {
        if (strcmp(role, "assistant"))
            return api_err(e, 400, param, "the content of a %s message is required", role);
        *out = pg_xstrdup("");
        return 0;
    }
    if (cJSON_IsString(c)) {
        *out = pg_xstrdup(c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return api_err(e, 400, param, "content must be a string or a list of text parts, got %s",
                       type_name(c));
    sbuf b = {0};
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
        const cJSON *text = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
        if (!cJSON_IsString(type)) {
            sbuf_free(&b);
            return api_err(e, 400, param, "each content part must be an object with a type");
        }
        if (strcmp(type->valuestring, "text")) {
            sbuf_free(&b);
            return api_err(e, 400, param, "content parts of type '%.32s' are not supported (only text)",
                           type->valuestring);
        }
        if (!cJSON_IsString(text)) {
            sbuf_free(&b);
            return api_err(e, 400, param, "a text content part needs a string \"text\"");
        }
        if (k++) sbuf_puts(&b, "\n");
        sbuf_puts(&b, text->valuestring);
    }
    *out = b.p ? sbuf_steal(&b, NULL) : pg_xstrdup("");
    return 0;
}

// tool_calls of an assistant message and tool_call_id/name of a tool
// message, checked and copied into `jm` (the template's view).
static int message_extras(const cJSON *m, const char *role, int index, cJSON *jm, api_error *e) {
    char param[48];
    snprintf(param, sizeof param, "messages[%d]", index);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (tc && !cJSON_IsNull(tc)) {
        if (strcmp(role, "assistant"))
            return api_err(e, 400, param, "only assistant messages can have tool_calls");
        if (!cJSON_IsArray(tc)) return api_err(e, 400, param, "tool_calls must be a list");
        cJSON *calls = cJSON_AddArrayToObject(jm, "tool_calls");
        const cJSON *c;
        int k = 0;
        cJSON_ArrayForEach(c, tc) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            if (!cJSON_IsObject(c) || !cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
                return api_err(e, 400, param,
                               "tool_calls[%d] must be {\"id\", \"type\": \"function\", \"function\": "
                               "{\"name\", \"arguments\": a string}}", k);
            cJSON *jc = cJSON_CreateObject();
            cJSON_AddStringToObject(jc, "id", id->valuestring);
            cJSON_AddStringToObject(jc, "type", "function");
            cJSON *jf = cJSON_AddObjectToObject(jc, "function");
            cJSON_AddStringToObject(jf, "name", name->valuestring);
            // Templates expect the arguments as a mapping (as vLLM passes them).
            cJSON *parsed = cJSON_Parse(args->valuestring);
            if (cJSON_IsObject(parsed)) cJSON_AddItemToObject(jf, "arguments", parsed);
            else {
                cJSON_Delete(parsed);
                cJSON_AddStringToObject(jf, "arguments", args->valuestring);
            }
            cJSON_AddItemToArray(calls, jc);
            k++;
        }
    }
    if (!strcmp(role, "tool")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        if (!cJSON_IsString(id)) return api_err(e, 400, param, "a tool message needs a string tool_call_id");
        cJSON_AddStringToObject(jm, "tool_call_id", id->valuestring);
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
    if (cJSON_IsString(name)) cJSON_AddStringToObject(jm, "name", name->valuestring);
    return 0;
}

int api_parse_messages(const cJSON *body, api_messages *out, api_error *e) {
    memset(out, 0, sizeof *out);
    const cJSON *ms = field(body, "messages");
    if (!ms) return api_err(e, 400, "messages", "messages is required");
    if (!cJSON_IsArray(ms)) return api_err(e, 400, "messages", "messages must be a list");
    int n = cJSON_GetArraySize(ms);
    if (n == 0) return api_err(e, 400, "messages", "messages must not be empty");
    out->msgs = pg_xcalloc((size_t)n, sizeof(pg_chat_msg));
    out->owned = pg_xcalloc((size_t)n, sizeof(char *));
    out->json = cJSON_CreateArray();
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, ms) {
        char param[32];
        snprintf(param, sizeof param, "messages[%d]", i);
        const cJSON *role = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            api_messages_free(out);
            return api_err(e, 400, param, "each message must be an object with a string role");
        }
        const char *r = role->valuestring;
        const char *canon = !strcmp(r, "system") || !strcmp(r, "developer") ? "system"
                            : !strcmp(r, "user")                            ? "user"
                            : !strcmp(r, "assistant")                       ? "assistant"
                            : !strcmp(r, "tool")                            ? "tool"
                                                                            : NULL;
        if (!canon) {
            api_messages_free(out);
            return api_err(e, 400, param,
                           "role '%.32s' is not supported (system, developer, user, assistant, tool)", r);
        }
        cJSON *jm = cJSON_CreateObject();
        cJSON_AddItemToArray(out->json, jm);
        cJSON_AddStringToObject(jm, "role", canon);
        if (message_extras(m, canon, i, jm, e) < 0) {
            api_messages_free(out);
            return -1;
        }
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(jm, "tool_calls");
        bool has_calls = cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0;
        char *content = NULL;
        const cJSON *cj = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (message_content(cj, has_calls ? "assistant" : canon, i, &content, e) < 0) {
            api_messages_free(out);
            return -1;
        }
        cJSON_AddStringToObject(jm, "content", content);
        out->owned[i] = content;
        out->msgs[i] = (pg_chat_msg){canon, content};
        out->n = ++i;
    }
    return 0;
}

// --- bodies --------------------------------------------------------------------

void api_json_string(sbuf *out, const char *s, size_t n) {
    sbuf_reserve(out, n + 2);
    sbuf_append(out, "\"", 1);
    size_t run = 0;  // bytes copied verbatim in one go
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sbuf_append(out, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"': sbuf_puts(out, "\\\""); break;
        case '\\': sbuf_puts(out, "\\\\"); break;
        case '\n': sbuf_puts(out, "\\n"); break;
        case '\r': sbuf_puts(out, "\\r"); break;
        case '\t': sbuf_puts(out, "\\t"); break;
        case '\b': sbuf_puts(out, "\\b"); break;
        case '\f': sbuf_puts(out, "\\f"); break;
        default: sbuf_printf(out, "\\u%04x", c); break;
        }
    }
    sbuf_append(out, s + run, n - run);
    sbuf_append(out, "\"", 1);
}

bool api_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;  // no surrogates
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return false;
        }
        if (i + (size_t)len > n) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (int k = 2; k < len; k++)
            if (s[i + (size_t)k] < 0x80 || s[i + (size_t)k] > 0xBF) return false;
        i += (size_t)len;
    }
    return true;
}

int api_parse_body(const char *body, size_t len, cJSON **out, api_error *e) {
    *out = NULL;
    if (len == 0) return api_err(e, 400, NULL, "the request body is empty; expected a JSON object");
    if (!api_utf8_valid(body, len)) return api_err(e, 400, NULL, "the request body is not valid UTF-8");
    // Strict RFC 8259 first (cJSON reads 01, 1. and raw control characters
    // in strings), so cJSON only sees text every other JSON reader agrees on.
    size_t bad_off;
    const char *why;
    if (!json_strict_check(body, len, &bad_off, &why))
        return api_err(e, 400, NULL, "the request body is not valid JSON: %s (byte %zu)", why, bad_off);
    // cJSON keeps strings NUL-terminated: an escaped NUL would silently cut
    // a prompt short.
    for (const char *p = body; (p = memmem(p, len - (size_t)(p - body), "\\u0000", 6)); p += 6) {
        size_t bs = 0;
        while (p - (ptrdiff_t)bs > body && p[-(ptrdiff_t)bs - 1] == '\\') bs++;
        if (bs % 2 == 0) return api_err(e, 400, NULL, "strings must not contain NUL (\\u0000)");
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!j) {
        size_t off = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return api_err(e, 400, NULL, "the request body is not valid JSON (error near byte %zu)", off);
    }
    // Only whitespace may follow the value.
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(j);
            return api_err(e, 400, NULL, "the request body has trailing data after the JSON value");
        }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return api_err(e, 400, NULL, "the request body must be a JSON object");
    }
    // Duplicate keys: cJSON would take the first, Python servers the last;
    // paged refuses them, so no two readers of one body disagree.
    const char *dup = json_strict_dup_key(j);
    if (dup) {
        api_err(e, 400, NULL, "the request body has the key '%.64s' twice in one object", dup);
        cJSON_Delete(j);
        return -1;
    }
    *out = j;
    return 0;
}
