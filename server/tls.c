// server/tls.c - OpenSSL sessions over memory BIOs (see tls.h).
#include "server/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

struct srv_tls_ctx {
    SSL_CTX *ssl;
};

struct srv_tls {
    SSL *ssl;
    BIO *rbio, *wbio;     // network side: we write received bytes to rbio, read wbio to send
    sbuf pending;         // plaintext SSL_write could not take yet (before the handshake)
    char err[160];
};

// The first queued OpenSSL error as text (and the queue cleared).
static void take_ssl_error(char *buf, size_t cap) {
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, buf, cap);
    else
        snprintf(buf, cap, "unknown TLS error");
    ERR_clear_error();
}

int srv_tls_ctx_create(const char *certfile, const char *keyfile, const char *ca_file, srv_tls_ctx **out) {
    *out = NULL;
    char why[256];
    SSL_CTX *ssl = SSL_CTX_new(TLS_server_method());
    if (!ssl) {
        take_ssl_error(why, sizeof why);
        return pg_err_set(PG_EINVAL, "TLS: cannot create a context: %s", why);
    }
    SSL_CTX_set_min_proto_version(ssl, TLS1_2_VERSION);
    // Replies are written as they come: partial writes are fine, and the
    // buffer may move between calls (sbuf grows).
    SSL_CTX_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ssl, certfile) != 1) {
        take_ssl_error(why, sizeof why);
        SSL_CTX_free(ssl);
        return pg_err_set(PG_EINVAL, "--ssl-certfile %s: cannot load the certificate: %s", certfile, why);
    }
    const char *kf = keyfile ? keyfile : certfile;
    if (SSL_CTX_use_PrivateKey_file(ssl, kf, SSL_FILETYPE_PEM) != 1) {
        take_ssl_error(why, sizeof why);
        SSL_CTX_free(ssl);
        if (strstr(why, "mismatch"))  // OpenSSL checks the pair while loading
            return pg_err_set(PG_EINVAL, "--ssl-keyfile %s does not match the certificate in %s", kf, certfile);
        return pg_err_set(PG_EINVAL, "%s %s: cannot load the private key: %s",
                          keyfile ? "--ssl-keyfile" : "--ssl-certfile", kf, why);
    }
    if (SSL_CTX_check_private_key(ssl) != 1) {
        take_ssl_error(why, sizeof why);
        SSL_CTX_free(ssl);
        return pg_err_set(PG_EINVAL, "--ssl-keyfile %s does not match the certificate in %s: %s", kf, certfile,
                          why);
    }
    if (ca_file) {
        if (SSL_CTX_load_verify_locations(ssl, ca_file, NULL) != 1) {
            take_ssl_error(why, sizeof why);
            SSL_CTX_free(ssl);
            return pg_err_set(PG_EINVAL, "--ssl-ca-certs %s: cannot load the CA certificates: %s", ca_file, why);
        }
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca_file);
        if (names) SSL_CTX_set_client_CA_list(ssl, names);
        SSL_CTX_set_verify(ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    ERR_clear_error();
    srv_tls_ctx *c = pg_xcalloc(1, sizeof *c);
    c->ssl = ssl;
    *out = c;
    return 0;
}

void srv_tls_ctx_free(srv_tls_ctx *ctx) {
    if (!ctx) return;
    SSL_CTX_free(ctx->ssl);
    free(ctx);
}

srv_tls *srv_tls_new(srv_tls_ctx *ctx) {
    srv_tls *t = pg_xcalloc(1, sizeof *t);
    t->ssl = SSL_new(ctx->ssl);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    PG_CHECK(t->ssl && t->rbio && t->wbio);
    BIO_set_mem_eof_return(t->rbio, -1);  // an empty rbio means "want more", not EOF
    SSL_set_bio(t->ssl, t->rbio, t->wbio); // the session owns both BIOs now
    SSL_set_accept_state(t->ssl);
    return t;
}

void srv_tls_free(srv_tls *t) {
    if (!t) return;
    SSL_free(t->ssl);
    sbuf_free(&t->pending);
    free(t);
}

const char *srv_tls_error(const srv_tls *t) { return t->err[0] ? t->err : "no error"; }

// Moves everything OpenSSL wants sent into `wire`.
static void drain_wbio(srv_tls *t, sbuf *wire) {
    char buf[16384];
    int n;
    while ((n = BIO_read(t->wbio, buf, sizeof buf)) > 0) sbuf_append(wire, buf, (size_t)n);
}

// Whether an SSL_* return `rc` is a real failure (records why) or just
// "needs more bytes".
static bool failed(srv_tls *t, int rc) {
    int e = SSL_get_error(t->ssl, rc);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return false;
    if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(t->err, sizeof t->err, "the client closed the TLS session");
    } else {
        take_ssl_error(t->err, sizeof t->err);
        long v = SSL_get_verify_result(t->ssl);
        if (v != X509_V_OK)
            snprintf(t->err + strlen(t->err), sizeof t->err - strlen(t->err), " (client certificate: %s)",
                     X509_verify_cert_error_string(v));
    }
    ERR_clear_error();
    return true;
}

static int flush_pending(srv_tls *t, sbuf *wire) {
    while (t->pending.len > 0) {
        int rc = SSL_write(t->ssl, t->pending.p, (int)(t->pending.len > (1u << 30) ? (1u << 30) : t->pending.len));
        if (rc <= 0) {
            drain_wbio(t, wire);
            return failed(t, rc) ? -1 : 0;
        }
        sbuf_consume(&t->pending, (size_t)rc);
    }
    drain_wbio(t, wire);
    return 0;
}

int srv_tls_feed(srv_tls *t, const char *data, size_t n, sbuf *plain, sbuf *wire) {
    while (n > 0) {
        int w = BIO_write(t->rbio, data, (int)(n > (1u << 30) ? (1u << 30) : n));
        PG_CHECK(w > 0);  // a memory BIO takes everything
        data += w;
        n -= (size_t)w;
    }
    char buf[16384];
    for (;;) {
        int rc = SSL_read(t->ssl, buf, sizeof buf);
        if (rc > 0) {
            sbuf_append(plain, buf, (size_t)rc);
            continue;
        }
        drain_wbio(t, wire);
        if (failed(t, rc)) return -1;
        break;
    }
    // Data written before the handshake ended can go now.
    return SSL_is_init_finished(t->ssl) ? flush_pending(t, wire) : 0;
}

int srv_tls_write(srv_tls *t, const char *data, size_t n, sbuf *wire) {
    sbuf_append(&t->pending, data, n);
    if (!SSL_is_init_finished(t->ssl)) return 0;
    return flush_pending(t, wire);
}

void srv_tls_close_notify(srv_tls *t, sbuf *wire) {
    if (SSL_is_init_finished(t->ssl)) SSL_shutdown(t->ssl);
    ERR_clear_error();
    drain_wbio(t, wire);
}
