// server/engine_options.c - the engine's command-line options and their help
// text, shared by every subcommand that runs an engine (serve, generate, plan).
#include "server/engine_options.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/parse.h"
#include "engine/runner/runner.h"

// A number's macro as a string literal, so the help states the defaults
// (engine/engine.h, scheduler/sched.h) the code uses.
#define STR_(x) #x
#define STR(x) STR_(x)

const char *pg_engine_options_help =
    "Model and device:\n"
    "  --model PATH                  GGUF file or Hugging Face model directory\n"
    "                                (default: the bundled SmolLM2-135M-Instruct Q4_1)\n"
    "  --device auto|cpu|cuda        compute device (default auto: the GPU when one is\n"
    "                                found, else the CPU)\n"
    "  --threads N                   CPU threads (default: all cores)\n"
    "  --matmul-mode MODE            CPU products with GGUF block weights: default,\n"
    "                                quant (8-bit activations, as llama.cpp), exact (f32)\n"
    "  --chat-template NAME|FILE     chatml, llama3, llama2, mistral, or a Jinja file\n"
    "  --tokenizer PATH              tokenizer from a GGUF file, HF directory or tokenizer.json\n"
    "                                (default: the model's)\n"
    "  --load-format auto|dummy      dummy: random weights generated on the GPU, shape from\n"
    "                                --hf-config (no checkpoint needed; GPU only)\n"
    "  --hf-config PATH              config.json (or its directory) for --load-format dummy\n"
    "  --gpu-memory-utilization F    share of GPU memory for weights, workspace and KV cache\n"
    "                                (default " STR(PG_DEFAULT_GPU_MEMORY_UTILIZATION) "); the KV cache gets what is left\n"
    "  --cuda-graphs on|off|lazy     decode CUDA graphs: captured at start-up (on, default),\n"
    "                                on a batch shape's first step (lazy), or none (off)\n"
    "  -tp, --tensor-parallel-size N shard the model over N GPUs (one worker thread each),\n"
    "                                or N CPU ranks sharing the CPU's threads (default 1)\n"
    "  --enable-expert-parallel      with -tp N: each rank holds n_experts / N whole experts\n"
    "                                of a mixture-of-experts model instead of a slice of\n"
    "                                every expert (attention stays split by heads); ignored,\n"
    "                                with a log line, for a model without experts\n"
    "  --all2all-backend allreduce|alltoall  how expert parallelism combines the experts'\n"
    "                                shares: the all-reduce every layer ends with (default),\n"
    "                                or each row's shares to the rank owning it by all-to-all\n"
    "                                (fewer bytes where top_k < ranks; cpu/tcp only for now)\n"
    "  --tp-comm auto|cpu|nccl       the ranks' communicator (auto: nccl on GPUs, the\n"
    "                                in-process one on the CPU)\n"
    "  --nnodes N --node-rank R      tensor parallelism over N nodes (-tp / N ranks each):\n"
    "                                node 0 serves HTTP and schedules, the others follow\n"
    "  --master-addr A --master-port P  node 0's address and control port (default\n"
    "                                127.0.0.1:29500; the CPU data plane uses P + 1)\n"
    "  --tp-timeout S                CPU data plane across nodes: a collective waiting S\n"
    "                                seconds for a rank that sends nothing fails the step\n"
    "                                (default 300)\n"
    "KV cache and scheduling:\n"
    "  --kv-cache-memory BYTES       KV cache size, e.g. 2G (default " STR(PG_DEFAULT_CPU_KV_GIB) "G on CPU; on the GPU,\n"
    "                                what --gpu-memory-utilization leaves)\n"
    "  --kv-blocks N                 KV cache size in blocks (overrides the above)\n"
    "  --block-size N                tokens per KV block (default " STR(SCHED_DEFAULT_BLOCK_SIZE) ")\n"
    "  --quantization Q              fp8|int4|awq|gptq|none: quantize the layers' linear weights at\n"
    "                                load (the embedding, LM head and norms stay as stored): fp8 =\n"
    "                                e4m3 with a scale per\n"
    "                                row (W8A8 in the quant numerics), int4 = group 128 with scales\n"
    "                                and zero points (weight-only); awq|gptq: an AWQ / GPTQ int4\n"
    "                                checkpoint, repacked at load (inferred from its config.json;\n"
    "                                given, it must match); CPU only for now\n"
    "  --cpu-offload-gb N            keep at least N GiB of layer weights (from the first\n"
    "                                layer on) in pinned host memory, copied to the device\n"
    "                                one layer ahead of use (per GPU; default 0)\n"
    "  --kv-cache-dtype T            KV cache elements: auto (bf16 on the GPU; on the CPU f16,\n"
    "                                f32 with --matmul-mode exact), bf16, fp8 (e4m3 with a scale\n"
    "                                per layer and KV head: --kv-cache-scales; twice bf16's\n"
    "                                tokens), f32, f16, q8_0,\n"
    "                                fp8_e4m3_scaled (CPU only; q8_0: int8 with an f16 scale per\n"
    "                                32 elements of head_dim, 3.76x f32's tokens in the same\n"
    "                                memory; fp8_e4m3_scaled: e4m3 with an f32 scale max|x|/448\n"
    "                                per head row, nothing saturates, head_dim + 4 bytes a row)\n"
    "  --kv-cache-scales auto|one    fp8 KV scales: auto = the checkpoint's k_scale/v_scale,\n"
    "                                else calibrated at start-up (one prefill; per layer and KV\n"
    "                                head); one = 1.0 (saturating at 448; vLLM's default)\n"
    "  --async-scheduling auto|on|off  plan the next step while the device runs this one\n"
    "                                (auto: on with the GPU, off on the CPU)\n"
    "  --swap-space BYTES            host KV blocks: swap space for preempted requests and\n"
    "                                the prefix cache's host tier (default: 4 GiB bounded by\n"
    "                                10% of RAM on a GPU; none on the CPU; 0 = none)\n"
    "  --no-host-kv-cache            host blocks for swap preemption only (no host tier)\n"
    "  --host-kv-offload all|reused  which evicted prefix blocks the host tier copies: every\n"
    "                                one (default), or those a request reused since they were\n"
    "                                cached (SGLang's write_through_selective)\n"
    "  --disable-hybrid-kv-cache-manager  one block table for every layer: sliding-window\n"
    "                                layers keep all their blocks (default: they keep their\n"
    "                                window's; docs/kv_layer_groups.md)\n"
    "  --preemption-mode MODE        recompute (default) or swap\n"
    "  --max-model-len N             prompt + output limit (default: the model's)\n"
    "LoRA adapters (docs/lora.md):\n"
    "  --enable-lora                 serve LoRA adapters beside the model\n"
    "  --lora-modules NAME=PATH ...  PEFT adapter directories, each served as model NAME\n"
    "                                (a request's \"model\" picks one)\n"
    "  --max-loras N                 adapter slots (default: as many as named); an adapter\n"
    "                                not in one is loaded when a request names it, in place\n"
    "                                of the least recently used idle one\n"
    "  --max-cpu-loras N             adapters known at once, in a slot or not (default:\n"
    "                                the larger of --max-loras and the adapters named)\n"
    "  --max-lora-rank R             the largest rank accepted (default " STR(PG_DEFAULT_MAX_LORA_RANK) ")\n"
    "  --allow-runtime-lora-updating POST /v1/load_lora_adapter and /v1/unload_lora_adapter\n"
    "                                (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=True does the same)\n"
    "  --max-num-seqs N              sequences per step (default " STR(SCHED_DEFAULT_MAX_NUM_SEQS) ")\n"
    "  --max-num-batched-tokens N    tokens per step (default " STR(PG_DEFAULT_CPU_BATCHED_TOKENS) " on the CPU, where a step\n"
    "                                stays a few hundred ms; " STR(SCHED_DEFAULT_MAX_NUM_BATCHED_TOKENS) " on a GPU)\n"
    "  --long-prefill-token-threshold N  prefill tokens one request gets per step while\n"
    "                                others are live (default: a quarter of the step\n"
    "                                budget; 0 = no cap)\n"
    "  --no-chunked-prefill          run each prompt in one step\n"
    "  --no-prefix-caching           disable automatic prefix caching\n"
    "  --scheduling-policy P         fcfs (default) or priority\n"
    "  --max-waiting N               queued requests before 503 (serve: default 1024;\n"
    "                                generate: 0 = unlimited)\n"
    "Speculative decoding (docs/speculative_decoding.md):\n"
    "  --speculative-config JSON     vLLM's: '{\"method\": \"ngram\", \"num_speculative_tokens\": 5,\n"
    "                                \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' (n-gram prompt\n"
    "                                lookup; requests of one sequence (greedy, sampled, penalties,\n"
    "                                bias, logprobs, structured outputs); \"disable_by_batch_size\": N: none above\n"
    "                                N running sequences, default " STR(SCHED_SPEC_DEFAULT_MAX_SEQS) ");\n"
    "                                '{\"method\": \"draft_model\", \"model\": PATH, \"num_speculative_tokens\": 4}'\n"
    "                                (a smaller model of the same vocabulary guesses greedily);\n"
    "                                with \"replay\": FILE, \"replay_error_rate\": R, \"replay_seed\": S its\n"
    "                                proposals are an earlier greedy run's outputs (generate's\n"
    "                                JSON lines), each wrong with probability R: a benchmark tool\n";

