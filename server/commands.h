// server/commands.h - the subcommands of the paged binary.
#pragma once

// Each takes the arguments after the subcommand name and returns the exit code.
int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_render_template(int argc, char **argv);
