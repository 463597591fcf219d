// text/template/jinja.h - a Jinja2 template engine for chat templates.
//
// Models ship their prompt format as a Jinja2 template (GGUF
// tokenizer.chat_template, tokenizer_config.json "chat_template",
// chat_template.jinja). This module parses such a template once and renders
// it with a JSON context (messages, tools, add_generation_prompt, ...), with
// the environment Hugging Face's apply_chat_template uses: trim_blocks and
// lstrip_blocks on, no autoescape, the loopcontrols extension, the
// {% generation %} tag, a tojson filter that is json.dumps(ensure_ascii=
// False, indent, separators, sort_keys), and the globals raise_exception,
// strftime_now, namespace, range and dict. docs/chat_templates.md lists what
// is covered and what is not.
//
// Rendering is bounded: a template can loop, recurse or grow its output only
// up to the limits in pg_jinja_limits, then it fails with a clear message,
// so a hostile template cannot hang or exhaust the server.
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct pg_jinja_template pg_jinja_template;

typedef struct pg_jinja_limits {
    size_t max_output;    // bytes of rendered text (default 8 MiB)
    size_t max_memory;    // bytes of values allocated while rendering (default 64 MiB)
    size_t max_steps;     // evaluated nodes and loop iterations (default 20 M)
    int max_depth;        // nested macro calls (default 64)
} pg_jinja_limits;

// The defaults above.
void pg_jinja_limits_default(pg_jinja_limits *l);

// Parses template source `src` (len bytes). On error returns PG_EINVAL with
// a message naming the line ("jinja line 12: unexpected 'endfor'").
int pg_jinja_parse(const char *src, size_t len, pg_jinja_template **out);
void pg_jinja_free(pg_jinja_template *t);  // NULL is a no-op

// Renders `t` with the variables of `ctx` (a JSON object; NULL = none) into
// a malloc'd NUL-terminated string (caller frees). `lim` NULL = defaults.
// On error (raise_exception, a type error, a limit) returns PG_EINVAL with
// the message; raise_exception's text is kept verbatim after
// "template error: ".
int pg_jinja_render(const pg_jinja_template *t, const cJSON *ctx, const pg_jinja_limits *lim,
                    char **out);
