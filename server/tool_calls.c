// server/tool_calls.c - tools in requests, tool calls in outputs.
#include "server/tool_calls.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "server/api_common.h"

// --- request -------------------------------------------------------------------------

void api_tools_free(api_tools *t) {
    if (!t) return;
    cJSON_Delete(t->tools);
    free(t->named);
    for (int i = 0; i < t->n_streams; i++) tc_stream_free(t->streams[i]);
    free(t->streams);
    free(t);
}

static bool valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static const cJSON *find_tool(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name)) return t;
    }
    return NULL;
}

static int check_tool(const cJSON *t, int i, const cJSON *all, api_error *e) {
    if (!cJSON_IsObject(t)) return api_err(e, 400, "tools", "tools[%d] must be an object", i);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return api_err(e, 400, "tools", "tools[%d].type must be \"function\"", i);
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(fn)) return api_err(e, 400, "tools", "tools[%d].function must be an object", i);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsString(name) || !valid_name(name->valuestring))
        return api_err(e, 400, "tools",
                       "tools[%d].function.name must be 1 to 64 letters, digits, underscores or dashes", i);
    if (find_tool(all, name->valuestring) != t)
        return api_err(e, 400, "tools", "tools[%d]: the function name '%s' is used twice", i, name->valuestring);
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
    if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
        return api_err(e, 400, "tools", "tools[%d].function.description must be a string", i);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
        return api_err(e, 400, "tools", "tools[%d].function.parameters must be a JSON schema object", i);
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return api_err(e, 400, "tools", "tools[%d].function.strict must be a boolean", i);
    return 0;
}

int api_parse_tools(const cJSON *body, api_tools **out, api_error *e) {
    *out = NULL;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(body, "parallel_tool_calls");
    if (tools && cJSON_IsNull(tools)) tools = NULL;
    if (tc && cJSON_IsNull(tc)) tc = NULL;
    if (par && !cJSON_IsNull(par) && !cJSON_IsBool(par))
        return api_err(e, 400, "parallel_tool_calls", "parallel_tool_calls must be a boolean");
    if (tools && !cJSON_IsArray(tools)) return api_err(e, 400, "tools", "tools must be a list of tools");
    if (tools && cJSON_GetArraySize(tools) > 128) return api_err(e, 400, "tools", "at most 128 tools are allowed");
    int i = 0;
    const cJSON *t;
    if (tools) cJSON_ArrayForEach(t, tools) if (check_tool(t, i++, tools, e) < 0) return -1;
    bool have = tools && cJSON_GetArraySize(tools) > 0;
    tc_choice choice = have ? TC_CHOICE_AUTO : TC_CHOICE_NONE;
    const char *named = NULL;
    if (tc && cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        if (!strcmp(s, "none")) choice = TC_CHOICE_NONE;
        else if (!strcmp(s, "auto")) choice = have ? TC_CHOICE_AUTO : TC_CHOICE_NONE;
        else if (!strcmp(s, "required")) choice = TC_CHOICE_REQUIRED;
        else return api_err(e, 400, "tool_choice", "tool_choice must be none, auto, required or a named function");
    } else if (tc && cJSON_IsObject(tc)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(nm))
            return api_err(e, 400, "tool_choice",
                           "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}");
        choice = TC_CHOICE_NAMED;
        named = nm->valuestring;
    } else if (tc) {
        return api_err(e, 400, "tool_choice", "tool_choice must be a string or an object");
    }
    if ((choice == TC_CHOICE_REQUIRED || choice == TC_CHOICE_NAMED) && !have)
        return api_err(e, 400, "tool_choice", "tool_choice '%s' needs tools", named ? named : "required");
    if (named && !find_tool(tools, named))
        return api_err(e, 400, "tool_choice", "tool_choice names the function '%.64s', which is not in tools", named);
    if (!have) return 0;
    api_tools *a = pg_xcalloc(1, sizeof *a);
    a->tools = cJSON_Duplicate(tools, true);
    a->choice = choice;
    a->named = named ? pg_xstrdup(named) : NULL;
    a->parallel = !par || cJSON_IsNull(par) || cJSON_IsTrue(par);
    a->format = TC_FMT_HERMES;
    *out = a;
    return 0;
}

