// tests/unit/test_gguf.c - the GGUF reader: metadata round trips, tensor
// layout, alignment, versions, and every malformed input we could think of
// (each must give a clean error, never a crash: run the ASan build too).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/dtype.h"
#include "formats/gguf.h"
#include "tests/unit/gguf_writer.h"

// --- helpers -----------------------------------------------------------------------

// Opens `len` bytes of `data` from an exact-size heap copy, so that any read
// past the end trips AddressSanitizer.
static int open_copy(const void *data, size_t len, const char *name, gguf_file **out, void **copy) {
    *copy = malloc(len ? len : 1);
    assert_non_null(*copy);
    if (len) memcpy(*copy, data, len);
    return gguf_open_memory(*copy, len, name, out);
}

// Expects opening `b` to fail with `code` and a message that starts with
// "t.gguf: " and contains `needle`.
static void expect_fail(const tw_buf *b, int code, const char *needle) {
    gguf_file *f = (gguf_file *)0x1;
    void *copy;
    int rc = open_copy(b->data, b->len, "t.gguf", &f, &copy);
    if (rc != code) fail_msg("expected %d, got %d (%s)", code, rc, pg_err_msg());
    assert_null(f);
    const char *msg = pg_err_msg();
    if (strncmp(msg, "t.gguf: ", 8) != 0 || !strstr(msg, needle))
        fail_msg("message \"%s\" lacks \"%s\"", msg, needle);
    free(copy);
}

static gguf_file *expect_open(const tw_buf *b, void **copy) {
    gguf_file *f = NULL;
    int rc = open_copy(b->data, b->len, "t.gguf", &f, copy);
    if (rc != 0) fail_msg("open failed: %d %s", rc, pg_err_msg());
    assert_non_null(f);
    return f;
}

// A valid file with a bit of everything: scalars of each type, a string
// array, a numeric array and three tensors of different types.
static tw_buf make_sample(uint32_t version, uint32_t align) {
    tw_gguf *g = tw_gguf_new(version);
    tw_gguf_kv_str(g, "general.architecture", "llama");
    if (align) tw_gguf_alignment(g, align);
    tw_gguf_kv_u32(g, "llama.block_count", 2);
    tw_gguf_kv_f32(g, "llama.rope.freq_base", 10000.0f);
    const char *toks[] = {"<s>", "", "hello", "\xe2\x96\x81world"};
    tw_gguf_kv_arr_str(g, "tokenizer.ggml.tokens", toks, 4);
    int32_t types[] = {3, 1, 1, -7};
    tw_gguf_kv_arr(g, "tokenizer.ggml.token_type", 5, types, 4, 4);
    float w[2 * 8];
    for (int i = 0; i < 16; i++) w[i] = (float)i * 0.25f;
    tw_gguf_tensor(g, "a.weight", PG_DTYPE_F32, 2, (uint64_t[]){8, 2}, w, sizeof w);
    uint8_t q8[2 * 34];
    for (int i = 0; i < (int)sizeof q8; i++) q8[i] = (uint8_t)(i * 7);
    tw_gguf_tensor(g, "b.weight", PG_DTYPE_Q8_0, 2, (uint64_t[]){32, 2}, q8, sizeof q8);
    uint8_t q4k[144] = {1, 2, 3};
    tw_gguf_tensor(g, "c.weight", PG_DTYPE_Q4_K, 1, (uint64_t[]){256}, q4k, sizeof q4k);
    return tw_gguf_finish(g, NULL);
}

// The header of a file: magic, version, counts; the rest is up to the test.
static void put_header(tw_buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    tw_put(b, "GGUF", 4);
    tw_u32(b, version);
    tw_u64(b, n_tensors);
    tw_u64(b, n_kv);
}

// --- metadata ---------------------------------------------------------------------

static void test_every_scalar_type_round_trips(void **state) {
    (void)state;
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_kv_u8(g, "u8", 250);
    tw_gguf_kv_i8(g, "i8", -100);
    tw_gguf_kv_u16(g, "u16", 65000);
    tw_gguf_kv_i16(g, "i16", -30000);
    tw_gguf_kv_u32(g, "u32", 4000000000u);
    tw_gguf_kv_i32(g, "i32", -2000000000);
    tw_gguf_kv_u64(g, "u64", UINT64_MAX);
    tw_gguf_kv_i64(g, "i64", INT64_MIN);
    tw_gguf_kv_f32(g, "f32", 0.1f);
    tw_gguf_kv_f64(g, "f64", -1e300);
    tw_gguf_kv_bool(g, "t", true);
    tw_gguf_kv_bool(g, "f", false);
    tw_gguf_kv_str(g, "s", "h\xc3\xa9llo");
    tw_gguf_kv_str(g, "empty", "");
    tw_buf b = tw_gguf_finish(g, NULL);
    void *copy;
    gguf_file *f = expect_open(&b, &copy);
    assert_int_equal(f->n_kv, 14);
    assert_int_equal(f->n_tensors, 0);
    assert_int_equal(f->version, 3);
    assert_int_equal(f->alignment, 32);

    uint64_t u;
    int64_t i;
    double d;
    bool bo;
    char *s;
    assert_int_equal(gguf_get_u64(f, "u8", &u), 0), assert_int_equal(u, 250);
    assert_int_equal(gguf_get_i64(f, "i8", &i), 0), assert_int_equal(i, -100);
    assert_int_equal(gguf_get_u64(f, "u16", &u), 0), assert_int_equal(u, 65000);
    assert_int_equal(gguf_get_i64(f, "i16", &i), 0), assert_int_equal(i, -30000);
    assert_int_equal(gguf_get_u64(f, "u32", &u), 0), assert_int_equal(u, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "i32", &i), 0), assert_int_equal(i, -2000000000);
    assert_int_equal(gguf_get_u64(f, "u64", &u), 0), assert_true(u == UINT64_MAX);
    assert_int_equal(gguf_get_i64(f, "i64", &i), 0), assert_true(i == INT64_MIN);
    assert_int_equal(gguf_get_f64(f, "f32", &d), 0), assert_true(d == (double)0.1f);
    assert_int_equal(gguf_get_f64(f, "f64", &d), 0), assert_true(d == -1e300);
    assert_int_equal(gguf_get_bool(f, "t", &bo), 0), assert_true(bo);
    assert_int_equal(gguf_get_bool(f, "f", &bo), 0), assert_false(bo);
    assert_int_equal(gguf_get_str(f, "s", &s), 0), assert_string_equal(s, "h\xc3\xa9llo"), free(s);
    assert_int_equal(gguf_get_str(f, "empty", &s), 0), assert_string_equal(s, ""), free(s);

    // Raw kv fields: file order, types, decoded values.
    const gguf_kv *kv = gguf_find_kv(f, "i8");
    assert_non_null(kv);
    assert_ptr_equal(kv, &f->kv[1]);
    assert_int_equal(kv->type, GGUF_TYPE_INT8);
    assert_int_equal(kv->v.i64, -100);
    kv = gguf_find_kv(f, "s");
    assert_int_equal(kv->type, GGUF_TYPE_STRING);
    assert_true(gguf_str_eq(kv->v.str, "h\xc3\xa9llo"));
    assert_true(gguf_str_eq(kv->key, "s"));
    assert_null(gguf_find_kv(f, "nope"));
    assert_null(gguf_find_kv(f, ""));
    assert_null(gguf_find_kv(f, "u")); // a prefix of "u8" is not "u8"
    gguf_close(f);
    free(copy);
    tw_buf_free(&b);
}

