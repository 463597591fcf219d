// kernels/backend_prof.h - where a step's device time goes, op by op
// (PAGED_PROFILE_OPS=1; docs/profiling.md).
//
// pg_backend_prof_wrap puts a profiling layer between a backend and its
// callers: every op, upload, swap and graph launch first stamps the compute
// timeline (dev->timer_mark, a ring of stamps: a CUDA event; the clock on
// the CPU), and so do the end of a step (dev->record) and a sync. Where the
// caller waits for the device anyway (dev->wait for a recorded step,
// dev->sync, read_f32) the stamps known to be complete are read back and
// the time between consecutive stamps is charged to the op that follows
// the first: the op's device time plus any wait for the host to issue the
// next one. The interval from a step's end to the next op issued is "idle
// (nothing queued)": the device had no work. No synchronization is added
// to a step (only the stamps, which keep CUDA's programmatic dependent
// launch from overlapping two kernels), and under async scheduling the
// next step may already be queued when one is read back. Ops issued while
// a graph is captured are not stamped: a replay counts as one "graph" op
// (run with --cuda-graphs off to see decode steps op by op).
//
// Ops are grouped by what they do and, for linear layers, by the weight's
// shape and type ("linear 28672x4096 fp8_e4m3"); attention by whether the
// step is decode only. The table (calls, total ms, share, mean us, mean
// rows) goes to the log when the backend is destroyed, or on demand.
#pragma once
#include <stdbool.h>

#include "kernels/backend.h"

// Whether PAGED_PROFILE_OPS asks for profiling (set and not "0").
bool pg_backend_prof_wanted(void);

// Wraps `be` in place (its tables are replaced; destroying it reports and
// unwraps). PG_EUNSUPP when the backend has no timer.
int pg_backend_prof_wrap(pg_backend *be);

// Logs the table so far (PG_LOGI lines) for a wrapped backend, after
// waiting for what was issued; returns the milliseconds of timeline
// charged (ops and idle), or -1 when `be` is not wrapped.
double pg_backend_prof_report(pg_backend *be);

// Calls charged to op `name` so far (what the table's line says; *ms its
// milliseconds), or -1 when `be` is not wrapped or no such op ran. Tests.
int64_t pg_backend_prof_calls(pg_backend *be, const char *name, double *ms);
