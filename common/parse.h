// common/parse.h - numbers and sizes from command-line text.
#pragma once
#include <stdint.h>

// A size with an optional K/M/G/T suffix (powers of 1024; "KiB", "KB" and
// "K" alike). PG_EINVAL with a message for anything else.
int pg_parse_bytes(const char *s, int64_t *out);
// A decimal integer in [lo, hi]; PG_EINVAL with a message otherwise.
int pg_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
// A finite number in [lo, hi]; PG_EINVAL with a message otherwise.
int pg_parse_float(const char *s, double lo, double hi, double *out);