static void test_getters_convert_integers_when_they_fit(void **state) {
    (void)state;
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_kv_i32(g, "neg", -1);
    tw_gguf_kv_i32(g, "pos", 7);
    tw_gguf_kv_u64(g, "huge", (uint64_t)INT64_MAX + 1);
    tw_gguf_kv_u8(g, "small", 3);
    tw_gguf_kv_str(g, "str", "x");
    tw_gguf_kv_bool(g, "b", true);
    tw_gguf_kv_f32(g, "f", 1.5f);
    tw_gguf_kv_raw(g, "nul", GGUF_TYPE_STRING, "\x03\0\0\0\0\0\0\0a\0b", 11);
    tw_buf b = tw_gguf_finish(g, NULL);
    void *copy;
    gguf_file *f = expect_open(&b, &copy);
    uint64_t u;
    int64_t i;
    double d;
    bool bo;
    char *s = NULL;
    assert_int_equal(gguf_get_u64(f, "neg", &u), PG_EFORMAT);
    assert_non_null(strstr(pg_err_msg(), "'neg'"));
    assert_int_equal(gguf_get_u64(f, "pos", &u), 0), assert_int_equal(u, 7);
    assert_int_equal(gguf_get_i64(f, "huge", &i), PG_EFORMAT);
    assert_int_equal(gguf_get_u64(f, "huge", &u), 0), assert_true(u == (uint64_t)INT64_MAX + 1);
    assert_int_equal(gguf_get_i64(f, "small", &i), 0), assert_int_equal(i, 3);
    assert_int_equal(gguf_get_f64(f, "neg", &d), 0), assert_true(d == -1.0);
    assert_int_equal(gguf_get_f64(f, "huge", &d), 0), assert_true(d == 9223372036854775808.0);
    assert_int_equal(gguf_get_u64(f, "str", &u), PG_EFORMAT);
    assert_string_equal(pg_err_msg(), "t.gguf: metadata 'str' has type string, expected an integer");
    assert_int_equal(gguf_get_u64(f, "b", &u), PG_EFORMAT);
    assert_int_equal(gguf_get_u64(f, "f", &u), PG_EFORMAT);
    assert_int_equal(gguf_get_bool(f, "pos", &bo), PG_EFORMAT);
    assert_int_equal(gguf_get_f64(f, "str", &d), PG_EFORMAT);
    assert_int_equal(gguf_get_str(f, "pos", &s), PG_EFORMAT);
    assert_null(s);
    assert_int_equal(gguf_get_str(f, "nul", &s), PG_EFORMAT); // embedded NUL
    assert_null(s);
    assert_int_equal(gguf_get_u64(f, "missing", &u), PG_ENOTFOUND);
    assert_string_equal(pg_err_msg(), "t.gguf: metadata key 'missing' not found");
    assert_int_equal(gguf_get_str(f, "missing", &s), PG_ENOTFOUND);
    gguf_close(f);
    free(copy);
    tw_buf_free(&b);
}

