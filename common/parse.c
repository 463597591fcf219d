// common/parse.c - numbers and sizes from command-line text.
#include "common/parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "common/err.h"

int pg_parse_bytes(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || !isfinite(v))
        return pg_err_set(PG_EINVAL, "'%s' is not a size", s);
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end || v * mul > 9e18) return pg_err_set(PG_EINVAL, "'%s' is not a size", s);
    *out = (int64_t)(v * mul);
    return 0;
}

int pg_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return pg_err_set(PG_EINVAL, "'%s' is not an integer in [%lld, %lld]", s, (long long)lo,
                          (long long)hi);
    *out = v;
    return 0;
}

int pg_parse_float(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi))
        return pg_err_set(PG_EINVAL, "'%s' is not a number in [%g, %g]", s, lo, hi);
    *out = v;
    return 0;
}

