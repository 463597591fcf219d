// kernels/comm/comm_tcp_collectives.c - the TCP communicator's collectives
// (all_reduce_sum, all_gather, all_to_all_v, broadcast, barrier): rank 0's
// side, which checks every rank's call and does the work, and a peer's.
// The design and the wire format: kernels/comm/comm_tcp_int.h.
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/half.h"
#include "kernels/comm/comm_op.h"
#include "kernels/comm/comm_tcp_int.h"
#include "kernels/dtype.h"

// ---------------------------------------------------------------- rank 0

// Checks peer r's header against rank 0's own call.
static int root_check_header(tcp_ctx *t, const frame *self, int r, const uint8_t h[HEADER_BYTES]) {
    char why[MAX_WHY];
    frame f;
    if (!tcp_frame_decode(h, &f)) {
        snprintf(why, sizeof why, "%s #%u: rank %d sent a malformed frame header", pg_comm_op_name(self->op),
                 self->seq, r);
        return tcp_root_fail(t, PG_EIO, self, why);
    }
    if (f.op != self->op || f.seq != self->seq || f.bytes != self->bytes || f.dtype != self->dtype ||
        f.root != self->root) {
        char a[160], b[160];
        tcp_frame_describe(a, sizeof a, self);
        tcp_frame_describe(b, sizeof b, &f);
        snprintf(why, sizeof why, "collectives differ between ranks: rank 0 calls %s, rank %d calls %s", a, r, b);
        return tcp_root_fail(t, PG_EINVAL, self, why);
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
            return tcp_root_fail(t, PG_EIO, self, why);
        }
        if (pr == 0 && pg_now_ns() < deadline) continue;
        if (pr == 0) {
            int r = 1;
            while (got[r - 1]) r++;
            snprintf(why, sizeof why, "%s #%u: rank %d %s", pg_comm_op_name(self->op), self->seq, r,
                     tcp_io_reason(t, -ETIMEDOUT));
            return tcp_root_fail(t, PG_EIO, self, why);
        }
        for (int r = 1; r < t->size; r++) {
            short ev = pfd[r - 1].revents;
            if (!ev) continue;
            int rc = -ENOTCONN;
            if (!got[r - 1] && (ev & POLLIN)) {
                uint8_t h[HEADER_BYTES];
                rc = tcp_read_idle(t->fds[r], h, sizeof h, t->op_timeout_ms);
                if (rc == 0) {
                    PG_TRY(root_check_header(t, self, r, h));
                    got[r - 1] = true;
                    left--;
                    continue;
                }
            } else if (got[r - 1] && !(ev & (POLLRDHUP | POLLHUP | POLLERR))) {
                continue;
            }
            snprintf(why, sizeof why, "%s #%u: rank %d %s", pg_comm_op_name(self->op), self->seq, r, tcp_io_reason(t, rc));
            return tcp_root_fail(t, PG_EIO, self, why);
        }
    }
    return 0;
}

// Sends the answer header (first round only) and `n` bytes of data.
static int root_answer(tcp_ctx *t, const frame *self, int r, bool with_header, const void *data, size_t n) {
    uint8_t h[HEADER_BYTES];
    tcp_frame_encode(h, self);
    int rc = with_header ? tcp_write_buf(t->fds[r], h, sizeof h, data, n) : tcp_write_buf(t->fds[r], data, n, NULL, 0);
    return rc < 0 ? tcp_peer_io_fail(t, self, r, rc) : 0;
}

