// formats/gguf.c - GGUF v2/v3 reader over a read-only mmap.
//
// File layout (all integers little-endian, no padding unless stated):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x      { string key | u32 value_type | value }
//   n_tensors x { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type
//                 | u64 offset }
//   padding to general.alignment (default 32)
//   tensor data: tensor i at data_offset + offset_i (offset_i aligned)
// where string = { u64 len | len bytes } and an array value is
// { u32 elem_type | u64 count | count elements }.
//
// Parsing is one forward pass over the image with a cursor that checks every
// read against the end of the image before touching memory; every count is
// compared with what the remaining bytes could possibly hold before anything
// is allocated, so a hostile header cannot make us allocate more than a small
// multiple of the file size. Nothing is copied out of the image: strings,
// arrays and tensor data point into it.
#include "formats/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/mmap_file.h"
#include "kernels/dtype.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
// Arrays nested deeper than this are rejected (a guard on recursion, not a
// limit any real file comes near: writers produce at most arrays of arrays).
#define GGUF_MAX_ARRAY_DEPTH 8
// Smallest possible encodings, used to bound counts before allocating.
#define GGUF_MIN_KV_BYTES (8 + 4 + 1)          // empty key, u32 type, 1-byte value
#define GGUF_MIN_TENSOR_INFO_BYTES (8 + 4 + 4 + 8) // empty name, 0 dims, type, offset

// --- private state --------------------------------------------------------------

// Sorted (name, index) pairs for binary-search lookups and duplicate checks.
typedef struct {
    const char *ptr;
    uint64_t len;
    uint64_t idx;
} gguf_name_ref;

// The public struct plus what only this file needs. gguf_file is the first
// member, so the pointer handed out converts back with a cast.
typedef struct {
    gguf_file pub;
    gguf_name_ref *kv_sorted;   // [n_kv], sorted by key
    gguf_name_ref *t_sorted;    // [n_tensors], sorted by name
} gguf_impl;

// --- small helpers ----------------------------------------------------------------

