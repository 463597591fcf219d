// tests/unit/gguf_writer.c - test support: GGUF images in memory, scratch
// files. See gguf_writer.h.
#include "tests/unit/gguf_writer.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TW_DIE(...)                                                                                          \
    do {                                                                                                     \
        fprintf(stderr, "gguf_writer: " __VA_ARGS__);                                                        \
        fputc('\n', stderr);                                                                                 \
        abort();                                                                                             \
    } while (0)

// --- buffer ------------------------------------------------------------------------

void tw_buf_free(tw_buf *b) {
    free(b->data);
    *b = (tw_buf){0};
}

void tw_put(tw_buf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        b->data = realloc(b->data, cap);
        if (!b->data) TW_DIE("out of memory");
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}

void tw_u8(tw_buf *b, uint8_t v) { tw_put(b, &v, 1); }
void tw_u16(tw_buf *b, uint16_t v) {
    uint8_t p[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    tw_put(b, p, 2);
}
void tw_u32(tw_buf *b, uint32_t v) {
    uint8_t p[4];
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
    tw_put(b, p, 4);
}
void tw_u64(tw_buf *b, uint64_t v) {
    uint8_t p[8];
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
    tw_put(b, p, 8);
}
void tw_f32(tw_buf *b, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    tw_u32(b, u);
}
void tw_f64(tw_buf *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    tw_u64(b, u);
}
void tw_gstr(tw_buf *b, const char *s) {
    size_t n = strlen(s);
    tw_u64(b, n);
    tw_put(b, s, n);
}
void tw_pad(tw_buf *b, size_t align) {
    static const uint8_t zeros[64];
    while (b->len % align) {
        size_t n = align - b->len % align;
        tw_put(b, zeros, n < sizeof zeros ? n : sizeof zeros);
    }
}
void tw_patch_u32(tw_buf *b, size_t off, uint32_t v) {
    if (off + 4 > b->len) TW_DIE("patch past end");
    for (int i = 0; i < 4; i++) b->data[off + i] = (uint8_t)(v >> (8 * i));
}
void tw_patch_u64(tw_buf *b, size_t off, uint64_t v) {
    if (off + 8 > b->len) TW_DIE("patch past end");
    for (int i = 0; i < 8; i++) b->data[off + i] = (uint8_t)(v >> (8 * i));
}

// --- GGUF builder --------------------------------------------------------------------

typedef struct {
    char *name;
    uint32_t type, n_dims;
    uint64_t dims[8];
    uint8_t *data;
    size_t nbytes;
    uint64_t offset_override;
} tw_tensor;

struct tw_gguf {
    uint32_t version;
    uint64_t n_kv;
    tw_buf kv;       // encoded metadata entries
    uint64_t align;
    tw_tensor *tensors;
    size_t n_tensors;
};

tw_gguf *tw_gguf_new(uint32_t version) {
    tw_gguf *g = calloc(1, sizeof *g);
    if (!g) TW_DIE("out of memory");
    g->version = version;
    g->align = 32;
    return g;
}

void tw_gguf_kv_raw(tw_gguf *g, const char *key, uint32_t type, const void *val, size_t n) {
    tw_gstr(&g->kv, key);
    tw_u32(&g->kv, type);
    tw_put(&g->kv, val, n);
    g->n_kv++;
}

#define TW_KV_SCALAR(fn, ctype, gtype)                                                                       \
    void fn(tw_gguf *g, const char *key, ctype v) { tw_gguf_kv_raw(g, key, gtype, &v, sizeof v); }
TW_KV_SCALAR(tw_gguf_kv_u8, uint8_t, 0)
TW_KV_SCALAR(tw_gguf_kv_i8, int8_t, 1)
TW_KV_SCALAR(tw_gguf_kv_u16, uint16_t, 2)
TW_KV_SCALAR(tw_gguf_kv_i16, int16_t, 3)
TW_KV_SCALAR(tw_gguf_kv_u32, uint32_t, 4)
TW_KV_SCALAR(tw_gguf_kv_i32, int32_t, 5)
TW_KV_SCALAR(tw_gguf_kv_f32, float, 6)
TW_KV_SCALAR(tw_gguf_kv_u64, uint64_t, 10)
TW_KV_SCALAR(tw_gguf_kv_i64, int64_t, 11)
TW_KV_SCALAR(tw_gguf_kv_f64, double, 12)
#undef TW_KV_SCALAR

void tw_gguf_kv_bool(tw_gguf *g, const char *key, bool v) {
    uint8_t b = v;
    tw_gguf_kv_raw(g, key, 7, &b, 1);
}

void tw_gguf_kv_str(tw_gguf *g, const char *key, const char *v) {
    tw_buf b = {0};
    tw_gstr(&b, v);
    tw_gguf_kv_raw(g, key, 8, b.data, b.len);
    tw_buf_free(&b);
}

void tw_gguf_kv_arr(tw_gguf *g, const char *key, uint32_t elem_type, const void *elems, uint64_t count,
                    size_t elem_size) {
    tw_buf b = {0};
    tw_u32(&b, elem_type);
    tw_u64(&b, count);
    tw_put(&b, elems, (size_t)count * elem_size);
    tw_gguf_kv_raw(g, key, 9, b.data, b.len);
    tw_buf_free(&b);
}

void tw_gguf_kv_arr_str(tw_gguf *g, const char *key, const char *const *strs, uint64_t count) {
    tw_buf b = {0};
    tw_u32(&b, 8);
    tw_u64(&b, count);
    for (uint64_t i = 0; i < count; i++) tw_gstr(&b, strs[i]);
    tw_gguf_kv_raw(g, key, 9, b.data, b.len);
    tw_buf_free(&b);
}

void tw_gguf_alignment(tw_gguf *g, uint32_t align) {
    tw_gguf_kv_u32(g, "general.alignment", align);
    g->align = align ? align : 1; // 0 is written (tests check it is refused) but laid out as 1
}

void tw_gguf_tensor_at(tw_gguf *g, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *dims,
                       const void *data, size_t nbytes, uint64_t offset_override) {
    if (n_dims > 8) TW_DIE("n_dims > 8");
    g->tensors = realloc(g->tensors, (g->n_tensors + 1) * sizeof *g->tensors);
    if (!g->tensors) TW_DIE("out of memory");
    tw_tensor *t = &g->tensors[g->n_tensors++];
    *t = (tw_tensor){0};
    t->name = strdup(name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t i = 0; i < n_dims; i++) t->dims[i] = dims[i];
    t->data = calloc(1, nbytes ? nbytes : 1);
    if (!t->name || !t->data) TW_DIE("out of memory");
    if (data && nbytes) memcpy(t->data, data, nbytes);
    t->nbytes = nbytes;
    t->offset_override = offset_override;
}

void tw_gguf_tensor(tw_gguf *g, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *dims,
                    const void *data, size_t nbytes) {
    tw_gguf_tensor_at(g, name, type, n_dims, dims, data, nbytes, UINT64_MAX);
}

tw_buf tw_gguf_finish(tw_gguf *g, size_t *infos_end) {
    tw_buf b = {0};
    tw_put(&b, "GGUF", 4);
    tw_u32(&b, g->version);
    tw_u64(&b, g->n_tensors);
    tw_u64(&b, g->n_kv);
    tw_put(&b, g->kv.data, g->kv.len);
    uint64_t off = 0;
    for (size_t i = 0; i < g->n_tensors; i++) {
        tw_tensor *t = &g->tensors[i];
        tw_gstr(&b, t->name);
        tw_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) tw_u64(&b, t->dims[d]);
        tw_u32(&b, t->type);
        tw_u64(&b, t->offset_override != UINT64_MAX ? t->offset_override : off);
        off += (t->nbytes + g->align - 1) / g->align * g->align;
    }
    if (infos_end) *infos_end = b.len;
    if (g->n_tensors) {
        tw_pad(&b, g->align);
        for (size_t i = 0; i < g->n_tensors; i++) {
            tw_put(&b, g->tensors[i].data, g->tensors[i].nbytes);
            tw_pad(&b, g->align);
        }
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        free(g->tensors[i].name);
        free(g->tensors[i].data);
    }
    free(g->tensors);
    tw_buf_free(&g->kv);
    free(g);
    return b;
}

