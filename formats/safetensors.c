// formats/safetensors.c - safetensors reader over a read-only mmap, and the
// sharded-model view. See formats/safetensors.h for the format and contract.
//
// The JSON header is parsed with cJSON_ParseWithLengthOpts on the mapped
// bytes (never as a C string: the mapping is not NUL-terminated), the tree
// is turned into a flat tensor table with every number checked to be an
// exact non-negative integer, and freed before returning.
#include "formats/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/mmap_file.h"
#include "kernels/dtype.h"

// Numbers in JSON are doubles in cJSON: integers above 2^53 are not exact.
#define ST_MAX_EXACT_INT 9007199254740992.0 // 2^53
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

// --- private state ------------------------------------------------------------------

typedef struct {
    pg_st_file pub;
    uint64_t *sorted; // [n_tensors] tensor indices sorted by name
} st_impl;

// Formats a name from the file for a message: at most ~80 bytes, control
// bytes and quotes escaped.
static const char *name_fmt(const char *p, char buf[static 128]) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (; *p; p++) {
        if (o > 80) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        unsigned char c = (unsigned char)*p;
        if (c >= 0x20 && c != 0x7f && c != '\'' && c != '\\') {
            buf[o++] = (char)c; // UTF-8 bytes pass through
        } else {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[c >> 4];
            buf[o++] = hex[c & 15];
        }
    }
    buf[o] = '\0';
    return buf;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

// Element size and pg_dtype of a safetensors dtype string; 0 if unsupported.
static size_t dtype_from_str(const char *s, int *dtype) {
    if (!strcmp(s, "F32")) return *dtype = PG_DTYPE_F32, 4;
    if (!strcmp(s, "F16")) return *dtype = PG_DTYPE_F16, 2;
    if (!strcmp(s, "BF16")) return *dtype = PG_DTYPE_BF16, 2;
    // FP8 checkpoints: the loader pairs each such weight with its
    // `weight_scale` (engine/model/model_load.c); alone it is not a weight.
    if (!strcmp(s, "F8_E4M3")) return *dtype = PG_DTYPE_FP8_E4M3, 1;
    // AWQ / GPTQ checkpoints: int32-packed nibbles and indices, repacked
    // by the loader (engine/model/int4_ckpt.c); alone it is not a weight either.
    if (!strcmp(s, "I32")) return *dtype = PG_DTYPE_I32, 4;
    return 0;
}

// An exact integer in [0, 2^53].
static bool json_uint(const cJSON *n, uint64_t *out) {
    if (!cJSON_IsNumber(n)) return false;
    double d = n->valuedouble;
    if (!(d >= 0.0 && d <= ST_MAX_EXACT_INT) || floor(d) != d) return false;
    *out = (uint64_t)d;
    return true;
}

// Orders tensor indices by name (qsort_r context: the tensor array).
static int idx_cmp_r(const void *a, const void *b, void *ctx) {
    const pg_st_tensor *t = ctx;
    return strcmp(t[*(const uint64_t *)a].name, t[*(const uint64_t *)b].name);
}

// --- one tensor entry -----------------------------------------------------------------

