// tests/unit/test_structured.c - grammars, their compilers and the matcher,
// on a small fake vocabulary and on the default model's tokenizer.
//
// The generation tests walk a grammar with random allowed tokens (seeded)
// and check every output with an independent checker: cJSON plus the
// schema's own constraints, POSIX regexec for regexes.
#include <cjson/cJSON.h>
#include <locale.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "tests/unit/rng_test_util.h"
#include "text/grammar/structured.h"
#include "text/grammar/structured_state.h"  // the slow exact reference (sg_*_reference)
#include "text/tokenizer/tokenizer.h"

// --- fake vocabulary --------------------------------------------------------------

// Every printable ASCII byte, some multi-byte tokens, a 2-byte UTF-8
// character split over two tokens, and EOS (special) as the last id.
static const char *MULTI[] = {"{\"", "\":", "\"}", "true", "false", "null", ", ", "abc", "12",
                              "\": \"", "\"]", "[\"", "\xc3", "\xa9", "\xc3\xa9", "ab", "-1"};
#define N_MULTI (int)(sizeof MULTI / sizeof MULTI[0])

typedef struct {
    pg_struct_vocab *v;
    int32_t n, eos;
    char **tok;
    int32_t *len;
} fake;

static fake fake_make(void) {
    fake f = {0};
    f.n = 95 + N_MULTI + 1;
    f.tok = calloc((size_t)f.n, sizeof(char *));
    f.len = calloc((size_t)f.n, sizeof(int32_t));
    bool *special = calloc((size_t)f.n, 1);
    int k = 0;
    for (int c = 32; c < 127; c++, k++) {
        f.tok[k] = malloc(2);
        f.tok[k][0] = (char)c;
        f.len[k] = 1;
    }
    for (int i = 0; i < N_MULTI; i++, k++) {
        f.tok[k] = strdup(MULTI[i]);
        f.len[k] = (int32_t)strlen(MULTI[i]);
    }
    f.eos = k;
    f.tok[k] = strdup("</s>");
    f.len[k] = 4;
    special[k] = true;
    assert_int_equal(pg_struct_vocab_create(f.n, (const char *const *)f.tok, f.len, special, f.eos, &f.v), 0);
    free(special);
    return f;
}

static void fake_free(fake *f) {
    for (int i = 0; i < f->n; i++) free(f->tok[i]);
    free(f->tok);
    free(f->len);
    pg_struct_vocab_free(f->v);
}

static int32_t fake_id(const fake *f, const char *s) {
    for (int i = 0; i < f->n; i++)
        if ((size_t)f->len[i] == strlen(s) && !memcmp(f->tok[i], s, strlen(s))) return i;
    fail_msg("no token '%s'", s);
    return -1;
}

