// tests/unit/test_tool_calls.c - the tool-call parsers on hand-written model
// outputs of each format, streamed in every chunk size against the whole
// output, and the validation of tools / tool_choice with the guided_json
// schemas built for required and named tool choice.
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/api_common.h"
#include "server/tool_calls.h"

// The calls of a whole parse as "name(args)|name(args)" and its content.
static void whole(tc_format fmt, const char *named, bool parallel, const char *text, char *calls_out,
                  size_t cap, char **content) {
    api_tools t = {.format = fmt, .named = (char *)named, .parallel = parallel};
    cJSON *calls;
    tools_parse_output(&t, text, content, &calls);
    calls_out[0] = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItem(c, "function");
        const char *id = cJSON_GetObjectItem(c, "id")->valuestring;
        assert_true(strlen(id) >= 9);
        if (fmt == TC_FMT_MISTRAL) assert_int_equal(strlen(id), 9);
        assert_string_equal(cJSON_GetObjectItem(c, "type")->valuestring, "function");
        size_t n = strlen(calls_out);
        snprintf(calls_out + n, cap - n, "%s%s(%s)", n ? "|" : "", cJSON_GetObjectItem(fn, "name")->valuestring,
                 cJSON_GetObjectItem(fn, "arguments")->valuestring);
    }
    cJSON_Delete(calls);
}

// The same output fed `chunk` bytes at a time; every call's first delta
// must carry its id and name before any argument text.
static void streamed(tc_format fmt, const char *named, bool parallel, const char *text, size_t chunk,
                     char *calls_out, size_t cap, char *content, size_t ccap) {
    tc_stream *s = tc_stream_new(fmt, named, parallel);
    char names[8][64] = {{0}}, args[8][512] = {{0}};
    bool seen[8] = {0};
    content[0] = 0;
    size_t n = strlen(text);
    for (size_t off = 0;;) {
        size_t k = n - off < chunk ? n - off : chunk;
        bool final = off + k >= n;
        tc_delta d = {0};
        tc_stream_feed(s, text + off, k, final, &d);
        strncat(content, sbuf_str(&d.content), ccap - strlen(content) - 1);
        for (int i = 0; i < d.n_calls; i++) {
            tc_delta_call *c = &d.calls[i];
            assert_true(c->index < 8);
            if (c->name) {
                assert_false(seen[c->index]);
                assert_true(c->id[0] != 0);
                seen[c->index] = true;
                snprintf(names[c->index], sizeof names[0], "%s", c->name);
            } else {
                assert_true(seen[c->index]);  // arguments never come before the name
            }
            strncat(args[c->index], sbuf_str(&c->args), sizeof args[0] - strlen(args[c->index]) - 1);
        }
        tc_delta_free(&d);
        off += k;
        if (final) break;
    }
    calls_out[0] = 0;
    for (int i = 0; i < tc_stream_n_calls(s); i++) {
        size_t m = strlen(calls_out);
        snprintf(calls_out + m, cap - m, "%s%s(%s)", m ? "|" : "", names[i], args[i]);
    }
    tc_stream_free(s);
}

// Whole and streamed (every chunk size up to 9 and all at once) parses
// give `want_calls` and `want_content` (NULL: no content).
static void check(tc_format fmt, const char *named, bool parallel, const char *text, const char *want_calls,
                  const char *want_content) {
    char calls[2048], *content;
    whole(fmt, named, parallel, text, calls, sizeof calls, &content);
    if (strcmp(calls, want_calls)) fail_msg("whole %s: calls %s, want %s", text, calls, want_calls);
    if (want_content) {
        assert_non_null(content);
        assert_string_equal(content, want_content);
    } else if (content) {
        fail_msg("whole %s: content %s, want none", text, content);
    }
    free(content);
    if (!want_calls[0] && want_content && strcmp(want_content, text)) return;
    for (size_t chunk = 1; chunk <= 10; chunk++) {
        char sc[2048], scontent[2048];
        streamed(fmt, named, parallel, text, chunk == 10 ? strlen(text) : chunk, sc, sizeof sc, scontent,
                 sizeof scontent);
        if (want_calls[0] && strcmp(sc, want_calls))
            fail_msg("streamed by %zu %s: calls %s, want %s", chunk, text, sc, want_calls);
        // Streamed content: what comes before the calls (blank is still sent).
        if (want_calls[0] && want_content && strcmp(scontent, want_content))
            fail_msg("streamed by %zu: content '%s', want '%s'", chunk, scontent, want_content);
        if (!want_calls[0] && strcmp(scontent, text))
            fail_msg("streamed by %zu: content '%s', want the whole text", chunk, scontent);
    }
}