// An integer member of --speculative-config: *dst keeps its value when absent.
static int spec_int(const cJSON *o, const char *key, int32_t lo, int32_t hi, int32_t *dst) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= lo && d <= hi) || d != floor(d))
        return pg_err_set(PG_EINVAL, "--speculative-config: %s must be an integer in [%d, %d]", key, lo, hi);
    *dst = (int32_t)d;
    return 1;
}

// The replay draft's keys of method "draft_model" (engine/draft_replay.h, a
// measuring tool): "replay" (the file; read when the engine starts, which
// names it if it is unusable), "replay_error_rate" (0 .. 1, default 0) and
// "replay_seed" (default 0); the last two only with the first.
static int spec_replay_config(pg_spec_options *sp, const cJSON *o) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "replay");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "replay_error_rate");
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(o, "replay_seed");
    if (!f) {
        if (r || seed) return pg_err_set(PG_EINVAL, "--speculative-config: replay_error_rate and replay_seed need \"replay\"");
        return 1;
    }
    if (!cJSON_IsString(f) || !f->valuestring[0] || strlen(f->valuestring) >= sizeof sp->replay)
        return pg_err_set(PG_EINVAL, "--speculative-config: \"replay\" must be a file path");
    if (r && !(cJSON_IsNumber(r) && r->valuedouble >= 0 && r->valuedouble <= 1))
        return pg_err_set(PG_EINVAL, "--speculative-config: replay_error_rate must be a number in [0, 1]");
    if (seed && !(cJSON_IsNumber(seed) && seed->valuedouble >= 0 && seed->valuedouble <= 9007199254740992.0 &&
                  seed->valuedouble == floor(seed->valuedouble)))
        return pg_err_set(PG_EINVAL, "--speculative-config: replay_seed must be a non-negative integer");
    snprintf(sp->replay, sizeof sp->replay, "%s", f->valuestring);
    sp->replay_error_rate = r ? r->valuedouble : 0;
    sp->replay_seed = seed ? (uint64_t)seed->valuedouble : 0;
    return 1;
}

