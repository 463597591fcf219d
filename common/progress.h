// common/progress.h - a one-line progress bar for long start-up work
// (reading and uploading weights).
//
// On a terminal one line on the stream is redrawn in place ("\r" + the
// line), at most every PG_PROGRESS_PERIOD_NS, and finished with a newline:
//
//   loading weights  [#######.....]  8.1/16.1 GB  2.3 GB/s
//
// Not on a terminal (a log file, a pipe) nothing is drawn; the caller logs
// its one summary line from pg_progress_end's figures either way.
// Single-threaded: one owner updates it.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PG_PROGRESS_PERIOD_NS ((int64_t)100000000) // 10 redraws a second at most
#define PG_PROGRESS_CELLS 24                       // characters between the brackets

typedef struct pg_progress {
    const char *label;  // borrowed
    FILE *out;          // NULL: never draws
    bool draw;          // out is a terminal
    int64_t total;      // bytes expected (0: unknown, no bar fraction)
    int64_t done;       // bytes so far
    int64_t items;      // things counted by the caller (tensors)
    int64_t t0_ns;      // pg_progress_begin's time
    int64_t drawn_ns;   // last redraw (0: never)
    int last_len;       // characters of the last line drawn (to blank a shorter one)
} pg_progress;

// Starts; draws on `out` only when it is a terminal (isatty).
void pg_progress_begin(pg_progress *p, const char *label, int64_t total_bytes, FILE *out);

// Counts `bytes` and `items` more; redraws when the period has passed.
void pg_progress_add(pg_progress *p, int64_t bytes, int64_t items);

// The final redraw and a newline (terminal only). Returns the seconds since
// begin, for the caller's summary line.
double pg_progress_end(pg_progress *p);

// The bar line for `done` of `total` bytes at `now_ns`, without "\r" or a
// newline, into buf (always terminated); returns its length. Pure: what
// the tests check.
size_t pg_progress_render(const pg_progress *p, int64_t now_ns, char *buf, size_t cap);
