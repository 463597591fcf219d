// text/template/chat_template.c - native rendering of the common chat templates.
#include "text/template/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "text/template/jinja.h"

struct pg_chat_template {
    pg_chat_family family;
    char *default_system;   // ChatML: system prompt added when none is given
    pg_jinja_template *jinja;  // PG_CHAT_JINJA
    char *source;           // PG_CHAT_JINJA: the template text
    char *bos, *eos;        // bos_token / eos_token text ("" when unknown)
};

const char *pg_chat_family_name(pg_chat_family f) {
    switch (f) {
    case PG_CHAT_CHATML: return "chatml";
    case PG_CHAT_LLAMA3: return "llama3";
    case PG_CHAT_LLAMA2: return "llama2";
    case PG_CHAT_MISTRAL: return "mistral";
    case PG_CHAT_JINJA: return "jinja";
    }
    return "unknown";
}

// SmolLM2-style ChatML templates insert a fixed system turn when the first
// message is not a system message; find its text in the template source:
// the literal between "<|im_start|>system\n" and "<|im_end|>".
static char *chatml_default_system(const char *text) {
    if (!strstr(text, "!= 'system'") && !strstr(text, "!= \"system\"")) return NULL;
    const char *key = "<|im_start|>system\\n";
    const char *p = strstr(text, key);
    size_t klen = strlen(key);
    if (!p) {
        key = "<|im_start|>system\n";
        p = strstr(text, key);
        klen = strlen(key);
    }
    if (!p) return NULL;
    p += klen;
    const char *e = strstr(p, "<|im_end|>");
    if (!e || memchr(p, '{', (size_t)(e - p)) || memchr(p, '\'', (size_t)(e - p))) return NULL;
    char *s = pg_xmalloc((size_t)(e - p) + 1);
    memcpy(s, p, (size_t)(e - p));
    s[e - p] = 0;
    return s;
}

int pg_chat_template_parse(const char *text, pg_chat_template **out) {
    *out = NULL;
    pg_chat_family f;
    if (!strcmp(text, "chatml") || strstr(text, "<|im_start|>")) {
        f = PG_CHAT_CHATML;
    } else if (!strcmp(text, "llama3") || strstr(text, "<|start_header_id|>")) {
        f = PG_CHAT_LLAMA3;
    } else if (!strcmp(text, "llama2") || strstr(text, "<<SYS>>")) {
        f = PG_CHAT_LLAMA2;
    } else if (!strcmp(text, "mistral") || strstr(text, "[INST]")) {
        f = PG_CHAT_MISTRAL;
    } else {
        return pg_err_set(PG_EUNSUPP,
                          "chat template not recognised (supported families: chatml, llama3, "
                          "llama2, mistral; pass one with --chat-template NAME or FILE)");
    }
    pg_chat_template *t = pg_xcalloc(1, sizeof *t);
    t->family = f;
    if (f == PG_CHAT_CHATML) t->default_system = chatml_default_system(text);
    *out = t;
    return 0;
}

void pg_chat_template_free(pg_chat_template *t) {
    if (!t) return;
    free(t->default_system);
    pg_jinja_free(t->jinja);
    free(t->source);
    free(t->bos);
    free(t->eos);
    free(t);
}

static bool is_family_name(const char *s) {
    return !strcmp(s, "chatml") || !strcmp(s, "llama3") || !strcmp(s, "llama2") || !strcmp(s, "mistral");
}

int pg_chat_template_create(const char *text, pg_chat_template **out) {
    *out = NULL;
    if (is_family_name(text)) return pg_chat_template_parse(text, out);
    pg_jinja_template *j;
    if (pg_jinja_parse(text, strlen(text), &j) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", pg_err_msg());
        if (pg_chat_template_parse(text, out) == 0) {
            PG_LOGW("chat template: the Jinja engine cannot parse it (%s); rendering it natively as %s",
                    why, pg_chat_family_name((*out)->family));
            return 0;
        }
        return pg_err_set(PG_EINVAL, "chat template: %s", why);
    }
    pg_chat_template *t = pg_xcalloc(1, sizeof *t);
    t->family = PG_CHAT_JINJA;
    t->jinja = j;
    t->source = pg_xstrdup(text);
    *out = t;
    return 0;
}

void pg_chat_template_set_tokens(pg_chat_template *t, const char *bos, const char *eos) {
    free(t->bos);
    free(t->eos);
    t->bos = bos ? pg_xstrdup(bos) : NULL;
    t->eos = eos ? pg_xstrdup(eos) : NULL;
}

