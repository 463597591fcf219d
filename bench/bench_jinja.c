// bench/bench_jinja.c - time to render a chat template (text/template/jinja.h).
//
// Renders every template of a directory (default tests/data/chat_templates)
// with a 6-message conversation with tools (the shape of an agent request),
// many times each, and prints the median microseconds per render and per
// parse. The chat route renders once per request on the loop thread, so
// this is the loop time a request's template costs.
//
// Usage: build/bench/bench_jinja [DIR] [REPEATS] [RESULTS.json]
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/file.h"
#include "text/template/jinja.h"

static const char *CONTEXT =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"},"
    "{\"role\": \"user\", \"content\": \"What is the weather in Paris?\"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call1abcd\", \"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call1abcd\", \"content\": \"{\\\"temperature\\\": 21}\"},"
    "{\"role\": \"assistant\", \"content\": \"It is 21 degrees.\"},"
    "{\"role\": \"user\", \"content\": \"And tomorrow?\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"documents\": null}";

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/data/chat_templates";
    int reps = argc > 2 ? atoi(argv[2]) : 200;
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "bench_jinja: cannot open %s\n", dir);
        return 1;
    }
    cJSON *ctx = cJSON_Parse(CONTEXT);
    cJSON *results = cJSON_CreateObject();  // name -> {parse_us, render_us, bytes}
    double *t_parse = malloc(sizeof(double) * (size_t)reps), *t_render = malloc(sizeof(double) * (size_t)reps);
    printf("%-56s %10s %10s %8s\n", "template", "parse us", "render us", "bytes");
    struct dirent *e;
    double sum_render = 0;
    int n = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 6, ".jinja")) continue;
        char path[4096], *src;
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (pg_read_file(path, 16u << 20, &src, &len) < 0) continue;
        size_t out_len = 0;
        int ok = 1;
        for (int r = 0; r < reps && ok; r++) {
            double t0 = now_us();
            pg_jinja_template *t;
            if (pg_jinja_parse(src, len, &t) < 0) { ok = 0; break; }
            double t1 = now_us();
            char *out;
            if (pg_jinja_render(t, ctx, NULL, &out) < 0) {
                printf("%-56s refuses: %.60s\n", e->d_name, pg_err_msg());
                ok = -1;
                pg_jinja_free(t);
                break;
            }
            double t2 = now_us();
            out_len = strlen(out);
            free(out);
            pg_jinja_free(t);
            t_parse[r] = t1 - t0;
            t_render[r] = t2 - t1;
        }
        free(src);
        if (ok != 1) continue;
        qsort(t_parse, (size_t)reps, sizeof(double), cmp_d);
        qsort(t_render, (size_t)reps, sizeof(double), cmp_d);
        printf("%-56s %10.1f %10.1f %8zu\n", e->d_name, t_parse[reps / 2], t_render[reps / 2], out_len);
        cJSON *r = cJSON_AddObjectToObject(results, e->d_name);
        cJSON_AddNumberToObject(r, "parse_us", t_parse[reps / 2]);
        cJSON_AddNumberToObject(r, "render_us", t_render[reps / 2]);
        cJSON_AddNumberToObject(r, "bytes", (double)out_len);
        sum_render += t_render[reps / 2];
        n++;
    }
    closedir(d);
    printf("%d templates: mean of the median render times %.1f us\n", n, n ? sum_render / n : 0);
    if (argc > 3) {
        cJSON *doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "bench", "bench_jinja");
        cJSON_AddNumberToObject(doc, "repeats", reps);
        cJSON_AddNumberToObject(doc, "mean_median_render_us", n ? sum_render / n : 0);
        cJSON_AddItemToObject(doc, "templates", results);
        results = NULL;
        char *js = cJSON_Print(doc);
        FILE *f = fopen(argv[3], "w");
        if (f) {
            fputs(js, f);
            fputc('\n', f);
            fclose(f);
        }
        free(js);
        cJSON_Delete(doc);
    }
    cJSON_Delete(results);
    free(t_parse);
    free(t_render);
    cJSON_Delete(ctx);
    return 0;
}
