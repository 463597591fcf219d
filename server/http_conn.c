// server/http_conn.c - connections: accept, read, parse with limits,
// timers, ordered responses and a write queue with backpressure.
#include "server/http_conn.h"

#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "server/tls.h"

#define READ_CHUNK 65536
#define LINGER_MS 2000

// Connection states. READ: parsing requests (or idle between them). BUSY: a
// request is with the handler. DONE: the last response is being written,
// then the connection closes. LINGER: write side shut down, input discarded
// until the client closes (so it reads our response before any RST).
typedef enum { C_READ, C_BUSY, C_DONE, C_LINGER, C_CLOSING } conn_state;
// Where the request being read is: nothing yet, in the headers, in the body.
typedef enum { P_IDLE, P_HEADERS, P_BODY } parse_phase;
// Header accumulation: after a field's last piece a value is expected.
typedef enum { H_NONE, H_FIELD, H_VALUE } hdr_state;

struct srv_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shutdown;
    srv_http *srv;
    llhttp_t parser;
    conn_state state;
    parse_phase phase;
    uint64_t phase_ms;        // loop time the phase (or idle / linger) began
    bool first_request;       // nothing received yet: idle limit is the header timeout
    bool reading, eof, parsing;
    bool dispatched;          // req is with the handler, response not ended
    bool resp_open, resp_chunked;
    bool close_after;         // close once the current response is written
    bool in_work, want_close, want_parse, dirty;
    int open_handles;

    // Input: bytes received, [in_off, in.len) not parsed yet.
    sbuf in;
    size_t in_off;
    int err_status;           // set by a parser callback that rejects the request
    char err_msg[160];

    // The request being read / served.
    sbuf url, hdr, body;      // hdr: "name\0value\0" pairs
    int n_hdr;
    size_t hdr_bytes;
    size_t hfield_off;        // where the header name being read starts in `hdr`
    hdr_state hstate;
    srv_req req;

    // Output: `out` not handed to libuv yet, `inflight` handed and not done.
    sbuf out;
    size_t inflight;
    uint64_t progress_ms;     // last write progress (or when output became pending)

    // TLS (NULL: plain HTTP): ciphertext is read into `raw` and decrypted
    // into `in`; `out` is encrypted into `wire`, which is what gets written.
    srv_tls *tls;
    sbuf raw, wire;

    srv_conn *prev, *next;    // all connections of the server
    srv_conn *work_next;
};

struct srv_http {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_idle_t work;
    bool listening, draining, closing;
    int port;                 // bound port (the one asked for, or the kernel's for 0)
    int open_handles;
    srv_http_limits lim;
    srv_http_handlers h;
    llhttp_settings_t settings;
    srv_conn *conns;
    int n_conns;
    size_t body_bytes;        // request body bytes buffered over all connections
    srv_tls_ctx *tls;         // borrowed; NULL: plain HTTP
    srv_conn *work_head;
    void (*done)(void *arg);
    void *done_arg;
};

void srv_http_limits_default(srv_http_limits *l) {
    l->max_request_line = 8 << 10;
    l->max_header_bytes = 64 << 10;
    l->max_headers = 100;
    l->max_body = 2 << 20;
    l->header_timeout_ms = 30000;
    l->body_timeout_ms = 60000;
    l->keepalive_timeout_ms = 75000;
    l->write_timeout_ms = 60000;
    l->out_high_water = 256 << 10;
    l->out_max = 4 << 20;
    l->max_pipeline = 64 << 10;
    l->max_connections = 4096;
    l->max_body_total = 256 << 20;
}