static size_t utf8_len(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool has(const uint32_t *m, int32_t t) { return m[t >> 5] >> (t & 31) & 1; }

static pg_grammar *compile_ok(pg_grammar_kind k, const char *text, pg_struct_vocab *v) {
    pg_grammar *g = NULL;
    char err[256];
    int rc = pg_grammar_compile(k, text, strlen(text), v, NULL, &g, err, sizeof err);
    if (rc) fail_msg("compile failed: %s\n%s", err, text);
    return g;
}

static int compile_err(pg_grammar_kind k, const char *text, pg_struct_vocab *v, char *err, size_t cap) {
    pg_grammar *g = NULL;
    int rc = pg_grammar_compile(k, text, strlen(text), v, NULL, &g, err, cap);
    assert_null(g);
    return rc;
}

// A seeded random walk: at each step a uniformly random allowed token; EOS
// as soon as it is allowed with probability `p_end`. Appends the text to
// out (NUL-terminated); returns the step count, or -1 when it ran out of
// steps.
static uint64_t rng_state;
static uint32_t rnd(void) { return lcg_u31(&rng_state); }

static int walk(pg_grammar *g, const char *const *tok, const int32_t *len, int32_t n, int32_t eos,
                double p_end, int max_steps, char *out, size_t cap) {
    pg_matcher *m = pg_matcher_create(g);
    uint32_t *mask = calloc((size_t)(n + 31) / 32, 4);
    int32_t *cand = malloc(sizeof(int32_t) * (size_t)n);
    size_t o = 0;
    int steps = 0;
    out[0] = 0;
    for (; steps < max_steps && !pg_matcher_is_terminated(m); steps++) {
        pg_matcher_fill_mask(m, mask);
        int nc = 0;
        for (int32_t t = 0; t < n; t++)
            if (has(mask, t) && t != eos) cand[nc++] = t;
        int32_t pick;
        if (has(mask, eos) && (nc == 0 || (double)(rnd() % 1000) / 1000.0 < p_end))
            pick = eos;
        else {
            assert_true(nc > 0);
            pick = cand[rnd() % (uint32_t)nc];
        }
        if (pick != eos && o + (size_t)len[pick] + 1 >= cap) break;  // too long: unfinished
        if (pg_matcher_advance(m, pick) != 0) fail_msg("advance(%d) refused after an allowed mask: %s", pick, pg_err_msg());
        if (pick != eos) {
            memcpy(out + o, tok[pick], (size_t)len[pick]);
            o += (size_t)len[pick];
            out[o] = 0;
        }
    }
    bool done = pg_matcher_is_terminated(m);
    free(mask);
    free(cand);
    pg_matcher_free(m);
    return done ? steps : -1;
}

static int fake_walk(fake *f, pg_grammar *g, double p_end, char *out, size_t cap) {
    return walk(g, (const char *const *)f->tok, f->len, f->n, f->eos, p_end, 20000, out, cap);
}

// --- GBNF ----------------------------------------------------------------------------

static void test_gbnf_masks_and_advance(void **st) {
    (void)st;
    fake f = fake_make();
    pg_grammar *g = compile_ok(PG_GRAMMAR_GBNF, "root ::= \"ab\" [c-d]+ \"!\"\n", f.v);
    pg_matcher *m = pg_matcher_create(g);
    uint32_t mask[8];
    pg_matcher_fill_mask(m, mask);
    assert_true(has(mask, fake_id(&f, "a")));
    assert_true(has(mask, fake_id(&f, "ab")));
    assert_true(has(mask, fake_id(&f, "abc")));  // a b c: a valid prefix
    assert_false(has(mask, fake_id(&f, "12")));
    assert_false(has(mask, f.eos));
    pg_matcher_free(m);
    pg_grammar_unref(g);
    fake_free(&f);
}

static void test_gbnf_multibyte_token_prefixes(void **st) {
    (void)st;
    fake f = fake_make();
    pg_grammar *g = compile_ok(PG_GRAMMAR_GBNF, "root ::= [^a-z]{2}\n", f.v);
    pg_matcher *m = pg_matcher_create(g);
    uint32_t mask[8];
    pg_matcher_fill_mask(m, mask);
    assert_true(has(mask, fake_id(&f, "\xc3")));      // a lead byte: the character may complete
    assert_true(has(mask, fake_id(&f, "\xc3\xa9")));  // é
    assert_false(has(mask, fake_id(&f, "\xa9")));     // a continuation byte cannot start one
    assert_false(has(mask, f.eos));
    assert_int_equal(pg_matcher_advance(m, fake_id(&f, "\xc3")), 0);
    pg_matcher_fill_mask(m, mask);
    assert_true(has(mask, fake_id(&f, "\xa9")));
    assert_false(has(mask, fake_id(&f, "A")));
    assert_int_equal(pg_matcher_advance(m, fake_id(&f, "\xa9")), 0);
    assert_int_equal(pg_matcher_advance(m, fake_id(&f, "A")), 0);
    assert_true(pg_matcher_is_terminated(m));
    pg_matcher_fill_mask(m, mask);
    assert_true(has(mask, f.eos));
    assert_false(has(mask, fake_id(&f, "A")));
    pg_matcher_free(m);
    pg_grammar_unref(g);
    fake_free(&f);
}

static void test_gbnf_refuses_disallowed_token_unchanged(void **st) {
    (void)st;
    fake f = fake_make();
    pg_grammar *g = compile_ok(PG_GRAMMAR_GBNF, "root ::= \"x\" | \"yz\"\n", f.v);
    pg_matcher *m = pg_matcher_create(g);
    assert_int_equal(pg_matcher_advance(m, fake_id(&f, "z")), PG_EINVAL);
    assert_int_equal(pg_matcher_advance(m, f.eos), PG_EINVAL);  // cannot end before a match
    assert_int_equal(pg_matcher_advance(m, fake_id(&f, "y")), 0);
    assert_false(pg_matcher_can_end(m));
    assert_int_equal(pg_matcher_advance(m, fake_id(&f, "z")), 0);
    assert_true(pg_matcher_is_terminated(m));
    pg_matcher_reset(m);
    assert_false(pg_matcher_is_terminated(m));
    assert_int_equal(pg_matcher_advance(m, fake_id(&f, "x")), 0);
    pg_matcher_free(m);
    pg_grammar_unref(g);
    fake_free(&f);
}

static void test_gbnf_llama_cpp_style_grammar(void **st) {
    (void)st;
    fake f = fake_make();
    // The shape of llama.cpp's grammars/arithmetic.gbnf and list.gbnf.
    const char *gr =
        "# comments and blank lines\n"
        "\n"
        "root  ::= (expr \"=\" ws term \"\\n\")+\n"
        "expr  ::= term ([-+*/] term)*\n"
        "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
        "ident ::= [a-z] [a-z0-9_]* ws\n"
        "num   ::= [0-9]+ ws\n"
        "ws    ::= [ \\t\\n]*\n";
    pg_grammar *g = compile_ok(PG_GRAMMAR_GBNF, gr, f.v);
    pg_matcher *m = pg_matcher_create(g);
    const char *text[] = {"(", "a", "+", "12", ")", "*", "3", "=", " ", "x", "\n"};
    // "\n" is not in the fake vocabulary: stop before it.
    for (int i = 0; i < 10; i++) assert_int_equal(pg_matcher_advance(m, fake_id(&f, text[i])), 0);
    assert_false(pg_matcher_can_end(m));
    pg_matcher_free(m);
    pg_grammar_unref(g);
    fake_free(&f);
}

static void test_gbnf_errors_name_the_problem(void **st) {
    (void)st;
    fake f = fake_make();
    char err[256];
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "root ::= foo\n", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "undefined rule 'foo'"));
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "root ::= root \"a\" | \"b\"\n", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "left recursion"));
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "root ::= x\nx ::= \"b\"? x \"a\" | \"b\"\n", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "left recursion"));
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "root ::= \"abc\n", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "unterminated"));
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "x ::= \"a\"\n", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "root"));
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "root ::= [z-a]\n", f.v, err, sizeof err), PG_EINVAL);
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "root ::= \"a\"{3,1}\n", f.v, err, sizeof err), PG_EINVAL);
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "root ::= \"a\"{99999999}\n", f.v, err, sizeof err), PG_EUNSUPP);
    assert_int_equal(compile_err(PG_GRAMMAR_GBNF, "root ::= \"a\"\nroot ::= \"b\"\n", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "twice"));
    // Nested repetitions stay compact (each level is one rule of 4000
    // references), so this compiles small rather than exploding.
    pg_grammar *g = compile_ok(PG_GRAMMAR_GBNF, "root ::= ((((\"a\"{4000}){4000}){4000}){4000})\n", f.v);
    pg_grammar_unref(g);
    // Flat content past the element cap is refused.
    char *big = malloc(1 << 16);
    strcpy(big, "root ::= ");
    for (int i = 0; i < 3000; i++) strcat(big + 9 + (size_t)i * 8, "\"abcde\" ");
    pg_grammar_limits lim;
    pg_grammar_limits_default(&lim);
    lim.max_elements = 10000;
    g = NULL;
    assert_int_equal(pg_grammar_compile(PG_GRAMMAR_GBNF, big, strlen(big), f.v, &lim, &g, err, sizeof err),
                     PG_EUNSUPP);
    assert_null(g);
    assert_non_null(strstr(err, "elements"));
    free(big);
    fake_free(&f);
}

