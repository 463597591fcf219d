// tests/fuzz/fuzz_safetensors.c - fuzz target for the safetensors reader.
//
// Opens the input as an in-memory safetensors image and, on success, looks
// every tensor up by name, touches its first and last byte and converts up
// to MAX_ELEMS of it to f32 (float types; I32 tensors are only touched). On failure the reader must leave the output
// NULL and set a message.
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "kernels/dtype.h"
#include "formats/safetensors.h"

#define MAX_ELEMS 4096

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pg_st_file *f = (pg_st_file *)&sink; // must be overwritten with NULL on failure
    int rc = pg_st_open_memory(data, size, "fuzz.safetensors", &f);
    if (rc != 0) {
        PG_CHECK(rc < 0 && f == NULL && pg_err_msg()[0] != '\0');
        return 0;
    }
    static float out[MAX_ELEMS];
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const pg_st_tensor *t = &f->tensors[i];
        PG_CHECK(pg_st_find_tensor(f, t->name) == t);
        PG_CHECK(t->n_dims <= PG_ST_MAX_DIMS);
        const uint8_t *p = t->data;
        PG_CHECK(p >= f->file.data && (uint64_t)(p - f->file.data) + t->nbytes <= f->file.size);
        if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1];
        uint64_t n = t->n_elems < MAX_ELEMS ? t->n_elems : MAX_ELEMS;
        // Integer tensors (AWQ/GPTQ packing, I32) are read raw by their
        // users, never converted: only the float types go through f32.
        if (pg_dtype_block_elems(t->dtype) > 0)
            pg_dequantize_row(t->dtype, t->data, out, (int64_t)n);
        else
            PG_CHECK(t->dtype == PG_DTYPE_I32);
    }
    (void)pg_st_find_tensor(f, ""); // a miss (or the tensor named "")
    pg_st_close(f);
    return 0;
}
