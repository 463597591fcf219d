// server/cmd_generate.c - `paged generate`: prompts through the engine from
// the command line.
//
// A single --prompt streams its completion to stdout and prints timing to
// stderr. --prompts-file runs every prompt of a file concurrently through
// the scheduler and prints one JSON line per prompt, in input order.
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "common/parse.h"
#include "server/engine_options.h"
#include "server/cli_flags.h"
#include "server/commands.h"

static const char *usage =
    "usage: paged generate [--prompt TEXT | --prompts-file FILE] [options]\n"
    "Generation:\n"
    "  --prompt TEXT                 the prompt (streamed completion on stdout)\n"
    "  --prompts-file FILE           one prompt per line, or JSON lines with \"prompt\"\n"
    "                                (or \"prompt_ids\": token ids, as benchmarks send) and\n"
    "                                per-prompt sampling fields (\"model\": an adapter of\n"
    "                                --lora-modules); all run concurrently\n"
    "  --chat                        apply the model's chat template (a user message)\n"
    "  --system TEXT                 system message for --chat\n"
    "  --max-tokens N                tokens to generate (default 128)\n"
    "  --temperature T               0 = greedy (default 0.8)\n"
    "  --top-p P, --top-k K, --min-p P\n"
    "  --repetition-penalty R, --presence-penalty P, --frequency-penalty F\n"
    "  --seed S                      same seed, same text\n"
    "  --ignore-eos                  generate max-tokens whatever the model says\n"
    "  --record-ids                  --prompts-file: each result line also carries \"prompt_ids\"\n"
    "                                (the prompt as the engine saw it), making the output a\n"
    "                                replay draft's recording; \"output_ids\" are always there\n";

// --- waiting for events ---------------------------------------------------------

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;
} waiter;

