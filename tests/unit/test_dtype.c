// tests/unit/test_dtype.c - block tables and dequantization of every weight
// type against golden values from llama.cpp's gguf-py
// (tests/data/gen_dequant_golden.py -> tests/data/dequant_golden.bin).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "tests/unit/gguf_writer.h"

// --- golden file -----------------------------------------------------------------

typedef struct {
    uint32_t type, n_elems, n_bytes;
    const uint8_t *raw;
    const uint8_t *expected; // n_elems little-endian f32
} golden_section;

typedef struct {
    uint8_t *file;
    size_t size;
    uint32_t n;
    golden_section sec[64];
} golden;

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static int golden_setup(void **state) {
    char path[4096];
    if (!tw_repo_path("tests/data/dequant_golden.bin", path, sizeof path)) {
        fprintf(stderr, "tests/data/dequant_golden.bin not found (run from the repository root)\n");
        return -1;
    }
    golden *g = calloc(1, sizeof *g);
    FILE *fp = fopen(path, "rb");
    if (!g || !fp) return -1;
    fseek(fp, 0, SEEK_END);
    g->size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    g->file = malloc(g->size);
    if (fread(g->file, 1, g->size, fp) != g->size) return -1;
    fclose(fp);
    if (g->size < 12 || memcmp(g->file, "PGDQ", 4) != 0 || rd32(g->file + 4) != 1) return -1;
    g->n = rd32(g->file + 8);
    if (g->n > 64) return -1;
    size_t pos = 12;
    for (uint32_t i = 0; i < g->n; i++) {
        golden_section *s = &g->sec[i];
        if (pos + 12 > g->size) return -1;
        s->type = rd32(g->file + pos);
        s->n_elems = rd32(g->file + pos + 4);
        s->n_bytes = rd32(g->file + pos + 8);
        pos += 12;
        if (pos + s->n_bytes + 4ull * s->n_elems > g->size) return -1;
        s->raw = g->file + pos;
        pos += s->n_bytes;
        s->expected = g->file + pos;
        pos += 4ull * s->n_elems;
    }
    if (pos != g->size) return -1;
    *state = g;
    return 0;
}

static int golden_teardown(void **state) {
    golden *g = *state;
    if (g) free(g->file);
    free(g);
    return 0;
}

// Bitwise equal, both NaN, or within 1e-6 relative. Returns 1 for a
// bitwise match, 0 for a close one, -1 for a mismatch.
static int float_match(float got, float want) {
    if (memcmp(&got, &want, 4) == 0) return 1;
    if (isnan(got) && isnan(want)) return 1;
    if (isfinite(want) && fabsf(got - want) <= 1e-6f * fmaxf(fabsf(want), 1e-30f)) return 0;
    return -1;
}

static void check_section(const golden_section *s, const uint8_t *src) {
    float *out = malloc(sizeof(float) * s->n_elems);
    assert_non_null(out);
    pg_dequantize_row((int)s->type, src, out, s->n_elems);
    uint32_t exact = 0;
    for (uint32_t i = 0; i < s->n_elems; i++) {
        float want;
        uint32_t u = rd32(s->expected + 4 * i);
        memcpy(&want, &u, 4);
        int m = float_match(out[i], want);
        if (m < 0) {
            uint32_t gu;
            memcpy(&gu, &out[i], 4);
            fail_msg("%s element %u: got %.9g (0x%08x), want %.9g (0x%08x)", pg_dtype_name((int)s->type), i,
                     out[i], gu, want, u);
        }
        exact += m == 1;
    }
    // gcc with -std=c11 does not contract a*b+c into an fma, so the results
    // are bit-identical to ggml/numpy; tolerate a stray ulp only elsewhere.
    assert_true(exact >= s->n_elems * 99 / 100);
    if (getenv("PG_TEST_VERBOSE")) printf("  %s: %u/%u bitwise equal\n", pg_dtype_name((int)s->type), exact, s->n_elems);
    free(out);
}

static void test_dequantize_matches_gguf_py_for_every_type(void **state) {
    golden *g = *state;
    int seen[PG_DTYPE_COUNT] = {0};
    for (uint32_t i = 0; i < g->n; i++) {
        const golden_section *s = &g->sec[i];
        assert_true(s->type < PG_DTYPE_COUNT);
        assert_int_equal(pg_dtype_row_bytes((int)s->type, s->n_elems), s->n_bytes);
        check_section(s, s->raw);
        seen[s->type] = 1;
    }
    static const int all[] = {PG_DTYPE_F32,  PG_DTYPE_F16,  PG_DTYPE_BF16, PG_DTYPE_Q4_0,
                              PG_DTYPE_Q4_1, PG_DTYPE_Q5_0, PG_DTYPE_Q5_1, PG_DTYPE_Q8_0,
                              PG_DTYPE_Q4_K, PG_DTYPE_Q5_K, PG_DTYPE_Q6_K};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!seen[all[i]]) fail_msg("golden file has no %s section", pg_dtype_name(all[i]));
    }
}

