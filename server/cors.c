// server/cors.c - CORS headers and preflight answers (server/cors.h).
#include "server/cors.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "server/api_common.h"

// What "*" methods means in a preflight answer: every method paged serves.
#define ANY_METHODS "GET, HEAD, POST, OPTIONS"
// Browsers may cache a preflight answer this long (Starlette's default).
#define MAX_AGE "600"
// An Origin longer than this is never echoed (it cannot match a configured
// one that fits a flag, and r->resp_headers is a fixed buffer).
#define MAX_ORIGIN 300

static void list_free(char **l) {
    for (char **p = l; p && *p; p++) free(*p);
    free(l);
}

static void list_push(char ***l, int *n, const char *s, size_t len, int (*conv)(int)) {
    *l = pg_xrealloc(*l, sizeof(char *) * (size_t)(*n + 2));
    char *v = pg_xmalloc(len + 1);
    for (size_t i = 0; i < len; i++) v[i] = (char)conv((unsigned char)s[i]);
    v[len] = 0;
    (*l)[(*n)++] = v;
    (*l)[*n] = NULL;
}

static int keep(int ch) { return ch; }

// "a, b" or ["a","b"] -> NULL-terminated list of trimmed, converted items.
static int parse_list(const char *flag, const char *value, int (*conv)(int), char ***out) {
    char **l = NULL;
    int n = 0;
    const char *v = value;
    while (*v == ' ') v++;
    if (*v == '[') {
        cJSON *j = cJSON_Parse(v);
        if (!cJSON_IsArray(j)) {
            cJSON_Delete(j);
            return pg_err_set(PG_EINVAL, "%s: not a JSON list of strings: %s", flag, value);
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            if (!cJSON_IsString(it) || !*it->valuestring) {
                cJSON_Delete(j);
                list_free(l);
                return pg_err_set(PG_EINVAL, "%s: every item must be a non-empty string", flag);
            }
            list_push(&l, &n, it->valuestring, strlen(it->valuestring), conv);
        }
        cJSON_Delete(j);
    } else {
        for (const char *p = v; *p;) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            while (len && *p == ' ') p++, len--;
            while (len && p[len - 1] == ' ') len--;
            if (len) list_push(&l, &n, p, len, conv);
            p = e ? e + 1 : p + strlen(p);
        }
    }
    if (n == 0) return pg_err_set(PG_EINVAL, "%s: the list is empty", flag);
    *out = l;
    return 0;
}

static bool list_has(char **l, const char *s, bool nocase) {
    for (char **p = l; p && *p; p++)
        if (nocase ? !strcasecmp(*p, s) : !strcmp(*p, s)) return true;
    return false;
}

int srv_cors_set(srv_cors *c, const char *which, const char *value) {
    char ***dst = !strcmp(which, "origins") ? &c->origins : !strcmp(which, "methods") ? &c->methods : &c->headers;
    int (*conv)(int) = dst == &c->methods ? toupper : dst == &c->headers ? tolower : keep;
    char **l = NULL;
    char flag[32];
    snprintf(flag, sizeof flag, "--allowed-%s", which);
    PG_TRY(parse_list(flag, value, conv, &l));
    list_free(*dst);
    *dst = l;
    return 0;
}

void srv_cors_finish(srv_cors *c) {
    c->enabled = c->origins != NULL;
    if (!c->methods) srv_cors_set(c, "methods", "*");
    if (!c->headers) srv_cors_set(c, "headers", "*");
    c->any_origin = list_has(c->origins, "*", false);
    c->any_method = list_has(c->methods, "*", false);
    c->any_header = list_has(c->headers, "*", false);
}

void srv_cors_free(srv_cors *c) {
    list_free(c->origins);
    list_free(c->methods);
    list_free(c->headers);
    memset(c, 0, sizeof *c);
}

static bool origin_allowed(const srv_cors *c, const char *origin) {
    return c->any_origin || list_has(c->origins, origin, false);
}

