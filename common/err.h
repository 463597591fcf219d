// common/err.h - error codes and a per-thread error message.
//
// Convention (see docs/conventions.md): a function that can fail returns an
// int, 0 on success and a negative PG_E* code on failure, after calling
// pg_err_set() with a one-line human-readable reason. The caller reads the
// reason with pg_err_msg() on the same thread. Broken invariants (bugs, a
// broken device) are not errors: they abort through PG_CHECK.
#pragma once
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    PG_OK = 0,
    PG_EINVAL = -1,   // bad argument or bad input data
    PG_ENOMEM = -2,   // allocation failed
    PG_EIO = -3,      // file or socket I/O failed
    PG_EFORMAT = -4,  // malformed file (bad magic, truncated, out of bounds)
    PG_EUNSUPP = -5,  // valid but unsupported (unknown tensor type, template)
    PG_ENOSPC = -6,   // no room (pool full, queue full): a normal outcome
    PG_ENOTFOUND = -7 // missing key, file or token
};

// Records a printf-style message for this thread and returns `code`, so a
// failure reads `return pg_err_set(PG_EFORMAT, "%s: truncated", path);`.
int pg_err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Prefixes the current message with more context ("loading model: " + old).
int pg_err_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// The last message set on this thread ("" if none). Valid until the next set.
const char *pg_err_msg(void);

// Aborts with file, line and the failing expression: for invariants only.
#define PG_CHECK(cond)                                                         \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
            abort();                                                           \
        }                                                                      \
    } while (0)

// Propagates a negative return code unchanged.
// Argument checks: PG_EINVAL with a message when `cond` does not hold.
#define PG_ARG(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) return pg_err_set(PG_EINVAL, __VA_ARGS__);                \
    } while (0)

#define PG_TRY(expr)                                                           \
    do {                                                                       \
        int pg_try_rc_ = (expr);                                               \
        if (pg_try_rc_ < 0) return pg_try_rc_;                                 \
    } while (0)

// Allocation that aborts on failure: used where running out of host memory
// for small bookkeeping is not recoverable anyway.
void *pg_xmalloc(size_t n);
void *pg_xcalloc(size_t count, size_t size);
void *pg_xrealloc(void *p, size_t n);
char *pg_xstrdup(const char *s);