static void test_hermes(void **state) {
    (void)state;
    check(TC_FMT_HERMES, NULL, true,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
          "get_weather({\"city\": \"Paris\"})", NULL);
    check(TC_FMT_HERMES, NULL, true,
          "Let me check.\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\n"
          "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>",
          "get_weather({\"city\": \"Paris\"})|add({\"a\":1,\"b\":2})", "Let me check.\n");
    // Braces and quotes inside strings, nested arrays.
    check(TC_FMT_HERMES, NULL, true,
          "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a}b{\\\"\", \"n\": {\"x\": [1, {\"y\": 2}]}}}</tool_call>",
          "f({\"s\": \"a}b{\\\"\", \"n\": {\"x\": [1, {\"y\": 2}]}})", NULL);
    // Arguments before the name, arguments as a JSON string, no arguments.
    check(TC_FMT_HERMES, NULL, true, "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>",
          "f({\"a\": 1})", NULL);
    check(TC_FMT_HERMES, NULL, true, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
          "f({\"a\": 1})", NULL);
    check(TC_FMT_HERMES, NULL, true, "<tool_call>{\"name\": \"f\"}</tool_call>", "f({})", NULL);
    // parallel_tool_calls false keeps the first call.
    check(TC_FMT_HERMES, NULL, false,
          "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>",
          "a({})", NULL);
}

static void test_hermes_not_calls(void **state) {
    (void)state;
    // Plain text, a marker prefix at the very end, a truncated call, a call
    // without a name: all content, nothing lost.
    check(TC_FMT_HERMES, NULL, true, "Hello, the weather is nice.", "", "Hello, the weather is nice.");
    check(TC_FMT_HERMES, NULL, true, "Almost a tag <tool_ca", "", "Almost a tag <tool_ca");
    char calls[256], *content;
    const char *trunc = "<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": 1}";
    whole(TC_FMT_HERMES, NULL, true, trunc, calls, sizeof calls, &content);
    assert_string_equal(calls, "");
    assert_string_equal(content, trunc);
    free(content);
    const char *noname = "<tool_call>{\"arguments\": {}}</tool_call>";
    whole(TC_FMT_HERMES, NULL, true, noname, calls, sizeof calls, &content);
    assert_string_equal(calls, "");
    assert_string_equal(content, noname);
    free(content);
}

static void test_llama3(void **state) {
    (void)state;
    check(TC_FMT_LLAMA3, NULL, true, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
          "get_weather({\"city\": \"Paris\"})", NULL);
    check(TC_FMT_LLAMA3, NULL, true, "\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
          "get_weather({\"city\": \"Paris\"})", NULL);
    check(TC_FMT_LLAMA3, NULL, true,
          "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1}}; {\"name\": \"get_weather\", \"parameters\": {}}",
          "add({\"a\": 1})|get_weather({})", NULL);
    check(TC_FMT_LLAMA3, NULL, true, "The set is {1, 2}.", "", "The set is {1, 2}.");
}

static void test_mistral(void **state) {
    (void)state;
    check(TC_FMT_MISTRAL, NULL, true,
          "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"get_weather\", "
          "\"arguments\": {\"city\": \"Paris\"}}]",
          "add({\"a\": 1, \"b\": 2})|get_weather({\"city\": \"Paris\"})", NULL);
    check(TC_FMT_MISTRAL, NULL, true, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
          "get_weather({\"city\": \"Paris\"})", NULL);
    check(TC_FMT_MISTRAL, NULL, true,
          "[TOOL_CALLS]add[ARGS]{\"a\": 1}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}",
          "add({\"a\": 1})|get_weather({\"city\": \"Rome\"})", NULL);
    check(TC_FMT_MISTRAL, NULL, true, "No tools needed.", "", "No tools needed.");
}

static void test_constrained(void **state) {
    (void)state;
    check(TC_FMT_REQUIRED, NULL, true,
          "[{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}, {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}]",
          "add({\"a\": 1, \"b\": 2})|get_weather({\"city\": \"Oslo\"})", NULL);
    check(TC_FMT_NAMED, "get_weather", true, "{\"city\": \"Paris\", \"unit\": \"celsius\"}",
          "get_weather({\"city\": \"Paris\", \"unit\": \"celsius\"})", NULL);
    // Unconstrained text where JSON was asked for: content, no call.
    char calls[256], *content;
    whole(TC_FMT_NAMED, "get_weather", true, "Sure! The weather", calls, sizeof calls, &content);
    assert_string_equal(calls, "");
    assert_string_equal(content, "Sure! The weather");
    free(content);
}