// --- JSON schema -----------------------------------------------------------------------

static void test_schema_object_walks_validate(void **st) {
    (void)st;
    fake f = fake_make();
    const char *schema =
        "{\"type\":\"object\",\"properties\":{"
        "\"id\":{\"type\":\"integer\",\"minimum\":-7,\"maximum\":1234},"
        "\"ok\":{\"type\":\"boolean\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"yy\",3]},\"minItems\":1,\"maxItems\":3},"
        "\"score\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":5},"
        "\"kind\":{\"const\":\"k\"},"
        "\"alt\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"string\",\"maxLength\":3}]}"
        "},\"required\":[\"id\",\"tags\",\"kind\"],\"additionalProperties\":false}";
    pg_grammar *g = compile_ok(PG_GRAMMAR_JSON_SCHEMA, schema, f.v);
    rng_state = 7;
    char out[8192];
    int seen_score = 0, seen_alt = 0;
    for (int it = 0; it < 300; it++) {
        int steps = fake_walk(&f, g, 0.5, out, sizeof out);
        if (steps < 0) fail_msg("walk did not finish: %s", out);
        cJSON *j = cJSON_Parse(out);
        if (!j) fail_msg("not JSON: %s", out);
        cJSON *id = cJSON_GetObjectItem(j, "id"), *tags = cJSON_GetObjectItem(j, "tags");
        cJSON *score = cJSON_GetObjectItem(j, "score"), *alt = cJSON_GetObjectItem(j, "alt");
        assert_true(cJSON_IsNumber(id));
        if (id->valuedouble < -7 || id->valuedouble > 1234) fail_msg("id out of range: %s", out);
        assert_true(cJSON_IsArray(tags));
        assert_in_range(cJSON_GetArraySize(tags), 1, 3);
        assert_string_equal(cJSON_GetObjectItem(j, "kind")->valuestring, "k");
        if (score) {
            seen_score++;
            if (!(score->valuedouble > 0 && score->valuedouble <= 5)) fail_msg("score out of range: %s", out);
        }
        if (alt) {
            seen_alt++;
            assert_true(cJSON_IsNull(alt) || (cJSON_IsString(alt) && utf8_len(alt->valuestring) <= 3));
        }
        int n = 0;
        cJSON *c;
        cJSON_ArrayForEach(c, j) n++;
        assert_in_range(n, 3, 6);  // nothing beyond the properties
        cJSON_Delete(j);
    }
    assert_true(seen_score > 0 && seen_alt > 0);  // optional properties do appear
    pg_grammar_unref(g);
    fake_free(&f);
}

