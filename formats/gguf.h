// formats/gguf.h - GGUF v2/v3 reader over a read-only mmap.
//
// Every count, offset and size read from the file is bounds-checked before
// use; a malformed file yields PG_EFORMAT (or PG_EUNSUPP for an unknown
// tensor type) with a message naming the file and the reason. Strings and
// tensor data point into the mapping and live as long as the gguf_file.
#pragma once
#include "common/mmap_file.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Metadata value types, numbered as in the GGUF specification.
typedef enum {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
} gguf_type;

// A string inside the mapping: not NUL-terminated.
typedef struct {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str key;
    gguf_type type;
    // Scalars are decoded here: unsigned types and bool (0/1) in u64, signed
    // types in i64, f32/f64 in f64, strings in str (into the mapping).
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        gguf_str str;
    } v;
    // Arrays: element type, count and a pointer to the raw elements in the
    // mapping. String arrays are walked with gguf_arr_str (each element is a
    // length-prefixed string, so they cannot be indexed directly). Arrays of
    // arrays are accepted and validated but left opaque (arr_type ARRAY,
    // arr_data at the raw bytes, no getter). Zero for non-array values.
    gguf_type arr_type;
    uint64_t arr_count;
    const uint8_t *arr_data;
    const uint32_t *arr_str_offsets; // string arrays: offset of element i
                                     // from arr_data (built at open)
} gguf_kv;

typedef struct {
    gguf_str name;          // into the mapping; unique within the file
    uint32_t n_dims;        // 0..4 (0: a scalar)
    uint64_t dims[4];       // dims[0] is the innermost (contiguous) dimension;
                            // dims[n_dims..3] are 1. Each <= INT64_MAX and
                            // their product <= INT64_MAX; dims[0] is a
                            // multiple of the type's block size.
    uint32_t type;          // a pg_dtype value (kernels/dtype.h); always one
                            // with a dequantizer (others fail at open)
    uint64_t offset;        // relative to the data section, a multiple of
                            // the file alignment
    uint64_t nbytes;        // pg_dtype_row_bytes(type, dims[0]) * dims[1..3]
    const void *data;       // into the mapping, aligned to the file alignment
                            // (relative to the start of the image); the
                            // nbytes at data lie inside the file
} gguf_tensor;

// Everything below is owned by the gguf_file and read-only for callers; the
// file (and so every pointer into the mapping) lives until gguf_close.
typedef struct gguf_file {
    char *path;             // as given to gguf_open (or the memory name)
    pg_mapped_file file;    // the whole file mapped (or the memory image read in its place)
    uint32_t version;       // 2 or 3
    uint64_t alignment;     // general.alignment or 32; a power of two
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;            // [n_kv] in file order; keys are unique
    gguf_tensor *tensors;   // [n_tensors] in file order; names are unique
    uint64_t data_offset;   // start of the tensor data section (aligned; may
                            // be past the end of the file when n_tensors == 0)
} gguf_file;

// Maps and parses `path`. On failure returns a negative code, sets the error
// message ("PATH: reason") and leaves *out NULL: PG_ENOTFOUND (no such file),
// PG_EIO (open/mmap failed), PG_EFORMAT (malformed), PG_EUNSUPP (GGUF v1,
// big-endian, unknown or unsupported tensor type), PG_ENOMEM.
// The file must not be truncated by someone else while mapped (SIGBUS).
int gguf_open(const char *path, gguf_file **out);

// Parses an in-memory image (fuzzing, tests); `buf` must outlive the file and
// is not copied. `name` (NULL: "<memory>") stands for the path in messages.
int gguf_open_memory(const void *buf, size_t size, const char *name, gguf_file **out);

// Unmaps and frees everything; pointers into the file become invalid. NULL ok.
void gguf_close(gguf_file *f);

// Lookup by key (binary search, O(log n)); NULL when absent.
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

// Typed getters: return PG_ENOTFOUND when absent, PG_EFORMAT when the value
// has an incompatible type (any integer type converts to another when it fits).
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f64(const gguf_file *f, const char *key, double *out);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out);
// Copies into a new NUL-terminated malloc'd string owned by the caller.
int gguf_get_str(const gguf_file *f, const char *key, char **out);

// Element i of a string array (bounds-checked; {NULL,0} when out of range).
gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i);
// Element i of a numeric array, converted: integer element types for
// gguf_arr_i64 (PG_EFORMAT for floats, bools and u64 values above INT64_MAX),
// integer or float element types for gguf_arr_f64. PG_EINVAL when kv is not
// an array or i is out of range. Elements are unaligned in the mapping, so
// use these (or memcpy) rather than casting arr_data.
int gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out);
int gguf_arr_f64(const gguf_kv *kv, uint64_t i, double *out);

// "u32", "string", ... for messages; "unknown" out of range.
const char *gguf_type_name(gguf_type t);
// True when `s` equals the NUL-terminated `z`.
bool gguf_str_eq(gguf_str s, const char *z);