static void test_string_and_numeric_arrays(void **state) {
    (void)state;
    tw_buf b = make_sample(3, 0);
    void *copy;
    gguf_file *f = expect_open(&b, &copy);
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_non_null(kv);
    assert_int_equal(kv->type, GGUF_TYPE_ARRAY);
    assert_int_equal(kv->arr_type, GGUF_TYPE_STRING);
    assert_int_equal(kv->arr_count, 4);
    assert_true(gguf_str_eq(gguf_arr_str(kv, 0), "<s>"));
    gguf_str e = gguf_arr_str(kv, 1);
    assert_non_null(e.ptr);
    assert_int_equal(e.len, 0);
    assert_true(gguf_str_eq(gguf_arr_str(kv, 2), "hello"));
    assert_true(gguf_str_eq(gguf_arr_str(kv, 3), "\xe2\x96\x81world"));
    assert_null(gguf_arr_str(kv, 4).ptr);
    assert_null(gguf_arr_str(kv, UINT64_MAX).ptr);
    assert_null(gguf_arr_str(NULL, 0).ptr);
    int64_t v;
    double d;
    assert_int_equal(gguf_arr_i64(kv, 0, &v), PG_EFORMAT); // strings are not numbers

    const gguf_kv *tt = gguf_find_kv(f, "tokenizer.ggml.token_type");
    assert_int_equal(tt->arr_type, GGUF_TYPE_INT32);
    assert_int_equal(tt->arr_count, 4);
    assert_null(gguf_arr_str(tt, 0).ptr); // not a string array
    assert_int_equal(gguf_arr_i64(tt, 0, &v), 0), assert_int_equal(v, 3);
    assert_int_equal(gguf_arr_i64(tt, 3, &v), 0), assert_int_equal(v, -7);
    assert_int_equal(gguf_arr_f64(tt, 3, &d), 0), assert_true(d == -7.0);
    assert_int_equal(gguf_arr_i64(tt, 4, &v), PG_EINVAL);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "llama.block_count"), 0, &v), PG_EINVAL);
    gguf_close(f);
    free(copy);
    tw_buf_free(&b);
}

static void test_arrays_of_every_element_type(void **state) {
    (void)state;
    tw_gguf *g = tw_gguf_new(3);
    uint8_t u8s[] = {1, 255};
    int8_t i8s[] = {-1, 127};
    uint16_t u16s[] = {1, 65535};
    int16_t i16s[] = {-32768, 5};
    uint32_t u32s[] = {0, 4294967295u};
    float f32s[] = {0.5f, -2.25f};
    uint8_t bools[] = {1, 0};
    uint64_t u64s[] = {(uint64_t)INT64_MAX + 2, 9};
    int64_t i64s[] = {INT64_MIN, 1};
    double f64s[] = {1e-300, 3.0};
    tw_gguf_kv_arr(g, "u8", GGUF_TYPE_UINT8, u8s, 2, 1);
    tw_gguf_kv_arr(g, "i8", GGUF_TYPE_INT8, i8s, 2, 1);
    tw_gguf_kv_arr(g, "u16", GGUF_TYPE_UINT16, u16s, 2, 2);
    tw_gguf_kv_arr(g, "i16", GGUF_TYPE_INT16, i16s, 2, 2);
    tw_gguf_kv_arr(g, "u32", GGUF_TYPE_UINT32, u32s, 2, 4);
    tw_gguf_kv_arr(g, "f32", GGUF_TYPE_FLOAT32, f32s, 2, 4);
    tw_gguf_kv_arr(g, "bool", GGUF_TYPE_BOOL, bools, 2, 1);
    tw_gguf_kv_arr(g, "u64", GGUF_TYPE_UINT64, u64s, 2, 8);
    tw_gguf_kv_arr(g, "i64", GGUF_TYPE_INT64, i64s, 2, 8);
    tw_gguf_kv_arr(g, "f64", GGUF_TYPE_FLOAT64, f64s, 2, 8);
    tw_gguf_kv_arr(g, "empty", GGUF_TYPE_UINT32, NULL, 0, 4);
    tw_gguf_kv_arr_str(g, "empty_str", NULL, 0);
    tw_buf b = tw_gguf_finish(g, NULL);
    void *copy;
    gguf_file *f = expect_open(&b, &copy);
    int64_t v;
    double d;
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "u8"), 1, &v), 0), assert_int_equal(v, 255);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "i8"), 0, &v), 0), assert_int_equal(v, -1);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "u16"), 1, &v), 0), assert_int_equal(v, 65535);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "i16"), 0, &v), 0), assert_int_equal(v, -32768);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "u32"), 1, &v), 0), assert_int_equal(v, 4294967295u);
    assert_int_equal(gguf_arr_f64(gguf_find_kv(f, "f32"), 1, &d), 0), assert_true(d == -2.25);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "f32"), 1, &v), PG_EFORMAT);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "bool"), 0, &v), PG_EFORMAT);
    assert_int_equal(gguf_arr_f64(gguf_find_kv(f, "bool"), 0, &d), PG_EFORMAT);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "u64"), 0, &v), PG_EFORMAT); // > INT64_MAX
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "u64"), 1, &v), 0), assert_int_equal(v, 9);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "i64"), 0, &v), 0), assert_true(v == INT64_MIN);
    assert_int_equal(gguf_arr_f64(gguf_find_kv(f, "f64"), 0, &d), 0), assert_true(d == 1e-300);
    assert_int_equal(gguf_find_kv(f, "bool")->arr_data[0], 1);
    assert_int_equal(gguf_find_kv(f, "empty")->arr_count, 0);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "empty"), 0, &v), PG_EINVAL);
    assert_int_equal(gguf_find_kv(f, "empty_str")->arr_count, 0);
    assert_null(gguf_arr_str(gguf_find_kv(f, "empty_str"), 0).ptr);
    gguf_close(f);
    free(copy);
    tw_buf_free(&b);
}

