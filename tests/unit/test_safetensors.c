// tests/unit/test_safetensors.c - the safetensors reader and the sharded-model
// view: valid files, dims order, and malformed headers (each must give a
// clean error, never a crash: run the ASan build too).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/half.h"
#include "kernels/dtype.h"
#include "formats/safetensors.h"
#include "tests/unit/gguf_writer.h"

// --- helpers -----------------------------------------------------------------------

// u64 header length | header | data.
static tw_buf st_build(const char *header, const void *data, size_t n) {
    tw_buf b = {0};
    tw_u64(&b, strlen(header));
    tw_put(&b, header, strlen(header));
    tw_put(&b, data, n);
    return b;
}

// Opens from an exact-size heap copy so over-reads trip ASan.
static int open_copy(const void *data, size_t len, pg_st_file **out, void **copy) {
    *copy = malloc(len ? len : 1);
    assert_non_null(*copy);
    if (len) memcpy(*copy, data, len);
    return pg_st_open_memory(*copy, len, "t.safetensors", out);
}

static void expect_fail_buf(const tw_buf *b, int code, const char *needle) {
    pg_st_file *f = (pg_st_file *)0x1;
    void *copy;
    int rc = open_copy(b->data, b->len, &f, &copy);
    if (rc != code) fail_msg("expected %d, got %d (%s)", code, rc, pg_err_msg());
    assert_null(f);
    const char *msg = pg_err_msg();
    if (strncmp(msg, "t.safetensors: ", 15) != 0 || !strstr(msg, needle))
        fail_msg("message \"%s\" lacks \"%s\"", msg, needle);
    free(copy);
}

// A header with one tensor entry `entry` over `ndata` bytes of zeros.
static void expect_fail_entry(const char *entry, size_t ndata, int code, const char *needle) {
    char hdr[1024];
    snprintf(hdr, sizeof hdr, "{\"t\":%s}", entry);
    uint8_t *zeros = calloc(1, ndata ? ndata : 1);
    tw_buf b = st_build(hdr, zeros, ndata);
    expect_fail_buf(&b, code, needle);
    tw_buf_free(&b);
    free(zeros);
}

// Three tensors (f32 [2,3], f16 [4], bf16 scalar) + metadata. Data: 24 + 8 + 2.
static tw_buf make_sample(void) {
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"model.embed.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[32,34]}}   ";
    uint8_t data[34];
    float w[6] = {1, 2, 3, 4, 5, 6};
    memcpy(data, w, 24);
    for (int i = 0; i < 4; i++) {
        uint16_t h = pg_f32_to_f16((float)i + 0.5f);
        memcpy(data + 24 + 2 * i, &h, 2);
    }
    uint16_t bf = pg_f32_to_bf16(-3.0f);
    memcpy(data + 32, &bf, 2);
    return st_build(hdr, data, sizeof data);
}

static void check_sample(const pg_st_file *f) {
    assert_int_equal(f->n_tensors, 3);
    const pg_st_tensor *e = pg_st_find_tensor(f, "model.embed.weight");
    assert_non_null(e);
    assert_ptr_equal(e, &f->tensors[0]); // header order
    assert_int_equal(e->dtype, PG_DTYPE_F32);
    assert_int_equal(e->n_dims, 2);
    assert_int_equal(e->shape[0], 2), assert_int_equal(e->shape[1], 3);
    assert_int_equal(e->dims[0], 3), assert_int_equal(e->dims[1], 2); // innermost first
    assert_int_equal(e->dims[2], 1), assert_int_equal(e->shape[2], 1);
    assert_int_equal(e->n_elems, 6);
    assert_int_equal(e->nbytes, 24);
    assert_int_equal(e->offset, 0);
    float w[6];
    memcpy(w, e->data, sizeof w);
    assert_true(w[0] == 1 && w[5] == 6);
    const pg_st_tensor *h = pg_st_find_tensor(f, "h");
    assert_int_equal(h->dtype, PG_DTYPE_F16);
    float hv[4];
    pg_dequantize_row(h->dtype, h->data, hv, 4);
    for (int i = 0; i < 4; i++) assert_true(hv[i] == (float)i + 0.5f);
    const pg_st_tensor *s = pg_st_find_tensor(f, "s");
    assert_int_equal(s->dtype, PG_DTYPE_BF16);
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->n_elems, 1);
    float sv;
    pg_dequantize_row(s->dtype, s->data, &sv, 1);
    assert_true(sv == -3.0f);
    assert_null(pg_st_find_tensor(f, "__metadata__"));
    assert_null(pg_st_find_tensor(f, "model.embed"));
    assert_int_equal(f->data_offset, 8 + f->header_len);
    assert_int_equal((const uint8_t *)e->data - f->file.data, f->data_offset);
}

