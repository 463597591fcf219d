// tests/unit/test_jinja.c - the Jinja engine: semantics that chat templates
// lean on (checked against what jinja2 3.1 prints for the same source),
// clear errors, and the limits that stop hostile templates. The corpus of
// real templates is compared with jinja2 itself by
// tests/integration/test_chat_templates.py.
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "text/template/jinja.h"

static int render(const char *src, const char *ctx_json, const pg_jinja_limits *lim, char **out) {
    *out = NULL;
    pg_jinja_template *t;
    int rc = pg_jinja_parse(src, strlen(src), &t);
    if (rc < 0) return rc;
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    rc = pg_jinja_render(t, ctx, lim, out);
    cJSON_Delete(ctx);
    pg_jinja_free(t);
    return rc;
}

static void expect(const char *src, const char *ctx, const char *want) {
    char *out;
    if (render(src, ctx, NULL, &out) < 0) fail_msg("%s: %s", src, pg_err_msg());
    if (strcmp(out, want)) fail_msg("%s\n got: [%s]\nwant: [%s]", src, out, want);
    free(out);
}

static void expect_error(const char *src, const char *ctx, const char *substring) {
    char *out;
    int rc = render(src, ctx, NULL, &out);
    if (rc >= 0) fail_msg("%s rendered [%s], want an error with '%s'", src, out, substring);
    if (!strstr(pg_err_msg(), substring)) fail_msg("%s: error '%s' lacks '%s'", src, pg_err_msg(), substring);
    assert_null(out);
}

