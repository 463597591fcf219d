// tests/fuzz/fuzz_json_request.c - fuzz target for request-body validation:
// what every POST route runs on a client's bytes before anything is queued.
//
// Input: the request body. It goes through api_parse_body (UTF-8, the
// strict RFC 8259 check, cJSON, duplicate keys); when that accepts, through
// the completions and chat field parsers (api_parse_params, api_check_length
// at several prompt lengths, api_parse_prompts, api_parse_messages) and the
// chat templates of every built-in family. Checked on every input:
//   - a body the strict check rejects is rejected;
//   - every error is a 4xx with a message, and its JSON (api_error_json) is
//     itself strict JSON that cJSON reads back with the same message;
//   - accepted parameters are in range (n >= 1, max_tokens >= 1 after the
//     length check, ids inside the vocabulary), and stop strings written
//     with api_json_string are strict JSON.
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "text/template/chat_template.h"
#include "server/api_common.h"
#include "server/json_strict.h"

#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "fuzz_json_request: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                                  \
        }                                                                             \
    } while (0)

static pg_chat_template *templates[4];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    pg_log_set_level(PG_LOG_ERROR);
    const char *names[4] = {"chatml", "llama3", "llama2", "mistral"};
    for (int i = 0; i < 4; i++) CHECK(pg_chat_template_parse(names[i], &templates[i]) == 0);
    return 0;
}

static bool strict(const char *s, size_t n) {
    size_t off;
    const char *why;
    return json_strict_check(s, n, &off, &why);
}

static void check_error(const api_error *e) {
    CHECK(e->status >= 400 && e->status < 500);
    CHECK(e->message[0]);
    sbuf b = {0};
    api_error_json(e, &b);
    CHECK(strict(b.p, b.len));
    cJSON *j = cJSON_ParseWithLength(b.p, b.len);
    CHECK(j);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    CHECK(cJSON_IsString(m) && !strcmp(m->valuestring, e->message));
    cJSON_Delete(j);
    sbuf_free(&b);
}

static void check_params(const cJSON *body, api_kind kind, const api_limits *lim) {
    api_params p;
    api_error e;
    if (api_parse_params(body, kind, lim, &p, &e) < 0) {
        check_error(&e);
        return;
    }
    CHECK(p.sp.n >= 1 && p.sp.n <= lim->max_n);
    for (int i = 0; i < p.sp.n_stop_ids; i++) CHECK(p.sp.stop_ids[i] >= 0 && p.sp.stop_ids[i] < lim->vocab_size);
    sbuf b = {0};
    sbuf_puts(&b, "[");
    for (int i = 0; i < p.n_stop; i++) {
        if (i) sbuf_puts(&b, ",");
        api_json_string(&b, p.stop[i], p.stop_lens[i]);
    }
    sbuf_puts(&b, "]");
    CHECK(strict(b.p, b.len));
    sbuf_free(&b);
    int32_t lens[3] = {1, lim->max_model_len / 2, lim->max_model_len};
    for (int k = 0; k < 3; k++) {
        api_params q = p;  // api_check_length only writes scalars
        if (api_check_length(lim, kind, lens[k], &q, &e) < 0) {
            check_error(&e);
            continue;
        }
        CHECK(q.sp.max_tokens >= 1 && lens[k] + q.sp.max_tokens <= lim->max_model_len);
    }
    api_params_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    api_limits lim;
    api_limits_default(&lim);
    lim.vocab_size = 1000;
    lim.max_model_len = 256;
    lim.max_n = 8;
    lim.max_seqs = 16;
    cJSON *body = NULL;
    api_error e;
    bool ok_strict = size > 0 && strict(s, size);
    if (api_parse_body(s, size, &body, &e) < 0) {
        check_error(&e);
        return 0;
    }
    CHECK(ok_strict && cJSON_IsObject(body));
    CHECK(!json_strict_dup_key(body));
    check_params(body, API_COMPLETION, &lim);
    check_params(body, API_CHAT, &lim);
    api_prompt *ps = NULL;
    int n_ps = 0;
    if (api_parse_prompts(body, &lim, 1, &ps, &n_ps, &e) < 0) {
        check_error(&e);
    } else {
        CHECK(n_ps >= 1 && n_ps <= lim.max_seqs);
        for (int i = 0; i < n_ps; i++)
            for (int k = 0; k < ps[i].n_ids; k++) CHECK(ps[i].ids[k] >= 0 && ps[i].ids[k] < lim.vocab_size);
        api_prompts_free(ps, n_ps);
    }
    api_messages m = {0};
    if (api_parse_messages(body, &m, &e) < 0) {
        check_error(&e);
    } else {
        CHECK(m.n >= 1);
        for (int t = 0; t < 4; t++)
            for (int gen = 0; gen < 2; gen++) {
                char *out = NULL;
                if (pg_chat_template_apply(templates[t], m.msgs, m.n, gen, &out) == 0) CHECK(out);
                free(out);
            }
        api_messages_free(&m);
    }
    cJSON_Delete(body);
    return 0;
}