static void test_schema_refs_and_recursion(void **st) {
    (void)st;
    fake f = fake_make();
    // A Pydantic-shaped schema: $defs and a recursive $ref.
    const char *schema =
        "{\"$defs\":{\"Node\":{\"type\":\"object\",\"properties\":{"
        "\"v\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Node\"},\"maxItems\":2}},"
        "\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/Node\"}";
    rng_state = 11;
    char out[16384];
    // A fresh grammar per walk: every nesting depth is a new set of states,
    // and one grammar's states are capped (max_state_bytes); a walk that
    // keeps nesting would hit the cap and be ended by the EOS way out.
    for (int it = 0; it < 50; it++) {
        pg_grammar *g = compile_ok(PG_GRAMMAR_JSON_SCHEMA, schema, f.v);
        int steps = fake_walk(&f, g, 0.9, out, sizeof out);
        pg_grammar_unref(g);
        if (steps < 0) continue;  // deep recursion may run out of steps
        cJSON *j = cJSON_Parse(out);
        if (!j) {
            FILE *df = fopen("/tmp/structured_fail.txt", "w");
            fputs(out, df);
            fclose(df);
            fail_msg("not JSON: %s", out);
        }
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "v")));
        cJSON_Delete(j);
    }
    fake_free(&f);
}