static cJSON *params_schema(const cJSON *tool) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (cJSON_IsObject(p) && p->child) return cJSON_Duplicate(p, true);
    // No parameters: the arguments are an empty object (as vLLM).
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "object");
    cJSON_AddObjectToObject(s, "properties");
    return s;
}

char *tools_guided_json(const api_tools *t) {
    if (!t) return NULL;
    cJSON *schema;
    if (t->choice == TC_CHOICE_NAMED) {
        schema = params_schema(find_tool(t->tools, t->named));
    } else if (t->choice == TC_CHOICE_REQUIRED) {
        schema = cJSON_CreateObject();
        cJSON_AddStringToObject(schema, "type", "array");
        cJSON_AddNumberToObject(schema, "minItems", 1);
        if (!t->parallel) cJSON_AddNumberToObject(schema, "maxItems", 1);
        cJSON *items = cJSON_AddObjectToObject(schema, "items");
        cJSON_AddStringToObject(items, "type", "object");
        cJSON *any = cJSON_AddArrayToObject(items, "anyOf");
        const cJSON *tool;
        cJSON_ArrayForEach(tool, t->tools) {
            cJSON *one = cJSON_CreateObject();
            cJSON *props = cJSON_AddObjectToObject(one, "properties");
            cJSON *name = cJSON_AddObjectToObject(props, "name");
            cJSON_AddStringToObject(name, "type", "string");
            cJSON *en = cJSON_AddArrayToObject(name, "enum");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
            cJSON_AddItemToArray(en, cJSON_CreateString(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring));
            cJSON_AddItemToObject(props, "parameters", params_schema(tool));
            cJSON *req = cJSON_AddArrayToObject(one, "required");
            cJSON_AddItemToArray(req, cJSON_CreateString("name"));
            cJSON_AddItemToArray(req, cJSON_CreateString("parameters"));
            cJSON_AddItemToArray(any, one);
        }
    } else {
        return NULL;
    }
    char *s = cJSON_PrintUnformatted(schema);
    cJSON_Delete(schema);
    return s;
}

void tools_set_format(api_tools *t, const char *src) {
    if (t->choice == TC_CHOICE_REQUIRED) t->format = TC_FMT_REQUIRED;
    else if (t->choice == TC_CHOICE_NAMED) t->format = TC_FMT_NAMED;
    else if (src && strstr(src, "[TOOL_CALLS]")) t->format = TC_FMT_MISTRAL;
    else if (src && strstr(src, "<tool_call>")) t->format = TC_FMT_HERMES;
    else if (src && (strstr(src, "<|python_tag|>") || strstr(src, "<|start_header_id|>ipython")))
        t->format = TC_FMT_LLAMA3;
    else if (src && strstr(src, "<|start_header_id|>") && strstr(src, "\"parameters\""))
        t->format = TC_FMT_LLAMA3;
    else t->format = TC_FMT_HERMES;  // ChatML and unknown templates: the Hermes convention
}

bool tools_need_special_tokens(const api_tools *t) {
    return t && t->choice != TC_CHOICE_NONE && (t->format == TC_FMT_MISTRAL || t->format == TC_FMT_LLAMA3);
}

// --- the parser ----------------------------------------------------------------------

enum { M_CONTENT, M_EXPECT, M_OBJ, M_AFTER, M_TRAIL };