const char *srv_status_text(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

static size_t pending_out(const srv_conn *c) { return c->out.len + c->wire.len + c->inflight; }

// --- deferred work -----------------------------------------------------------------
// Closing a connection, parsing the next pipelined request and flushing
// output run from an idle handle: never from inside a handler's call
// stack, and still before the loop next blocks.

static void work_cb(uv_idle_t *h);

static void work_push(srv_conn *c) {
    if (c->state == C_CLOSING) return;
    if (!c->in_work) {
        c->in_work = true;
        c->work_next = c->srv->work_head;
        c->srv->work_head = c;
    }
    uv_idle_start(&c->srv->work, work_cb);  // no-op when active
}

static void conn_mark_dirty(srv_conn *c) {
    c->dirty = true;
    work_push(c);
}

static void conn_schedule_close(srv_conn *c) {
    c->want_close = true;
    work_push(c);
}

static void conn_arm_timer(srv_conn *c);
static void conn_update_reading(srv_conn *c);
static void conn_parse(srv_conn *c);
static void conn_flush(srv_conn *c);
static void conn_close_now(srv_conn *c);
static int conn_write(srv_conn *c, sbuf *src);

static void work_cb(uv_idle_t *h) {
    srv_http *s = h->data;
    srv_conn *c;
    while ((c = s->work_head)) {
        s->work_head = c->work_next;
        c->in_work = false;
        if (c->state == C_CLOSING) continue;
        if (c->want_close) {
            conn_close_now(c);
            continue;
        }
        if (c->want_parse) {
            c->want_parse = false;
            conn_parse(c);
        }
        if (c->dirty && c->state != C_CLOSING && !c->want_close) {
            c->dirty = false;
            conn_flush(c);
        }
    }
    uv_idle_stop(h);
}

// --- closing ------------------------------------------------------------------------

static void srv_maybe_done(srv_http *s) {
    if (!s->closing || s->n_conns > 0 || s->open_handles > 0) return;
    void (*done)(void *) = s->done;
    void *arg = s->done_arg;
    free(s);
    if (done) done(arg);
}

static void conn_on_close(uv_handle_t *h) {
    srv_conn *c = h->data;
    if (--c->open_handles > 0) return;
    srv_http *s = c->srv;
    if (c->in_work)  // queued after it was closed: unlink before freeing
        for (srv_conn **w = &s->work_head; *w; w = &(*w)->work_next)
            if (*w == c) {
                *w = c->work_next;
                break;
            }
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    sbuf_free(&c->in);
    sbuf_free(&c->url);
    sbuf_free(&c->hdr);
    s->body_bytes -= c->body.len;
    sbuf_free(&c->body);
    sbuf_free(&c->out);
    sbuf_free(&c->raw);
    sbuf_free(&c->wire);
    srv_tls_free(c->tls);
    free(c);
    srv_maybe_done(s);
}

// Closes both handles. A request still with the handler is aborted first;
// writes in flight complete with UV_ECANCELED before the close callbacks.
static void conn_close_now(srv_conn *c) {
    if (c->state == C_CLOSING) return;
    bool aborted = c->dispatched;
    c->state = C_CLOSING;
    c->dispatched = false;
    if (aborted) {
        void (*hook)(srv_req *, void *) = c->req.on_abort;
        void *ud = c->req.ud;
        c->req.on_abort = NULL;
        if (!c->resp_open && c->srv->h.on_response)
            c->srv->h.on_response(c->req.route ? c->req.route : "other", 499, c->srv->h.ctx);
        if (hook) hook(&c->req, ud);
    }
    uv_close((uv_handle_t *)&c->tcp, conn_on_close);
    uv_close((uv_handle_t *)&c->timer, conn_on_close);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
    srv_conn *c = req->data;
    if (status < 0 && c->state == C_LINGER) conn_schedule_close(c);
}

// All output written: shut down our side and wait briefly for the client
// to close, discarding what it still sends.
static void conn_start_linger(srv_conn *c) {
    c->state = C_LINGER;
    c->phase_ms = uv_now(c->srv->loop);
    if (c->tls) {  // close_notify first: libuv shuts down after pending writes
        srv_tls_close_notify(c->tls, &c->wire);
        if (c->wire.len > 0 && conn_write(c, &c->wire) < 0) return;
    }
    c->shutdown.data = c;
    if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        conn_schedule_close(c);
        return;
    }
    conn_update_reading(c);
    conn_arm_timer(c);
}

// --- writing --------------------------------------------------------------------------

typedef struct {
    uv_write_t req;
    srv_conn *conn;
    char *data;
    size_t len;
} write_req;

static void on_write(uv_write_t *w, int status) {
    write_req *wr = (write_req *)w;
    srv_conn *c = wr->conn;
    c->inflight -= wr->len;
    free(wr->data);
    free(wr);
    if (c->state == C_CLOSING) return;
    if (status < 0) {
        PG_LOGD("http: write failed: %s", uv_strerror(status));
        conn_schedule_close(c);
        return;
    }
    c->progress_ms = uv_now(c->srv->loop);
    if (c->state == C_DONE && pending_out(c) == 0) {
        conn_start_linger(c);
        return;
    }
    // Below the high-water mark again: read and parse pipelined requests.
    if (c->state == C_READ && c->in.len > c->in_off && pending_out(c) < c->srv->lim.out_high_water) {
        c->want_parse = true;
        work_push(c);
    }
    conn_update_reading(c);
    conn_arm_timer(c);
}