// Formats a name from the file for a message: at most 80 bytes, non-printable
// bytes escaped, so a hostile name cannot mangle a log line.
static const char *name_fmt(const char *p, uint64_t len, char buf[static 128]) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (uint64_t i = 0; i < len; i++) {
        if (o > 80) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
            buf[o++] = (char)c;
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

static const char *str_fmt(gguf_str s, char buf[static 128]) { return name_fmt(s.ptr, s.len, buf); }

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

// Size in bytes of a fixed-size value type; 0 for string, array and unknown.
static size_t type_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

// Smallest encoding of one value of type t (bounds array counts).
static size_t type_min_size(uint32_t t) {
    if (t == GGUF_TYPE_STRING) return 8;
    if (t == GGUF_TYPE_ARRAY) return 4 + 8;
    return type_size(t);
}

static bool type_valid(uint32_t t) { return t <= GGUF_TYPE_FLOAT64; }

const char *gguf_type_name(gguf_type t) {
    static const char *const names[] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

static bool is_unsigned(gguf_type t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}
static bool is_signed(gguf_type t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

// Decodes a fixed-size scalar of type t at p into the kv union.
static void decode_scalar(gguf_type t, const uint8_t *p, gguf_kv *kv) {
    switch (t) {
    case GGUF_TYPE_UINT8: kv->v.u64 = p[0]; break;
    case GGUF_TYPE_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_BOOL: kv->v.u64 = p[0] != 0; break;
    case GGUF_TYPE_UINT16: kv->v.u64 = le16(p); break;
    case GGUF_TYPE_INT16: kv->v.i64 = (int16_t)le16(p); break;
    case GGUF_TYPE_UINT32: kv->v.u64 = le32(p); break;
    case GGUF_TYPE_INT32: kv->v.i64 = (int32_t)le32(p); break;
    case GGUF_TYPE_UINT64: kv->v.u64 = le64(p); break;
    case GGUF_TYPE_INT64: {
        uint64_t u = le64(p);
        memcpy(&kv->v.i64, &u, 8);
        break;
    }
    case GGUF_TYPE_FLOAT32: {
        uint32_t u = le32(p);
        float f;
        memcpy(&f, &u, 4);
        kv->v.f64 = f;
        break;
    }
    case GGUF_TYPE_FLOAT64: {
        uint64_t u = le64(p);
        memcpy(&kv->v.f64, &u, 8);
        break;
    }
    default: PG_CHECK(type_size(t) != 0); // only fixed-size types come here
    }
}

static int name_ref_cmp(const void *a, const void *b) {
    const gguf_name_ref *x = a, *y = b;
    uint64_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->ptr, y->ptr, (size_t)n) : 0;
    if (c) return c;
    return (x->len > y->len) - (x->len < y->len);
}

// Binary search in a sorted ref table; UINT64_MAX when absent.
static uint64_t name_ref_find(const gguf_name_ref *refs, uint64_t n, const char *name) {
    gguf_name_ref key = {name, strlen(name), 0};
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = name_ref_cmp(&key, &refs[mid]);
        if (c == 0) return refs[mid].idx;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return UINT64_MAX;
}

// --- cursor ---------------------------------------------------------------------

// A bounds-checked forward cursor over the image. `what`, `index` and `name`
// describe the item being parsed, for the truncation message.
typedef struct {
    const uint8_t *base;
    size_t size;
    size_t pos;
    const char *path;
    const char *what; // "header", "metadata entry", "tensor info"
    bool index_valid; // false while reading the header
    uint64_t index;
    gguf_str name;    // key or tensor name once read ({NULL,0} before)
} gguf_cursor;

static int cur_truncated(const gguf_cursor *c, uint64_t need) {
    char item[256], nb[128];
    if (!c->index_valid) snprintf(item, sizeof item, "%s", c->what);
    else if (c->name.ptr)
        snprintf(item, sizeof item, "%s %" PRIu64 " ('%s')", c->what, c->index, str_fmt(c->name, nb));
    else snprintf(item, sizeof item, "%s %" PRIu64, c->what, c->index);
    return pg_err_set(PG_EFORMAT, "%s: truncated file: %s needs %" PRIu64 " bytes at offset %zu, file size %zu",
                      c->path, item, need, c->pos, c->size);
}

static size_t cur_left(const gguf_cursor *c) { return c->size - c->pos; }

// Consumes n bytes, returning a pointer to them in *out.
static int cur_take(gguf_cursor *c, uint64_t n, const uint8_t **out) {
    if (n > cur_left(c)) return cur_truncated(c, n);
    *out = c->base + c->pos;
    c->pos += (size_t)n;
    return 0;
}

static int cur_u32(gguf_cursor *c, uint32_t *out) {
    const uint8_t *p = NULL;
    PG_TRY(cur_take(c, 4, &p));
    *out = le32(p);
    return 0;
}

static int cur_u64(gguf_cursor *c, uint64_t *out) {
    const uint8_t *p = NULL;
    PG_TRY(cur_take(c, 8, &p));
    *out = le64(p);
    return 0;
}

static int cur_str(gguf_cursor *c, gguf_str *out) {
    uint64_t len;
    const uint8_t *p = NULL;
    PG_TRY(cur_u64(c, &len));
    PG_TRY(cur_take(c, len, &p));
    out->ptr = (const char *)p;
    out->len = len;
    return 0;
}

// --- metadata --------------------------------------------------------------------

static int array_too_long(const gguf_cursor *c, uint32_t elem_type, uint64_t count) {
    char nb[128];
    return pg_err_set(PG_EFORMAT,
                      "%s: metadata '%s': array of %" PRIu64 " %s elements does not fit in the file "
                      "(offset %zu, file size %zu)",
                      c->path, str_fmt(c->name, nb), count, gguf_type_name((gguf_type)elem_type), c->pos,
                      c->size);
}

// Skips one value of type t (used for the elements of nested arrays).
static int skip_value(gguf_cursor *c, uint32_t t, int depth) {
    char nb[128];
    const uint8_t *p = NULL;
    if (!type_valid(t))
        return pg_err_set(PG_EFORMAT, "%s: metadata '%s' has unknown value type %" PRIu32, c->path,
                          str_fmt(c->name, nb), t);
    if (t == GGUF_TYPE_STRING) {
        gguf_str s;
        return cur_str(c, &s);
    }
    if (t != GGUF_TYPE_ARRAY) return cur_take(c, type_size(t), &p);
    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return pg_err_set(PG_EUNSUPP, "%s: metadata '%s': arrays nested more than %d deep", c->path,
                          str_fmt(c->name, nb), GGUF_MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t count;
    PG_TRY(cur_u32(c, &et));
    PG_TRY(cur_u64(c, &count));
    if (!type_valid(et))
        return pg_err_set(PG_EFORMAT, "%s: metadata '%s' has an array of unknown type %" PRIu32, c->path,
                          str_fmt(c->name, nb), et);
    if (count > cur_left(c) / type_min_size(et)) return array_too_long(c, et, count);
    size_t fixed = type_size(et);
    if (fixed) return cur_take(c, count * fixed, &p);
    for (uint64_t i = 0; i < count; i++) PG_TRY(skip_value(c, et, depth + 1));
    return 0;
}

// Parses an array value (after the kv's type field) into kv.
static int parse_array(gguf_cursor *c, gguf_kv *kv) {
    char nb[128];
    uint32_t et;
    uint64_t count;
    PG_TRY(cur_u32(c, &et));
    PG_TRY(cur_u64(c, &count));
    if (!type_valid(et))
        return pg_err_set(PG_EFORMAT, "%s: metadata '%s' has an array of unknown type %" PRIu32, c->path,
                          str_fmt(c->name, nb), et);
    if (count > cur_left(c) / type_min_size(et)) return array_too_long(c, et, count);
    kv->arr_type = (gguf_type)et;
    kv->arr_count = count;
    kv->arr_data = c->base + c->pos;

    size_t fixed = type_size(et);
    if (fixed) {
        const uint8_t *p = NULL;
        return cur_take(c, count * fixed, &p); // count * fixed <= bytes left: checked above
    }
    if (et == GGUF_TYPE_ARRAY) {
        // Arrays of arrays are kept as opaque raw bytes (arr_data, arr_count)
        // after checking that they parse; no getter decodes them.
        for (uint64_t i = 0; i < count; i++) PG_TRY(skip_value(c, et, 1));
        return 0;
    }
    // Strings: record where each element starts so gguf_arr_str is O(1).
    // count <= bytes left / 8, so this allocation is at most half the file.
    uint32_t *offs = malloc(count ? count * sizeof *offs : 1);
    if (!offs)
        return pg_err_set(PG_ENOMEM, "%s: out of memory for %" PRIu64 " strings of '%s'", c->path, count,
                          str_fmt(c->name, nb));
    kv->arr_str_offsets = offs; // owned by kv from here on, freed by gguf_close
    size_t start = c->pos;
    for (uint64_t i = 0; i < count; i++) {
        size_t off = c->pos - start;
        if (off > UINT32_MAX)
            return pg_err_set(PG_EUNSUPP, "%s: metadata '%s': string array larger than 4 GiB", c->path,
                              str_fmt(c->name, nb));
        offs[i] = (uint32_t)off;
        gguf_str s;
        PG_TRY(cur_str(c, &s));
    }
    return 0;
}

static int parse_kv(gguf_cursor *c, gguf_kv *kv) {
    char nb[128];
    c->name = (gguf_str){NULL, 0};
    PG_TRY(cur_str(c, &kv->key));
    c->name = kv->key;
    uint32_t t;
    PG_TRY(cur_u32(c, &t));
    if (!type_valid(t))
        return pg_err_set(PG_EFORMAT, "%s: metadata '%s' has unknown value type %" PRIu32, c->path,
                          str_fmt(kv->key, nb), t);
    kv->type = (gguf_type)t;
    if (t == GGUF_TYPE_STRING) return cur_str(c, &kv->v.str);
    if (t == GGUF_TYPE_ARRAY) return parse_array(c, kv);
    const uint8_t *p = NULL;
    PG_TRY(cur_take(c, type_size(t), &p));
    decode_scalar(kv->type, p, kv);
    return 0;
}

// Builds and checks a sorted name table (duplicates are an error).
static int build_index(const char *path, const char *what, uint64_t n, const gguf_str *(*get)(const void *, uint64_t),
                       const void *items, gguf_name_ref **out) {
    gguf_name_ref *refs = malloc((n ? n : 1) * sizeof *refs);
    if (!refs) return pg_err_set(PG_ENOMEM, "%s: out of memory indexing %" PRIu64 " %ss", path, n, what);
    for (uint64_t i = 0; i < n; i++) {
        const gguf_str *s = get(items, i);
        refs[i] = (gguf_name_ref){s->ptr, s->len, i};
    }
    if (n > 1) qsort(refs, (size_t)n, sizeof *refs, name_ref_cmp);
    for (uint64_t i = 1; i < n; i++) {
        if (name_ref_cmp(&refs[i - 1], &refs[i]) == 0) {
            char nb[128];
            int rc = pg_err_set(PG_EFORMAT, "%s: duplicate %s '%s'", path, what,
                                name_fmt(refs[i].ptr, refs[i].len, nb));
            free(refs);
            return rc;
        }
    }
    *out = refs;
    return 0;
}

static const gguf_str *kv_key_at(const void *items, uint64_t i) { return &((const gguf_kv *)items)[i].key; }
static const gguf_str *tensor_name_at(const void *items, uint64_t i) {
    return &((const gguf_tensor *)items)[i].name;
}

// --- tensor infos ------------------------------------------------------------------

static int parse_tensor_info(gguf_cursor *c, uint64_t alignment, gguf_tensor *t) {
    char nb[128];
    c->name = (gguf_str){NULL, 0};
    PG_TRY(cur_str(c, &t->name));
    c->name = t->name;
    const char *path = c->path;
    const char *tn = str_fmt(t->name, nb);

    PG_TRY(cur_u32(c, &t->n_dims));
    if (t->n_dims > 4)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' has %" PRIu32 " dimensions (at most 4 supported)", path,
                          tn, t->n_dims);
    for (uint32_t d = 0; d < 4; d++) t->dims[d] = 1; // unused trailing dims read as 1
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        PG_TRY(cur_u64(c, &t->dims[d]));
        if (t->dims[d] > INT64_MAX)
            return pg_err_set(PG_EFORMAT, "%s: tensor '%s' dimension %" PRIu32 " is %" PRIu64 " (negative)",
                              path, tn, d, t->dims[d]);
    }
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->dims[d] != 0 && nelem > (uint64_t)INT64_MAX / t->dims[d]) {
            return pg_err_set(PG_EFORMAT,
                              "%s: tensor '%s' shape {%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
                              "} has more than 2^63 elements",
                              path, tn, t->dims[0], t->dims[1], t->dims[2], t->dims[3]);
        }
        nelem *= t->dims[d];
    }
    PG_TRY(cur_u32(c, &t->type));
    PG_TRY(cur_u64(c, &t->offset));

    // paged's own types (FP8_E4M3 and up) need scales a GGUF file does not
    // carry: such a number is unknown here, as it is to GGML.
    const bool ggml_type = t->type < PG_DTYPE_FP8_E4M3;
    int be = ggml_type ? pg_dtype_block_elems((int)t->type) : 0;
    if (be == 0) {
        const char *tname = ggml_type ? pg_dtype_name((int)t->type) : "unknown";
        if (strcmp(tname, "unknown") == 0)
            return pg_err_set(PG_EUNSUPP, "%s: tensor '%s' has unknown type %" PRIu32, path, tn, t->type);
        return pg_err_set(PG_EUNSUPP, "%s: tensor '%s' has unsupported type %s (%" PRIu32 ")", path, tn,
                          tname, t->type);
    }
    if (t->dims[0] % (uint64_t)be != 0)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' row of %" PRIu64 " elements is not a multiple of the %s block size %d",
                          path, tn, t->dims[0], pg_dtype_name((int)t->type), be);
    // dims[0] <= INT64_MAX was checked; row bytes only overflow size_t for
    // absurd rows, which the product check below then also catches.
    uint64_t row = t->dims[0] ? pg_dtype_row_bytes((int)t->type, (int64_t)t->dims[0]) : 0;
    if (t->dims[0] && row == 0)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' row of %" PRIu64 " elements is too large", path, tn,
                          t->dims[0]);
    uint64_t rows = t->dims[0] ? nelem / t->dims[0] : 0; // exact: dims[0] divides nelem
    if (rows && row > UINT64_MAX / rows)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' byte size overflows", path, tn);
    t->nbytes = row * rows;
    if (t->offset % alignment != 0)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                          path, tn, t->offset, alignment);
    return 0;
}