// --speculative-config's method "draft_model": model (a path) and
// num_speculative_tokens required, disable_by_batch_size; other keys refused.
static int spec_draft_config(pg_spec_options *sp, const cJSON *o) {
    static const char *const keys[] = {"method", "model", "num_speculative_tokens", "disable_by_batch_size",
                                       "replay", "replay_error_rate", "replay_seed"};
    for (const cJSON *it = o->child; it; it = it->next) {
        bool known = false;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) known |= !strcmp(it->string, keys[k]);
        if (!known) return pg_err_set(PG_EINVAL, "--speculative-config: unknown key \"%s\" for method draft_model", it->string);
    }
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (!cJSON_IsString(m) || !m->valuestring[0] || strlen(m->valuestring) >= sizeof sp->draft_model)
        return pg_err_set(PG_EINVAL, "--speculative-config: method draft_model needs \"model\": the draft's path");
    int32_t k = 0, backoff = 0;
    int rc = spec_int(o, "num_speculative_tokens", 1, PG_MAX_DRAFT, &k);
    if (rc == 0)
        return pg_err_set(PG_EINVAL, "--speculative-config: num_speculative_tokens (1 .. %d) is required", PG_MAX_DRAFT);
    if (rc < 0 || (rc = spec_int(o, "disable_by_batch_size", 1, 65536, &backoff)) < 0) return rc;
    *sp = (pg_spec_options){.draft = true, .draft_k = k, .max_running_seqs = backoff};
    snprintf(sp->draft_model, sizeof sp->draft_model, "%s", m->valuestring);
    return spec_replay_config(sp, o);
}

