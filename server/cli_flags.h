// server/cli_flags.h - what the subcommands share besides the engine's
// options (server/engine_options.h) and the number parsers (common/parse.h).
#pragma once

// The default model: $PAGED_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf
// next to the binary's build/ directory, else under the working directory.
const char *cli_default_model(void);
