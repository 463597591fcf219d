// server/api_guided.c - the structured-output and token-control fields of
// completion and chat requests (api_common.h: api_parse_guided).
//
// Spellings accepted, all meaning the same constraint:
//   response_format {"type": "json_object"} | {"type": "json_schema",
//       "json_schema": {"name", "schema", "strict"}}        (OpenAI)
//   guided_json, guided_regex, guided_choice, guided_grammar (vLLM)
//   structured_outputs {"json" | "regex" | "choice" | "grammar" |
//       "json_object"}                                       (newer vLLM)
// Only one constraint per request. The texts are kept as given; the route
// compiles them against the model's vocabulary.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured.h"
#include "text/tokenizer/tokenizer.h"
#include "server/api_common.h"

// OpenAI's limits.
#define MAX_LOGIT_BIAS 300
#define MAX_METADATA 16
#define MAX_METADATA_KEY 64
#define MAX_METADATA_VALUE 512
// Ours: generous, and bounded so a request cannot make the engine scan
// unbounded lists per step.
#define MAX_BAD_WORDS 128
#define MAX_BAD_WORD_LEN 256

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

// Records one constraint; a second one is a 400.
static int set_constraint(api_params *p, const char *param, int kind, char *text, api_error *e) {
    if (p->guided_json || p->grammar_kind >= 0) {
        free(text);
        return api_err(e, 400, param, "only one structured output constraint may be given (%s and %s)",
                       p->guided_param, param);
    }
    p->guided_param = param;
    if (kind == PG_GRAMMAR_JSON_SCHEMA) {
        p->guided_json = text;
    } else {
        p->grammar_kind = kind;
        p->grammar_text = text;
    }
    return 0;
}

// A schema given as an object, or (vLLM) as a string holding one.
static int schema_text(const cJSON *s, const char *param, char **out, api_error *e) {
    if (cJSON_IsObject(s) || cJSON_IsBool(s)) {
        *out = cJSON_PrintUnformatted(s);
        return 0;
    }
    if (cJSON_IsString(s)) {
        cJSON *j = cJSON_Parse(s->valuestring);
        bool ok = cJSON_IsObject(j) || cJSON_IsBool(j);
        cJSON_Delete(j);
        if (!ok) return api_err(e, 400, param, "%s must be a JSON schema (an object, or a string holding one)", param);
        *out = pg_xstrdup(s->valuestring);
        return 0;
    }
    return api_err(e, 400, param, "%s must be a JSON schema object", param);
}

static int choices_text(const cJSON *c, const char *param, char **out, api_error *e) {
    if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) == 0)
        return api_err(e, 400, param, "%s must be a non-empty list of strings", param);
    const cJSON *it;
    cJSON_ArrayForEach(it, c) if (!cJSON_IsString(it))
        return api_err(e, 400, param, "%s must be a non-empty list of strings", param);
    *out = cJSON_PrintUnformatted(c);
    return 0;
}

static int string_text(const cJSON *c, const char *param, char **out, api_error *e) {
    if (!cJSON_IsString(c)) return api_err(e, 400, param, "%s must be a string", param);
    *out = pg_xstrdup(c->valuestring);
    return 0;
}

static int parse_response_format(const cJSON *body, api_params *p, api_error *e) {
    const cJSON *rf = field(body, "response_format");
    if (!rf) return 0;
    const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (!cJSON_IsString(t))
        return api_err(e, 400, "response_format", "response_format must be an object with a string type");
    const char *ty = t->valuestring;
    if (!strcmp(ty, "text")) return 0;
    if (!strcmp(ty, "json_object"))
        return set_constraint(p, "response_format", PG_GRAMMAR_JSON_OBJECT, NULL, e);
    if (strcmp(ty, "json_schema"))
        return api_err(e, 400, "response_format.type",
                       "response_format type '%.64s' is not one of 'text', 'json_object', 'json_schema'", ty);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return api_err(e, 400, "response_format.json_schema",
                       "response_format of type 'json_schema' needs a json_schema object");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (!cJSON_IsString(name))
        return api_err(e, 400, "response_format.json_schema.name", "json_schema.name is required (a string)");
    size_t nl = strlen(name->valuestring);
    if (nl == 0 || nl > 64 || strspn(name->valuestring,
                                     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != nl)
        return api_err(e, 400, "response_format.json_schema.name",
                       "json_schema.name must be 1 to 64 of a-z, A-Z, 0-9, '_' and '-'");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return api_err(e, 400, "response_format.json_schema.strict", "json_schema.strict must be a boolean");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!schema || cJSON_IsNull(schema))  // no schema: any JSON object
        return set_constraint(p, "response_format", PG_GRAMMAR_JSON_OBJECT, NULL, e);
    char *text;
    PG_TRY(schema_text(schema, "response_format.json_schema.schema", &text, e));
    return set_constraint(p, "response_format", PG_GRAMMAR_JSON_SCHEMA, text, e);
}

