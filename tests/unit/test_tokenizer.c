// tests/unit/test_tokenizer.c - the tokenizer against independent
// implementations, plus decoding, incremental detokenization and errors.
//
// Golden files (tests/data/gen_tokenizer_golden.py, tests/data/README.md):
//   tokenizer_golden_smollm2.jsonl     llama.cpp on models/SmolLM2-135M-Instruct.Q4_1.gguf
//   tokenizer_golden_smollm2_hf.jsonl  HF tokenizers on tests/data/tokenizer_smollm2.json
//   tokenizer_golden_spm_tiny.jsonl    llama.cpp on tests/data/tokenizer_spm_tiny.gguf
//                                      (agrees with the sentencepiece library)
//   gemma3_llamacpp_golden.json        llama.cpp on models/gemma-3-270m-q4_k_m.gguf ("tokenize")
// The model-based test is skipped, with a message, when models/ is absent.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/file.h"
#include "formats/gguf.h"
#include "text/tokenizer/tokenizer.h"
#include "tests/unit/gguf_writer.h"

#define SMOLLM_GGUF "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define GEMMA3_GGUF "models/gemma-3-270m-q4_k_m.gguf"

// --- helpers ----------------------------------------------------------------

typedef struct {
    char *text;
    size_t len;
    bool parse_special;
    int32_t *ids;
    int n_ids;
    int32_t *alt;              // "ids_llama_cpp" where it differs from "ids", else NULL
    int n_alt;
} golden_case;

typedef struct {
    golden_case *c;
    int n;
} golden_set;

static void golden_free(golden_set *g) {
    for (int i = 0; i < g->n; i++) {
        free(g->c[i].text);
        free(g->c[i].ids);
        free(g->c[i].alt);
    }
    free(g->c);
    g->c = NULL;
    g->n = 0;
}

// Adds one golden row {"text": ..., "parse_special": ..., "ids": [...],
// optional "ids_llama_cpp": [...]} to g.
static void golden_add(golden_set *g, int *cap, const cJSON *j) {
    cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "ids");
    assert_true(cJSON_IsString(text) && cJSON_IsArray(ids));
    if (g->n == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        g->c = realloc(g->c, (size_t)*cap * sizeof *g->c);
    }
    golden_case *c = &g->c[g->n++];
    c->text = strdup(text->valuestring);
    c->len = strlen(c->text);
    c->parse_special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "parse_special"));
    c->n_ids = cJSON_GetArraySize(ids);
    c->ids = malloc(((size_t)c->n_ids + 1) * sizeof *c->ids);
    int k = 0;
    cJSON *v;
    cJSON_ArrayForEach(v, ids) c->ids[k++] = (int32_t)v->valuedouble;
    cJSON *alt = cJSON_GetObjectItemCaseSensitive(j, "ids_llama_cpp");
    c->alt = NULL;
    c->n_alt = 0;
    if (cJSON_IsArray(alt)) {
        c->n_alt = cJSON_GetArraySize(alt);
        c->alt = malloc(((size_t)c->n_alt + 1) * sizeof *c->alt);
        k = 0;
        cJSON_ArrayForEach(v, alt) c->alt[k++] = (int32_t)v->valuedouble;
    }
}

static char *golden_read(const char *rel, size_t *len) {
    char path[4096];
    if (!tw_repo_path(rel, path, sizeof path)) fail_msg("%s not found (run from the repository root)", rel);
    char *buf;
    assert_int_equal(pg_read_file(path, 64u << 20, &buf, len), 0);
    return buf;
}

// Reads a golden .jsonl: one row per line.
static golden_set golden_load(const char *rel) {
    golden_set g = {0};
    size_t len;
    char *buf = golden_read(rel, &len);
    int cap = 0;
    for (char *line = buf; line < buf + len;) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(buf + len - line);
        if (ll) {
            cJSON *j = cJSON_ParseWithLength(line, ll);
            assert_non_null(j);
            golden_add(&g, &cap, j);
            cJSON_Delete(j);
        }
        line += ll + 1;
    }
    free(buf);
    return g;
}

// Reads the rows of array `key` of a golden .json document.
static golden_set golden_load_json(const char *rel, const char *key) {
    golden_set g = {0};
    size_t len;
    char *buf = golden_read(rel, &len);
    cJSON *doc = cJSON_ParseWithLength(buf, len);
    assert_non_null(doc);
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(doc, key), *j;
    assert_true(cJSON_IsArray(rows));
    int cap = 0;
    cJSON_ArrayForEach(j, rows) golden_add(&g, &cap, j);
    cJSON_Delete(doc);
    free(buf);
    return g;
}

// Encodes into a malloc'd array (two calls when the first buffer is short).
static int32_t *encode(const pg_tokenizer *t, const char *s, size_t n, bool bos, bool special, int *count) {
    int cap = 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int k = pg_tokenizer_encode(t, s, n, bos, special, ids, cap);
    assert_true(k >= 0);
    if (k > cap) {
        ids = realloc(ids, (size_t)k * sizeof *ids);
        assert_int_equal(pg_tokenizer_encode(t, s, n, bos, special, ids, k), k);
    }
    *count = k;
    return ids;
}

static void print_ids(const char *label, const int32_t *ids, int n) {
    fprintf(stderr, "    %s [", label);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
    fprintf(stderr, "]\n");
}

