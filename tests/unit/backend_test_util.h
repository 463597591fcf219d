// tests/unit/backend_test_util.h - helpers the CPU backend unit tests share
// (test_backend_prof.c, test_gemma_ops.c): a seeded LCG for test data, an
// f32 weight upload and an f32 tensor view. Static inline functions: each
// test binary is one .c file and gets its own copy.
#ifndef PAGED_TESTS_UNIT_BACKEND_TEST_UTIL_H
#define PAGED_TESTS_UNIT_BACKEND_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>

#include "kernels/backend.h"

// The next of the LCG at *state: uniform in [-1, 1).
static inline float lcg_frand(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*state >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

// Uploads v [rows][cols] as an f32 weight (must succeed).
static inline pg_bweight *upload_f32(pg_backend *be, const float *v, int64_t rows, int64_t cols) {
    pg_weight w = {.data = v,
                   .dtype = PG_DTYPE_F32,
                   .rows = rows,
                   .cols = cols,
                   .row_bytes = sizeof(float) * (size_t)cols};
    pg_bweight *out;
    assert_int_equal(be->store->weight_upload(be, &w, 1, &out), 0);
    return out;
}

// d as a contiguous f32 tensor [rows][cols].
static inline pg_tensor view_f32(float *d, int64_t rows, int64_t cols) {
    return (pg_tensor){d, PG_DTYPE_F32, rows, cols, cols};
}

#endif // PAGED_TESTS_UNIT_BACKEND_TEST_UTIL_H