static void test_nested_arrays_are_kept_opaque_and_depth_limited(void **state) {
    (void)state;
    // [[1,2],[3]] as u32 arrays, followed by a normal key to prove we
    // skipped the nested bytes correctly.
    tw_buf v = {0};
    tw_u32(&v, GGUF_TYPE_ARRAY);
    tw_u64(&v, 2);
    tw_u32(&v, GGUF_TYPE_UINT32), tw_u64(&v, 2), tw_u32(&v, 1), tw_u32(&v, 2);
    tw_u32(&v, GGUF_TYPE_STRING), tw_u64(&v, 1), tw_gstr(&v, "x");
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_kv_raw(g, "nested", GGUF_TYPE_ARRAY, v.data, v.len);
    tw_gguf_kv_u32(g, "after", 42);
    tw_buf b = tw_gguf_finish(g, NULL);
    void *copy;
    gguf_file *f = expect_open(&b, &copy);
    const gguf_kv *kv = gguf_find_kv(f, "nested");
    assert_int_equal(kv->arr_type, GGUF_TYPE_ARRAY);
    assert_int_equal(kv->arr_count, 2);
    assert_null(gguf_arr_str(kv, 0).ptr);
    int64_t x;
    assert_int_equal(gguf_arr_i64(kv, 0, &x), PG_EFORMAT);
    uint64_t u;
    assert_int_equal(gguf_get_u64(f, "after", &u), 0);
    assert_int_equal(u, 42);
    gguf_close(f);
    free(copy);
    tw_buf_free(&b);
    tw_buf_free(&v);

    // 100 levels of single-element arrays: refused, not a stack overflow.
    tw_buf deep = {0};
    for (int i = 0; i < 100; i++) tw_u32(&deep, GGUF_TYPE_ARRAY), tw_u64(&deep, 1);
    tw_u32(&deep, GGUF_TYPE_UINT8), tw_u64(&deep, 0);
    g = tw_gguf_new(3);
    tw_gguf_kv_raw(g, "deep", GGUF_TYPE_ARRAY, deep.data, deep.len);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EUNSUPP, "nested");
    tw_buf_free(&b);
    tw_buf_free(&deep);
}

// --- tensors and alignment -----------------------------------------------------------

static void check_sample_tensors(const gguf_file *f, const tw_buf *b) {
    assert_int_equal(f->n_tensors, 3);
    const gguf_tensor *a = gguf_find_tensor(f, "a.weight");
    const gguf_tensor *q = gguf_find_tensor(f, "b.weight");
    const gguf_tensor *k = gguf_find_tensor(f, "c.weight");
    assert_non_null(a), assert_non_null(q), assert_non_null(k);
    assert_null(gguf_find_tensor(f, "a.weigh"));
    assert_null(gguf_find_tensor(f, "d.weight"));
    assert_ptr_equal(a, &f->tensors[0]);
    assert_int_equal(a->type, PG_DTYPE_F32);
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->dims[0], 8), assert_int_equal(a->dims[1], 2);
    assert_int_equal(a->dims[2], 1), assert_int_equal(a->dims[3], 1);
    assert_int_equal(a->nbytes, 64);
    float w[16];
    memcpy(w, a->data, sizeof w);
    for (int i = 0; i < 16; i++) assert_true(w[i] == (float)i * 0.25f);
    assert_int_equal(q->type, PG_DTYPE_Q8_0);
    assert_int_equal(q->nbytes, 68);
    assert_int_equal(((const uint8_t *)q->data)[5], 35);
    assert_int_equal(k->type, PG_DTYPE_Q4_K);
    assert_int_equal(k->n_dims, 1);
    assert_int_equal(k->nbytes, 144);
    assert_int_equal(((const uint8_t *)k->data)[2], 3);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        size_t abs = (size_t)((const uint8_t *)t->data - f->file.data);
        assert_int_equal(abs % f->alignment, 0);
        assert_int_equal(t->offset % f->alignment, 0);
        assert_int_equal(abs, f->data_offset + t->offset);
        assert_true(abs + t->nbytes <= b->len);
    }
    assert_int_equal(f->data_offset % f->alignment, 0);
}

static void test_v2_and_v3_files_open(void **state) {
    (void)state;
    for (uint32_t version = 2; version <= 3; version++) {
        tw_buf b = make_sample(version, 0);
        void *copy;
        gguf_file *f = expect_open(&b, &copy);
        assert_int_equal(f->version, version);
        assert_int_equal(f->alignment, 32);
        assert_string_equal(f->path, "t.gguf");
        assert_int_equal(f->file.fd, -1);
        check_sample_tensors(f, &b);
        gguf_close(f);
        free(copy);
        tw_buf_free(&b);
    }
}

static void test_custom_alignment_is_honoured(void **state) {
    (void)state;
    uint32_t aligns[] = {1, 8, 64, 4096};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        tw_buf b = make_sample(3, aligns[i]);
        void *copy;
        gguf_file *f = expect_open(&b, &copy);
        assert_int_equal(f->alignment, aligns[i]);
        check_sample_tensors(f, &b);
        gguf_close(f);
        free(copy);
        tw_buf_free(&b);
    }
}

static void test_bad_alignment_is_rejected(void **state) {
    (void)state;
    // No tensors: the check is on the metadata, and the writer need not pad.
    uint32_t bad[] = {0, 3, 48, 0xffffffffu};
    for (int i = 0; i < 4; i++) {
        tw_gguf *g = tw_gguf_new(3);
        tw_gguf_alignment(g, bad[i]);
        tw_buf b = tw_gguf_finish(g, NULL);
        char want[128];
        snprintf(want, sizeof want, "general.alignment %u is not a nonzero power of two", bad[i]);
        expect_fail(&b, PG_EFORMAT, want);
        tw_buf_free(&b);
    }
    int64_t neg = -32;
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_kv_i64(g, "general.alignment", neg);
    tw_buf b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "general.alignment has type i64, expected an unsigned integer");
    tw_buf_free(&b);
    g = tw_gguf_new(3);
    tw_gguf_kv_str(g, "general.alignment", "32");
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "general.alignment has type string");
    tw_buf_free(&b);
}

