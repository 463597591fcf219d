// tests/unit/test_api_guided.c - structured-output and token-control fields
// of completion and chat requests (server/api_guided.c), and their
// compilation into grammars through the cache.
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/grammar/structured.h"
#include "server/api_common.h"

static api_limits limits(void) {
    api_limits l;
    api_limits_default(&l);
    l.vocab_size = 1000;
    return l;
}

static int parse(const char *json, api_kind kind, api_params *p, api_error *e) {
    api_limits l = limits();
    cJSON *body = NULL;
    memset(e, 0, sizeof *e);
    if (api_parse_body(json, strlen(json), &body, e) < 0) return e->status;
    int rc = api_parse_params(body, kind, &l, p, e);
    cJSON_Delete(body);
    return rc < 0 ? e->status : 0;
}

static void expect_400(const char *json, api_kind kind, const char *param, const char *msg_part) {
    api_params p;
    api_error e;
    int st = parse(json, kind, &p, &e);
    if (st != 400) fail_msg("%s: status %d, want 400", json, st);
    if (param && strcmp(e.param, param)) fail_msg("%s: param '%s', want '%s' (%s)", json, e.param, param, e.message);
    if (msg_part && !strstr(e.message, msg_part)) fail_msg("%s: message '%s' lacks '%s'", json, e.message, msg_part);
}

static void test_response_format_spellings(void **st) {
    (void)st;
    api_params p;
    api_error e;
    assert_int_equal(parse("{\"response_format\":{\"type\":\"text\"}}", API_CHAT, &p, &e), 0);
    assert_int_equal(p.grammar_kind, -1);
    assert_null(p.guided_json);
    api_params_free(&p);
    assert_int_equal(parse("{\"response_format\":{\"type\":\"json_object\"}}", API_CHAT, &p, &e), 0);
    assert_int_equal(p.grammar_kind, PG_GRAMMAR_JSON_OBJECT);
    api_params_free(&p);
    assert_int_equal(parse("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"Person\","
                           "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}}",
                           API_CHAT, &p, &e), 0);
    assert_non_null(p.guided_json);
    assert_non_null(strstr(p.guided_json, "\"integer\""));
    assert_string_equal(p.guided_param, "response_format");
    api_params_free(&p);
    // Completions take it too (vLLM).
    assert_int_equal(parse("{\"response_format\":{\"type\":\"json_object\"}}", API_COMPLETION, &p, &e), 0);
    api_params_free(&p);
    assert_int_equal(parse("{\"guided_json\":\"{\\\"type\\\":\\\"string\\\"}\"}", API_COMPLETION, &p, &e), 0);
    assert_string_equal(p.guided_json, "{\"type\":\"string\"}");
    api_params_free(&p);
    assert_int_equal(parse("{\"guided_regex\":\"[a-z]+\"}", API_CHAT, &p, &e), 0);
    assert_int_equal(p.grammar_kind, PG_GRAMMAR_REGEX);
    assert_string_equal(p.grammar_text, "[a-z]+");
    api_params_free(&p);
    assert_int_equal(parse("{\"guided_choice\":[\"yes\",\"no\"]}", API_CHAT, &p, &e), 0);
    assert_int_equal(p.grammar_kind, PG_GRAMMAR_CHOICE);
    api_params_free(&p);
    assert_int_equal(parse("{\"guided_grammar\":\"root ::= \\\"x\\\"\"}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(p.grammar_kind, PG_GRAMMAR_GBNF);
    api_params_free(&p);
    assert_int_equal(parse("{\"structured_outputs\":{\"choice\":[\"a\"]}}", API_CHAT, &p, &e), 0);
    assert_int_equal(p.grammar_kind, PG_GRAMMAR_CHOICE);
    api_params_free(&p);
    assert_int_equal(parse("{\"structured_outputs\":{\"json\":{\"type\":\"object\"}}}", API_CHAT, &p, &e), 0);
    assert_non_null(p.guided_json);
    api_params_free(&p);
    assert_int_equal(parse("{\"structured_outputs\":{\"json_object\":true}}", API_CHAT, &p, &e), 0);
    assert_int_equal(p.grammar_kind, PG_GRAMMAR_JSON_OBJECT);
    api_params_free(&p);
}

static void test_response_format_errors(void **st) {
    (void)st;
    expect_400("{\"response_format\":\"json\"}", API_CHAT, "response_format", NULL);
    expect_400("{\"response_format\":{\"type\":\"yaml\"}}", API_CHAT, "response_format.type", "yaml");
    expect_400("{\"response_format\":{\"type\":\"json_schema\"}}", API_CHAT, "response_format.json_schema", NULL);
    expect_400("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}}", API_CHAT,
               "response_format.json_schema.name", "name");
    expect_400("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a b\",\"schema\":{}}}}",
               API_CHAT, "response_format.json_schema.name", NULL);
    expect_400("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":5}}}",
               API_CHAT, "response_format.json_schema.schema", NULL);
    expect_400("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"strict\":1,\"schema\":{}}}}",
               API_CHAT, "response_format.json_schema.strict", NULL);
    expect_400("{\"guided_json\":\"not json\"}", API_CHAT, "guided_json", NULL);
    expect_400("{\"guided_regex\":5}", API_CHAT, "guided_regex", NULL);
    expect_400("{\"guided_choice\":[]}", API_CHAT, "guided_choice", NULL);
    expect_400("{\"guided_choice\":[\"a\",1]}", API_CHAT, "guided_choice", NULL);
    expect_400("{\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]}", API_CHAT, "guided_choice", "only one");
    expect_400("{\"response_format\":{\"type\":\"json_object\"},\"guided_regex\":\"a\"}", API_CHAT, "guided_regex",
               "only one");
    expect_400("{\"structured_outputs\":{\"structural_tag\":{}}}", API_CHAT, "structured_outputs", "structural_tag");
    expect_400("{\"guided_whitespace_pattern\":\" \"}", API_CHAT, "guided_whitespace_pattern", NULL);
}

