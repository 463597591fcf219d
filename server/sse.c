// server/sse.c - Server-Sent Events framing.
#include "server/sse.h"

#include <stdlib.h>
#include <string.h>

#include "server/sbuf.h"

void sse_begin(srv_req *r) {
    srv_resp_begin(r, 200, "text/event-stream; charset=utf-8",
                   "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n");
}

int sse_send_json(srv_req *r, const cJSON *obj) {
    char *json = cJSON_PrintUnformatted(obj);
    if (!json) return -1;
    sbuf b = {0};
    sbuf_reserve(&b, strlen(json) + 8);
    sbuf_puts(&b, "data: ");
    sbuf_puts(&b, json);
    sbuf_puts(&b, "\n\n");
    free(json);
    int rc = srv_resp_write(r, b.p, b.len);
    sbuf_free(&b);
    return rc;
}

int sse_send_done(srv_req *r) {
    static const char done[] = "data: [DONE]\n\n";
    return srv_resp_write(r, done, sizeof done - 1);
}
