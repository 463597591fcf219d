// kernels/comm/comm.h - the communicator of a tensor-parallel group: all-reduce,
// all-gather, all-to-all, broadcast and barrier over the ranks' buffers (C ABI).
//
// Three implementations of one table:
//   cpu   in-process, one communicator per rank thread over shared memory
//         (kernels/comm/comm_cpu.c): sharding tested on any machine;
//   tcp   one communicator per rank in any process on any host, over TCP
//         sockets (kernels/comm/comm_tcp*.c): the CPU data plane of multi-node
//         runs, and the bootstrap that hands NCCL its unique id;
//   nccl  NCCL on the CUDA backend's compute stream (kernels/cuda/
//         comm_nccl.cu), so CUDA graphs capture the collectives.
//
// Execution model: a collective is called by every rank of the group, each
// from its own thread, in the same order with the same sizes. cpu and tcp
// finish before they return (like the CPU backend's ops); nccl enqueues on
// the stream and returns (like the CUDA backend's ops). Buffers are in the
// memory of the backend the communicator serves (host memory for cpu and
// tcp, device memory for nccl).
//
// Determinism: all_reduce_sum gives every rank bit-identical results (cpu
// and tcp add the ranks' values in rank order 0, 1, ..., n-1 in f32 and
// round once), so ranks that sample from reduced values agree.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pg_comm pg_comm;

struct pg_comm {
    const char *name; // "cpu", "tcp", "nccl"
    int32_t rank, size;
    void *ctx;

    // buf[i] = sum over ranks of buf[i], i < count, in place; dtype is
    // PG_DTYPE_F32 or PG_DTYPE_BF16 (kernels/dtype.h).
    int (*all_reduce_sum)(pg_comm *c, void *buf, int64_t count, int32_t dtype);
    // recv[r * bytes, (r + 1) * bytes) = rank r's send[0, bytes) for every
    // rank r (recv holds size * bytes; send may be recv + rank * bytes).
    int (*all_gather)(pg_comm *c, const void *send, void *recv, size_t bytes);
    // All-to-all with per-pair sizes: this rank sends send[soff[d], soff[d] + sbytes[d]) to
    // every rank d (itself included) and receives rank s's piece for it into
    // recv[roff[s], roff[s] + rbytes[s]) for every rank s. rbytes[s] must equal what rank s
    // sends to this one (callers exchange the sizes first, e.g. with all_gather); sizes may
    // be 0. The pieces in recv must not overlap each other or send. Arrays of `size` entries
    // in host memory; the data in the communicator's memory (host for cpu and tcp, device
    // for nccl: grouped ncclSend/ncclRecv on the stream).
    int (*all_to_all_v)(pg_comm *c, const void *send, const size_t *sbytes, const size_t *soff, void *recv,
                        const size_t *rbytes, const size_t *roff);
    // buf[0, bytes) of rank `root` to every rank.
    int (*broadcast)(pg_comm *c, void *buf, size_t bytes, int32_t root);
    // Returns when every rank has called it (nccl: when the stream's work
    // before it is done on every rank).
    int (*barrier)(pg_comm *c);
    // Breaks the communicator for good, from any thread, also while other
    // threads are blocked in collectives of it (or of another rank of its
    // group): every pending and later collective fails promptly with
    // PG_EIO and a message containing `why`. A rank that fails before it
    // calls a collective aborts, so the ranks waiting for it there do not
    // wait forever (cpu: the whole in-process group; tcp: this rank's
    // sockets shut down, and the other ranks, in any process, fail with a
    // closed connection naming it; nccl: ncclCommAbort). The caller keeps
    // `c` alive (not destroyed) during the call.
    void (*abort)(pg_comm *c, const char *why);
    // Frees this rank's communicator (each rank destroys its own).
    void (*destroy)(pg_comm *c);
};

// True when `msg` (a pg_err_msg) is a collective's failure in a
// communicator (they say "tcp communicator (rank R of N): ..."; nccl only
// once aborted): a collective aborted, a peer that closed its connection,
// went silent or reported a failure. Such a failure is usually the echo of
// another rank's own, so callers report that one first (engine/dist/executor.c).
bool pg_comm_err_is_collective(const char *msg);

// n in-process communicators, out[r] for rank r (1 <= n <= 64). A rank
// whose thread stops calling leaves the others waiting: callers abort the
// group through any rank's `abort` (or pg_comm_cpu_abort, the same), which
// makes every pending and later collective of every rank fail with PG_EIO.
int pg_comm_cpu_create_group(int32_t n, pg_comm **out);
void pg_comm_cpu_abort(pg_comm *any_rank_of_group, const char *why);

// One rank of a group over TCP. Rank 0 listens on `port` (on every
// address when host is NULL), the others connect to host:port, retrying
// until timeout_ms has passed; errors name the address and the reason.
// A collective that waits op_timeout_ms for a peer that sends nothing
// fails with PG_EIO ("...: rank 2 sent nothing for 300.0 s") and breaks
// the communicator, so a rank that hangs (or a host that vanishes without
// closing its connections) cannot block the group forever.
typedef struct pg_comm_tcp_opts {
    int32_t rank, size;
    const char *host; // master address (rank 0 binds it when given)
    int32_t port;
    int32_t timeout_ms;    // set-up; 0 = 60 s
    int32_t op_timeout_ms; // a collective's wait for a peer; 0 = 300 s
} pg_comm_tcp_opts;
int pg_comm_tcp_create(const pg_comm_tcp_opts *o, pg_comm **out);

// NCCL (loaded with dlopen at the first call, so a build with CUDA runs
// without libnccl until tensor parallelism asks for it). In a build without
// CUDA these fail with PG_EUNSUPP "built without CUDA".
typedef struct pg_backend pg_backend;
#define PG_NCCL_ID_BYTES 128
// One communicator per CUDA backend (each on its own device), on the
// backends' compute streams: ncclCommInitAll for one host.
int pg_comm_nccl_create_all(pg_backend *const *backends, int32_t n, pg_comm **out);
// The unique id rank 0 makes and hands to the others (over the tcp
// bootstrap) for pg_comm_nccl_create_rank: ncclGetUniqueId.
int pg_comm_nccl_unique_id(uint8_t out[PG_NCCL_ID_BYTES]);
// This process's rank of a group across processes or hosts:
// ncclCommInitRank, on be's compute stream.
int pg_comm_nccl_create_rank(pg_backend *be, int32_t rank, int32_t size, const uint8_t id[PG_NCCL_ID_BYTES],
                             pg_comm **out);

#ifdef __cplusplus
}
#endif