// --- valid files -----------------------------------------------------------------------

static void test_valid_file_parses_with_both_dim_orders(void **state) {
    (void)state;
    tw_buf b = make_sample();
    void *copy;
    pg_st_file *f = NULL;
    assert_int_equal(open_copy(b.data, b.len, &f, &copy), 0);
    assert_string_equal(f->path, "t.safetensors");
    assert_int_equal(f->file.fd, -1);
    check_sample(f);
    pg_st_close(f);
    free(copy);
    tw_buf_free(&b);
}

static void test_empty_and_zero_sized_tensors(void **state) {
    (void)state;
    tw_buf b = st_build("{}", NULL, 0);
    void *copy;
    pg_st_file *f = NULL;
    assert_int_equal(open_copy(b.data, b.len, &f, &copy), 0);
    assert_int_equal(f->n_tensors, 0);
    assert_null(pg_st_find_tensor(f, "x"));
    pg_st_close(f);
    free(copy);
    tw_buf_free(&b);
    b = st_build("{\"z\":{\"dtype\":\"F16\",\"shape\":[0,7],\"data_offsets\":[0,0]},"
                 "\"__metadata__\":{}}",
                 NULL, 0);
    assert_int_equal(open_copy(b.data, b.len, &f, &copy), 0);
    const pg_st_tensor *z = pg_st_find_tensor(f, "z");
    assert_int_equal(z->n_elems, 0);
    assert_int_equal(z->nbytes, 0);
    assert_int_equal(z->dims[0], 7), assert_int_equal(z->dims[1], 0);
    pg_st_close(f);
    free(copy);
    tw_buf_free(&b);
}

static void test_rank_up_to_eight(void **state) {
    (void)state;
    uint8_t data[4] = {0};
    tw_buf b = st_build("{\"r8\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", data, 4);
    void *copy;
    pg_st_file *f = NULL;
    assert_int_equal(open_copy(b.data, b.len, &f, &copy), 0);
    assert_int_equal(f->tensors[0].n_dims, 8);
    pg_st_close(f);
    free(copy);
    tw_buf_free(&b);
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}", 4, PG_EFORMAT,
                      "tensor 't' has 9 dimensions (at most 8 supported)");
}

// --- malformed headers -------------------------------------------------------------------

static void test_header_length_is_bounded(void **state) {
    (void)state;
    tw_buf b = {0};
    tw_put(&b, "\x01\x02\x03", 3);
    expect_fail_buf(&b, PG_EFORMAT, "file of 3 bytes is too small to be safetensors");
    tw_buf_free(&b);
    uint64_t lens[] = {UINT64_MAX, UINT64_C(1) << 63, PG_ST_MAX_HEADER + 1ull};
    for (int i = 0; i < 3; i++) {
        tw_u64(&b, lens[i]);
        tw_put(&b, "{}", 2);
        expect_fail_buf(&b, PG_EFORMAT, "exceeds the 100000000-byte limit");
        tw_buf_free(&b);
    }
    tw_u64(&b, 1000);
    tw_put(&b, "{}", 2);
    expect_fail_buf(&b, PG_EFORMAT, "header length 1000 past end of file (size 10)");
    tw_buf_free(&b);
    tw_u64(&b, 0);
    expect_fail_buf(&b, PG_EFORMAT, "does not start with '{'");
    tw_buf_free(&b);
}