static void test_schema_errors_name_the_problem(void **st) {
    (void)st;
    fake f = fake_make();
    char err[256];
    assert_int_equal(compile_err(PG_GRAMMAR_JSON_SCHEMA, "{\"type\":", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "not valid JSON"));
    assert_int_equal(compile_err(PG_GRAMMAR_JSON_SCHEMA, "{\"type\":\"strin\"}", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "strin"));
    assert_int_equal(compile_err(PG_GRAMMAR_JSON_SCHEMA, "{\"not\":{}}", f.v, err, sizeof err), PG_EUNSUPP);
    assert_non_null(strstr(err, "not is not supported"));
    assert_int_equal(compile_err(PG_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/X\"}", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "#/$defs/X"));
    assert_int_equal(compile_err(PG_GRAMMAR_JSON_SCHEMA,
                                 "{\"type\":\"string\",\"pattern\":\"(a\"}", f.v, err, sizeof err), PG_EINVAL);
    assert_non_null(strstr(err, "pattern"));
    assert_int_equal(compile_err(PG_GRAMMAR_JSON_SCHEMA,
                                 "{\"type\":\"array\",\"minItems\":5,\"maxItems\":2}", f.v, err, sizeof err), PG_EINVAL);
    // A self-referencing $ref with nothing in between is left recursion.
    assert_int_equal(compile_err(PG_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#\"}", f.v, err, sizeof err), PG_EINVAL);
    // Deep nesting hits the depth cap.
    char deep[4096] = "";
    for (int i = 0; i < 200; i++) strcat(deep, "{\"items\":");
    strcat(deep, "true");
    for (int i = 0; i < 200; i++) strcat(deep, "}");
    assert_int_equal(compile_err(PG_GRAMMAR_JSON_SCHEMA, deep, f.v, err, sizeof err), PG_EUNSUPP);
    fake_free(&f);
}

static void test_json_object_mode(void **st) {
    (void)st;
    fake f = fake_make();
    pg_grammar *g = compile_ok(PG_GRAMMAR_JSON_OBJECT, "", f.v);
    rng_state = 3;
    char out[16384];
    int ok = 0;
    for (int it = 0; it < 100; it++) {
        if (fake_walk(&f, g, 0.9, out, sizeof out) < 0) continue;
        cJSON *j = cJSON_Parse(out);
        if (!cJSON_IsObject(j)) fail_msg("not a JSON object: %s", out);
        cJSON_Delete(j);
        ok++;
    }
    assert_true(ok > 50);
    pg_grammar_unref(g);
    fake_free(&f);
}

// --- regex and choice ----------------------------------------------------------------

static void check_regex_walks(fake *f, const char *re, const char *posix) {
    pg_grammar *g = compile_ok(PG_GRAMMAR_REGEX, re, f->v);
    regex_t rx;
    assert_int_equal(regcomp(&rx, posix, REG_EXTENDED | REG_NOSUB), 0);
    char out[4096];
    for (int it = 0; it < 200; it++) {
        if (fake_walk(f, g, 0.3, out, sizeof out) < 0) fail_msg("walk did not end for %s", re);
        if (regexec(&rx, out, 0, NULL, 0)) fail_msg("'%s' does not match %s", out, re);
    }
    regfree(&rx);
    pg_grammar_unref(g);
}

static void test_regex_outputs_match(void **st) {
    (void)st;
    fake f = fake_make();
    rng_state = 5;
    check_regex_walks(&f, "^[a-z]{2,4}-\\d+$", "^[a-z]{2,4}-[0-9]+$");
    check_regex_walks(&f, "(cat|dog)s?( [A-Z]\\w*)*", "^(cat|dog)s?( [A-Z][A-Za-z0-9_]*)*$");
    check_regex_walks(&f, "[^a-z\\s]{3}\\.(?:x|yz)", "^[^a-z[:space:]]{3}\\.(x|yz)$");
    char err[256];
    assert_int_equal(compile_err(PG_GRAMMAR_REGEX, "(a)\\1", f.v, err, sizeof err), PG_EUNSUPP);
    assert_non_null(strstr(err, "backreference"));
    assert_int_equal(compile_err(PG_GRAMMAR_REGEX, "a(?=b)", f.v, err, sizeof err), PG_EUNSUPP);
    assert_int_equal(compile_err(PG_GRAMMAR_REGEX, "a)", f.v, err, sizeof err), PG_EINVAL);
    assert_int_equal(compile_err(PG_GRAMMAR_REGEX, "*a", f.v, err, sizeof err), PG_EINVAL);
    assert_int_equal(compile_err(PG_GRAMMAR_REGEX, "(a*)*", f.v, err, sizeof err), PG_EINVAL);
    fake_free(&f);
}

static void test_choice(void **st) {
    (void)st;
    fake f = fake_make();
    pg_grammar *g = compile_ok(PG_GRAMMAR_CHOICE, "[\"abc\", \"ab\", \"x\\\"y\"]", f.v);
    rng_state = 9;
    char out[256];
    int seen[3] = {0};
    for (int it = 0; it < 200; it++) {
        assert_true(fake_walk(&f, g, 0.5, out, sizeof out) >= 0);
        if (!strcmp(out, "abc")) seen[0]++;
        else if (!strcmp(out, "ab")) seen[1]++;
        else if (!strcmp(out, "x\"y")) seen[2]++;
        else fail_msg("not a choice: %s", out);
    }
    assert_true(seen[0] && seen[1] && seen[2]);
    pg_grammar_unref(g);
    char err[256];
    assert_int_equal(compile_err(PG_GRAMMAR_CHOICE, "[]", f.v, err, sizeof err), PG_EINVAL);
    assert_int_equal(compile_err(PG_GRAMMAR_CHOICE, "[1]", f.v, err, sizeof err), PG_EINVAL);
    fake_free(&f);
}

// --- the default model's tokenizer -----------------------------------------------------

static pg_tokenizer *load_smollm(void) {
    const char *json = "tests/data/tokenizer_smollm2.json";
    const char *cfg = "tests/data/tokenizer_smollm2_config.json";
    if (access(json, R_OK)) return NULL;
    pg_tokenizer *t = NULL;
    if (pg_tokenizer_from_hf(json, cfg, &t) != 0) fail_msg("from_hf: %s", pg_err_msg());
    return t;
}

static void test_real_vocab_schema_walks(void **st) {
    (void)st;
    pg_tokenizer *t = load_smollm();
    if (!t) {
        fprintf(stderr, "SKIP: tests/data/tokenizer_smollm2.json not found (run from the repo root)\n");
        skip();
    }
    pg_struct_vocab *v;
    assert_int_equal(pg_struct_vocab_from_tokenizer(t, &v), 0);
    int32_t n = pg_tokenizer_vocab_size(t);
    char **tok = calloc((size_t)n, sizeof(char *));
    int32_t *len = calloc((size_t)n, sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) {
        char buf[512];
        int k = pg_tokenizer_token_bytes(t, i, buf, sizeof buf);
        tok[i] = malloc((size_t)k + 1);
        memcpy(tok[i], buf, (size_t)k);
        len[i] = k;
    }
    const char *schema =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
        "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
        "\"pets\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"cat\",\"dog\"]},\"maxItems\":4}},"
        "\"required\":[\"name\",\"age\",\"pets\"]}";
    pg_grammar *g = compile_ok(PG_GRAMMAR_JSON_SCHEMA, schema, v);
    rng_state = 1;
    char out[65536];
    for (int it = 0; it < 20; it++) {
        int steps = walk(g, (const char *const *)tok, len, n, pg_tokenizer_eos(t), 0.5, 3000, out, sizeof out);
        if (steps < 0) fail_msg("walk did not finish: %.200s", out);
        cJSON *j = cJSON_Parse(out);
        if (!j) fail_msg("not JSON: %s", out);
        cJSON *age = cJSON_GetObjectItem(j, "age");
        assert_true(cJSON_IsNumber(age) && age->valuedouble >= 0 && age->valuedouble <= 150);
        assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "name")));
        cJSON_Delete(j);
    }
    // Special tokens are never text: <|im_end|> only as EOS (it is EOS here).
    pg_matcher *m = pg_matcher_create(g);
    uint32_t *mask = calloc((size_t)(n + 31) / 32, 4);
    pg_matcher_fill_mask(m, mask);
    int32_t im_start = pg_tokenizer_find(t, "<|im_start|>");
    assert_true(im_start >= 0);
    assert_false(has(mask, im_start));
    assert_false(has(mask, pg_tokenizer_eos(t)));
    assert_true(has(mask, pg_tokenizer_find(t, "{\"")));
    fprintf(stderr, "  smollm2 schema grammar: %d states, %zu bytes\n", pg_grammar_state_count(g),
            pg_grammar_state_bytes(g));
    free(mask);
    pg_matcher_free(m);
    pg_grammar_unref(g);
    for (int32_t i = 0; i < n; i++) free(tok[i]);
    free(tok);
    free(len);
    pg_struct_vocab_free(v);
    pg_tokenizer_free(t);
}

