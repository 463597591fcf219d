// tests/unit/test_api_validate.c - request bodies into sampling parameters,
// and every bad field into a 400 naming it, without an engine.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/api_common.h"

static api_limits limits(void) {
    api_limits l;
    api_limits_default(&l);
    l.vocab_size = 1000;
    l.max_model_len = 100;
    l.max_n = 8;
    l.max_seqs = 16;
    l.max_stop = 3;
    l.max_stop_len = 10;
    l.default_max_tokens = 50;
    return l;
}

// Parses `json` as a request body and its params; returns the status (0 = ok).
static int params(const char *json, api_kind kind, api_params *p, api_error *e) {
    api_limits l = limits();
    cJSON *body = NULL;
    memset(e, 0, sizeof *e);
    if (api_parse_body(json, strlen(json), &body, e) < 0) return e->status;
    int rc = api_parse_params(body, kind, &l, p, e);
    cJSON_Delete(body);
    return rc < 0 ? e->status : 0;
}

static void expect_400(const char *json, api_kind kind, const char *param) {
    api_params p;
    api_error e;
    int st = params(json, kind, &p, &e);
    if (st != 400) fail_msg("%s: status %d, want 400", json, st);
    if (param && strcmp(e.param, param)) fail_msg("%s: param '%s', want '%s' (%s)", json, e.param, param, e.message);
    assert_true(strlen(e.message) > 0);
}

static void test_bodies(void **state) {
    api_error e;
    cJSON *j;
    assert_int_equal(api_parse_body("", 0, &j, &e), -1);
    assert_int_equal(e.status, 400);
    assert_int_equal(api_parse_body("{\"a\":", 5, &j, &e), -1);           // truncated
    assert_int_equal(api_parse_body("{\"a\":1} x", 9, &j, &e), -1);       // trailing data
    assert_int_equal(api_parse_body("[1,2]", 5, &j, &e), -1);             // not an object
    assert_int_equal(api_parse_body("{\"a\":\"\xff\"}", 9, &j, &e), -1);  // invalid UTF-8
    assert_non_null(strstr(e.message, "UTF-8"));
    assert_int_equal(api_parse_body("{\"a\":\"\\ud800\"}", 14, &j, &e), -1);  // lone surrogate
    assert_int_equal(api_parse_body("{\"a\":NaN}", 9, &j, &e), -1);
    // A body that is not NUL-terminated is never read past its length.
    char buf[8] = {'{', '}', ' ', '\n', 'x', 'x', 'x', 'x'};
    assert_int_equal(api_parse_body(buf, 4, &j, &e), 0);
    cJSON_Delete(j);
    assert_int_equal(api_parse_body("{\"prompt\": \"hi\"}\r\n", 18, &j, &e), 0);
    cJSON_Delete(j);
    assert_int_equal(api_parse_body("{\"a\":\"x\0y\"}", 11, &j, &e), -1);  // raw NUL
    assert_int_equal(api_parse_body("{\"a\":\"x\x01y\"}", 11, &j, &e), -1);
    // An escaped NUL would cut a string short: refused; an escaped backslash
    // followed by "u0000" is plain text.
    assert_int_equal(api_parse_body("{\"a\":\"x\\u0000y\"}", 16, &j, &e), -1);
    assert_non_null(strstr(e.message, "NUL"));
    assert_int_equal(api_parse_body("{\"a\":\"x\\\\u0000y\"}", 17, &j, &e), 0);
    assert_string_equal(cJSON_GetObjectItem(j, "a")->valuestring, "x\\u0000y");
    cJSON_Delete(j);
}