// Rank 0's scratch for all_reduce_sum and all_to_all_v, at the first use.
static int root_scratch(tcp_ctx *t) {
    if (t->scratch && t->acc) return 0;
    if (!t->scratch) t->scratch = malloc(CHUNK_BYTES);
    if (!t->acc) t->acc = malloc(CHUNK_BYTES / 2 * sizeof(float));
    return t->scratch && t->acc ? 0 : tcp_fail(t, PG_ENOMEM, "out of memory for rank 0's scratch");
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
            int rc = tcp_read_idle(t->fds[r], t->scratch, (size_t)m * esz, t->wait_ms);
            if (rc < 0) return tcp_root_read_fail(t, self, r, rc, off > 0);
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
        int rc = tcp_read_idle(t->fds[r], (char *)recv + (size_t)r * bytes, bytes, t->wait_ms);
        if (rc < 0) return tcp_root_read_fail(t, self, r, rc, false);
    }
    for (int r = 1; r < t->size; r++) PG_TRY(root_answer(t, self, r, true, recv, bytes * (size_t)t->size));
    return 0;
}

static int root_broadcast(tcp_ctx *t, const frame *self, void *buf, size_t bytes, int32_t root) {
    PG_TRY(root_headers(t, self));
    if (root != 0) {
        int rc = tcp_read_idle(t->fds[root], buf, bytes, t->wait_ms);
        if (rc < 0) return tcp_root_read_fail(t, self, root, rc, false);
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
        tcp_put64(p + A2A_ENTRY_BYTES * d, sbytes[d]);
        tcp_put64(p + A2A_ENTRY_BYTES * d + 8, rbytes[d]);
    }
}

