// kernels/cuda/cuda_stub.c - the CUDA model ABI in a build without CUDA.
//
// Compiled into libpaged.a on every machine. build/paged links the CUDA
// archive whole and first (tools/gen_build.py), so where nvcc built real
// objects their definitions win and this object is never pulled from the
// archive; elsewhere (no nvcc, unit tests, ASan builds) these stubs resolve
// the symbols: no device, and every call says the binary has no CUDA.
#include <string.h>

#include "common/err.h"
#include "kernels/cuda/cuda_model.h"

#define NO_CUDA()                                                                                  \
    pg_err_set(PG_EUNSUPP, "this binary was built without CUDA (no nvcc at build time)")

int pg_cuda_built(void) {
    return 0;
}

int pg_cuda_device_count(void) {
    return 0;
}

int pg_cuda_device_describe(char *name, size_t cap) {
    if (name && cap) name[0] = 0;
    return NO_CUDA();
}

int pg_cuda_model_create(const pg_cuda_model_shape *shape, const float *inv_freq, int device,
                         pg_cuda_model **out) {
    (void)shape, (void)inv_freq, (void)device;
    *out = NULL;
    return NO_CUDA();
}

void pg_cuda_model_free(pg_cuda_model *m) {
    (void)m;
}

void pg_cuda_model_weight_dims(const pg_cuda_model *m, pg_cuda_weight_id w, int64_t *rows,
                               int64_t *cols) {
    (void)m, (void)w;
    *rows = *cols = 0;
}

int pg_cuda_model_upload_rows(pg_cuda_model *m, pg_cuda_weight_id w, int32_t layer, int64_t row0,
                              int64_t n_rows, const void *src, int src_dtype) {
    (void)m, (void)w, (void)layer, (void)row0, (void)n_rows, (void)src, (void)src_dtype;
    return NO_CUDA();
}

int pg_cuda_model_init_random(pg_cuda_model *m, uint64_t seed, float std) {
    (void)m, (void)seed, (void)std;
    return NO_CUDA();
}

int pg_cuda_model_set_graph_mode(pg_cuda_model *m, pg_cuda_graph_mode mode) {
    (void)m, (void)mode;
    return NO_CUDA();
}

int pg_cuda_model_capture_graphs(pg_cuda_model *m) {
    (void)m;
    return NO_CUDA();
}

int pg_cuda_model_prepare(pg_cuda_model *m, const pg_cuda_model_limits *lim) {
    (void)m, (void)lim;
    return NO_CUDA();
}

size_t pg_cuda_model_kv_block_bytes(const pg_cuda_model_shape *s, int32_t block_size) {
    return (size_t)2 * (size_t)s->n_layers * (size_t)block_size * (size_t)s->n_kv_heads *
           (size_t)s->head_dim * 2;
}

int pg_cuda_model_alloc_kv(pg_cuda_model *m, int32_t n_blocks, int32_t n_host_blocks) {
    (void)m, (void)n_blocks, (void)n_host_blocks;
    return NO_CUDA();
}

void pg_cuda_model_mem(const pg_cuda_model *m, pg_cuda_mem_stats *out) {
    (void)m;
    memset(out, 0, sizeof *out);
}

int pg_cuda_model_step(pg_cuda_model *m, const pg_cuda_step *s, pg_cuda_sample_out *out) {
    (void)m, (void)s, (void)out;
    return NO_CUDA();
}

int pg_cuda_model_step_begin(pg_cuda_model *m, const pg_cuda_step *s) {
    (void)m, (void)s;
    return NO_CUDA();
}

int pg_cuda_model_step_end(pg_cuda_model *m, pg_cuda_sample_out *out) {
    (void)m, (void)out;
    return NO_CUDA();
}

int pg_cuda_model_last_logits(pg_cuda_model *m, float *out, int32_t n) {
    (void)m, (void)out, (void)n;
    return NO_CUDA();
}