static int parse_tensor(const char *path, const cJSON *e, uint64_t data_size, pg_st_tensor *t) {
    char nb[128];
    const char *tn = name_fmt(t->name, nb);
    if (!cJSON_IsObject(e))
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s': entry is not a JSON object", path, tn);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s': missing \"dtype\" string", path, tn);
    if (!cJSON_IsArray(shape))
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s': missing \"shape\" array", path, tn);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s': \"data_offsets\" is not an array of 2 numbers", path, tn);

    size_t esize = dtype_from_str(dt->valuestring, &t->dtype);
    if (!esize) {
        char db[128];
        return pg_err_set(PG_EUNSUPP, "%s: tensor '%s' has unsupported dtype '%s' (F32, F16, BF16, F8_E4M3 and I32 are supported)",
                          path, tn, name_fmt(dt->valuestring, db));
    }

    int rank = cJSON_GetArraySize(shape);
    if (rank > PG_ST_MAX_DIMS)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' has %d dimensions (at most %d supported)", path, tn, rank,
                          PG_ST_MAX_DIMS);
    t->n_dims = (uint32_t)rank;
    for (int i = 0; i < PG_ST_MAX_DIMS; i++) t->shape[i] = t->dims[i] = 1;
    uint64_t n = 1;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        uint64_t v;
        if (!json_uint(d, &v))
            return pg_err_set(PG_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer below 2^53",
                              path, tn, i);
        if (v != 0 && n > (uint64_t)INT64_MAX / v)
            return pg_err_set(PG_EFORMAT, "%s: tensor '%s': shape has more than 2^63 elements", path, tn);
        n *= v;
        t->shape[i] = v;
        t->dims[rank - 1 - i] = v;
        i++;
    }
    t->n_elems = n;
    if (n > UINT64_MAX / esize)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s': byte size overflows", path, tn);
    uint64_t want = n * esize;

    uint64_t begin, end;
    if (!json_uint(cJSON_GetArrayItem(offs, 0), &begin) || !json_uint(cJSON_GetArrayItem(offs, 1), &end))
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s': data_offsets are not non-negative integers below 2^53", path,
                          tn);
    if (begin > end || end > data_size)
        return pg_err_set(PG_EFORMAT,
                          "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 ") outside the data section (%" PRIu64
                          " bytes)",
                          path, tn, begin, end, data_size);
    if (end - begin != want)
        return pg_err_set(PG_EFORMAT,
                          "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64
                          " bytes, shape and dtype need %" PRIu64,
                          path, tn, begin, end, end - begin, want);
    t->offset = begin;
    t->nbytes = want;
    return 0;
}

// --- one file ---------------------------------------------------------------------------