// A piece rank 0 relays from peer s to peer d, a chunk at a time through its
// scratch buffer.
static int root_relay(tcp_ctx *t, const frame *self, int s, int d, size_t len) {
    for (size_t off = 0; off < len;) {
        size_t m = len - off < CHUNK_BYTES ? len - off : CHUNK_BYTES;
        int rc = tcp_read_idle(t->fds[s], t->scratch, m, t->wait_ms);
        if (rc < 0) return tcp_peer_io_fail(t, self, s, rc);
        rc = tcp_write_buf(t->fds[d], t->scratch, m, NULL, 0);
        if (rc < 0) return tcp_peer_io_fail(t, self, d, rc);
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
        int rc = tcp_read_idle(t->fds[s], wire, (size_t)n * A2A_ENTRY_BYTES, t->wait_ms);
        if (rc < 0) return tcp_root_read_fail(t, self, s, rc, false);
        for (int d = 0; d < n; d++) {
            tab[s * n + d][0] = tcp_get64(wire + A2A_ENTRY_BYTES * d);
            tab[s * n + d][1] = tcp_get64(wire + A2A_ENTRY_BYTES * d + 8);
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
            return tcp_root_fail(t, PG_EINVAL, self, why);
        }
    return 0;
}

static int root_all_to_all_v(tcp_ctx *t, const frame *self, const void *send, const size_t *sbytes,
                             const size_t *soff, void *recv, const size_t *rbytes, const size_t *roff) {
    PG_TRY(root_headers(t, self));
    int n = t->size;
    uint64_t(*tab)[2] = malloc(sizeof *tab * (size_t)n * (size_t)n);
    uint8_t *wire = malloc((size_t)n * A2A_ENTRY_BYTES);
    int rc = tab && wire ? root_scratch(t) : tcp_root_fail(t, PG_ENOMEM, self, "out of memory for the size tables");
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
                int w = tcp_write_buf(t->fds[d], (const char *)send + soff[d], len, NULL, 0);
                if (w < 0) rc = tcp_peer_io_fail(t, self, d, w);
            } else if (d == 0) {
                int r = tcp_read_idle(t->fds[s], (char *)recv + roff[s], len, t->wait_ms);
                if (r < 0) rc = tcp_peer_io_fail(t, self, s, r);
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
        if (pr < 0) return tcp_peer_io_fail(t, self, 0, -errno);
        if (pr == 0) return tcp_peer_io_fail(t, self, 0, rs < n ? -ETIMEDOUT : -EAGAIN);
        if (rs < n && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t k = recv(fd, in + roff[rs] + rdone, rbytes[rs] - rdone, MSG_DONTWAIT);
            if (k == 0) return tcp_peer_io_fail(t, self, 0, -ENOTCONN);
            if (k < 0 && !io_retry(errno)) return tcp_peer_io_fail(t, self, 0, -errno);
            if (k > 0) rdone += (size_t)k;
        }
        if (sd < n && (p.revents & (POLLOUT | POLLHUP | POLLERR))) {
            ssize_t k = send(fd, out + soff[sd] + sdone, sbytes[sd] - sdone, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k < 0 && !io_retry(errno)) return tcp_peer_io_fail(t, self, 0, -errno);
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
    tcp_frame_encode(h, self);
    int rc = with_header ? tcp_write_buf(t->fds[0], h, sizeof h, data, n) : tcp_write_buf(t->fds[0], data, n, NULL, 0);
    if (rc == 0) return 0;
    if (with_header && tcp_read_all(t->fds[0], h, sizeof h, pg_now_ns() + 200000000) == 0) {
        int e = peer_answer_header(t, self, h);
        if (e < 0) return e;
    }
    return tcp_peer_io_fail(t, self, 0, rc);
}

// Reads rank 0's answer header: an error it reports, or the same call.
static int peer_answer(tcp_ctx *t, const frame *self) {
    uint8_t h[HEADER_BYTES];
    int rc = tcp_read_idle(t->fds[0], h, sizeof h, t->wait_ms);
    if (rc < 0) return tcp_peer_io_fail(t, self, 0, rc);
    return peer_answer_header(t, self, h);
}

static int peer_answer_header(tcp_ctx *t, const frame *self, const uint8_t h[HEADER_BYTES]) {
    frame f;
    char why[MAX_WHY];
    if (!tcp_frame_decode(h, &f)) {
        snprintf(why, sizeof why, "%s #%u: rank 0 sent a malformed frame header", pg_comm_op_name(self->op), self->seq);
        return tcp_fail(t, PG_EIO, why);
    }
    if (f.status) {
        char msg[MAX_WHY - 32] = "";
        size_t len = f.bytes < sizeof msg - 1 ? (size_t)f.bytes : sizeof msg - 1;
        if (tcp_read_all(t->fds[0], msg, len, pg_now_ns() + 1000000000) == 0) msg[len] = 0;
        snprintf(why, sizeof why, "rank 0 reports: %s", msg[0] ? msg : "(no reason)");
        return tcp_fail(t, f.status == -PG_EINVAL ? PG_EINVAL : PG_EIO, why);
    }
    if (f.op != self->op || f.seq != self->seq) {
        char a[160], b[160];
        tcp_frame_describe(a, sizeof a, self);
        tcp_frame_describe(b, sizeof b, &f);
        snprintf(why, sizeof why, "rank 0 answered %s to this rank's %s", b, a);
        return tcp_fail(t, PG_EIO, why);
    }
    return 0;
}

static int peer_recv(tcp_ctx *t, const frame *self, void *data, size_t n) {
    int rc = tcp_read_idle(t->fds[0], data, n, t->wait_ms);
    return rc < 0 ? tcp_peer_io_fail(t, self, 0, rc) : 0;
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
    return tcp_fail(t, PG_EINVAL, why);
}

int tcp_all_reduce_sum(pg_comm *c, void *buf, int64_t count, int32_t dtype) {
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

int tcp_all_gather(pg_comm *c, const void *send, void *recv, size_t bytes) {
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

int tcp_all_to_all_v(pg_comm *c, const void *send, const size_t *sbytes, const size_t *soff, void *recv,
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
    if (!wire) return tcp_fail(t, PG_ENOMEM, "out of memory for the all_to_all_v size table");
    a2a_table_encode(wire, t->size, sbytes, rbytes);
    int rc = peer_send(t, &f, true, wire, (size_t)f.bytes);
    free(wire);
    PG_TRY(rc);
    PG_TRY(peer_answer(t, &f));
    return peer_a2a_exchange(t, &f, send, sbytes, soff, recv, rbytes, roff);
}

int tcp_broadcast(pg_comm *c, void *buf, size_t bytes, int32_t root) {
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

int tcp_barrier(pg_comm *c) {
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
