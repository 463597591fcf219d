// server/http_router.c - routes: method and path to a handler, with CORS,
// the API key check, 404 and 405, and 503 while draining.
#include "server/http_router.h"

#include <llhttp.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include "server/app.h"
#include "server/cors.h"
#include "server/openapi.h"
#include "server/webui.h"

typedef struct route {
    const char *path;
    int method;                 // enum llhttp_method
    void (*fn)(srv_app *a, srv_req *r);
    bool open;                  // reachable without the API key
} route;

static const route ROUTES[] = {
    {"/v1/completions", HTTP_POST, api_completions, false},
    {"/v1/chat/completions", HTTP_POST, api_chat_completions, false},
    {"/v1/models", HTTP_GET, api_models, false},
    {"/tokenize", HTTP_POST, api_tokenize, false},
    {"/detokenize", HTTP_POST, api_detokenize, false},
    {"/health", HTTP_GET, api_health, true},
    {"/version", HTTP_GET, api_version, false},
    {"/metrics", HTTP_GET, api_metrics, false},
    // Off unless --enable-lora --allow-runtime-lora-updating (404, as vLLM).
    {"/v1/load_lora_adapter", HTTP_POST, api_load_lora, false},
    {"/v1/unload_lora_adapter", HTTP_POST, api_unload_lora, false},
    // The chat page asks for the API key itself; the API description is
    // public, as vLLM's is.
    {"/", HTTP_GET, api_webui, true},
    {"/openapi.json", HTTP_GET, api_openapi, true},
};
#define N_ROUTES ((int)(sizeof ROUTES / sizeof ROUTES[0]))

const srv_route_info *srv_routes(int *n) {
    static srv_route_info info[N_ROUTES];
    for (int i = 0; i < N_ROUTES; i++)
        info[i] = (srv_route_info){ROUTES[i].path, ROUTES[i].method == HTTP_GET ? "GET" : "POST", ROUTES[i].open};
    *n = N_ROUTES;
    return info;
}

// Compares in time that depends only on the expected key's length.
static bool key_equal(const char *got, size_t got_len, const char *want, size_t want_len) {
    unsigned char diff = (unsigned char)(got_len != want_len);
    for (size_t i = 0; i < want_len; i++) {
        unsigned char g = got_len ? (unsigned char)got[i % got_len] : 0;
        diff |= g ^ (unsigned char)want[i];
    }
    return diff == 0;
}

static bool authorized(srv_app *a, const srv_req *r) {
    if (!a->api_key) return true;
    const char *h = srv_req_header(r, "authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    const char *k = h + 7;
    while (*k == ' ') k++;
    return key_equal(k, strlen(k), a->api_key, a->api_key_len);
}

void srv_route(srv_req *r, void *ctx) {
    srv_app *a = ctx;
    const route *match = NULL;
    bool path_known = false;
    if (a->cors.enabled) srv_cors_decorate(&a->cors, r);
    for (int i = 0; i < N_ROUTES; i++) {
        if (strcmp(ROUTES[i].path, r->path)) continue;
        if (ROUTES[i].fn == api_webui && a->no_webui) continue;  // --no-webui: 404
        if ((ROUTES[i].fn == api_load_lora || ROUTES[i].fn == api_unload_lora) && !a->lora_runtime) continue;
        path_known = true;
        if (ROUTES[i].method == r->method ||
            (ROUTES[i].method == HTTP_GET && r->method == HTTP_HEAD)) {
            match = &ROUTES[i];
            break;
        }
    }
    r->route = match ? match->path : path_known ? r->path : "other";
    if (!path_known) {
        app_send_error_msg(r, 404, NULL, "Not Found");
        return;
    }
    // A preflight carries no credentials: it is answered before the key
    // check, on every route.
    if (!match && a->cors.enabled && srv_cors_is_preflight(r)) {
        srv_cors_preflight(&a->cors, r);
        return;
    }
    if (!match) {
        api_error e;
        api_err(&e, 405, NULL, "Method %s is not allowed on %s", r->method_name, r->path);
        sbuf b = {0};
        api_error_json(&e, &b);
        const char *allow = "Allow: POST\r\n";
        for (int i = 0; i < N_ROUTES; i++)
            if (!strcmp(ROUTES[i].path, r->path) && ROUTES[i].method == HTTP_GET)
                allow = "Allow: GET, HEAD\r\n";
        srv_resp_send(r, 405, "application/json", allow, b.p, b.len);
        sbuf_free(&b);
        return;
    }
    if (!match->open && !authorized(a, r)) {
        app_send_error_msg(r, 401, NULL, "Unauthorized: a valid API key is required (Authorization: Bearer KEY)");
        return;
    }
    // A failed engine (the watchdog): /health and everything else but
    // /metrics is 503 until the process exits.
    if (a->engine_failed && match->fn != api_metrics) {
        app_send_error_msg(r, 503, NULL, a->engine_failure);
        return;
    }
    // Draining: every new request is refused, but /metrics keeps answering
    // so the drain itself can be watched.
    if (a->draining && match->fn != api_metrics) {
        app_send_error_msg(r, 503, NULL, "the server is shutting down");
        return;
    }
    match->fn(a, r);
}
