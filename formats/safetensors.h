// formats/safetensors.h - Hugging Face safetensors reader over a read-only mmap,
// and a sharded-model view (model.safetensors.index.json).
//
// File layout: u64 little-endian header length N | N bytes of JSON | data.
// The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin,
// end)} with offsets relative to the start of the data section;
// "__metadata__" (string -> string) is ignored.
//
// Every length and offset is checked before use: the header length against
// PG_ST_MAX_HEADER and the file size, each tensor's [begin, end) against the
// data section and against shape x dtype size. A malformed file yields
// PG_EFORMAT and an unsupported dtype PG_EUNSUPP, with a message naming the
// file (and the tensor). Tensor data points into the mapping and lives as
// long as the pg_st_file.
#pragma once
#include "common/mmap_file.h"
#include <stddef.h>
#include <stdint.h>

// Largest JSON header accepted (the reference implementation's limit).
#define PG_ST_MAX_HEADER (100u * 1000u * 1000u)
// Largest tensor rank accepted.
#define PG_ST_MAX_DIMS 8

// Dimension order: safetensors (like PyTorch) lists the shape outermost
// first, GGUF innermost first. A pg_st_tensor has both:
//   shape[i]: the file's order, shape[n_dims-1] contiguous  (torch .shape)
//   dims[i]:  reversed, dims[0] contiguous                    (GGUF order)
// so a [vocab, hidden] embedding has shape {vocab, hidden} and
// dims {hidden, vocab}, the same dims a GGUF file would give it.
typedef struct {
    char *name;             // NUL-terminated, owned by the file
    int dtype;              // PG_DTYPE_F32, _F16, _BF16, _FP8_E4M3 or _I32
    uint32_t n_dims;        // 0..PG_ST_MAX_DIMS (0: a scalar)
    uint64_t shape[PG_ST_MAX_DIMS]; // [n_dims] outermost first; rest 1
    uint64_t dims[PG_ST_MAX_DIMS];  // [n_dims] innermost first; rest 1
    uint64_t n_elems;       // product of the dims (<= INT64_MAX)
    uint64_t offset;        // begin, relative to the data section
    uint64_t nbytes;        // end - begin == n_elems * element size
    const void *data;       // into the mapping; NOT necessarily aligned
                            // (the header length need not be a multiple of
                            // the element size): read with memcpy or copy
} pg_st_tensor;

// Everything is owned by the pg_st_file and read-only for callers.
typedef struct pg_st_file {
    char *path;             // as given (or the memory name)
    pg_mapped_file file;    // the whole file mapped (or the memory image read in its place)
    uint64_t header_len;    // N, the JSON length
    uint64_t data_offset;   // 8 + N: start of the data section
    uint64_t n_tensors;
    pg_st_tensor *tensors;  // [n_tensors] in header order; names unique
} pg_st_file;

// Maps and parses `path`. On failure returns a negative code (PG_ENOTFOUND,
// PG_EIO, PG_EFORMAT, PG_EUNSUPP, PG_ENOMEM), sets "PATH: reason" and leaves
// *out NULL. The file must not be truncated while mapped (SIGBUS).
int pg_st_open(const char *path, pg_st_file **out);

// Parses an in-memory image (fuzzing, tests); `buf` must outlive the file and
// is not copied. `name` (NULL: "<memory>") stands for the path in messages.
int pg_st_open_memory(const void *buf, size_t size, const char *name, pg_st_file **out);

// Unmaps and frees everything. NULL ok.
void pg_st_close(pg_st_file *f);

// Lookup by name (binary search); NULL when absent.
const pg_st_tensor *pg_st_find_tensor(const pg_st_file *f, const char *name);

// --- a model made of one or more files ----------------------------------------

typedef struct pg_st_model {
    char *dir;              // as given
    uint32_t n_files;
    pg_st_file **files;     // [n_files] owned; shards sorted by file name
                            // (or the one model.safetensors)
    uint64_t n_tensors;     // over all files
    const pg_st_tensor **tensors; // [n_tensors] sorted by name, pointing
                                  // into files[]
    uint32_t *tensor_file;  // [n_tensors] index into files[] of tensors[i]
} pg_st_model;

// Opens a model directory: when DIR/model.safetensors.index.json exists,
// every shard named in its "weight_map" (plain file names inside DIR; a name
// with '/' or a leading '.' is refused), else DIR/model.safetensors. `dir`
// may also name a single .safetensors file. Every tensor the index lists must
// be in the shard it names; a tensor name found in two shards is an error.
// PG_ENOTFOUND when neither file exists. Caller closes with
// pg_st_model_close.
int pg_st_model_open(const char *dir, pg_st_model **out);

void pg_st_model_close(pg_st_model *m);

// Lookup by name across all shards (binary search); NULL when absent.
// `file_index` (may be NULL) receives the index into m->files.
const pg_st_tensor *pg_st_model_find(const pg_st_model *m, const char *name, uint32_t *file_index);