static int st_parse(st_impl *fi) {
    pg_st_file *f = &fi->pub;
    const char *path = f->path;
    cJSON *root = NULL;
    int rc = 0;

    if (f->file.size < 8)
        return pg_err_set(PG_EFORMAT, "%s: file of %zu bytes is too small to be safetensors", path, f->file.size);
    uint64_t n = le64(f->file.data);
    if (n > PG_ST_MAX_HEADER)
        return pg_err_set(PG_EFORMAT, "%s: header length %" PRIu64 " exceeds the %u-byte limit (not a safetensors file?)",
                          path, n, PG_ST_MAX_HEADER);
    if (n > f->file.size - 8)
        return pg_err_set(PG_EFORMAT, "%s: header length %" PRIu64 " past end of file (size %zu)", path, n,
                          f->file.size);
    f->header_len = n;
    f->data_offset = 8 + n;
    const char *json = (const char *)f->file.data + 8;
    if (n == 0 || json[0] != '{')
        return pg_err_set(PG_EFORMAT, "%s: header does not start with '{' (not a safetensors file)", path);

    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + n ? (size_t)(end - json) : 0;
        return pg_err_set(PG_EFORMAT, "%s: header is not valid JSON (error near byte %zu of %" PRIu64 ")", path,
                          8 + at, n);
    }
    // Writers pad the header with spaces; anything else after the JSON is
    // a malformed file, not something to ignore.
    for (const char *p = end; p < json + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = pg_err_set(PG_EFORMAT, "%s: unexpected bytes after the JSON header (at byte %zu)", path,
                            (size_t)(8 + (p - json)));
            goto out;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = pg_err_set(PG_EFORMAT, "%s: header is not a JSON object", path);
        goto out;
    }

    uint64_t count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") != 0) count++;
    }
    f->tensors = calloc(count ? count : 1, sizeof *f->tensors);
    fi->sorted = malloc((count ? count : 1) * sizeof *fi->sorted);
    if (!f->tensors || !fi->sorted) {
        rc = pg_err_set(PG_ENOMEM, "%s: out of memory for %" PRIu64 " tensors", path, count);
        goto out;
    }
    uint64_t data_size = f->file.size - f->data_offset;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) continue;
        pg_st_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(e->string);
        if (!t->name) {
            rc = pg_err_set(PG_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        f->n_tensors++; // counted now so close frees the name on failure
        if ((rc = parse_tensor(path, e, data_size, t)) < 0) goto out;
        t->data = f->file.data + f->data_offset + t->offset;
    }

    for (uint64_t i = 0; i < f->n_tensors; i++) fi->sorted[i] = i;
    qsort_r(fi->sorted, (size_t)f->n_tensors, sizeof *fi->sorted, idx_cmp_r, f->tensors);
    for (uint64_t i = 1; i < f->n_tensors; i++) {
        const char *a = f->tensors[fi->sorted[i - 1]].name, *b = f->tensors[fi->sorted[i]].name;
        if (!strcmp(a, b)) {
            char nb[128];
            rc = pg_err_set(PG_EFORMAT, "%s: duplicate tensor name '%s'", path, name_fmt(a, nb));
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    return rc;
}

static void st_free(st_impl *fi) {
    if (!fi) return;
    pg_st_file *f = &fi->pub;
    if (f->tensors)
        for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(fi->sorted);
    pg_mapped_file_close(&f->file);
    free(f->path);
    free(fi);
}

static st_impl *st_alloc(const char *path) {
    st_impl *fi = calloc(1, sizeof *fi);
    if (!fi) return NULL;
    fi->pub.file.fd = -1;
    fi->pub.path = strdup(path);
    if (!fi->pub.path) {
        free(fi);
        return NULL;
    }
    return fi;
}

int pg_st_open_memory(const void *buf, size_t size, const char *name, pg_st_file **out) {
    *out = NULL;
    const char *path = name ? name : "<memory>";
    st_impl *fi = st_alloc(path);
    if (!fi) return pg_err_set(PG_ENOMEM, "%s: out of memory", path);
    pg_mapped_file_borrow(&fi->pub.file, buf, size);
    int rc = st_parse(fi);
    if (rc < 0) {
        st_free(fi);
        return rc;
    }
    *out = &fi->pub;
    return 0;
}

int pg_st_open(const char *path, pg_st_file **out) {
    *out = NULL;
    int rc;
    st_impl *fi = st_alloc(path);
    if (!fi) return pg_err_set(PG_ENOMEM, "%s: out of memory", path);
    pg_st_file *f = &fi->pub;
    if ((rc = pg_mapped_file_open(&f->file, path, 8, "safetensors")) < 0) goto fail;
    if ((rc = st_parse(fi)) < 0) goto fail;
    *out = f;
    return 0;
fail:
    st_free(fi);
    return rc;
}

void pg_st_close(pg_st_file *f) {
    if (f) st_free((st_impl *)f);
}

const pg_st_tensor *pg_st_find_tensor(const pg_st_file *f, const char *name) {
    const st_impl *fi = (const st_impl *)f;
    uint64_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const pg_st_tensor *t = &f->tensors[fi->sorted[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

// --- sharded model ---------------------------------------------------------------------

// Reads a whole (small) file into a malloc'd buffer.
static int read_small_file(const char *path, size_t limit, char **out, size_t *len) {
    *out = NULL;
    int rc = 0;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pg_err_set(errno == ENOENT ? PG_ENOTFOUND : PG_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = pg_err_set(PG_EIO, "%s: not a readable regular file", path);
        goto out;
    }
    if ((uint64_t)st.st_size > limit) {
        rc = pg_err_set(PG_EFORMAT, "%s: %lld bytes, more than the %zu-byte limit", path, (long long)st.st_size,
                        limit);
        goto out;
    }
    size_t n = (size_t)st.st_size, got = 0;
    buf = malloc(n ? n : 1);
    if (!buf) {
        rc = pg_err_set(PG_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = pg_err_set(PG_EIO, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "file shrank");
            goto out;
        }
        got += (size_t)r;
    }
    *out = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

typedef struct {
    const pg_st_tensor *t;
    uint32_t file;
} st_model_ref;

static int model_ref_cmp(const void *a, const void *b) {
    return strcmp(((const st_model_ref *)a)->t->name, ((const st_model_ref *)b)->t->name);
}

static int str_ptr_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// A shard name from the index must be a plain file name in the directory.
static bool shard_name_ok(const char *s) {
    return s[0] != '\0' && s[0] != '.' && !strchr(s, '/') && strlen(s) < NAME_MAX;
}

// Builds the sorted cross-file table; a name in two files is an error.
static int model_index(pg_st_model *m) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < m->n_files; i++) n += m->files[i]->n_tensors;
    st_model_ref *refs = malloc((n ? n : 1) * sizeof *refs);
    m->tensors = malloc((n ? n : 1) * sizeof *m->tensors);
    m->tensor_file = malloc((n ? n : 1) * sizeof *m->tensor_file);
    if (!refs || !m->tensors || !m->tensor_file) {
        free(refs);
        return pg_err_set(PG_ENOMEM, "%s: out of memory indexing %" PRIu64 " tensors", m->dir, n);
    }
    uint64_t k = 0;
    for (uint32_t i = 0; i < m->n_files; i++)
        for (uint64_t j = 0; j < m->files[i]->n_tensors; j++) refs[k++] = (st_model_ref){&m->files[i]->tensors[j], i};
    qsort(refs, (size_t)n, sizeof *refs, model_ref_cmp);
    for (uint64_t i = 0; i < n; i++) {
        if (i > 0 && !strcmp(refs[i - 1].t->name, refs[i].t->name)) {
            char nb[128];
            int rc = pg_err_set(PG_EFORMAT, "%s: tensor '%s' is in both %s and %s", m->dir,
                                name_fmt(refs[i].t->name, nb), m->files[refs[i - 1].file]->path,
                                m->files[refs[i].file]->path);
            free(refs);
            return rc;
        }
        m->tensors[i] = refs[i].t;
        m->tensor_file[i] = refs[i].file;
    }
    m->n_tensors = n;
    free(refs);
    return 0;
}

static int model_open_file(pg_st_model *m, const char *path) {
    m->files = calloc(1, sizeof *m->files);
    if (!m->files) return pg_err_set(PG_ENOMEM, "%s: out of memory", path);
    PG_TRY(pg_st_open(path, &m->files[0]));
    m->n_files = 1;
    return 0;
}

// Opens every shard the index names and checks the weight map against them.
static int model_open_index(pg_st_model *m, const char *index_path) {
    char *text = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    char **names = NULL;
    int rc = read_small_file(index_path, PG_ST_MAX_HEADER, &text, &len);
    if (rc < 0) goto out;
    root = cJSON_ParseWithLength(text, len);
    if (!root) {
        rc = pg_err_set(PG_EFORMAT, "%s: not valid JSON", index_path);
        goto out;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        rc = pg_err_set(PG_EFORMAT, "%s: no \"weight_map\" object", index_path);
        goto out;
    }
    size_t n_entries = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        char nb[128];
        if (!cJSON_IsString(e) || !e->valuestring || !shard_name_ok(e->valuestring)) {
            rc = pg_err_set(PG_EFORMAT, "%s: weight_map entry '%s' is not a plain file name in the directory",
                            index_path, name_fmt(e->string, nb));
            goto out;
        }
        n_entries++;
    }
    // Unique shard names, sorted (model-00001-of-N first).
    names = malloc((n_entries ? n_entries : 1) * sizeof *names);
    if (!names) {
        rc = pg_err_set(PG_ENOMEM, "%s: out of memory", index_path);
        goto out;
    }
    size_t k = 0;
    cJSON_ArrayForEach(e, wm) names[k++] = e->valuestring;
    qsort(names, n_entries, sizeof *names, str_ptr_cmp);
    size_t n_unique = 0;
    for (size_t i = 0; i < n_entries; i++)
        if (n_unique == 0 || strcmp(names[n_unique - 1], names[i]) != 0) names[n_unique++] = names[i];
    if (n_unique == 0) {
        rc = pg_err_set(PG_EFORMAT, "%s: weight_map is empty", index_path);
        goto out;
    }
    if (n_unique > UINT32_MAX) {
        rc = pg_err_set(PG_EFORMAT, "%s: too many shards", index_path);
        goto out;
    }
    m->files = calloc(n_unique, sizeof *m->files);
    if (!m->files) {
        rc = pg_err_set(PG_ENOMEM, "%s: out of memory", index_path);
        goto out;
    }
    for (size_t i = 0; i < n_unique; i++) {
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", m->dir, names[i]) >= sizeof path) {
            rc = pg_err_set(PG_EINVAL, "%s: shard path too long", index_path);
            goto out;
        }
        if ((rc = pg_st_open(path, &m->files[i])) < 0) goto out;
        m->n_files++;
    }
    // Every tensor the index lists must be in the shard it names.
    cJSON_ArrayForEach(e, wm) {
        char *key = e->valuestring;
        char **hit = bsearch(&key, names, n_unique, sizeof *names, str_ptr_cmp);
        PG_CHECK(hit != NULL);
        const pg_st_file *sf = m->files[hit - names];
        if (!pg_st_find_tensor(sf, e->string)) {
            char nb[128];
            rc = pg_err_set(PG_EFORMAT, "%s: weight_map puts '%s' in %s, which has no such tensor", index_path,
                            name_fmt(e->string, nb), sf->path);
            goto out;
        }
    }
out:
    free(names);
    cJSON_Delete(root);
    free(text);
    return rc;
}

void pg_st_model_close(pg_st_model *m) {
    if (!m) return;
    for (uint32_t i = 0; i < m->n_files; i++) pg_st_close(m->files[i]);
    free(m->files);
    free(m->tensors);
    free(m->tensor_file);
    free(m->dir);
    free(m);
}

int pg_st_model_open(const char *dir, pg_st_model **out) {
    *out = NULL;
    int rc;
    pg_st_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return pg_err_set(PG_ENOMEM, "%s: out of memory", dir);
    }
    struct stat st;
    if (stat(dir, &st) != 0) {
        rc = pg_err_set(errno == ENOENT ? PG_ENOTFOUND : PG_EIO, "%s: %s", dir, strerror(errno));
        goto fail;
    }
    if (S_ISREG(st.st_mode)) {
        rc = model_open_file(m, dir);
    } else {
        char index_path[PATH_MAX], single_path[PATH_MAX];
        if ((size_t)snprintf(index_path, sizeof index_path, "%s/%s", dir, ST_INDEX_NAME) >= sizeof index_path ||
            (size_t)snprintf(single_path, sizeof single_path, "%s/%s", dir, ST_SINGLE_NAME) >= sizeof single_path) {
            rc = pg_err_set(PG_EINVAL, "%s: path too long", dir);
            goto fail;
        }
        if (access(index_path, F_OK) == 0) rc = model_open_index(m, index_path);
        else if (access(single_path, F_OK) == 0) rc = model_open_file(m, single_path);
        else rc = pg_err_set(PG_ENOTFOUND, "%s: neither %s nor %s found", dir, ST_SINGLE_NAME, ST_INDEX_NAME);
    }
    if (rc < 0) goto fail;
    if ((rc = model_index(m)) < 0) goto fail;
    *out = m;
    return 0;
fail:
    pg_st_model_close(m);
    return rc;
}

const pg_st_tensor *pg_st_model_find(const pg_st_model *m, const char *name, uint32_t *file_index) {
    uint64_t lo = 0, hi = m->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, m->tensors[mid]->name);
        if (c == 0) {
            if (file_index) *file_index = m->tensor_file[mid];
            return m->tensors[mid];
        }
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}