// --- open / close --------------------------------------------------------------------

static int read_alignment(gguf_impl *fi, uint64_t *out) {
    gguf_file *f = &fi->pub;
    *out = GGUF_DEFAULT_ALIGNMENT;
    uint64_t i = name_ref_find(fi->kv_sorted, f->n_kv, "general.alignment");
    if (i == UINT64_MAX) return 0;
    const gguf_kv *kv = &f->kv[i];
    uint64_t a;
    if (is_unsigned(kv->type)) {
        a = kv->v.u64;
    } else if (is_signed(kv->type) && kv->v.i64 >= 0) {
        a = (uint64_t)kv->v.i64;
    } else {
        return pg_err_set(PG_EFORMAT, "%s: general.alignment has type %s, expected an unsigned integer", f->path,
                          gguf_type_name(kv->type));
    }
    if (a == 0 || (a & (a - 1)) != 0)
        return pg_err_set(PG_EFORMAT, "%s: general.alignment %" PRIu64 " is not a nonzero power of two", f->path,
                          a);
    *out = a;
    return 0;
}

static int gguf_parse(gguf_impl *fi) {
    gguf_file *f = &fi->pub;
    const char *path = f->path;
    gguf_cursor c = {.base = f->file.data, .size = f->file.size, .path = path, .what = "header"};

    if (f->file.size < 4 || memcmp(f->file.data, GGUF_MAGIC, 4) != 0) {
        if (f->file.size < 4)
            return pg_err_set(PG_EFORMAT, "%s: file of %zu bytes is too small to be GGUF (bad magic)", path,
                              f->file.size);
        return pg_err_set(PG_EFORMAT, "%s: bad magic (not a GGUF file)", path);
    }
    c.pos = 4;
    PG_TRY(cur_u32(&c, &f->version));
    if (f->version == 1)
        return pg_err_set(PG_EUNSUPP, "%s: GGUF version 1 is not supported (re-convert the model to v3)", path);
    if (f->version != 2 && f->version != 3) {
        if ((f->version & 0xffff) == 0 && f->version != 0)
            return pg_err_set(PG_EUNSUPP, "%s: big-endian GGUF (version %" PRIu32 " byte-swapped) is not supported",
                              path, __builtin_bswap32(f->version));
        return pg_err_set(PG_EUNSUPP, "%s: unsupported GGUF version %" PRIu32 " (expected 2 or 3)", path,
                          f->version);
    }
    PG_TRY(cur_u64(&c, &f->n_tensors));
    PG_TRY(cur_u64(&c, &f->n_kv));
    // Every entry takes some bytes: refuse counts the file cannot hold
    // before allocating for them.
    if (f->n_kv > cur_left(&c) / GGUF_MIN_KV_BYTES)
        return pg_err_set(PG_EFORMAT, "%s: header claims %" PRIu64 " metadata entries, more than a %zu-byte file can hold",
                          path, f->n_kv, f->file.size);
    if (f->n_tensors > (cur_left(&c) - f->n_kv * GGUF_MIN_KV_BYTES) / GGUF_MIN_TENSOR_INFO_BYTES)
        return pg_err_set(PG_EFORMAT, "%s: header claims %" PRIu64 " tensors, more than a %zu-byte file can hold",
                          path, f->n_tensors, f->file.size);

    f->kv = calloc(f->n_kv ? (size_t)f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors)
        return pg_err_set(PG_ENOMEM, "%s: out of memory for %" PRIu64 " metadata entries and %" PRIu64 " tensors",
                          path, f->n_kv, f->n_tensors);

    c.what = "metadata entry";
    c.index_valid = true;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        c.index = i;
        PG_TRY(parse_kv(&c, &f->kv[i]));
    }
    PG_TRY(build_index(path, "metadata key", f->n_kv, kv_key_at, f->kv, &fi->kv_sorted));
    PG_TRY(read_alignment(fi, &f->alignment));

    c.what = "tensor info";
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        c.index = i;
        PG_TRY(parse_tensor_info(&c, f->alignment, &f->tensors[i]));
    }
    PG_TRY(build_index(path, "tensor name", f->n_tensors, tensor_name_at, f->tensors, &fi->t_sorted));

    // The data section starts at the next multiple of the alignment. With no
    // tensors a file may end before that point; otherwise every tensor's
    // bytes must lie inside the file.
    uint64_t pos = c.pos, rem = pos % f->alignment;
    uint64_t pad = rem ? f->alignment - rem : 0;
    f->data_offset = pad > UINT64_MAX - pos ? UINT64_MAX : pos + pad;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t size = f->file.size;
        bool ok = f->data_offset <= size && t->offset <= size - f->data_offset &&
                  t->nbytes <= size - f->data_offset - t->offset;
        if (!ok) {
            char nb[128];
            return pg_err_set(PG_EFORMAT,
                              "%s: tensor '%s' data [offset %" PRIu64 ", %" PRIu64 " bytes] past end of file "
                              "(size %zu, data section at %" PRIu64 ")",
                              path, str_fmt(t->name, nb), t->offset, t->nbytes, f->file.size, f->data_offset);
        }
        t->data = f->file.data + f->data_offset + t->offset;
    }
    return 0;
}

