// bench/bench_structured.c - per-token cost of structured outputs: grammar
// compile time, vocabulary build, and the mask + advance cost per token at
// batch 1 and batch B, cold (a new grammar: every state is built on first
// use) and warm (the same grammar again: states and masks cached).
//
// Usage: build/bench/bench_structured TOKENIZER.json [batch=64] [vocab]
//   TOKENIZER.json: e.g. tests/data/tokenizer_smollm2.json (49,152 tokens);
//   vocab: grow the vocabulary to this size with synthetic merged tokens
//   (128256 for a Llama-3-sized vocabulary; documents are still tokenized
//   by the real tokenizer, the extra tokens enlarge every mask and walk).
// Each sequence follows the tokens of its own random document that fits the
// schema (names, numbers and list lengths vary), as a model would emit it.
// Prints one line per (phase, batch) with p50 / p99 / max microseconds per
// token, where a step's time (fill masks for every sequence, then advance
// each) is divided by the batch, and at the end a summary, one line per
// batch size. "first" is a new grammar's first run after its background
// precomputation finished (the time it took is printed: a server overlaps
// it with the request's prefill); "race" is a new grammar run at once,
// while its precomputation is still going; PAGED_BENCH_NO_PRECOMPUTE=1 switches the
// precomputation off (every mask built on first use, as before it).
// Reads only TOKENIZER.json; needs only libc, libm and pthread at run time.
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "text/grammar/structured.h"
#include "text/tokenizer/tokenizer.h"

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"email\":{\"type\":\"string\",\"pattern\":\"^[a-z]+@[a-z]+\\\\.com$\"},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"score\":{\"type\":\"number\",\"minimum\":0,\"maximum\":100},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,\"maxItems\":5},"
    "\"address\":{\"type\":\"object\",\"properties\":{"
    "\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"city\"]},"
    "\"active\":{\"type\":\"boolean\"},"
    "\"notes\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}"
    "},\"required\":[\"name\",\"age\",\"email\",\"role\",\"tags\",\"address\",\"active\"]}";

static const char *WORDS[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf",
                              "hotel", "india", "juliet", "kilo", "lima", "mike", "november",
                              "oscar", "papa", "quebec", "romeo", "sierra", "tango"};

static uint64_t rng = 12345;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
static const char *word(void) { return WORDS[rnd() % 20]; }

static void make_doc(char *o, size_t cap) {
    int n = snprintf(o, cap, "{\"name\": \"%s %s\", \"age\": %u, \"email\": \"%s@%s.com\", \"role\": \"%s\", "
                             "\"score\": %u.%u, \"tags\": [", word(), word(), rnd() % 121, word(), word(),
                     (const char *[]){"admin", "user", "guest"}[rnd() % 3], rnd() % 100, rnd() % 100);
    int nt = 1 + (int)(rnd() % 5);
    for (int i = 0; i < nt; i++) n += snprintf(o + n, cap - (size_t)n, "%s\"%s\"", i ? ", " : "", word());
    n += snprintf(o + n, cap - (size_t)n,
                  "], \"address\": {\"street\": \"%u %s street\", \"city\": \"%s\", \"zip\": \"%05u\"}, "
                  "\"active\": %s, \"notes\": %s}",
                  rnd() % 999, word(), word(), rnd() % 99999, rnd() % 2 ? "true" : "false",
                  rnd() % 2 ? "null" : "\"see the file\"");
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    int32_t *ids;
    int n;
} doc;

// Steps `batch` matchers through their documents; per-token times into t.
static int run(pg_grammar *g, doc *docs, int batch, int32_t vocab, double *t, int *nt) {
    pg_matcher **m = calloc((size_t)batch, sizeof *m);
    uint32_t **mask = calloc((size_t)batch, sizeof *mask);
    for (int b = 0; b < batch; b++) {
        m[b] = pg_matcher_create(g);
        mask[b] = malloc(sizeof(uint32_t) * (size_t)((vocab + 31) / 32));
    }
    int maxn = 0;
    for (int b = 0; b < batch; b++) maxn = docs[b].n > maxn ? docs[b].n : maxn;
    *nt = 0;
    for (int s = 0; s < maxn; s++) {
        int live = 0;
        double t0 = now_us();
        for (int b = 0; b < batch; b++)
            if (s < docs[b].n) {
                pg_matcher_fill_mask(m[b], mask[b]);
                live++;
            }
        for (int b = 0; b < batch; b++)
            if (s < docs[b].n) {
                int32_t id = docs[b].ids[s];
                if (!(mask[b][id >> 5] >> (id & 31) & 1) || pg_matcher_advance(m[b], id) < 0) {
                    fprintf(stderr, "bench_structured: token %d of doc %d refused at step %d\n", id, b, s);
                    return -1;
                }
            }
        double dt = (now_us() - t0) / live;
        for (int k = 0; k < live; k++) t[(*nt)++] = dt;
    }
    for (int b = 0; b < batch; b++) {
        pg_matcher_free(m[b]);
        free(mask[b]);
    }
    free(m);
    free(mask);
    return 0;
}

