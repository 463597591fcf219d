// tests/unit/gguf_writer.h - test support: build GGUF images in memory, write
// scratch files, find repository data files.
//
// Linked into every unit test (tools/gen_build.py). Everything aborts on
// misuse or allocation failure: this is test code. Names are prefixed tw_.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// --- growable byte buffer ------------------------------------------------------

typedef struct {
    uint8_t *data;
    size_t len, cap;
} tw_buf;

void tw_buf_free(tw_buf *b);
void tw_put(tw_buf *b, const void *p, size_t n);
void tw_u8(tw_buf *b, uint8_t v);
void tw_u16(tw_buf *b, uint16_t v);
void tw_u32(tw_buf *b, uint32_t v);
void tw_u64(tw_buf *b, uint64_t v);
void tw_f32(tw_buf *b, float v);
void tw_f64(tw_buf *b, double v);
// A GGUF string: u64 length + bytes (no NUL).
void tw_gstr(tw_buf *b, const char *s);
// Zero bytes up to the next multiple of `align`.
void tw_pad(tw_buf *b, size_t align);
// Overwrites 4 or 8 bytes at `off` (little-endian).
void tw_patch_u32(tw_buf *b, size_t off, uint32_t v);
void tw_patch_u64(tw_buf *b, size_t off, uint64_t v);

// --- GGUF builder ------------------------------------------------------------------

// Metadata and tensors are added in order and serialized by tw_gguf_finish:
// header, metadata, tensor infos, padding to the alignment, tensor data
// (each tensor's bytes padded to the alignment, as gguf-py writes them).
typedef struct tw_gguf tw_gguf;

// `version` goes into the header unchecked (tests write 1, 2, 3, 4...).
tw_gguf *tw_gguf_new(uint32_t version);

// A metadata entry whose value bytes are `val` (already encoded) of type
// `type` (a gguf_type number, unchecked).
void tw_gguf_kv_raw(tw_gguf *g, const char *key, uint32_t type, const void *val, size_t n);
void tw_gguf_kv_u8(tw_gguf *g, const char *key, uint8_t v);
void tw_gguf_kv_i8(tw_gguf *g, const char *key, int8_t v);
void tw_gguf_kv_u16(tw_gguf *g, const char *key, uint16_t v);
void tw_gguf_kv_i16(tw_gguf *g, const char *key, int16_t v);
void tw_gguf_kv_u32(tw_gguf *g, const char *key, uint32_t v);
void tw_gguf_kv_i32(tw_gguf *g, const char *key, int32_t v);
void tw_gguf_kv_u64(tw_gguf *g, const char *key, uint64_t v);
void tw_gguf_kv_i64(tw_gguf *g, const char *key, int64_t v);
void tw_gguf_kv_f32(tw_gguf *g, const char *key, float v);
void tw_gguf_kv_f64(tw_gguf *g, const char *key, double v);
void tw_gguf_kv_bool(tw_gguf *g, const char *key, bool v);
void tw_gguf_kv_str(tw_gguf *g, const char *key, const char *v);
// An array of `count` fixed-size elements of `elem_type`, `elem_size` bytes
// each, copied from `elems` (host order = little-endian on x86).
void tw_gguf_kv_arr(tw_gguf *g, const char *key, uint32_t elem_type, const void *elems, uint64_t count,
                    size_t elem_size);
void tw_gguf_kv_arr_str(tw_gguf *g, const char *key, const char *const *strs, uint64_t count);

// Sets general.alignment (a u32 metadata entry) and uses it for the layout.
void tw_gguf_alignment(tw_gguf *g, uint32_t align);

// A tensor: dims innermost first, `type` a GGML type number, `nbytes` bytes
// of data copied from `data` (may be NULL: zeros). The header offset is
// computed from the layout unless `offset_override` != UINT64_MAX.
void tw_gguf_tensor(tw_gguf *g, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *dims,
                    const void *data, size_t nbytes);
void tw_gguf_tensor_at(tw_gguf *g, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *dims,
                       const void *data, size_t nbytes, uint64_t offset_override);

// Serializes the file and frees the builder. If `infos_end` is not NULL it
// receives the offset just past the tensor infos (before padding).
tw_buf tw_gguf_finish(tw_gguf *g, size_t *infos_end);

// --- files ----------------------------------------------------------------------------

// A fresh scratch directory (mkdtemp under $TMPDIR or /tmp), into `out`.
void tw_tmpdir(char *out, size_t cap);
// Writes `n` bytes to `path` (truncating); aborts on failure.
void tw_write_file(const char *path, const void *data, size_t n);
// Removes a scratch directory and the files in it (one level).
void tw_rmdir(const char *dir);
// Resolves `rel` (e.g. "tests/data/x.bin") against the repository root: the
// current directory when `rel` exists there, else the directories above the
// test executable. Returns false (and leaves `rel` in out) when not found.
bool tw_repo_path(const char *rel, char *out, size_t cap);