struct tc_stream {
    tc_format fmt;
    char *named;
    bool parallel;
    sbuf buf;               // the whole output so far
    size_t pos;             // content: emitted up to; calls: parsed up to
    int mode;
    bool saw_text;          // non-blank content was emitted
    bool in_array;          // Mistral [TOOL_CALLS] [ ... ]
    bool failed;            // text that should be a call is not one
    int n_calls;
    // the call being parsed
    size_t obj;             // where its object starts
    bool whole_args;        // the object itself is the arguments (named, Mistral name[ARGS])
    bool started;           // its first delta (id, name) went out
    size_t args_done_to;    // argument bytes emitted up to this buf index (0: none yet)
    char *name;             // whole_args: the known name
};

static uint64_t g_id_counter;

static void new_id(tc_format fmt, char *out, size_t cap) {
    if (!g_id_counter) g_id_counter = ((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 40) ^ 0x9E3779B97F4A7C15ull;
    uint64_t z = (g_id_counter += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    if (fmt == TC_FMT_MISTRAL) {  // Mistral's templates require 9 alphanumerics
        static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        for (int i = 0; i < 9 && (size_t)i + 1 < cap; i++, z /= 62) out[i] = al[z % 62];
        out[cap > 9 ? 9 : cap - 1] = 0;
        return;
    }
    uint64_t y = z * 0xD6E8FEB86659FD93ull;
    snprintf(out, cap, "call_%016llx%08llx", (unsigned long long)z, (unsigned long long)(y >> 32));
}

tc_stream *tc_stream_new(tc_format fmt, const char *named, bool parallel) {
    tc_stream *s = pg_xcalloc(1, sizeof *s);
    s->fmt = fmt;
    s->named = named ? pg_xstrdup(named) : NULL;
    s->parallel = parallel;
    s->mode = fmt == TC_FMT_REQUIRED || fmt == TC_FMT_NAMED ? M_EXPECT : M_CONTENT;
    return s;
}

void tc_stream_free(tc_stream *s) {
    if (!s) return;
    sbuf_free(&s->buf);
    free(s->named);
    free(s->name);
    free(s);
}

int tc_stream_n_calls(const tc_stream *s) { return s->n_calls; }

void tc_delta_reset(tc_delta *d) {
    sbuf_reset(&d->content);
    for (int i = 0; i < d->n_calls; i++) {
        free(d->calls[i].name);
        sbuf_free(&d->calls[i].args);
    }
    d->n_calls = 0;
}

void tc_delta_free(tc_delta *d) {
    tc_delta_reset(d);
    sbuf_free(&d->content);
    free(d->calls);
    memset(d, 0, sizeof *d);
}

// The delta entry of call `index` in `d` (appended when it is not the last one).
static tc_delta_call *delta_call(tc_delta *d, int index) {
    if (d->n_calls && d->calls[d->n_calls - 1].index == index) return &d->calls[d->n_calls - 1];
    if (d->n_calls == d->cap_calls) {
        d->cap_calls = d->cap_calls ? d->cap_calls * 2 : 4;
        d->calls = pg_xrealloc(d->calls, sizeof *d->calls * (size_t)d->cap_calls);
    }
    tc_delta_call *c = &d->calls[d->n_calls++];
    memset(c, 0, sizeof *c);
    c->index = index;
    return c;
}

static const char *marker(tc_format f) {
    switch (f) {
    case TC_FMT_HERMES: return "<tool_call>";
    case TC_FMT_MISTRAL: return "[TOOL_CALLS]";
    case TC_FMT_LLAMA3: return "<|python_tag|>";
    default: return NULL;
    }
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest suffix of s[0..n) that is a proper prefix of m.
static size_t partial_suffix(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t k = ml - 1; k > 0; k--)
        if (k <= n && !memcmp(s + n - k, m, k)) return k;
    return 0;
}

// 1: s[pos..] starts with m; 0: it cannot; -1: too short to tell.
static int starts(const sbuf *b, size_t pos, const char *m) {
    size_t ml = strlen(m), left = b->len - pos;
    if (left >= ml) return !memcmp(b->p + pos, m, ml);
    return !memcmp(b->p + pos, m, left) ? -1 : 0;
}

// A JSON object starting at s[start] ('{'), scanned as far as the text goes.
typedef struct {
    bool complete;
    size_t end;              // after the closing brace
    bool has_name;
    size_t name_s, name_e;   // the raw text of the "name" string (without quotes)
    bool has_args, args_container, args_string, args_done;
    size_t args_s, args_e;
} objscan;

static bool key_is(const char *s, size_t a, size_t b, const char *k) {
    return b - a == strlen(k) && !memcmp(s + a, k, b - a);
}

static void scan_object(const char *s, size_t len, size_t start, objscan *o) {
    memset(o, 0, sizeof *o);
    int depth = 0;
    bool in_str = false, esc = false, expect_key = false, value_pending = false;
    size_t str_s = 0, key_s = 0, key_e = 0;
    bool str_is_key = false;
    int val_kind = 0;  // of the pending/current depth-1 value: 1 name, 2 args
    bool scalar_args = false;
    for (size_t i = start; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') {
                in_str = false;
                if (depth == 1 && str_is_key) {
                    key_s = str_s + 1;
                    key_e = i;
                } else if (depth == 1 && val_kind == 1) {
                    o->has_name = true;
                    o->name_s = str_s + 1;
                    o->name_e = i;
                    val_kind = 0;
                } else if (depth == 1 && val_kind == 2 && o->args_string) {
                    o->args_e = i + 1;
                    o->args_done = true;
                    val_kind = 0;
                }
            }
            continue;
        }
        if (is_ws(c)) continue;
        if (depth == 1 && value_pending) {
            value_pending = false;
            val_kind = key_is(s, key_s, key_e, "name") ? 1
                       : key_is(s, key_s, key_e, "arguments") || key_is(s, key_s, key_e, "parameters") ? 2 : 0;
            if (val_kind == 2) {
                o->has_args = true;
                o->args_s = i;
                o->args_container = c == '{' || c == '[';
                o->args_string = c == '"';
                scalar_args = !o->args_container && !o->args_string;
            }
        }
        switch (c) {
        case '"':
            in_str = true;
            str_s = i;
            str_is_key = depth == 1 && expect_key;
            break;
        case '{': case '[':
            depth++;
            if (depth == 1) expect_key = true;
            break;
        case '}': case ']':
            if (depth == 1 && scalar_args && !o->args_done) {
                size_t e = i;
                while (e > o->args_s && is_ws(s[e - 1])) e--;
                o->args_e = e;
                o->args_done = true;
            }
            depth--;
            if (depth == 1 && val_kind == 2 && o->args_container && !o->args_done) {
                o->args_e = i + 1;
                o->args_done = true;
                val_kind = 0;
            }
            if (depth == 0) {
                o->complete = true;
                o->end = i + 1;
                return;
            }
            break;
        case ':':
            if (depth == 1) {
                value_pending = true;
                expect_key = false;
            }
            break;
        case ',':
            if (depth == 1) {
                if (scalar_args && !o->args_done && val_kind == 2) {
                    size_t e = i;
                    while (e > o->args_s && is_ws(s[e - 1])) e--;
                    o->args_e = e;
                    o->args_done = true;
                }
                val_kind = 0;
                expect_key = true;
            }
            break;
        default: break;
        }
    }
}