static void on_events(void *ctx) {
    waiter *w = ctx;
    pthread_mutex_lock(&w->mu);
    w->pending = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static int wait_events(pg_engine *e, waiter *w, pg_gen_event *buf, int cap) {
    for (;;) {
        int n = pg_engine_poll(e, buf, cap);
        if (n > 0) return n;
        pthread_mutex_lock(&w->mu);
        while (!w->pending) pthread_cond_wait(&w->cv, &w->mu);
        w->pending = 0;
        pthread_mutex_unlock(&w->mu);
    }
}

// --- prompts ------------------------------------------------------------------------

typedef struct {
    char *text;              // prompt as given
    char *model;             // "model": the LoRA adapter served as this name (NULL: the base)
    pg_sampling_params sp;
    bool chat;
    int32_t *ids;
    int n_ids;
    // results
    int64_t id;
    char *out;
    size_t out_len, out_cap;
    int32_t *toks;           // the output token ids ("output_ids": the replay draft's input)
    int n_toks, toks_cap;
    pg_detok detok;
    const char *finish;
    sched_usage usage;
    bool done;
    char error[256];
} job;

static void append(job *j, const char *s, int n) {
    if (j->out_len + (size_t)n + 1 > j->out_cap) {
        j->out_cap = (j->out_len + (size_t)n + 1) * 2;
        j->out = pg_xrealloc(j->out, j->out_cap);
    }
    memcpy(j->out + j->out_len, s, (size_t)n);
    j->out_len += (size_t)n;
    j->out[j->out_len] = 0;
}

static void append_token(job *j, int32_t t) {
    if (j->n_toks == j->toks_cap) {
        j->toks_cap = j->toks_cap ? 2 * j->toks_cap : 64;
        j->toks = pg_xrealloc(j->toks, sizeof(int32_t) * (size_t)j->toks_cap);
    }
    j->toks[j->n_toks++] = t;
}

static cJSON *ids_array(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static int encode_job(pg_engine *e, job *j, const char *system) {
    if (j->ids) return 0; // "prompt_ids": already token ids
    const pg_tokenizer *tok = pg_engine_tokenizer(e);
    char *text = j->text;
    char *rendered = NULL;
    if (j->chat) {
        const pg_chat_template *ct = pg_engine_chat_template(e);
        if (!ct) return pg_err_set(PG_EUNSUPP, "the model has no chat template usable by paged; pass --chat-template");
        pg_chat_msg msgs[2];
        int n = 0;
        if (system) msgs[n++] = (pg_chat_msg){"system", system};
        msgs[n++] = (pg_chat_msg){"user", j->text};
        PG_TRY(pg_chat_template_apply(ct, msgs, n, true, &rendered));
        text = rendered;
    }
    // A Jinja chat template writes BOS itself.
    bool add_bos = pg_tokenizer_add_bos(tok) &&
                   !(j->chat && pg_chat_template_renders_bos(pg_engine_chat_template(e)));
    int n = pg_tokenizer_encode_alloc(tok, text, strlen(text), add_bos, true, &j->ids);
    free(rendered);
    if (n < 0) return n;
    if (n == 0) return pg_err_set(PG_EINVAL, "the prompt is empty");
    j->n_ids = n;
    return 0;
}

// JSON line: {"prompt": ..., "max_tokens": ..., "temperature": ..., ...}
static int parse_json_prompt(const char *line, job *j) {
    cJSON *o = cJSON_ParseWithLength(line, strlen(line));
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return pg_err_set(PG_EINVAL, "not a JSON object");
    }
    int rc = 0;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(o, "prompt_ids");
    const cJSON *it;
    if (cJSON_IsArray(pids)) {
        // Token ids as given (no BOS added, no template); ids outside the
        // vocabulary are rejected by the engine.
        int n = cJSON_GetArraySize(pids), k = 0;
        if (n <= 0) {
            rc = pg_err_set(PG_EINVAL, "\"prompt_ids\" is empty");
            goto out;
        }
        j->ids = pg_xmalloc(sizeof(int32_t) * (size_t)n);
        cJSON_ArrayForEach(it, pids) {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX ||
                it->valuedouble != (double)(int32_t)it->valuedouble) {
                rc = pg_err_set(PG_EINVAL, "\"prompt_ids\" must hold non-negative integers");
                goto out;
            }
            j->ids[k++] = (int32_t)it->valuedouble;
        }
        j->n_ids = n;
        char label[64];
        snprintf(label, sizeof label, "<%d token ids>", n);
        j->text = pg_xstrdup(cJSON_IsString(p) ? p->valuestring : label);
    } else if (!cJSON_IsString(p)) {
        rc = pg_err_set(PG_EINVAL, "\"prompt\" must be a string (or \"prompt_ids\" a list of token ids)");
        goto out;
    } else {
        j->text = pg_xstrdup(p->valuestring);
    }
#define NUM(key, dst)                                                         \
    if ((it = cJSON_GetObjectItemCaseSensitive(o, key)) && cJSON_IsNumber(it)) \
        dst = it->valuedouble;
    NUM("max_tokens", j->sp.max_tokens)
    NUM("min_tokens", j->sp.min_tokens)
    NUM("temperature", j->sp.temperature)
    NUM("top_p", j->sp.top_p)
    NUM("top_k", j->sp.top_k)
    NUM("min_p", j->sp.min_p)
    NUM("repetition_penalty", j->sp.repetition_penalty)
    NUM("presence_penalty", j->sp.presence_penalty)
    NUM("frequency_penalty", j->sp.frequency_penalty)
#undef NUM
    if ((it = cJSON_GetObjectItemCaseSensitive(o, "seed")) && cJSON_IsNumber(it)) {
        j->sp.seed = (uint64_t)it->valuedouble;
        j->sp.has_seed = true;
    }
    if ((it = cJSON_GetObjectItemCaseSensitive(o, "ignore_eos"))) j->sp.ignore_eos = cJSON_IsTrue(it);
    if ((it = cJSON_GetObjectItemCaseSensitive(o, "chat"))) j->chat = cJSON_IsTrue(it);
    if ((it = cJSON_GetObjectItemCaseSensitive(o, "model"))) {
        if (!cJSON_IsString(it) || !it->valuestring[0]) {
            rc = pg_err_set(PG_EINVAL, "\"model\" must name an adapter of --lora-modules");
            goto out;
        }
        j->model = pg_xstrdup(it->valuestring);
    }
out:
    cJSON_Delete(o);
    return rc;
}