// Hands all of `src` to libuv. Returns -1 (connection closing) on failure.
static int conn_write(srv_conn *c, sbuf *src) {
    write_req *wr = pg_xmalloc(sizeof *wr);
    wr->conn = c;
    wr->data = sbuf_steal(src, &wr->len);
    uv_buf_t buf = uv_buf_init(wr->data, (unsigned)wr->len);
    if (c->inflight == 0) c->progress_ms = uv_now(c->srv->loop);
    int rc = uv_write(&wr->req, (uv_stream_t *)&c->tcp, &buf, 1, on_write);
    if (rc < 0) {
        free(wr->data);
        free(wr);
        conn_schedule_close(c);
        return -1;
    }
    c->inflight += wr->len;
    return 0;
}

static void conn_flush(srv_conn *c) {
    if (c->tls && c->out.len > 0) {
        if (srv_tls_write(c->tls, c->out.p, c->out.len, &c->wire) < 0) {
            PG_LOGD("http: TLS: %s", srv_tls_error(c->tls));
            conn_schedule_close(c);
            return;
        }
        sbuf_reset(&c->out);
    }
    sbuf *src = c->tls ? &c->wire : &c->out;
    if (src->len == 0) {
        if (c->state == C_DONE && c->inflight == 0) conn_start_linger(c);
        return;
    }
    if (conn_write(c, src) < 0) return;
    conn_update_reading(c);
    conn_arm_timer(c);
}

// --- timers ------------------------------------------------------------------------------

static void on_timer(uv_timer_t *t);

static uint64_t conn_deadline(const srv_conn *c) {
    const srv_http_limits *l = &c->srv->lim;
    uint64_t d = UINT64_MAX;
    if (c->state == C_READ) {
        if (c->phase == P_IDLE)
            d = c->phase_ms + (c->first_request ? l->header_timeout_ms : l->keepalive_timeout_ms);
        else if (c->phase == P_HEADERS)
            d = c->phase_ms + l->header_timeout_ms;
        else
            d = c->phase_ms + l->body_timeout_ms;
    } else if (c->state == C_LINGER) {
        d = c->phase_ms + LINGER_MS;
    }
    // Write stall: output handed to libuv and not written for too long
    // (output still in `out` is flushed before the loop next blocks).
    if (c->inflight > 0 && c->state != C_LINGER) {
        uint64_t w = c->progress_ms + l->write_timeout_ms;
        if (w < d) d = w;
    }
    return d;
}

static void conn_arm_timer(srv_conn *c) {
    if (c->state == C_CLOSING) return;
    uint64_t d = conn_deadline(c);
    if (d == UINT64_MAX) {
        uv_timer_stop(&c->timer);
        return;
    }
    uint64_t now = uv_now(c->srv->loop);
    uv_timer_start(&c->timer, on_timer, d > now ? d - now : 0, 0);
}

static void conn_protocol_error(srv_conn *c, int status, const char *msg);

static void on_timer(uv_timer_t *t) {
    srv_conn *c = t->data;
    if (c->state == C_CLOSING) return;
    uint64_t now = uv_now(c->srv->loop);
    const srv_http_limits *l = &c->srv->lim;
    if (c->inflight > 0 && c->state != C_LINGER && now >= c->progress_ms + l->write_timeout_ms) {
        PG_LOGW("http: client not reading for %.0f s with %zu bytes pending; closing",
                (double)l->write_timeout_ms / 1e3, pending_out(c));
        conn_close_now(c);
        return;
    }
    if (now < conn_deadline(c)) {
        conn_arm_timer(c);
        return;
    }
    if (c->state == C_READ && c->phase == P_IDLE) {
        conn_close_now(c);  // idle keep-alive connection: close quietly
    } else if (c->state == C_READ) {
        conn_protocol_error(c, 408,
                            c->phase == P_HEADERS ? "request headers not received in time"
                                                  : "request body not received in time");
    } else {
        conn_close_now(c);  // linger over
    }
}

