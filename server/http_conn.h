// server/http_conn.h - HTTP/1.1 server on a libuv loop: accept, read,
// llhttp parsing with limits and timers, and a write queue with
// backpressure.
//
// Requests on one connection are served strictly in order: when a request
// is complete the parser pauses, the request is handed to the handler, and
// the next pipelined request is parsed only after the previous response has
// ended. While a request is being served the connection keeps reading (to
// see a client that goes away) into a bounded buffer.
//
// Output is appended to a per-connection buffer and handed to uv_write once
// per loop iteration. When a connection's unsent output exceeds
// `out_high_water` it stops reading (no new requests are parsed); beyond
// `out_max` the client is deemed gone and the connection is closed, and so is
// a connection whose pending output makes no progress for `write_timeout_ms`.
//
// Lifetime: a srv_req belongs to its connection and is valid from
// on_request until the handler ends the response (srv_resp_send /
// srv_resp_end) or until the connection calls the request's on_abort hook
// (the client went away or stopped reading); after either the handler must
// not touch it. Handles are freed in their uv_close callbacks.
//
// Everything runs on the loop thread.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "server/sbuf.h"

typedef struct srv_http srv_http;
typedef struct srv_conn srv_conn;
typedef struct srv_req srv_req;

typedef struct srv_http_limits {
    size_t max_request_line;      // URL bytes (8 KiB) -> 414
    size_t max_header_bytes;      // header block (64 KiB) -> 431
    int max_headers;              // header count (100) -> 431
    size_t max_body;              // body bytes (2 MB) -> 413
    uint64_t header_timeout_ms;   // first byte .. end of headers (30 s) -> 408
    uint64_t body_timeout_ms;     // end of headers .. end of body (60 s) -> 408
    uint64_t keepalive_timeout_ms;// idle between requests (75 s) -> close
    uint64_t write_timeout_ms;    // pending output without progress (60 s) -> close
    size_t out_high_water;        // unsent output at which reading stops (256 KiB)
    size_t out_max;               // unsent output at which the client is dropped (4 MiB)
    size_t max_pipeline;          // buffered unparsed input while busy (64 KiB)
    int max_connections;          // open connections (4096); more are closed at accept
    size_t max_body_total;        // request body bytes buffered over all connections
                                  // (256 MiB) -> 503 + Retry-After, connection closed
} srv_http_limits;

void srv_http_limits_default(srv_http_limits *l);

struct srv_req {
    srv_conn *conn;
    int method;                   // enum llhttp_method
    const char *method_name;
    const char *path;             // NUL-terminated, without the query
    const char *query;            // after '?', "" when none
    const char *body;             // NUL-terminated (NUL not counted)
    size_t body_len;
    int http_minor;               // 1.0 or 1.1
    bool keep_alive;
    int64_t start_ns;             // first byte of the request (pg_now_ns)
    // Set by the handler when it answers later (from engine events): called
    // once if the connection dies before the response ends.
    void (*on_abort)(srv_req *r, void *ud);
    void *ud;
    const char *route;            // label for metrics (set by the router)
    // Header lines ("Name: value\r\n") added to this request's response,
    // whatever the status: set by the router (CORS, server/cors.h); "" none.
    char resp_headers[512];
};

// The first header named `name` (case-insensitive), or NULL.
const char *srv_req_header(const srv_req *r, const char *name);

typedef struct srv_http_handlers {
    // A complete request: answer now or later with srv_resp_*.
    void (*on_request)(srv_req *r, void *ctx);
    // The JSON (or text) body for a protocol error the HTTP layer answers
    // itself (400, 408, 413, 414, 431, 503, 505). May be NULL: plain text.
    void (*error_body)(int status, const char *message, sbuf *out, void *ctx);
    // Called once per response with its status (for metrics); `route` is
    // the request's route label or "http" for protocol errors. 499 when the
    // client went away before a response ended. May be NULL.
    void (*on_response)(const char *route, int status, void *ctx);
    void *ctx;
} srv_http_handlers;

// Binds host:port and starts accepting. Errors (address in use, bad host)
// are returned with the message set.
int srv_http_start(uv_loop_t *loop, const char *host, int port, const srv_http_limits *lim,
                   const srv_http_handlers *h, srv_http **out);

// Serves every connection accepted from now on over TLS with `ctx`
// (server/tls.h; borrowed: it must outlive the server). Before the loop runs.
struct srv_tls_ctx;
void srv_http_set_tls(srv_http *s, struct srv_tls_ctx *ctx);

// Graceful shutdown: stops accepting, closes idle connections, and closes
// every other connection after its current response.
void srv_http_drain(srv_http *s);
bool srv_http_draining(const srv_http *s);
// The port listened on (the kernel's choice when started with port 0).
int srv_http_port(const srv_http *s);
int srv_http_num_connections(const srv_http *s);

// Closes every connection (aborting requests in flight) and the listener;
// `done` runs when all handles are closed and `s` is freed.
void srv_http_close(srv_http *s, void (*done)(void *arg), void *arg);

// --- responses -------------------------------------------------------------------

// A whole response with Content-Length. `extra_headers` is "" or lines each
// ending in "\r\n". Ends the request.
void srv_resp_send(srv_req *r, int status, const char *content_type, const char *extra_headers,
                   const char *body, size_t len);

// A streamed response: chunked on HTTP/1.1, close-delimited on 1.0.
void srv_resp_begin(srv_req *r, int status, const char *content_type, const char *extra_headers);
// Appends body bytes. Returns -1 when the connection is closing (the
// handler's on_abort follows), else 0.
int srv_resp_write(srv_req *r, const char *data, size_t len);
// Ends a streamed response (ends the request).
void srv_resp_end(srv_req *r);

// Bytes of output queued on the request's connection and not yet written.
size_t srv_resp_pending(const srv_req *r);

const char *srv_status_text(int status);