static void test_utf8(void **state) {
    assert_true(api_utf8_valid("", 0));
    assert_true(api_utf8_valid("h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 12));
    assert_false(api_utf8_valid("\xc0\xaf", 2));          // overlong
    assert_false(api_utf8_valid("\xe0\x80\xaf", 3));      // overlong
    assert_false(api_utf8_valid("\xed\xa0\x80", 3));      // surrogate
    assert_false(api_utf8_valid("\xf4\x90\x80\x80", 4));  // > U+10FFFF
    assert_false(api_utf8_valid("\xe2\x82", 2));          // truncated
    assert_false(api_utf8_valid("\x80", 1));              // lone continuation
}

static void test_defaults_and_fields(void **state) {
    api_params p;
    api_error e;
    assert_int_equal(params("{}", API_COMPLETION, &p, &e), 0);
    assert_float_equal(p.sp.temperature, 1.0, 0);
    assert_int_equal(p.sp.n, 1);
    assert_int_equal(p.logprobs, -1);
    assert_true(p.skip_special_tokens);
    assert_false(p.max_tokens_set);
    api_params_free(&p);
    assert_int_equal(params("{\"model\":\"m\",\"temperature\":0,\"top_p\":0.5,\"top_k\":-1,\"min_p\":0.1,"
                            "\"presence_penalty\":-2,\"frequency_penalty\":2,\"repetition_penalty\":1.2,"
                            "\"seed\":-5,\"n\":3,\"best_of\":3,\"max_tokens\":7,\"min_tokens\":2,"
                            "\"ignore_eos\":true,\"skip_special_tokens\":false,"
                            "\"include_stop_str_in_output\":true,\"stop\":[\"a\",\"bc\"],"
                            "\"stop_token_ids\":[1,999],\"logprobs\":5,\"echo\":false,\"stream\":true,"
                            "\"stream_options\":{\"include_usage\":true},\"priority\":0,\"user\":\"u\"}",
                            API_COMPLETION, &p, &e),
                     0);
    assert_string_equal(p.model, "m");
    assert_float_equal(p.sp.temperature, 0, 0);
    assert_float_equal(p.sp.top_p, 0.5, 1e-6);
    assert_int_equal(p.sp.top_k, 0);
    assert_float_equal(p.sp.repetition_penalty, 1.2, 1e-6);
    assert_true(p.sp.has_seed);
    assert_int_equal((int64_t)p.sp.seed, -5);
    assert_int_equal(p.sp.n, 3);
    assert_int_equal(p.sp.max_tokens, 7);
    assert_true(p.max_tokens_set);
    assert_int_equal(p.sp.min_tokens, 2);
    assert_true(p.sp.ignore_eos);
    assert_false(p.skip_special_tokens);
    assert_true(p.include_stop_str);
    assert_int_equal(p.n_stop, 2);
    assert_string_equal(p.stop[1], "bc");
    assert_int_equal(p.stop_lens[1], 2);
    assert_int_equal(p.sp.n_stop_ids, 2);
    assert_int_equal(p.sp.stop_ids[1], 999);
    assert_int_equal(p.logprobs, 5);
    assert_int_equal(p.sp.logprobs, 5);
    assert_true(p.stream);
    assert_true(p.include_usage);
    api_params_free(&p);
    // Seeds: any signed or unsigned 64-bit integer.
    assert_int_equal(params("{\"seed\":18446744073709549568}", API_COMPLETION, &p, &e), 0);
    assert_true(p.sp.seed == 18446744073709549568ull);
    api_params_free(&p);
    // A single stop string; null fields are absent.
    assert_int_equal(params("{\"stop\":\"END\",\"temperature\":null,\"n\":null}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(p.n_stop, 1);
    assert_float_equal(p.sp.temperature, 1, 0);
    api_params_free(&p);
    // Integral floats are integers (as pydantic accepts them).
    assert_int_equal(params("{\"max_tokens\":5.0}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(p.sp.max_tokens, 5);
    api_params_free(&p);
}

static void test_chat_fields(void **state) {
    api_params p;
    api_error e;
    assert_int_equal(params("{\"logprobs\":true,\"top_logprobs\":3,\"max_completion_tokens\":9,"
                            "\"max_tokens\":4}",
                            API_CHAT, &p, &e),
                     0);
    assert_int_equal(p.logprobs, 3);
    assert_int_equal(p.sp.max_tokens, 9);  // max_completion_tokens wins
    api_params_free(&p);
    assert_int_equal(params("{\"logprobs\":true}", API_CHAT, &p, &e), 0);
    assert_int_equal(p.logprobs, 0);
    api_params_free(&p);
    assert_int_equal(params("{\"logprobs\":false}", API_CHAT, &p, &e), 0);
    assert_int_equal(p.logprobs, -1);
    api_params_free(&p);
    assert_int_equal(params("{\"tools\":[],\"tool_choice\":\"none\",\"response_format\":{\"type\":\"text\"}}",
                            API_CHAT, &p, &e),
                     0);
    api_params_free(&p);
}

static void test_bad_fields(void **state) {
    expect_400("{\"temperature\":\"hot\"}", API_COMPLETION, "temperature");
    expect_400("{\"temperature\":-0.1}", API_COMPLETION, "temperature");
    expect_400("{\"temperature\":1e999}", API_COMPLETION, "temperature");  // Inf
    expect_400("{\"top_p\":0}", API_COMPLETION, "top_p");
    expect_400("{\"top_p\":1.5}", API_COMPLETION, "top_p");
    expect_400("{\"top_k\":-2}", API_COMPLETION, "top_k");
    expect_400("{\"min_p\":2}", API_COMPLETION, "min_p");
    expect_400("{\"presence_penalty\":3}", API_COMPLETION, "presence_penalty");
    expect_400("{\"repetition_penalty\":0}", API_COMPLETION, "repetition_penalty");
    expect_400("{\"seed\":1.5}", API_COMPLETION, "seed");
    expect_400("{\"seed\":1e30}", API_COMPLETION, "seed");
    expect_400("{\"seed\":-1e19}", API_COMPLETION, "seed");
    expect_400("{\"n\":0}", API_COMPLETION, "n");
    expect_400("{\"n\":-1}", API_COMPLETION, "n");
    expect_400("{\"n\":1000000000}", API_COMPLETION, "n");
    expect_400("{\"n\":\"2\"}", API_COMPLETION, "n");
    expect_400("{\"n\":3,\"best_of\":2}", API_COMPLETION, "best_of");  // best_of below n
    expect_400("{\"max_tokens\":0}", API_COMPLETION, "max_tokens");
    expect_400("{\"max_tokens\":-5}", API_COMPLETION, "max_tokens");
    expect_400("{\"max_tokens\":1.5}", API_COMPLETION, "max_tokens");
    expect_400("{\"max_tokens\":1e300}", API_COMPLETION, "max_tokens");
    expect_400("{\"max_completion_tokens\":0}", API_CHAT, "max_completion_tokens");
    expect_400("{\"min_tokens\":-1}", API_COMPLETION, "min_tokens");
    expect_400("{\"logprobs\":21}", API_COMPLETION, "logprobs");
    expect_400("{\"logprobs\":-1}", API_COMPLETION, "logprobs");
    expect_400("{\"logprobs\":true}", API_COMPLETION, "logprobs");
    expect_400("{\"logprobs\":3}", API_CHAT, "logprobs");
    expect_400("{\"top_logprobs\":2}", API_CHAT, "top_logprobs");
    expect_400("{\"logprobs\":true,\"top_logprobs\":21}", API_CHAT, "top_logprobs");
    expect_400("{\"stop\":5}", API_COMPLETION, "stop");
    expect_400("{\"stop\":[\"a\",5]}", API_COMPLETION, "stop");
    expect_400("{\"stop\":\"\"}", API_COMPLETION, "stop");
    expect_400("{\"stop\":[\"a\",\"b\",\"c\",\"d\"]}", API_COMPLETION, "stop");  // too many
    expect_400("{\"stop\":\"12345678901\"}", API_COMPLETION, "stop");           // too long
    expect_400("{\"stop_token_ids\":[1000]}", API_COMPLETION, "stop_token_ids");
    expect_400("{\"stop_token_ids\":[-1]}", API_COMPLETION, "stop_token_ids");
    expect_400("{\"stop_token_ids\":3}", API_COMPLETION, "stop_token_ids");
    expect_400("{\"stream\":\"yes\"}", API_COMPLETION, "stream");
    expect_400("{\"stream_options\":{\"include_usage\":true}}", API_COMPLETION, "stream_options");
    expect_400("{\"stream\":true,\"stream_options\":{\"include_usage\":1}}", API_COMPLETION, "include_usage");
    expect_400("{\"priority\":1}", API_COMPLETION, "priority");
    expect_400("{\"model\":5}", API_COMPLETION, "model");
    expect_400("{\"logit_bias\":{\"1\":101}}", API_COMPLETION, "logit_bias");
    expect_400("{\"use_beam_search\":true}", API_COMPLETION, "use_beam_search");
    expect_400("{\"response_format\":{\"type\":\"xml\"}}", API_CHAT, "response_format.type");
    expect_400("{\"tools\":[{\"type\":\"function\"}]}", API_CHAT, "tools");
    // The legacy function-calling fields are refused (not silently ignored).
    expect_400("{\"functions\":[{\"name\":\"f\",\"parameters\":{}}]}", API_CHAT, "functions");
    expect_400("{\"function_call\":\"auto\"}", API_CHAT, "function_call");
    expect_400("{\"logit_bias\":[]}", API_COMPLETION, "logit_bias");
    // Strict JSON (RFC 8259) and duplicate keys: 400 before any field is read.
    expect_400("{\"max_tokens\":01}", API_COMPLETION, NULL);
    expect_400("{\"temperature\":1.}", API_COMPLETION, NULL);
    expect_400("{\"prompt\":\"a\tb\"}", API_COMPLETION, NULL);
    expect_400("{\"prompt\":\"a\nb\"}", API_COMPLETION, NULL);
    expect_400("{\"n\":1,\"n\":2}", API_COMPLETION, NULL);
    expect_400("{\"ignore_eos\":1}", API_COMPLETION, "ignore_eos");
}

// Fields sent with neutral values that paged accepts.
static void test_neutral_fields_accepted(void **state) {
    api_params p;
    api_error e;
    const char *ok[] = {"{\"logit_bias\":{}}", "{\"logit_bias\":null}", "{\"tools\":[]}",
                        "{\"prompt\":\"a\\tb\\nc\"}", "{\"a\":{\"n\":1},\"n\":2}"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int st = params(ok[i], API_CHAT, &p, &e);
        if (st != 0) fail_msg("%s: status %d (%s)", ok[i], st, e.message);
        api_params_free(&p);
    }
}

static void test_length_checks(void **state) {
    api_limits l = limits();
    api_params p;
    api_error e;
    // Completions default to 16 tokens, capped by the room left.
    assert_int_equal(params("{}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(api_check_length(&l, API_COMPLETION, 10, &p, &e), 0);
    assert_int_equal(p.sp.max_tokens, 16);
    api_params_free(&p);
    assert_int_equal(params("{}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(api_check_length(&l, API_COMPLETION, 95, &p, &e), 0);
    assert_int_equal(p.sp.max_tokens, 5);
    api_params_free(&p);
    // Chat defaults to the rest of the context, capped at default_max_tokens.
    assert_int_equal(params("{}", API_CHAT, &p, &e), 0);
    assert_int_equal(api_check_length(&l, API_CHAT, 30, &p, &e), 0);
    assert_int_equal(p.sp.max_tokens, 50);
    api_params_free(&p);
    assert_int_equal(params("{}", API_CHAT, &p, &e), 0);
    assert_int_equal(api_check_length(&l, API_CHAT, 80, &p, &e), 0);
    assert_int_equal(p.sp.max_tokens, 20);
    api_params_free(&p);
    // Explicit max_tokens beyond the context: 400 with vLLM's wording.
    assert_int_equal(params("{\"max_tokens\":50}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(api_check_length(&l, API_COMPLETION, 60, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "max_tokens");
    assert_non_null(strstr(e.message, "maximum context length is 100 tokens"));
    assert_non_null(strstr(e.message, "110 tokens (60 in the prompt, 50 in the completion)"));
    api_params_free(&p);
    // The prompt alone fills the context.
    assert_int_equal(params("{}", API_CHAT, &p, &e), 0);
    assert_int_equal(api_check_length(&l, API_CHAT, 100, &p, &e), -1);
    assert_string_equal(e.param, "messages");
    assert_int_equal(api_check_length(&l, API_CHAT, 0, &p, &e), -1);
    api_params_free(&p);
    // min_tokens above max_tokens.
    assert_int_equal(params("{\"max_tokens\":4,\"min_tokens\":5}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(api_check_length(&l, API_COMPLETION, 10, &p, &e), -1);
    assert_string_equal(e.param, "min_tokens");
    api_params_free(&p);
}

static int prompts(const char *json, int32_t n, api_prompt **ps, int *count, api_error *e) {
    api_limits l = limits();
    cJSON *body = cJSON_Parse(json);
    assert_non_null(body);
    int rc = api_parse_prompts(body, &l, n, ps, count, e);
    cJSON_Delete(body);
    return rc;
}

static void test_prompts(void **state) {
    api_prompt *ps;
    int n;
    api_error e;
    assert_int_equal(prompts("{\"prompt\":\"hello\"}", 1, &ps, &n, &e), 0);
    assert_int_equal(n, 1);
    assert_string_equal(ps[0].text, "hello");
    api_prompts_free(ps, n);
    assert_int_equal(prompts("{\"prompt\":[\"a\",\"b\",\"c\"]}", 2, &ps, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_string_equal(ps[2].text, "c");
    api_prompts_free(ps, n);
    assert_int_equal(prompts("{\"prompt\":[1,2,3]}", 1, &ps, &n, &e), 0);
    assert_int_equal(n, 1);
    assert_null(ps[0].text);
    assert_int_equal(ps[0].n_ids, 3);
    assert_int_equal(ps[0].ids[2], 3);
    api_prompts_free(ps, n);
    assert_int_equal(prompts("{\"prompt\":[[1,2],[3]]}", 1, &ps, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ps[1].n_ids, 1);
    api_prompts_free(ps, n);

    const char *bad[] = {
        "{}",                               // missing
        "{\"prompt\":5}",                   // wrong type
        "{\"prompt\":[]}",                  // empty
        "{\"prompt\":[1,1000]}",            // outside the vocabulary
        "{\"prompt\":[1,-1]}",              // negative id
        "{\"prompt\":[1,2.5]}",             // fraction
        "{\"prompt\":[\"a\",[1]]}",         // mixed
        "{\"prompt\":[[1],[]]}",            // an empty id list
        "{\"prompt\":[[1],[1,1e10]]}",      // huge id
        "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",  // 9 prompts * n 2 > 16
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        if (prompts(bad[i], 2, &ps, &n, &e) != -1) fail_msg("accepted: %s", bad[i]);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "prompt");
        assert_null(ps);
    }
}

static int messages(const char *json, api_messages *m, api_error *e) {
    cJSON *body = cJSON_Parse(json);
    assert_non_null(body);
    int rc = api_parse_messages(body, m, e);
    cJSON_Delete(body);
    return rc;
}

static void test_messages(void **state) {
    api_messages m;
    api_error e;
    assert_int_equal(messages("{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                              "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                              "{\"type\":\"text\",\"text\":\"b\"}]},"
                              "{\"role\":\"assistant\",\"content\":null}]}",
                              &m, &e),
                     0);
    assert_int_equal(m.n, 3);
    assert_string_equal(m.msgs[0].role, "system");
    assert_string_equal(m.msgs[0].content, "be brief");
    assert_string_equal(m.msgs[1].content, "a\nb");
    assert_string_equal(m.msgs[2].role, "assistant");
    assert_string_equal(m.msgs[2].content, "");
    api_messages_free(&m);

    const char *bad[] = {
        "{}",
        "{\"messages\":[]}",
        "{\"messages\":{}}",
        "{\"messages\":[5]}",
        "{\"messages\":[{\"content\":\"x\"}]}",
        "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
        "{\"messages\":[{\"role\":\"user\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":null}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        if (messages(bad[i], &m, &e) != -1) fail_msg("accepted: %s", bad[i]);
        assert_int_equal(e.status, 400);
        assert_non_null(strstr(e.param, "messages"));
        assert_int_equal(m.n, 0);
    }
}

static void test_error_json(void **state) {
    api_error e;
    api_err(&e, 400, "n", "n must be in [1, %d], got %d", 8, 9);
    sbuf b = {0};
    api_error_json(&e, &b);
    assert_string_equal(sbuf_str(&b), "{\"error\":{\"message\":\"n must be in [1, 8], got 9\","
                                      "\"type\":\"invalid_request_error\",\"param\":\"n\",\"code\":400}}");
    sbuf_reset(&b);
    api_err(&e, 503, NULL, "busy \"now\"");
    api_error_json(&e, &b);
    assert_string_equal(sbuf_str(&b), "{\"error\":{\"message\":\"busy \\\"now\\\"\","
                                      "\"type\":\"server_error\",\"param\":null,\"code\":503}}");
    sbuf_free(&b);
    assert_string_equal(api_error_type(401), "authentication_error");
    assert_string_equal(api_error_type(404), "not_found_error");
    assert_string_equal(api_error_type(413), "invalid_request_error");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_defaults_and_fields),
        cmocka_unit_test(test_chat_fields),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_length_checks),
        cmocka_unit_test(test_neutral_fields_accepted),
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_error_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