// Encodes every golden case and counts mismatches (each one printed).
// `llama_cpp`: compare with "ids_llama_cpp" where a case has it.
static int check_golden_as(const pg_tokenizer *t, const golden_set *g, bool llama_cpp) {
    int bad = 0;
    for (int i = 0; i < g->n; i++) {
        const golden_case *c = &g->c[i];
        const int32_t *want = llama_cpp && c->alt ? c->alt : c->ids;
        int n_want = llama_cpp && c->alt ? c->n_alt : c->n_ids;
        int n;
        int32_t *ids = encode(t, c->text, c->len, false, c->parse_special, &n);
        if (n != n_want || memcmp(ids, want, (size_t)n * sizeof *ids) != 0) {
            fprintf(stderr, "  mismatch #%d (parse_special=%d): \"%.80s\"\n", i, c->parse_special, c->text);
            print_ids("expected", want, n_want);
            print_ids("got     ", ids, n);
            bad++;
        }
        free(ids);
    }
    return bad;
}

static int check_golden(const pg_tokenizer *t, const golden_set *g) { return check_golden_as(t, g, false); }

// An independent strict UTF-8 check (RFC 3629: no overlongs, surrogates or
// code points above U+10FFFF).
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (i + len > n) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

// Feeds ids one at a time: every chunk must be valid UTF-8 and the chunks
// must concatenate to pg_tokenizer_decode's output. Returns the text.
static char *detok_all(const pg_tokenizer *t, const int32_t *ids, int n, bool skip_special) {
    int cap = pg_tokenizer_max_token_bytes(t) + 64;
    char *chunk = malloc((size_t)cap);
    size_t total = 0, tcap = 64;
    char *acc = malloc(tcap);
    pg_detok d;
    pg_detok_init(&d, t, skip_special);
    for (int i = 0; i <= n; i++) {
        int r = i < n ? pg_detok_feed(&d, ids[i], chunk, cap) : pg_detok_flush(&d, chunk, cap);
        assert_true(r >= 0 && r <= 3 + pg_tokenizer_max_token_bytes(t));
        assert_int_equal(strlen(chunk), (size_t)r);
        assert_true(valid_utf8((const unsigned char *)chunk, (size_t)r));
        while (total + (size_t)r + 1 > tcap) tcap *= 2;
        acc = realloc(acc, tcap);
        memcpy(acc + total, chunk, (size_t)r);
        total += (size_t)r;
    }
    acc[total] = '\0';
    free(chunk);
    char *full;
    assert_int_equal(pg_tokenizer_decode(t, ids, n, skip_special, &full), 0);
    assert_string_equal(full, acc);
    free(full);
    return acc;
}

// False when a byte of the text has no token at all (SmolLM2 lacks e.g.
// 0x1D): such bytes are dropped, as llama.cpp and HF drop them.
static bool representable(const pg_tokenizer *t, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (pg_tokenizer_encode(t, s + i, 1, false, false, NULL, 0) == 0) return false;
    return true;
}

// Round trip and incremental detokenization over a golden set.
static void check_decode(const pg_tokenizer *t, const golden_set *g, bool spm) {
    int checked = 0;
    for (int i = 0; i < g->n; i++) {
        const golden_case *c = &g->c[i];
        char *text = detok_all(t, c->ids, c->n_ids, false);
        // SPM drops the one leading space its encoder adds; llama.cpp adds a
        // prefix after every special token, which a plain decode keeps.
        if ((!spm || !c->parse_special) && representable(t, c->text, c->len)) {
            checked++;
            if (strcmp(text, c->text) != 0)
                fail_msg("round trip #%d: \"%s\" decoded as \"%s\"", i, c->text, text);
        }
        free(text);
    }
    fprintf(stderr, "  round trip exact for %d/%d (the rest: special-token prefixes or bytes "
            "without a token)\n", checked, g->n);
}

static pg_tokenizer *load_gguf_path(const char *path, gguf_file **f) {
    pg_tokenizer *t = NULL;
    if (gguf_open(path, f) != 0) fail_msg("gguf_open %s: %s", path, pg_err_msg());
    if (pg_tokenizer_from_gguf(*f, &t) != 0) fail_msg("from_gguf %s: %s", path, pg_err_msg());
    return t;
}

static bool smollm_path(char *path, size_t cap) { return tw_repo_path(SMOLLM_GGUF, path, cap); }

static pg_tokenizer *load_hf_smollm(void) {
    char json[4096], cfg[4096];
    assert_true(tw_repo_path("tests/data/tokenizer_smollm2.json", json, sizeof json));
    assert_true(tw_repo_path("tests/data/tokenizer_smollm2_config.json", cfg, sizeof cfg));
    pg_tokenizer *t = NULL;
    if (pg_tokenizer_from_hf(json, cfg, &t) != 0) fail_msg("from_hf: %s", pg_err_msg());
    return t;
}

// --- golden: byte-level BPE ---------------------------------------------------

static void test_gguf_smollm2_matches_llama_cpp(void **state) {
    (void)state;
    char path[4096];
    if (!smollm_path(path, sizeof path)) {
        fprintf(stderr, "SKIP: %s not present\n", SMOLLM_GGUF);
        skip();
    }
    gguf_file *f;
    pg_tokenizer *t = load_gguf_path(path, &f);
    assert_int_equal(pg_tokenizer_kind(t), PG_TOK_BPE_BYTE);
    assert_int_equal(pg_tokenizer_vocab_size(t), 49152);
    assert_string_equal(pg_tokenizer_pre_name(t), "smollm");
    golden_set g = golden_load("tests/data/tokenizer_golden_smollm2.jsonl");
    assert_true(g.n >= 300);
    int bad = check_golden(t, &g);
    fprintf(stderr, "  gguf smollm2 vs llama.cpp: %d/%d equal\n", g.n - bad, g.n);
    assert_int_equal(bad, 0);
    check_decode(t, &g, false);
    golden_free(&g);
    pg_tokenizer_free(t);
    gguf_close(f);
}