// --speculative-config (vLLM's JSON): method "ngram" with
// num_speculative_tokens (required), prompt_lookup_min / _max (vLLM's
// defaults: 5 and 5 when both are absent, one for the other when one is)
// and disable_by_batch_size; method "draft_model" (spec_draft_config);
// every other method or key is refused.
static int spec_config(pg_spec_options *sp, const char *json) {
    static const char *const keys[] = {"method", "num_speculative_tokens", "prompt_lookup_min",
                                       "prompt_lookup_max", "disable_by_batch_size"};
    cJSON *o = cJSON_Parse(json);
    int rc = 0;
    const cJSON *m = o ? cJSON_GetObjectItemCaseSensitive(o, "method") : NULL;
    pg_ngram_config nc = {0, 0, 0};
    int32_t backoff = 0;
    if (!cJSON_IsObject(o)) {
        rc = pg_err_set(PG_EINVAL, "--speculative-config: not a JSON object: %s", json);
    } else if (!cJSON_IsString(m)) {
        rc = pg_err_set(PG_EINVAL, "--speculative-config: \"method\" (a string, \"ngram\" or \"draft_model\") is required");
    } else if (!strcmp(m->valuestring, "draft_model")) {
        rc = spec_draft_config(sp, o);
        cJSON_Delete(o);
        return rc;
    } else if (!strcmp(m->valuestring, "eagle") || !strcmp(m->valuestring, "eagle3") ||
               !strcmp(m->valuestring, "medusa") || !strcmp(m->valuestring, "mtp")) {
        rc = pg_err_set(PG_EINVAL,
                        "--speculative-config: method \"%s\" is not supported yet (\"ngram\", \"draft_model\")",
                        m->valuestring);
    } else if (strcmp(m->valuestring, "ngram")) {
        rc = pg_err_set(PG_EINVAL, "--speculative-config: unknown method \"%s\" (\"ngram\", \"draft_model\")",
                        m->valuestring);
    }
    for (const cJSON *it = o && !rc ? o->child : NULL; it && !rc; it = it->next) {
        bool known = false;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) known |= !strcmp(it->string, keys[k]);
        if (!known) rc = pg_err_set(PG_EINVAL, "--speculative-config: unknown key \"%s\" for method ngram", it->string);
    }
    int got_min = 0, got_max = 0;
    if (rc == 0 && (rc = spec_int(o, "num_speculative_tokens", 1, PG_MAX_DRAFT, &nc.k)) == 0)
        rc = pg_err_set(PG_EINVAL, "--speculative-config: num_speculative_tokens (1 .. %d) is required", PG_MAX_DRAFT);
    if (rc >= 0) rc = got_min = spec_int(o, "prompt_lookup_min", 1, PG_NGRAM_MAX_N, &nc.min_n);
    if (rc >= 0) rc = got_max = spec_int(o, "prompt_lookup_max", 1, PG_NGRAM_MAX_N, &nc.max_n);
    if (rc >= 0) rc = spec_int(o, "disable_by_batch_size", 1, 65536, &backoff);
    if (rc >= 0) {
        if (!got_min && !got_max) nc.min_n = nc.max_n = 5;
        else if (!got_min) nc.min_n = nc.max_n;
        else if (!got_max) nc.max_n = nc.min_n;
        rc = pg_ngram_config_check(&nc) < 0 ? pg_err_wrap(PG_EINVAL, "--speculative-config: ") : 0;
    }
    cJSON_Delete(o);
    if (rc < 0) return rc;
    *sp = (pg_spec_options){.ngram = true, .ngram_cfg = nc, .max_running_seqs = backoff};
    return 1;
}

