// server/cli_flags.h - command-line flags shared by `generate` and `serve`.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

// Parses a size with an optional K/M/G/T suffix (powers of 1024).
int cli_parse_bytes(const char *s, int64_t *out);
int cli_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_parse_float(const char *s, double lo, double hi, double *out);

// If argv[*i] is an engine flag, consumes it (and its value), updates `c`
// and returns 1; 0 when it is not an engine flag; negative (message set)
// for a bad value.
int cli_engine_flag(pg_engine_config *c, int argc, char **argv, int *i);

// The help text of the engine flags.
extern const char *cli_engine_flags_help;

// The default model: $PAGED_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf
// next to the binary's build/ directory, else under the working directory.
const char *cli_default_model(void);