static void start_call(tc_stream *s, const char *name, size_t n, tc_delta *d) {
    tc_delta_call *c = delta_call(d, s->n_calls);
    new_id(s->fmt, c->id, sizeof c->id);
    c->name = pg_xmalloc(n + 1);
    memcpy(c->name, name, n);
    c->name[n] = 0;
    s->started = true;
    s->n_calls++;
}

static void emit_args(tc_stream *s, size_t from, size_t to, tc_delta *d) {
    if (to <= from) return;
    sbuf_append(&delta_call(d, s->n_calls - 1)->args, s->buf.p + from, to - from);
}

// Advances the call whose object starts at s->obj; true when it completed.
static bool advance_object(tc_stream *s, bool final, tc_delta *d) {
    const char *b = s->buf.p;
    objscan o;
    scan_object(b, s->buf.len, s->obj, &o);
    if (s->whole_args) {
        size_t to = o.complete ? o.end : s->buf.len;
        size_t from = s->args_done_to ? s->args_done_to : s->obj;
        emit_args(s, from, to, d);
        s->args_done_to = to;
        if (o.complete) s->pos = o.end;
        return o.complete;
    }
    if (!s->started && o.has_name) {
        // The name as JSON text: decode it (escapes are rare in names).
        char *raw = pg_xmalloc(o.name_e - o.name_s + 3);
        raw[0] = '"';
        memcpy(raw + 1, b + o.name_s, o.name_e - o.name_s);
        raw[o.name_e - o.name_s + 1] = '"';
        raw[o.name_e - o.name_s + 2] = 0;
        cJSON *nj = cJSON_Parse(raw);
        const char *nm = cJSON_IsString(nj) ? nj->valuestring : "";
        start_call(s, nm, strlen(nm), d);
        cJSON_Delete(nj);
        free(raw);
    }
    if (s->started && o.has_args && !o.args_string) {
        size_t to = o.args_done ? o.args_e : (o.args_container ? s->buf.len : o.args_s);
        size_t from = s->args_done_to ? s->args_done_to : o.args_s;
        emit_args(s, from, to, d);
        if (to > from) s->args_done_to = to;
    }
    if (!o.complete) {
        if (final) s->failed = true;
        return false;
    }
    if (!s->started) {  // an object without a name is not a call
        s->failed = true;
        return false;
    }
    if (o.has_args && o.args_string) {  // "arguments": "{...}" (JSON in a string): decoded
        char *raw = pg_xmalloc(o.args_e - o.args_s + 1);
        memcpy(raw, b + o.args_s, o.args_e - o.args_s);
        raw[o.args_e - o.args_s] = 0;
        cJSON *aj = cJSON_Parse(raw);
        if (cJSON_IsString(aj)) sbuf_puts(&delta_call(d, s->n_calls - 1)->args, aj->valuestring);
        cJSON_Delete(aj);
        free(raw);
    } else if (!o.has_args) {
        sbuf_puts(&delta_call(d, s->n_calls - 1)->args, "{}");
    }
    s->pos = o.end;
    return true;
}

