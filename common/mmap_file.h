// common/mmap_file.h - mapping a whole model file read-only.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Opens and maps `path` (a regular file of at least `min_size` bytes)
// read-only. On failure returns a negative code with a one-line message
// naming the path: cannot open (PG_ENOTFOUND when missing), not a regular
// file, "file of N bytes is too small to be <what>" (PG_EFORMAT), or mmap
// failure. On success *fd, *map and *size describe the mapping; release it
// with pg_mmap_file_close.
int pg_mmap_file(const char *path, size_t min_size, const char *what, int *fd, const void **map,
                 size_t *size);
void pg_mmap_file_close(int fd, const void *map, size_t size);

// A whole model file mapped read-only, or a caller's buffer read in its
// place (tests, fuzzing): what the GGUF and safetensors readers hold, one
// type for both.
typedef struct pg_mapped_file {
    const uint8_t *data; // [size] the whole file, PROT_READ
    size_t size;
    int fd;              // open read-only while mapped; -1 for a borrowed buffer
    bool owned;          // pg_mapped_file_close unmaps and closes it
} pg_mapped_file;

// pg_mmap_file into *m (same errors); *m is empty (fd -1) on failure.
int pg_mapped_file_open(pg_mapped_file *m, const char *path, size_t min_size, const char *what);
// *m reads buf [size] (NULL: empty), which the caller owns and keeps alive.
void pg_mapped_file_borrow(pg_mapped_file *m, const void *buf, size_t size);
// Unmaps and closes what pg_mapped_file_open opened (nothing for a borrowed
// buffer); *m is empty after.
void pg_mapped_file_close(pg_mapped_file *m);
