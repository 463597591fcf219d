// tests/unit/test_json_strict.c - the RFC 8259 check run before cJSON:
// what the grammar rejects (and cJSON alone accepted), what it accepts, and
// the duplicate-key scan.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/json_strict.h"

static bool check(const char *s) {
    size_t off = 0;
    const char *why = NULL;
    bool ok = json_strict_check(s, strlen(s), &off, &why);
    if (!ok) {
        assert_non_null(why);
        assert_true(off <= strlen(s));
    }
    return ok;
}

static void test_rejects_what_rfc8259_rejects(void **state) {
    const char *bad[] = {
        "{\"a\":01}", "{\"a\":-01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":-}", "{\"a\":1e}", "{\"a\":1e+}",
        "{\"a\":+1}", "{\"a\":0x10}", "{\"a\":\"x\ty\"}", "{\"a\":\"x\ny\"}", "{\"a\":\"\x01\"}",
        "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}", "{\"a\":\"\\u12g4\"}", "{\"a\":tru}", "{\"a\":nul}",
        "{\"a\":NaN}", "{\"a\":Infinity}", "{\"a\":[1,]}", "{\"a\":1,}", "{,}", "{\"a\" 1}", "{a:1}",
        "{'a':1}", "[1 2]", "{\"a\":1}}", "{\"a\":1} x", "", "   ", "{", "[", "\"abc", "{\"a\":[}",
        "{\"a\":1]", "[1}", "\x01{}", "{}\x0b",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (check(bad[i])) fail_msg("accepted: %s", bad[i]);
}

static void test_accepts_valid_json(void **state) {
    const char *good[] = {
        "{}", "[]", "0", "-0", "1.5e10", "-0.0E-3", "1E+2", "\"\"", "true", "false", "null",
        " \t\r\n{ \"a\" : [ 1 , 2 , { } , [ ] ] , \"b\" : \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\" } \n",
        "{\"prompt\":\"caf\xc3\xa9\",\"n\":2,\"stop\":[\"x\",\"y\"]}", "[[[[[]]]]]", "{\"a\":{\"b\":{}}}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (!check(good[i])) fail_msg("rejected: %s", good[i]);
}

static void test_depth_limit(void **state) {
    size_t n = JSON_STRICT_MAX_DEPTH;
    char *s = malloc(2 * n + 3);
    memset(s, '[', n);
    memset(s + n, ']', n);
    s[2 * n] = 0;
    assert_true(check(s));  // exactly the limit
    memmove(s + 1, s, 2 * n + 1);
    s[0] = '[';
    strcat(s, "]");
    assert_false(check(s));  // one deeper
    free(s);
}

static void test_error_offset(void **state) {
    size_t off = 0;
    const char *why = NULL;
    assert_false(json_strict_check("{\"a\":01}", 8, &off, &why));
    assert_int_equal(off, 6);
    assert_non_null(strstr(why, "leading zero"));
    // Not NUL-terminated: never read past n.
    char buf[4] = {'[', '1', ']', '9'};
    assert_true(json_strict_check(buf, 3, &off, &why));
}

static void test_duplicate_keys(void **state) {
    cJSON *j = cJSON_Parse("{\"a\":1,\"b\":{\"x\":1,\"y\":[{\"k\":1,\"k\":2}]},\"c\":3}");
    assert_non_null(j);
    assert_string_equal(json_strict_dup_key(j), "k");
    cJSON_Delete(j);
    j = cJSON_Parse("{\"a\":1,\"b\":2,\"a\":3}");
    assert_string_equal(json_strict_dup_key(j), "a");
    cJSON_Delete(j);
    // Same key in different objects, and arrays of objects: fine.
    j = cJSON_Parse("{\"a\":{\"a\":{\"a\":1}},\"m\":[{\"role\":\"user\"},{\"role\":\"user\"}]}");
    assert_null(json_strict_dup_key(j));
    cJSON_Delete(j);
    j = cJSON_Parse("[1,2,[3]]");
    assert_null(json_strict_dup_key(j));
    cJSON_Delete(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejects_what_rfc8259_rejects),
        cmocka_unit_test(test_accepts_valid_json),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_error_offset),
        cmocka_unit_test(test_duplicate_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
