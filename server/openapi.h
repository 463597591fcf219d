// server/openapi.h - the OpenAPI 3.1 description of every route paged
// serves (server/openapi.json, compiled into the binary by tools/embed.py).
// tests/unit/test_openapi.c holds it to the route table; docs/server.md.
#pragma once
#include <stddef.h>

#include "server/app.h"

// GET /openapi.json
void api_openapi(srv_app *a, srv_req *r);

// The embedded document (NUL-terminated; `len` excludes the NUL).
const char *srv_openapi_json(size_t *len);