static int parse_vllm_guided(const cJSON *body, api_params *p, api_error *e) {
    const cJSON *it;
    char *text;
    if ((it = field(body, "guided_json"))) {
        PG_TRY(schema_text(it, "guided_json", &text, e));
        PG_TRY(set_constraint(p, "guided_json", PG_GRAMMAR_JSON_SCHEMA, text, e));
    }
    if ((it = field(body, "guided_regex"))) {
        PG_TRY(string_text(it, "guided_regex", &text, e));
        PG_TRY(set_constraint(p, "guided_regex", PG_GRAMMAR_REGEX, text, e));
    }
    if ((it = field(body, "guided_choice"))) {
        PG_TRY(choices_text(it, "guided_choice", &text, e));
        PG_TRY(set_constraint(p, "guided_choice", PG_GRAMMAR_CHOICE, text, e));
    }
    if ((it = field(body, "guided_grammar"))) {
        PG_TRY(string_text(it, "guided_grammar", &text, e));
        PG_TRY(set_constraint(p, "guided_grammar", PG_GRAMMAR_GBNF, text, e));
    }
    const cJSON *be = field(body, "guided_decoding_backend");
    if (be && !cJSON_IsString(be))
        return api_err(e, 400, "guided_decoding_backend", "guided_decoding_backend must be a string");
    const cJSON *so = field(body, "structured_outputs");
    if (!so) return 0;
    if (!cJSON_IsObject(so)) return api_err(e, 400, "structured_outputs", "structured_outputs must be an object");
    static const char *refused[] = {"structural_tag", "whitespace_pattern", NULL};
    for (int i = 0; refused[i]; i++)
        if (field(so, refused[i]))
            return api_err(e, 400, "structured_outputs", "structured_outputs.%s is not supported", refused[i]);
    if ((it = field(so, "json"))) {
        PG_TRY(schema_text(it, "structured_outputs.json", &text, e));
        PG_TRY(set_constraint(p, "structured_outputs.json", PG_GRAMMAR_JSON_SCHEMA, text, e));
    }
    if ((it = field(so, "regex"))) {
        PG_TRY(string_text(it, "structured_outputs.regex", &text, e));
        PG_TRY(set_constraint(p, "structured_outputs.regex", PG_GRAMMAR_REGEX, text, e));
    }
    if ((it = field(so, "choice"))) {
        PG_TRY(choices_text(it, "structured_outputs.choice", &text, e));
        PG_TRY(set_constraint(p, "structured_outputs.choice", PG_GRAMMAR_CHOICE, text, e));
    }
    if ((it = field(so, "grammar"))) {
        PG_TRY(string_text(it, "structured_outputs.grammar", &text, e));
        PG_TRY(set_constraint(p, "structured_outputs.grammar", PG_GRAMMAR_GBNF, text, e));
    }
    if ((it = field(so, "json_object"))) {
        if (!cJSON_IsBool(it)) return api_err(e, 400, "structured_outputs.json_object", "json_object must be a boolean");
        if (cJSON_IsTrue(it)) PG_TRY(set_constraint(p, "structured_outputs.json_object", PG_GRAMMAR_JSON_OBJECT, NULL, e));
    }
    return 0;
}

// A token id given as a JSON number or (logit_bias keys) a decimal string.
static bool token_id(double v, const api_limits *lim) {
    return isfinite(v) && v == floor(v) && v >= 0 && v < lim->vocab_size;
}

