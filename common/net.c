// common/net.c - blocking TCP helpers (common/net.h).
#include "common/net.h"

#include <errno.h>
#include <stdbool.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int resolve(const char *host, int port, bool passive, struct addrinfo **out) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    int rc = getaddrinfo(host && *host ? host : NULL, ps, &hints, out);
    if (rc != 0)
        return pg_err_set(PG_EIO, "cannot resolve %s:%d: %s", host && *host ? host : "*", port, gai_strerror(rc));
    return 0;
}

int pg_net_listen(const char *host, int port, int backlog, int *fd_out) {
    struct addrinfo *ai;
    PG_TRY(resolve(host, port, true, &ai));
    int fd = -1, err = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return pg_err_set(PG_EIO, "cannot listen on %s:%d: %s", host && *host ? host : "*", port, strerror(err));
    *fd_out = fd;
    return 0;
}

int pg_net_accept(int listen_fd, int timeout_ms, int *fd_out) {
    struct pollfd p = {.fd = listen_fd, .events = POLLIN};
    for (;;) {
        int n = poll(&p, 1, timeout_ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return pg_err_set(PG_EIO, "accept: %s", strerror(errno));
        if (n == 0) return pg_err_set(PG_EIO, "no connection within %.0f s", timeout_ms / 1000.0);
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0 && (errno == EINTR || errno == ECONNABORTED)) continue;
        if (fd < 0) return pg_err_set(PG_EIO, "accept: %s", strerror(errno));
        nodelay(fd);
        *fd_out = fd;
        return 0;
    }
}

// A connect to a local port that nobody listens on can succeed against
// itself: when the kernel happens to pick the destination port as the
// ephemeral source port, TCP's simultaneous open joins the socket to itself
// (the retry loop below makes that likely enough to have failed a CI run:
// the follower read its own hello back). Such a socket's two ends are equal.
bool pg_net_self_connected(int fd) {
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) < 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) < 0)
        return false;
    return ml == pl && memcmp(&me, &peer, ml) == 0;
}

int pg_net_connect(const char *host, int port, int timeout_ms, int *fd_out) {
    const int64_t deadline = pg_now_ns() + (int64_t)timeout_ms * 1000000;
    int err = 0;
    for (;;) {
        struct addrinfo *ai;
        PG_TRY(resolve(host, port, false, &ai));
        for (struct addrinfo *a = ai; a; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) {
                err = errno;
                continue;
            }
            if (connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
                err = errno;
            } else if (pg_net_self_connected(fd)) {
                err = ECONNREFUSED; // nobody listens: what a plain refusal would have said
            } else {
                freeaddrinfo(ai);
                nodelay(fd);
                *fd_out = fd;
                return 0;
            }
            close(fd);
        }
        freeaddrinfo(ai);
        if (pg_now_ns() >= deadline) break;
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    }
    return pg_err_set(PG_EIO, "cannot connect to %s:%d: %s after %.0f s", host, port, strerror(err),
                      timeout_ms / 1000.0);
}

int pg_net_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return pg_err_set(PG_EIO, "send: %s", w < 0 ? strerror(errno) : "nothing written");
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int pg_net_read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return pg_err_set(PG_EIO, "connection closed");
        if (r < 0) return pg_err_set(PG_EIO, "recv: %s", strerror(errno));
        p += r;
        n -= (size_t)r;
    }
    return 0;
}
