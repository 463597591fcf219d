// kernels/comm/comm_tcp.c - the TCP communicator (kernels/comm/comm.h): one rank per
// call, the ranks in any process on any host, a star through rank 0.
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
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/half.h"
#include "common/net.h"
#include "kernels/comm/comm.h"
#include "kernels/comm/comm_op.h"
#include "kernels/dtype.h"

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

// ---------------------------------------------------------------- encoding

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void frame_encode(uint8_t p[HEADER_BYTES], const frame *f) {
    put32(p, FRAME_MAGIC);
    p[4] = f->op;
    p[5] = f->dtype;
    p[6] = (uint8_t)f->status;
    p[7] = (uint8_t)(f->status >> 8);
    put32(p + 8, f->seq);
    put32(p + 12, (uint32_t)f->root);
    put64(p + 16, f->bytes);
}

static bool frame_decode(const uint8_t p[HEADER_BYTES], frame *f) {
    if (get32(p) != FRAME_MAGIC) return false;
    f->op = p[4];
    f->dtype = p[5];
    f->status = (uint16_t)(p[6] | p[7] << 8);
    f->seq = get32(p + 8);
    f->root = (int32_t)get32(p + 12);
    f->bytes = get64(p + 16);
    return true;
}

static void frame_describe(char *out, size_t cap, const frame *f) {
    if (f->op == OP_ALL_REDUCE)
        snprintf(out, cap, "%s #%u (%llu bytes of %s)", pg_comm_op_name(f->op), f->seq, (unsigned long long)f->bytes,
                 pg_dtype_name(f->dtype));
    else if (f->op == OP_BROADCAST)
        snprintf(out, cap, "%s #%u (%llu bytes from rank %d)", pg_comm_op_name(f->op), f->seq, (unsigned long long)f->bytes,
                 f->root);
    else if (f->op == OP_ALL_TO_ALL) // (bytes is the size table's: per-pair sizes are checked apart)
        snprintf(out, cap, "%s #%u", pg_comm_op_name(f->op), f->seq);
    else
        snprintf(out, cap, "%s #%u (%llu bytes)", pg_comm_op_name(f->op), f->seq, (unsigned long long)f->bytes);
}

// ---------------------------------------------------------------- socket I/O

// Writes every byte of the iovecs (partial writes and EINTR resumed).
// 0, or -errno (EPIPE when the other side is gone).
static int write_all(int fd, struct iovec *iov, int n) {
    while (n > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        while (n > 0 && (size_t)k >= iov->iov_len) k -= (ssize_t)iov->iov_len, iov++, n--;
        if (n > 0) iov->iov_base = (char *)iov->iov_base + k, iov->iov_len -= (size_t)k;
    }
    return 0;
}

static int write_buf(int fd, const void *a, size_t na, const void *b, size_t nb) {
    struct iovec iov[2] = {{(void *)a, na}, {(void *)b, nb}};
    return write_all(fd, iov, nb ? 2 : 1);
}

// Reads exactly n bytes. 0, -errno, -ENOTCONN when the other side closed
// first, or -ETIMEDOUT: past deadline_ns (< 0: none), or when nothing
// arrives for idle_ms (< 0: no bound; a collective's peer that hangs, or a
// host gone without closing its connections).
static int read_bytes(int fd, void *buf, size_t n, int64_t deadline_ns, int32_t idle_ms) {
    char *p = buf;
    while (n > 0) {
        int wait = idle_ms;
        if (deadline_ns >= 0) {
            int64_t left = deadline_ns - pg_now_ns();
            if (left <= 0) return -ETIMEDOUT;
            const int64_t l = left / 1000000 + 1;
            if (wait < 0 || l < wait) wait = (int)l;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, wait);
        if (pr < 0 && errno != EINTR) return -errno;
        if (pr == 0 && wait == idle_ms) return -ETIMEDOUT; // idle too long (the deadline is checked above)
        if (pr <= 0) continue;
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -errno;
        }
        if (k == 0) return -ENOTCONN;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}
static int read_all(int fd, void *buf, size_t n, int64_t deadline_ns) { return read_bytes(fd, buf, n, deadline_ns, -1); }
static int read_idle(int fd, void *buf, size_t n, int32_t idle_ms) { return read_bytes(fd, buf, n, -1, idle_ms); }

// What a failed transfer with a peer says after "rank N ". A timeout is
// reported with this rank's wait (reads; writes time out through
// SO_SNDTIMEO, set to the same wait).
static const char *io_reason(const tcp_ctx *t, int rc) {
    if (rc == -ENOTCONN || rc == -EPIPE || rc == -ECONNRESET) return "closed the connection";
    static _Thread_local char buf[128];
    if (rc == -ETIMEDOUT)
        snprintf(buf, sizeof buf, "sent nothing for %.1f s", t->wait_ms * 1e-3);
    else if (rc == -EAGAIN || rc == -EWOULDBLOCK)
        snprintf(buf, sizeof buf, "took no data for %.1f s", t->wait_ms * 1e-3);
    else
        snprintf(buf, sizeof buf, "failed: %s", strerror(-rc));
    return buf;
}

// ---------------------------------------------------------------- failure

static void shutdown_all(tcp_ctx *t) {
    int n = t->rank == 0 ? t->size : 1;
    for (int r = 0; r < n; r++)
        if (t->fds[r] >= 0) shutdown(t->fds[r], SHUT_RDWR);
}

static bool is_broken(tcp_ctx *t) {
    pthread_mutex_lock(&t->mu);
    bool b = t->broken;
    pthread_mutex_unlock(&t->mu);
    return b;
}