static void test_unaligned_tensor_offset_is_rejected(void **state) {
    (void)state;
    tw_gguf *g = tw_gguf_new(3);
    float w[8] = {0};
    tw_gguf_tensor_at(g, "w", PG_DTYPE_F32, 1, (uint64_t[]){8}, w, sizeof w, 4);
    tw_buf b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "tensor 'w' offset 4 is not a multiple of the alignment 32");
    tw_buf_free(&b);
}

static void test_zero_sized_and_scalar_tensors(void **state) {
    (void)state;
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_tensor(g, "empty", PG_DTYPE_F32, 2, (uint64_t[]){0, 5}, NULL, 0);
    float one = 3.0f;
    tw_gguf_tensor(g, "scalar", PG_DTYPE_F32, 0, NULL, &one, 4);
    tw_buf b = tw_gguf_finish(g, NULL);
    void *copy;
    gguf_file *f = expect_open(&b, &copy);
    assert_int_equal(gguf_find_tensor(f, "empty")->nbytes, 0);
    const gguf_tensor *s = gguf_find_tensor(f, "scalar");
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->nbytes, 4);
    assert_int_equal(s->dims[0], 1);
    gguf_close(f);
    free(copy);
    tw_buf_free(&b);
}

// --- versions and magic ----------------------------------------------------------------

static void test_versions_and_magic(void **state) {
    (void)state;
    tw_buf b = make_sample(1, 0);
    expect_fail(&b, PG_EUNSUPP, "GGUF version 1 is not supported");
    tw_buf_free(&b);
    b = make_sample(4, 0);
    expect_fail(&b, PG_EUNSUPP, "unsupported GGUF version 4");
    tw_buf_free(&b);
    b = make_sample(0x03000000, 0);
    expect_fail(&b, PG_EUNSUPP, "big-endian");
    tw_buf_free(&b);
    b = make_sample(3, 0);
    b.data[0] = 'X';
    expect_fail(&b, PG_EFORMAT, "bad magic (not a GGUF file)");
    b.len = 3;
    expect_fail(&b, PG_EFORMAT, "too small");
    b.len = 0;
    expect_fail(&b, PG_EFORMAT, "too small");
    tw_buf_free(&b);
    gguf_file *f = (gguf_file *)0x1;
    assert_int_equal(gguf_open_memory(NULL, 0, NULL, &f), PG_EFORMAT);
    assert_null(f);
    assert_int_equal(strncmp(pg_err_msg(), "<memory>: ", 10), 0);
}

// --- malformed input ---------------------------------------------------------------

// Every proper prefix of a valid file that cuts into the header, metadata,
// tensor infos or tensor data must fail cleanly with PG_EFORMAT.
static void test_truncation_at_every_byte_fails_cleanly(void **state) {
    (void)state;
    for (uint32_t align = 0; align <= 64; align += 64) {
        tw_buf b = make_sample(3, align);
        void *copy;
        gguf_file *full = expect_open(&b, &copy);
        size_t data_end = 0;
        for (uint64_t i = 0; i < full->n_tensors; i++) {
            const gguf_tensor *t = &full->tensors[i];
            size_t end = (size_t)(full->data_offset + t->offset + t->nbytes);
            if (end > data_end) data_end = end;
        }
        gguf_close(full);
        free(copy);
        for (size_t len = 0; len < b.len; len++) {
            gguf_file *f = NULL;
            int rc = open_copy(b.data, len, "t.gguf", &f, &copy);
            if (len < data_end) {
                if (rc != PG_EFORMAT) fail_msg("prefix of %zu bytes: rc %d (%s)", len, rc, pg_err_msg());
                assert_null(f);
                assert_int_equal(strncmp(pg_err_msg(), "t.gguf: ", 8), 0);
            } else {
                // Only the trailing padding is missing: still a valid file.
                assert_int_equal(rc, 0);
            }
            gguf_close(f);
            free(copy);
        }
        tw_buf_free(&b);
    }
}

static void test_truncation_message_names_the_item(void **state) {
    (void)state;
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_kv_str(g, "general.architecture", "llama");
    tw_buf b = tw_gguf_finish(g, NULL);
    // Cut inside the string value.
    b.len = 24 + 8 + strlen("general.architecture") + 4 + 8 + 2;
    expect_fail(&b, PG_EFORMAT, "truncated file: metadata entry 0 ('general.architecture') needs 5 bytes");
    tw_buf_free(&b);
}

static void test_absurd_counts_are_rejected_before_allocating(void **state) {
    (void)state;
    tw_buf b = {0};
    put_header(&b, 3, 0, UINT64_C(1) << 63);
    tw_pad(&b, 64);
    expect_fail(&b, PG_EFORMAT, "header claims 9223372036854775808 metadata entries");
    tw_buf_free(&b);
    put_header(&b, 3, UINT64_MAX, 0);
    expect_fail(&b, PG_EFORMAT, "header claims 18446744073709551615 tensors");
    tw_buf_free(&b);
    put_header(&b, 2, 1000, 1000);
    tw_pad(&b, 4096);
    expect_fail(&b, PG_EFORMAT, "metadata entries");
    tw_buf_free(&b);
}

