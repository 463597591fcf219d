// server/webui.c - serves the embedded chat page (server/webui.h).
#include "server/webui.h"

#include <stddef.h>

// build/gen/server/webui/index_html.c (tools/embed.py)
extern const unsigned char paged_webui_index_html[];
extern const size_t paged_webui_index_html_len;

// The page is one self-contained file: inline script and style, and API
// calls to its own origin only. The policy makes the browser enforce that.
#define WEBUI_HEADERS                                                                      \
    "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "            \
    "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; "      \
    "form-action 'none'; frame-ancestors 'none'\r\n"                                       \
    "X-Content-Type-Options: nosniff\r\n"                                                   \
    "Cache-Control: no-cache\r\n"

void api_webui(srv_app *a, srv_req *r) {
    srv_resp_send(r, 200, "text/html; charset=utf-8", WEBUI_HEADERS, (const char *)paged_webui_index_html,
                  paged_webui_index_html_len);
}
