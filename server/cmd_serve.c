// server/cmd_serve.c - `paged serve` (the HTTP server lands with the server issue).
#include <stdio.h>

#include "server/commands.h"

int cmd_serve(int argc, char **argv) {
    fprintf(stderr, "paged serve: the HTTP server is not built yet; use `paged generate`\n");
    return 2;
}