// Breaks the communicator with `why` (the first reason stays) and returns
// `code` with the message set. After an abort the failure this rank's own
// shut-down sockets caused is reported as the abort and its reason.
static int fail(tcp_ctx *t, int code, const char *why) {
    char first[MAX_WHY];
    pthread_mutex_lock(&t->mu);
    if (!t->broken) {
        t->broken = true;
        snprintf(t->why, sizeof t->why, "%s", why);
        shutdown_all(t);
    }
    bool aborted = t->aborted;
    memcpy(first, t->why, sizeof first);
    pthread_mutex_unlock(&t->mu);
    if (aborted) return pg_err_set(PG_EIO, "tcp communicator (rank %d of %d): %s", t->rank, t->size, first);
    return pg_err_set(code, "tcp communicator (rank %d of %d): %s", t->rank, t->size, why);
}

// Rank 0, before it has answered: tells every peer why (best effort, they
// are all waiting for an answer header), then breaks.
static int root_fail(tcp_ctx *t, int code, const frame *self, const char *why) {
    // (An abort racing with this may shut the sockets down first: these
    // best-effort sends then fail, and fail() below reports the abort.)
    if (!is_broken(t)) {
        size_t len = strlen(why);
        frame e = *self;
        e.status = (uint16_t)-code; // the PG_E* code, negated
        e.bytes = len;
        uint8_t h[HEADER_BYTES];
        frame_encode(h, &e);
        for (int r = 1; r < t->size; r++) {
            if (t->fds[r] < 0) continue;
            struct iovec iov[2] = {{h, sizeof h}, {(void *)why, len}};
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
            (void)!sendmsg(t->fds[r], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
    }
    return fail(t, code, why);
}

static int peer_io_fail(tcp_ctx *t, const frame *f, int who, int rc) {
    char why[MAX_WHY];
    snprintf(why, sizeof why, "%s #%u: rank %d %s", pg_comm_op_name(f->op), f->seq, who, io_reason(t, rc));
    return fail(t, PG_EIO, why);
}

// Rank 0 failed reading rank `who`'s data: before any answer went out the
// peers still wait for an answer header, so they are told why.
static int root_read_fail(tcp_ctx *t, const frame *f, int who, int rc, bool answered) {
    if (answered) return peer_io_fail(t, f, who, rc);
    char why[MAX_WHY];
    snprintf(why, sizeof why, "%s #%u: rank %d %s", pg_comm_op_name(f->op), f->seq, who, io_reason(t, rc));
    return root_fail(t, PG_EIO, f, why);
}

// ---------------------------------------------------------------- rank 0

// Checks peer r's header against rank 0's own call.
static int root_check_header(tcp_ctx *t, const frame *self, int r, const uint8_t h[HEADER_BYTES]) {
    char why[MAX_WHY];
    frame f;
    if (!frame_decode(h, &f)) {
        snprintf(why, sizeof why, "%s #%u: rank %d sent a malformed frame header", pg_comm_op_name(self->op),
                 self->seq, r);
        return root_fail(t, PG_EIO, self, why);
    }
    if (f.op != self->op || f.seq != self->seq || f.bytes != self->bytes || f.dtype != self->dtype ||
        f.root != self->root) {
        char a[160], b[160];
        frame_describe(a, sizeof a, self);
        frame_describe(b, sizeof b, &f);
        snprintf(why, sizeof why, "collectives differ between ranks: rank 0 calls %s, rank %d calls %s", a, r, b);
        return root_fail(t, PG_EINVAL, self, why);
    }
    return 0;
}

// Reads every peer's header, in the order they come, and checks each
// against rank 0's own call. Every peer is polled, those already read for
// a hang-up only (their data may follow the header): a peer that goes
// away fails the collective at once, not after the peer rank 0 happens to
// be waiting for. A peer whose header has not come within op_timeout_ms
// fails it too, named.
static int root_headers(tcp_ctx *t, const frame *self) {
    struct pollfd *pfd = t->pfd;
    bool *got = t->got; // got[r - 1]: rank r's header is read
    memset(got, 0, sizeof(bool) * (size_t)(t->size - 1));
    int left = t->size - 1;
    const int64_t deadline = pg_now_ns() + (int64_t)t->op_timeout_ms * 1000000;
    char why[MAX_WHY];
    while (left > 0) {
        for (int r = 1; r < t->size; r++) {
            short want = got[r - 1] ? POLLRDHUP : POLLIN | POLLRDHUP;
            pfd[r - 1] = (struct pollfd){.fd = t->fds[r], .events = want};
        }
        int64_t wait = deadline - pg_now_ns();
        int pr = wait > 0 ? poll(pfd, (nfds_t)(t->size - 1), (int)(wait / 1000000 + 1)) : 0;
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) {
            snprintf(why, sizeof why, "%s #%u: poll: %s", pg_comm_op_name(self->op), self->seq, strerror(errno));
            return root_fail(t, PG_EIO, self, why);
        }
        if (pr == 0 && pg_now_ns() < deadline) continue;
        if (pr == 0) {
            int r = 1;
            while (got[r - 1]) r++;
            snprintf(why, sizeof why, "%s #%u: rank %d %s", pg_comm_op_name(self->op), self->seq, r,
                     io_reason(t, -ETIMEDOUT));
            return root_fail(t, PG_EIO, self, why);
        }
        for (int r = 1; r < t->size; r++) {
            short ev = pfd[r - 1].revents;
            if (!ev) continue;
            int rc = -ENOTCONN;
            if (!got[r - 1] && (ev & POLLIN)) {
                uint8_t h[HEADER_BYTES];
                rc = read_idle(t->fds[r], h, sizeof h, t->op_timeout_ms);
                if (rc == 0) {
                    PG_TRY(root_check_header(t, self, r, h));
                    got[r - 1] = true;
                    left--;
                    continue;
                }
            } else if (got[r - 1] && !(ev & (POLLRDHUP | POLLHUP | POLLERR))) {
                continue;
            }
            snprintf(why, sizeof why, "%s #%u: rank %d %s", pg_comm_op_name(self->op), self->seq, r, io_reason(t, rc));
            return root_fail(t, PG_EIO, self, why);
        }
    }
    return 0;
}

// Sends the answer header (first round only) and `n` bytes of data.
static int root_answer(tcp_ctx *t, const frame *self, int r, bool with_header, const void *data, size_t n) {
    uint8_t h[HEADER_BYTES];
    frame_encode(h, self);
    int rc = with_header ? write_buf(t->fds[r], h, sizeof h, data, n) : write_buf(t->fds[r], data, n, NULL, 0);
    return rc < 0 ? peer_io_fail(t, self, r, rc) : 0;
}

// Rank 0's scratch for all_reduce_sum and all_to_all_v, at the first use.
static int root_scratch(tcp_ctx *t) {
    if (t->scratch && t->acc) return 0;
    if (!t->scratch) t->scratch = malloc(CHUNK_BYTES);
    if (!t->acc) t->acc = malloc(CHUNK_BYTES / 2 * sizeof(float));
    return t->scratch && t->acc ? 0 : fail(t, PG_ENOMEM, "out of memory for rank 0's scratch");
}

static int root_all_reduce(tcp_ctx *t, const frame *self, void *buf, int64_t count) {
    PG_TRY(root_headers(t, self));
    PG_TRY(root_scratch(t));
    bool bf16 = self->dtype == PG_DTYPE_BF16;
    size_t esz = bf16 ? 2 : 4;
    int64_t chunk = CHUNK_BYTES / esz;
    int64_t off = 0;
    do {
        int64_t m = count - off < chunk ? count - off : chunk;
        char *mine = (char *)buf + (size_t)off * esz;
        // Rank order: rank 0's value, then + rank 1's, + rank 2's, ...; f32
        // sums in place, bf16 sums in f32 and rounds once at the end.
        if (bf16)
            for (int64_t i = 0; i < m; i++) t->acc[i] = pg_bf16_to_f32(((const uint16_t *)mine)[i]);
        for (int r = 1; r < t->size; r++) {
            int rc = read_idle(t->fds[r], t->scratch, (size_t)m * esz, t->wait_ms);
            if (rc < 0) return root_read_fail(t, self, r, rc, off > 0);
            if (bf16) {
                const uint16_t *x = t->scratch;
                for (int64_t i = 0; i < m; i++) t->acc[i] += pg_bf16_to_f32(x[i]);
            } else {
                const float *x = t->scratch;
                float *y = (float *)mine;
                for (int64_t i = 0; i < m; i++) y[i] += x[i];
            }
        }
        if (bf16)
            for (int64_t i = 0; i < m; i++) ((uint16_t *)mine)[i] = pg_f32_to_bf16(t->acc[i]);
        for (int r = 1; r < t->size; r++) PG_TRY(root_answer(t, self, r, off == 0, mine, (size_t)m * esz));
        off += m;
    } while (off < count);
    return 0;
}

static int root_all_gather(tcp_ctx *t, const frame *self, const void *send, void *recv, size_t bytes) {
    PG_TRY(root_headers(t, self));
    if (recv != send && bytes) memmove(recv, send, bytes);
    for (int r = 1; r < t->size; r++) {
        int rc = read_idle(t->fds[r], (char *)recv + (size_t)r * bytes, bytes, t->wait_ms);
        if (rc < 0) return root_read_fail(t, self, r, rc, false);
    }
    for (int r = 1; r < t->size; r++) PG_TRY(root_answer(t, self, r, true, recv, bytes * (size_t)t->size));
    return 0;
}

static int root_broadcast(tcp_ctx *t, const frame *self, void *buf, size_t bytes, int32_t root) {
    PG_TRY(root_headers(t, self));
    if (root != 0) {
        int rc = read_idle(t->fds[root], buf, bytes, t->wait_ms);
        if (rc < 0) return root_read_fail(t, self, root, rc, false);
    }
    for (int r = 1; r < t->size; r++) PG_TRY(root_answer(t, self, r, true, buf, r == root ? 0 : bytes));
    return 0;
}

// ---------------------------------------------------------------- all_to_all_v

// A rank's size table on the wire: u64 bytes it sends to rank d, u64
// bytes it expects from rank d, for d = 0..n-1.
#define A2A_ENTRY_BYTES 16

static void a2a_table_encode(uint8_t *p, int n, const size_t *sbytes, const size_t *rbytes) {
    for (int d = 0; d < n; d++) {
        put64(p + A2A_ENTRY_BYTES * d, sbytes[d]);
        put64(p + A2A_ENTRY_BYTES * d + 8, rbytes[d]);
    }
}

// A piece rank 0 relays from peer s to peer d, a chunk at a time through its
// scratch buffer.
static int root_relay(tcp_ctx *t, const frame *self, int s, int d, size_t len) {
    for (size_t off = 0; off < len;) {
        size_t m = len - off < CHUNK_BYTES ? len - off : CHUNK_BYTES;
        int rc = read_idle(t->fds[s], t->scratch, m, t->wait_ms);
        if (rc < 0) return peer_io_fail(t, self, s, rc);
        rc = write_buf(t->fds[d], t->scratch, m, NULL, 0);
        if (rc < 0) return peer_io_fail(t, self, d, rc);
        off += m;
    }
    return 0;
}

// Sizes: tab[s * n + d] is what rank s sends to rank d (u64 pairs: sent,
// expected by s from d). Every pair is checked before any data moves.
static int root_a2a_sizes(tcp_ctx *t, const frame *self, uint64_t (*tab)[2], uint8_t *wire, const size_t *sbytes,
                          const size_t *rbytes) {
    int n = t->size;
    for (int d = 0; d < n; d++) tab[d][0] = sbytes[d], tab[d][1] = rbytes[d];
    for (int s = 1; s < n; s++) {
        int rc = read_idle(t->fds[s], wire, (size_t)n * A2A_ENTRY_BYTES, t->wait_ms);
        if (rc < 0) return root_read_fail(t, self, s, rc, false);
        for (int d = 0; d < n; d++) {
            tab[s * n + d][0] = get64(wire + A2A_ENTRY_BYTES * d);
            tab[s * n + d][1] = get64(wire + A2A_ENTRY_BYTES * d + 8);
        }
    }
    for (int s = 0; s < n; s++)
        for (int d = 0; d < n; d++) {
            uint64_t sent = tab[s * n + d][0], expected = tab[d * n + s][1];
            if (sent == expected) continue;
            char why[MAX_WHY];
            snprintf(why, sizeof why,
                     "%s #%u sizes differ: rank %d sends %llu bytes to rank %d, which expects %llu from it",
                     pg_comm_op_name(self->op), self->seq, s, (unsigned long long)sent, d,
                     (unsigned long long)expected);
            return root_fail(t, PG_EINVAL, self, why);
        }
    return 0;
}

static int root_all_to_all_v(tcp_ctx *t, const frame *self, const void *send, const size_t *sbytes,
                             const size_t *soff, void *recv, const size_t *rbytes, const size_t *roff) {
    PG_TRY(root_headers(t, self));
    int n = t->size;
    uint64_t(*tab)[2] = malloc(sizeof *tab * (size_t)n * (size_t)n);
    uint8_t *wire = malloc((size_t)n * A2A_ENTRY_BYTES);
    int rc = tab && wire ? root_scratch(t) : root_fail(t, PG_ENOMEM, self, "out of memory for the size tables");
    if (rc == 0) rc = root_a2a_sizes(t, self, tab, wire, sbytes, rbytes);
    for (int r = 1; r < n && rc == 0; r++) rc = root_answer(t, self, r, true, NULL, 0);
    // (source, destination) order: peer s sends its pieces by destination,
    // peer d takes its pieces by source, so each read and write below is
    // the next thing on its socket.
    for (int s = 0; s < n && rc == 0; s++)
        for (int d = 0; d < n && rc == 0; d++) {
            size_t len = (size_t)tab[s * n + d][0];
            if (len == 0 || (s == d && s != 0)) continue; // a peer's own piece stays with it
            if (s == 0 && d == 0) {
                memcpy((char *)recv + roff[0], (const char *)send + soff[0], len);
            } else if (s == 0) {
                int w = write_buf(t->fds[d], (const char *)send + soff[d], len, NULL, 0);
                if (w < 0) rc = peer_io_fail(t, self, d, w);
            } else if (d == 0) {
                int r = read_idle(t->fds[s], (char *)recv + roff[s], len, t->wait_ms);
                if (r < 0) rc = peer_io_fail(t, self, s, r);
            } else {
                rc = root_relay(t, self, s, d, len);
            }
        }
    free(tab);
    free(wire);
    return rc;
}

static bool io_retry(int e) { return e == EINTR || e == EAGAIN || e == EWOULDBLOCK; }

// A peer, after rank 0's answer: sends its pieces (by destination) and
// takes its pieces (by source) at once on its socket, so a large piece
// each way cannot leave both ends blocked in send. Bounded by wait_ms
// without progress either way.
static int peer_a2a_exchange(tcp_ctx *t, const frame *self, const char *out, const size_t *sbytes,
                             const size_t *soff, char *in, const size_t *rbytes, const size_t *roff) {
    const int me = t->rank, n = t->size, fd = t->fds[0];
    if (sbytes[me]) memcpy(in + roff[me], out + soff[me], sbytes[me]);
    int sd = 0, rs = 0;          // the piece being sent (to rank sd) and received (from rank rs)
    size_t sdone = 0, rdone = 0; // its bytes done
    for (;;) {
        while (sd < n && (sd == me || sdone == sbytes[sd])) sd++, sdone = 0;
        while (rs < n && (rs == me || rdone == rbytes[rs])) rs++, rdone = 0;
        if (sd == n && rs == n) return 0;
        struct pollfd p = {.fd = fd, .events = (short)((rs < n ? POLLIN : 0) | (sd < n ? POLLOUT : 0))};
        int pr = poll(&p, 1, t->wait_ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return peer_io_fail(t, self, 0, -errno);
        if (pr == 0) return peer_io_fail(t, self, 0, rs < n ? -ETIMEDOUT : -EAGAIN);
        if (rs < n && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t k = recv(fd, in + roff[rs] + rdone, rbytes[rs] - rdone, MSG_DONTWAIT);
            if (k == 0) return peer_io_fail(t, self, 0, -ENOTCONN);
            if (k < 0 && !io_retry(errno)) return peer_io_fail(t, self, 0, -errno);
            if (k > 0) rdone += (size_t)k;
        }
        if (sd < n && (p.revents & (POLLOUT | POLLHUP | POLLERR))) {
            ssize_t k = send(fd, out + soff[sd] + sdone, sbytes[sd] - sdone, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k < 0 && !io_retry(errno)) return peer_io_fail(t, self, 0, -errno);
            if (k > 0) sdone += (size_t)k;
        }
    }
}

// ---------------------------------------------------------------- peers

static int peer_answer_header(tcp_ctx *t, const frame *self, const uint8_t h[HEADER_BYTES]);

// Sends this peer's header with the first data. When rank 0 has gone, its
// error answer (why it gave up) may already wait in the socket: that
// reason is reported rather than "rank 0 closed the connection".
static int peer_send(tcp_ctx *t, const frame *self, bool with_header, const void *data, size_t n) {
    uint8_t h[HEADER_BYTES];
    frame_encode(h, self);
    int rc = with_header ? write_buf(t->fds[0], h, sizeof h, data, n) : write_buf(t->fds[0], data, n, NULL, 0);
    if (rc == 0) return 0;
    if (with_header && read_all(t->fds[0], h, sizeof h, pg_now_ns() + 200000000) == 0) {
        int e = peer_answer_header(t, self, h);
        if (e < 0) return e;
    }
    return peer_io_fail(t, self, 0, rc);
}

// Reads rank 0's answer header: an error it reports, or the same call.
static int peer_answer(tcp_ctx *t, const frame *self) {
    uint8_t h[HEADER_BYTES];
    int rc = read_idle(t->fds[0], h, sizeof h, t->wait_ms);
    if (rc < 0) return peer_io_fail(t, self, 0, rc);
    return peer_answer_header(t, self, h);
}

static int peer_answer_header(tcp_ctx *t, const frame *self, const uint8_t h[HEADER_BYTES]) {
    frame f;
    char why[MAX_WHY];
    if (!frame_decode(h, &f)) {
        snprintf(why, sizeof why, "%s #%u: rank 0 sent a malformed frame header", pg_comm_op_name(self->op), self->seq);
        return fail(t, PG_EIO, why);
    }
    if (f.status) {
        char msg[MAX_WHY - 32] = "";
        size_t len = f.bytes < sizeof msg - 1 ? (size_t)f.bytes : sizeof msg - 1;
        if (read_all(t->fds[0], msg, len, pg_now_ns() + 1000000000) == 0) msg[len] = 0;
        snprintf(why, sizeof why, "rank 0 reports: %s", msg[0] ? msg : "(no reason)");
        return fail(t, f.status == -PG_EINVAL ? PG_EINVAL : PG_EIO, why);
    }
    if (f.op != self->op || f.seq != self->seq) {
        char a[160], b[160];
        frame_describe(a, sizeof a, self);
        frame_describe(b, sizeof b, &f);
        snprintf(why, sizeof why, "rank 0 answered %s to this rank's %s", b, a);
        return fail(t, PG_EIO, why);
    }
    return 0;
}

static int peer_recv(tcp_ctx *t, const frame *self, void *data, size_t n) {
    int rc = read_idle(t->fds[0], data, n, t->wait_ms);
    return rc < 0 ? peer_io_fail(t, self, 0, rc) : 0;
}

static int peer_all_reduce(tcp_ctx *t, const frame *self, void *buf, int64_t count) {
    size_t esz = self->dtype == PG_DTYPE_BF16 ? 2 : 4;
    int64_t chunk = CHUNK_BYTES / esz;
    int64_t off = 0;
    do {
        int64_t m = count - off < chunk ? count - off : chunk;
        char *mine = (char *)buf + (size_t)off * esz;
        PG_TRY(peer_send(t, self, off == 0, mine, (size_t)m * esz));
        if (off == 0) PG_TRY(peer_answer(t, self));
        PG_TRY(peer_recv(t, self, mine, (size_t)m * esz));
        off += m;
    } while (off < count);
    return 0;
}

// ---------------------------------------------------------------- the table

static int begin(pg_comm *c, frame *f, int op) {
    tcp_ctx *t = c->ctx;
    *f = (frame){.op = (uint8_t)op, .seq = t->seq++};
    char why[MAX_WHY];
    pthread_mutex_lock(&t->mu);
    bool broken = t->broken;
    if (broken) memcpy(why, t->why, sizeof why);
    pthread_mutex_unlock(&t->mu);
    if (broken)
        return pg_err_set(PG_EIO, "tcp communicator (rank %d of %d): %s: broken earlier: %s", t->rank, t->size,
                          pg_comm_op_name(op), why);
    return 0;
}

// A call that is wrong on this rank alone: the others would wait for it,
// so the communicator breaks (its sockets shut down) and they fail too.
static int bad_call(tcp_ctx *t, int op, const char *what) {
    char why[MAX_WHY];
    snprintf(why, sizeof why, "%s called with %s", pg_comm_op_name(op), what);
    return fail(t, PG_EINVAL, why);
}

static int tcp_all_reduce_sum(pg_comm *c, void *buf, int64_t count, int32_t dtype) {
    tcp_ctx *t = c->ctx;
    frame f;
    PG_TRY(begin(c, &f, OP_ALL_REDUCE));
    if (dtype != PG_DTYPE_F32 && dtype != PG_DTYPE_BF16) return bad_call(t, f.op, "an unsupported dtype");
    if (count < 0 || (count > 0 && !buf)) return bad_call(t, f.op, "a negative count or no buffer");
    f.dtype = (uint8_t)dtype;
    f.bytes = (uint64_t)count * (dtype == PG_DTYPE_BF16 ? 2 : 4);
    if (t->size == 1) return 0;
    return t->rank == 0 ? root_all_reduce(t, &f, buf, count) : peer_all_reduce(t, &f, buf, count);
}

static int tcp_all_gather(pg_comm *c, const void *send, void *recv, size_t bytes) {
    tcp_ctx *t = c->ctx;
    frame f;
    PG_TRY(begin(c, &f, OP_ALL_GATHER));
    if (bytes > 0 && (!send || !recv)) return bad_call(t, f.op, "no buffer");
    f.bytes = bytes;
    if (t->size == 1) {
        if (recv != send && bytes) memmove(recv, send, bytes);
        return 0;
    }
    if (t->rank == 0) return root_all_gather(t, &f, send, recv, bytes);
    PG_TRY(peer_send(t, &f, true, send, bytes));
    PG_TRY(peer_answer(t, &f));
    return peer_recv(t, &f, recv, bytes * (size_t)t->size);
}

static int tcp_all_to_all_v(pg_comm *c, const void *send, const size_t *sbytes, const size_t *soff, void *recv,
                            const size_t *rbytes, const size_t *roff) {
    tcp_ctx *t = c->ctx;
    frame f;
    PG_TRY(begin(c, &f, OP_ALL_TO_ALL));
    if (!sbytes || !soff || !rbytes || !roff) return bad_call(t, f.op, "no size or offset array");
    for (int r = 0; r < t->size; r++) {
        if (sbytes[r] > 0 && !send) return bad_call(t, f.op, "no send buffer");
        if (rbytes[r] > 0 && !recv) return bad_call(t, f.op, "no receive buffer");
    }
    // The payload with the header is the size table, the same length on
    // every rank; the pieces follow rank 0's answer.
    f.bytes = (uint64_t)t->size * A2A_ENTRY_BYTES;
    if (t->size == 1) {
        char what[160];
        snprintf(what, sizeof what, "%zu bytes to send to itself but %zu to receive", sbytes[0], rbytes[0]);
        if (sbytes[0] != rbytes[0]) return bad_call(t, f.op, what);
        if (sbytes[0]) memcpy((char *)recv + roff[0], (const char *)send + soff[0], sbytes[0]);
        return 0;
    }
    if (t->rank == 0) return root_all_to_all_v(t, &f, send, sbytes, soff, recv, rbytes, roff);
    uint8_t *wire = malloc((size_t)f.bytes);
    if (!wire) return fail(t, PG_ENOMEM, "out of memory for the all_to_all_v size table");
    a2a_table_encode(wire, t->size, sbytes, rbytes);
    int rc = peer_send(t, &f, true, wire, (size_t)f.bytes);
    free(wire);
    PG_TRY(rc);
    PG_TRY(peer_answer(t, &f));
    return peer_a2a_exchange(t, &f, send, sbytes, soff, recv, rbytes, roff);
}

static int tcp_broadcast(pg_comm *c, void *buf, size_t bytes, int32_t root) {
    tcp_ctx *t = c->ctx;
    frame f;
    PG_TRY(begin(c, &f, OP_BROADCAST));
    if (root < 0 || root >= t->size) return bad_call(t, f.op, "a root outside the group");
    if (bytes > 0 && !buf) return bad_call(t, f.op, "no buffer");
    f.bytes = bytes;
    f.root = root;
    if (t->size == 1) return 0;
    if (t->rank == 0) return root_broadcast(t, &f, buf, bytes, root);
    PG_TRY(peer_send(t, &f, true, buf, t->rank == root ? bytes : 0));
    PG_TRY(peer_answer(t, &f));
    return t->rank == root ? 0 : peer_recv(t, &f, buf, bytes);
}

static int tcp_barrier(pg_comm *c) {
    tcp_ctx *t = c->ctx;
    frame f;
    PG_TRY(begin(c, &f, OP_BARRIER));
    if (t->size == 1) return 0;
    if (t->rank == 0) {
        PG_TRY(root_headers(t, &f));
        for (int r = 1; r < t->size; r++) PG_TRY(root_answer(t, &f, r, true, NULL, 0));
        return 0;
    }
    PG_TRY(peer_send(t, &f, true, NULL, 0));
    return peer_answer(t, &f);
}

// Any thread, while this rank's thread may be inside a collective: the
// shut-down sockets wake it (recv and poll return, a blocked send fails),
// and it reports the abort; the other ranks see the connections close.
static void tcp_abort(pg_comm *c, const char *why) {
    tcp_ctx *t = c->ctx;
    pthread_mutex_lock(&t->mu);
    if (!t->broken) {
        t->broken = t->aborted = true;
        snprintf(t->why, sizeof t->why, "aborted: %s", why && *why ? why : "(no reason given)");
        shutdown_all(t);
    }
    pthread_mutex_unlock(&t->mu);
}

static void tcp_free(tcp_ctx *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    if (t->fds) {
        int n = t->rank == 0 ? t->size : 1;
        for (int r = 0; r < n; r++)
            if (t->fds[r] >= 0) close(t->fds[r]);
        free(t->fds);
    }
    free(t->pfd);
    free(t->got);
    free(t->scratch);
    free(t->acc);
    free(t);
}

static void tcp_destroy(pg_comm *c) {
    if (!c) return;
    tcp_free(c->ctx);
    free(c);
}

// ---------------------------------------------------------------- set-up

static double secs_since(int64_t t0) { return (double)(pg_now_ns() - t0) * 1e-9; }

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

static int send_welcome(int fd, uint32_t status, const char *why) {
    uint8_t h[12];
    size_t len = why ? strlen(why) : 0;
    put32(h, HELLO_MAGIC);
    put32(h + 4, status);
    put32(h + 8, (uint32_t)len);
    return write_buf(fd, h, sizeof h, why, len);
}

static int listen_on(tcp_ctx *t, const char *host, int port) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0)
        return pg_err_set(PG_EIO, "tcp communicator (rank 0 of %d): cannot listen on %s: %s", t->size, t->addr,
                          gai_strerror(g));
    int err = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        // "::" takes IPv4 peers too, so a NULL host means every address.
        if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, t->size) == 0) {
            freeaddrinfo(ai);
            return fd;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(ai);
    return pg_err_set(PG_EIO, "tcp communicator (rank 0 of %d): cannot listen on %s: %s", t->size, t->addr,
                      strerror(err ? err : EADDRNOTAVAIL));
}

