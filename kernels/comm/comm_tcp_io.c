// kernels/comm/comm_tcp_io.c - what the TCP communicator's set-up and its
// collectives both build on: the wire encoding, socket reads and writes
// bounded by the timeouts, and breaking the communicator on a failure
// (telling the peers why). The design and the wire format:
// kernels/comm/comm_tcp_int.h.
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/comm/comm_op.h"
#include "kernels/comm/comm_tcp_int.h"
#include "kernels/dtype.h"

// ---------------------------------------------------------------- encoding

void tcp_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
void tcp_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
uint32_t tcp_get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
uint64_t tcp_get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void tcp_frame_encode(uint8_t p[HEADER_BYTES], const frame *f) {
    tcp_put32(p, FRAME_MAGIC);
    p[4] = f->op;
    p[5] = f->dtype;
    p[6] = (uint8_t)f->status;
    p[7] = (uint8_t)(f->status >> 8);
    tcp_put32(p + 8, f->seq);
    tcp_put32(p + 12, (uint32_t)f->root);
    tcp_put64(p + 16, f->bytes);
}

bool tcp_frame_decode(const uint8_t p[HEADER_BYTES], frame *f) {
    if (tcp_get32(p) != FRAME_MAGIC) return false;
    f->op = p[4];
    f->dtype = p[5];
    f->status = (uint16_t)(p[6] | p[7] << 8);
    f->seq = tcp_get32(p + 8);
    f->root = (int32_t)tcp_get32(p + 12);
    f->bytes = tcp_get64(p + 16);
    return true;
}

void tcp_frame_describe(char *out, size_t cap, const frame *f) {
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

int tcp_write_buf(int fd, const void *a, size_t na, const void *b, size_t nb) {
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
int tcp_read_all(int fd, void *buf, size_t n, int64_t deadline_ns) { return read_bytes(fd, buf, n, deadline_ns, -1); }
int tcp_read_idle(int fd, void *buf, size_t n, int32_t idle_ms) { return read_bytes(fd, buf, n, -1, idle_ms); }

// What a failed transfer with a peer says after "rank N ". A timeout is
// reported with this rank's wait (reads; writes time out through
// SO_SNDTIMEO, set to the same wait).
const char *tcp_io_reason(const tcp_ctx *t, int rc) {
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

void tcp_shutdown_all(tcp_ctx *t) {
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
int tcp_fail(tcp_ctx *t, int code, const char *why) {
    char first[MAX_WHY];
    pthread_mutex_lock(&t->mu);
    if (!t->broken) {
        t->broken = true;
        snprintf(t->why, sizeof t->why, "%s", why);
        tcp_shutdown_all(t);
    }
    bool aborted = t->aborted;
    memcpy(first, t->why, sizeof first);
    pthread_mutex_unlock(&t->mu);
    if (aborted) return pg_err_set(PG_EIO, "tcp communicator (rank %d of %d): %s", t->rank, t->size, first);
    return pg_err_set(code, "tcp communicator (rank %d of %d): %s", t->rank, t->size, why);
}

// Rank 0, before it has answered: tells every peer why (best effort, they
// are all waiting for an answer header), then breaks.
int tcp_root_fail(tcp_ctx *t, int code, const frame *self, const char *why) {
    // (An abort racing with this may shut the sockets down first: these
    // best-effort sends then fail, and tcp_fail() below reports the abort.)
    if (!is_broken(t)) {
        size_t len = strlen(why);
        frame e = *self;
        e.status = (uint16_t)-code; // the PG_E* code, negated
        e.bytes = len;
        uint8_t h[HEADER_BYTES];
        tcp_frame_encode(h, &e);
        for (int r = 1; r < t->size; r++) {
            if (t->fds[r] < 0) continue;
            struct iovec iov[2] = {{h, sizeof h}, {(void *)why, len}};
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
            (void)!sendmsg(t->fds[r], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
    }
    return tcp_fail(t, code, why);
}

int tcp_peer_io_fail(tcp_ctx *t, const frame *f, int who, int rc) {
    char why[MAX_WHY];
    snprintf(why, sizeof why, "%s #%u: rank %d %s", pg_comm_op_name(f->op), f->seq, who, tcp_io_reason(t, rc));
    return tcp_fail(t, PG_EIO, why);
}

// Rank 0 failed reading rank `who`'s data: before any answer went out the
// peers still wait for an answer header, so they are told why.
int tcp_root_read_fail(tcp_ctx *t, const frame *f, int who, int rc, bool answered) {
    if (answered) return tcp_peer_io_fail(t, f, who, rc);
    char why[MAX_WHY];
    snprintf(why, sizeof why, "%s #%u: rank %d %s", pg_comm_op_name(f->op), f->seq, who, tcp_io_reason(t, rc));
    return tcp_root_fail(t, PG_EIO, f, why);
}