typedef struct {
    double mean, p99;
} stat;

static stat report(const char *phase, int batch, double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    printf("%-5s batch %3d: %6d tokens  mean %8.2f  p50 %8.2f  p99 %8.2f  max %9.1f us/token\n", phase,
           batch, n, sum / n, t[n / 2], t[(int)(n * 0.99)], t[n - 1]);
    return (stat){sum / n, t[(int)(n * 0.99)]};
}

typedef struct {
    int batch;
    double compile_ms, pre_ms;
    stat first, warm, race;
    double mib;
} summary;

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TOKENIZER.json [batch=64] [vocab]\n", argv[0]);
        return 2;
    }
    int batch = argc > 2 ? atoi(argv[2]) : 64;
    pg_tokenizer *tok;
    if (pg_tokenizer_from_hf(argv[1], NULL, &tok) < 0) {
        fprintf(stderr, "bench_structured: %s: %s\n", argv[1], pg_err_msg());
        return 1;
    }
    int32_t vocab = pg_tokenizer_vocab_size(tok);
    // The tokenizer's tokens, then (with a larger target) synthetic ones:
    // concatenations of two random text tokens, as BPE merges are, so the
    // trie grows the way a larger real vocabulary's does.
    int32_t target = argc > 3 ? atoi(argv[3]) : vocab;
    if (target < vocab) target = vocab;
    char **tb = calloc((size_t)target, sizeof(char *));
    int32_t *tl = calloc((size_t)target, sizeof(int32_t));
    bool *sp = calloc((size_t)target, sizeof(bool));
    for (int32_t i = 0; i < vocab; i++) {
        char buf[1024];
        int k = pg_tokenizer_token_bytes(tok, i, buf, sizeof buf);
        if (k < 0 || k > (int)sizeof buf) k = 0;
        tb[i] = malloc((size_t)k + 1);
        memcpy(tb[i], buf, (size_t)k);
        tl[i] = k;
        sp[i] = pg_tokenizer_is_special(tok, i);
    }
    for (int32_t i = vocab; i < target; i++) {
        int32_t a, b;
        do {
            a = (int32_t)(rnd() % (uint32_t)vocab);
            b = (int32_t)(rnd() % (uint32_t)vocab);
        } while (sp[a] || sp[b] || !tl[a] || !tl[b] || tl[a] + tl[b] > 24);
        tl[i] = tl[a] + tl[b];
        tb[i] = malloc((size_t)tl[i]);
        memcpy(tb[i], tb[a], (size_t)tl[a]);
        memcpy(tb[i] + tl[a], tb[b], (size_t)tl[b]);
    }
    double t0 = now_us();
    pg_struct_vocab *v;
    if (pg_struct_vocab_create(target, (const char *const *)tb, tl, sp, pg_tokenizer_eos(tok), &v) < 0) return 1;
    printf("vocabulary: %d tokens (%d from the tokenizer), trie built in %.1f ms\n", target, vocab,
           (now_us() - t0) / 1e3);
    vocab = target;
    int n_docs = batch > 1 ? batch : 1;
    doc *docs = calloc((size_t)n_docs, sizeof *docs);
    for (int b = 0; b < n_docs; b++) {
        char text[2048];
        make_doc(text, sizeof text);
        int n = pg_tokenizer_encode(tok, text, strlen(text), false, false, NULL, 0);
        docs[b].ids = malloc(sizeof(int32_t) * (size_t)n);
        docs[b].n = pg_tokenizer_encode(tok, text, strlen(text), false, false, docs[b].ids, n);
        if (b == 0) printf("document 0 (%d tokens): %s\n", docs[b].n, text);
    }
    // argv[4]: write the vocabulary and documents for the xgrammar
    // harness (docs/structured_outputs.md): u32 n, n x (u32 len, bytes),
    // i32 eos, u32 docs, docs x (u32 n, n x i32).
    if (argc > 4) {
        FILE *f = fopen(argv[4], "wb");
        uint32_t u = (uint32_t)vocab;
        fwrite(&u, 4, 1, f);
        for (int32_t i = 0; i < vocab; i++) {
            u = (uint32_t)(sp[i] ? 0 : tl[i]);
            fwrite(&u, 4, 1, f);
            if (u) fwrite(tb[i], 1, u, f);
        }
        int32_t eos = pg_tokenizer_eos(tok);
        fwrite(&eos, 4, 1, f);
        u = (uint32_t)n_docs;
        fwrite(&u, 4, 1, f);
        for (int b = 0; b < n_docs; b++) {
            u = (uint32_t)docs[b].n;
            fwrite(&u, 4, 1, f);
            fwrite(docs[b].ids, 4, (size_t)docs[b].n, f);
        }
        fclose(f);
    }
    size_t tmax = 0;
    for (int b = 0; b < n_docs; b++) tmax += (size_t)docs[b].n;
    double *t = malloc(sizeof(double) * tmax);
    int sizes[2] = {1, batch};
    pg_grammar_limits lim;
    pg_grammar_limits_default(&lim);
    const char *nopre = getenv("PAGED_BENCH_NO_PRECOMPUTE");
    if (nopre && *nopre && strcmp(nopre, "0")) lim.precompute_states = 0;
    summary sum[2] = {0};
    int n_cases = batch > 1 ? 2 : 1;
    for (int k = 0; k < n_cases; k++) {
        int bs = sizes[k];
        char err[256];
        pg_grammar *g;
        t0 = now_us();
        if (pg_grammar_compile(PG_GRAMMAR_JSON_SCHEMA, SCHEMA, strlen(SCHEMA), v, &lim, &g, err, sizeof err) < 0) {
            fprintf(stderr, "bench_structured: compile: %s\n", err);
            return 1;
        }
        sum[k].batch = bs;
        sum[k].compile_ms = (now_us() - t0) / 1e3;
        printf("grammar compiled in %.2f ms\n", sum[k].compile_ms);
        pg_grammar_precompute pre;
        pg_grammar_precompute_wait(g, 60000);
        pg_grammar_precompute_stats(g, &pre);
        if (pre.started)
            printf("precomputed in %.1f ms (background): %d states, %d distinct masks (%.1f MiB)%s\n", pre.ms,
                   pre.states, pre.masks, (double)pre.bytes / (1 << 20), pre.published ? "" : ", NOT used");
        else
            printf("no precomputation\n");
        sum[k].pre_ms = pre.started ? pre.ms : 0;
        int nt;
        if (run(g, docs, bs, vocab, t, &nt) < 0) return 1;
        sum[k].first = report("first", bs, t, nt);
        if (run(g, docs, bs, vocab, t, &nt) < 0) return 1;
        sum[k].warm = report("warm", bs, t, nt);
        sum[k].mib = (double)(pg_grammar_state_bytes(g) + (pre.published ? pre.bytes : 0)) / (1 << 20);
        printf("      states %d, %.1f MiB of states and masks in all\n", pg_grammar_state_count(g), sum[k].mib);
        pg_grammar_unref(g);
        // The same, but decoding starts at once, racing the precomputation
        // (a server with no prefill to hide it behind).
        if (pg_grammar_compile(PG_GRAMMAR_JSON_SCHEMA, SCHEMA, strlen(SCHEMA), v, &lim, &g, err, sizeof err) < 0)
            return 1;
        if (run(g, docs, bs, vocab, t, &nt) < 0) return 1;
        sum[k].race = report("race", bs, t, nt);
        pg_grammar_unref(g);
    }
    printf("\nsummary (us per token; target: p99 <= 50)\n");
    printf("%7s %5s %10s %10s %10s %10s %10s %10s %10s %10s %8s\n", "vocab", "batch", "compile_ms",
           "precomp_ms", "first_mean", "first_p99", "warm_mean", "warm_p99", "race_mean", "race_p99", "MiB");
    for (int k = 0; k < n_cases; k++)
        printf("%7d %5d %10.2f %10.1f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %8.1f\n", vocab, sum[k].batch,
               sum[k].compile_ms, sum[k].pre_ms, sum[k].first.mean, sum[k].first.p99, sum[k].warm.mean,
               sum[k].warm.p99, sum[k].race.mean, sum[k].race.p99, sum[k].mib);
    return 0;
}
