// engine/chat_template.h - turning chat messages into a prompt.
//
// paged does not run Jinja: it recognises the common template families from
// the template text shipped with the model (GGUF tokenizer.chat_template,
// tokenizer_config.json chat_template, or --chat-template FILE) and renders
// them natively. Supported: ChatML (SmolLM2, Qwen), Llama-3, Llama-2 and
// Mistral [INST]. Anything else is a clear error naming the families.
#pragma once
#include <stdbool.h>

typedef enum {
    PG_CHAT_CHATML = 0,
    PG_CHAT_LLAMA3 = 1,
    PG_CHAT_LLAMA2 = 2,   // [INST] with <<SYS>> blocks
    PG_CHAT_MISTRAL = 3,  // [INST] without system blocks (system folded into the first user turn)
} pg_chat_family;

typedef struct {
    const char *role;     // "system", "user", "assistant"
    const char *content;
} pg_chat_msg;

typedef struct pg_chat_template pg_chat_template;

// Recognises `text` (a Jinja template, or a family name: "chatml", "llama3",
// "llama2", "mistral"). PG_EUNSUPP when the family is unknown.
int pg_chat_template_parse(const char *text, pg_chat_template **out);
void pg_chat_template_free(pg_chat_template *t);
pg_chat_family pg_chat_template_family(const pg_chat_template *t);
const char *pg_chat_family_name(pg_chat_family f);

// Renders messages into a malloc'd prompt string (caller frees), ending
// with the assistant header when `add_generation_prompt`. The BOS token is
// not included: the caller encodes with the tokenizer's add_bos setting.
// PG_EINVAL (message set) for an unknown role or a misplaced system message.
int pg_chat_template_apply(const pg_chat_template *t, const pg_chat_msg *msgs, int n,
                           bool add_generation_prompt, char **out);