// Frees what gguf_parse allocated; `fi` itself and the mapping too.
static void gguf_free(gguf_impl *fi) {
    if (!fi) return;
    gguf_file *f = &fi->pub;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) free((void *)f->kv[i].arr_str_offsets);
    free(f->kv);
    free(f->tensors);
    free(fi->kv_sorted);
    free(fi->t_sorted);
    pg_mapped_file_close(&f->file);
    free(f->path);
    free(fi);
}

static gguf_impl *gguf_alloc(const char *path) {
    gguf_impl *fi = calloc(1, sizeof *fi);
    if (!fi) return NULL;
    fi->pub.file.fd = -1;
    fi->pub.path = strdup(path);
    if (!fi->pub.path) {
        free(fi);
        return NULL;
    }
    return fi;
}

int gguf_open_memory(const void *buf, size_t size, const char *name, gguf_file **out) {
    *out = NULL;
    const char *path = name ? name : "<memory>";
    gguf_impl *fi = gguf_alloc(path);
    if (!fi) return pg_err_set(PG_ENOMEM, "%s: out of memory", path);
    pg_mapped_file_borrow(&fi->pub.file, buf, size);
    int rc = gguf_parse(fi);
    if (rc < 0) {
        gguf_free(fi);
        return rc;
    }
    *out = &fi->pub;
    return 0;
}