static int read_prompts(const char *path, const job *proto, job **jobs, int *n_jobs) {
    char *text;
    size_t len;
    PG_TRY(pg_read_file(path, 256u << 20, &text, &len));
    int n = 0, cap = 16;
    job *js = pg_xcalloc((size_t)cap, sizeof(job));
    int rc = 0, line_no = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        line_no++;
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r') line[--l] = 0;
        if (!l) continue;
        if (n == cap) {
            js = pg_xrealloc(js, sizeof(job) * (size_t)(cap *= 2));
            memset(js + n, 0, sizeof(job) * (size_t)(cap - n));
        }
        js[n] = *proto;
        if (line[0] == '{') {
            if ((rc = parse_json_prompt(line, &js[n])) < 0) {
                pg_err_wrap(rc, "%s:%d: ", path, line_no);
                break;
            }
        } else {
            js[n].text = pg_xstrdup(line);
        }
        n++;
    }
    free(text);
    *jobs = js;
    *n_jobs = n;
    return rc;
}

// --- the command --------------------------------------------------------------------

static void print_json_result(const job *j, int index, bool record_ids) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddStringToObject(o, "prompt", j->text);
    if (j->error[0]) {
        cJSON_AddStringToObject(o, "error", j->error);
    } else {
        cJSON_AddStringToObject(o, "text", j->out ? j->out : "");
        cJSON_AddStringToObject(o, "finish_reason", j->finish);
        // The token ids too; with --record-ids the prompt's, so that a
        // greedy run's lines are the replay draft's file (engine/
        // draft_replay.h, matched by prompt ids). Not by default: a long
        // prompt's ids are most of a line (800 KB for 131,000 tokens).
        if (record_ids) cJSON_AddItemToObject(o, "prompt_ids", ids_array(j->ids, j->n_ids));
        cJSON_AddItemToObject(o, "output_ids", ids_array(j->toks, j->n_toks));
    }
    cJSON_AddNumberToObject(o, "prompt_tokens", j->n_ids);
    cJSON_AddNumberToObject(o, "completion_tokens", j->usage.completion_tokens);
    cJSON_AddNumberToObject(o, "cached_tokens", j->usage.cached_tokens);
    cJSON_AddNumberToObject(o, "preemptions", j->usage.n_preemptions);
    const sched_usage *u = &j->usage;
    if (u->first_token_ns)
        cJSON_AddNumberToObject(o, "ttft_ms", (double)(u->first_token_ns - u->arrival_ns) / 1e6);
    if (u->finish_ns) cJSON_AddNumberToObject(o, "total_ms", (double)(u->finish_ns - u->arrival_ns) / 1e6);
    if (u->finish_ns && u->first_token_ns && u->completion_tokens > 1)
        cJSON_AddNumberToObject(o, "tpot_ms", (double)(u->finish_ns - u->first_token_ns) / 1e6 /
                                                  (u->completion_tokens - 1));
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

// Speculative decoding's counters (the /metrics spec_decode ones), on
// stderr when anything was drafted: benchmarks and tests read the
// acceptance from this line.
static void print_spec_counts(pg_engine *e) {
    pg_engine_stats st;
    pg_engine_stats_get(e, &st);
    const sched_stats *s = &st.sched;
    if (s->n_spec_draft_tokens <= 0) return;
    fprintf(stderr, "[speculative decoding: %lld drafts, %lld draft tokens, %lld accepted (%.4f)]\n",
            (long long)s->n_spec_drafts, (long long)s->n_spec_draft_tokens, (long long)s->n_spec_accepted,
            (double)s->n_spec_accepted / (double)s->n_spec_draft_tokens);
}