void srv_cors_decorate(const srv_cors *c, srv_req *r) {
    const char *origin = srv_req_header(r, "origin");
    if (!c->enabled || !origin || strlen(origin) > MAX_ORIGIN || !origin_allowed(c, origin)) return;
    if (c->any_origin)
        snprintf(r->resp_headers, sizeof r->resp_headers, "Access-Control-Allow-Origin: *\r\n");
    else
        snprintf(r->resp_headers, sizeof r->resp_headers,
                 "Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n", origin);
}

bool srv_cors_is_preflight(const srv_req *r) {
    return r->method == HTTP_OPTIONS && srv_req_header(r, "origin") &&
           srv_req_header(r, "access-control-request-method");
}

static void join(sbuf *b, char **l) {
    for (char **p = l; p && *p; p++) sbuf_printf(b, "%s%s", p == l ? "" : ", ", *p);
}

// Each header named in Access-Control-Request-Headers must be allowed;
// returns the first one that is not (in `bad`), or true.
static bool headers_allowed(const srv_cors *c, const char *req, char *bad, size_t cap) {
    if (c->any_header || !req) return true;
    for (const char *p = req; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len && (*p == ' ' || *p == '\t')) p++, len--;
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len) {
            char h[128];
            size_t n = len < sizeof h - 1 ? len : sizeof h - 1;
            for (size_t i = 0; i < n; i++) h[i] = (char)tolower((unsigned char)p[i]);
            h[n] = 0;
            if (len >= sizeof h || !list_has(c->headers, h, false)) {
                snprintf(bad, cap, "%.*s", (int)(len < 100 ? len : 100), p);
                return false;
            }
        }
        p = e ? e + 1 : p + strlen(p);
    }
    return true;
}

void srv_cors_preflight(const srv_cors *c, srv_req *r) {
    const char *origin = srv_req_header(r, "origin");
    const char *method = srv_req_header(r, "access-control-request-method");
    const char *req_headers = srv_req_header(r, "access-control-request-headers");
    char bad[128];
    api_error e;
    int fail = 0;
    if (!origin_allowed(c, origin) || strlen(origin) > MAX_ORIGIN)
        fail = api_err(&e, 400, NULL, "CORS preflight refused: origin %.100s is not allowed (--allowed-origins)", origin);
    else if (!c->any_method && !list_has(c->methods, method, true))
        fail = api_err(&e, 400, NULL, "CORS preflight refused: method %.40s is not allowed (--allowed-methods)", method);
    else if (!headers_allowed(c, req_headers, bad, sizeof bad))
        fail = api_err(&e, 400, NULL, "CORS preflight refused: header %s is not allowed (--allowed-headers)", bad);
    // Starlette sends the allowed lists even with a refusal, so a browser's
    // console shows what would have been accepted.
    sbuf h = {0};
    sbuf_puts(&h, "Access-Control-Allow-Methods: ");
    if (c->any_method)
        sbuf_puts(&h, ANY_METHODS);
    else
        join(&h, c->methods);
    sbuf_puts(&h, "\r\nAccess-Control-Max-Age: " MAX_AGE "\r\n");
    if (c->any_header && req_headers)
        sbuf_printf(&h, "Access-Control-Allow-Headers: %s\r\n", req_headers);
    else if (!c->any_header) {
        sbuf_puts(&h, "Access-Control-Allow-Headers: ");
        join(&h, c->headers);
        sbuf_puts(&h, "\r\n");
    }
    if (!c->any_origin && !r->resp_headers[0]) sbuf_puts(&h, "Vary: Origin\r\n");  // else decorate said it
    if (fail) {
        sbuf b = {0};
        api_error_json(&e, &b);
        srv_resp_send(r, 400, "application/json", sbuf_str(&h), sbuf_str(&b), b.len);
        sbuf_free(&b);
    } else {
        srv_resp_send(r, 200, "text/plain; charset=utf-8", sbuf_str(&h), "OK", 2);
    }
    sbuf_free(&h);
}
