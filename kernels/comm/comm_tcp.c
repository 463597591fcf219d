// kernels/comm/comm_tcp.c - the TCP communicator (kernels/comm/comm.h): one rank per
// call, the ranks in any process on any host, a star through rank 0.
//
// This file: set-up (rank 0 listens and accepts, a peer connects; the
// hello and the welcome), abort, destroy and pg_comm_tcp_create. The
// design and the wire format: kernels/comm/comm_tcp_int.h; the
// collectives: comm_tcp_collectives.c; encoding, socket I/O and failure:
// comm_tcp_io.c.
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
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/net.h"
#include "kernels/comm/comm.h"
#include "kernels/comm/comm_tcp_int.h"

// ---------------------------------------------------------------- the table (abort, destroy)

// Any thread, while this rank's thread may be inside a collective: the
// shut-down sockets wake it (recv and poll return, a blocked send fails),
// and it reports the abort; the other ranks see the connections close.
static void tcp_abort(pg_comm *c, const char *why) {
    tcp_ctx *t = c->ctx;
    pthread_mutex_lock(&t->mu);
    if (!t->broken) {
        t->broken = t->aborted = true;
        snprintf(t->why, sizeof t->why, "aborted: %s", why && *why ? why : "(no reason given)");
        tcp_shutdown_all(t);
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
    tcp_put32(h, HELLO_MAGIC);
    tcp_put32(h + 4, status);
    tcp_put32(h + 8, (uint32_t)len);
    return tcp_write_buf(fd, h, sizeof h, why, len);
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
        if (tcp_read_all(fd, h, sizeof h, deadline) < 0 || tcp_get32(h) != HELLO_MAGIC) {
            close(fd);
            continue;
        }
        uint32_t version = tcp_get32(h + 4);
        int32_t rank = (int32_t)tcp_get32(h + 8), size = (int32_t)tcp_get32(h + 12);
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
    tcp_put32(h, HELLO_MAGIC);
    tcp_put32(h + 4, PROTO_VERSION);
    tcp_put32(h + 8, (uint32_t)t->rank);
    tcp_put32(h + 12, (uint32_t)t->size);
    int rc = tcp_write_buf(fd, h, sizeof h, NULL, 0);
    uint8_t w[12];
    if (rc == 0) rc = tcp_read_all(fd, w, sizeof w, deadline);
    if (rc == -ETIMEDOUT)
        return pg_err_set(PG_EIO,
                          "tcp communicator (rank %d of %d): connected to %s but the group was not complete after "
                          "%.1f s",
                          t->rank, t->size, t->addr, secs_since(t0));
    if (rc < 0)
        return pg_err_set(PG_EIO, "tcp communicator (rank %d of %d): rank 0 at %s %s before welcoming this rank",
                          t->rank, t->size, t->addr, tcp_io_reason(t, rc));
    if (tcp_get32(w) != HELLO_MAGIC)
        return pg_err_set(PG_EIO, "tcp communicator (rank %d of %d): %s is not a paged communicator", t->rank,
                          t->size, t->addr);
    if (tcp_get32(w + 4) != 0) {
        char why[MAX_WHY] = "";
        uint32_t len = tcp_get32(w + 8);
        size_t n = len < sizeof why - 1 ? len : sizeof why - 1;
        if (tcp_read_all(fd, why, n, pg_now_ns() + 1000000000) == 0) why[n] = 0;
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