// --- reading --------------------------------------------------------------------------

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    srv_conn *c = h->data;
    sbuf *b = c->tls ? &c->raw : &c->in;
    sbuf_reserve(b, READ_CHUNK);
    buf->base = b->p + b->len;
    buf->len = b->cap - b->len - 1;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    srv_conn *c = st->data;
    if (c->state == C_CLOSING) return;
    if (nread < 0) {
        // EOF or a reset: the client is gone. A request it was waiting for
        // is aborted (HTTP/1.1 clients do not half-close while waiting).
        c->eof = true;
        if (nread != UV_EOF) PG_LOGD("http: read: %s", uv_strerror((int)nread));
        conn_close_now(c);
        return;
    }
    if (nread == 0) return;
    if (c->state == C_LINGER || c->state == C_DONE) return;  // discarded
    if (c->tls) {
        c->raw.len += (size_t)nread;
        size_t before = c->in.len;
        int rc = srv_tls_feed(c->tls, c->raw.p, c->raw.len, &c->in, &c->wire);
        sbuf_reset(&c->raw);
        if (rc < 0) {  // a failed handshake (plain HTTP, a bad client certificate) or close_notify
            PG_LOGD("http: TLS: %s", srv_tls_error(c->tls));
            conn_close_now(c);
            return;
        }
        if (c->wire.len > 0) conn_mark_dirty(c);  // handshake replies
        if (c->in.len == before) return;
    } else {
        c->in.len += (size_t)nread;
        c->in.p[c->in.len] = 0;
    }
    if (c->state == C_READ) conn_parse(c);
    else conn_update_reading(c);
}

static void conn_update_reading(srv_conn *c) {
    if (c->state == C_CLOSING) return;
    const srv_http_limits *l = &c->srv->lim;
    bool want = !c->eof;
    if (c->state != C_LINGER && pending_out(c) >= l->out_high_water) want = false;
    if (c->state == C_BUSY && c->in.len - c->in_off >= l->max_pipeline) want = false;
    if (want && !c->reading) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) c->reading = true;
    } else if (!want && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    }
}

// --- parser callbacks ----------------------------------------------------------------

static int reject(srv_conn *c, int status, const char *msg) {
    c->err_status = status;
    snprintf(c->err_msg, sizeof c->err_msg, "%s", msg);
    return -1;
}

static int cb_message_begin(llhttp_t *p) {
    srv_conn *c = p->data;
    sbuf_reset(&c->url);
    sbuf_reset(&c->hdr);
    c->srv->body_bytes -= c->body.len;
    if (c->body.cap > (256u << 10)) sbuf_free(&c->body);
    sbuf_reset(&c->body);
    c->n_hdr = 0;
    c->hdr_bytes = 0;
    c->hstate = H_NONE;
    c->first_request = false;
    memset(&c->req, 0, sizeof c->req);
    c->req.conn = c;
    c->req.start_ns = pg_now_ns();
    c->phase = P_HEADERS;
    c->phase_ms = uv_now(c->srv->loop);
    conn_arm_timer(c);
    return 0;
}

static int cb_url(llhttp_t *p, const char *at, size_t n) {
    srv_conn *c = p->data;
    if (c->url.len + n > c->srv->lim.max_request_line) return reject(c, 414, "request line too long");
    sbuf_append(&c->url, at, n);
    return 0;
}

static int header_bytes(srv_conn *c, size_t n) {
    c->hdr_bytes += n;
    if (c->hdr_bytes > c->srv->lim.max_header_bytes) return reject(c, 431, "request headers too large");
    return 0;
}

static int cb_header_field(llhttp_t *p, const char *at, size_t n) {
    srv_conn *c = p->data;
    if (c->hstate == H_VALUE) sbuf_append(&c->hdr, "", 1);  // previous value was empty
    if (c->hstate != H_FIELD) {
        if (c->n_hdr >= c->srv->lim.max_headers) return reject(c, 431, "too many request headers");
        c->n_hdr++;
        c->hstate = H_FIELD;
        c->hfield_off = c->hdr.len;
    }
    if (header_bytes(c, n) < 0) return -1;
    sbuf_append(&c->hdr, at, n);
    return 0;
}