static void test_bad_json_is_rejected(void **state) {
    (void)state;
    const char *bad[] = {
        "{\"a\":",              // unterminated
        "{\"a\":{\"dtype\":\"F32\"", // unterminated
        "{]",
        "[1,2]",                // not an object (and no '{')
        "{\"a\":1}x",           // trailing garbage
        "{\"a\":\"\\u12\"}",    // bad escape
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tw_buf b = st_build(bad[i], NULL, 0);
        pg_st_file *f = (pg_st_file *)0x1;
        void *copy;
        int rc = open_copy(b.data, b.len, &f, &copy);
        if (rc != PG_EFORMAT) fail_msg("'%s': rc %d (%s)", bad[i], rc, pg_err_msg());
        assert_null(f);
        assert_int_equal(strncmp(pg_err_msg(), "t.safetensors: ", 15), 0);
        free(copy);
        tw_buf_free(&b);
    }
    // The JSON must end inside the declared length: a valid JSON object that
    // only closes after the header is an error, not an over-read.
    tw_buf b = {0};
    tw_u64(&b, 4);
    tw_put(&b, "{\"a\":1}", 7);
    expect_fail_buf(&b, PG_EFORMAT, "not valid JSON");
    tw_buf_free(&b);
    b = st_build("{\"t\":5}", NULL, 0);
    expect_fail_buf(&b, PG_EFORMAT, "tensor 't': entry is not a JSON object");
    tw_buf_free(&b);
}

static void test_unsupported_dtypes_name_the_tensor(void **state) {
    (void)state;
    // (F8_E4M3 is read: FP8 checkpoints, engine/model/model_load.c; e5m2 is not.)
    const char *dts[] = {"I64", "F64", "U8", "BOOL", "F8_E5M2", "f32", "Q9"};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        char entry[256], want[128];
        snprintf(entry, sizeof entry, "{\"dtype\":\"%s\",\"shape\":[1],\"data_offsets\":[0,8]}", dts[i]);
        snprintf(want, sizeof want, "tensor 't' has unsupported dtype '%s'", dts[i]);
        expect_fail_entry(entry, 8, PG_EUNSUPP, want);
    }
}

static void test_bad_entries_are_rejected(void **state) {
    (void)state;
    expect_fail_entry("{\"shape\":[1],\"data_offsets\":[0,4]}", 4, PG_EFORMAT, "missing \"dtype\"");
    expect_fail_entry("{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}", 4, PG_EFORMAT, "missing \"dtype\"");
    expect_fail_entry("{\"dtype\":\"F32\",\"data_offsets\":[0,4]}", 4, PG_EFORMAT, "missing \"shape\"");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[1]}", 4, PG_EFORMAT, "\"data_offsets\" is not an array of 2");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}", 8, PG_EFORMAT,
                      "\"data_offsets\" is not an array of 2");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}", 4, PG_EFORMAT,
                      "shape[0] is not a non-negative integer");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}", 4, PG_EFORMAT,
                      "shape[0] is not a non-negative integer");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}", 4, PG_EFORMAT,
                      "shape[0] is not");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[1,18446744073709551615],\"data_offsets\":[0,4]}", 4,
                      PG_EFORMAT, "shape[1] is not a non-negative integer below 2^53");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}", 4,
                      PG_EFORMAT, "shape has more than 2^63 elements");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,4]}", 4,
                      PG_EFORMAT, "byte size overflows");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}", 4, PG_EFORMAT,
                      "data_offsets are not non-negative integers");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}", 4, PG_EFORMAT,
                      "data_offsets are not non-negative integers");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}", 4, PG_EFORMAT,
                      "data_offsets [4, 0) outside the data section (4 bytes)");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 4, PG_EFORMAT,
                      "tensor 't' data_offsets [0, 8) outside the data section (4 bytes)");
    expect_fail_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}", 8, PG_EFORMAT,
                      "data_offsets [0, 4) hold 4 bytes, shape and dtype need 8");
    expect_fail_entry("{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}", 8, PG_EFORMAT,
                      "hold 8 bytes, shape and dtype need 6");
}

