// server/cmd_template.c - `paged render-template`: renders a Jinja chat
// template with a JSON context, as the server would, and prints the text.
// For checking a model's template by hand and for the test that compares
// paged's Jinja engine with Python's jinja2 (tests/integration/
// test_chat_templates.py).
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "text/template/jinja.h"
#include "server/commands.h"

static const char *usage =
    "usage: paged render-template TEMPLATE_FILE [CONTEXT_JSON_FILE]\n"
    "       paged render-template TEMPLATE_FILE --each CONTEXTS_JSON_FILE\n"
    "Renders the Jinja template with the variables of the JSON object in\n"
    "CONTEXT_JSON_FILE (or stdin; e.g. {\"messages\": [...], \"add_generation_prompt\": true})\n"
    "and prints the result. Exit code 1 with the reason on stderr on error.\n"
    "--each: the file holds a list of contexts; prints a JSON list of\n"
    "{\"text\": ...} or {\"error\": ...}, one per context (exit 0).\n";

// --each: one template, many contexts, one JSON answer (the corpus test
// renders hundreds of conversations without a process each).
static int render_each(const pg_jinja_template *t, const cJSON *list) {
    cJSON *res = cJSON_CreateArray();
    const cJSON *ctx;
    cJSON_ArrayForEach(ctx, list) {
        cJSON *r = cJSON_CreateObject();
        char *out = NULL;
        if (pg_jinja_render(t, ctx, NULL, &out) == 0) cJSON_AddStringToObject(r, "text", out);
        else cJSON_AddStringToObject(r, "error", pg_err_msg());
        free(out);
        cJSON_AddItemToArray(res, r);
    }
    char *s = cJSON_PrintUnformatted(res);
    fputs(s, stdout);
    free(s);
    cJSON_Delete(res);
    return 0;
}

static int read_stdin(char **out, size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = pg_xmalloc(cap);
    size_t k;
    while ((k = fread(b + n, 1, cap - n - 1, stdin)) > 0) {
        n += k;
        if (n + 1 == cap) b = pg_xrealloc(b, cap *= 2);
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

int cmd_render_template(int argc, char **argv) {
    bool each = argc == 3 && !strcmp(argv[1], "--each");
    if (each) {
        argv[1] = argv[2];
        argc = 2;
    }
    if (argc < 1 || argc > 2 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        fputs(usage, argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    char *src = NULL, *ctx_text = NULL, *out = NULL;
    size_t src_len, ctx_len;
    cJSON *ctx = NULL;
    pg_jinja_template *t = NULL;
    int rc = 1;
    if (pg_read_file(argv[0], 16u << 20, &src, &src_len) < 0) {
        fprintf(stderr, "paged render-template: %s\n", pg_err_msg());
        goto done;
    }
    if (argc == 2 ? pg_read_file(argv[1], 64u << 20, &ctx_text, &ctx_len) < 0 : read_stdin(&ctx_text, &ctx_len) < 0) {
        fprintf(stderr, "paged render-template: %s\n", pg_err_msg());
        goto done;
    }
    ctx = cJSON_ParseWithLength(ctx_text, ctx_len);
    if (each ? !cJSON_IsArray(ctx) : !cJSON_IsObject(ctx)) {
        fprintf(stderr, "paged render-template: the context is not a JSON %s\n", each ? "list" : "object");
        goto done;
    }
    if (pg_jinja_parse(src, src_len, &t) < 0) {
        fprintf(stderr, "paged render-template: %s: %s\n", argv[0], pg_err_msg());
        goto done;
    }
    if (each) {
        rc = render_each(t, ctx);
        goto done;
    }
    if (pg_jinja_render(t, ctx, NULL, &out) < 0) {
        fprintf(stderr, "paged render-template: %s: %s\n", argv[0], pg_err_msg());
        goto done;
    }
    fwrite(out, 1, strlen(out), stdout);
    rc = 0;
done:
    free(out);
    pg_jinja_free(t);
    cJSON_Delete(ctx);
    free(ctx_text);
    free(src);
    return rc;
}