const char *pg_chat_template_source(const pg_chat_template *t) { return t->source; }

bool pg_chat_template_renders_bos(const pg_chat_template *t) { return t->family == PG_CHAT_JINJA; }

pg_chat_family pg_chat_template_family(const pg_chat_template *t) { return t->family; }

// --- a growable string -----------------------------------------------------------

typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = pg_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

// Trims leading and trailing whitespace (Llama templates apply `| trim`).
static void sb_add_trimmed(sbuf *b, const char *s) {
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    char *tmp = pg_xmalloc(n + 1);
    memcpy(tmp, s, n);
    tmp[n] = 0;
    sb_add(b, tmp);
    free(tmp);
}

static int check_roles(const pg_chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        if (!m[i].role || !m[i].content) return pg_err_set(PG_EINVAL, "message %d has no role or content", i);
        if (strcmp(m[i].role, "system") && strcmp(m[i].role, "user") && strcmp(m[i].role, "assistant"))
            return pg_err_set(PG_EINVAL, "message %d has unknown role '%s'", i, m[i].role);
    }
    return 0;
}

static void render_chatml(const pg_chat_template *t, const pg_chat_msg *m, int n, bool gen, sbuf *b) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && strcmp(m[0].role, "system") && t->default_system) {
            sb_add(b, "<|im_start|>system\n");
            sb_add(b, t->default_system);
            sb_add(b, "<|im_end|>\n");
        }
        sb_add(b, "<|im_start|>");
        sb_add(b, m[i].role);
        sb_add(b, "\n");
        sb_add(b, m[i].content);
        sb_add(b, "<|im_end|>\n");
    }
    if (gen) sb_add(b, "<|im_start|>assistant\n");
}

static void render_llama3(const pg_chat_msg *m, int n, bool gen, sbuf *b) {
    for (int i = 0; i < n; i++) {
        sb_add(b, "<|start_header_id|>");
        sb_add(b, m[i].role);
        sb_add(b, "<|end_header_id|>\n\n");
        sb_add_trimmed(b, m[i].content);
        sb_add(b, "<|eot_id|>");
    }
    if (gen) sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// Removes trailing whitespace from the buffer (Jinja's strip() on a turn).
static void sb_rtrim(sbuf *b, size_t from) {
    while (b->len > from && (b->p[b->len - 1] == ' ' || b->p[b->len - 1] == '\n' ||
                             b->p[b->len - 1] == '\t' || b->p[b->len - 1] == '\r'))
        b->p[--b->len] = 0;
}

// Llama-2 (Hugging Face's template): user/assistant alternate; a leading
// system message is wrapped in <<SYS>> inside the first user turn, and the
// turn as a whole is stripped; every user turn but the first starts with
// BOS. Mistral (v0.1 template): no system role, "[INST] u [/INST]a</s>".
static int render_inst(pg_chat_family f, const pg_chat_msg *m, int n, sbuf *b) {
    const char *system = NULL;
    int start = 0;
    if (n > 0 && !strcmp(m[0].role, "system")) {
        if (f == PG_CHAT_MISTRAL)
            return pg_err_set(PG_EINVAL, "the mistral template supports only user and assistant roles");
        system = m[0].content;
        start = 1;
    }
    for (int i = start, turn = 0; i < n; i++, turn++) {
        const char *want = turn % 2 == 0 ? "user" : "assistant";
        if (strcmp(m[i].role, want))
            return pg_err_set(PG_EINVAL, "%s template needs alternating user/assistant messages "
                              "(message %d is '%s')", pg_chat_family_name(f), i, m[i].role);
        if (f == PG_CHAT_LLAMA2 && turn % 2 == 0) {
            if (turn > 0) sb_add(b, "<s>");
            sb_add(b, "[INST] ");
            size_t from = b->len;
            if (turn == 0 && system) {
                sb_add(b, "<<SYS>>\n");
                sb_add(b, system);
                sb_add(b, "\n<</SYS>>\n\n");
                sb_add(b, m[i].content);
            } else {
                sb_add_trimmed(b, m[i].content);
            }
            sb_rtrim(b, from);
            sb_add(b, " [/INST]");
        } else if (f == PG_CHAT_LLAMA2) {
            sb_add(b, " ");
            sb_add_trimmed(b, m[i].content);
            sb_add(b, " </s>");
        } else if (turn % 2 == 0) {
            sb_add(b, "[INST] ");
            sb_add(b, m[i].content);
            sb_add(b, " [/INST]");
        } else {
            sb_add(b, m[i].content);
            sb_add(b, "</s>");
        }
    }
    return 0;
}

static int render_jinja(const pg_chat_template *t, const cJSON *messages, const pg_chat_render_opts *o,
                        char **out) {
    cJSON *ctx = cJSON_CreateObject();
    // chat_template_kwargs first: the variables HF sets itself win over them.
    const cJSON *kw;
    if (o->kwargs) cJSON_ArrayForEach(kw, o->kwargs) if (kw->string) cJSON_AddItemToObject(ctx, kw->string, cJSON_Duplicate(kw, true));
    cJSON_DeleteItemFromObject(ctx, "messages");
    cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(messages, true));
    cJSON_DeleteItemFromObject(ctx, "tools");
    cJSON_AddItemToObject(ctx, "tools", o->tools ? cJSON_Duplicate(o->tools, true) : cJSON_CreateNull());
    if (!cJSON_HasObjectItem(ctx, "documents")) cJSON_AddNullToObject(ctx, "documents");
    cJSON_DeleteItemFromObject(ctx, "add_generation_prompt");
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", o->add_generation_prompt);
    cJSON_DeleteItemFromObject(ctx, "bos_token");
    cJSON_AddStringToObject(ctx, "bos_token", t->bos ? t->bos : "");
    cJSON_DeleteItemFromObject(ctx, "eos_token");
    cJSON_AddStringToObject(ctx, "eos_token", t->eos ? t->eos : "");
    int rc = pg_jinja_render(t->jinja, ctx, NULL, out);
    cJSON_Delete(ctx);
    if (rc < 0) return pg_err_wrap(PG_EINVAL, "the chat template failed: ");
    return 0;
}

