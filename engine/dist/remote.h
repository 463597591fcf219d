// engine/dist/remote.h - the control link of a multi-node tensor-parallel group.
//
// Node 0 runs the HTTP server, the scheduler and its share of the ranks;
// nodes 1..n-1 run only their ranks (`paged serve --nnodes N --node-rank R
// --master-addr A --master-port P`, the same model and flags). Node 0
// listens on the master port; each other node connects and says who it is
// (node rank, node count, tensor-parallel size, this build's id, and the
// configuration every node must share: engine/dist/node_config.h), and
// node 0 answers once all have come with a blob (the NCCL unique id on
// GPUs), or refuses one whose hello differs from its own with a line
// naming what differs (which the follower exits with too). Then node 0's executor sends every call (create runners, memory,
// allocate KV, begin a step with its plan, end it, quit) to the other
// nodes and collects one reply from each: a status, and a payload or the
// error message. The collectives themselves do not go here: NCCL, or the
// tcp communicator (kernels/comm/comm.h) on master port + 1.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/dist/node_config.h"
#include "engine/dist/plan_wire.h"

typedef struct pg_remote_opts {
    int32_t nnodes, node_rank, tp;
    const char *master_addr; // NULL: 127.0.0.1
    int32_t master_port;
    int32_t timeout_ms; // for the set-up (0: 300 s); steps wait as long as they take
    // What must match across nodes (the hello carries it; node 0 compares);
    // NULL: all zeros.
    const pg_node_config *config;
} pg_remote_opts;

enum {
    PG_REMOTE_RUNNERS = 1, // payload: pg_runner_config
    PG_REMOTE_MEM,         // reply: the node's ranks' pg_runner_mem
    PG_REMOTE_ALLOC_KV,    // payload: int32 n_blocks, n_host_blocks
    PG_REMOTE_BEGIN,       // payload: plan_wire plan + masks
    PG_REMOTE_END,         // reply: int32 n, then n sampled tokens
    PG_REMOTE_QUIT,
    PG_REMOTE_LORA,        // payload: int32 slot, then the adapter directory (none: empty the slot)
};

// Node 0's side: one link per other node.
typedef struct pg_remote {
    int32_t n; // other nodes
    int fds[64];
} pg_remote;

// Node 0: accepts the other nodes and sends each `blob` (blob_len bytes).
int pg_remote_leader_open(const pg_remote_opts *o, const void *blob, size_t blob_len, pg_remote *out);
void pg_remote_close(pg_remote *r);
// Sends one call to every other node.
int pg_remote_send(pg_remote *r, uint32_t op, const void *payload, size_t len);
// One reply from every other node: replies[i] gets node i + 1's payload
// (replies may be NULL); a node's error becomes "node N: message" (the
// first node's, or a later one's own failure over a collective's echo of it).
// timeout_ms >= 0 bounds the wait for each node's reply ("node N sent no
// reply for X s"; the link is then out of step: for a call that already
// failed here), < 0 waits as long as the call takes.
int pg_remote_collect(pg_remote *r, pg_wbuf *replies, int timeout_ms);

// Nodes 1..n-1: connects to node 0, says who it is, receives the blob.
int pg_remote_follower_open(const pg_remote_opts *o, void *blob, size_t blob_len, int *fd_out);
// The next call from node 0 (payload into *payload, reset first).
int pg_remote_recv_call(int fd, uint32_t *op, pg_wbuf *payload);
// The reply to it: rc < 0 sends the message of this thread's error.
int pg_remote_reply(int fd, int rc, const void *payload, size_t len);
