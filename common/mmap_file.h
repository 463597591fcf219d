// common/mmap_file.h - mapping a whole model file read-only.
#pragma once
#include <stddef.h>

// Opens and maps `path` (a regular file of at least `min_size` bytes)
// read-only. On failure returns a negative code with a one-line message
// naming the path: cannot open (PG_ENOTFOUND when missing), not a regular
// file, "file of N bytes is too small to be <what>" (PG_EFORMAT), or mmap
// failure. On success *fd, *map and *size describe the mapping; release it
// with pg_mmap_file_close.
int pg_mmap_file(const char *path, size_t min_size, const char *what, int *fd, const void **map,
                 size_t *size);
void pg_mmap_file_close(int fd, const void *map, size_t size);
