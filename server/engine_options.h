// server/engine_options.h - the engine's command-line options.
//
// Every subcommand that starts an engine (serve, generate, plan) accepts
// the same flags. Their names, help text and parsing into a
// pg_engine_config live with the rest of the CLI, in server/; the values'
// meaning (defaults, devices, the KV cache) is the engine's.
#pragma once
#include "engine/engine.h"

// If argv[*i] is an engine option, consumes it (and its value), updates `c`
// and returns 1; 0 when it is not an engine option; negative (message set)
// for a bad value.
int pg_engine_option(pg_engine_config *c, int argc, char **argv, int *i);

// The help text of the engine options.
extern const char *pg_engine_options_help;
