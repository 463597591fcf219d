// engine/model/model_source_int.h - where the loader finds stored tensors:
// a GGUF file, a Hugging Face safetensors directory, or random (dummy)
// weights. Private to engine/model/ (model_load.c and model_source.c).
#pragma once
#include <stdbool.h>

#include "engine/model/model.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

typedef enum { SRC_GGUF, SRC_HF, SRC_DUMMY } src_kind;

typedef struct {
    src_kind kind;
    const char *path;
    gguf_file *gguf;
    pg_st_model *st;
    const pg_model_config *cfg; // read from this source (ckpt_quant: an AWQ / GPTQ checkpoint)
} source;

// The stored tensor `name` as rows x cols (1 x n for a vector); false when
// the file has none. Dummy sources have every tensor, without data.
bool pg_model_src_find(const source *s, const char *name, pg_weight *w);

// Opens o's source and reads its config into *c (the GGUF header and tensor
// table, the safetensors headers, or the config.json of dummy weights; both
// files are mapped, so nothing past the headers is read), and checks
// --quantization against the checkpoint's own.
int pg_model_src_open(const pg_model_load_opts *o, source *s, pg_model_config *c);
void pg_model_src_close(source *s);

// A source's mapping as pg_model.source_close takes it (the model keeps the
// file mapped while it computes from it).
void pg_model_src_close_gguf(void *p);
void pg_model_src_close_st(void *p);