int gguf_open(const char *path, gguf_file **out) {
    *out = NULL;
    int rc;
    gguf_impl *fi = gguf_alloc(path);
    if (!fi) return pg_err_set(PG_ENOMEM, "%s: out of memory", path);
    gguf_file *f = &fi->pub;

    rc = pg_mapped_file_open(&f->file, path, 4, "GGUF (bad magic)");
    if (rc < 0) goto fail;
    rc = gguf_parse(fi);
    if (rc < 0) goto fail;
    *out = f;
    return 0;
fail:
    gguf_free(fi);
    return rc;
}

void gguf_close(gguf_file *f) {
    if (f) gguf_free((gguf_impl *)f);
}

// --- lookups ------------------------------------------------------------------------

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    const gguf_impl *fi = (const gguf_impl *)f;
    uint64_t i = name_ref_find(fi->kv_sorted, f->n_kv, key);
    return i == UINT64_MAX ? NULL : &f->kv[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    const gguf_impl *fi = (const gguf_impl *)f;
    uint64_t i = name_ref_find(fi->t_sorted, f->n_tensors, name);
    return i == UINT64_MAX ? NULL : &f->tensors[i];
}

static const gguf_kv *find_or_err(const gguf_file *f, const char *key) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) pg_err_set(PG_ENOTFOUND, "%s: metadata key '%s' not found", f->path, key);
    return kv;
}