static void test_absurd_string_and_array_lengths(void **state) {
    (void)state;
    // Key length 2^64-1.
    tw_buf b = {0};
    put_header(&b, 3, 0, 1);
    tw_u64(&b, UINT64_MAX);
    tw_put(&b, "abcdefgh", 8);
    expect_fail(&b, PG_EFORMAT, "truncated file: metadata entry 0 needs 18446744073709551615 bytes");
    tw_buf_free(&b);
    // String value length 2^63.
    put_header(&b, 3, 0, 1);
    tw_gstr(&b, "k");
    tw_u32(&b, GGUF_TYPE_STRING);
    tw_u64(&b, UINT64_C(1) << 63);
    tw_put(&b, "xxxxxxxxxxxxxxxx", 16);
    expect_fail(&b, PG_EFORMAT, "('k') needs 9223372036854775808 bytes");
    tw_buf_free(&b);
    // Arrays whose counts overflow count * element size.
    uint32_t types[] = {GGUF_TYPE_UINT8, GGUF_TYPE_UINT64, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY};
    uint64_t counts[] = {UINT64_MAX, UINT64_C(1) << 61, UINT64_MAX / 8 + 1, UINT64_C(1) << 62};
    for (int t = 0; t < 4; t++) {
        for (int c = 0; c < 4; c++) {
            put_header(&b, 3, 0, 1);
            tw_gstr(&b, "arr");
            tw_u32(&b, GGUF_TYPE_ARRAY);
            tw_u32(&b, types[t]);
            tw_u64(&b, counts[c]);
            tw_pad(&b, 256);
            expect_fail(&b, PG_EFORMAT, "does not fit in the file");
            tw_buf_free(&b);
        }
    }
    // A string array whose elements claim huge lengths.
    put_header(&b, 3, 0, 1);
    tw_gstr(&b, "arr");
    tw_u32(&b, GGUF_TYPE_ARRAY);
    tw_u32(&b, GGUF_TYPE_STRING);
    tw_u64(&b, 3);
    tw_gstr(&b, "ok");
    tw_u64(&b, UINT64_MAX - 1);
    tw_pad(&b, 128);
    expect_fail(&b, PG_EFORMAT, "truncated file");
    tw_buf_free(&b);
}

static void test_unknown_value_types_are_rejected(void **state) {
    (void)state;
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_kv_raw(g, "weird", 13, "\0\0\0\0", 4);
    tw_buf b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "metadata 'weird' has unknown value type 13");
    tw_buf_free(&b);
    g = tw_gguf_new(3);
    tw_gguf_kv_arr(g, "weird", 0xffffffffu, "", 0, 1);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "metadata 'weird' has an array of unknown type 4294967295");
    tw_buf_free(&b);
}

static void test_duplicates_are_rejected(void **state) {
    (void)state;
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_kv_u32(g, "a", 1);
    tw_gguf_kv_u32(g, "b", 1);
    tw_gguf_kv_str(g, "a", "again");
    tw_buf b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "duplicate metadata key 'a'");
    tw_buf_free(&b);
    g = tw_gguf_new(3);
    float w[32] = {0};
    tw_gguf_tensor(g, "w", PG_DTYPE_F32, 1, (uint64_t[]){32}, w, sizeof w);
    tw_gguf_tensor(g, "w", PG_DTYPE_F32, 1, (uint64_t[]){32}, w, sizeof w);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "duplicate tensor name 'w'");
    tw_buf_free(&b);
}

static void test_bad_tensor_infos_are_rejected(void **state) {
    (void)state;
    float w[64] = {0};
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_tensor(g, "five", PG_DTYPE_F32, 5, (uint64_t[]){1, 1, 1, 1, 1}, w, 4);
    tw_buf b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "tensor 'five' has 5 dimensions (at most 4 supported)");
    tw_buf_free(&b);

    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "huge", PG_DTYPE_F32, 4, (uint64_t[]){UINT64_C(1) << 32, UINT64_C(1) << 32, 1, 1}, w, 4);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "tensor 'huge' shape {4294967296, 4294967296, 1, 1} has more than 2^63 elements");
    tw_buf_free(&b);

    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "neg", PG_DTYPE_F32, 2, (uint64_t[]){4, UINT64_MAX}, w, 4);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "tensor 'neg' dimension 1 is 18446744073709551615 (negative)");
    tw_buf_free(&b);

    // Elements fit in int64 but bytes of f32 overflow 64 bits.
    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "bytes", PG_DTYPE_F32, 2, (uint64_t[]){UINT64_C(1) << 31, UINT64_C(1) << 30}, w, 4);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "tensor 'bytes' data [offset 0, 9223372036854775808 bytes] past end of file");
    tw_buf_free(&b);
    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "bytes", PG_DTYPE_F32, 2, (uint64_t[]){UINT64_C(1) << 32, UINT64_C(1) << 30}, w, 4);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "tensor 'bytes' byte size overflows");
    tw_buf_free(&b);

    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "q", PG_DTYPE_Q4_0, 2, (uint64_t[]){48, 2}, w, sizeof w);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "tensor 'q' row of 48 elements is not a multiple of the q4_0 block size 32");
    tw_buf_free(&b);

    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "x", 99, 1, (uint64_t[]){4}, w, 16);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EUNSUPP, "t.gguf: tensor 'x' has unknown type 99");
    tw_buf_free(&b);

    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "x", 0xffffffffu, 1, (uint64_t[]){4}, w, 16);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EUNSUPP, "has unknown type 4294967295");
    tw_buf_free(&b);

    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "x", 10, 1, (uint64_t[]){256}, w, 84);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EUNSUPP, "tensor 'x' has unsupported type q2_K (10)");
    tw_buf_free(&b);

    // A name with control bytes is escaped in the message.
    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "a\nb'", 99, 1, (uint64_t[]){4}, w, 16);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EUNSUPP, "tensor 'a\\x0ab\\x27' has unknown type 99");
    tw_buf_free(&b);
}

