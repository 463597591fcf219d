// server/api_common.h - request validation and OpenAI-style errors, shared
// by the completion and chat routes.
//
// Everything here is pure (no engine, no sockets): a JSON body goes in,
// sampling parameters or an api_error with its HTTP status come out. The
// routes run these checks before anything is tokenized, allocated for the
// engine or queued. tests/unit/test_api_validate.c drives them directly.
#pragma once
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/template/chat_template.h"
#include "text/grammar/structured.h"
#include "text/tokenizer/tokenizer.h"
#include "scheduler/plan.h"
#include "server/sbuf.h"

// --- errors --------------------------------------------------------------------

typedef struct api_error {
    int status;            // HTTP status (400, 404, 413, 503 ...)
    char param[64];        // the offending field, "" for none
    char message[512];
} api_error;

// Sets `e` and returns -1, so a check reads `return api_err(e, 400, "n", "...")`.
int api_err(api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// OpenAI's error "type" for a status: invalid_request_error (4xx),
// authentication_error (401), not_found_error (404), server_error (5xx).
const char *api_error_type(int status);

// {"error": {"message": ..., "type": ..., "param": ..., "code": status}}
void api_error_json(const api_error *e, sbuf *out);

// --- limits and parameters -----------------------------------------------------

typedef struct api_limits {
    int32_t vocab_size;          // token ids must be in [0, vocab_size)
    int32_t max_model_len;       // prompt + max_tokens
    int32_t max_n;               // n per request
    int32_t max_seqs;            // prompts * n per request
    int32_t max_stop;            // stop strings per request
    int32_t max_stop_len;        // bytes per stop string
    int32_t max_logprobs;        // completions logprobs / chat top_logprobs (<= PG_MAX_LOGPROBS)
    int32_t default_max_tokens;  // cap on the default when a chat request gives none (0 = none)
    bool allow_priority;         // priority scheduling is on (otherwise priority must be 0)
} api_limits;

void api_limits_default(api_limits *l);

typedef enum { API_COMPLETION = 0, API_CHAT = 1 } api_kind;

// The parsed fields of a completion or chat request, apart from the prompt.
typedef struct api_params {
    pg_sampling_params sp;
    bool max_tokens_set;         // max_tokens / max_completion_tokens given
    bool stream, include_usage;
    bool echo;                   // completions
    bool echo_only;              // completions: echo with max_tokens 0 (vLLM's): the prompt
                                 //   and its logprobs only; the engine runs max_tokens 1 and
                                 //   the token is not shown
    int32_t logprobs;            // -1 = none; completions: top-N, chat: top_logprobs
    bool skip_special_tokens;    // default true
    bool include_stop_str;       // include_stop_str_in_output
    int32_t priority;
    int64_t lora_id;             // the adapter "model" names (0: the base model; app_check_model)
    int n_stop;
    char **stop;                 // [n_stop] owned
    size_t *stop_lens;           // [n_stop] owned
    char *model;                 // owned; NULL when absent
    // Structured outputs (server/api_guided.c, text/grammar/structured.h): at
    // most one constraint. guided_json is a JSON schema text (from
    // response_format json_schema, guided_json, structured_outputs.json, or
    // set by tool calling for tool_choice required / named); otherwise
    // grammar_kind (a pg_grammar_kind, -1 = none) names what grammar_text is.
    char *guided_json;           // owned; NULL when absent
    int grammar_kind;
    char *grammar_text;          // owned; NULL when absent
    const char *guided_param;    // the field that set the constraint, for errors
    // Token-level controls.
    int32_t n_logit_bias;        // logit_bias entries (ids ascending, unique)
    int32_t *bias_ids;           // [n_logit_bias] owned
    float *bias_values;          // [n_logit_bias] owned, in [-100, 100]
    int32_t n_allowed;           // allowed_token_ids (0 = all allowed)
    int32_t *allowed_ids;        // [n_allowed] owned
    int n_bad_words;
    char **bad_words;            // [n_bad_words] owned
    int32_t n_bad_seqs;          // their token sequences (api_tokenize_bad_words)
    int32_t *bad_off;            // [n_bad_seqs + 1] owned: sequence k is bad_ids[off[k] .. off[k+1])
    int32_t *bad_ids;            // owned
    int32_t best_of;             // completions: candidates per choice (>= n); 0 = n
    int32_t prompt_logprobs;     // -1 = none; the prompt_logprobs field: top-N per prompt
                                 //   position (sp.want_prompt_logprobs also follows echo +
                                 //   logprobs, which reports the prompt at logprobs' N)
    pg_grammar *grammar;         // owned reference, set by api_compile_grammar
    struct api_tools *tools;     // chat: owned; NULL without tools (server/tool_calls.h)
    cJSON *chat_template_kwargs; // chat: owned copy of the object; NULL when absent
} api_params;

// Parses every field but the prompt/messages from `body` (an object),
// checking types, ranges and combinations. On error fills `e` (status 400)
// and returns -1, leaving `p` freed. Token-id fields are checked against
// lim->vocab_size.
int api_parse_params(const cJSON *body, api_kind kind, const api_limits *lim, api_params *p,
                     api_error *e);
void api_params_free(api_params *p);

// The structured-output and token-control fields (response_format,
// guided_json / guided_regex / guided_choice / guided_grammar,
// structured_outputs, logit_bias, allowed_token_ids, bad_words, best_of,
// prompt_logprobs, metadata) into p; called by api_parse_params. Checks
// shapes and OpenAI's limits (logit_bias: at most 300 entries, token ids in
// the vocabulary, values in [-100, 100]); grammars are compiled later, by
// the route (api_compile_grammar).
int api_parse_guided(const cJSON *body, api_kind kind, const api_limits *lim, api_params *p,
                     api_error *e);

// Compiles p's constraint, if any, through the cache `c` into p->grammar
// (NULL cache: structured outputs unavailable). A schema or grammar that
// does not compile is a 400 naming the field and the reason. Compilation
// is bounded by the cache's limits, so it may run on the loop thread.
int api_compile_grammar(pg_grammar_cache *c, api_params *p, api_error *e);

// Tokenizes p's bad_words, each as written and with a leading space (as
// vLLM does), into p->bad_off / bad_ids.
void api_tokenize_bad_words(const pg_tokenizer *t, api_params *p);


// Sets the default max_tokens (completions: 16; chat: the rest of the
// context, capped at lim->default_max_tokens) and checks prompt + max_tokens
// against the model length, and min_tokens against max_tokens. Call once
// per prompt with a copy of the params when prompts differ in length.
int api_check_length(const api_limits *lim, api_kind kind, int32_t n_prompt, api_params *p,
                     api_error *e);

// --- prompts (completions) -----------------------------------------------------

typedef struct api_prompt {
    char *text;                  // owned; NULL for a token-id prompt
    size_t text_len;
    int32_t *ids;                // owned; token ids (given, or filled by the route)
    int32_t n_ids;
} api_prompt;

// "prompt": a string, a list of strings, a list of token ids, or a list of
// lists of token ids. Ids are checked against the vocabulary; the count of
// prompts times n against lim->max_seqs.
int api_parse_prompts(const cJSON *body, const api_limits *lim, int32_t n, api_prompt **out,
                      int *n_out, api_error *e);
void api_prompts_free(api_prompt *ps, int n);

// --- messages (chat) -----------------------------------------------------------

typedef struct api_messages {
    pg_chat_msg *msgs;           // [n] role and content point into owned storage
    int n;
    char **owned;                // [n] content strings
    cJSON *json;                 // owned: the messages as the chat template sees them
} api_messages;

// "messages": a non-empty list of {role, content}; role system, developer
// (as system), user, assistant or tool; content a string, null (assistant),
// or a list of {"type": "text", "text": ...} parts (joined with "\n").
// Assistant messages may carry tool_calls ({id, type "function", function
// {name, arguments}}; arguments that are a JSON object text are given to the
// template as an object, as vLLM does); tool messages need tool_call_id.
// `json` holds them normalised (content a string) for the template.
int api_parse_messages(const cJSON *body, api_messages *out, api_error *e);
void api_messages_free(api_messages *m);

// --- bodies --------------------------------------------------------------------

// Appends s[0..n) as a JSON string literal (quotes included; control
// characters escaped; the bytes are expected to be UTF-8).
void api_json_string(sbuf *out, const char *s, size_t n);

// Whether s[0..n) is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool api_utf8_valid(const char *s, size_t n);

// Checks UTF-8, parses with cJSON_ParseWithLength and requires an object.
int api_parse_body(const char *body, size_t len, cJSON **out, api_error *e);

// Reads an optional integral JSON number in [lo, hi] (null/absent leaves *out
// unchanged). -1 with `e` set on a wrong type, a fraction, NaN/Inf or range.
int api_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                bool *present, api_error *e);
// Optional boolean (null/absent leaves *out unchanged).
int api_get_bool(const cJSON *obj, const char *key, bool *out, api_error *e);
