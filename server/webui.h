// server/webui.h - the chat page served at `/` (server/webui/index.html,
// compiled into the binary by tools/embed.py; docs/server.md, "Browser clients").
#pragma once
#include "server/app.h"

// GET / : the page (text/html, with a Content-Security-Policy that lets it
// reach only this server: nothing is fetched from elsewhere).
void api_webui(srv_app *a, srv_req *r);