static void skip_ws(tc_stream *s) {
    while (s->pos < s->buf.len && is_ws(s->buf.p[s->pos])) s->pos++;
}

static void emit_content(tc_stream *s, size_t to, tc_delta *d) {
    if (to <= s->pos) return;
    for (size_t i = s->pos; i < to && !s->saw_text; i++) s->saw_text = !is_ws(s->buf.p[i]);
    sbuf_append(&d->content, s->buf.p + s->pos, to - s->pos);
    s->pos = to;
}

// One step of the state machine; false when it needs more text.
static bool step(tc_stream *s, bool final, tc_delta *d) {
    sbuf *b = &s->buf;
    switch (s->mode) {
    case M_CONTENT: {
        const char *m = marker(s->fmt);
        const char *hit = memmem(b->p + s->pos, b->len - s->pos, m, strlen(m));
        size_t brace = SIZE_MAX;
        if (s->fmt == TC_FMT_LLAMA3 && !s->saw_text) {  // a bare JSON call first in the output
            size_t i = s->pos;
            while (i < b->len && is_ws(b->p[i])) i++;
            if (i < b->len && b->p[i] == '{') brace = i;
            else if (i == b->len && !final) return false;  // only blanks so far: wait
        }
        if (brace != SIZE_MAX && (!hit || (size_t)(hit - b->p) > brace)) {
            s->pos = brace;
            s->mode = M_EXPECT;
            return true;
        }
        if (hit) {
            emit_content(s, (size_t)(hit - b->p), d);
            s->pos += strlen(m);
            s->mode = M_EXPECT;
            return true;
        }
        size_t hold = final ? 0 : partial_suffix(b->p + s->pos, b->len - s->pos, m);
        emit_content(s, b->len - hold, d);
        return false;
    }
    case M_EXPECT: {
        skip_ws(s);
        if (s->pos >= b->len) {
            if (final && (s->n_calls == 0 || s->fmt == TC_FMT_REQUIRED)) s->failed = s->n_calls == 0;
            return false;
        }
        char c = b->p[s->pos];
        if ((s->fmt == TC_FMT_MISTRAL || s->fmt == TC_FMT_REQUIRED) && c == '[' && !s->in_array) {
            s->in_array = true;
            s->pos++;
            return true;
        }
        if (s->fmt == TC_FMT_REQUIRED && !s->in_array) {
            s->failed = true;
            s->mode = M_TRAIL;
            return true;
        }
        s->started = false;
        s->args_done_to = 0;
        s->whole_args = false;
        if (s->fmt == TC_FMT_NAMED) {
            if (c != '{') {
                s->failed = true;
                s->mode = M_TRAIL;
                return true;
            }
            start_call(s, s->named, strlen(s->named), d);
            s->whole_args = true;
            s->obj = s->pos;
            s->mode = M_OBJ;
            return true;
        }
        if (s->fmt == TC_FMT_MISTRAL && !s->in_array && c != '{') {
            // [TOOL_CALLS]name[ARGS]{...} (Mistral Small 3.2, Devstral)
            const char *args = memmem(b->p + s->pos, b->len - s->pos, "[ARGS]", 6);
            if (!args) {
                if (final || b->len - s->pos > 128) s->failed = true, s->mode = M_TRAIL;
                return final ? true : s->mode == M_TRAIL;
            }
            size_t ne = (size_t)(args - b->p);
            while (ne > s->pos && is_ws(b->p[ne - 1])) ne--;
            start_call(s, b->p + s->pos, ne - s->pos, d);
            s->pos = (size_t)(args - b->p) + 6;
            skip_ws(s);
            if (s->pos >= b->len) {  // wait for the arguments' brace
                s->whole_args = true;
                s->obj = s->pos;
                s->mode = M_OBJ;
                return false;
            }
            s->whole_args = true;
            s->obj = s->pos;
            s->mode = M_OBJ;
            return true;
        }
        if (c != '{') {
            s->failed = true;
            s->mode = M_TRAIL;
            return true;
        }
        s->obj = s->pos;
        s->mode = M_OBJ;
        return true;
    }
    case M_OBJ:
        if (s->whole_args && s->obj >= b->len) {
            if (final) s->failed = true;
            return false;
        }
        if (s->whole_args && s->obj < b->len && b->p[s->obj] != '{') {
            skip_ws(s);
            s->obj = s->pos;
            if (s->obj >= b->len) return false;
            if (b->p[s->obj] != '{') {
                s->failed = true;
                s->mode = M_TRAIL;
                return true;
            }
        }
        if (!advance_object(s, final, d)) {
            if (s->failed) s->mode = M_TRAIL;
            return s->failed;
        }
        s->mode = s->parallel ? M_AFTER : M_TRAIL;
        return true;
    case M_AFTER: {
        skip_ws(s);
        if (s->pos >= b->len) return false;
        char c = b->p[s->pos];
        int k;
        switch (s->fmt) {
        case TC_FMT_HERMES:
            if ((k = starts(b, s->pos, "</tool_call>")) < 0) return false;
            if (k) {
                s->pos += strlen("</tool_call>");
                skip_ws(s);
                if (s->pos >= b->len) return false;
            }
            if ((k = starts(b, s->pos, "<tool_call>")) < 0) return false;
            if (k) {
                s->pos += strlen("<tool_call>");
                s->mode = M_EXPECT;
            } else {
                s->mode = M_TRAIL;
            }
            return true;
        case TC_FMT_LLAMA3:
            if (c == ';' || c == ',') {
                s->pos++;
                s->mode = M_EXPECT;
            } else if ((k = starts(b, s->pos, "<|python_tag|>")) != 0) {
                if (k < 0) return false;
                s->pos += strlen("<|python_tag|>");
                s->mode = M_EXPECT;
            } else {
                s->mode = c == '{' ? M_EXPECT : M_TRAIL;
            }
            return true;
        case TC_FMT_MISTRAL: case TC_FMT_REQUIRED:
            if (s->in_array && c == ',') {
                s->pos++;
                s->mode = M_EXPECT;
                return true;
            }
            if (s->in_array && c == ']') {
                s->pos++;
                s->in_array = false;
                if (s->fmt == TC_FMT_REQUIRED) {
                    s->mode = M_TRAIL;
                    return true;
                }
                skip_ws(s);
                if (s->pos >= b->len) return false;
            }
            if (s->fmt == TC_FMT_MISTRAL) {
                if ((k = starts(b, s->pos, "[TOOL_CALLS]")) < 0) return false;
                if (k) {
                    s->pos += strlen("[TOOL_CALLS]");
                    s->mode = M_EXPECT;
                    return true;
                }
            }
            s->mode = M_TRAIL;
            return true;
        default:
            s->mode = M_TRAIL;
            return true;
        }
    }
    default:
        return false;
    }
}

