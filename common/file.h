// common/file.h - small whole-file helpers.
#pragma once
#include <stdbool.h>
#include <stddef.h>

// Reads a whole file into a malloc'd buffer with a terminating NUL (not
// counted in *len). Fails with PG_EIO naming the path, or PG_EINVAL when
// the file is larger than `max_bytes`.
int pg_read_file(const char *path, size_t max_bytes, char **out, size_t *len);

bool pg_file_exists(const char *path);
bool pg_is_dir(const char *path);

// snprintf into a malloc'd string: pg_path_join("dir", "config.json").
char *pg_path_join(const char *dir, const char *name);
