// tests/fuzz/fuzz_gguf.c - fuzz target for the GGUF reader.
//
// Opens the input as an in-memory GGUF image, then exercises everything a
// caller could touch on success: every key through the lookups and typed
// getters, every array element, every tensor's first and last byte and its
// first row through the dequantizer. On failure the reader must leave the
// output NULL and set a message. Built with the standalone driver
// (build/fuzz/fuzz_gguf) and with libFuzzer (build/fuzz/libfuzzer_gguf).
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/dtype.h"
#include "formats/gguf.h"

#define MAX_ROW 4096

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n) {
    if (n) sink ^= ((const uint8_t *)p)[0] ^ ((const uint8_t *)p)[n - 1];
}

static void walk_kv(const gguf_file *f, const gguf_kv *kv) {
    touch(kv->key.ptr, kv->key.len);
    // Lookups by key need a C string: keys with a NUL byte cannot be found.
    if (!memchr(kv->key.ptr, '\0', kv->key.len)) {
        char *key = malloc(kv->key.len + 1);
        PG_CHECK(key);
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = '\0';
        PG_CHECK(gguf_find_kv(f, key) == kv); // keys are unique
        uint64_t u;
        int64_t i;
        double d;
        bool b;
        char *s = NULL;
        (void)gguf_get_u64(f, key, &u);
        (void)gguf_get_i64(f, key, &i);
        (void)gguf_get_f64(f, key, &d);
        (void)gguf_get_bool(f, key, &b);
        if (gguf_get_str(f, key, &s) == 0) {
            PG_CHECK(strlen(s) == kv->v.str.len);
            free(s);
        }
        free(key);
    }
    if (kv->type == GGUF_TYPE_STRING) touch(kv->v.str.ptr, kv->v.str.len);
    if (kv->type != GGUF_TYPE_ARRAY) return;
    for (uint64_t j = 0; j < kv->arr_count; j++) {
        if (kv->arr_type == GGUF_TYPE_STRING) {
            gguf_str s = gguf_arr_str(kv, j);
            PG_CHECK(s.ptr != NULL);
            touch(s.ptr, s.len);
        } else {
            int64_t i;
            double d;
            (void)gguf_arr_i64(kv, j, &i);
            (void)gguf_arr_f64(kv, j, &d);
        }
    }
    PG_CHECK(gguf_arr_str(kv, kv->arr_count).ptr == NULL);
}

static void walk_tensor(const gguf_file *f, const gguf_tensor *t, float *row) {
    touch(t->name.ptr, t->name.len);
    if (!memchr(t->name.ptr, '\0', t->name.len)) {
        char *name = malloc(t->name.len + 1);
        PG_CHECK(name);
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = '\0';
        PG_CHECK(gguf_find_tensor(f, name) == t);
        free(name);
    }
    PG_CHECK(t->n_dims <= 4);
    PG_CHECK(pg_dtype_block_elems((int)t->type) > 0);
    const uint8_t *p = t->data;
    PG_CHECK(p >= f->file.data && (uint64_t)(p - f->file.data) + t->nbytes <= f->file.size);
    touch(t->data, t->nbytes);
    // The first row, when the tensor has one and it is small.
    size_t rb = pg_dtype_row_bytes((int)t->type, (int64_t)t->dims[0]);
    if (t->dims[0] > 0 && t->dims[0] <= MAX_ROW && rb <= t->nbytes)
        pg_dequantize_row((int)t->type, t->data, row, (int64_t)t->dims[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = (gguf_file *)&sink; // must be overwritten with NULL on failure
    int rc = gguf_open_memory(data, size, "fuzz.gguf", &f);
    if (rc != 0) {
        PG_CHECK(rc < 0 && f == NULL && pg_err_msg()[0] != '\0');
        return 0;
    }
    static float row[MAX_ROW];
    for (uint64_t i = 0; i < f->n_kv; i++) walk_kv(f, &f->kv[i]);
    for (uint64_t i = 0; i < f->n_tensors; i++) walk_tensor(f, &f->tensors[i], row);
    gguf_close(f);
    return 0;
}
