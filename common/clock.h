// common/clock.h - monotonic time.
#pragma once
#include <stdint.h>
#include <time.h>

// Monotonic nanoseconds since an arbitrary origin.
static inline int64_t pg_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline double pg_now_s(void) { return (double)pg_now_ns() * 1e-9; }
