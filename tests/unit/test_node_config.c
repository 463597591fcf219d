// tests/unit/test_node_config.c - the comparison of two nodes' configurations
// (engine/dist/node_config.h) that node 0 runs on each follower's hello:
// equal ones pass, and the first differing field is named with both values,
// the follower's ("here") first.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "engine/dist/node_config.h"

static pg_node_config base(void) {
    pg_node_config c;
    memset(&c, 0, sizeof c);
    pg_node_config_name(c.arch, "mixtral");
    pg_node_config_name(c.weight_dtype, "random");
    pg_node_config_name(c.load_format, "dummy");
    c.n_layers = 2, c.hidden = 64, c.vocab_size = 512, c.n_heads = 4, c.n_kv_heads = 4, c.head_dim = 16;
    c.ffn = 128, c.n_experts = 8, c.n_experts_used = 2;
    pg_node_config_name(c.device, "cpu");
    pg_node_config_name(c.matmul_mode, "exact");
    pg_node_config_name(c.quantization, "none");
    c.expert_parallel = 1;
    pg_node_config_name(c.all2all_backend, "allreduce");
    pg_node_config_name(c.kv_cache_dtype, "f32");
    c.max_model_len = 2048, c.block_size = 16, c.max_num_seqs = 256, c.max_num_batched_tokens = 256;
    c.chunked_prefill = c.prefix_caching = c.kv_layer_groups = 1;
    pg_node_config_name(c.speculative, "");
    return c;
}

static void test_equal(void **state) {
    (void)state;
    pg_node_config a = base(), b = base();
    char msg[256] = "";
    assert_int_equal(pg_node_config_diff(&a, &b, 1, msg, sizeof msg), 0);
    assert_string_equal(msg, "");
    pg_node_config z1, z2; // the tools' executors send none: zeros on both sides
    memset(&z1, 0, sizeof z1);
    memset(&z2, 0, sizeof z2);
    assert_int_equal(pg_node_config_diff(&z1, &z2, 3, msg, sizeof msg), 0);
}

// One field of the follower's configuration changed from base(), and the
// line that names it: a name field (`name` set) or an int32 one (`num`), at
// its offset, so each case is one row.
typedef struct {
    size_t off;
    const char *name;
    int32_t num;
    int32_t node;
    const char *want;
} one_field;

static const one_field one_field_cases[] = {
    {offsetof(pg_node_config, all2all_backend), "alltoall", 0, 1,
     "node 1: --all2all-backend alltoall here, allreduce on node 0"},
    {offsetof(pg_node_config, expert_parallel), NULL, 0, 2,
     "node 2: --enable-expert-parallel off here, on on node 0"},
    {offsetof(pg_node_config, max_model_len), NULL, 512, 1,
     "node 1: --max-model-len 512 here, 2048 on node 0"},
    {offsetof(pg_node_config, speculative), "ngram k=5", 0, 1,
     "node 1: --speculative-config ngram k=5 here, none on node 0"},
    {offsetof(pg_node_config, n_layers), NULL, 30, 1,
     "node 1: the model's layers 30 here, 2 on node 0"},
};

static void test_names_the_field(void **state) {
    (void)state;
    pg_node_config ours = base();
    char msg[256];
    for (size_t i = 0; i < sizeof one_field_cases / sizeof one_field_cases[0]; i++) {
        const one_field *c = &one_field_cases[i];
        pg_node_config theirs = base();
        char *field = (char *)&theirs + c->off;
        if (c->name)
            pg_node_config_name(field, c->name);
        else
            memcpy(field, &c->num, sizeof c->num);
        assert_int_equal(pg_node_config_diff(&theirs, &ours, c->node, msg, sizeof msg), 1);
        assert_string_equal(msg, c->want);
    }
}

// Several differences: the first in the struct's order (the model before the flags).
static void test_first_difference(void **state) {
    (void)state;
    pg_node_config ours = base(), theirs = base();
    char msg[256];
    pg_node_config_name(theirs.kv_cache_dtype, "f16");
    pg_node_config_name(theirs.arch, "llama");
    assert_int_equal(pg_node_config_diff(&theirs, &ours, 1, msg, sizeof msg), 1);
    assert_string_equal(msg, "node 1: the model's architecture llama here, mixtral on node 0");
}

// A name that fills its field (no terminating zero off the wire) is
// compared and printed within the field.
static void test_unterminated_name(void **state) {
    (void)state;
    pg_node_config ours = base(), theirs = base();
    memset(theirs.quantization, 'x', sizeof theirs.quantization);
    char msg[256];
    assert_int_equal(pg_node_config_diff(&theirs, &ours, 1, msg, sizeof msg), 1);
    char want[256];
    snprintf(want, sizeof want, "node 1: --quantization %.*s here, none on node 0", PG_NODE_NAME - 1,
             theirs.quantization);
    assert_string_equal(msg, want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal),
        cmocka_unit_test(test_names_the_field),
        cmocka_unit_test(test_first_difference),
        cmocka_unit_test(test_unterminated_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