// --- files ---------------------------------------------------------------------------

void tw_tmpdir(char *out, size_t cap) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    if ((size_t)snprintf(out, cap, "%s/pg_test_XXXXXX", base) >= cap) TW_DIE("tmpdir path too long");
    if (!mkdtemp(out)) TW_DIE("mkdtemp %s failed", out);
}

void tw_write_file(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) TW_DIE("cannot create %s", path);
    if (n && fwrite(data, 1, n, fp) != n) TW_DIE("short write to %s", path);
    if (fclose(fp) != 0) TW_DIE("close %s failed", path);
}

void tw_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

bool tw_repo_path(const char *rel, char *out, size_t cap) {
    struct stat st;
    snprintf(out, cap, "%s", rel);
    if (stat(rel, &st) == 0) return true;
    // The binaries live in build/tests/ or build/asan/tests/: walk up from
    // the executable's directory.
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = '\0';
    for (int up = 0; up < 6; up++) {
        char *slash = strrchr(exe, '/');
        if (!slash) break;
        *slash = '\0';
        char cand[PATH_MAX];
        if ((size_t)snprintf(cand, sizeof cand, "%s/%s", exe, rel) >= sizeof cand) break;
        if (stat(cand, &st) == 0) {
            snprintf(out, cap, "%s", cand);
            return true;
        }
    }
    return false;
}