// --- fast masks against the slow exact ones ------------------------------------------
//
// Random schemas; for each, three grammars: the normal one with its
// background precomputation finished (masks from the copy), one with the
// precomputation off (masks from the trie walk with byte classes and
// plain-subtree shortcuts), and the reference (one byte per class, no
// shortcuts) whose masks are computed token by token. Random walks through
// all three must see identical masks at every step.

typedef struct sg_buf_t {
    char *p;
    size_t n, cap;
} sg_buf_t;

static void rand_schema(sg_buf_t *b, int depth);

static void bput(sg_buf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, tmp, (size_t)k + 1);
    b->n += (size_t)k;
}

static const char *PATTERNS[] = {"^[a-z]+@[a-z]+\\\\.com$", "^[0-9]{3}-[0-9]{4}$", "^[A-Z][a-z]*$",
                                 "^(ab|cd)+x?$", "^\\\\w+ \\\\d+$"};

static void rand_schema(sg_buf_t *b, int depth) {
    int k = (int)(rnd() % (depth >= 2 ? 7 : 10));
    switch (k) {
    case 0: case 1:
        switch (rnd() % 5) {
        case 0: bput(b, "{\"type\":\"string\"}"); break;
        case 1: bput(b, "{\"type\":\"string\",\"maxLength\":%u}", 1 + rnd() % 40); break;
        case 2: bput(b, "{\"type\":\"string\",\"minLength\":%u,\"maxLength\":%u}", rnd() % 3, 3 + rnd() % 20); break;
        case 3: bput(b, "{\"type\":\"string\",\"pattern\":\"%s\"}", PATTERNS[rnd() % 5]); break;
        default: bput(b, "{\"type\":\"string\",\"format\":\"%s\"}", (const char *[]){"date", "uuid", "email", "time"}[rnd() % 4]);
        }
        break;
    case 2: bput(b, "{\"type\":\"integer\",\"minimum\":%d,\"maximum\":%d}", -(int)(rnd() % 50), (int)(rnd() % 5000)); break;
    case 3: bput(b, "{\"type\":\"number\"}"); break;
    case 4: bput(b, "{\"type\":\"boolean\"}"); break;
    case 5: bput(b, "{\"enum\":[\"red\",\"green\",%u,null]}", rnd() % 100); break;
    case 6: bput(b, "{\"type\":[\"string\",\"null\"]}"); break;
    case 7:
        bput(b, "{\"type\":\"array\",\"items\":");
        rand_schema(b, depth + 1);
        bput(b, ",\"maxItems\":%u}", 1 + rnd() % 4);
        break;
    case 8:
        bput(b, "{\"anyOf\":[");
        rand_schema(b, depth + 1);
        bput(b, ",");
        rand_schema(b, depth + 1);
        bput(b, "]}");
        break;
    default: {
        int np = 1 + (int)(rnd() % 4);
        bput(b, "{\"type\":\"object\",\"properties\":{");
        for (int i = 0; i < np; i++) {
            bput(b, "%s\"p%d\":", i ? "," : "", i);
            rand_schema(b, depth + 1);
        }
        bput(b, "},\"required\":[");
        int nr = 0;
        for (int i = 0; i < np; i++)
            if (rnd() % 2) bput(b, "%s\"p%d\"", nr++ ? "," : "", i);
        bput(b, "]}");
    }
    }
}

