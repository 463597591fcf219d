// engine/engine_int.h - the engine's state, shared by engine.c (the engine
// thread and its queues) and setup.c (device choice, model, KV sizing, the
// memory log). Internal.
#pragma once
#include <pthread.h>
#include <stdbool.h>

#include "engine/engine.h"
#include "engine/runner.h"

// A submission: a new request, an abort or an early finish of one sequence.
typedef enum { SUB_ADD, SUB_ABORT, SUB_FINISH_SEQ } sub_kind;

typedef struct sub {
    sub_kind kind;
    int64_t id;
    int32_t seq_index;
    pg_gen_request req;   // SUB_ADD: prompt points to memory owned by the sub
    struct sub *next;
} sub;

// Per live request on the engine side: the submitter's pointer.
typedef struct live {
    int64_t id;
    void *user;
    struct live *next;
} live;

#define LIVE_BUCKETS 1024

struct pg_engine {
    pg_engine_config cfg;
    pg_backend *backend;
    pg_model *model;
    pg_tokenizer *tok;
    pg_chat_template *chat;
    pg_runner *runner;
    sched *sched;
    bool async;                  // plan step N + 1 while step N runs (sched.h, async scheduling)
    int32_t max_model_len;
    int32_t kv_blocks;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    sub *subs_head, *subs_tail;  // guarded by mu
    int64_t next_id;             // guarded by mu

    // Events published by the engine thread, drained by pg_engine_poll.
    pthread_mutex_t ev_mu;
    pg_gen_event *events;
    int n_events, cap_events, ev_head;
    pg_engine_notify_fn notify;
    void *notify_ctx;

    live *live[LIVE_BUCKETS];    // engine thread only

    pthread_mutex_t stats_mu;
    pg_engine_stats stats;
    int64_t mem_polled_ns; // engine thread: when device memory was last read
    int64_t last_end_ns;   // engine thread: when the last step was finished (busy time)
};

// setup.c: everything pg_engine_create does before the thread starts.
int eng_setup(pg_engine *e);
// setup.c: device memory into e->stats (engine thread or set-up).
void eng_stats_memory(pg_engine *e, const pg_runner_mem *m);