static int cmp_bias(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int parse_logit_bias(const cJSON *body, const api_limits *lim, api_params *p, api_error *e) {
    const cJSON *lb = field(body, "logit_bias");
    if (!lb) return 0;
    if (!cJSON_IsObject(lb))
        return api_err(e, 400, "logit_bias", "logit_bias must be an object mapping token ids to numbers");
    int n = cJSON_GetArraySize(lb);
    if (n > MAX_LOGIT_BIAS)
        return api_err(e, 400, "logit_bias", "logit_bias may have at most %d entries, got %d", MAX_LOGIT_BIAS, n);
    if (n == 0) return 0;
    // pairs (id, value bits) sorted by id so duplicates ("7" and "07") are found
    int32_t *pairs = pg_xmalloc(sizeof(int32_t) * 2 * (size_t)n);
    const cJSON *it;
    int k = 0;
    cJSON_ArrayForEach(it, lb) {
        char *end;
        const char *key = it->string;
        double id = strtod(key, &end);
        if (!*key || *end || strspn(key, "0123456789") != strlen(key) || !token_id(id, lim)) {
            free(pairs);
            return api_err(e, 400, "logit_bias", "logit_bias key '%.32s' is not a token id in [0, %d)", key,
                           lim->vocab_size);
        }
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 ||
            it->valuedouble > 100) {
            free(pairs);
            return api_err(e, 400, "logit_bias", "logit_bias value for token %s must be a number in [-100, 100]",
                           key);
        }
        float f = (float)it->valuedouble;
        pairs[2 * k] = (int32_t)id;
        memcpy(&pairs[2 * k + 1], &f, sizeof f);
        k++;
    }
    qsort(pairs, (size_t)n, 2 * sizeof(int32_t), cmp_bias);
    for (int i = 1; i < n; i++)
        if (pairs[2 * i] == pairs[2 * i - 2]) {
            int32_t dup = pairs[2 * i];
            free(pairs);
            return api_err(e, 400, "logit_bias", "logit_bias names token %d twice", dup);
        }
    p->bias_ids = pg_xmalloc(sizeof(int32_t) * (size_t)n);
    p->bias_values = pg_xmalloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) {
        p->bias_ids[i] = pairs[2 * i];
        memcpy(&p->bias_values[i], &pairs[2 * i + 1], sizeof(float));
    }
    p->n_logit_bias = n;
    free(pairs);
    return 0;
}

static int parse_allowed(const cJSON *body, const api_limits *lim, api_params *p, api_error *e) {
    const cJSON *a = field(body, "allowed_token_ids");
    if (!a) return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0)
        return api_err(e, 400, "allowed_token_ids", "allowed_token_ids must be a non-empty list of token ids");
    int n = cJSON_GetArraySize(a);
    if (n > lim->vocab_size)
        return api_err(e, 400, "allowed_token_ids", "allowed_token_ids has more entries than the vocabulary");
    p->allowed_ids = pg_xmalloc(sizeof(int32_t) * (size_t)n);
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsNumber(it) || !token_id(it->valuedouble, lim))
            return api_err(e, 400, "allowed_token_ids", "allowed_token_ids must be token ids in [0, %d)",
                           lim->vocab_size);
        p->allowed_ids[p->n_allowed++] = (int32_t)it->valuedouble;
    }
    return 0;
}

static int parse_bad_words(const cJSON *body, api_params *p, api_error *e) {
    const cJSON *b = field(body, "bad_words");
    if (!b) return 0;
    if (!cJSON_IsArray(b)) return api_err(e, 400, "bad_words", "bad_words must be a list of strings");
    int n = cJSON_GetArraySize(b);
    if (n > MAX_BAD_WORDS) return api_err(e, 400, "bad_words", "at most %d bad_words are allowed", MAX_BAD_WORDS);
    p->bad_words = pg_xcalloc((size_t)n + 1, sizeof(char *));
    const cJSON *it;
    cJSON_ArrayForEach(it, b) {
        if (!cJSON_IsString(it) || !it->valuestring[0] || strlen(it->valuestring) > MAX_BAD_WORD_LEN)
            return api_err(e, 400, "bad_words", "bad_words must be non-empty strings of at most %d bytes",
                           MAX_BAD_WORD_LEN);
        p->bad_words[p->n_bad_words++] = pg_xstrdup(it->valuestring);
    }
    return 0;
}