static void test_duplicate_names_are_rejected(void **state) {
    (void)state;
    uint8_t data[8] = {0};
    tw_buf b = st_build("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        data, 8);
    expect_fail_buf(&b, PG_EFORMAT, "duplicate tensor name 'a'");
    tw_buf_free(&b);
}

static void test_truncation_at_every_byte_fails_cleanly(void **state) {
    (void)state;
    tw_buf b = make_sample();
    for (size_t len = 0; len < b.len; len++) {
        pg_st_file *f = NULL;
        void *copy;
        int rc = open_copy(b.data, len, &f, &copy);
        if (rc != PG_EFORMAT) fail_msg("prefix of %zu bytes: rc %d (%s)", len, rc, pg_err_msg());
        assert_null(f);
        assert_int_equal(strncmp(pg_err_msg(), "t.safetensors: ", 15), 0);
        free(copy);
    }
    tw_buf_free(&b);
}

static void test_random_corruption_never_crashes(void **state) {
    (void)state;
    tw_buf b = make_sample();
    uint64_t rng = 12345;
    int opened = 0;
    for (int iter = 0; iter < 20000; iter++) {
        uint8_t *m = malloc(b.len);
        memcpy(m, b.data, b.len);
        int flips = 1 + (int)(rng % 3);
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            m[(rng >> 33) % b.len] = (uint8_t)(rng >> 13);
        }
        pg_st_file *f = NULL;
        int rc = pg_st_open_memory(m, b.len, "fuzz", &f);
        if (rc == 0) {
            opened++;
            volatile uint8_t sink = 0;
            for (uint64_t i = 0; i < f->n_tensors; i++) {
                const pg_st_tensor *t = &f->tensors[i];
                if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
                assert_ptr_equal(pg_st_find_tensor(f, t->name), t);
            }
            (void)sink;
        } else {
            assert_null(f);
        }
        pg_st_close(f);
        free(m);
    }
    assert_true(opened > 0);
    tw_buf_free(&b);
}

// --- files and sharded models ------------------------------------------------------------

static void write_st(const char *dir, const char *name, const char *header, const void *data, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tw_buf b = st_build(header, data, n);
    tw_write_file(path, b.data, b.len);
    tw_buf_free(&b);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tw_write_file(path, text, strlen(text));
}

static void test_open_from_disk_and_single_file_model(void **state) {
    (void)state;
    char dir[4096], path[4200];
    tw_tmpdir(dir, sizeof dir);
    tw_buf b = make_sample();
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tw_write_file(path, b.data, b.len);

    pg_st_file *f = NULL;
    assert_int_equal(pg_st_open(path, &f), 0);
    assert_true(f->file.fd >= 0);
    check_sample(f);
    pg_st_close(f);

    pg_st_model *m = NULL;
    assert_int_equal(pg_st_model_open(dir, &m), 0);
    assert_int_equal(m->n_files, 1);
    assert_int_equal(m->n_tensors, 3);
    uint32_t fi = 99;
    const pg_st_tensor *t = pg_st_model_find(m, "h", &fi);
    assert_non_null(t);
    assert_int_equal(fi, 0);
    assert_int_equal(t->dtype, PG_DTYPE_F16);
    assert_null(pg_st_model_find(m, "nope", NULL));
    pg_st_model_close(m);

    // A path to the file itself works too.
    assert_int_equal(pg_st_model_open(path, &m), 0);
    assert_int_equal(m->n_tensors, 3);
    pg_st_model_close(m);

    // Errors on disk.
    b.data[0] = 0xff;
    tw_write_file(path, b.data, b.len);
    assert_int_equal(pg_st_open(path, &f), PG_EFORMAT);
    assert_null(f);
    assert_int_equal(strncmp(pg_err_msg(), path, strlen(path)), 0);
    assert_int_equal(pg_st_model_open(dir, &m), PG_EFORMAT);
    assert_null(m);
    unlink(path);
    assert_int_equal(pg_st_model_open(dir, &m), PG_ENOTFOUND);
    assert_non_null(strstr(pg_err_msg(), "neither model.safetensors nor model.safetensors.index.json"));
    assert_int_equal(pg_st_open(path, &f), PG_ENOTFOUND);
    assert_int_equal(pg_st_open(dir, &f), PG_EINVAL);
    snprintf(path, sizeof path, "%s/nonexistent", dir);
    assert_int_equal(pg_st_model_open(path, &m), PG_ENOTFOUND);
    pg_st_model_close(NULL);
    pg_st_close(NULL);
    tw_buf_free(&b);
    tw_rmdir(dir);
}

