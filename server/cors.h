// server/cors.h - Cross-Origin Resource Sharing for `paged serve`, as vLLM
// offers it (--allowed-origins, --allowed-methods, --allowed-headers; the
// semantics of Starlette's CORSMiddleware, which vLLM uses).
//
// Off unless --allowed-origins is given. When on:
//   - every response to a request with an allowed Origin carries
//     Access-Control-Allow-Origin ("*" when any origin is allowed, else the
//     origin itself plus Vary: Origin);
//   - a preflight (OPTIONS with Origin and Access-Control-Request-Method) on
//     any route is answered before authentication: 200 with the allowed
//     methods and headers and Max-Age 600, or 400 (OpenAI-style JSON) naming
//     the origin, method or header that is not allowed.
// Lists are "a,b,c" or a JSON list of strings ('["*"]', as vLLM takes them);
// "*" allows everything. Loop thread only; the config is read-only once
// parsed.
#pragma once
#include <stdbool.h>

#include "server/http_conn.h"

typedef struct srv_cors {
    bool enabled;                 // --allowed-origins was given
    char **origins, **methods, **headers;  // NULL-terminated; "*" = any
    bool any_origin, any_method, any_header;
} srv_cors;

// Sets one of the lists from a flag's value: `which` is "origins",
// "methods" or "headers". Methods are upper-cased, headers lower-cased.
// Returns 0, or < 0 with the message set (an empty or malformed list).
int srv_cors_set(srv_cors *c, const char *which, const char *value);

// Fills in the defaults for lists not given ("*" methods and headers) and
// turns CORS on when origins were given. Call once after the flags.
void srv_cors_finish(srv_cors *c);

void srv_cors_free(srv_cors *c);

// Writes the Access-Control-* lines for this request into
// r->resp_headers (added to its response, whatever the status).
void srv_cors_decorate(const srv_cors *c, srv_req *r);

// True when `r` is a CORS preflight (OPTIONS + Origin +
// Access-Control-Request-Method).
bool srv_cors_is_preflight(const srv_req *r);

// Answers a preflight (ends the request).
void srv_cors_preflight(const srv_cors *c, srv_req *r);