// --- request validation ---------------------------------------------------------------

static int tools_of(const char *json, api_tools **t, api_error *e) {
    cJSON *body = cJSON_Parse(json);
    assert_non_null(body);
    int rc = api_parse_tools(body, t, e);
    cJSON_Delete(body);
    return rc;
}

#define WEATHER "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}"
#define ADD "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}"

static void test_parse_tools(void **state) {
    (void)state;
    api_tools *t;
    api_error e;
    assert_int_equal(tools_of("{}", &t, &e), 0);
    assert_null(t);
    assert_int_equal(tools_of("{\"tools\":[],\"tool_choice\":\"none\"}", &t, &e), 0);
    assert_null(t);
    assert_int_equal(tools_of("{\"tools\":[" WEATHER "," ADD "]}", &t, &e), 0);
    assert_non_null(t);
    assert_int_equal(t->choice, TC_CHOICE_AUTO);
    assert_true(t->parallel);
    assert_null(tools_guided_json(t));
    tools_set_format(t, "{% for m in messages %}<|im_start|>{% endfor %}");
    assert_int_equal(t->format, TC_FMT_HERMES);
    tools_set_format(t, "{{ '[TOOL_CALLS]' }}");
    assert_int_equal(t->format, TC_FMT_MISTRAL);
    assert_true(tools_need_special_tokens(t));
    tools_set_format(t, "<|start_header_id|>ipython<|end_header_id|>");
    assert_int_equal(t->format, TC_FMT_LLAMA3);
    api_tools_free(t);

    // required: vLLM's array schema, one item at most without parallel calls.
    assert_int_equal(tools_of("{\"tools\":[" WEATHER "," ADD "],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}", &t, &e), 0);
    char *g = tools_guided_json(t);
    cJSON *s = cJSON_Parse(g);
    assert_string_equal(cJSON_GetObjectItem(s, "type")->valuestring, "array");
    assert_int_equal(cJSON_GetObjectItem(s, "minItems")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(s, "maxItems")->valueint, 1);
    const cJSON *any = cJSON_GetObjectItem(cJSON_GetObjectItem(s, "items"), "anyOf");
    assert_int_equal(cJSON_GetArraySize(any), 2);
    const cJSON *p0 = cJSON_GetObjectItem(cJSON_GetArrayItem(any, 0), "properties");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(p0, "name"), "enum"), 0)->valuestring,
                        "get_weather");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(p0, "parameters"), "required")->child->valuestring, "city");
    const cJSON *p1 = cJSON_GetObjectItem(cJSON_GetArrayItem(any, 1), "properties");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(p1, "parameters"), "type")->valuestring, "object");
    cJSON_Delete(s);
    free(g);
    tools_set_format(t, "<tool_call>");
    assert_int_equal(t->format, TC_FMT_REQUIRED);
    api_tools_free(t);

    // named: the function's parameters schema itself.
    assert_int_equal(tools_of("{\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}", &t, &e), 0);
    assert_int_equal(t->choice, TC_CHOICE_NAMED);
    g = tools_guided_json(t);
    s = cJSON_Parse(g);
    assert_non_null(cJSON_GetObjectItem(cJSON_GetObjectItem(s, "properties"), "city"));
    cJSON_Delete(s);
    free(g);
    api_tools_free(t);

    const char *bad[] = {
        "{\"tools\":5}",
        "{\"tools\":[5]}",
        "{\"tools\":[{\"type\":\"function\"}]}",
        "{\"tools\":[{\"type\":\"retrieval\",\"function\":{\"name\":\"a\"}}]}",
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"has space\"}}]}",
        "{\"tools\":[" ADD "," ADD "]}",
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":[]}}]}",
        "{\"tools\":[" ADD "],\"tool_choice\":\"sometimes\"}",
        "{\"tools\":[" ADD "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}",
        "{\"tool_choice\":\"required\"}",
        "{\"tools\":[" ADD "],\"parallel_tool_calls\":\"yes\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        t = NULL;
        if (tools_of(bad[i], &t, &e) != -1) fail_msg("accepted: %s", bad[i]);
        assert_null(t);
        assert_int_equal(e.status, 400);
        assert_true(!strcmp(e.param, "tools") || !strcmp(e.param, "tool_choice") || !strcmp(e.param, "parallel_tool_calls"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_hermes_not_calls),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_constrained),
        cmocka_unit_test(test_parse_tools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