// RFC 9110 token characters: what a field name may hold. llhttp 8 in its
// default (non-strict) build lets a space or an empty name through; behind
// a proxy that reads them differently that is a request-smuggling vector.
static bool is_tchar(unsigned char ch) {
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) return true;
    return ch && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

static int cb_header_field_complete(llhttp_t *p) {
    srv_conn *c = p->data;
    if (c->hstate != H_FIELD || c->hdr.len == c->hfield_off)
        return reject(c, 400, "malformed HTTP request: empty header name");
    for (size_t i = c->hfield_off; i < c->hdr.len; i++)
        if (!is_tchar((unsigned char)c->hdr.p[i]))
            return reject(c, 400, "malformed HTTP request: invalid character in a header name");
    sbuf_append(&c->hdr, "", 1);
    c->hstate = H_VALUE;
    return 0;
}

static int cb_header_value(llhttp_t *p, const char *at, size_t n) {
    srv_conn *c = p->data;
    if (header_bytes(c, n) < 0) return -1;
    sbuf_append(&c->hdr, at, n);
    return 0;
}

static int cb_header_value_complete(llhttp_t *p) {
    srv_conn *c = p->data;
    if (c->hstate == H_VALUE) sbuf_append(&c->hdr, "", 1);
    c->hstate = H_NONE;
    return 0;
}

const char *srv_req_header(const srv_req *r, const char *name) {
    const srv_conn *c = r->conn;
    const char *p = c->hdr.p, *end = p + c->hdr.len;
    for (int i = 0; i < c->n_hdr && p && p < end; i++) {
        const char *v = p + strlen(p) + 1;
        if (v > end) break;
        if (!strcasecmp(p, name)) return v;
        p = v + strlen(v) + 1;
    }
    return NULL;
}

static int cb_headers_complete(llhttp_t *p) {
    srv_conn *c = p->data;
    if (c->hstate == H_VALUE) sbuf_append(&c->hdr, "", 1);
    c->hstate = H_NONE;
    if (p->http_major != 1 || p->http_minor > 1)
        return reject(c, 505, "HTTP version not supported (HTTP/1.0 and HTTP/1.1 are)");
    // RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 message means faulty framing.
    if (p->http_minor == 0 && ((p->flags & F_CHUNKED) || srv_req_header(&c->req, "transfer-encoding")))
        return reject(c, 400, "malformed HTTP request: Transfer-Encoding in an HTTP/1.0 request");
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->srv->lim.max_body)
        return reject(c, 413, "request body too large");
    // A declared body that cannot fit the global budget now is refused before
    // it is sent (the check in cb_body covers chunked and slow bodies).
    if ((p->flags & F_CONTENT_LENGTH) && c->srv->body_bytes + p->content_length > c->srv->lim.max_body_total)
        return reject(c, 503, "the server is busy: too many request body bytes buffered; retry later");
    c->req.conn = c;
    c->phase = P_BODY;
    c->phase_ms = uv_now(c->srv->loop);
    conn_arm_timer(c);
    // Expect: 100-continue (curl sends it for larger bodies): tell the
    // client to go on now rather than after its own timeout.
    const char *expect = srv_req_header(&c->req, "expect");
    if (expect && !strcasecmp(expect, "100-continue") && p->http_minor >= 1 &&
        ((p->flags & F_CHUNKED) || ((p->flags & F_CONTENT_LENGTH) && p->content_length > 0))) {
        sbuf_puts(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
        conn_mark_dirty(c);
    }
    return 0;
}

static int cb_body(llhttp_t *p, const char *at, size_t n) {
    srv_conn *c = p->data;
    if (c->body.len + n > c->srv->lim.max_body) return reject(c, 413, "request body too large");
    if (c->srv->body_bytes + n > c->srv->lim.max_body_total)
        return reject(c, 503, "the server is busy: too many request body bytes buffered; retry later");
    sbuf_append(&c->body, at, n);
    c->srv->body_bytes += n;
    return 0;
}

static int cb_message_complete(llhttp_t *p) {
    srv_conn *c = p->data;
    c->req.method = p->method;
    c->req.http_minor = p->http_minor;
    c->req.keep_alive = llhttp_should_keep_alive(p);
    return HPE_PAUSED;  // one request at a time: parsing resumes after the response
}

// --- requests --------------------------------------------------------------------------