// Compares the three grammars' masks along `walks` random walks of up to
// `steps` tokens; returns the masks compared.
static int compare_masks(const char *schema, pg_struct_vocab *v, int32_t n, int walks, int steps) {
    char err[256];
    pg_grammar *fast = NULL, *lazy = NULL, *ref = NULL;
    pg_grammar_limits lim;
    pg_grammar_limits_default(&lim);
    if (pg_grammar_compile(PG_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), v, &lim, &fast, err, sizeof err))
        fail_msg("compile %s: %s", schema, err);
    if (!pg_grammar_precompute_wait(fast, 60000)) fail_msg("no precomputation for %s", schema);
    lim.precompute_states = 0;
    assert_int_equal(pg_grammar_compile(PG_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), v, &lim, &lazy, err, sizeof err), 0);
    assert_int_equal(sg_grammar_compile_reference(PG_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), v, &ref, err, sizeof err), 0);
    int32_t nw = (n + 31) / 32;
    uint32_t *a = malloc(4 * (size_t)nw), *bm = malloc(4 * (size_t)nw), *c = malloc(4 * (size_t)nw);
    int32_t *allowed = malloc(sizeof(int32_t) * (size_t)n);
    int compared = 0;
    for (int w = 0; w < walks; w++) {
        pg_matcher *ma = pg_matcher_create(fast), *mb = pg_matcher_create(lazy), *mc = pg_matcher_create(ref);
        for (int s = 0; s < steps && !pg_matcher_is_terminated(mc); s++) {
            pg_matcher_fill_mask(ma, a);
            pg_matcher_fill_mask(mb, bm);
            sg_matcher_reference_mask(mc, c);
            compared++;
            for (int32_t i = 0; i < nw; i++)
                if (a[i] != c[i] || bm[i] != c[i])
                    fail_msg("schema %s, walk %d step %d: mask word %d: precomputed %08x lazy %08x exact %08x",
                             schema, w, s, i, a[i], bm[i], c[i]);
            int32_t na = 0;
            for (int32_t t = 0; t < n; t++)
                if (c[t >> 5] >> (t & 31) & 1) allowed[na++] = t;
            assert_true(na > 0);
            // Mostly short tokens so walks get through strings, sometimes any.
            int32_t pick = allowed[rnd() % (uint32_t)na];
            assert_int_equal(pg_matcher_advance(ma, pick), 0);
            assert_int_equal(pg_matcher_advance(mb, pick), 0);
            assert_int_equal(pg_matcher_advance(mc, pick), 0);
        }
        pg_matcher_free(ma);
        pg_matcher_free(mb);
        pg_matcher_free(mc);
    }
    free(a);
    free(bm);
    free(c);
    free(allowed);
    pg_grammar_unref(fast);
    pg_grammar_unref(lazy);
    pg_grammar_unref(ref);
    return compared;
}

// pg_grammar_precompute_notify, the engine's wake-up for a request it holds
// while the grammar's masks are precomputed: called once when the thread
// finishes (before pg_grammar_precompute_wait returns), at once when it has
// already finished or when there is no precomputation, never after a clear.
// Bounds past +-1e15 on the wrong side have no int64 to stand for them
// (the fuzzer's maximum of -1e300 overflowed a negation): refused by name.
static void test_schema_far_bounds_refused(void **st) {
    (void)st;
    fake f = fake_make();
    const char *bad[] = {"{\"type\":\"number\",\"maximum\":-1e300}", "{\"type\":\"integer\",\"minimum\":1e300}",
                         "{\"type\":\"number\",\"exclusiveMaximum\":-1e16}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        pg_grammar_limits lim;
        pg_grammar_limits_default(&lim);
        pg_grammar *g = NULL;
        assert_int_not_equal(pg_grammar_compile(PG_GRAMMAR_JSON_SCHEMA, bad[i], strlen(bad[i]), f.v, &lim, &g, err,
                                                sizeof err), 0);
        assert_null(g);
        assert_non_null(strstr(err, "1e15"));
    }
    // Far bounds on the open side stay open.
    const char *ok = "{\"type\":\"number\",\"minimum\":-1e300,\"maximum\":3}";
    char err[256];
    pg_grammar_limits lim;
    pg_grammar_limits_default(&lim);
    pg_grammar *g = NULL;
    assert_int_equal(pg_grammar_compile(PG_GRAMMAR_JSON_SCHEMA, ok, strlen(ok), f.v, &lim, &g, err, sizeof err), 0);
    pg_grammar_unref(g);
    fake_free(&f);
}

static atomic_int notified;
static void count_notify(void *arg) {
    assert_ptr_equal(arg, &notified);
    atomic_fetch_add(&notified, 1);
}