// Blocks are packed (Q4_0 is 18 bytes), so real rows start at odd
// addresses: the dequantizers must not assume alignment.
static void test_dequantize_unaligned_source(void **state) {
    golden *g = *state;
    for (uint32_t i = 0; i < g->n; i++) {
        const golden_section *s = &g->sec[i];
        uint8_t *buf = malloc(s->n_bytes + 3);
        assert_non_null(buf);
        memcpy(buf + 3, s->raw, s->n_bytes);
        check_section(s, buf + 3);
        free(buf);
    }
}

// Dequantizing block by block gives the same values as the whole row.
static void test_dequantize_block_by_block_equals_whole_row(void **state) {
    golden *g = *state;
    for (uint32_t i = 0; i < g->n; i++) {
        const golden_section *s = &g->sec[i];
        int be = pg_dtype_block_elems((int)s->type);
        size_t bb = pg_dtype_block_bytes((int)s->type);
        float *whole = malloc(sizeof(float) * s->n_elems), *part = malloc(sizeof(float) * s->n_elems);
        pg_dequantize_row((int)s->type, s->raw, whole, s->n_elems);
        for (uint32_t b = 0; b < s->n_elems / (uint32_t)be; b++)
            pg_dequantize_row((int)s->type, s->raw + b * bb, part + (size_t)b * be, be);
        assert_memory_equal(whole, part, sizeof(float) * s->n_elems);
        // n = 0 writes nothing.
        pg_dequantize_row((int)s->type, s->raw, part, 0);
        free(whole);
        free(part);
    }
}

// --- tables ------------------------------------------------------------------------

static void test_block_tables_match_ggml(void **state) {
    (void)state;
    struct {
        int t, elems;
        size_t bytes;
        const char *name;
    } want[] = {
        {PG_DTYPE_F32, 1, 4, "f32"},       {PG_DTYPE_F16, 1, 2, "f16"},     {PG_DTYPE_BF16, 1, 2, "bf16"},
        {PG_DTYPE_Q4_0, 32, 18, "q4_0"},   {PG_DTYPE_Q4_1, 32, 20, "q4_1"}, {PG_DTYPE_Q8_0, 32, 34, "q8_0"},
        {PG_DTYPE_Q5_0, 32, 22, "q5_0"},   {PG_DTYPE_Q5_1, 32, 24, "q5_1"},
        {PG_DTYPE_Q4_K, 256, 144, "q4_K"}, {PG_DTYPE_Q5_K, 256, 176, "q5_K"}, {PG_DTYPE_Q6_K, 256, 210, "q6_K"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_int_equal(pg_dtype_block_elems(want[i].t), want[i].elems);
        assert_int_equal(pg_dtype_block_bytes(want[i].t), want[i].bytes);
        assert_string_equal(pg_dtype_name(want[i].t), want[i].name);
    }
}

static void test_unknown_and_unsupported_types_have_no_blocks(void **state) {
    (void)state;
    int bad[] = {-1, 4, 5, 9, 10, 11, 15, 16, 28, 29, PG_DTYPE_COUNT, 99, 1 << 30};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(pg_dtype_block_elems(bad[i]), 0);
        assert_int_equal(pg_dtype_block_bytes(bad[i]), 0);
        assert_int_equal(pg_dtype_row_bytes(bad[i], 32), 0);
    }
    assert_string_equal(pg_dtype_name(-1), "unknown");
    assert_string_equal(pg_dtype_name(4), "unknown"); // removed from GGML
    assert_string_equal(pg_dtype_name(99), "unknown");
    assert_string_equal(pg_dtype_name(10), "q2_K");   // GGML's, not supported here
}

static void test_row_bytes_rejects_partial_blocks_negative_and_overflow(void **state) {
    (void)state;
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_Q4_1, 576), 576 / 32 * 20);
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_Q6_K, 4096), 16 * 210);
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_F32, 0), 0);
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_Q4_0, 33), 0);
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_Q4_K, 128), 0);
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_F16, -2), 0);
    // 2^62 f32 elements are 2^64 bytes: not representable.
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_F32, INT64_C(1) << 62), 0);
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_F32, INT64_C(1) << 60), (size_t)1 << 62);
    // Largest multiple of 32 below 2^63: blocks * 34 still fits in 64 bits.
    int64_t big = INT64_MAX / 32 * 32;
    assert_int_equal(pg_dtype_row_bytes(PG_DTYPE_Q8_0, big), (size_t)(big / 32) * 34);
}