// Rank 0: accepts size - 1 peers, each with a hello naming a rank of this
// group, then welcomes them all. A peer with the wrong group size, a rank
// out of range or a rank already taken is refused (told why) and fails
// the set-up: a misconfigured launch should stop, not run short.
static int accept_peers(tcp_ctx *t, int lfd, int64_t t0, int64_t deadline) {
    int got = 0;
    char why[MAX_WHY];
    while (got < t->size - 1) {
        int64_t left = deadline - pg_now_ns();
        if (left <= 0) {
            char missing[256] = "";
            size_t k = 0;
            for (int r = 1; r < t->size && k + 16 < sizeof missing; r++)
                if (t->fds[r] < 0) k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", r);
            return pg_err_set(PG_EIO,
                              "tcp communicator (rank 0 of %d) on %s: only %d of %d peers connected after %.1f s "
                              "(missing ranks %s)",
                              t->size, t->addr, got, t->size - 1, secs_since(t0), missing);
        }
        struct pollfd pfd = {.fd = lfd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(left / 1000000 + 1));
        if (pr < 0 && errno != EINTR)
            return pg_err_set(PG_EIO, "tcp communicator (rank 0 of %d) on %s: poll: %s", t->size, t->addr,
                              strerror(errno));
        if (pr <= 0) continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
            return pg_err_set(PG_EIO, "tcp communicator (rank 0 of %d) on %s: accept: %s", t->size, t->addr,
                              strerror(errno));
        }
        set_nodelay(fd);
        uint8_t h[HELLO_BYTES];
        // Something that is not a rank (a port scan, a health check) is
        // dropped; the group keeps waiting for its ranks.
        if (read_all(fd, h, sizeof h, deadline) < 0 || get32(h) != HELLO_MAGIC) {
            close(fd);
            continue;
        }
        uint32_t version = get32(h + 4);
        int32_t rank = (int32_t)get32(h + 8), size = (int32_t)get32(h + 12);
        why[0] = 0;
        if (version != PROTO_VERSION)
            snprintf(why, sizeof why, "rank %d speaks protocol version %u, rank 0 speaks %u", rank, version,
                     PROTO_VERSION);
        else if (size != t->size)
            snprintf(why, sizeof why, "rank %d says the group has %d ranks, rank 0 says %d", rank, size, t->size);
        else if (rank < 1 || rank >= t->size)
            snprintf(why, sizeof why, "a peer claims rank %d, outside 1..%d", rank, t->size - 1);
        else if (t->fds[rank] >= 0)
            snprintf(why, sizeof why, "a second connection claims rank %d", rank);
        if (why[0]) {
            send_welcome(fd, 1, why);
            close(fd);
            return pg_err_set(PG_EINVAL, "tcp communicator (rank 0 of %d) on %s: %s", t->size, t->addr, why);
        }
        t->fds[rank] = fd;
        got++;
    }
    for (int r = 1; r < t->size; r++)
        if (send_welcome(t->fds[r], 0, NULL) < 0)
            return pg_err_set(PG_EIO, "tcp communicator (rank 0 of %d) on %s: rank %d left before the welcome",
                              t->size, t->addr, r);
    return 0;
}