static const char *SHARD1_HDR = "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                "\"b.weight\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}";
static const char *SHARD2_HDR = "{\"__metadata__\":{\"format\":\"pt\"},"
                                "\"c.weight\":{\"dtype\":\"BF16\",\"shape\":[2,1],\"data_offsets\":[0,4]}}";

static void make_sharded(const char *dir) {
    float one = 1.0f;
    uint8_t d1[8] = {0}, d2[4] = {0};
    memcpy(d1, &one, 4);
    write_st(dir, "model-00001-of-00002.safetensors", SHARD1_HDR, d1, 8);
    write_st(dir, "model-00002-of-00002.safetensors", SHARD2_HDR, d2, 4);
}

static void test_sharded_model_looks_up_across_shards(void **state) {
    (void)state;
    char dir[4096];
    tw_tmpdir(dir, sizeof dir);
    make_sharded(dir);
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":12},\"weight_map\":{"
               "\"c.weight\":\"model-00002-of-00002.safetensors\","
               "\"a.weight\":\"model-00001-of-00002.safetensors\","
               "\"b.weight\":\"model-00001-of-00002.safetensors\"}}");
    // A model.safetensors next to the index is ignored: the index wins.
    write_text(dir, "model.safetensors", "garbage");
    pg_st_model *m = NULL;
    int rc = pg_st_model_open(dir, &m);
    if (rc) fail_msg("%s", pg_err_msg());
    assert_int_equal(m->n_files, 2);
    assert_int_equal(m->n_tensors, 3);
    assert_non_null(strstr(m->files[0]->path, "model-00001-of-00002.safetensors"));
    uint32_t fi;
    const pg_st_tensor *a = pg_st_model_find(m, "a.weight", &fi);
    assert_non_null(a);
    assert_int_equal(fi, 0);
    float v;
    memcpy(&v, a->data, 4);
    assert_true(v == 1.0f);
    const pg_st_tensor *c = pg_st_model_find(m, "c.weight", &fi);
    assert_non_null(c);
    assert_int_equal(fi, 1);
    assert_int_equal(c->dims[0], 1), assert_int_equal(c->dims[1], 2);
    assert_non_null(pg_st_model_find(m, "b.weight", NULL));
    assert_null(pg_st_model_find(m, "d.weight", NULL));
    for (uint64_t i = 1; i < m->n_tensors; i++) assert_true(strcmp(m->tensors[i - 1]->name, m->tensors[i]->name) < 0);
    pg_st_model_close(m);
    tw_rmdir(dir);
}

static void expect_model_fail(const char *index_json, int code, const char *needle) {
    char dir[4096];
    tw_tmpdir(dir, sizeof dir);
    make_sharded(dir);
    write_text(dir, "model.safetensors.index.json", index_json);
    pg_st_model *m = (pg_st_model *)0x1;
    int rc = pg_st_model_open(dir, &m);
    if (rc != code) fail_msg("expected %d, got %d (%s)", code, rc, pg_err_msg());
    assert_null(m);
    if (!strstr(pg_err_msg(), needle)) fail_msg("message \"%s\" lacks \"%s\"", pg_err_msg(), needle);
    tw_rmdir(dir);
}

