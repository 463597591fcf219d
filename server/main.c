// server/main.c - the paged binary: `paged serve`, `generate`, `plan`, `render-template`.
#include <stdio.h>
#include <string.h>

#include "server/commands.h"

#ifndef PAGED_VERSION
#define PAGED_VERSION "0.1.0"
#endif

static const char *usage =
    "paged " PAGED_VERSION " - an LLM inference server\n"
    "usage: paged <command> [options]\n"
    "  serve      run the OpenAI-compatible HTTP server\n"
    "  generate   generate text from the command line\n"
    "  plan       say what fits in memory (and what would) before loading\n"
    "  render-template  render a Jinja chat template with a JSON context\n"
    "  version    print the version\n"
    "Run `paged <command> --help` for the options of a command.\n";

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 2, argv + 2);
    if (!strcmp(argv[1], "plan")) return cmd_plan(argc - 2, argv + 2);
    if (!strcmp(argv[1], "render-template")) return cmd_render_template(argc - 2, argv + 2);
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        puts("paged " PAGED_VERSION);
        return 0;
    }
    fprintf(stderr, "paged: unknown command '%s'\n%s", argv[1], usage);
    return 2;
}