int pg_chat_template_render(const pg_chat_template *t, const cJSON *messages,
                            const pg_chat_render_opts *o, char **out) {
    *out = NULL;
    if (t->family == PG_CHAT_JINJA) return render_jinja(t, messages, o, out);
    // A native family: role and content only.
    if (o->tools && cJSON_GetArraySize(o->tools) > 0)
        return pg_err_set(PG_EINVAL, "the %s chat template cannot render tools (the model has no Jinja "
                          "template that does)", pg_chat_family_name(t->family));
    int n = cJSON_GetArraySize(messages);
    pg_chat_msg *m = pg_xcalloc((size_t)(n ? n : 1), sizeof *m);
    int i = 0, rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(it, "tool_calls");
        if (cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0) {
            rc = pg_err_set(PG_EINVAL, "the %s chat template cannot render tool calls (message %d)",
                            pg_chat_family_name(t->family), i);
            break;
        }
        m[i].role = cJSON_IsString(role) ? role->valuestring : NULL;
        m[i].content = cJSON_IsString(content) ? content->valuestring : "";
        i++;
    }
    if (rc == 0) rc = pg_chat_template_apply(t, m, n, o->add_generation_prompt, out);
    free(m);
    return rc;
}

int pg_chat_template_apply(const pg_chat_template *t, const pg_chat_msg *msgs, int n, bool gen,
                           char **out) {
    *out = NULL;
    if (t->family == PG_CHAT_JINJA) {
        cJSON *arr = cJSON_CreateArray();
        for (int i = 0; i < n; i++) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", msgs[i].role ? msgs[i].role : "");
            cJSON_AddStringToObject(m, "content", msgs[i].content ? msgs[i].content : "");
            cJSON_AddItemToArray(arr, m);
        }
        pg_chat_render_opts o = {.add_generation_prompt = gen};
        int rc = render_jinja(t, arr, &o, out);
        cJSON_Delete(arr);
        return rc;
    }
    PG_TRY(check_roles(msgs, n));
    for (int i = 1; i < n; i++)
        if (!strcmp(msgs[i].role, "system") && t->family != PG_CHAT_CHATML && t->family != PG_CHAT_LLAMA3)
            return pg_err_set(PG_EINVAL, "%s template allows a system message only first",
                              pg_chat_family_name(t->family));
    sbuf b = {0};
    sb_add(&b, "");
    switch (t->family) {
    case PG_CHAT_CHATML: render_chatml(t, msgs, n, gen, &b); break;
    case PG_CHAT_LLAMA3: render_llama3(msgs, n, gen, &b); break;
    case PG_CHAT_JINJA: break;  // handled above
    case PG_CHAT_LLAMA2:
    case PG_CHAT_MISTRAL: {
        int rc = render_inst(t->family, msgs, n, &b);
        if (rc < 0) {
            free(b.p);
            return rc;
        }
        break;
    }
    }
    *out = b.p;
    return 0;
}