static void test_bad_indexes_are_rejected(void **state) {
    (void)state;
    expect_model_fail("{\"weight_map\":{\"a.weight\":\"model-00002-of-00002.safetensors\"}}", PG_EFORMAT,
                      "weight_map puts 'a.weight' in");
    expect_model_fail("{\"weight_map\":{\"a.weight\":\"../model-00001-of-00002.safetensors\"}}", PG_EFORMAT,
                      "weight_map entry 'a.weight' is not a plain file name");
    expect_model_fail("{\"weight_map\":{\"a.weight\":\"/etc/passwd\"}}", PG_EFORMAT, "not a plain file name");
    expect_model_fail("{\"weight_map\":{\"a.weight\":\"\"}}", PG_EFORMAT, "not a plain file name");
    expect_model_fail("{\"weight_map\":{\"a.weight\":3}}", PG_EFORMAT, "not a plain file name");
    expect_model_fail("{\"weight_map\":{\"a.weight\":\"missing.safetensors\"}}", PG_ENOTFOUND,
                      "missing.safetensors: cannot open");
    expect_model_fail("{\"weight_map\":{}}", PG_EFORMAT, "weight_map is empty");
    expect_model_fail("{\"metadata\":{}}", PG_EFORMAT, "no \"weight_map\" object");
    expect_model_fail("{\"weight_map\":", PG_EFORMAT, "not valid JSON");
    expect_model_fail("", PG_EFORMAT, "not valid JSON");

    // The same tensor in two shards is ambiguous.
    char dir[4096];
    tw_tmpdir(dir, sizeof dir);
    make_sharded(dir);
    uint8_t d[8] = {0};
    write_st(dir, "model-00002-of-00002.safetensors", SHARD1_HDR, d, 8);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\","
               "\"b.weight\":\"model-00002-of-00002.safetensors\"}}");
    pg_st_model *m = NULL;
    assert_int_equal(pg_st_model_open(dir, &m), PG_EFORMAT);
    assert_non_null(strstr(pg_err_msg(), "is in both"));
    tw_rmdir(dir);
}

// The fuzz seed corpus (tests/fuzz/gen_corpus.py): all open except the
// deliberately unsupported one.
static void test_seed_corpus_files_open(void **state) {
    (void)state;
    char dir[4096];
    if (!tw_repo_path("tests/fuzz/corpus/safetensors", dir, sizeof dir)) fail_msg("corpus not found");
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[8300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        pg_st_file *f = NULL;
        int rc = pg_st_open(path, &f);
        if (strcmp(e->d_name, "unsupported_dtype.safetensors") == 0) {
            assert_int_equal(rc, PG_EUNSUPP);
            assert_non_null(strstr(pg_err_msg(), "tensor 'ids' has unsupported dtype 'I64'"));
        } else if (rc != 0) {
            fail_msg("%s", pg_err_msg());
        }
        if (strcmp(e->d_name, "ranks.safetensors") == 0) {
            const pg_st_tensor *t = pg_st_find_tensor(f, "r4");
            assert_int_equal(t->n_dims, 4);
            assert_int_equal(t->shape[0], 1), assert_int_equal(t->shape[3], 2);
            assert_int_equal(t->dims[0], 2), assert_int_equal(t->dims[1], 3), assert_int_equal(t->dims[3], 1);
        }
        pg_st_close(f);
        n++;
    }
    closedir(d);
    assert_true(n >= 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file_parses_with_both_dim_orders),
        cmocka_unit_test(test_empty_and_zero_sized_tensors),
        cmocka_unit_test(test_rank_up_to_eight),
        cmocka_unit_test(test_header_length_is_bounded),
        cmocka_unit_test(test_bad_json_is_rejected),
        cmocka_unit_test(test_unsupported_dtypes_name_the_tensor),
        cmocka_unit_test(test_bad_entries_are_rejected),
        cmocka_unit_test(test_duplicate_names_are_rejected),
        cmocka_unit_test(test_truncation_at_every_byte_fails_cleanly),
        cmocka_unit_test(test_random_corruption_never_crashes),
        cmocka_unit_test(test_open_from_disk_and_single_file_model),
        cmocka_unit_test(test_sharded_model_looks_up_across_shards),
        cmocka_unit_test(test_bad_indexes_are_rejected),
        cmocka_unit_test(test_seed_corpus_files_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