static void test_hf_json_smollm2_matches_hf_tokenizers(void **state) {
    (void)state;
    pg_tokenizer *t = load_hf_smollm();
    assert_int_equal(pg_tokenizer_kind(t), PG_TOK_BPE_BYTE);
    assert_int_equal(pg_tokenizer_vocab_size(t), 49152);
    assert_string_equal(pg_tokenizer_pre_name(t), "smollm");
    assert_int_equal(pg_tokenizer_bos(t), 1);
    assert_int_equal(pg_tokenizer_eos(t), 2);
    assert_false(pg_tokenizer_add_bos(t));
    golden_set g = golden_load("tests/data/tokenizer_golden_smollm2_hf.jsonl");
    assert_true(g.n >= 300);
    int bad = check_golden(t, &g);
    fprintf(stderr, "  tokenizer.json smollm2 vs HF tokenizers: %d/%d equal\n", g.n - bad, g.n);
    assert_int_equal(bad, 0);
    check_decode(t, &g, false);
    golden_free(&g);
    pg_tokenizer_free(t);
}

// The same vocabulary through both loaders gives the same tables.
static void test_gguf_and_json_agree(void **state) {
    (void)state;
    char path[4096];
    if (!smollm_path(path, sizeof path)) {
        fprintf(stderr, "SKIP: %s not present\n", SMOLLM_GGUF);
        skip();
    }
    gguf_file *f;
    pg_tokenizer *a = load_gguf_path(path, &f), *b = load_hf_smollm();
    assert_int_equal(pg_tokenizer_vocab_size(a), pg_tokenizer_vocab_size(b));
    char x[512], y[512];
    for (int32_t id = 0; id < pg_tokenizer_vocab_size(a); id++) {
        int nx = pg_tokenizer_token_bytes(a, id, x, sizeof x), ny = pg_tokenizer_token_bytes(b, id, y, sizeof y);
        assert_int_equal(nx, ny);
        assert_memory_equal(x, y, (size_t)nx);
        assert_int_equal(pg_tokenizer_is_special(a, id), pg_tokenizer_is_special(b, id));
    }
    assert_int_equal(pg_tokenizer_bos(a), pg_tokenizer_bos(b));
    assert_int_equal(pg_tokenizer_eos(a), pg_tokenizer_eos(b));
    pg_tokenizer_free(a);
    pg_tokenizer_free(b);
    gguf_close(f);
}

// The gpt2 / llama3 / qwen2 pre-tokenizers, each through both loaders: a small
// vocabulary trained with that family's pre-tokenizer (HF tokenizers), as
// tokenizer.json (checked against HF) and as GGUF (checked against llama.cpp).
static void test_families_match_hf_and_llama_cpp(void **state) {
    (void)state;
    const char *fams[] = {"gpt2", "llama3", "qwen2"};
    for (int i = 0; i < 3; i++) {
        char rel[256], path[4096];
        snprintf(rel, sizeof rel, "tests/data/tokenizer_golden_%s.jsonl", fams[i]);
        golden_set g = golden_load(rel);
        assert_true(g.n >= 300);
        snprintf(rel, sizeof rel, "tests/data/tokenizer_%s.json", fams[i]);
        assert_true(tw_repo_path(rel, path, sizeof path));
        pg_tokenizer *t = NULL;
        if (pg_tokenizer_from_hf(path, NULL, &t) != 0) fail_msg("%s: %s", rel, pg_err_msg());
        assert_string_equal(pg_tokenizer_pre_name(t), fams[i]);
        int bad = check_golden_as(t, &g, false);
        fprintf(stderr, "  tokenizer.json %s vs HF tokenizers: %d/%d equal\n", fams[i], g.n - bad, g.n);
        assert_int_equal(bad, 0);
        check_decode(t, &g, false);
        pg_tokenizer_free(t);

        snprintf(rel, sizeof rel, "tests/data/tokenizer_%s.gguf", fams[i]);
        assert_true(tw_repo_path(rel, path, sizeof path));
        gguf_file *f;
        t = load_gguf_path(path, &f);
        bad = check_golden_as(t, &g, true);
        fprintf(stderr, "  gguf %s (pre %s) vs llama.cpp: %d/%d equal\n", fams[i], pg_tokenizer_pre_name(t),
                g.n - bad, g.n);
        assert_int_equal(bad, 0);
        pg_tokenizer_free(t);
        gguf_close(f);
        golden_free(&g);
    }
}

// --- golden: SPM ----------------------------------------------------------------

static void test_gguf_spm_matches_llama_cpp(void **state) {
    (void)state;
    char path[4096];
    assert_true(tw_repo_path("tests/data/tokenizer_spm_tiny.gguf", path, sizeof path));
    gguf_file *f;
    pg_tokenizer *t = load_gguf_path(path, &f);
    assert_int_equal(pg_tokenizer_kind(t), PG_TOK_SPM);
    assert_true(pg_tokenizer_add_bos(t));
    assert_int_equal(pg_tokenizer_bos(t), 1);
    golden_set g = golden_load("tests/data/tokenizer_golden_spm_tiny.jsonl");
    assert_true(g.n >= 300);
    int bad = check_golden(t, &g);
    fprintf(stderr, "  gguf spm-tiny vs llama.cpp: %d/%d equal\n", g.n - bad, g.n);
    assert_int_equal(bad, 0);
    check_decode(t, &g, true);
    golden_free(&g);
    pg_tokenizer_free(t);
    gguf_close(f);
}