static void test_tensor_data_past_end_is_rejected(void **state) {
    (void)state;
    float w[8] = {0};
    // Offset far past the end.
    tw_gguf *g = tw_gguf_new(3);
    tw_gguf_tensor_at(g, "blk.0.attn_q.weight", PG_DTYPE_F32, 1, (uint64_t[]){8}, w, sizeof w, 1 << 20);
    tw_buf b = tw_gguf_finish(g, NULL);
    char want[200];
    // Header 24 + name 8+19 + n_dims 4 + dim 8 + type 4 + offset 8 = 75 -> data at 96.
    snprintf(want, sizeof want,
             "t.gguf: tensor 'blk.0.attn_q.weight' data [offset 1048576, 32 bytes] past end of file (size %zu, "
             "data section at 96)",
             b.len);
    expect_fail(&b, PG_EFORMAT, want);
    tw_buf_free(&b);
    // Offset near 2^64 (aligned): offset + size would wrap.
    g = tw_gguf_new(3);
    tw_gguf_tensor_at(g, "w", PG_DTYPE_F32, 1, (uint64_t[]){8}, w, sizeof w, UINT64_MAX - 31);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "past end of file");
    tw_buf_free(&b);
    // Data claims more bytes than are left.
    g = tw_gguf_new(3);
    tw_gguf_tensor(g, "w", PG_DTYPE_F32, 2, (uint64_t[]){8, 1000}, w, sizeof w);
    b = tw_gguf_finish(g, NULL);
    expect_fail(&b, PG_EFORMAT, "tensor 'w' data [offset 0, 32000 bytes] past end of file");
    tw_buf_free(&b);
    // Data section itself would start past the end (huge alignment); the
    // file is written by hand to spare the writer 2 GiB of padding.
    put_header(&b, 3, 1, 1);
    tw_gstr(&b, "general.alignment");
    tw_u32(&b, GGUF_TYPE_UINT32);
    tw_u32(&b, 1u << 31);
    tw_gstr(&b, "w");
    tw_u32(&b, 1);
    tw_u64(&b, 0);
    tw_u32(&b, PG_DTYPE_F32);
    tw_u64(&b, 0);
    expect_fail(&b, PG_EFORMAT, "tensor 'w' data [offset 0, 0 bytes] past end of file (size 90, data section at 2147483648)");
    tw_buf_free(&b);
}

// Random corruption of a valid file: must never crash or leak (ASan run).
static void test_random_corruption_never_crashes(void **state) {
    (void)state;
    tw_buf b = make_sample(3, 0);
    uint64_t rng = 0x9e3779b97f4a7c15u;
    int opened = 0;
    for (int iter = 0; iter < 20000; iter++) {
        uint8_t *m = malloc(b.len);
        memcpy(m, b.data, b.len);
        int flips = 1 + (int)(rng % 4);
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            size_t pos = (size_t)(rng >> 33) % b.len;
            m[pos] = (uint8_t)(rng >> 13);
        }
        gguf_file *f = NULL;
        int rc = gguf_open_memory(m, b.len, "fuzz.gguf", &f);
        if (rc == 0) {
            opened++;
            for (uint64_t i = 0; i < f->n_kv; i++)
                for (uint64_t j = 0; j < f->kv[i].arr_count && j < 8; j++) gguf_arr_str(&f->kv[i], j);
            // Touch the first and last byte of every tensor: ASan checks
            // they are inside the image.
            volatile uint8_t sink = 0;
            for (uint64_t i = 0; i < f->n_tensors; i++) {
                const gguf_tensor *t = &f->tensors[i];
                if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
            }
            (void)sink;
        } else {
            assert_null(f);
            assert_int_equal(strncmp(pg_err_msg(), "fuzz.gguf: ", 11), 0);
        }
        gguf_close(f);
        free(m);
    }
    assert_true(opened > 0);
    tw_buf_free(&b);
}

// --- files on disk ----------------------------------------------------------------------

static void test_open_from_disk(void **state) {
    (void)state;
    char dir[4096], path[4200];
    tw_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/sample.gguf", dir);
    tw_buf b = make_sample(3, 0);
    tw_write_file(path, b.data, b.len);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f), 0);
    assert_string_equal(f->path, path);
    assert_true(f->file.fd >= 0);
    assert_int_equal(f->file.size, b.len);
    check_sample_tensors(f, &b);
    char *arch = NULL;
    assert_int_equal(gguf_get_str(f, "general.architecture", &arch), 0);
    assert_string_equal(arch, "llama");
    free(arch);
    gguf_close(f);

    // Corrupt on disk: error names the path, nothing leaks (ASan).
    b.data[0] = 'g';
    tw_write_file(path, b.data, b.len);
    f = (gguf_file *)0x1;
    assert_int_equal(gguf_open(path, &f), PG_EFORMAT);
    assert_null(f);
    char want[4400];
    snprintf(want, sizeof want, "%s: bad magic (not a GGUF file)", path);
    assert_string_equal(pg_err_msg(), want);

    tw_write_file(path, "", 0);
    assert_int_equal(gguf_open(path, &f), PG_EFORMAT);
    assert_non_null(strstr(pg_err_msg(), "too small"));
    assert_int_equal(gguf_open(dir, &f), PG_EINVAL);
    assert_non_null(strstr(pg_err_msg(), "not a regular file"));
    snprintf(path, sizeof path, "%s/missing.gguf", dir);
    assert_int_equal(gguf_open(path, &f), PG_ENOTFOUND);
    assert_null(f);
    assert_non_null(strstr(pg_err_msg(), "missing.gguf: cannot open"));
    gguf_close(NULL);
    tw_buf_free(&b);
    tw_rmdir(dir);
}

