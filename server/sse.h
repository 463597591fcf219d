// server/sse.h - Server-Sent Events framing for streamed completions.
//
// OpenAI's format: a `text/event-stream` response whose events are single
// `data: <json>` lines followed by a blank line, ending with `data: [DONE]`.
#pragma once
#include <cjson/cJSON.h>

#include "server/http_conn.h"

// Starts a 200 event stream (chunked on HTTP/1.1).
void sse_begin(srv_req *r);
// Sends one event with `obj` printed unformatted. Returns srv_resp_write's result.
int sse_send_json(srv_req *r, const cJSON *obj);
// Sends `data: [DONE]`.
int sse_send_done(srv_req *r);