int pg_engine_option(pg_engine_config *c, int argc, char **argv, int *i) {
    const char *f = argv[*i];
    bool has_value = *i + 1 < argc;
    const char *v = has_value ? argv[*i + 1] : NULL;
    int64_t n;
#define NEED_VALUE()                                                                   \
    do {                                                                               \
        if (!has_value) return pg_err_set(PG_EINVAL, "%s needs a value", f);           \
        (*i)++;                                                                        \
    } while (0)
#define INT_FLAG(name, lo, hi, dst)                                                    \
    if (!strcmp(f, name)) {                                                            \
        NEED_VALUE();                                                                  \
        if (pg_parse_int(v, lo, hi, &n) < 0) return pg_err_wrap(PG_EINVAL, "%s: ", f); \
        dst = (int32_t)n;                                                              \
        return 1;                                                                      \
    }
    if (!strcmp(f, "--model")) {
        NEED_VALUE();
        c->model_path = v;
        return 1;
    }
    if (!strcmp(f, "--device")) {
        NEED_VALUE();
        if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto"))
            return pg_err_set(PG_EINVAL, "--device must be cpu, cuda or auto");
        c->device = v;
        return 1;
    }
    if (!strcmp(f, "--matmul-mode")) {
        NEED_VALUE();
        if (pg_matmul_mode_parse(v, &c->matmul_mode) < 0) return pg_err_wrap(PG_EINVAL, "%s: ", f);
        return 1;
    }
    if (!strcmp(f, "--chat-template")) {
        NEED_VALUE();
        c->chat_template = v;
        return 1;
    }
    if (!strcmp(f, "--tokenizer")) {
        NEED_VALUE();
        c->tokenizer = v;
        return 1;
    }
    if (!strcmp(f, "--hf-config")) {
        NEED_VALUE();
        c->hf_config = v;
        return 1;
    }
    if (!strcmp(f, "--load-format")) {
        NEED_VALUE();
        if (strcmp(v, "auto") && strcmp(v, "dummy"))
            return pg_err_set(PG_EINVAL, "--load-format must be auto or dummy");
        c->load_format = v;
        return 1;
    }
    if (!strcmp(f, "--cuda-graphs")) {
        NEED_VALUE();
        pg_graph_mode m;
        if (pg_graph_mode_parse(v, &m) < 0) return pg_err_set(PG_EINVAL, "--cuda-graphs must be on, off or lazy");
        c->cuda_graphs = v;
        return 1;
    }
    if (!strcmp(f, "--tensor-parallel-size") || !strcmp(f, "-tp")) {
        NEED_VALUE();
        if (pg_parse_int(v, 1, 64, &n) < 0) return pg_err_wrap(PG_EINVAL, "%s: ", f);
        c->tensor_parallel = (int32_t)n;
        return 1;
    }
    if (!strcmp(f, "--enable-expert-parallel")) {
        c->expert_parallel = true;
        return 1;
    }
    if (!strcmp(f, "--all2all-backend")) {
        NEED_VALUE();
        if (strcmp(v, "allreduce") && strcmp(v, "alltoall"))
            return pg_err_set(PG_EINVAL, "%s: '%s' (allreduce or alltoall)", f, v);
        c->moe_alltoall = !strcmp(v, "alltoall");
        return 1;
    }
    INT_FLAG("--nnodes", 1, 64, c->nnodes)
    INT_FLAG("--node-rank", 0, 63, c->node_rank)
    INT_FLAG("--master-port", 1, 65534, c->master_port)
    if (!strcmp(f, "--tp-timeout")) {
        NEED_VALUE();
        double s;
        if (pg_parse_float(v, 0.001, 2e6, &s) < 0) return pg_err_wrap(PG_EINVAL, "%s: ", f);
        c->tp_timeout_ms = (int32_t)(s * 1000 + 0.5);
        return 1;
    }
    if (!strcmp(f, "--master-addr")) {
        NEED_VALUE();
        c->master_addr = v;
        return 1;
    }
    if (!strcmp(f, "--tp-comm")) {
        NEED_VALUE();
        if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "nccl"))
            return pg_err_set(PG_EINVAL, "--tp-comm must be auto, cpu or nccl");
        c->tp_comm = v;
        return 1;
    }
    if (!strcmp(f, "--async-scheduling")) {
        NEED_VALUE();
        if (strcmp(v, "auto") && strcmp(v, "on") && strcmp(v, "off"))
            return pg_err_set(PG_EINVAL, "--async-scheduling must be auto, on or off");
        c->async_scheduling = v;
        return 1;
    }
    if (!strcmp(f, "--quantization") || !strcmp(f, "-q")) {
        NEED_VALUE();
        int q;
        PG_TRY(pg_quantization_parse(v, &q));
        c->quantization = q;
        return 1;
    }
    if (!strcmp(f, "--kv-cache-dtype")) {
        NEED_VALUE();
        static const char *const kv_types[] = {"auto", "f32", "f16", "bf16", "q8_0", "fp8", "fp8_e4m3_scaled"};
        bool known = false;
        for (size_t t = 0; t < sizeof kv_types / sizeof kv_types[0]; t++) known |= !strcmp(v, kv_types[t]);
        if (!known) return pg_err_set(PG_EINVAL, "--kv-cache-dtype must be auto, f32, f16, bf16, q8_0, fp8 or fp8_e4m3_scaled");
        c->kv_cache_dtype = v;
        return 1;
    }
    if (!strcmp(f, "--kv-cache-scales")) {
        NEED_VALUE();
        return pg_kv_scales_parse(v, &c->kv_cache_scales) < 0 ? PG_EINVAL : 1;
    }
    if (!strcmp(f, "--cpu-offload-gb")) {
        NEED_VALUE();
        double g;
        if (pg_parse_float(v, 0.0, 1 << 20, &g) < 0) return pg_err_wrap(PG_EINVAL, "%s: ", f);
        c->cpu_offload_bytes = (int64_t)(g * (double)(1 << 30));
        return 1;
    }
    if (!strcmp(f, "--gpu-memory-utilization")) {
        NEED_VALUE();
        double u;
        if (pg_parse_float(v, 0.01, 1.0, &u) < 0) return pg_err_wrap(PG_EINVAL, "%s: ", f);
        c->gpu_memory_utilization = u;
        return 1;
    }
    INT_FLAG("--threads", 0, 1024, c->n_threads)
    INT_FLAG("--kv-blocks", 2, INT32_MAX, c->kv_blocks)
    INT_FLAG("--block-size", 1, 1024, c->sched.block_size)
    INT_FLAG("--max-model-len", 1, INT32_MAX, c->max_model_len)
    INT_FLAG("--max-num-seqs", 1, 65536, c->sched.max_num_seqs)
    if (!strcmp(f, "--max-num-batched-tokens")) c->batched_tokens_set = true;
    INT_FLAG("--max-num-batched-tokens", 1, INT32_MAX, c->sched.max_num_batched_tokens)
    INT_FLAG("--max-waiting", 0, INT32_MAX, c->sched.max_waiting)
    INT_FLAG("--long-prefill-token-threshold", 0, INT32_MAX, c->sched.long_prefill_token_threshold)
    if (!strcmp(f, "--kv-cache-memory") || !strcmp(f, "--swap-space")) {
        NEED_VALUE();
        int64_t b;
        if (pg_parse_bytes(v, &b) < 0) return pg_err_wrap(PG_EINVAL, "%s: ", f);
        if (!strcmp(f, "--kv-cache-memory"))
            c->kv_cache_bytes = b;
        else
            c->swap_bytes = b;
        return 1;
    }
    if (!strcmp(f, "--preemption-mode")) {
        NEED_VALUE();
        if (!strcmp(v, "recompute"))
            c->sched.preemption_mode = SCHED_PREEMPT_RECOMPUTE;
        else if (!strcmp(v, "swap"))
            c->sched.preemption_mode = SCHED_PREEMPT_SWAP;
        else
            return pg_err_set(PG_EINVAL, "--preemption-mode must be recompute or swap");
        return 1;
    }
    if (!strcmp(f, "--scheduling-policy")) {
        NEED_VALUE();
        if (!strcmp(v, "fcfs"))
            c->sched.policy = SCHED_POLICY_FCFS;
        else if (!strcmp(v, "priority"))
            c->sched.policy = SCHED_POLICY_PRIORITY;
        else
            return pg_err_set(PG_EINVAL, "--scheduling-policy must be fcfs or priority");
        return 1;
    }
    if (!strcmp(f, "--no-host-kv-cache")) {
        c->no_host_kv_cache = true;
        return 1;
    }
    if (!strcmp(f, "--host-kv-offload")) {
        NEED_VALUE();
        if (strcmp(v, "all") && strcmp(v, "reused"))
            return pg_err_set(PG_EINVAL, "--host-kv-offload must be all or reused");
        c->host_kv_reused_only = !strcmp(v, "reused");
        return 1;
    }
    if (!strcmp(f, "--disable-hybrid-kv-cache-manager")) {
        c->disable_kv_layer_groups = true;
        return 1;
    }
    if (!strcmp(f, "--no-prefix-caching")) {
        c->sched.enable_prefix_caching = false;
        return 1;
    }
    if (!strcmp(f, "--enable-prefix-caching")) {
        c->sched.enable_prefix_caching = true;
        return 1;
    }
    if (!strcmp(f, "--enable-lora")) {
        c->enable_lora = true;
        return 1;
    }
    if (!strcmp(f, "--allow-runtime-lora-updating")) {
        c->allow_runtime_lora_updating = true;
        return 1;
    }
    INT_FLAG("--max-loras", 1, PG_MAX_LORA_MODULES, c->max_loras)
    INT_FLAG("--max-cpu-loras", 1, PG_MAX_LORA_MODULES, c->max_cpu_loras)
    INT_FLAG("--max-lora-rank", 1, 1024, c->max_lora_rank)
    if (!strcmp(f, "--lora-modules")) {
        // vLLM's form: one or more NAME=PATH after the flag (and the flag
        // may come again).
        if (!has_value || v[0] == '-') return pg_err_set(PG_EINVAL, "%s needs NAME=PATH", f);
        while (*i + 1 < argc && argv[*i + 1][0] != '-') {
            char *kv = argv[++*i], *eq = strchr(kv, '=');
            if (!eq || eq == kv || !eq[1])
                return pg_err_set(PG_EINVAL, "--lora-modules: '%s' is not NAME=PATH", kv);
            if (c->n_lora == PG_MAX_LORA_MODULES)
                return pg_err_set(PG_EINVAL, "--lora-modules: more than %d adapters", PG_MAX_LORA_MODULES);
            *eq = 0; // split in place: the config points into argv, which outlives it
            c->lora_names[c->n_lora] = kv;
            c->lora_paths[c->n_lora++] = eq + 1;
        }
        return 1;
    }
    if (!strcmp(f, "--speculative-config")) {
        NEED_VALUE();
        return spec_config(&c->spec, v);
    }
    if (!strcmp(f, "--no-chunked-prefill")) {
        c->sched.enable_chunked_prefill = false;
        return 1;
    }
#undef INT_FLAG
#undef NEED_VALUE
    return 0;
}
