// server/cmd_plan.c - `paged plan`: what fits in memory, and what would,
// before anything is loaded. Takes the model, device and limit flags of
// `paged serve`, reads only the config or the file's headers, and prints
// per rank the weights, KV cache, workspace (and on CUDA graphs, context,
// free), the KV tokens and how many sequences of --plan-seq-len fit; when
// it does not fit, the flags that would make it (engine/memplan.h,
// docs/memory_planning.md).
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/parse.h"
#include "engine/memplan.h"
#include "server/engine_options.h"
#include "server/cli_flags.h"
#include "server/commands.h"

static const char *usage =
    "usage: paged plan [options]\n"
    "Says, before loading, what start-up would allocate per device (weights, KV cache,\n"
    "workspace, CUDA graphs, free), how many KV tokens and concurrent sequences fit,\n"
    "and when it does not fit, which flags would make it fit. Reads only the config\n"
    "or the headers of the model file, never the weights. Exit 0 when it fits, 1 when\n"
    "it does not, 2 for a bad flag.\n"
    "Plan options:\n"
    "  --plan-seq-len N              count concurrent sequences of N tokens (default:\n"
    "                                the max model length)\n"
    "  --json                        one JSON document instead of text\n"
    "  --device-memory BYTES         plan for a GPU of this size (e.g. 141G for an H200)\n"
    "                                instead of this machine's (implies --device cuda)\n";

static int fail2(const char *msg) {
    fprintf(stderr, "paged plan: %s (see --help)\n", msg);
    return 2;
}

int cmd_plan(int argc, char **argv) {
    pg_memplan_in in;
    memset(&in, 0, sizeof in);
    pg_engine_config_default(&in.cfg);
    in.cfg.model_path = cli_default_model();
    in.device_other = -1;
    bool json = false;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("%s%s", usage, pg_engine_options_help);
            return 0;
        }
        if (!strcmp(f, "--json")) {
            json = true;
            continue;
        }
        if (!strcmp(f, "--plan-seq-len") || !strcmp(f, "--device-memory")) {
            if (i + 1 >= argc) {
                pg_err_set(PG_EINVAL, "%s needs a value", f);
                return fail2(pg_err_msg());
            }
            const char *v = argv[++i];
            int64_t n;
            int rc = !strcmp(f, "--plan-seq-len") ? pg_parse_int(v, 1, INT32_MAX, &n) : pg_parse_bytes(v, &n);
            if (rc == 0 && n <= 0) rc = pg_err_set(PG_EINVAL, "must be positive");
            if (rc < 0) {
                pg_err_wrap(PG_EINVAL, "%s: ", f);
                return fail2(pg_err_msg());
            }
            if (!strcmp(f, "--plan-seq-len"))
                in.plan_seq_len = (int32_t)n;
            else
                in.device_total = n;
            continue;
        }
        int r = pg_engine_option(&in.cfg, argc, argv, &i);
        if (r == 0) r = pg_err_set(PG_EINVAL, "unknown flag: %s", f);
        if (r < 0) return fail2(pg_err_msg());
    }
    // The device: --device-memory plans a GPU that need not be here.
    const char *dev = pg_engine_config_device(&in.cfg);
    if (in.device_total > 0) {
        if (!strcmp(dev, "cpu")) return fail2("--device-memory is the size of a GPU: it needs --device cuda (or auto)");
        in.cuda = true;
    } else if (!strcmp(dev, "cuda") || !strcmp(dev, "auto")) {
        // This machine's GPU: its size, and what is in use on it now in
        // place of the estimate. auto without one plans the CPU, as serve runs.
        int64_t total = 0, in_use = 0;
        if (pg_memplan_local_gpu(&total, &in_use) == 0) {
            in.cuda = true;
            in.device_total = total;
            in.device_other = in_use;
        } else if (!strcmp(dev, "cuda")) {
            fprintf(stderr, "paged plan: --device cuda, but %s: pass --device-memory BYTES (e.g. 141G for an "
                            "H200) to plan for one\n", pg_err_msg());
            return 2;
        }
    }
    pg_memplan *p = malloc(sizeof *p);
    pg_memplan_advice *adv = malloc(sizeof *adv * PG_MEMPLAN_MAX_ADVICE);
    if (!p || !adv) {
        free(p), free(adv);
        fprintf(stderr, "paged plan: out of memory\n");
        return 1;
    }
    int rc = pg_memplan_compute(&in, p);
    if (rc < 0) {
        fprintf(stderr, "paged plan: %s\n", pg_err_msg());
        free(p), free(adv);
        return rc == PG_EINVAL || rc == PG_EUNSUPP ? 2 : 1;
    }
    const int n_adv = p->fits ? 0 : pg_memplan_advise(&in, adv, PG_MEMPLAN_MAX_ADVICE);
    char *s = json ? pg_memplan_json(p, adv, n_adv) : pg_memplan_text(p, adv, n_adv);
    fputs(s, stdout);
    free(s);
    const int code = p->fits ? 0 : 1;
    free(p), free(adv);
    return code;
}
