// text/template/chat_template.h - turning chat messages into a prompt.
//
// The model's own Jinja template (GGUF tokenizer.chat_template,
// tokenizer_config.json chat_template, chat_template.jinja, or
// --chat-template FILE) is rendered by text/template/jinja.h with the variables
// Hugging Face's apply_chat_template passes: messages, tools,
// add_generation_prompt, bos_token, eos_token and the request's
// chat_template_kwargs. Four families are also rendered natively, as
// fallbacks for a model with no template or one the Jinja engine cannot
// parse, and by name (--chat-template chatml|llama3|llama2|mistral): ChatML
// (SmolLM2, Qwen), Llama-3, Llama-2 and Mistral [INST].
#pragma once
#include <cjson/cJSON.h>
#include <stdbool.h>

typedef enum {
    PG_CHAT_CHATML = 0,
    PG_CHAT_LLAMA3 = 1,
    PG_CHAT_LLAMA2 = 2,   // [INST] with <<SYS>> blocks
    PG_CHAT_MISTRAL = 3,  // [INST] without system blocks (system folded into the first user turn)
    PG_CHAT_JINJA = 4,    // the model's Jinja template
} pg_chat_family;

typedef struct {
    const char *role;     // "system", "user", "assistant"
    const char *content;
} pg_chat_msg;

typedef struct pg_chat_template pg_chat_template;
typedef struct pg_tokenizer pg_tokenizer;

// Finds and loads the chat template (text/template/chat_template_load.c): `want`
// is --chat-template (a family name, a file or Jinja text; NULL = the
// model's own), `model_src` the model's GGUF file or directory (NULL: a
// dummy model). bos/eos text comes from `tok` (may be NULL). *out stays
// NULL when the model has none, or (with a warning) when its own template
// is unusable; an unusable --chat-template is an error.
int pg_chat_template_load(const char *want, const char *model_src, const pg_tokenizer *tok,
                          pg_chat_template **out);

// Recognises the native family of `text` (a Jinja template, or a family
// name: "chatml", "llama3", "llama2", "mistral"). PG_EUNSUPP when the
// family is unknown.
int pg_chat_template_parse(const char *text, pg_chat_template **out);

// A template to render: a family name gives that native family; other
// text is parsed as Jinja, and when that fails the native family the text
// belongs to is used instead (with a warning naming the Jinja error). Fails
// (PG_EINVAL, the Jinja error) only when neither works.
int pg_chat_template_create(const char *text, pg_chat_template **out);

// The text of bos_token and eos_token for Jinja templates (copied; NULL = "").
void pg_chat_template_set_tokens(pg_chat_template *t, const char *bos, const char *eos);

// The Jinja source (NULL for a native family): server/tool_calls.c reads
// the model's tool-call format from it.
const char *pg_chat_template_source(const pg_chat_template *t);

// Whether the rendered prompt carries its own BOS text (Jinja templates do,
// as in vLLM, which tokenizes chat prompts without adding special tokens);
// native families leave BOS to the tokenizer's add_bos setting.
bool pg_chat_template_renders_bos(const pg_chat_template *t);

typedef struct pg_chat_render_opts {
    const cJSON *tools;          // the request's tools (array) or NULL: `tools` is none
    const cJSON *kwargs;         // chat_template_kwargs (object) or NULL: extra variables
    bool add_generation_prompt;
} pg_chat_render_opts;

// Renders `messages` (a JSON array of OpenAI message objects: role, content
// as a string, tool_calls with arguments, tool_call_id, name) into a
// malloc'd prompt (caller frees). PG_EINVAL with the reason when the
// template refuses the conversation (its raise_exception text), fails, or
// (native families) meets a role or tool call it cannot render.
int pg_chat_template_render(const pg_chat_template *t, const cJSON *messages,
                            const pg_chat_render_opts *o, char **out);
void pg_chat_template_free(pg_chat_template *t);
pg_chat_family pg_chat_template_family(const pg_chat_template *t);
const char *pg_chat_family_name(pg_chat_family f);

// Renders role/content messages into a malloc'd prompt string (caller
// frees), ending with the assistant header when `add_generation_prompt`.
// Native families leave out BOS (see pg_chat_template_renders_bos).
// PG_EINVAL (message set) for an unknown role or a misplaced system message.
int pg_chat_template_apply(const pg_chat_template *t, const pg_chat_msg *msgs, int n,
                           bool add_generation_prompt, char **out);
