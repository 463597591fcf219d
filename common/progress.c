// common/progress.c - a one-line progress bar (common/progress.h).
#include "common/progress.h"

#include <string.h>
#include <unistd.h>

#include "common/clock.h"

void pg_progress_begin(pg_progress *p, const char *label, int64_t total_bytes, FILE *out) {
    memset(p, 0, sizeof *p);
    p->label = label ? label : "";
    p->out = out;
    p->draw = out && isatty(fileno(out));
    p->total = total_bytes > 0 ? total_bytes : 0;
    p->t0_ns = pg_now_ns();
}

size_t pg_progress_render(const pg_progress *p, int64_t now_ns, char *buf, size_t cap) {
    if (!buf || cap == 0) return 0;
    const double GB = 1e9;
    char bar[PG_PROGRESS_CELLS + 1];
    int full = 0;
    if (p->total > 0) {
        int64_t d = p->done < p->total ? p->done : p->total;
        full = (int)((double)d / (double)p->total * PG_PROGRESS_CELLS);
    }
    for (int i = 0; i < PG_PROGRESS_CELLS; i++) bar[i] = i < full ? '#' : '.';
    bar[PG_PROGRESS_CELLS] = 0;
    const double secs = (double)(now_ns - p->t0_ns) * 1e-9;
    int n;
    if (secs > 0.05) // a rate over less than 50 ms is noise
        n = snprintf(buf, cap, "%s  [%s]  %.1f/%.1f GB  %.1f GB/s", p->label, bar,
                     (double)p->done / GB, (double)p->total / GB, (double)p->done / GB / secs);
    else
        n = snprintf(buf, cap, "%s  [%s]  %.1f/%.1f GB", p->label, bar, (double)p->done / GB,
                     (double)p->total / GB);
    if (n < 0) {
        buf[0] = 0;
        return 0;
    }
    return (size_t)n < cap ? (size_t)n : cap - 1;
}

static void redraw(pg_progress *p, int64_t now) {
    char line[256];
    size_t n = pg_progress_render(p, now, line, sizeof line);
    // Blank what a longer previous line left on the right.
    int pad = p->last_len > (int)n ? p->last_len - (int)n : 0;
    fprintf(p->out, "\r%s%*s", line, pad, "");
    fflush(p->out);
    p->last_len = (int)n;
    p->drawn_ns = now;
}

void pg_progress_add(pg_progress *p, int64_t bytes, int64_t items) {
    p->done += bytes;
    p->items += items;
    if (!p->draw) return;
    int64_t now = pg_now_ns();
    if (p->drawn_ns == 0 || now - p->drawn_ns >= PG_PROGRESS_PERIOD_NS) redraw(p, now);
}

double pg_progress_end(pg_progress *p) {
    int64_t now = pg_now_ns();
    if (p->draw) {
        redraw(p, now);
        fputc('\n', p->out);
        fflush(p->out);
    }
    return (double)(now - p->t0_ns) * 1e-9;
}
