// server/api_lora.c - vLLM's runtime LoRA routes (docs/lora.md):
// POST /v1/load_lora_adapter {"lora_name", "lora_path"} and POST
// /v1/unload_lora_adapter {"lora_name"}, answered only when the server was
// started with --enable-lora and --allow-runtime-lora-updating (vLLM gates
// them with VLLM_ALLOW_RUNTIME_LORA_UPDATING); a 404 otherwise, as a route
// vLLM has not mounted. The engine applies a change between steps, so the
// route waits for it on the thread pool, never on the loop thread.
#include <cjson/cJSON.h>
#include <string.h>

#include "common/err.h"
#include "server/api_common.h"
#include "server/app.h"

// A string field of the body, required.
static int str_field(const cJSON *body, const char *key, const char **out, api_error *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!cJSON_IsString(it) || !it->valuestring[0])
        return api_err(e, 400, key, "%s must be a non-empty string", key);
    *out = it->valuestring;
    return 0;
}

// The engine's refusal as an OpenAI error: 404 for an adapter it does not
// have, 409 while requests use it, 400 for the rest (a taken name, no free
// slot, an adapter that does not fit: its file named).
static int engine_error(int rc, const char *param, api_error *e) {
    const int status = rc == PG_ENOTFOUND ? 404 : rc == PG_ENOSPC ? 409 : 400;
    return api_err(e, status, param, "%s", pg_err_msg());
}

static int send_message(sbuf *out, const char *fmt, const char *name) {
    char msg[400];
    snprintf(msg, sizeof msg, fmt, name);
    // vLLM answers with this text; here as a JSON string (the route's body is JSON).
    cJSON *str = cJSON_CreateString(msg);
    char *json = cJSON_PrintUnformatted(str);
    sbuf_puts(out, json);
    cJSON_free(json);
    cJSON_Delete(str);
    return 0;
}

static int load_body(srv_app *a, const char *body, size_t len, sbuf *out, api_error *e) {
    cJSON *j = NULL;
    const char *name, *path;
    int rc = api_parse_body(body, len, &j, e);
    if (rc == 0) rc = str_field(j, "lora_name", &name, e);
    if (rc == 0) rc = str_field(j, "lora_path", &path, e);
    if (rc == 0 && (!strcmp(name, a->served_name) || !strcmp(name, a->model_path)))
        rc = api_err(e, 400, "lora_name", "'%s' is the served model's name", name);
    if (rc == 0 && pg_engine_lora_load(a->engine, name, path) < 0) rc = engine_error(PG_EINVAL, "lora_path", e);
    if (rc == 0) send_message(out, "Success: LoRA adapter '%s' added successfully.", name);
    cJSON_Delete(j);
    return rc;
}

static int unload_body(srv_app *a, const char *body, size_t len, sbuf *out, api_error *e) {
    cJSON *j = NULL;
    const char *name;
    int rc = api_parse_body(body, len, &j, e);
    if (rc == 0) rc = str_field(j, "lora_name", &name, e);
    if (rc == 0) {
        const int r = pg_engine_lora_unload(a->engine, name);
        if (r < 0) rc = engine_error(r, "lora_name", e);
    }
    if (rc == 0) send_message(out, "Success: LoRA adapter '%s' removed successfully.", name);
    cJSON_Delete(j);
    return rc;
}

void api_load_lora(srv_app *a, srv_req *r) { app_run_on_pool(a, r, load_body); }
void api_unload_lora(srv_app *a, srv_req *r) { app_run_on_pool(a, r, unload_body); }