// Expected strings are jinja2 3.1.6's output with trim_blocks and
// lstrip_blocks (HF's environment) for the same source.
static void test_semantics(void **state) {
    (void)state;
    expect("{% for m in ms %}{{ loop.index0 }}{{ m }}{% if not loop.last %},{% endif %}{% endfor %}",
           "{\"ms\":[\"a\",\"b\",\"c\"]}", "0a,1b,2c");
    expect("{{ [1, 2.5, \"a'b\", none, true, {\"k\": [1]}] }}", NULL, "[1, 2.5, \"a'b\", None, True, {'k': [1]}]");
    expect("{{ 1e16 }}|{{ 1/3 }}|{{ 10/2 }}|{{ 7//2 }}|{{ -7 % 3 }}|{{ 2**10 }}|{{ 0.1+0.2 }}", NULL,
           "1e+16|0.3333333333333333|5.0|3|2|1024|0.30000000000000004");
    expect("{% set ns = namespace(n=0) %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
           NULL, "10");
    expect("{% for i in [1,2,3] %}{% if loop.first %}{% set x = 5 %}{% endif %}[{{ x }}]{% endfor %}{{ x }}",
           "{\"x\":0}", "[5][0][0]0");
    expect("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', punct='?') }}",
           NULL, "Hi Ann! Hi Bo?");
    expect("{{ '  x  ' | trim }}|{{ 'a-b c' | title }}|{{ 'hello' | capitalize }}|{{ 'x' | upper }}", NULL,
           "x|A-B C|Hello|X");
    expect("{{ {'b': 1, 'a': [1, 2]} | tojson }}|{{ {'b': 1, 'a': 'é\"'} | tojson(sort_keys=true) }}", NULL,
           "{\"b\": 1, \"a\": [1, 2]}|{\"a\": \"é\\\"\", \"b\": 1}");
    expect("{{ {'a': [1, {}], 'b': []} | tojson(indent=2) }}", NULL,
           "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
    expect("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'[1:] }}|{{ 'abc'[::-1] }}|{{ [1,2,3][-1] }}",
           NULL, "['a', 'b', '', 'c']|['a', 'b']|bc|cba|3");
    expect("{{ 'x' in 'xyz' }}{{ 3 in [1,2] }}{{ 'k' in {'k': 1} }}{{ 'a' ~ 1 ~ none }}", NULL, "TrueFalseTruea1None");
    expect("{{ x is defined }}{{ y is none }}{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}"
           "{{ 3 is odd }}{{ 'a' is equalto 'a' }}",
           "{\"y\":null}", "FalseTrueTrueTrueTrueTrueTrue");
    expect("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | join(', ') }}|{{ ms | length }}",
           "{\"ms\":[{\"role\":\"user\",\"c\":\"a\"},{\"role\":\"bot\",\"c\":\"b\"},{\"role\":\"user\",\"c\":\"d\"}]}",
           "a, d|3");
    expect("{{ undefined_var | default('dflt') }}|{{ '' | default('e', true) }}|{{ {'b': 2, 'a': 1} | dictsort }}",
           NULL, "dflt|e|[('a', 1), ('b', 2)]");
    expect("{{ 'line1\nline2' | indent(2) }}|{{ 'a\nb' | indent(2, first=true) }}", NULL, "line1\n  line2|  a\n  b");
    expect("{{ '%s is %d' % ('x', 3) }}|{{ 'hi %s' % 'you' }}|{{ (1,) }}{{ (1, 'a') }}", NULL, "x is 3|hi you|(1,)(1, 'a')");
    expect("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\":{\"a\":1,\"b\":\"x\"}}", "a=1;b=x;");
    expect("{% set s %}  inner  {% endset %}[{{ s }}]{% filter upper %}up{% endfilter %}", NULL, "[  inner  ]UP");
    expect("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}", NULL, "2242");
    expect("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
           NULL, "1");
    expect("{{ \"'\"|safe + '<b>' }}|{{ 'a' + 'b' }}", NULL, "'&lt;b&gt;|ab");
    // Whitespace control: lstrip_blocks and trim_blocks, -, +.
    expect("<\n  {% if true %}\n    x\n  {% endif %}\n>", NULL, "<\n    x\n>");
    expect("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    expect("a\n  {%+ if true %}b{% endif %}", NULL, "a\n  b");
    expect("x\n{# a comment #}\ny\n", NULL, "x\ny");
}

static void test_errors(void **state) {
    (void)state;
    expect_error("{% if x %}never closed", NULL, "line 1");
    expect_error("{% if x %}\n{% endfor %}", NULL, "line 2");
    expect_error("{{ 1 + }}", NULL, "unexpected");
    expect_error("{% include 'x' %}", NULL, "unsupported statement");
    expect_error("{{ raise_exception('Only user and assistant roles are supported!') }}", NULL,
                 "Only user and assistant roles are supported!");
    expect_error("{{ x.y }}", NULL, "'x' is undefined");
    expect_error("{{ 'a' + 1 }}", NULL, "unsupported operand");
    expect_error("{{ [1] | frobnicate }}", NULL, "no filter named 'frobnicate'");
    expect_error("{{ x | tojson }}", NULL, "not JSON serializable");
    expect_error("{% set l = [] %}{{ l.append(1) }}", NULL, "unsafe");
    expect_error("{{ 'unterminated }}", NULL, "unterminated");
}

// Hostile templates end with a clear error, fast.
static void test_limits(void **state) {
    (void)state;
    pg_jinja_limits lim;
    pg_jinja_limits_default(&lim);
    lim.max_steps = 100000;
    char *out;
    // A loop nest with 10^15 iterations.
    int rc = render("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                    "{% endfor %}{% endfor %}{% endfor %}", NULL, &lim, &out);
    assert_true(rc < 0);
    if (!strstr(pg_err_msg(), "evaluation steps")) fail_msg("%s", pg_err_msg());
    // Unbounded recursion.
    rc = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim, &out);
    assert_true(rc < 0);
    assert_non_null(strstr(pg_err_msg(), "nested deeper"));
    // Output that doubles.
    pg_jinja_limits_default(&lim);
    lim.max_output = 1 << 20;
    rc = render("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
                NULL, &lim, &out);
    assert_true(rc < 0);
    assert_true(strstr(pg_err_msg(), "memory") || strstr(pg_err_msg(), "output"));
    rc = render("{{ 'x' * 100000000 }}", NULL, &lim, &out);
    assert_true(rc < 0);
    assert_non_null(strstr(pg_err_msg(), "too large"));
    // Too big a range (jinja2's sandbox limit) and deep nesting in the parser.
    rc = render("{{ range(1000000) | length }}", NULL, NULL, &out);
    assert_true(rc < 0);
    assert_non_null(strstr(pg_err_msg(), "Range too big"));
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    rc = render(deep, NULL, NULL, &out);
    assert_true(rc < 0);
    assert_non_null(strstr(pg_err_msg(), "nested too deeply"));
    // Left-deep chains are tree levels too (fuzz_jinja found "{{a" + ".b" *
    // 20000 + "}}" overrunning the C stack): each kind is refused cleanly,
    // and 100 links still render.
    static const char *const links[] = {".b", "|string", "+1", "*1", " and 1", " or 1", "[0]"};
    for (size_t c = 0; c < sizeof links / sizeof links[0]; c++) {
        const size_t n = strlen(links[c]);
        for (int count = 100; count <= 20000; count += 19900) {
            char *t = malloc(16 + n * (size_t)count);
            size_t o = (size_t)sprintf(t, "{{ 1");
            for (int i = 0; i < count; i++) memcpy(t + o, links[c], n), o += n;
            strcpy(t + o, " }}");
            rc = render(t, NULL, NULL, &out);
            if (count == 20000) {
                assert_true(rc < 0);
                assert_non_null(strstr(pg_err_msg(), "nested too deeply"));
            } else if (c != 0 && c != 6) { // 1.b and 1[0] are undefined / errors at run time, not in the parser
                assert_int_equal(rc, 0);
                free(out);
            } else if (rc == 0) {
                free(out);
            }
            free(t);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_semantics),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