// One connection attempt, bounded by the deadline. The socket, or -errno.
static int try_connect(const char *host, int port, int64_t deadline) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0) return g == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
    int err = ECONNREFUSED;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            for (;;) {
                // Polls at least once, so a refusal that is already there is
                // reported as such even at the deadline.
                int64_t left = deadline - pg_now_ns();
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                int pr = poll(&pfd, 1, left > 0 ? (int)(left / 1000000 + 1) : 0);
                if (pr < 0 && errno != EINTR) break;
                if (pr == 0 && left <= 0) {
                    errno = ETIMEDOUT;
                    break;
                }
                if (pr <= 0) continue;
                int e = 0;
                socklen_t el = sizeof e;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
                rc = e ? -1 : 0;
                errno = e;
                break;
            }
        }
        if (rc == 0 && !pg_net_self_connected(fd)) {
            freeaddrinfo(ai);
            return fd;
        }
        // A socket joined to itself by TCP's simultaneous open (its
        // ephemeral port was the one it dialled, on this host, before rank 0
        // listened) is nobody: a refusal, retried (common/net.c).
        err = rc == 0 ? ECONNREFUSED : errno ? errno : ECONNREFUSED;
        close(fd);
    }
    freeaddrinfo(ai);
    return -err;
}

// Back to blocking after the bounded connect: the collectives block.
static int set_blocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

