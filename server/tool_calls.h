// server/tool_calls.h - OpenAI tool calling on /v1/chat/completions.
//
// Request side: `tools`, `tool_choice` and `parallel_tool_calls` are
// validated into an api_tools; for tool_choice "required" or a named
// function a JSON schema is built as vLLM builds it, for the structured-
// output engine to constrain the output (api_params.guided_json).
//
// Response side: the model's text is split into content and tool calls in
// the format of its chat template: Hermes/Qwen (<tool_call>{...}</tool_call>),
// Llama 3.1+ ({"name": ..., "parameters": ...}, optionally after
// <|python_tag|>), Mistral ([TOOL_CALLS] [{...}] or [TOOL_CALLS]name[ARGS]{...}),
// or, with a constraint, the constrained JSON itself. One incremental
// parser serves streamed and whole responses, so both agree: content is
// passed through until a tool call starts (holding back text that may be
// the start of a marker), then each call yields its name (with a new id)
// first and its arguments as they arrive.
#pragma once
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/sbuf.h"

struct api_error;

typedef enum { TC_CHOICE_NONE, TC_CHOICE_AUTO, TC_CHOICE_REQUIRED, TC_CHOICE_NAMED } tc_choice;

typedef enum {
    TC_FMT_HERMES,    // <tool_call>{"name", "arguments"}</tool_call> (Hermes, Qwen, ChatML models)
    TC_FMT_LLAMA3,    // {"name", "parameters"} / <|python_tag|>
    TC_FMT_MISTRAL,   // [TOOL_CALLS]
    TC_FMT_REQUIRED,  // constrained: [{"name", "parameters"}, ...]
    TC_FMT_NAMED,     // constrained: the arguments object of tool_choice's function
} tc_format;

typedef struct tc_stream tc_stream;

typedef struct api_tools {
    cJSON *tools;           // owned: the request's tools, validated (passed to the template)
    tc_choice choice;
    char *named;            // TC_CHOICE_NAMED: the function's name (owned)
    bool parallel;          // parallel_tool_calls (default true)
    tc_format format;       // set by tools_set_format
    tc_stream **streams;    // per choice index, created on first use (owned)
    int n_streams;
} api_tools;

// Reads tools, tool_choice and parallel_tool_calls from a chat request
// body. *out stays NULL when there are no tools (an empty list, or none
// with tool_choice none/auto). 400 (fills e, returns -1) for a malformed
// tool, a duplicate name, an unknown named function, or tool_choice
// required/named without tools.
int api_parse_tools(const cJSON *body, api_tools **out, struct api_error *e);
void api_tools_free(api_tools *t);  // NULL is a no-op

// The JSON schema (malloc'd text) that constrains the output for
// tool_choice required (an array of {"name": enum, "parameters": schema},
// one item at most when parallel_tool_calls is false) or named (the
// function's parameters); NULL for none/auto.
char *tools_guided_json(const api_tools *t);

// The format the model writes tool calls in, from its chat template text
// (NULL: a native family): required/named use the constrained formats.
void tools_set_format(api_tools *t, const char *template_source);
// Whether the detokenizer must keep special tokens for the format's
// markers ([TOOL_CALLS] and <|python_tag|> are special tokens).
bool tools_need_special_tokens(const api_tools *t);

// --- the parser ---------------------------------------------------------------------

// What one feed produced: content text to emit, and tool-call deltas.
typedef struct tc_delta_call {
    int index;              // the call's index in the choice's tool_calls
    char id[40];            // set ("" otherwise) in the call's first delta, with name
    char *name;             // owned; the first delta of a call only
    sbuf args;              // argument text to append
} tc_delta_call;

typedef struct tc_delta {
    sbuf content;
    tc_delta_call *calls;
    int n_calls, cap_calls;
} tc_delta;

void tc_delta_reset(tc_delta *d);
void tc_delta_free(tc_delta *d);

tc_stream *tc_stream_new(tc_format fmt, const char *named, bool parallel);
void tc_stream_free(tc_stream *s);
// Appends text[0..n) of the model's output; `final` at the end of the
// output (flushes held-back text). Results are appended to `out`.
void tc_stream_feed(tc_stream *s, const char *text, size_t n, bool final, tc_delta *out);
// How many tool calls were started so far.
int tc_stream_n_calls(const tc_stream *s);

// The stream of choice `index` of a request (created on first use).
tc_stream *tools_stream(api_tools *t, int index);

// A whole output parsed at once: content (NULL when empty and there are
// calls) and the calls as OpenAI's message.tool_calls array (NULL when
// none). Both owned by the caller.
void tools_parse_output(const api_tools *t, const char *text, char **content, cJSON **tool_calls);
