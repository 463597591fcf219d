// engine/dist/plan_wire.h - a step plan (its token masks included) as bytes, for the
// nodes of a multi-node tensor-parallel group (engine/dist/remote.h): node 0's
// scheduler makes the plan, every node's ranks run it.
//
// The encoding is this build's own (host byte order, the structs' fields
// one by one): every node runs the same binary, which the hello checks.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "scheduler/plan.h"

// A growing byte buffer.
typedef struct pg_wbuf {
    uint8_t *data;
    size_t len, cap;
} pg_wbuf;
void pg_wbuf_put(pg_wbuf *b, const void *p, size_t n);
void pg_wbuf_free(pg_wbuf *b);

// Appends `plan`, its sequences' token masks included (pg_plan_seq.mask).
void pg_plan_encode(pg_wbuf *b, const pg_batch_plan *plan);

// A decoded plan: every pointer inside points into this struct's arrays.
typedef struct pg_plan_decoded {
    pg_batch_plan plan;
    void *mem; // one allocation holding everything
} pg_plan_decoded;
// PG_EFORMAT when the bytes are not a whole plan.
int pg_plan_decode(const uint8_t *data, size_t len, pg_plan_decoded *out);
void pg_plan_decoded_free(pg_plan_decoded *d);