// Hand-made blocks with known values (independent of the golden file).
static void test_dequantize_known_blocks(void **state) {
    (void)state;
    float out[256];
    // Q8_0: d = 0.5 (fp16 0x3800), q = -128..-97.
    uint8_t q8[34] = {0x00, 0x38};
    for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(int8_t)(-128 + i);
    pg_dequantize_row(PG_DTYPE_Q8_0, q8, out, 32);
    for (int i = 0; i < 32; i++) assert_true(out[i] == 0.5f * (float)(-128 + i));
    // Q4_0: d = 2 (0x4000); qs[j] = j | (15-j)<<4 -> x[j] = (j-8)*2, x[j+16] = (7-j)*2.
    uint8_t q4[18] = {0x00, 0x40};
    for (int j = 0; j < 16; j++) q4[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    pg_dequantize_row(PG_DTYPE_Q4_0, q4, out, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == 2.0f * (float)(j - 8));
        assert_true(out[j + 16] == 2.0f * (float)(7 - j));
    }
    // Q4_1: d = 1, m = -1.5 (0xbe00): x = q - 1.5.
    uint8_t q41[20] = {0x00, 0x3c, 0x00, 0xbe};
    for (int j = 0; j < 16; j++) q41[4 + j] = (uint8_t)(j | (j << 4));
    pg_dequantize_row(PG_DTYPE_Q4_1, q41, out, 32);
    for (int j = 0; j < 16; j++) assert_true(out[j] == (float)j - 1.5f && out[j + 16] == (float)j - 1.5f);
    // Q5_0: d = 0.5 (0x3800); qs[j] = j | (15-j)<<4, qh = 0xAAAA5555 (bit
    // j set for even j < 16 and odd j >= 16): every fifth bit is exercised.
    uint8_t q50[22] = {0x00, 0x38, 0x55, 0x55, 0xaa, 0xaa};
    for (int j = 0; j < 16; j++) q50[6 + j] = (uint8_t)(j | ((15 - j) << 4));
    pg_dequantize_row(PG_DTYPE_Q5_0, q50, out, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == 0.5f * (float)((j | (j % 2 == 0) << 4) - 16));
        assert_true(out[j + 16] == 0.5f * (float)(((15 - j) | (j % 2 == 1) << 4) - 16));
    }
    // Q5_1: d = 1, m = -1.5 (0xbe00), the same quants: x = q - 1.5.
    uint8_t q51[24] = {0x00, 0x3c, 0x00, 0xbe, 0x55, 0x55, 0xaa, 0xaa};
    for (int j = 0; j < 16; j++) q51[8 + j] = (uint8_t)(j | ((15 - j) << 4));
    pg_dequantize_row(PG_DTYPE_Q5_1, q51, out, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == (float)(j | (j % 2 == 0) << 4) - 1.5f);
        assert_true(out[j + 16] == (float)((15 - j) | (j % 2 == 1) << 4) - 1.5f);
    }
    // Q6_K with all-zero quants and scale 1, d = 1: every element is -32.
    uint8_t q6[210] = {0};
    for (int i = 0; i < 16; i++) q6[192 + i] = 1;
    q6[208] = 0x00;
    q6[209] = 0x3c;
    pg_dequantize_row(PG_DTYPE_Q6_K, q6, out, 256);
    for (int i = 0; i < 256; i++) assert_true(out[i] == -32.0f);
    // BF16 / F16 of 1.0 and -2.0.
    uint8_t bf[4] = {0x80, 0x3f, 0x00, 0xc0}, hf[4] = {0x00, 0x3c, 0x00, 0xc0};
    pg_dequantize_row(PG_DTYPE_BF16, bf, out, 2);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    pg_dequantize_row(PG_DTYPE_F16, hf, out, 2);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_tables_match_ggml),
        cmocka_unit_test(test_unknown_and_unsupported_types_have_no_blocks),
        cmocka_unit_test(test_row_bytes_rejects_partial_blocks_negative_and_overflow),
        cmocka_unit_test(test_dequantize_known_blocks),
        cmocka_unit_test_setup_teardown(test_dequantize_matches_gguf_py_for_every_type, golden_setup,
                                        golden_teardown),
        cmocka_unit_test_setup_teardown(test_dequantize_unaligned_source, golden_setup, golden_teardown),
        cmocka_unit_test_setup_teardown(test_dequantize_block_by_block_equals_whole_row, golden_setup,
                                        golden_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
