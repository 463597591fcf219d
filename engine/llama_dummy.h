// engine/llama_dummy.h - a model shape without weights (`--load-format
// dummy`), and a synthetic tokenizer for it.
//
// The CUDA runner generates the weights on the device (a seeded normal,
// norms 1.0), so a shape such as llama3-8b-shape runs without a checkpoint.
#pragma once
#include "engine/llama.h"
#include "engine/tokenizer.h"

// A pg_llama whose config comes from a Hugging Face config.json (a file, or
// a directory holding one) and whose weights are described (bf16 shapes,
// weight_bytes) but have no data. Only a runner that makes its own weights
// (pg_cuda_runner with dummy_weights) can run it.
int pg_llama_dummy(const char *hf_config, pg_llama **out);

// A byte-level tokenizer covering `vocab` ids: ids 0..255 are the 256 bytes
// (GPT-2's byte-to-unicode alphabet, no merges), ids 256.. decode to the
// text "<tN>" and are never produced by encoding. Honest about what it is:
// text round-trips byte by byte; a dummy model's output ids print as <tN>.
int pg_tokenizer_synthetic_bytes(int32_t vocab, pg_tokenizer **out);
