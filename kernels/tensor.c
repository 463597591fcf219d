// kernels/tensor.c - tensor views (kernels/backend.h).
#include "kernels/backend.h"

pg_tensor pg_tensor_view(pg_tensor t, int64_t r0, int64_t n, int64_t c0, int64_t nc) {
    const size_t elem = t.dtype == PG_DTYPE_F32 ? 4 : 2;
    pg_tensor v = t;
    v.data = (char *)t.data + ((size_t)r0 * (size_t)t.stride + (size_t)c0) * elem;
    v.rows = n;
    v.cols = nc;
    return v;
}