// The real Gemma 3 270M GGUF (SentencePiece-style vocabulary of 262144
// pieces, no space prefix, user-defined whitespace and markup pieces)
// against llama.cpp: tests/data/gemma3_llamacpp_golden.json
// (tests/data/gen_gemma3_golden.py), parse_special false and true.
static void test_gguf_gemma3_matches_llama_cpp(void **state) {
    (void)state;
    char path[4096];
    if (!tw_repo_path(GEMMA3_GGUF, path, sizeof path)) {
        fprintf(stderr, "SKIP: %s not present\n", GEMMA3_GGUF);
        skip();
    }
    gguf_file *f;
    pg_tokenizer *t = load_gguf_path(path, &f);
    assert_int_equal(pg_tokenizer_kind(t), PG_TOK_SPM);
    assert_int_equal(pg_tokenizer_vocab_size(t), 262144);
    assert_true(pg_tokenizer_add_bos(t));
    assert_int_equal(pg_tokenizer_bos(t), 2);
    golden_set g = golden_load_json("tests/data/gemma3_llamacpp_golden.json", "tokenize");
    assert_true(g.n >= 80);
    int bad = check_golden(t, &g);
    fprintf(stderr, "  gguf gemma3 vs llama.cpp: %d/%d equal\n", g.n - bad, g.n);
    assert_int_equal(bad, 0);
    check_decode(t, &g, false);
    golden_free(&g);
    pg_tokenizer_free(t);
    gguf_close(f);
}

// The same SPM vocabulary as a Llama-2-style tokenizer.json (BPE merges +
// byte_fallback + Prepend/Replace normalizer), checked against HF.
static void test_hf_json_spm_matches_hf_tokenizers(void **state) {
    (void)state;
    char path[4096];
    assert_true(tw_repo_path("tests/data/tokenizer_spm_tiny.json", path, sizeof path));
    pg_tokenizer *t = NULL;
    if (pg_tokenizer_from_hf(path, NULL, &t) != 0) fail_msg("%s", pg_err_msg());
    assert_int_equal(pg_tokenizer_kind(t), PG_TOK_SPM);
    golden_set g = golden_load("tests/data/tokenizer_golden_spm_tiny_hf.jsonl");
    assert_true(g.n >= 300);
    int bad = check_golden(t, &g);
    fprintf(stderr, "  tokenizer.json spm-tiny vs HF tokenizers: %d/%d equal\n", g.n - bad, g.n);
    assert_int_equal(bad, 0);
    check_decode(t, &g, true);
    golden_free(&g);
    pg_tokenizer_free(t);
}

// --- SPM behaviour on a hand-made vocabulary ------------------------------------

// <unk> <s> </s>, the 256 byte tokens, then a few pieces with scores.
static const char *const spm_pieces[] = {"\xe2\x96\x81", "a", "b", "c", "h", "e", "l", "o",
                                         "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "he", "ll",
                                         "llo", "hello", "\xe2\x96\x81" "hello", "<tag>", "\xc3\xa9"};
static const float spm_scores[] = {-1, -2, -2, -2, -2, -2, -2, -2, -3, -4, -5, -6, -7, -8, -9, -1, 0, -3};
#define SPM_BASE 259  // first id after <unk> <s> </s> and 256 bytes

static tw_buf spm_gguf(bool add_space_prefix) {
    enum { N = SPM_BASE + (int)(sizeof spm_pieces / sizeof spm_pieces[0]) };
    const char *toks[N];
    char bytes[256][8];
    float scores[N];
    int32_t types[N];
    toks[0] = "<unk>", types[0] = 2, scores[0] = 0;
    toks[1] = "<s>", types[1] = 3, scores[1] = 0;
    toks[2] = "</s>", types[2] = 3, scores[2] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b], types[3 + b] = 6, scores[3 + b] = 0;
    }
    for (int i = SPM_BASE; i < N; i++) {
        toks[i] = spm_pieces[i - SPM_BASE];
        scores[i] = spm_scores[i - SPM_BASE];
        types[i] = strcmp(toks[i], "<tag>") == 0 ? 4 : 1;
    }
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_kv_str(g, "general.architecture", "llama");
    tw_gguf_kv_str(g, "tokenizer.ggml.model", "llama");
    tw_gguf_kv_arr_str(g, "tokenizer.ggml.tokens", toks, N);
    tw_gguf_kv_arr(g, "tokenizer.ggml.scores", 6, scores, N, 4);
    tw_gguf_kv_arr(g, "tokenizer.ggml.token_type", 5, types, N, 4);
    tw_gguf_kv_u32(g, "tokenizer.ggml.bos_token_id", 1);
    tw_gguf_kv_u32(g, "tokenizer.ggml.eos_token_id", 2);
    tw_gguf_kv_u32(g, "tokenizer.ggml.unknown_token_id", 0);
    tw_gguf_kv_bool(g, "tokenizer.ggml.add_space_prefix", add_space_prefix);
    return tw_gguf_finish(g, NULL);
}

static pg_tokenizer *spm_tokenizer(bool add_space_prefix, tw_buf *img, gguf_file **f) {
    *img = spm_gguf(add_space_prefix);
    assert_int_equal(gguf_open_memory(img->data, img->len, "spm-test", f), 0);
    pg_tokenizer *t = NULL;
    if (pg_tokenizer_from_gguf(*f, &t) != 0) fail_msg("%s", pg_err_msg());
    return t;
}

static int spm_id(const char *piece) {
    for (size_t i = 0; i < sizeof spm_pieces / sizeof spm_pieces[0]; i++)
        if (strcmp(spm_pieces[i], piece) == 0) return SPM_BASE + (int)i;
    fail_msg("no piece %s", piece);
    return -1;
}

static void expect_ids(const pg_tokenizer *t, const char *text, bool bos, bool special, const int32_t *want,
                       int n_want) {
    int n;
    int32_t *ids = encode(t, text, strlen(text), bos, special, &n);
    if (n != n_want || memcmp(ids, want, (size_t)n * sizeof *ids) != 0) {
        fprintf(stderr, "  \"%s\"\n", text);
        print_ids("expected", want, n_want);
        print_ids("got     ", ids, n);
        fail();
    }
    free(ids);
}

#define EXPECT(t, text, bos, special, ...)                                                        \
    do {                                                                                          \
        const int32_t want_[] = {__VA_ARGS__};                                                    \
        expect_ids(t, text, bos, special, want_, (int)(sizeof want_ / sizeof want_[0]));          \
    } while (0)

