// server/cli_flags.c - where the default model is.
#include "server/cli_flags.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/file.h"

const char *cli_default_model(void) {
    static char path[4096];
    const char *env = getenv("PAGED_MODEL");
    if (env && *env) return env;
    const char *rel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        // A binary replaced while running reads as "<path> (deleted)".
        char *del = strstr(exe, " (deleted)");
        if (del) *del = 0;
        // <root>/build/paged -> <root>/models/...
        char *dir = dirname(exe);
        snprintf(path, sizeof path, "%s/../%s", dir, rel);
        if (pg_file_exists(path)) return path;
    }
    return rel;
}
