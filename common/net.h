// common/net.h - blocking TCP helpers: listen, accept within a deadline,
// connect with retries, whole reads and writes (EINTR and partial
// transfers handled). Errors are PG_EIO with a message naming the address
// or the peer and the reason (common/err.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>

// Listens on host:port (every address when host is NULL or empty), with
// SO_REUSEADDR.
int pg_net_listen(const char *host, int port, int backlog, int *fd_out);
// Accepts one connection, waiting at most timeout_ms (< 0: forever).
int pg_net_accept(int listen_fd, int timeout_ms, int *fd_out);
// Connects to host:port, retrying every 100 ms until timeout_ms has passed
// (the other side may not listen yet); TCP_NODELAY is set.
// A connection that TCP's simultaneous open joined to itself (its local and
// peer addresses equal) is closed and retried, never returned.
int pg_net_connect(const char *host, int port, int timeout_ms, int *fd_out);
// Whether connected socket fd's two ends are the same address.
bool pg_net_self_connected(int fd);
int pg_net_write_all(int fd, const void *buf, size_t n);
// PG_EIO "connection closed" when the peer closes before n bytes.
int pg_net_read_all(int fd, void *buf, size_t n);