static void test_spm_leading_space_merges_and_byte_fallback(void **state) {
    (void)state;
    tw_buf img;
    gguf_file *f;
    pg_tokenizer *t = spm_tokenizer(true, &img, &f);
    const int sp = spm_id("\xe2\x96\x81");
    // "hello" -> "▁hello": the best-scoring merges win (▁hello scores -1).
    EXPECT(t, "hello", false, false, spm_id("\xe2\x96\x81hello"));
    EXPECT(t, "hello", true, false, 1, spm_id("\xe2\x96\x81hello"));
    // Leading space: "▁▁hello".
    EXPECT(t, " hello", false, false, sp, spm_id("\xe2\x96\x81hello"));
    // "ab c": ▁ab ▁ c
    EXPECT(t, "ab c", false, false, spm_id("\xe2\x96\x81" "ab"), sp, spm_id("c"));
    // Unknown characters fall back to their UTF-8 bytes: "z" and "€" (E2 82 AC).
    EXPECT(t, "z", false, false, sp, 3 + 'z');
    EXPECT(t, "a\xe2\x82\xac", false, false, spm_id("\xe2\x96\x81" "a"), 3 + 0xE2, 3 + 0x82, 3 + 0xAC);
    // A character in the vocabulary is not split into bytes.
    EXPECT(t, "\xc3\xa9", false, false, sp, spm_id("\xc3\xa9"));
    // Invalid UTF-8 is encoded byte by byte.
    EXPECT(t, "a\xff", false, false, spm_id("\xe2\x96\x81" "a"), 3 + 0xFF);
    // User-defined tokens are matched even without parse_special, control
    // tokens only with it; text after a matched token gets a '▁' again.
    EXPECT(t, "<tag>ab", false, false, spm_id("<tag>"), spm_id("\xe2\x96\x81" "ab"));
    EXPECT(t, "c<tag>ab", false, false, sp, spm_id("c"), spm_id("<tag>"), spm_id("\xe2\x96\x81" "ab"));
    EXPECT(t, "<s>ab", false, true, 1, spm_id("\xe2\x96\x81" "ab"));
    int n;
    int32_t *ids = encode(t, "<s>", 3, false, false, &n);
    assert_true(n > 1);  // plain text
    free(ids);
    // Empty text: nothing (BOS only when asked).
    EXPECT(t, "", true, false, 1);
    assert_int_equal(pg_tokenizer_encode(t, "", 0, false, false, NULL, 0), 0);

    // Decoding drops the prefix space once; byte tokens rebuild characters.
    const int32_t seq[] = {1, spm_id("\xe2\x96\x81hello"), sp, spm_id("c"), 3 + 0xE2, 3 + 0x82, 3 + 0xAC};
    char *s = detok_all(t, seq, 7, true);
    assert_string_equal(s, "hello c\xe2\x82\xac");
    free(s);
    s = detok_all(t, seq, 7, false);
    assert_string_equal(s, "<s> hello c\xe2\x82\xac");
    free(s);
    pg_tokenizer_free(t);
    gguf_close(f);
    tw_buf_free(&img);

    // Without add_space_prefix no '▁' is added.
    t = spm_tokenizer(false, &img, &f);
    EXPECT(t, "hello", false, false, spm_id("hello"));
    pg_tokenizer_free(t);
    gguf_close(f);
    tw_buf_free(&img);
}

// --- decoding details -----------------------------------------------------------

