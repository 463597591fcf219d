// tests/unit/test_llama_logits.c - the CPU forward on the real default model
// against two independent references (tests/data/logits_golden.json, made by
// tests/data/gen_logits_golden.py):
//  - an exact f32 numpy forward over weights dequantized by gguf-py: our
//    exact matmul mode must agree to float rounding;
//  - llama.cpp (CPU build), which quantizes activations to 8 bits inside its
//    dot products: our llama.cpp-compatible mode must agree closely, and its
//    greedy continuation must be llama.cpp's.
// Skipped (visibly) when models/ has no default model.
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/file.h"
#include "engine/model/model.h"
#include "engine/runner/runner.h"
#include "tests/unit/gguf_writer.h"

static char model_path[4096];
static bool have_model;
static cJSON *golden;
static char *golden_text;

static int b64val(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

// Decodes base64 float32 data into a malloc'd array; *n = float count.
static float *b64_floats(const char *s, size_t *n) {
    size_t len = strlen(s), o = 0;
    uint8_t *buf = malloc(len / 4 * 3 + 4);
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64val(s[i]);
        if (v < 0) continue;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) buf[o++] = (uint8_t)(acc >> (bits -= 8));
    }
    *n = o / 4;
    return (float *)buf;
}

static int setup(void **state) {
    char path[4096];
    if (!tw_repo_path("models/SmolLM2-135M-Instruct.Q4_1.gguf", model_path, sizeof model_path)) return 0;
    have_model = true;
    size_t len;
    if (!tw_repo_path("tests/data/logits_golden.json", path, sizeof path) ||
        pg_read_file(path, 64 << 20, &golden_text, &len) < 0)
        return -1;
    golden = cJSON_ParseWithLength(golden_text, len);
    return golden ? 0 : -1;
}

static int teardown(void **state) {
    cJSON_Delete(golden);
    free(golden_text);
    return 0;
}

// Runs `ids` as one prefill then `n_greedy` greedy decode steps through the
// runner on the CPU backend in `mode`; writes the prefill's last-position
// logits and the greedy tokens.
static void run(pg_matmul_mode mode, const int32_t *ids, int n, float *logits, int32_t *greedy,
                int n_greedy) {
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(2, mode, &be), 0);
    pg_model *model;
    pg_model_load_opts mo = {.path = model_path};
    assert_int_equal(pg_model_load(&mo, be, &model), 0);
    assert_int_equal(model->cfg.vocab_size, 49152);
    pg_runner_config rc = {.block_size = 16, .max_num_seqs = 1, .max_num_batched_tokens = 512,
                           // The engine's auto KV type: f16 (llama.cpp's) in the
                           // compatible numerics, f32 in the exact ones.
                           .max_model_len = 63 * 16,
                           .kv_dtype = mode == PG_MATMUL_EXACT ? PG_KV_F32 : PG_KV_F16};
    pg_runner *r;
    assert_int_equal(pg_runner_create(model, &rc, &r), 0);
    assert_int_equal(pg_runner_alloc_kv(r, 64, 0), 0);
    int32_t table[63], hist[512];
    for (int i = 0; i < 63; i++) table[i] = i + 1;
    memcpy(hist, ids, sizeof(int32_t) * (size_t)n);
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.logprobs = 20;
    int start = 0, len = n;
    for (int step = 0; step <= n_greedy; step++) {
        pg_plan_seq s = {.seq_id = 1, .tokens = hist + start, .n_tokens = len, .start_pos = start,
                         .block_table = table, .n_blocks = 63, .sample = true, .sp = &sp,
                         .history = hist, .n_history = start + len, .n_prompt = n, .eos_id = -1};
        pg_batch_plan p = {.n_seqs = 1, .seqs = &s, .n_tokens = len};
        pg_step_output o;
        assert_int_equal(pg_runner_execute(r, &p, &o), 0);
        // The runner keeps the full rows of the step's logits.
        if (step == 0 && logits) assert_int_equal(pg_runner_last_logits(r, logits, 1), 0);
        if (step < n_greedy && greedy) greedy[step] = o.outs[0].token;
        hist[start + len] = o.outs[0].token;
        start += len;
        len = 1;
    }
    pg_runner_free(r);
    pg_model_free(model);
    be->dev->destroy(be);
}

static double rel_err(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]), den += (double)ref[i] * ref[i];
    return sqrt(num / den);
}

static size_t argmax(const float *a, size_t n) {
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (a[i] > a[b]) b = i;
    return b;
}

static void test_logits_and_greedy(void **state) {
    if (!have_model) {
        print_message("SKIP: models/SmolLM2-135M-Instruct.Q4_1.gguf not present\n");
        skip();
    }
    const size_t vocab = 49152; // SmolLM2's; checked against the golden rows below
    float *logits = malloc(sizeof(float) * vocab);
    const cJSON *p;
    int n_prompts = 0, greedy_equal = 0;
    double worst_exact = 0, worst_quant = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(golden, "prompts")) {
        const cJSON *jids = cJSON_GetObjectItem(p, "ids");
        int n = cJSON_GetArraySize(jids);
        int32_t ids[256];
        for (int i = 0; i < n; i++) ids[i] = cJSON_GetArrayItem(jids, i)->valueint;
        size_t nf, nl;
        float *ref_f32 = b64_floats(cJSON_GetObjectItem(p, "logits_f32")->valuestring, &nf);
        float *ref_llama = b64_floats(cJSON_GetObjectItem(p, "logits_llama_cpp")->valuestring, &nl);
        assert_int_equal(nf, vocab);
        assert_int_equal(nl, vocab);

        run(PG_MATMUL_EXACT, ids, n, logits, NULL, 0);
        double e_exact = rel_err(logits, ref_f32, vocab);
        assert_int_equal(argmax(logits, vocab), argmax(ref_f32, vocab));
        assert_true(e_exact < 1e-4);

        const cJSON *jg = cJSON_GetObjectItem(p, "greedy_llama_cpp");
        int ng = cJSON_GetArraySize(jg);
        int32_t greedy[32];
        run(PG_MATMUL_QUANT_ACT, ids, n, logits, greedy, ng);
        double e_quant = rel_err(logits, ref_llama, vocab);
        assert_int_equal(argmax(logits, vocab), argmax(ref_llama, vocab));
        int same = 1;
        for (int i = 0; i < ng; i++) same &= greedy[i] == cJSON_GetArrayItem(jg, i)->valueint;
        print_message("%-40.40s exact vs f32 %.2e | quant vs llama.cpp %.2e | greedy %s\n",
                      cJSON_GetObjectItem(p, "prompt")->valuestring, e_exact, e_quant,
                      same ? "equal" : "DIFFERS");
        greedy_equal += same;
        worst_exact = fmax(worst_exact, e_exact);
        worst_quant = fmax(worst_quant, e_quant);
        n_prompts++;
        free(ref_f32);
        free(ref_llama);
    }
    print_message("%d prompts: worst rel err exact %.2e, quant %.2e; greedy equal to llama.cpp on %d\n",
                  n_prompts, worst_exact, worst_quant, greedy_equal);
    assert_true(worst_quant < 1e-2);
    assert_int_equal(greedy_equal, n_prompts);
    free(logits);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_and_greedy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