static void conn_dispatch(srv_conn *c) {
    srv_req *r = &c->req;
    r->conn = c;
    r->method_name = llhttp_method_name((llhttp_method_t)r->method);
    sbuf_append(&c->url, "", 0);  // ensure a NUL-terminated buffer
    sbuf_append(&c->body, "", 0);
    char *path = c->url.p;
    // RFC 9112 3.2.2: a server must accept the absolute form
    // (GET http://host:port/health HTTP/1.1); the authority is not checked
    // (Host is not either), only the path and query are used.
    if (!strncasecmp(path, "http://", 7) || !strncasecmp(path, "https://", 8)) {
        char *auth = strstr(path, "//") + 2;
        char *slash = auth + strcspn(auth, "/?");
        if (*slash == '/') {
            path = slash;
        } else {  // "http://host" or "http://host?q": the path is "/"
            size_t ql = strlen(slash);
            memmove(auth + 1, slash, ql + 1);
            auth[0] = '/';
            path = auth;
        }
    }
    char *q = strchr(path, '?');
    if (q) *q++ = 0;
    r->path = path;
    r->query = q ? q : "";
    r->body = c->body.p;
    r->body_len = c->body.len;
    if (c->srv->draining) r->keep_alive = false;
    c->state = C_BUSY;
    c->phase = P_IDLE;
    c->dispatched = true;
    c->resp_open = false;
    conn_arm_timer(c);
    c->srv->h.on_request(r, c->srv->h.ctx);
}

// The response has ended: the next request may be parsed.
static void conn_end_request(srv_conn *c) {
    // The body is not needed any more: it leaves the global budget now, not
    // when (if ever) the connection sends its next request.
    c->srv->body_bytes -= c->body.len;
    if (c->body.cap > (256u << 10)) sbuf_free(&c->body);
    sbuf_reset(&c->body);
    c->dispatched = false;
    c->resp_open = false;
    c->req.on_abort = NULL;
    c->req.ud = NULL;
    if (!c->req.keep_alive || c->srv->draining) c->close_after = true;
    if (c->close_after) {
        c->state = C_DONE;
    } else {
        c->state = C_READ;
        c->phase = P_IDLE;
        c->phase_ms = uv_now(c->srv->loop);
        c->want_parse = true;  // pipelined input, from the idle handle
    }
    conn_mark_dirty(c);
    conn_arm_timer(c);
}

static void conn_parse(srv_conn *c) {
    if (c->parsing) return;
    c->parsing = true;
    while (c->state == C_READ && c->in.len > c->in_off &&
           pending_out(c) < c->srv->lim.out_high_water) {
        const char *start = c->in.p + c->in_off;
        llhttp_errno_t err = llhttp_execute(&c->parser, start, c->in.len - c->in_off);
        if (err == HPE_OK) {
            c->in_off = c->in.len;
            break;
        }
        if (err != HPE_PAUSED) {
            const char *reason = llhttp_get_error_reason(&c->parser);
            char msg[160];
            snprintf(msg, sizeof msg, "malformed HTTP request: %s", reason ? reason : llhttp_errno_name(err));
            int status = c->err_status ? c->err_status : err == HPE_INVALID_VERSION ? 505 : 400;
            if (!c->err_status && status == 505)
                snprintf(msg, sizeof msg, "HTTP version not supported (HTTP/1.0 and HTTP/1.1 are)");
            conn_protocol_error(c, status, c->err_status ? c->err_msg : msg);
            break;
        }
        c->in_off += (size_t)(llhttp_get_error_pos(&c->parser) - start);
        llhttp_resume(&c->parser);
        conn_dispatch(c);  // may answer at once (state back to C_READ)
    }
    if (c->in_off == c->in.len) {
        c->in_off = 0;
        sbuf_reset(&c->in);
        if (c->in.cap > (1u << 20)) sbuf_free(&c->in);
    } else if (c->in_off > 0 && c->state != C_CLOSING) {
        sbuf_consume(&c->in, c->in_off);
        c->in_off = 0;
    }
    c->parsing = false;
    conn_update_reading(c);
    conn_arm_timer(c);
}

// --- response formatting -----------------------------------------------------------