static void test_detok_holds_back_split_characters(void **state) {
    (void)state;
    tw_buf img;
    gguf_file *f;
    pg_tokenizer *t = spm_tokenizer(false, &img, &f);
    pg_detok d;
    char out[256];
    pg_detok_init(&d, t, false);
    // "€" = E2 82 AC as three byte tokens: nothing until the last one.
    assert_int_equal(pg_detok_feed(&d, 3 + 0xE2, out, sizeof out), 0);
    assert_int_equal(pg_detok_feed(&d, 3 + 0x82, out, sizeof out), 0);
    assert_int_equal(pg_detok_feed(&d, 3 + 0xAC, out, sizeof out), 3);
    assert_string_equal(out, "\xe2\x82\xac");
    // A broken sequence becomes one U+FFFD, and the byte that broke it is kept.
    assert_int_equal(pg_detok_feed(&d, 3 + 0xE2, out, sizeof out), 0);
    assert_int_equal(pg_detok_feed(&d, spm_id("a"), out, sizeof out), 4);
    assert_string_equal(out, "\xef\xbf\xbd" "a");
    // A stray continuation byte or 0xFF is replaced at once.
    assert_int_equal(pg_detok_feed(&d, 3 + 0x80, out, sizeof out), 3);
    assert_int_equal(pg_detok_feed(&d, 3 + 0xFF, out, sizeof out), 3);
    // Held bytes at the end are flushed as one U+FFFD.
    assert_int_equal(pg_detok_feed(&d, 3 + 0xF0, out, sizeof out), 0);
    assert_int_equal(pg_detok_feed(&d, 3 + 0x9F, out, sizeof out), 0);
    assert_int_equal(pg_detok_flush(&d, out, sizeof out), 3);
    assert_string_equal(out, "\xef\xbf\xbd");
    assert_int_equal(pg_detok_flush(&d, out, sizeof out), 0);
    // Surrogates (ED A0 80) and overlongs (C0 AF) are ill-formed.
    const int32_t sur[] = {3 + 0xED, 3 + 0xA0, 3 + 0x80, 3 + 0xC0, 3 + 0xAF};
    char *s = detok_all(t, sur, 5, false);
    assert_string_equal(s, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
    // A buffer too small leaves the state untouched.
    pg_detok_init(&d, t, false);
    assert_int_equal(pg_detok_feed(&d, 3 + 0xE2, out, sizeof out), 0);
    assert_int_equal(pg_detok_feed(&d, 3 + 0x82, out, sizeof out), 0);
    assert_int_equal(pg_detok_feed(&d, 3 + 0xAC, out, 2), PG_ENOSPC);
    assert_int_equal(pg_detok_feed(&d, 3 + 0xAC, out, sizeof out), 3);
    pg_tokenizer_free(t);
    gguf_close(f);
    tw_buf_free(&img);
}

// Invalid UTF-8 is never rejected: the token bytes give back the input.
static void test_invalid_utf8_is_encoded_byte_by_byte(void **state) {
    (void)state;
    pg_tokenizer *t = load_hf_smollm();
    const char text[] = "a\x80" "b\xc3(\xe2\x82 \xed\xa0\x80 ok \xf0\x9f\x98";
    int n;
    int32_t *ids = encode(t, text, sizeof text - 1, false, false, &n);
    char got[256];
    int w = 0;
    for (int i = 0; i < n; i++) {
        int r = pg_tokenizer_token_bytes(t, ids[i], got + w, (int)sizeof got - w);
        assert_true(r >= 0 && w + r <= (int)sizeof got);
        w += r;
    }
    assert_int_equal(w, (int)sizeof text - 1);
    assert_memory_equal(got, text, sizeof text - 1);
    char *s = detok_all(t, ids, n, false);  // every chunk valid UTF-8
    free(s);
    free(ids);
    pg_tokenizer_free(t);
}

// --- API contract -----------------------------------------------------------------

static void test_queries_capacity_and_bad_ids(void **state) {
    (void)state;
    pg_tokenizer *t = load_hf_smollm();
    int32_t n_vocab = pg_tokenizer_vocab_size(t);
    assert_int_equal(pg_tokenizer_find(t, "<|im_end|>"), 2);
    assert_int_equal(pg_tokenizer_find(t, "no such token here"), -1);
    assert_true(pg_tokenizer_is_special(t, 2));
    assert_false(pg_tokenizer_is_special(t, 100));
    assert_false(pg_tokenizer_is_special(t, -1));
    assert_false(pg_tokenizer_is_special(t, n_vocab));
    // BOS is prepended when asked, whatever the model's default.
    int n;
    int32_t *ids = encode(t, "hi", 2, true, false, &n);
    assert_int_equal(ids[0], 1);
    free(ids);
    // A short buffer: the needed count is returned and the prefix written.
    const char *text = "The quick brown fox jumps over the lazy dog.";
    int32_t full[64], part[3];
    int total = pg_tokenizer_encode(t, text, strlen(text), false, false, full, 64);
    assert_true(total > 3);
    assert_int_equal(pg_tokenizer_encode(t, text, strlen(text), false, false, part, 3), total);
    assert_memory_equal(part, full, sizeof part);
    assert_int_equal(pg_tokenizer_encode(t, text, strlen(text), false, false, NULL, 0), total);
    // Bad arguments and ids.
    assert_true(pg_tokenizer_encode(t, NULL, 5, false, false, full, 64) < 0);
    assert_true(pg_tokenizer_encode(t, text, 4, false, false, NULL, 4) < 0);
    char buf[64];
    assert_true(pg_tokenizer_token_bytes(t, -1, buf, sizeof buf) < 0);
    assert_true(pg_tokenizer_token_bytes(t, n_vocab, buf, sizeof buf) < 0);
    assert_int_equal(pg_tokenizer_token_bytes(t, 2, buf, 3), 10);  // needs 10 ("<|im_end|>")
    const int32_t bad[] = {5, n_vocab};
    char *s = (char *)1;
    assert_true(pg_tokenizer_decode(t, bad, 2, false, &s) < 0);
    assert_null(s);
    pg_detok d;
    pg_detok_init(&d, t, false);
    assert_true(pg_detok_feed(&d, -7, buf, sizeof buf) < 0);
    // skip_special drops control tokens only.
    const int32_t chat[] = {1, 4093, 2};
    assert_int_equal(pg_tokenizer_decode(t, chat, 3, true, &s), 0);
    assert_string_equal(s, "user");
    free(s);
    assert_int_equal(pg_tokenizer_decode(t, chat, 3, false, &s), 0);
    assert_string_equal(s, "<|im_start|>user<|im_end|>");
    free(s);
    assert_int_equal(pg_tokenizer_decode(t, NULL, 0, false, &s), 0);
    assert_string_equal(s, "");
    free(s);
    pg_tokenizer_free(t);
}

// pg_tokenizer_encode_alloc gives exactly pg_tokenizer_encode's ids, in an
// array the caller frees (the ASan build checks it is freed whole).
static void check_alloc_matches(const pg_tokenizer *t, const char *s, size_t n, bool bos, bool special) {
    int want = pg_tokenizer_encode(t, s, n, bos, special, NULL, 0);
    assert_true(want >= 0);
    int32_t *ref = malloc(((size_t)want + 1) * sizeof *ref);
    assert_int_equal(pg_tokenizer_encode(t, s, n, bos, special, ref, want), want);
    int32_t *ids = NULL;
    assert_int_equal(pg_tokenizer_encode_alloc(t, s, n, bos, special, &ids), want);
    assert_non_null(ids);
    if (want > 0) assert_memory_equal(ids, ref, (size_t)want * sizeof *ids);
    free(ids);
    free(ref);
}

static void test_encode_alloc_matches_encode(void **state) {
    (void)state;
    pg_tokenizer *hf = load_hf_smollm();  // byte-level BPE
    char path[4096];
    assert_true(tw_repo_path("tests/data/tokenizer_spm_tiny.gguf", path, sizeof path));
    gguf_file *f;
    pg_tokenizer *spm = load_gguf_path(path, &f);  // SPM, with BOS and the '▁' prefix
    // A long text (about 40 KB): words, a special token, invalid UTF-8.
    const char *piece = "The quick brown fox <|im_start|> jumps \xe2\x82\xac 12345 caf\xc3\xa9\xff\n";
    size_t plen = strlen(piece), long_len = 0;
    char *long_text = malloc(40000 + plen);
    while (long_len < 40000) {
        memcpy(long_text + long_len, piece, plen);
        long_len += plen;
    }
    const char *texts[] = {"", "hi", "a\x80 b\xc3( \xe2\x82 <s> ok", long_text};
    const size_t lens[] = {0, 2, strlen(texts[2]), long_len};
    pg_tokenizer *ts[] = {hf, spm};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            for (int bos = 0; bos < 2; bos++)
                for (int special = 0; special < 2; special++)
                    check_alloc_matches(ts[k], texts[i], lens[i], bos, special);
    // Empty text: count 0 without BOS, 1 with; an array to free either way.
    int32_t *ids = NULL;
    assert_int_equal(pg_tokenizer_encode_alloc(spm, "", 0, false, false, &ids), 0);
    assert_non_null(ids);
    free(ids);
    assert_int_equal(pg_tokenizer_encode_alloc(spm, "", 0, true, false, &ids), 1);
    assert_int_equal(ids[0], pg_tokenizer_bos(spm));
    free(ids);
    // Errors are pg_tokenizer_encode's (message set), with nothing allocated.
    ids = (int32_t *)1;
    assert_true(pg_tokenizer_encode_alloc(hf, NULL, 5, false, false, &ids) < 0);
    assert_null(ids);
    assert_true(strstr(pg_err_msg(), "bad arguments") != NULL);
    assert_true(pg_tokenizer_encode_alloc(hf, "x", 1, false, false, NULL) < 0);
    free(long_text);
    pg_tokenizer_free(spm);
    gguf_close(f);
    pg_tokenizer_free(hf);
}

static void test_load_errors(void **state) {
    (void)state;
    char dir[512], p[1024];
    tw_tmpdir(dir, sizeof dir);
    pg_tokenizer *t = (pg_tokenizer *)1;
    snprintf(p, sizeof p, "%s/missing.json", dir);
    assert_true(pg_tokenizer_from_hf(p, NULL, &t) < 0);
    assert_null(t);
    const struct {
        const char *json;
        int code;
    } cases[] = {
        {"{not json", PG_EFORMAT},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", PG_EUNSUPP},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", PG_EFORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", PG_EFORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", PG_EUNSUPP},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", PG_EFORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
         "\"behavior\": \"Isolated\"}, \"decoder\": {\"type\": \"ByteLevel\"}}", PG_EUNSUPP},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"decoder\": {\"type\": \"ByteLevel\"}}", PG_EUNSUPP},
    };
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tw_write_file(p, cases[i].json, strlen(cases[i].json));
        t = (pg_tokenizer *)1;
        int rc = pg_tokenizer_from_hf(p, NULL, &t);
        if (rc != cases[i].code) fail_msg("case %zu: rc %d (%s)", i, rc, pg_err_msg());
        assert_null(t);
    }
    // A minimal valid byte-level tokenizer.json loads.
    const char *ok = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
                     "\"merges\": [[\"a\", \"b\"]]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                     "\"add_prefix_space\": false}}";
    tw_write_file(p, ok, strlen(ok));
    assert_int_equal(pg_tokenizer_from_hf(p, NULL, &t), 0);
    int32_t ids[4];
    assert_int_equal(pg_tokenizer_encode(t, "abab", 4, false, false, ids, 4), 2);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 2);
    pg_tokenizer_free(t);
    tw_rmdir(dir);

    // GGUF without tokenizer keys / with an unknown model or pre-tokenizer.
    for (int k = 0; k < 3; k++) {
        tw_gguf *g = tw_gguf_new(3);
        const char *toks[] = {"a", "b"};
        if (k >= 1) tw_gguf_kv_str(g, "tokenizer.ggml.model", k == 1 ? "bert" : "gpt2");
        if (k == 2) {
            tw_gguf_kv_str(g, "tokenizer.ggml.pre", "no-such-pre");
            tw_gguf_kv_arr_str(g, "tokenizer.ggml.tokens", toks, 2);
            tw_gguf_kv_arr_str(g, "tokenizer.ggml.merges", toks, 0);
        }
        tw_buf img = tw_gguf_finish(g, NULL);
        gguf_file *f;
        assert_int_equal(gguf_open_memory(img.data, img.len, "bad", &f), 0);
        t = (pg_tokenizer *)1;
        int rc = pg_tokenizer_from_gguf(f, &t);
        assert_int_equal(rc, k == 0 ? PG_ENOTFOUND : PG_EUNSUPP);
        assert_null(t);
        gguf_close(f);
        tw_buf_free(&img);
    }
}