static void test_precompute_notify(void **st) {
    (void)st;
    fake f = fake_make();
    char err[256];
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
                         "\"b\":{\"type\":\"integer\",\"minimum\":3}},\"required\":[\"a\",\"b\"]}";
    pg_grammar_limits lim;
    pg_grammar_limits_default(&lim);
    pg_grammar *g = NULL;
    assert_int_equal(pg_grammar_compile(PG_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), f.v, &lim, &g, err, sizeof err), 0);
    pg_grammar_precompute pc;
    pg_grammar_precompute_stats(g, &pc);
    assert_true(pc.started);
    atomic_store(&notified, 0);
    pg_grammar_precompute_notify(g, count_notify, &notified);
    assert_true(pg_grammar_precompute_wait(g, 60000));
    assert_int_equal(atomic_load(&notified), 1); // once, by the time the wait returns
    pg_grammar_precompute_notify(g, count_notify, &notified); // already done: at once
    assert_int_equal(atomic_load(&notified), 2);
    pg_grammar_precompute_notify(g, NULL, NULL);
    assert_int_equal(atomic_load(&notified), 2);
    pg_grammar_unref(g);
    // No precomputation at all: at once too.
    lim.precompute_states = 0;
    assert_int_equal(pg_grammar_compile(PG_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), f.v, &lim, &g, err, sizeof err), 0);
    pg_grammar_precompute_notify(g, count_notify, &notified);
    assert_int_equal(atomic_load(&notified), 3);
    pg_grammar_unref(g);
    fake_free(&f);
}

// The real 49k vocabulary and, grown from it as bench_structured does, a
// synthetic 128k one (pairs of tokens concatenated, as BPE merges are).
static void test_fast_masks_equal_exact_masks(void **st) {
    (void)st;
    pg_tokenizer *t = load_smollm();
    if (!t) {
        fprintf(stderr, "SKIP: tests/data/tokenizer_smollm2.json not found (run from the repo root)\n");
        skip();
    }
    int32_t n = pg_tokenizer_vocab_size(t), big = 128256;
    char **tok = calloc((size_t)big, sizeof(char *));
    int32_t *len = calloc((size_t)big, sizeof(int32_t));
    bool *sp = calloc((size_t)big, sizeof(bool));
    for (int32_t i = 0; i < n; i++) {
        char buf[1024];
        int k = pg_tokenizer_token_bytes(t, i, buf, sizeof buf);
        if (k < 0 || k > (int)sizeof buf) k = 0;
        tok[i] = malloc((size_t)k + 1);
        memcpy(tok[i], buf, (size_t)k);
        len[i] = k;
        sp[i] = pg_tokenizer_is_special(t, i);
    }
    rng_state = 99;
    for (int32_t i = n; i < big; i++) {
        int32_t x, y;
        do {
            x = (int32_t)(rnd() % (uint32_t)n);
            y = (int32_t)(rnd() % (uint32_t)n);
        } while (sp[x] || sp[y] || !len[x] || !len[y] || len[x] + len[y] > 24);
        len[i] = len[x] + len[y];
        tok[i] = malloc((size_t)len[i]);
        memcpy(tok[i], tok[x], (size_t)len[x]);
        memcpy(tok[i] + len[x], tok[y], (size_t)len[y]);
    }
    // PAGED_TEST_QUICK=1: fewer schemas (ASan is slower by several times).
    const char *q = getenv("PAGED_TEST_QUICK");
    bool quick = q && *q && strcmp(q, "0");
    int schemas[2] = {quick ? 8 : 30, quick ? 3 : 8};
    for (int pass = 0; pass < 2; pass++) {
        int32_t nv = pass ? big : n;
        pg_struct_vocab *v;
        assert_int_equal(pg_struct_vocab_create(nv, (const char *const *)tok, len, sp, pg_tokenizer_eos(t), &v), 0);
        int compared = 0;
        for (int k = 0; k < schemas[pass]; k++) {
            sg_buf_t b = {0};
            rand_schema(&b, 0);
            compared += compare_masks(b.p, v, nv, 2, 40);
            free(b.p);
        }
        fprintf(stderr, "  %d-token vocabulary: %d schemas, %d masks equal to the exact ones\n", nv,
                schemas[pass], compared);
        pg_struct_vocab_free(v);
    }
    for (int32_t i = 0; i < big; i++) free(tok[i]);
    free(tok);
    free(len);
    free(sp);
    pg_tokenizer_free(t);
}

int main(void) {
    setlocale(LC_ALL, "C.UTF-8");  // regexec counts characters, not bytes
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_masks_and_advance),
        cmocka_unit_test(test_gbnf_multibyte_token_prefixes),
        cmocka_unit_test(test_gbnf_refuses_disallowed_token_unchanged),
        cmocka_unit_test(test_gbnf_llama_cpp_style_grammar),
        cmocka_unit_test(test_gbnf_errors_name_the_problem),
        cmocka_unit_test(test_schema_object_walks_validate),
        cmocka_unit_test(test_schema_refs_and_recursion),
        cmocka_unit_test(test_schema_errors_name_the_problem),
        cmocka_unit_test(test_json_object_mode),
        cmocka_unit_test(test_regex_outputs_match),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_real_vocab_schema_walks),
        cmocka_unit_test(test_fast_masks_equal_exact_masks),
        cmocka_unit_test(test_precompute_notify),
        cmocka_unit_test(test_schema_far_bounds_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
