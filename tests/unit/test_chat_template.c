// tests/unit/test_chat_template.c - native chat templates against prompts
// rendered by Jinja2 from the real templates (tests/data/chat_golden.json,
// made by tests/data/gen_chat_golden.py).
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/file.h"
#include "text/template/chat_template.h"
#include "tests/unit/gguf_writer.h"

static void test_golden(void **state) {
    char path[4096], *text;
    size_t len;
    assert_true(tw_repo_path("tests/data/chat_golden.json", path, sizeof path));
    assert_int_equal(pg_read_file(path, 16 << 20, &text, &len), 0);
    cJSON *cases = cJSON_ParseWithLength(text, len);
    assert_non_null(cases);
    int n_ok = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *family = cJSON_GetObjectItem(c, "family")->valuestring;
        pg_chat_template *t;
        assert_int_equal(pg_chat_template_parse(cJSON_GetObjectItem(c, "template")->valuestring, &t), 0);
        assert_string_equal(pg_chat_family_name(pg_chat_template_family(t)), family);
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        int n = cJSON_GetArraySize(msgs);
        pg_chat_msg m[8];
        for (int i = 0; i < n; i++) {
            const cJSON *mi = cJSON_GetArrayItem(msgs, i);
            m[i] = (pg_chat_msg){cJSON_GetObjectItem(mi, "role")->valuestring,
                                 cJSON_GetObjectItem(mi, "content")->valuestring};
        }
        char *out = NULL;
        int rc = pg_chat_template_apply(t, m, n, cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")), &out);
        const cJSON *want = cJSON_GetObjectItem(c, "text");
        if (want) {
            assert_int_equal(rc, 0);
            if (strcmp(out, want->valuestring))
                fail_msg("%s: got\n%s\nwant\n%s", family, out, want->valuestring);
        } else {
            // Jinja raised (e.g. a system role for Mistral): we must refuse too.
            assert_true(rc < 0);
            assert_true(strlen(pg_err_msg()) > 0);
        }
        free(out);
        pg_chat_template_free(t);
        n_ok++;
    }
    print_message("%d golden chat prompts match\n", n_ok);
    assert_true(n_ok >= 32);
    cJSON_Delete(cases);
    free(text);
}

static void test_errors(void **state) {
    pg_chat_template *t;
    assert_int_equal(pg_chat_template_parse("{{ messages | tojson }}", &t), PG_EUNSUPP);
    assert_non_null(strstr(pg_err_msg(), "not recognised"));
    assert_int_equal(pg_chat_template_parse("chatml", &t), 0);
    pg_chat_msg bad[] = {{"robot", "hi"}};
    char *out;
    assert_int_equal(pg_chat_template_apply(t, bad, 1, true, &out), PG_EINVAL);
    assert_non_null(strstr(pg_err_msg(), "robot"));
    pg_chat_template_free(t);
    assert_int_equal(pg_chat_template_parse("llama2", &t), 0);
    pg_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    assert_int_equal(pg_chat_template_apply(t, two_users, 2, true, &out), PG_EINVAL);
    pg_chat_template_free(t);
}

// The Jinja path: a real template (Qwen2.5's) with tools, a tool call and
// its result, bos/eos and chat_template_kwargs.
static void test_jinja_render(void **state) {
    char path[4096], *text;
    size_t len;
    assert_true(tw_repo_path("tests/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja", path, sizeof path));
    assert_int_equal(pg_read_file(path, 1 << 20, &text, &len), 0);
    pg_chat_template *t;
    assert_int_equal(pg_chat_template_create(text, &t), 0);
    assert_int_equal(pg_chat_template_family(t), PG_CHAT_JINJA);
    assert_true(pg_chat_template_renders_bos(t));
    assert_non_null(strstr(pg_chat_template_source(t), "<tool_call>"));
    pg_chat_template_set_tokens(t, "<|endoftext|>", "<|im_end|>");
    cJSON *msgs = cJSON_Parse(
        "[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"21 C\"}]");
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}]");
    pg_chat_render_opts o = {.tools = tools, .add_generation_prompt = true};
    char *out;
    assert_int_equal(pg_chat_template_render(t, msgs, &o, &out), 0);
    const char *want[] = {"<|im_start|>system\nYou are Qwen", "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"",
                          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                          "<tool_response>\n21 C\n</tool_response>"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i])) fail_msg("missing %s in\n%s", want[i], out);
    assert_true(strlen(out) > 20 && !strcmp(out + strlen(out) - 22, "<|im_start|>assistant\n"));
    free(out);
    // chat_template_kwargs become variables; HF's own variables win over them.
    cJSON *kw = cJSON_Parse("{\"add_generation_prompt\": false, \"custom\": 1}");
    pg_chat_render_opts o2 = {.kwargs = kw, .add_generation_prompt = true};
    assert_int_equal(pg_chat_template_render(t, msgs, &o2, &out), 0);
    assert_true(!strcmp(out + strlen(out) - 22, "<|im_start|>assistant\n"));
    free(out);
    pg_chat_template_free(t);
    // A native family refuses tools and tool calls with a clear message.
    assert_int_equal(pg_chat_template_create("chatml", &t), 0);
    assert_int_equal(pg_chat_template_render(t, msgs, &o, &out), PG_EINVAL);
    assert_non_null(strstr(pg_err_msg(), "cannot render tools"));
    pg_chat_template_free(t);
    // Text the Jinja engine cannot parse falls back to its native family.
    assert_int_equal(pg_chat_template_create("{% call x %}<|im_start|>{% endcall %}", &t), 0);
    assert_int_equal(pg_chat_template_family(t), PG_CHAT_CHATML);
    pg_chat_template_free(t);
    assert_int_equal(pg_chat_template_create("{% if %}", &t), PG_EINVAL);
    cJSON_Delete(kw);
    cJSON_Delete(tools);
    cJSON_Delete(msgs);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_jinja_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