// The fuzz seed corpus is written by llama.cpp's gguf-py (an independent
// writer): every file must open, and the metadata seed must read back.
static void test_files_written_by_gguf_py_open(void **state) {
    (void)state;
    char dir[4096];
    if (!tw_repo_path("tests/fuzz/corpus/gguf", dir, sizeof dir)) fail_msg("tests/fuzz/corpus/gguf not found");
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[8300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        gguf_file *f = NULL;
        if (gguf_open(path, &f) != 0) fail_msg("%s", pg_err_msg());
        char *arch = NULL;
        assert_int_equal(gguf_get_str(f, "general.architecture", &arch), 0);
        assert_string_equal(arch, "llama");
        free(arch);
        if (strcmp(e->d_name, "metadata_all_types.gguf") == 0) {
            uint64_t u;
            int64_t i;
            double x;
            assert_int_equal(gguf_get_u64(f, "t.u64", &u), 0), assert_true(u == (UINT64_C(1) << 63) + 5);
            assert_int_equal(gguf_get_i64(f, "t.i64", &i), 0), assert_true(i == -(INT64_C(1) << 62));
            assert_int_equal(gguf_get_f64(f, "t.f64", &x), 0), assert_true(x == 1e-300);
            const gguf_kv *kv = gguf_find_kv(f, "t.arr_str");
            assert_true(gguf_str_eq(gguf_arr_str(kv, 2), "\xe2\x96\x81" "b"));
            assert_int_equal(gguf_find_kv(f, "t.nested")->arr_type, GGUF_TYPE_ARRAY);
        }
        if (strcmp(e->d_name, "align64_v2.gguf") == 0) {
            assert_int_equal(f->version, 2);
            assert_int_equal(f->alignment, 64);
        }
        if (strcmp(e->d_name, "quant_tensors.gguf") == 0) {
            const gguf_tensor *t = gguf_find_tensor(f, "q4_1.weight");
            assert_non_null(t);
            assert_int_equal(t->dims[0], 64), assert_int_equal(t->dims[1], 2);
            assert_int_equal(t->nbytes, 2 * 2 * 20);
            t = gguf_find_tensor(f, "q5_0.weight");
            assert_non_null(t);
            assert_int_equal(t->type, PG_DTYPE_Q5_0);
            assert_int_equal(t->nbytes, 2 * 2 * 22);
            t = gguf_find_tensor(f, "q5_1.weight");
            assert_non_null(t);
            assert_int_equal(t->type, PG_DTYPE_Q5_1);
            assert_int_equal(t->nbytes, 2 * 2 * 24);
        }
        gguf_close(f);
        n++;
    }
    closedir(d);
    assert_true(n >= 5);
}

// The default model, when deploy/bootstrap has fetched it.
static void test_real_model_file(void **state) {
    (void)state;
    const char *env = getenv("PG_TEST_GGUF");
    char path[4096];
    if (env) snprintf(path, sizeof path, "%s", env);
    else if (!tw_repo_path("models/SmolLM2-135M-Instruct.Q4_1.gguf", path, sizeof path)) {
        printf("  skipped: models/SmolLM2-135M-Instruct.Q4_1.gguf not found\n");
        skip();
    }
    gguf_file *f = NULL;
    int rc = gguf_open(path, &f);
    if (rc != 0) fail_msg("%s", pg_err_msg());
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_tensors, 272);
    uint64_t u;
    assert_int_equal(gguf_get_u64(f, "llama.block_count", &u), 0), assert_int_equal(u, 30);
    assert_int_equal(gguf_get_u64(f, "llama.embedding_length", &u), 0), assert_int_equal(u, 576);
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_non_null(toks);
    assert_int_equal(toks->arr_type, GGUF_TYPE_STRING);
    assert_int_equal(toks->arr_count, 49152);
    for (uint64_t i = 0; i < toks->arr_count; i++) assert_non_null(gguf_arr_str(toks, i).ptr);
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    assert_non_null(emb);
    assert_int_equal(emb->type, PG_DTYPE_Q8_0);
    assert_int_equal(emb->n_dims, 2);
    assert_int_equal(emb->dims[0], 576);
    assert_int_equal(emb->dims[1], 49152);
    assert_int_equal(emb->nbytes, (uint64_t)576 / 32 * 34 * 49152);
    // Every tensor dequantizes (first row) to finite values.
    float *row = malloc(sizeof(float) * 65536);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        assert_true(t->dims[0] <= (1 << 16));
        pg_dequantize_row((int)t->type, t->data, row, (int64_t)t->dims[0]);
        for (uint64_t j = 0; j < t->dims[0]; j++) assert_true(isfinite(row[j]));
    }
    free(row);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_scalar_type_round_trips),
        cmocka_unit_test(test_getters_convert_integers_when_they_fit),
        cmocka_unit_test(test_string_and_numeric_arrays),
        cmocka_unit_test(test_arrays_of_every_element_type),
        cmocka_unit_test(test_nested_arrays_are_kept_opaque_and_depth_limited),
        cmocka_unit_test(test_v2_and_v3_files_open),
        cmocka_unit_test(test_custom_alignment_is_honoured),
        cmocka_unit_test(test_bad_alignment_is_rejected),
        cmocka_unit_test(test_unaligned_tensor_offset_is_rejected),
        cmocka_unit_test(test_zero_sized_and_scalar_tensors),
        cmocka_unit_test(test_versions_and_magic),
        cmocka_unit_test(test_truncation_at_every_byte_fails_cleanly),
        cmocka_unit_test(test_truncation_message_names_the_item),
        cmocka_unit_test(test_absurd_counts_are_rejected_before_allocating),
        cmocka_unit_test(test_absurd_string_and_array_lengths),
        cmocka_unit_test(test_unknown_value_types_are_rejected),
        cmocka_unit_test(test_duplicates_are_rejected),
        cmocka_unit_test(test_bad_tensor_infos_are_rejected),
        cmocka_unit_test(test_tensor_data_past_end_is_rejected),
        cmocka_unit_test(test_random_corruption_never_crashes),
        cmocka_unit_test(test_open_from_disk),
        cmocka_unit_test(test_files_written_by_gguf_py_open),
        cmocka_unit_test(test_real_model_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
