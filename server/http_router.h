// server/http_router.h - the route table of `paged serve`, for the checks
// that hold docs to the code (tests/unit/test_openapi.c). srv_route itself
// is declared in server/app.h.
#pragma once
#include <stdbool.h>

typedef struct srv_route_info {
    const char *path;
    const char *method;   // "GET" (HEAD is answered too) or "POST"
    bool open;            // reachable without the API key
} srv_route_info;

// The routes, in table order; `*n` set to their count.
const srv_route_info *srv_routes(int *n);