int cmd_generate(int argc, char **argv) {
    pg_engine_config cfg;
    pg_engine_config_default(&cfg);
    cfg.model_path = cli_default_model();
    job proto;
    memset(&proto, 0, sizeof proto);
    pg_sampling_params_default(&proto.sp);
    proto.sp.max_tokens = 128;
    proto.sp.temperature = 0.8f;
    const char *prompt = NULL, *prompts_file = NULL, *system = NULL;
    bool record_ids = false;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        int r = pg_engine_option(&cfg, argc, argv, &i);
        if (r < 0) goto bad_flag;
        if (r > 0) continue;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        double d;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("%s%s", usage, pg_engine_options_help);
            return 0;
        } else if (!strcmp(f, "--chat")) {
            proto.chat = true;
        } else if (!strcmp(f, "--ignore-eos")) {
            proto.sp.ignore_eos = true;
        } else if (!strcmp(f, "--record-ids")) {
            record_ids = true;
        } else if (!v) {
            pg_err_set(PG_EINVAL, "unknown flag or missing value: %s", f);
            goto bad_flag;
        } else if (!strcmp(f, "--prompt")) {
            prompt = v, i++;
        } else if (!strcmp(f, "--prompts-file")) {
            prompts_file = v, i++;
        } else if (!strcmp(f, "--system")) {
            system = v, i++;
        } else if (!strcmp(f, "--max-tokens")) {
            if (pg_parse_int(v, 1, INT32_MAX, &n) < 0) goto bad_value;
            proto.sp.max_tokens = (int32_t)n, i++;
        } else if (!strcmp(f, "--top-k")) {
            if (pg_parse_int(v, -1, INT32_MAX, &n) < 0) goto bad_value;
            proto.sp.top_k = (int32_t)n, i++;
        } else if (!strcmp(f, "--seed")) {
            if (pg_parse_int(v, 0, INT64_MAX, &n) < 0) goto bad_value;
            proto.sp.seed = (uint64_t)n, proto.sp.has_seed = true, i++;
        } else if (!strcmp(f, "--temperature")) {
            if (pg_parse_float(v, 0, 100, &d) < 0) goto bad_value;
            proto.sp.temperature = (float)d, i++;
        } else if (!strcmp(f, "--top-p")) {
            if (pg_parse_float(v, 1e-9, 1, &d) < 0) goto bad_value;
            proto.sp.top_p = (float)d, i++;
        } else if (!strcmp(f, "--min-p")) {
            if (pg_parse_float(v, 0, 1, &d) < 0) goto bad_value;
            proto.sp.min_p = (float)d, i++;
        } else if (!strcmp(f, "--repetition-penalty")) {
            if (pg_parse_float(v, 1e-6, 100, &d) < 0) goto bad_value;
            proto.sp.repetition_penalty = (float)d, i++;
        } else if (!strcmp(f, "--presence-penalty")) {
            if (pg_parse_float(v, -2, 2, &d) < 0) goto bad_value;
            proto.sp.presence_penalty = (float)d, i++;
        } else if (!strcmp(f, "--frequency-penalty")) {
            if (pg_parse_float(v, -2, 2, &d) < 0) goto bad_value;
            proto.sp.frequency_penalty = (float)d, i++;
        } else {
            pg_err_set(PG_EINVAL, "unknown flag: %s", f);
            goto bad_flag;
        }
        continue;
    bad_value:
        pg_err_wrap(PG_EINVAL, "%s: ", f);
    bad_flag:
        fprintf(stderr, "paged generate: %s (see --help)\n", pg_err_msg());
        return 2;
    }
    if (!prompt == !prompts_file) {
        fprintf(stderr, "paged generate: give exactly one of --prompt or --prompts-file\n");
        return 2;
    }
    job *jobs = NULL;
    int n_jobs = 0;
    if (prompts_file) {
        if (read_prompts(prompts_file, &proto, &jobs, &n_jobs) < 0) {
            fprintf(stderr, "paged generate: %s\n", pg_err_msg());
            return 1;
        }
    } else {
        jobs = pg_xcalloc(1, sizeof(job));
        jobs[0] = proto;
        jobs[0].text = pg_xstrdup(prompt);
        n_jobs = 1;
    }

    waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    pg_engine *e;
    double t_load = pg_now_s();
    if (pg_engine_create(&cfg, on_events, &w, &e) < 0) {
        fprintf(stderr, "paged: %s\n", pg_err_msg());
        return 1;
    }
    t_load = pg_now_s() - t_load;
    const pg_tokenizer *tok = pg_engine_tokenizer(e);
    int rc = 0, remaining = 0;
    for (int i = 0; i < n_jobs; i++) {
        job *j = &jobs[i];
        j->id = -1;
        pg_detok_init(&j->detok, tok, true);
        if (encode_job(e, j, system) < 0) {
            snprintf(j->error, sizeof j->error, "%s", pg_err_msg());
            j->done = true;
            continue;
        }
        const int64_t lora = j->model ? pg_engine_lora_find(e, j->model) : 0;
        if (j->model && lora == 0) {
            snprintf(j->error, sizeof j->error, "no LoRA adapter is served as \"%s\" (--enable-lora --lora-modules)",
                     j->model);
            j->done = true;
            continue;
        }
        pg_gen_request req = {.prompt = j->ids, .n_prompt = j->n_ids, .sp = j->sp, .user = j, .lora_id = lora};
        j->id = pg_engine_submit(e, &req);
        remaining++;
    }
    bool stream = prompt != NULL;
    int max_piece = pg_tokenizer_max_token_bytes(tok) + 64;
    char *piece = pg_xmalloc((size_t)max_piece);
    pg_gen_event evs[64];
    while (remaining > 0) {
        int n = wait_events(e, &w, evs, 64);
        for (int k = 0; k < n; k++) {
            const pg_gen_event *ge = &evs[k];
            job *j = ge->user;
            if (!j) continue;
            if (ge->ev.has_token) {
                append_token(j, ge->ev.out.token);
                int m = pg_detok_feed(&j->detok, ge->ev.out.token, piece, max_piece);
                if (m > 0) {
                    append(j, piece, m);
                    if (stream) fwrite(piece, 1, (size_t)m, stdout), fflush(stdout);
                }
            }
            if (ge->ev.req_finished) {
                int m = pg_detok_flush(&j->detok, piece, max_piece);
                if (m > 0) {
                    append(j, piece, m);
                    if (stream) fwrite(piece, 1, (size_t)m, stdout);
                }
                j->finish = sched_finish_name(ge->ev.finish);
                if (!j->finish) j->finish = "none";
                j->usage = ge->ev.usage;
                if (ge->error_code < 0) snprintf(j->error, sizeof j->error, "%s", ge->error);
                j->done = true;
                remaining--;
            }
        }
    }
    free(piece);
    if (stream) {
        job *j = &jobs[0];
        printf("\n");
        fflush(stdout);
        if (j->error[0]) {
            fprintf(stderr, "paged generate: %s\n", j->error);
            rc = 1;
        } else {
            const sched_usage *u = &j->usage;
            double prefill_s = (double)(u->first_token_ns - u->first_scheduled_ns) * 1e-9;
            double decode_s = (double)(u->finish_ns - u->first_token_ns) * 1e-9;
            fprintf(stderr,
                    "[load %.2f s | prompt %d tokens in %.3f s: %.1f tok/s | generated %d tokens in "
                    "%.3f s: %.1f tok/s | finish: %s]\n",
                    t_load, j->n_ids, prefill_s, prefill_s > 0 ? j->n_ids / prefill_s : 0,
                    u->completion_tokens, decode_s,
                    decode_s > 0 && u->completion_tokens > 1 ? (u->completion_tokens - 1) / decode_s : 0,
                    j->finish);
        }
    } else {
        for (int i = 0; i < n_jobs; i++) {
            print_json_result(&jobs[i], i, record_ids);
            if (jobs[i].error[0]) rc = 1;
        }
    }
    print_spec_counts(e);
    pg_engine_destroy(e);
    for (int i = 0; i < n_jobs; i++) {
        free(jobs[i].toks);
        free(jobs[i].text);
        free(jobs[i].model);
        free(jobs[i].ids);
        free(jobs[i].out);
    }
    free(jobs);
    return rc;
}
