// tests/fuzz/fuzz_jinja.c - fuzz target for the Jinja engine (text/template/jinja.h).
//
// Input: a template source (arbitrary bytes). It is parsed and, when it
// parses, rendered with a fixed chat context (system/user/assistant
// messages, a tool call and its result, tools, add_generation_prompt,
// bos/eos tokens) under small limits, so a hostile input ends quickly.
// Checked on every input:
//   - parse and render either succeed or fail with a non-empty message;
//   - a successful render is a NUL-terminated string no longer than the
//     output limit, and rendering twice gives the same text;
//   - nothing leaks (ASan/LSan) and nothing overruns the C stack.
// Seeds: the real chat templates of tests/data/chat_templates
// (tests/fuzz/corpus/jinja). Built with the standalone driver
// (build/fuzz/fuzz_jinja) and with libFuzzer (build/fuzz/libfuzzer_jinja).
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/template/jinja.h"

#define CHECK(c)                                                                        \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "fuzz_jinja: %s:%d: %s (%s)\n", __FILE__, __LINE__, #c,     \
                    pg_err_msg());                                                      \
            abort();                                                                    \
        }                                                                               \
    } while (0)

static const char *CONTEXT =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": \"Weather in Paris? \\u00e9\\ud83d\\ude42\"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call1abcd\", \"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call1abcd\", \"content\": \"21.5\"},"
    "{\"role\": \"assistant\", \"content\": \"It is 21.5 degrees.\"},"
    "{\"role\": \"user\", \"content\": \"Thanks\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 3.5}";

static cJSON *g_ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_ctx) g_ctx = cJSON_Parse(CONTEXT);
    CHECK(g_ctx);
    pg_jinja_template *t;
    if (pg_jinja_parse((const char *)data, size, &t) < 0) {
        CHECK(pg_err_msg()[0]);
        return 0;
    }
    pg_jinja_limits lim;
    pg_jinja_limits_default(&lim);
    lim.max_steps = 200000;
    lim.max_output = 1 << 20;
    lim.max_memory = 16 << 20;
    lim.max_depth = 32;
    char *a = NULL, *b = NULL;
    int rc = pg_jinja_render(t, g_ctx, &lim, &a);
    if (rc < 0) {
        CHECK(pg_err_msg()[0]);
        CHECK(!a);
    } else {
        CHECK(a && strlen(a) <= lim.max_output);
        // strftime_now is the one source of difference between two renders.
        if (!memmem(data, size, "strftime", 8)) {
            CHECK(pg_jinja_render(t, g_ctx, &lim, &b) == 0);
            CHECK(!strcmp(a, b));
        }
    }
    free(a);
    free(b);
    pg_jinja_free(t);
    return 0;
}