static int wrong_type(const gguf_file *f, const char *key, gguf_type t, const char *want) {
    return pg_err_set(PG_EFORMAT, "%s: metadata '%s' has type %s, expected %s", f->path, key, gguf_type_name(t),
                      want);
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out) {
    const gguf_kv *kv = find_or_err(f, key);
    if (!kv) return PG_ENOTFOUND;
    if (is_unsigned(kv->type)) {
        *out = kv->v.u64;
        return 0;
    }
    if (is_signed(kv->type)) {
        if (kv->v.i64 < 0)
            return pg_err_set(PG_EFORMAT, "%s: metadata '%s' is %" PRId64 ", expected a value >= 0", f->path, key,
                              kv->v.i64);
        *out = (uint64_t)kv->v.i64;
        return 0;
    }
    return wrong_type(f, key, kv->type, "an integer");
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = find_or_err(f, key);
    if (!kv) return PG_ENOTFOUND;
    if (is_signed(kv->type)) {
        *out = kv->v.i64;
        return 0;
    }
    if (is_unsigned(kv->type)) {
        if (kv->v.u64 > INT64_MAX)
            return pg_err_set(PG_EFORMAT, "%s: metadata '%s' is %" PRIu64 ", too large for int64", f->path, key,
                              kv->v.u64);
        *out = (int64_t)kv->v.u64;
        return 0;
    }
    return wrong_type(f, key, kv->type, "an integer");
}

