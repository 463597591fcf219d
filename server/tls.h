// server/tls.h - TLS for the HTTP server, on OpenSSL with memory BIOs.
//
// The connection code (server/http_conn.c) keeps owning the socket and the
// libuv reads and writes; TLS sits between them as two byte transforms:
// ciphertext received -> plaintext for llhttp (plus handshake bytes to
// send), and plaintext responses -> ciphertext to write. No OpenSSL call
// ever touches a socket, so backpressure, timers and closing work as for
// plain HTTP.
//
// A context holds the certificate chain and key (--ssl-certfile,
// --ssl-keyfile) and, with --ssl-ca-certs, the CAs client certificates must
// chain to: a client without a valid certificate then fails the handshake
// (mutual TLS). TLS 1.2 and 1.3 only. Everything runs on the loop thread.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "server/sbuf.h"

typedef struct srv_tls_ctx srv_tls_ctx;
typedef struct srv_tls srv_tls;

// Loads the certificate chain (PEM) from `certfile`, the private key from
// `keyfile` (NULL: from certfile too) and, when `ca_file` is not NULL, the
// CAs that client certificates are verified against (required then).
// Returns 0, or PG_EINVAL with a message naming the file and OpenSSL's
// reason (unreadable, not PEM, key does not match the certificate).
int srv_tls_ctx_create(const char *certfile, const char *keyfile, const char *ca_file, srv_tls_ctx **out);
void srv_tls_ctx_free(srv_tls_ctx *ctx);

// A server-side TLS session for one connection; aborts on out-of-memory.
srv_tls *srv_tls_new(srv_tls_ctx *ctx);
void srv_tls_free(srv_tls *t);

// Takes `n` bytes received from the peer: appends the decrypted application
// data to `plain` and whatever must be sent back (handshake, alerts,
// session tickets) to `wire`. Returns 0, or -1 when the session failed
// (bad handshake, an unverified client certificate, a protocol error) or
// the peer sent close_notify; the caller sends `wire` if it can and closes.
// The reason is in srv_tls_error().
int srv_tls_feed(srv_tls *t, const char *data, size_t n, sbuf *plain, sbuf *wire);

// Encrypts `n` bytes of application data into `wire`. Before the handshake
// completes the data waits inside the session and comes out with a later
// call. Returns 0, or -1 when the session failed.
int srv_tls_write(srv_tls *t, const char *data, size_t n, sbuf *wire);

// Appends a close_notify alert to `wire` (after the last response).
void srv_tls_close_notify(srv_tls *t, sbuf *wire);

// The last failure of this session, for a debug log line.
const char *srv_tls_error(const srv_tls *t);