// A peer: connects (retrying until the deadline), says hello and waits for
// rank 0's welcome, which comes once every rank has connected.
static int join(tcp_ctx *t, const char *host, int port, int64_t t0, int64_t deadline) {
    int fd = -1, last = 0;
    int64_t pause_ns = 20000000; // 20 ms, doubling to 500 ms between attempts
    for (;;) {
        fd = try_connect(host, port, deadline);
        if (fd >= 0) break;
        // An attempt cut short by the deadline keeps the previous reason
        // (it says more: "refused", "no route to host").
        if (-fd != ETIMEDOUT || last == 0) last = -fd;
        int64_t left = deadline - pg_now_ns();
        if (left <= 0) break;
        int64_t nap = pause_ns < left ? pause_ns : left;
        struct timespec ts = {(time_t)(nap / 1000000000), (long)(nap % 1000000000)};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
        }
        pause_ns = pause_ns * 2 < 500000000 ? pause_ns * 2 : 500000000;
    }
    if (fd < 0)
        return pg_err_set(PG_EIO, "cannot connect to %s (rank %d of %d): %s after %.1f s", t->addr, t->rank, t->size,
                          strerror(last ? last : ETIMEDOUT), secs_since(t0));
    t->fds[0] = fd;
    if (set_blocking(fd) < 0)
        return pg_err_set(PG_EIO, "tcp communicator (rank %d of %d): fcntl: %s", t->rank, t->size, strerror(errno));
    set_nodelay(fd);
    uint8_t h[HELLO_BYTES];
    put32(h, HELLO_MAGIC);
    put32(h + 4, PROTO_VERSION);
    put32(h + 8, (uint32_t)t->rank);
    put32(h + 12, (uint32_t)t->size);
    int rc = write_buf(fd, h, sizeof h, NULL, 0);
    uint8_t w[12];
    if (rc == 0) rc = read_all(fd, w, sizeof w, deadline);
    if (rc == -ETIMEDOUT)
        return pg_err_set(PG_EIO,
                          "tcp communicator (rank %d of %d): connected to %s but the group was not complete after "
                          "%.1f s",
                          t->rank, t->size, t->addr, secs_since(t0));
    if (rc < 0)
        return pg_err_set(PG_EIO, "tcp communicator (rank %d of %d): rank 0 at %s %s before welcoming this rank",
                          t->rank, t->size, t->addr, io_reason(t, rc));
    if (get32(w) != HELLO_MAGIC)
        return pg_err_set(PG_EIO, "tcp communicator (rank %d of %d): %s is not a paged communicator", t->rank,
                          t->size, t->addr);
    if (get32(w + 4) != 0) {
        char why[MAX_WHY] = "";
        uint32_t len = get32(w + 8);
        size_t n = len < sizeof why - 1 ? len : sizeof why - 1;
        if (read_all(fd, why, n, pg_now_ns() + 1000000000) == 0) why[n] = 0;
        return pg_err_set(PG_EINVAL, "tcp communicator (rank %d of %d): rank 0 at %s refused this rank: %s", t->rank,
                          t->size, t->addr, why[0] ? why : "(no reason)");
    }
    return 0;
}