// GPT-2 byte alphabet character of byte b, as UTF-8 (test-side copy).
static int alpha_char(unsigned b, char *o) {
    unsigned cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174))
        cp = b <= 32 ? 256 + b : b <= 160 ? 256 + 33 + (b - 127) : 256 + 67;
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

// `\s` in the pre-tokenizer regexes is Unicode White_Space, as in HF
// (Oniguruma) and llama.cpp: U+180E MONGOLIAN VOWEL SEPARATOR is not a space
// there, while PCRE2's own \s would take it. With a merge for "\u180e " in
// the vocabulary, "x\u180e " shows which: HF splits x | \u180e | ' '.
static void test_pretokenizer_whitespace_is_unicode_white_space(void **state) {
    (void)state;
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab"), *merges = cJSON_AddArrayToObject(model, "merges");
    char c[8];
    for (unsigned b = 0; b < 256; b++) {
        c[alpha_char(b, c)] = '\0';
        cJSON_AddNumberToObject(vocab, c, b);
    }
    // \u180e = E1 A0 8E -> "áłİ"; ' ' -> "Ġ".
    cJSON_AddNumberToObject(vocab, "\xc3\xa1\xc5\x82", 256);
    cJSON_AddNumberToObject(vocab, "\xc3\xa1\xc5\x82\xc4\xb0", 257);
    cJSON_AddNumberToObject(vocab, "\xc3\xa1\xc5\x82\xc4\xb0\xc4\xa0", 258);
    cJSON_AddItemToArray(merges, cJSON_CreateString("\xc3\xa1 \xc5\x82"));
    cJSON_AddItemToArray(merges, cJSON_CreateString("\xc3\xa1\xc5\x82 \xc4\xb0"));
    cJSON_AddItemToArray(merges, cJSON_CreateString("\xc3\xa1\xc5\x82\xc4\xb0 \xc4\xa0"));
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddFalseToObject(pre, "add_prefix_space");
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    pg_tokenizer *t = NULL;
    if (pg_tokenizer_from_hf_memory(json, strlen(json), NULL, 0, "ws-test", &t) != 0) fail_msg("%s", pg_err_msg());
    free(json);
    EXPECT(t, "x\xe1\xa0\x8e ", false, false, 'x', 257, ' ');
    EXPECT(t, "\xe1\xa0\x8e \xe1\xa0\x8e", false, false, 257, ' ', 257);
    // A real space run before the next word still splits as \s+(?!\S).
    EXPECT(t, "a  b", false, false, 'a', ' ', ' ', 'b');
    pg_tokenizer_free(t);
}

