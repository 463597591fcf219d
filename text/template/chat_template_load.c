// text/template/chat_template_load.c - finding a model's chat template.
//
// Where the text comes from, first match wins (as vLLM and transformers):
//   1. --chat-template: a family name (chatml, llama3, llama2, mistral, gemma), a
//      file holding a Jinja template, or Jinja text itself;
//   2. a model directory: chat_template.jinja, else tokenizer_config.json
//      "chat_template" (a string, or a list of {name, template} where the
//      one named "default" wins);
//   3. a GGUF file: tokenizer.chat_template (a Gemma 3 file without one:
//      Gemma's, built in).
// The text becomes a pg_chat_template (Jinja, or a native family when the
// Jinja engine cannot parse it) with bos_token/eos_token taken from the
// tokenizer.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "text/template/chat_template.h"
#include "formats/gguf.h"
#include "text/tokenizer/tokenizer.h"

#define MAX_TEMPLATE (4u << 20)

static char *hf_config_template(const char *dir) {
    char *path = pg_path_join(dir, "tokenizer_config.json"), *text = NULL, *result = NULL;
    size_t len;
    if (pg_read_file(path, 64u << 20, &text, &len) == 0) {
        cJSON *j = cJSON_ParseWithLength(text, len);
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
        if (cJSON_IsString(ct)) {
            result = pg_xstrdup(ct->valuestring);
        } else if (cJSON_IsArray(ct)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, ct) {
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
                const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(it, "template");
                bool is_default = cJSON_IsString(name) && !strcmp(name->valuestring, "default");
                if (cJSON_IsString(tmpl) && (!result || is_default)) {
                    free(result);
                    result = pg_xstrdup(tmpl->valuestring);
                }
                if (is_default) break;
            }
        }
        cJSON_Delete(j);
    }
    free(text);
    free(path);
    return result;
}

// Gemma's chat template (the one Google ships with Gemma 3's instruction
// models): a system message becomes the first user turn's prefix, the
// assistant's turns are "model" turns, and every turn ends with
// <end_of_turn>, which the model's config adds to its EOS ids. Built in for
// Gemma files that carry none (the base 270M GGUF) and as --chat-template
// gemma.
static const char GEMMA_TEMPLATE[] =
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}{{ raise_exception(\"Invalid content type\") }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";

static int model_template_text(const char *src, char **text) {
    *text = NULL;
    size_t len;
    if (pg_is_dir(src)) {
        char *p = pg_path_join(src, "chat_template.jinja");
        int rc = pg_file_exists(p) ? pg_read_file(p, MAX_TEMPLATE, text, &len) : 0;
        free(p);
        PG_TRY(rc);
        if (!*text) *text = hf_config_template(src);
        return 0;
    }
    size_t n = strlen(src);
    if (n >= 5 && !strcmp(src + n - 5, ".json")) return 0;  // a bare tokenizer.json: no template
    gguf_file *f;
    PG_TRY(gguf_open(src, &f));
    if (gguf_get_str(f, "tokenizer.chat_template", text) < 0) *text = NULL;
    char *arch = NULL;
    if (!*text && gguf_get_str(f, "general.architecture", &arch) == 0 &&
        (!strcmp(arch, "gemma3") || !strcmp(arch, "gemma2")))
        *text = pg_xstrdup(GEMMA_TEMPLATE);
    free(arch);
    gguf_close(f);
    return 0;
}

static char *token_text(const pg_tokenizer *tok, int32_t id) {
    if (!tok || id < 0) return NULL;
    char buf[256];
    int n = pg_tokenizer_token_bytes(tok, id, buf, sizeof buf - 1);
    if (n < 0 || n >= (int)sizeof buf) return NULL;
    buf[n] = 0;
    return pg_xstrdup(buf);
}

int pg_chat_template_load(const char *want, const char *model_src, const pg_tokenizer *tok,
                          pg_chat_template **out) {
    *out = NULL;
    char *text = NULL;
    size_t len;
    if (want && pg_file_exists(want) && !pg_is_dir(want)) {
        PG_TRY(pg_read_file(want, MAX_TEMPLATE, &text, &len));
    } else if (want) {
        // Neither a file nor Jinja-looking text: a mistyped path (vLLM's rule).
        if (!strpbrk(want, "{}\n") && strcmp(want, "chatml") && strcmp(want, "llama3") &&
            strcmp(want, "llama2") && strcmp(want, "mistral") && strcmp(want, "gemma"))
            return pg_err_set(PG_EINVAL, "--chat-template: chat template not recognised: '%.200s' is not a "
                              "file, a family name (chatml, llama3, llama2, mistral, gemma) or Jinja text", want);
        text = pg_xstrdup(strcmp(want, "gemma") ? want : GEMMA_TEMPLATE);
    } else if (model_src) {
        PG_TRY(model_template_text(model_src, &text));
    }
    if (!text) return 0;  // no template: chat requests get a clear error later
    int rc = pg_chat_template_create(text, out);
    if (rc < 0 && !want) {
        // The model's own template is unusable: chat is unavailable, text
        // completion still works.
        PG_LOGW("chat template of %s unusable; /v1/chat/completions disabled (%s)", model_src, pg_err_msg());
        rc = 0;
    } else if (rc < 0) {
        rc = pg_err_wrap(rc, "--chat-template: ");
    }
    if (*out) {
        char *bos = token_text(tok, tok ? pg_tokenizer_bos(tok) : -1);
        char *eos = token_text(tok, tok ? pg_tokenizer_eos(tok) : -1);
        pg_chat_template_set_tokens(*out, bos, eos);
        free(bos);
        free(eos);
    }
    free(text);
    return rc;
}