int gguf_get_f64(const gguf_file *f, const char *key, double *out) {
    const gguf_kv *kv = find_or_err(f, key);
    if (!kv) return PG_ENOTFOUND;
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) *out = kv->v.f64;
    else if (is_unsigned(kv->type)) *out = (double)kv->v.u64;
    else if (is_signed(kv->type)) *out = (double)kv->v.i64;
    else return wrong_type(f, key, kv->type, "a number");
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out) {
    const gguf_kv *kv = find_or_err(f, key);
    if (!kv) return PG_ENOTFOUND;
    if (kv->type != GGUF_TYPE_BOOL) return wrong_type(f, key, kv->type, "bool");
    *out = kv->v.u64 != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, char **out) {
    const gguf_kv *kv = find_or_err(f, key);
    if (!kv) return PG_ENOTFOUND;
    if (kv->type != GGUF_TYPE_STRING) return wrong_type(f, key, kv->type, "string");
    gguf_str s = kv->v.str;
    if (s.len && memchr(s.ptr, '\0', (size_t)s.len))
        return pg_err_set(PG_EFORMAT, "%s: metadata '%s' contains a NUL byte", f->path, key);
    char *r = malloc((size_t)s.len + 1);
    if (!r) return pg_err_set(PG_ENOMEM, "%s: out of memory copying '%s' (%" PRIu64 " bytes)", f->path, key, s.len);
    if (s.len) memcpy(r, s.ptr, (size_t)s.len);
    r[s.len] = '\0';
    *out = r;
    return 0;
}

gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i) {
    gguf_str none = {NULL, 0};
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING || !kv->arr_str_offsets ||
        i >= kv->arr_count)
        return none;
    const uint8_t *p = kv->arr_data + kv->arr_str_offsets[i];
    return (gguf_str){(const char *)p + 8, le64(p)};
}

// Checks that kv is an array of a numeric type holding element i.
static int arr_elem(const gguf_kv *kv, uint64_t i, const uint8_t **p) {
    if (!kv || kv->type != GGUF_TYPE_ARRAY) return pg_err_set(PG_EINVAL, "gguf: not an array");
    size_t es = type_size(kv->arr_type);
    if (es == 0)
        return pg_err_set(PG_EFORMAT, "gguf: array '%.*s' has %s elements, expected numbers",
                          (int)(kv->key.len > 80 ? 80 : kv->key.len), kv->key.ptr, gguf_type_name(kv->arr_type));
    if (i >= kv->arr_count)
        return pg_err_set(PG_EINVAL, "gguf: index %" PRIu64 " out of range for array of %" PRIu64, i,
                          kv->arr_count);
    *p = kv->arr_data + i * es;
    return 0;
}

int gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out) {
    const uint8_t *p = NULL;
    PG_TRY(arr_elem(kv, i, &p));
    gguf_kv tmp = {0};
    if (kv->arr_type == GGUF_TYPE_FLOAT32 || kv->arr_type == GGUF_TYPE_FLOAT64 || kv->arr_type == GGUF_TYPE_BOOL)
        return pg_err_set(PG_EFORMAT, "gguf: array has %s elements, expected integers", gguf_type_name(kv->arr_type));
    decode_scalar(kv->arr_type, p, &tmp);
    if (is_signed(kv->arr_type)) {
        *out = tmp.v.i64;
        return 0;
    }
    if (tmp.v.u64 > INT64_MAX)
        return pg_err_set(PG_EFORMAT, "gguf: array element %" PRIu64 " is %" PRIu64 ", too large for int64", i,
                          tmp.v.u64);
    *out = (int64_t)tmp.v.u64;
    return 0;
}

int gguf_arr_f64(const gguf_kv *kv, uint64_t i, double *out) {
    const uint8_t *p = NULL;
    PG_TRY(arr_elem(kv, i, &p));
    gguf_kv tmp = {0};
    decode_scalar(kv->arr_type, p, &tmp);
    if (kv->arr_type == GGUF_TYPE_FLOAT32 || kv->arr_type == GGUF_TYPE_FLOAT64) *out = tmp.v.f64;
    else if (is_signed(kv->arr_type)) *out = (double)tmp.v.i64;
    else if (kv->arr_type == GGUF_TYPE_BOOL)
        return pg_err_set(PG_EFORMAT, "gguf: array has bool elements, expected numbers");
    else *out = (double)tmp.v.u64;
    return 0;
}

bool gguf_str_eq(gguf_str s, const char *z) {
    size_t n = strlen(z);
    return s.len == n && (n == 0 || memcmp(s.ptr, z, n) == 0);
}
