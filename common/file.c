// common/file.c - small whole-file helpers.
#include "common/file.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"

int pg_read_file(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return pg_err_set(PG_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return pg_err_set(PG_EIO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        fclose(f);
        return pg_err_set(PG_EINVAL, "%s: %lld bytes is over the %zu byte limit", path,
                          (long long)st.st_size, max_bytes);
    }
    char *buf = pg_xmalloc((size_t)st.st_size + 1);
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (n != (size_t)st.st_size) {
        free(buf);
        return pg_err_set(PG_EIO, "%s: short read", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

bool pg_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool pg_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *pg_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = pg_xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}
