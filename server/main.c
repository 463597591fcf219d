// server/main.c - CLI entry point (placeholder until the CLI lands).
#include <stdio.h>
int main(void) { puts("paged"); return 0; }