// --- performance and threads -----------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// A 10k-character word and a 100k-space run must not be quadratic.
static void test_long_inputs_are_fast(void **state) {
    (void)state;
    pg_tokenizer *t = load_hf_smollm();
    size_t n = 10000;
    char *s = malloc(100001);
    for (size_t i = 0; i < n; i++) s[i] = (char)('a' + (i * 7 + i / 13) % 26);
    double t0 = now_s();
    int k;
    int32_t *ids = encode(t, s, n, false, false, &k);
    double dt = now_s() - t0;
    assert_true(k > 0 && k < (int)n);
    free(ids);
    fprintf(stderr, "  10k-letter word: %d tokens in %.1f ms\n", k, dt * 1e3);
    assert_true(dt < 1.5);  // quadratic would take minutes
    memset(s, ' ', 100000);
    s[99999] = 'x';
    t0 = now_s();
    ids = encode(t, s, 100000, false, false, &k);
    dt = now_s() - t0;
    free(ids);
    fprintf(stderr, "  100k spaces: %d tokens in %.1f ms\n", k, dt * 1e3);
    assert_true(dt < 1.5);  // quadratic would take minutes
    free(s);
    pg_tokenizer_free(t);
}

typedef struct {
    const pg_tokenizer *t;
    const golden_set *g;
    int bad;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < a->g->n; i++) {
            const golden_case *c = &a->g->c[i];
            int32_t ids[4096];
            int n = pg_tokenizer_encode(a->t, c->text, c->len, false, c->parse_special, ids, 4096);
            if (n != c->n_ids || (n <= 4096 && memcmp(ids, c->ids, (size_t)n * sizeof *ids) != 0)) a->bad++;
        }
    }
    return NULL;
}

// One tokenizer, four threads encoding at once: same ids as alone. Also
// reports the encode speed over the whole golden set.
static void test_concurrent_encode_and_speed(void **state) {
    (void)state;
    pg_tokenizer *t = load_hf_smollm();
    golden_set g = golden_load("tests/data/tokenizer_golden_smollm2_hf.jsonl");
    thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, &g, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    // Speed: all golden texts concatenated, encoded as one text.
    size_t total = 0;
    for (int i = 0; i < g.n; i++) total += g.c[i].len + 1;
    char *big = malloc(total + 1);
    size_t w = 0;
    for (int i = 0; i < g.n; i++) {
        memcpy(big + w, g.c[i].text, g.c[i].len);
        w += g.c[i].len;
        big[w++] = '\n';
    }
    int k = 0;
    double t0 = now_s();
    int reps = 5;
    for (int r = 0; r < reps; r++) {
        int32_t *ids = encode(t, big, w, false, false, &k);
        free(ids);
    }
    double dt = (now_s() - t0) / reps;
    fprintf(stderr, "  encode: %zu bytes -> %d tokens in %.2f ms (%.2f M tokens/s, %.1f MB/s)\n", w, k,
            dt * 1e3, k / dt / 1e6, (double)w / dt / 1e6);
    free(big);
    golden_free(&g);
    pg_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_smollm2_matches_llama_cpp),
        cmocka_unit_test(test_hf_json_smollm2_matches_hf_tokenizers),
        cmocka_unit_test(test_gguf_and_json_agree),
        cmocka_unit_test(test_families_match_hf_and_llama_cpp),
        cmocka_unit_test(test_gguf_spm_matches_llama_cpp),
        cmocka_unit_test(test_hf_json_spm_matches_hf_tokenizers),
        cmocka_unit_test(test_gguf_gemma3_matches_llama_cpp),
        cmocka_unit_test(test_spm_leading_space_merges_and_byte_fallback),
        cmocka_unit_test(test_detok_holds_back_split_characters),
        cmocka_unit_test(test_invalid_utf8_is_encoded_byte_by_byte),
        cmocka_unit_test(test_queries_capacity_and_bad_ids),
        cmocka_unit_test(test_encode_alloc_matches_encode),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_pretokenizer_whitespace_is_unicode_white_space),
        cmocka_unit_test(test_long_inputs_are_fast),
        cmocka_unit_test(test_concurrent_encode_and_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