static void put_head(srv_conn *c, int status, const char *ctype, const char *extra, long long clen,
                     bool chunked) {
    sbuf *o = &c->out;
    sbuf_printf(o, "HTTP/1.1 %d %s\r\n", status, srv_status_text(status));
    if (ctype) sbuf_printf(o, "Content-Type: %s\r\n", ctype);
    if (clen >= 0) sbuf_printf(o, "Content-Length: %lld\r\n", clen);
    if (chunked) sbuf_puts(o, "Transfer-Encoding: chunked\r\n");
    if (c->close_after || !c->req.keep_alive || c->srv->draining)
        sbuf_puts(o, "Connection: close\r\n");
    else if (c->req.http_minor == 0)
        sbuf_puts(o, "Connection: keep-alive\r\n");
    if (extra) sbuf_puts(o, extra);
    sbuf_puts(o, c->req.resp_headers);
    sbuf_puts(o, "\r\n");
    if (c->srv->h.on_response)
        c->srv->h.on_response(c->req.route ? c->req.route : "other", status, c->srv->h.ctx);
}

// Answers a request the parser rejected, then closes (the framing is lost).
static void conn_protocol_error(srv_conn *c, int status, const char *msg) {
    if (c->state == C_CLOSING) return;
    PG_LOGD("http: %d %s", status, msg);
    sbuf body = {0};
    if (c->srv->h.error_body)
        c->srv->h.error_body(status, msg, &body, c->srv->h.ctx);
    else
        sbuf_printf(&body, "%s\n", msg);
    c->close_after = true;
    c->req.route = "http";
    c->req.keep_alive = false;
    put_head(c, status, c->srv->h.error_body ? "application/json" : "text/plain",
             status == 503 ? "Retry-After: 1\r\n" : NULL, (long long)body.len, false);
    sbuf_append(&c->out, body.p ? body.p : "", body.len);
    sbuf_free(&body);
    c->state = C_DONE;
    c->in_off = c->in.len;
    conn_mark_dirty(c);
    conn_arm_timer(c);
}

void srv_resp_send(srv_req *r, int status, const char *content_type, const char *extra_headers,
                   const char *body, size_t len) {
    srv_conn *c = r->conn;
    PG_CHECK(c->dispatched && !c->resp_open);
    if (c->srv->draining) c->close_after = true;
    put_head(c, status, content_type, extra_headers, (long long)len, false);
    if (r->method != HTTP_HEAD) sbuf_append(&c->out, body, len);
    conn_end_request(c);
}

void srv_resp_begin(srv_req *r, int status, const char *content_type, const char *extra_headers) {
    srv_conn *c = r->conn;
    PG_CHECK(c->dispatched && !c->resp_open);
    c->resp_chunked = r->http_minor >= 1;
    if (!c->resp_chunked) c->close_after = true;  // HTTP/1.0: the body ends at close
    if (c->srv->draining) c->close_after = true;
    put_head(c, status, content_type, extra_headers, -1, c->resp_chunked);
    c->resp_open = true;
    conn_mark_dirty(c);
}

int srv_resp_write(srv_req *r, const char *data, size_t len) {
    srv_conn *c = r->conn;
    PG_CHECK(c->dispatched && c->resp_open);
    if (c->state == C_CLOSING || c->want_close) return -1;
    if (len == 0) return 0;
    if (c->resp_chunked) sbuf_printf(&c->out, "%zx\r\n", len);
    sbuf_append(&c->out, data, len);
    if (c->resp_chunked) sbuf_puts(&c->out, "\r\n");
    if (pending_out(c) > c->srv->lim.out_max) {
        PG_LOGW("http: client is not reading (%zu bytes pending); dropping it", pending_out(c));
        conn_schedule_close(c);
        return -1;
    }
    conn_mark_dirty(c);
    return 0;
}

void srv_resp_end(srv_req *r) {
    srv_conn *c = r->conn;
    PG_CHECK(c->dispatched && c->resp_open);
    if (c->resp_chunked) sbuf_puts(&c->out, "0\r\n\r\n");
    conn_end_request(c);
}

size_t srv_resp_pending(const srv_req *r) { return pending_out(r->conn); }

// --- accepting ---------------------------------------------------------------------------

