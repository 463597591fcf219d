// engine/gguf.h - GGUF v2/v3 reader over a read-only mmap.
//
// Every count, offset and size read from the file is bounds-checked before
// use; a malformed file yields PG_EFORMAT (or PG_EUNSUPP for an unknown
// tensor type) with a message naming the file and the reason. Strings and
// tensor data point into the mapping and live as long as the gguf_file.
#pragma once
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
    // Scalars are decoded here (integers widened, bools as 0/1).
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        gguf_str str;
    } v;
    // Arrays: element type, count and a pointer to the raw elements in the
    // mapping. String arrays are walked with gguf_arr_str (each element is a
    // length-prefixed string, so they cannot be indexed directly).
    gguf_type arr_type;
    uint64_t arr_count;
    const uint8_t *arr_data;
    const uint32_t *arr_str_offsets; // string arrays: offset of element i
                                     // from arr_data (built at open)
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t dims[4];       // dims[0] is the innermost (contiguous) dimension
    uint32_t type;          // a pg_dtype value (engine/dtype.h)
    uint64_t offset;        // relative to the data section
    uint64_t nbytes;
    const void *data;       // into the mapping, aligned to the file alignment
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    int fd;
    const uint8_t *map;
    size_t map_size;
    uint32_t version;
    uint64_t alignment;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;            // [n_kv]
    gguf_tensor *tensors;   // [n_tensors]
    uint64_t data_offset;   // start of the tensor data section
} gguf_file;

// Maps and parses `path`. On failure returns a negative code, sets the error
// message ("PATH: reason") and leaves *out NULL.
int gguf_open(const char *path, gguf_file **out);

// Parses an in-memory image (fuzzing, tests); `buf` must outlive the file.
int gguf_open_memory(const void *buf, size_t size, const char *name, gguf_file **out);

void gguf_close(gguf_file *f);

// Lookup by key; NULL when absent.
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