static void test_logit_bias_limits(void **st) {
    (void)st;
    api_params p;
    api_error e;
    assert_int_equal(parse("{\"logit_bias\":{}}", API_CHAT, &p, &e), 0);  // empty is fine
    assert_int_equal(p.n_logit_bias, 0);
    api_params_free(&p);
    assert_int_equal(parse("{\"logit_bias\":{\"50\":-100,\"7\":100,\"999\":0.5}}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(p.n_logit_bias, 3);
    assert_int_equal(p.bias_ids[0], 7);  // sorted by id
    assert_true(p.bias_values[0] == 100.0f);
    assert_int_equal(p.bias_ids[2], 999);
    assert_true(p.bias_values[2] == 0.5f);
    api_params_free(&p);
    expect_400("{\"logit_bias\":{\"1000\":1}}", API_CHAT, "logit_bias", "token id");
    expect_400("{\"logit_bias\":{\"-1\":1}}", API_CHAT, "logit_bias", NULL);
    expect_400("{\"logit_bias\":{\"abc\":1}}", API_CHAT, "logit_bias", NULL);
    expect_400("{\"logit_bias\":{\"1.5\":1}}", API_CHAT, "logit_bias", NULL);
    expect_400("{\"logit_bias\":{\"1\":-100.5}}", API_CHAT, "logit_bias", "[-100, 100]");
    expect_400("{\"logit_bias\":{\"1\":\"5\"}}", API_CHAT, "logit_bias", NULL);
    expect_400("{\"logit_bias\":{\"7\":1,\"07\":2}}", API_CHAT, "logit_bias", "twice");
    expect_400("{\"logit_bias\":[1]}", API_CHAT, "logit_bias", NULL);
    // 301 entries: one over OpenAI's limit.
    char *big = malloc(16384);
    strcpy(big, "{\"logit_bias\":{");
    for (int i = 0; i < 301; i++) sprintf(big + strlen(big), "%s\"%d\":1", i ? "," : "", i);
    strcat(big, "}}");
    expect_400(big, API_CHAT, "logit_bias", "300");
    big[strlen(big) - 2] = 0;
    *strrchr(big, ',') = 0;  // 300 entries
    strcat(big, "}}");
    assert_int_equal(parse(big, API_CHAT, &p, &e), 0);
    assert_int_equal(p.n_logit_bias, 300);
    api_params_free(&p);
    free(big);
}

static void test_token_controls(void **st) {
    (void)st;
    api_params p;
    api_error e;
    assert_int_equal(parse("{\"allowed_token_ids\":[1,2,3],\"bad_words\":[\"foo\",\"bar baz\"],"
                           "\"min_tokens\":2,\"stop_token_ids\":[5],\"user\":\"u1\","
                           "\"metadata\":{\"k\":\"v\"},\"prompt_logprobs\":3}",
                           API_CHAT, &p, &e), 0);
    assert_int_equal(p.n_allowed, 3);
    assert_int_equal(p.n_bad_words, 2);
    assert_string_equal(p.bad_words[1], "bar baz");
    assert_int_equal(p.sp.min_tokens, 2);
    assert_int_equal(p.prompt_logprobs, 3);
    assert_true(p.sp.want_prompt_logprobs);
    assert_int_equal(p.sp.prompt_logprobs, 3);
    api_params_free(&p);
    // A stream takes prompt_logprobs 0 (and reports nothing), refuses more (vLLM).
    expect_400("{\"prompt_logprobs\":2,\"stream\":true}", API_CHAT, "prompt_logprobs", "stream=True");
    assert_int_equal(parse("{\"prompt_logprobs\":0,\"stream\":true}", API_COMPLETION, &p, &e), 0);
    assert_false(p.sp.want_prompt_logprobs);
    api_params_free(&p);
    expect_400("{\"allowed_token_ids\":[]}", API_CHAT, "allowed_token_ids", NULL);
    expect_400("{\"allowed_token_ids\":[1000]}", API_CHAT, "allowed_token_ids", NULL);
    expect_400("{\"bad_words\":[\"\"]}", API_CHAT, "bad_words", NULL);
    expect_400("{\"bad_words\":\"x\"}", API_CHAT, "bad_words", NULL);
    expect_400("{\"metadata\":{\"k\":1}}", API_CHAT, "metadata", NULL);
    expect_400("{\"metadata\":[]}", API_CHAT, "metadata", NULL);
    expect_400("{\"prompt_logprobs\":21}", API_COMPLETION, "prompt_logprobs", NULL);
    // best_of: completions only, at least n, never streamed above n.
    assert_int_equal(parse("{\"n\":2,\"best_of\":4}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(p.best_of, 4);
    api_params_free(&p);
    expect_400("{\"n\":2,\"best_of\":1}", API_COMPLETION, "best_of", NULL);
    expect_400("{\"best_of\":3,\"stream\":true}", API_COMPLETION, "best_of", "stream");
    expect_400("{\"best_of\":3}", API_CHAT, "best_of", "completions");
    // echo with logprobs asks for the prompt's logprobs at the same depth
    // (the larger of it and prompt_logprobs); streamed too, in the echo chunk.
    assert_int_equal(parse("{\"echo\":true,\"logprobs\":2,\"stream\":true}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(p.prompt_logprobs, -1);
    assert_true(p.sp.want_prompt_logprobs);
    assert_int_equal(p.sp.prompt_logprobs, 2);
    api_params_free(&p);
    assert_int_equal(parse("{\"echo\":true,\"logprobs\":2,\"prompt_logprobs\":4}", API_COMPLETION, &p, &e), 0);
    assert_int_equal(p.sp.prompt_logprobs, 4);
    api_params_free(&p);
    assert_int_equal(parse("{\"logprobs\":2}", API_COMPLETION, &p, &e), 0);
    assert_false(p.sp.want_prompt_logprobs);
    api_params_free(&p);
    // max_tokens 0: only with echo (the prompt alone, vLLM's), one engine token.
    assert_int_equal(parse("{\"echo\":true,\"max_tokens\":0}", API_COMPLETION, &p, &e), 0);
    assert_true(p.echo_only);
    assert_int_equal(p.sp.max_tokens, 1);
    api_params_free(&p);
    expect_400("{\"max_tokens\":0}", API_COMPLETION, "max_tokens", NULL);
    expect_400("{\"echo\":true,\"max_tokens\":0}", API_CHAT, "max_tokens", NULL);
}

static void test_compile_through_cache(void **st) {
    (void)st;
    const char *toks[] = {"a", "b", "{", "}", "\"", ":", "1", " ", ","};
    int32_t lens[9];
    for (int i = 0; i < 9; i++) lens[i] = 1;
    pg_struct_vocab *v;
    assert_int_equal(pg_struct_vocab_create(9, toks, lens, NULL, -1, &v), 0);
    pg_grammar_cache *c = pg_grammar_cache_create(v, NULL, 2);
    api_params p, q;
    api_error e;
    assert_int_equal(parse("{\"guided_json\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}",
                           API_CHAT, &p, &e), 0);
    assert_int_equal(api_compile_grammar(c, &p, &e), 0);
    assert_non_null(p.grammar);
    assert_int_equal(parse("{\"guided_json\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}",
                           API_COMPLETION, &q, &e), 0);
    assert_int_equal(api_compile_grammar(c, &q, &e), 0);
    assert_ptr_equal(p.grammar, q.grammar);  // shared: its states are warm for the second request
    api_params_free(&q);
    // A schema that does not compile is a 400 naming the field and the reason.
    assert_int_equal(parse("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
                           "\"schema\":{\"type\":\"string\",\"pattern\":\"(a\"}}}}", API_CHAT, &q, &e), 0);
    assert_int_equal(api_compile_grammar(c, &q, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "response_format");
    assert_non_null(strstr(e.message, "pattern"));
    api_params_free(&q);
    assert_int_equal(parse("{\"guided_grammar\":\"root ::= foo\"}", API_CHAT, &q, &e), 0);
    assert_int_equal(api_compile_grammar(c, &q, &e), -1);
    assert_non_null(strstr(e.message, "undefined rule 'foo'"));
    api_params_free(&q);
    // Eviction keeps references held elsewhere valid.
    for (int i = 0; i < 3; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"guided_regex\":\"a{%d}\"}", i + 1);
        assert_int_equal(parse(body, API_CHAT, &q, &e), 0);
        assert_int_equal(api_compile_grammar(c, &q, &e), 0);
        api_params_free(&q);
    }
    pg_matcher *m = pg_matcher_create(p.grammar);
    assert_int_equal(pg_matcher_advance(m, 2), 0);  // "{"
    pg_matcher_free(m);
    api_params_free(&p);
    pg_grammar_cache_free(c);
    pg_struct_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_response_format_spellings),
        cmocka_unit_test(test_response_format_errors),
        cmocka_unit_test(test_logit_bias_limits),
        cmocka_unit_test(test_token_controls),
        cmocka_unit_test(test_compile_through_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
