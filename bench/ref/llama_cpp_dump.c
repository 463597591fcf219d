// bench/ref/llama_cpp_dump.c - runs llama.cpp (CPU, no flash attention, as
// tests/data/gen_logits_golden.py) on token ids given on the command line
// as one prompt batch and writes every contiguous f32 intermediate tensor
// to DIR/<name>.bin (a name seen twice keeps its last value, e.g. Qcur-0
// after RoPE). bench/ref/paged_dump.c compares ours against them, op by op.
// Not part of the build:
//
//   L=/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp
//   gcc -O2 -I$L/include -I$L/ggml/include bench/ref/llama_cpp_dump.c -L$L/build/bin
//       -lllama -lggml -lggml-base -Wl,-rpath,$L/build/bin -o /tmp/llama_cpp_dump
//   mkdir -p /tmp/dump && DUMP=/tmp/dump /tmp/llama_cpp_dump 504 3575 282 4649 314 2>/dev/null
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

static const char *dir;

static bool dump(struct ggml_tensor *t, bool ask, void *user) {
    if (ask) return true; // compute every node and show it to us
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.bin", dir, t->name);
    FILE *f = fopen(path, "wb");
    if (!f) return true;
    size_t n = (size_t)ggml_nelements(t);
    float *buf = malloc(n * sizeof(float));
    ggml_backend_tensor_get(t, buf, 0, n * sizeof(float));
    fwrite(buf, sizeof(float), n, f);
    fclose(f);
    free(buf);
    return true;
}

int main(int argc, char **argv) {
    dir = getenv("DUMP") ? getenv("DUMP") : "/tmp/dump";
    const char *model_path =
        getenv("MODEL") ? getenv("MODEL") : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int n = argc - 1;
    if (n < 1) {
        fprintf(stderr, "usage: DUMP=dir %s TOKEN_ID...\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model *model =
        llama_model_load_from_file(model_path, llama_model_default_params());
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = dump;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = atoi(argv[i + 1]);
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b)) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    return 0;
}