int pg_comm_tcp_create(const pg_comm_tcp_opts *o, pg_comm **out) {
    PG_ARG(o && out, "pg_comm_tcp_create: no options or no output");
    *out = NULL;
    PG_ARG(o->size >= 1 && o->size <= MAX_RANKS, "tcp communicator: group size %d outside 1..%d", o->size, MAX_RANKS);
    PG_ARG(o->rank >= 0 && o->rank < o->size, "tcp communicator: rank %d outside 0..%d", o->rank, o->size - 1);
    PG_ARG(o->port >= 0 && o->port <= 65535, "tcp communicator: port %d outside 0..65535", o->port);
    PG_ARG(o->rank == 0 || (o->host && *o->host), "tcp communicator (rank %d of %d): no master host to connect to",
           o->rank, o->size);
    PG_ARG(o->timeout_ms >= 0, "tcp communicator: negative timeout %d ms", o->timeout_ms);
    PG_ARG(o->op_timeout_ms >= 0, "tcp communicator: negative collective timeout %d ms", o->op_timeout_ms);
    int64_t t0 = pg_now_ns();
    int64_t deadline = t0 + (int64_t)(o->timeout_ms ? o->timeout_ms : 60000) * 1000000;

    tcp_ctx *t = calloc(1, sizeof *t);
    pg_comm *c = calloc(1, sizeof *c);
    int n_fds = o->rank == 0 ? o->size : 1;
    if (t) t->fds = malloc(sizeof(int) * (size_t)n_fds);
    if (t && o->rank == 0 && o->size > 1) {
        t->pfd = malloc(sizeof(struct pollfd) * (size_t)(o->size - 1));
        t->got = malloc(sizeof(bool) * (size_t)(o->size - 1));
    }
    if (!t || !c || !t->fds || (o->rank == 0 && o->size > 1 && (!t->pfd || !t->got))) {
        if (t) free(t->fds), free(t->pfd), free(t->got);
        free(t);
        free(c);
        return pg_err_set(PG_ENOMEM, "tcp communicator: out of memory");
    }
    for (int i = 0; i < n_fds; i++) t->fds[i] = -1;
    pthread_mutex_init(&t->mu, NULL);
    t->rank = o->rank;
    t->size = o->size;
    t->op_timeout_ms = o->op_timeout_ms ? o->op_timeout_ms : DEFAULT_OP_TIMEOUT_MS;
    // A peer waits a quarter longer, so that rank 0 names a silent peer
    // before the others give up on rank 0 (at most 2^31 ms).
    int64_t peer_wait = (int64_t)t->op_timeout_ms + t->op_timeout_ms / 4;
    t->wait_ms = o->rank == 0 ? t->op_timeout_ms : (int32_t)(peer_wait < INT32_MAX ? peer_wait : INT32_MAX);
    snprintf(t->addr, sizeof t->addr, "%s:%d", o->host ? o->host : "*", o->port);

    int rc = 0;
    if (o->rank == 0 && o->size > 1) {
        int lfd = listen_on(t, o->host, o->port);
        if (lfd < 0) {
            rc = lfd;
        } else {
            rc = accept_peers(t, lfd, t0, deadline);
            close(lfd);
        }
    } else if (o->rank > 0) {
        rc = join(t, o->host, o->port, t0, deadline);
    }
    if (rc < 0) {
        tcp_free(t);
        free(c);
        return rc;
    }
    // A send blocked by a peer that stops reading gives up after the same
    // wait as a read (EAGAIN, "took no data for X s").
    struct timeval tv = {.tv_sec = t->wait_ms / 1000, .tv_usec = (t->wait_ms % 1000) * 1000};
    for (int i = 0; i < n_fds; i++)
        if (t->fds[i] >= 0) setsockopt(t->fds[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    *c = (pg_comm){.name = "tcp",
                   .rank = o->rank,
                   .size = o->size,
                   .ctx = t,
                   .all_reduce_sum = tcp_all_reduce_sum,
                   .all_gather = tcp_all_gather,
                   .all_to_all_v = tcp_all_to_all_v,
                   .broadcast = tcp_broadcast,
                   .barrier = tcp_barrier,
                   .abort = tcp_abort,
                   .destroy = tcp_destroy};
    *out = c;
    return 0;
}
