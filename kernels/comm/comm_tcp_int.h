// kernels/comm/comm_tcp_int.h - what the TCP communicator's files share and
// nothing outside them includes (kernels/comm/comm.h is the public API):
// the context, the frame, the wire format's constants, and the helpers of
// comm_tcp_io.c. Internal names are tcp_*. The communicator is three files:
//   comm_tcp.c             set-up (listen, accept, connect, the hello and the
//                          welcome), abort, destroy, pg_comm_tcp_create
//   comm_tcp_collectives.c the collectives on rank 0 and on a peer
//   comm_tcp_io.c          encoding, socket I/O with its timeouts, and
//                          breaking the communicator on a failure
//
// The TCP communicator (kernels/comm/comm.h): one rank per call, the ranks
// in any process on any host, a star through rank 0.
//
// Set-up: rank 0 listens and accepts size - 1 connections; each peer sends
// a hello (its rank and the group size), and rank 0 answers every peer
// once all have arrived (or refuses one with the reason, and fails).
//
// A collective: every peer sends a frame header (op, sequence number,
// bytes, dtype, root) and its data; rank 0 reads every header first and
// checks that all ranks call the same collective with the same sizes (a
// different order between ranks is reported instead of mixing up data),
// does the work and answers each peer with a header and the result.
// all_reduce_sum goes in chunks of CHUNK_BYTES in lock step (peers send a
// chunk, rank 0 adds the ranks' chunks in rank order 0..n-1 in f32 and
// rounds once, exactly as kernels/comm/comm_cpu.c does, and sends the sum
// back), so rank 0's scratch memory stays bounded whatever the size.
//
// all_to_all_v goes through rank 0 too: every peer sends its header with
// its size table (what it sends to and expects from each rank); rank 0
// checks every pair (rank s sends rank d what d expects from s, or every
// rank fails naming both and both sizes), answers, and then relays the
// pieces one at a time in (source, destination) order through a
// CHUNK_BYTES buffer. That order is each peer's send order (by
// destination) and each peer's receive order (by source), and a peer
// sends and receives at once (polling its one socket), so neither side of
// a large piece waits on a full socket buffer for the other.
//
// Failure: any socket error or a mismatch breaks the communicator; rank 0
// tells the peers still waiting for its answer why (an error header and a
// message), then shuts every socket down, so no rank waits forever. Every
// later collective fails at once with the first reason. abort (any thread)
// breaks it the same way: shutting the sockets down wakes this rank's
// thread blocked in recv, poll or send, and the other ranks see the
// connection close. While rank 0 waits for the peers' headers it polls
// every peer, so a peer that goes away is noticed whichever peer it is
// waiting for. A wait for a peer that sends nothing is bounded by
// op_timeout_ms (a peer waits a quarter longer for rank 0 than rank 0
// waits for each peer, so rank 0, which sees every rank, normally names the
// silent one and tells the others).
//
// Wire format (little-endian):
//   hello   u32 'PGCH' | u32 version | i32 rank | i32 size
//   answer  u32 'PGCH' | u32 status (0 = welcome) | u32 len | len bytes why
//   header  u32 'PGCF' | u8 op | u8 dtype | u16 status (0, or an error
//           answer's PG_E* code negated) | u32 seq | i32 root
//           | u64 bytes (a request: this rank's payload; an error answer:
//           the length of the message that follows)
#pragma once
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/comm/comm.h"

#define HELLO_MAGIC 0x48434750u // "PGCH"
#define FRAME_MAGIC 0x46434750u // "PGCF"
#define PROTO_VERSION 1u
#define HELLO_BYTES 16
#define HEADER_BYTES 24
#define MAX_RANKS 4096
// Payload per lock-step round of all_reduce_sum: big enough that the
// round trip is small next to the transfer, small enough for rank 0's
// scratch (this, plus twice as much f32 accumulator for bf16).
#define CHUNK_BYTES (1u << 20)
#define MAX_WHY 512
#define DEFAULT_OP_TIMEOUT_MS 300000

typedef struct {
    uint8_t op, dtype;
    uint16_t status;
    uint32_t seq;
    int32_t root;
    uint64_t bytes;
} frame;

typedef struct {
    int32_t rank, size;
    char addr[300]; // "host:port" of rank 0, for messages
    // Rank 0: fds[r] is the socket to rank r (fds[0] unused). A peer:
    // fds[0] is its socket to rank 0.
    int *fds;
    // Rank 0: root_headers' poll set and which peers' headers it has read
    // (size - 1 each; groups of up to MAX_RANKS are too big for a stack).
    struct pollfd *pfd;
    bool *got;
    uint32_t seq;          // collectives called so far
    int32_t op_timeout_ms; // rank 0's wait for each peer
    int32_t wait_ms;       // this rank's wait for a peer: rank 0's, or a quarter more on a peer
    // The collective's thread and abort (any thread) both break it: `mu`
    // guards these three.
    pthread_mutex_t mu;
    bool broken, aborted;
    char why[MAX_WHY]; // the reason the communicator broke
    // Rank 0's all_reduce scratch, allocated at the first one.
    void *scratch; // CHUNK_BYTES
    float *acc;    // CHUNK_BYTES / 2 floats (bf16 sums)
} tcp_ctx;

// ---------------------------------------------------------------- comm_tcp_io.c

// Encoding (little-endian).
void tcp_put32(uint8_t *p, uint32_t v);
void tcp_put64(uint8_t *p, uint64_t v);
uint32_t tcp_get32(const uint8_t *p);
uint64_t tcp_get64(const uint8_t *p);
void tcp_frame_encode(uint8_t p[HEADER_BYTES], const frame *f);
bool tcp_frame_decode(const uint8_t p[HEADER_BYTES], frame *f);
void tcp_frame_describe(char *out, size_t cap, const frame *f);

// Socket I/O.
int tcp_write_buf(int fd, const void *a, size_t na, const void *b, size_t nb);
int tcp_read_all(int fd, void *buf, size_t n, int64_t deadline_ns);
int tcp_read_idle(int fd, void *buf, size_t n, int32_t idle_ms);
const char *tcp_io_reason(const tcp_ctx *t, int rc);

// Failure: breaking the communicator, and telling the peers why.
void tcp_shutdown_all(tcp_ctx *t);
int tcp_fail(tcp_ctx *t, int code, const char *why);
int tcp_root_fail(tcp_ctx *t, int code, const frame *self, const char *why);
int tcp_peer_io_fail(tcp_ctx *t, const frame *f, int who, int rc);
int tcp_root_read_fail(tcp_ctx *t, const frame *f, int who, int rc, bool answered);

// ---------------------------------------------------------------- comm_tcp_collectives.c

// The pg_comm table's collectives (pg_comm_tcp_create fills it).
int tcp_all_reduce_sum(pg_comm *c, void *buf, int64_t count, int32_t dtype);
int tcp_all_gather(pg_comm *c, const void *send, void *recv, size_t bytes);
int tcp_all_to_all_v(pg_comm *c, const void *send, const size_t *sbytes, const size_t *soff, void *recv,
                     const size_t *rbytes, const size_t *roff);
int tcp_broadcast(pg_comm *c, void *buf, size_t bytes, int32_t root);
int tcp_barrier(pg_comm *c);