static void on_connection(uv_stream_t *ls, int status) {
    srv_http *s = ls->data;
    if (status < 0) {
        PG_LOGW("http: accept: %s", uv_strerror(status));
        return;
    }
    srv_conn *c = pg_xcalloc(1, sizeof *c);
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    c->state = C_READ;
    c->phase = P_IDLE;
    c->first_request = true;
    c->phase_ms = uv_now(s->loop);
    c->req.conn = c;
    llhttp_init(&c->parser, HTTP_REQUEST, &s->settings);
    c->parser.data = c;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0) {
        conn_close_now(c);
        return;
    }
    if (s->n_conns > s->lim.max_connections || s->draining) {
        PG_LOGW("http: %d connections open (limit %d); refusing one", s->n_conns - 1,
                s->lim.max_connections);
        conn_close_now(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);  // SSE chunks are small and latency matters
    if (s->tls) c->tls = srv_tls_new(s->tls);
    conn_update_reading(c);
    conn_arm_timer(c);
}

static void srv_on_handle_close(uv_handle_t *h) {
    srv_http *s = h->data;
    s->open_handles--;
    srv_maybe_done(s);
}

int srv_http_start(uv_loop_t *loop, const char *host, int port, const srv_http_limits *lim,
                   const srv_http_handlers *h, srv_http **out) {
    *out = NULL;
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    uv_getaddrinfo_t gai;
    int rc = uv_getaddrinfo(loop, &gai, NULL, host, port_s, &hints);
    if (rc < 0) return pg_err_set(PG_EINVAL, "cannot resolve host '%s': %s", host, uv_strerror(rc));
    srv_http *s = pg_xcalloc(1, sizeof *s);
    s->loop = loop;
    s->lim = *lim;
    s->h = *h;
    llhttp_settings_init(&s->settings);
    s->settings.on_message_begin = cb_message_begin;
    s->settings.on_url = cb_url;
    s->settings.on_header_field = cb_header_field;
    s->settings.on_header_field_complete = cb_header_field_complete;
    s->settings.on_header_value = cb_header_value;
    s->settings.on_header_value_complete = cb_header_value_complete;
    s->settings.on_headers_complete = cb_headers_complete;
    s->settings.on_body = cb_body;
    s->settings.on_message_complete = cb_message_complete;
    uv_tcp_init(loop, &s->listener);
    uv_idle_init(loop, &s->work);
    s->listener.data = s->work.data = s;
    s->open_handles = 2;
    s->listening = true;
    rc = uv_tcp_bind(&s->listener, gai.addrinfo->ai_addr, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
    uv_freeaddrinfo(gai.addrinfo);
    if (rc < 0) {
        int code = pg_err_set(PG_EIO, "cannot listen on %s:%d: %s", host, port, uv_strerror(rc));
        s->closing = true;
        uv_close((uv_handle_t *)&s->listener, srv_on_handle_close);
        uv_close((uv_handle_t *)&s->work, srv_on_handle_close);
        uv_run(loop, UV_RUN_NOWAIT);  // runs the close callbacks, frees s
        return code;
    }
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    s->port = port;
    if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &sl) == 0)
        s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *out = s;
    return 0;
}

int srv_http_port(const srv_http *s) { return s->port; }

void srv_http_set_tls(srv_http *s, srv_tls_ctx *ctx) { s->tls = ctx; }

void srv_http_drain(srv_http *s) {
    if (s->draining) return;
    s->draining = true;
    if (s->listening) {
        s->listening = false;
        uv_close((uv_handle_t *)&s->listener, srv_on_handle_close);
    }
    for (srv_conn *c = s->conns; c; c = c->next) {
        c->close_after = true;
        if (c->state != C_READ || c->phase != P_IDLE || c->in.len > c->in_off) continue;
        // Idle between requests: close now, or once its output is written.
        if (pending_out(c) == 0) {
            conn_schedule_close(c);
        } else {
            c->state = C_DONE;
            conn_mark_dirty(c);
        }
    }
}

bool srv_http_draining(const srv_http *s) { return s->draining; }
int srv_http_num_connections(const srv_http *s) { return s->n_conns; }

void srv_http_close(srv_http *s, void (*done)(void *arg), void *arg) {
    s->closing = true;
    s->done = done;
    s->done_arg = arg;
    if (s->listening) {
        s->listening = false;
        uv_close((uv_handle_t *)&s->listener, srv_on_handle_close);
    }
    for (srv_conn *c = s->conns; c; c = c->next) conn_close_now(c);
    uv_close((uv_handle_t *)&s->work, srv_on_handle_close);
}
