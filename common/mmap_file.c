// common/mmap_file.c - mapping a whole model file read-only.
#include "common/mmap_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

int pg_mmap_file(const char *path, size_t min_size, const char *what, int *fd, const void **map,
                 size_t *size) {
    *fd = -1;
    *map = NULL;
    *size = 0;
    int rc;
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return pg_err_set(errno == ENOENT ? PG_ENOTFOUND : PG_EIO, "%s: cannot open: %s", path,
                          strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0) {
        rc = pg_err_set(PG_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = pg_err_set(PG_EINVAL, "%s: not a regular file", path);
        goto fail;
    }
    if ((size_t)st.st_size < min_size) {
        rc = pg_err_set(PG_EFORMAT, "%s: file of %lld bytes is too small to be %s", path,
                        (long long)st.st_size, what);
        goto fail;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, f, 0);
    if (m == MAP_FAILED) {
        rc = pg_err_set(PG_EIO, "%s: mmap of %lld bytes failed: %s", path, (long long)st.st_size,
                        strerror(errno));
        goto fail;
    }
    *fd = f;
    *map = m;
    *size = (size_t)st.st_size;
    return 0;
fail:
    close(f);
    return rc;
}

void pg_mmap_file_close(int fd, const void *map, size_t size) {
    if (map) munmap((void *)map, size);
    if (fd >= 0) close(fd);
}

int pg_mapped_file_open(pg_mapped_file *m, const char *path, size_t min_size, const char *what) {
    const void *map;
    *m = (pg_mapped_file){.fd = -1};
    int rc = pg_mmap_file(path, min_size, what, &m->fd, &map, &m->size);
    if (rc < 0) return rc;
    m->data = map;
    m->owned = true;
    return 0;
}

void pg_mapped_file_borrow(pg_mapped_file *m, const void *buf, size_t size) {
    *m = (pg_mapped_file){.data = buf, .size = buf ? size : 0, .fd = -1};
}

void pg_mapped_file_close(pg_mapped_file *m) {
    if (m->owned) pg_mmap_file_close(m->fd, m->data, m->size);
    *m = (pg_mapped_file){.fd = -1};
}