void tc_stream_feed(tc_stream *s, const char *text, size_t n, bool final, tc_delta *out) {
    sbuf_append(&s->buf, text, n);
    if (!s->buf.p) sbuf_puts(&s->buf, "");
    for (int guard = 0; guard < 1 << 20 && step(s, final, out); guard++) {
    }
}

tc_stream *tools_stream(api_tools *t, int index) {
    if (index >= t->n_streams) {
        t->streams = pg_xrealloc(t->streams, sizeof *t->streams * (size_t)(index + 1));
        for (int i = t->n_streams; i <= index; i++) t->streams[i] = NULL;
        t->n_streams = index + 1;
    }
    if (!t->streams[index]) t->streams[index] = tc_stream_new(t->format, t->named, t->parallel);
    return t->streams[index];
}

void tools_parse_output(const api_tools *t, const char *text, char **content, cJSON **tool_calls) {
    *content = NULL;
    *tool_calls = NULL;
    tc_stream *s = tc_stream_new(t->format, t->named, t->parallel);
    tc_delta d = {0};
    tc_stream_feed(s, text, strlen(text), true, &d);
    if (s->failed || s->n_calls == 0) {
        // Not a (well-formed) tool call: all of it is content, as in vLLM.
        *content = pg_xstrdup(text);
    } else {
        cJSON *arr = cJSON_CreateArray();
        for (int i = 0; i < d.n_calls; i++) {
            tc_delta_call *c = &d.calls[i];
            cJSON *call = cJSON_GetArrayItem(arr, c->index);
            if (!call) {
                call = cJSON_CreateObject();
                cJSON_AddStringToObject(call, "id", c->id);
                cJSON_AddStringToObject(call, "type", "function");
                cJSON *fn = cJSON_AddObjectToObject(call, "function");
                cJSON_AddStringToObject(fn, "name", c->name ? c->name : "");
                cJSON_AddStringToObject(fn, "arguments", "");
                cJSON_AddItemToArray(arr, call);
            }
            cJSON *args = cJSON_GetObjectItem(cJSON_GetObjectItem(call, "function"), "arguments");
            size_t old = strlen(args->valuestring);
            char *joined = pg_xmalloc(old + c->args.len + 1);
            memcpy(joined, args->valuestring, old);
            memcpy(joined + old, sbuf_str(&c->args), c->args.len);
            joined[old + c->args.len] = 0;
            cJSON_SetValuestring(args, joined);
            free(joined);
        }
        *tool_calls = arr;
        const char *ct = sbuf_str(&d.content);
        bool blank = true;
        for (const char *p = ct; *p && blank; p++) blank = is_ws(*p);
        if (!blank) *content = pg_xstrdup(ct);
    }
    tc_delta_free(&d);
    tc_stream_free(s);
}
