// common/thread_pool.h - a fork-join pool for data-parallel CPU kernels.
//
// The CPU backend dispatches hundreds of small parallel loops per token
// (one per matrix product), so a dispatch must cost microseconds: workers
// spin briefly on a generation counter before sleeping on a condition
// variable. The calling thread takes part in the work.
#pragma once
#include <stdint.h>

typedef struct pg_pool pg_pool;

// Runs task(ctx, i, thread) for every i in [0, n_tasks); `thread` is in
// [0, pg_pool_threads()) and identifies per-thread scratch space.
typedef void (*pg_pool_fn)(void *ctx, int64_t i, int thread);

// n_threads counts the caller; 0 picks the number of online CPUs.
int pg_pool_create(int n_threads, pg_pool **out);
void pg_pool_destroy(pg_pool *p);
int pg_pool_threads(const pg_pool *p);

// Runs all tasks and returns when every one has finished. Tasks are handed
// out dynamically, so uneven tasks balance. Not re-entrant: one caller at a
// time (the engine thread).
void pg_pool_run(pg_pool *p, int64_t n_tasks, pg_pool_fn fn, void *ctx);
