// server/openapi.c - serves the embedded OpenAPI document (server/openapi.h).
#include "server/openapi.h"

// build/gen/server/openapi_json.c (tools/embed.py)
extern const unsigned char paged_openapi_json[];
extern const size_t paged_openapi_json_len;

const char *srv_openapi_json(size_t *len) {
    if (len) *len = paged_openapi_json_len;
    return (const char *)paged_openapi_json;
}

void api_openapi(srv_app *a, srv_req *r) {
    app_send_json(r, 200, (const char *)paged_openapi_json, paged_openapi_json_len);
}
