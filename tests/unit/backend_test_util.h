// tests/unit/backend_test_util.h - helpers the CPU backend unit tests share
// (test_backend_prof.c, test_gemma_ops.c): a seeded LCG for test data
// (rng_test_util.h's lcg_frand), an f32 weight upload and an f32 tensor
// view. Static inline functions: each test binary is one .c file and gets
// its own copy.
#ifndef PAGED_TESTS_UNIT_BACKEND_TEST_UTIL_H
#define PAGED_TESTS_UNIT_BACKEND_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>

#include "kernels/backend.h"
#include "tests/unit/rng_test_util.h"

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