static int parse_metadata(const cJSON *body, api_error *e) {
    const cJSON *m = field(body, "metadata");
    if (!m) return 0;
    if (!cJSON_IsObject(m)) return api_err(e, 400, "metadata", "metadata must be an object of strings");
    if (cJSON_GetArraySize(m) > MAX_METADATA)
        return api_err(e, 400, "metadata", "metadata may have at most %d keys", MAX_METADATA);
    const cJSON *it;
    cJSON_ArrayForEach(it, m) {
        if (strlen(it->string) > MAX_METADATA_KEY)
            return api_err(e, 400, "metadata", "metadata keys must be at most %d characters", MAX_METADATA_KEY);
        if (!cJSON_IsString(it) || strlen(it->valuestring) > MAX_METADATA_VALUE)
            return api_err(e, 400, "metadata", "metadata values must be strings of at most %d characters",
                           MAX_METADATA_VALUE);
    }
    return 0;
}

int api_parse_guided(const cJSON *body, api_kind kind, const api_limits *lim, api_params *p,
                     api_error *e) {
    PG_TRY(parse_response_format(body, p, e));
    PG_TRY(parse_vllm_guided(body, p, e));
    PG_TRY(parse_logit_bias(body, lim, p, e));
    PG_TRY(parse_allowed(body, lim, p, e));
    PG_TRY(parse_bad_words(body, p, e));
    PG_TRY(parse_metadata(body, e));
    int64_t v;
    bool has;
    if (api_get_int(body, "prompt_logprobs", 0, lim->max_logprobs, &v, &has, e) < 0) return -1;
    if (has && v > 0 && p->stream)  // vLLM's rule: 0 streams (and reports nothing)
        return api_err(e, 400, "prompt_logprobs", "`prompt_logprobs` are not available when `stream=True`.");
    if (has) p->prompt_logprobs = (int32_t)v;
    if (kind == API_COMPLETION) {
        if (api_get_int(body, "best_of", 1, lim->max_n, &v, &has, e) < 0) return -1;
        if (has) {
            if (v < p->sp.n)
                return api_err(e, 400, "best_of", "best_of (%lld) must be at least n (%d)", (long long)v, p->sp.n);
            if (v > p->sp.n && p->stream)
                return api_err(e, 400, "best_of", "best_of greater than n cannot be streamed");
            p->best_of = (int32_t)v;
        }
    } else {
        if (api_get_int(body, "best_of", 1, lim->max_n, &v, &has, e) < 0) return -1;
        if (has && v != p->sp.n)
            return api_err(e, 400, "best_of", "best_of different from n is only supported on /v1/completions");
    }
    return 0;
}

int api_compile_grammar(pg_grammar_cache *c, api_params *p, api_error *e) {
    if (!p->guided_json && p->grammar_kind < 0) return 0;
    if (!c) return api_err(e, 400, p->guided_param, "structured outputs are not available on this server");
    pg_grammar_kind kind = p->guided_json ? PG_GRAMMAR_JSON_SCHEMA : (pg_grammar_kind)p->grammar_kind;
    const char *text = p->guided_json ? p->guided_json : p->grammar_text ? p->grammar_text : "";
    char err[300];
    int rc = pg_grammar_cache_get(c, kind, text, strlen(text), &p->grammar, err, sizeof err);
    if (rc < 0) return api_err(e, 400, p->guided_param, "%s cannot be compiled: %s", p->guided_param, err);
    return 0;
}

void api_tokenize_bad_words(const pg_tokenizer *t, api_params *p) {
    if (p->n_bad_words == 0) return;
    int32_t cap = 0, n = 0;
    p->bad_off = pg_xmalloc(sizeof(int32_t) * (size_t)(2 * p->n_bad_words + 1));
    p->bad_off[0] = 0;
    for (int i = 0; i < p->n_bad_words; i++)
        for (int sp = 0; sp < 2; sp++) {
            char buf[MAX_BAD_WORD_LEN + 2];
            int len = snprintf(buf, sizeof buf, "%s%s", sp ? " " : "", p->bad_words[i]);
            int k = pg_tokenizer_encode(t, buf, (size_t)len, false, false, NULL, 0);
            if (k <= 0) continue;
            if (n + k > cap) {
                cap = (n + k) * 2;
                p->bad_ids = pg_xrealloc(p->bad_ids, sizeof(int32_t) * (size_t)cap);
            }
            pg_tokenizer_encode(t, buf, (size_t)len, false, false, p->bad_ids + n, k);
            n += k;
            p->bad_off[++p->n_bad_seqs] = n;
        }
}

