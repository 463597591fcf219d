// tests/fuzz/fuzz_grammar.c - fuzz target for the structured-output
// compilers and matcher (text/grammar/structured.h).
//
// Input: byte 0 picks the kind (GBNF, JSON schema, JSON object, regex,
// choice list) and seeds the walk; the rest is the text. Compiled against a
// small vocabulary (every printable byte, some multi-byte tokens, a split
// UTF-8 character, EOS) under tight limits. When it compiles, a walk of up
// to 48 tokens takes allowed tokens chosen from the input's bytes. Checked
// on every input:
//   - compilation either succeeds or fails with a message (no crash, no
//     leak: ASan/LSan watch), bounded by the limits;
//   - a mask is never empty (EOS is the way out), and every token it allows
//     is accepted by advance; a token it refuses is refused, leaving the
//     matcher as it was;
//   - the GBNF text a schema / regex / choice list converts to compiles;
//   - all of it also with the background precomputation of masks (one
//     input in four, by length), before and after it is published.
// Built with the standalone driver (build/fuzz/fuzz_grammar) and libFuzzer.
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar/structured.h"

#define CHECK(c)                                                                          \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "fuzz_grammar: %s:%d: %s\n", __FILE__, __LINE__, #c);         \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

static const char *MULTI[] = {"{\"", "\":", "\"}", "true", "null", ", ", "ab", "12", "\": \"",
                              "\xc3", "\xa9", "\xc3\xa9", "\n", "  ", "[\"", "\"]"};
#define N_MULTI (int)(sizeof MULTI / sizeof MULTI[0])

static pg_struct_vocab *vocab;
static int32_t n_vocab, eos;

static void init_vocab(void) {
    if (vocab) return;
    static char one[95][2];
    const char *tok[95 + N_MULTI + 1];
    int32_t len[95 + N_MULTI + 1];
    bool special[95 + N_MULTI + 1] = {0};
    int k = 0;
    for (int c = 32; c < 127; c++, k++) {
        one[k][0] = (char)c;
        tok[k] = one[k];
        len[k] = 1;
    }
    for (int i = 0; i < N_MULTI; i++, k++) {
        tok[k] = MULTI[i];
        len[k] = (int32_t)strlen(MULTI[i]);
    }
    eos = k;
    tok[k] = "</s>";
    len[k] = 4;
    special[k++] = true;
    n_vocab = k;
    CHECK(pg_struct_vocab_create(n_vocab, tok, len, special, eos, &vocab) == 0);
}

static bool bit(const uint32_t *m, int32_t t) { return m[t >> 5] >> (t & 31) & 1; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    init_vocab();
    pg_grammar_limits lim;
    pg_grammar_limits_default(&lim);
    lim.max_elements = 20000;
    lim.max_repeat = 64;
    lim.max_depth = 16;
    lim.max_stacks = 64;
    lim.max_stack_depth = 128;
    lim.max_state_bytes = 8 << 20;
    // The background precomputation (its copy, its publication, a matcher
    // moving over, a drop while it works) on one input in four, by length,
    // small, so the fuzzer's rate stays up; one in eight waits for it, so
    // the walk below runs on the published copy.
    lim.precompute_states = size % 4 == 0 ? 64 : 0;
    lim.precompute_ms = 50;
    pg_grammar_kind kind = (pg_grammar_kind)(data[0] % 5);
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    char err[256];
    pg_grammar *g = NULL;
    int rc = pg_grammar_compile(kind, text, n, vocab, &lim, &g, err, sizeof err);
    if (rc < 0) {
        CHECK(g == NULL && err[0]);
        return 0;
    }
    CHECK(g != NULL);
    if (size % 8 == 0) pg_grammar_precompute_wait(g, 1000);
    if (kind != PG_GRAMMAR_GBNF) {  // the generated GBNF compiles on its own
        char *gbnf = NULL;
        CHECK(pg_grammar_to_gbnf(kind, text, n, &lim, &gbnf, err, sizeof err) == 0);
        pg_grammar *g2 = NULL;
        CHECK(pg_grammar_compile(PG_GRAMMAR_GBNF, gbnf, strlen(gbnf), vocab, &lim, &g2, err, sizeof err) == 0);
        pg_grammar_unref(g2);
        free(gbnf);
    }
    pg_matcher *m = pg_matcher_create(g);
    uint32_t mask[8] = {0}, again[8] = {0};  // 4 words are used
    uint32_t pick = data[0];
    for (int step = 0; step < 48 && !pg_matcher_is_terminated(m); step++) {
        pg_matcher_fill_mask(m, mask);
        int allowed = 0;
        for (int32_t t = 0; t < n_vocab; t++) allowed += bit(mask, t);
        CHECK(allowed > 0);
        // A refused token leaves the matcher unchanged.
        for (int32_t t = 0; t < n_vocab; t++)
            if (!bit(mask, t)) {
                CHECK(pg_matcher_advance(m, t) != 0);
                pg_matcher_fill_mask(m, again);
                CHECK(!memcmp(mask, again, sizeof mask));
                break;
            }
        pick = pick * 1103515245u + 12345u + (step + 1 < (int)size ? data[step + 1] : 0);
        int32_t want = (int32_t)(pick >> 8) % allowed, t = 0;
        for (;; t++)
            if (bit(mask, t) && want-- == 0) break;
        CHECK(pg_matcher_advance(m, t) == 0);
    }
    pg_matcher_free(m);
    pg_grammar_unref(g);
    return 0;
}
