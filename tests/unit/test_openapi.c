// tests/unit/test_openapi.c - the embedded OpenAPI document is true to the
// route table: every route of server/http_router.c is described with its
// method, every described path and method is a route, routes that need the
// API key say so (security) and open ones do not; and CORS lists parse as
// vLLM's flags take them.
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "server/cors.h"
#include "server/http_router.h"
#include "server/openapi.h"

static cJSON *doc(void) {
    size_t len;
    const char *s = srv_openapi_json(&len);
    cJSON *d = cJSON_ParseWithLength(s, len);
    assert_non_null(d);
    return d;
}

static void test_document_is_openapi_31(void **state) {
    cJSON *d = doc();
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(d, "openapi");
    assert_true(cJSON_IsString(v));
    assert_string_equal(v->valuestring, "3.1.0");
    cJSON_Delete(d);
}

static void test_every_route_is_documented(void **state) {
    cJSON *d = doc();
    const cJSON *paths = cJSON_GetObjectItemCaseSensitive(d, "paths");
    int n;
    const srv_route_info *r = srv_routes(&n);
    assert_true(n >= 10);
    for (int i = 0; i < n; i++) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(paths, r[i].path);
        if (!p) fail_msg("route %s is not in openapi.json", r[i].path);
        char m[8] = {0};  // "GET" -> "get", as OpenAPI spells operations
        for (int k = 0; r[i].method[k] && k < 7; k++) m[k] = (char)(r[i].method[k] | 0x20);
        const cJSON *op = cJSON_GetObjectItemCaseSensitive(p, m);
        if (!op) fail_msg("%s %s is not in openapi.json", r[i].method, r[i].path);
        const cJSON *sec = cJSON_GetObjectItemCaseSensitive(op, "security");
        if (r[i].open && sec) fail_msg("%s needs no key but documents security", r[i].path);
        if (!r[i].open && !sec) fail_msg("%s needs the key but documents no security", r[i].path);
        if (!cJSON_GetObjectItemCaseSensitive(op, "responses")) fail_msg("%s has no responses", r[i].path);
    }
    cJSON_Delete(d);
}

static void test_every_documented_operation_is_a_route(void **state) {
    cJSON *d = doc();
    const cJSON *paths = cJSON_GetObjectItemCaseSensitive(d, "paths"), *p;
    int n;
    const srv_route_info *r = srv_routes(&n);
    cJSON_ArrayForEach(p, paths) {
        const cJSON *op;
        cJSON_ArrayForEach(op, p) {
            bool found = false;
            for (int i = 0; i < n && !found; i++)
                found = !strcmp(r[i].path, p->string) && !strcasecmp(r[i].method, op->string);
            if (!found) fail_msg("openapi.json documents %s %s, which is no route", op->string, p->string);
        }
    }
    cJSON_Delete(d);
}

static void test_cors_lists_parse_both_forms(void **state) {
    srv_cors c = {0};
    assert_int_equal(srv_cors_set(&c, "origins", " http://a.example ,http://b.example"), 0);
    assert_int_equal(srv_cors_set(&c, "methods", "[\"get\", \"post\"]"), 0);
    srv_cors_finish(&c);
    assert_true(c.enabled);
    assert_false(c.any_origin);
    assert_string_equal(c.origins[0], "http://a.example");
    assert_string_equal(c.origins[1], "http://b.example");
    assert_null(c.origins[2]);
    assert_string_equal(c.methods[0], "GET");
    assert_string_equal(c.methods[1], "POST");
    assert_false(c.any_method);
    assert_true(c.any_header);  // default "*"
    srv_cors_free(&c);

    assert_true(srv_cors_set(&c, "origins", "") < 0);
    assert_true(srv_cors_set(&c, "origins", " , ") < 0);
    assert_true(srv_cors_set(&c, "origins", "[1]") < 0);
    assert_true(srv_cors_set(&c, "headers", "[\"x\"") < 0);
    srv_cors_finish(&c);
    assert_false(c.enabled);  // off without origins
    srv_cors_free(&c);

    assert_int_equal(srv_cors_set(&c, "origins", "[\"*\"]"), 0);
    assert_int_equal(srv_cors_set(&c, "headers", "Content-Type, Authorization"), 0);
    srv_cors_finish(&c);
    assert_true(c.any_origin);
    assert_string_equal(c.headers[1], "authorization");
    srv_cors_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_document_is_openapi_31),
        cmocka_unit_test(test_every_route_is_documented),
        cmocka_unit_test(test_every_documented_operation_is_a_route),
        cmocka_unit_test(test_cors_lists_parse_both_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
