// server/api_format.c - the OpenAI JSON of both generation routes,
// streamed and whole.
//
// Chat with tools (server/tool_calls.h): each choice's text goes through
// the tool-call parser; streamed as content deltas, then per call a chunk
// with its id and name and chunks with argument text; whole responses carry
// message.tool_calls. Either way finish_reason is "tool_calls" when the
// model called a tool.
//
// Completions: choice i * n + k is sequence k of prompt i; echo puts the
// prompt in front of the text (streamed: as the choice's first chunk), and
// the legacy logprobs object counts text_offset in characters (vLLM's).
#include "server/api_format.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/sse.h"
#include "server/tool_calls.h"

// --- tokens and numbers ---------------------------------------------------------

// vLLM clamps -inf logprobs to -9999.
static double logprob_num(float lp) { return isfinite(lp) && lp > -9999.0f ? (double)lp : -9999.0; }

// A token's raw bytes: in `small` (256 bytes) or a malloc'd buffer put in
// *big (the caller frees it). Returns the count, 0 for an unknown id.
static int token_bytes(const pg_tokenizer *t, int32_t id, char *small, char **big) {
    *big = NULL;
    int n = pg_tokenizer_token_bytes(t, id, small, 256);
    if (n > 256) {
        *big = pg_xmalloc((size_t)n);
        n = pg_tokenizer_token_bytes(t, id, *big, n);
    }
    return n < 0 ? 0 : n;
}

void api_format_token_text(const pg_tokenizer *t, int32_t id, sbuf *out) {
    char small[256], *big;
    int n = token_bytes(t, id, small, &big);
    const char *buf = big ? big : small;
    // Append, replacing each ill-formed sequence with U+FFFD.
    for (int i = 0; i < n;) {
        int k = 1;
        unsigned char c = (unsigned char)buf[i];
        if (c >= 0x80) {
            k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
            if (k == 0 || i + k > n || !api_utf8_valid(buf + i, (size_t)k)) {
                sbuf_puts(out, "\xEF\xBF\xBD");
                i++;
                continue;
            }
        }
        sbuf_append(out, buf + i, (size_t)k);
        i += k;
    }
    free(big);
}

// The token's text in `t` (reset first), for a JSON string or key.
static const char *token_str(const pg_tokenizer *tok, int32_t id, sbuf *t) {
    sbuf_reset(t);
    api_format_token_text(tok, id, t);
    return sbuf_str(t);
}

// Chat's "bytes": the token's raw bytes as numbers (a character split
// across tokens shows here, not in "token").
static cJSON *token_bytes_json(const pg_tokenizer *tok, int32_t id) {
    char small[256], *big;
    int n = token_bytes(tok, id, small, &big);
    const char *buf = big ? big : small;
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)buf[i]));
    free(big);
    return arr;
}

static int64_t utf8_chars(const char *s, size_t n) {
    int64_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

// --- the envelope and what both routes share -------------------------------------

// id, object, created, model: the head of every body and chunk (a job
// either streams or answers whole, so j->p.stream picks chat's object).
static cJSON *envelope(const gen_job *j) {
    const char *object = j->kind == API_COMPLETION ? "text_completion"
                         : j->p.stream             ? "chat.completion.chunk"
                                                   : "chat.completion";
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->p.lora_id ? j->p.model : j->app->served_name); // an adapter: as asked
    return o;
}

// Sends one chunk (taken) on the job's stream.
static void send_chunk(gen_job *j, cJSON *o) {
    sse_send_json(j->req, o);
    cJSON_Delete(o);
}

// A chunk of one choice (taken).
static void send_choice(gen_job *j, cJSON *ch) {
    cJSON *o = envelope(j);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), ch);
    send_chunk(j, o);
}

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
static cJSON *usage_json(const gen_job *j) {
    int64_t prompt = 0, completion = 0, cached = 0;
    for (int i = 0; i < j->n_subs; i++) {
        prompt += j->subs[i].n_ids;
        cached += j->subs[i].usage.cached_tokens;
    }
    for (int i = 0; i < j->n_choices; i++) completion += j->choices[i].n_tokens;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

static void add_plp_entry(cJSON *dict, const pg_tokenizer *tok, int32_t id, float lp, int32_t rank,
                          sbuf *t) {
    char key[16];
    snprintf(key, sizeof key, "%d", id);
    if (cJSON_GetObjectItemCaseSensitive(dict, key)) return;
    cJSON *o = cJSON_AddObjectToObject(dict, key);
    cJSON_AddNumberToObject(o, "logprob", logprob_num(lp));
    cJSON_AddNumberToObject(o, "rank", rank);
    cJSON_AddStringToObject(o, "decoded_token", token_str(tok, id, t));
}

// vLLM's prompt_logprobs for prompt `s`: [null, {"<id>": {"logprob", "rank",
// "decoded_token"}, ...}, ...], one entry per prompt token, each dict the
// prompt token first, then the top k (by rank) not already in it. JSON null
// when the engine delivered none (the request failed first).
static cJSON *prompt_logprobs_json(const gen_job *j, const gen_sub *s, int32_t k) {
    if (!s->plp) return cJSON_CreateNull();
    const pg_tokenizer *tok = j->app->tok;
    cJSON *list = cJSON_CreateArray();
    sbuf t = {0};
    for (int32_t p = 0; p < s->n_ids; p++) {
        if (p == 0) { // nothing before the first token to score it
            cJSON_AddItemToArray(list, cJSON_CreateNull());
            continue;
        }
        const pg_prompt_logprob *e = &s->plp[p];
        cJSON *d = cJSON_CreateObject();
        add_plp_entry(d, tok, s->ids[p], e->logprob, e->rank, &t);
        int32_t n = e->n_top < k ? e->n_top : k;
        for (int32_t i = 0; i < n; i++) add_plp_entry(d, tok, e->top_ids[i], e->top_logprobs[i], i + 1, &t);
        cJSON_AddItemToArray(list, d);
    }
    sbuf_free(&t);
    return list;
}

// "stop" becomes "tool_calls" when the choice called a tool (OpenAI's reason).
static const char *finish_with_calls(const char *finish, bool called) {
    return called && finish && !strcmp(finish, "stop") ? "tool_calls" : finish;
}

// finish_reason, and vLLM's stop_reason: the stop string, or the
// stop_token_ids entry that ended the choice; null for EOS, length and
// tool calls. Before the end a completions choice says stop_reason null, a
// chat choice leaves it out (as vLLM's).
static void add_finish(const gen_job *j, const gen_choice *c, cJSON *ch, const char *finish) {
    if (!finish) {
        cJSON_AddNullToObject(ch, "finish_reason");
        if (j->kind == API_COMPLETION) cJSON_AddNullToObject(ch, "stop_reason");
        return;
    }
    cJSON_AddStringToObject(ch, "finish_reason", finish);
    if (!strcmp(finish, "tool_calls")) {
        cJSON_AddNullToObject(ch, "stop_reason");
        return;
    }
    if (c->stop_string >= 0) {
        cJSON_AddStringToObject(ch, "stop_reason", j->p.stop[c->stop_string]);
        return;
    }
    const pg_sampling_params *sp = &c->sub->sp;
    for (int i = 0; c->stop_token >= 0 && i < sp->n_stop_ids; i++)
        if (sp->stop_ids[i] == c->stop_token) {
            cJSON_AddNumberToObject(ch, "stop_reason", c->stop_token);
            return;
        }
    cJSON_AddNullToObject(ch, "stop_reason");
}

static int top_count(const gen_job *j, int32_t n_top) { return n_top < j->p.logprobs ? n_top : j->p.logprobs; }

// --- chat ------------------------------------------------------------------------

static cJSON *chat_entry_json(const pg_tokenizer *tok, int32_t id, float lp, sbuf *t) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", token_str(tok, id, t));
    cJSON_AddNumberToObject(o, "logprob", logprob_num(lp));
    cJSON_AddItemToObject(o, "bytes", token_bytes_json(tok, id));
    return o;
}

// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
static cJSON *chat_logprobs_json(const gen_job *j, const gen_choice *c) {
    if (j->p.logprobs < 0) return cJSON_CreateNull();
    const pg_tokenizer *tok = j->app->tok;
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    sbuf t = {0};
    for (int k = 0; k < c->n_lps; k++) {
        const pg_seq_output *so = &c->lps[k];
        cJSON *e = chat_entry_json(tok, so->token, so->logprob, &t);
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        int n_top = top_count(j, so->n_top);
        for (int i = 0; i < n_top; i++)
            cJSON_AddItemToArray(tops, chat_entry_json(tok, so->top_ids[i], so->top_logprobs[i], &t));
        cJSON_AddItemToArray(content, e);
    }
    sbuf_free(&t);
    return o;
}

static bool parsing_tools(const gen_job *j) { return j->p.tools && j->p.tools->choice != TC_CHOICE_NONE; }

// One chunk of choice c with `delta` (taken) and, when lps, its logprobs.
static void chat_send_delta(gen_job *j, gen_choice *c, cJSON *d, bool lps, const char *finish) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    cJSON_AddItemToObject(ch, "delta", d);
    cJSON_AddItemToObject(ch, "logprobs", lps ? chat_logprobs_json(j, c) : cJSON_CreateNull());
    add_finish(j, c, ch, finish);
    send_choice(j, ch);
}

static void chat_stream_start(gen_job *j) {
    // OpenAI sends the role first, one chunk per choice.
    for (int i = 0; i < j->n_choices; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        chat_send_delta(j, &j->choices[i], d, false, NULL);
    }
}

// {"tool_calls": [one call's name (with its id) or argument text]}
static cJSON *tool_call_delta(const tc_delta_call *tc, bool name) {
    cJSON *d = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls");
    cJSON *call = cJSON_CreateObject();
    cJSON_AddNumberToObject(call, "index", tc->index);
    cJSON *fn;
    if (name) {  // the name first, with the call's id
        cJSON_AddStringToObject(call, "id", tc->id);
        cJSON_AddStringToObject(call, "type", "function");
        fn = cJSON_AddObjectToObject(call, "function");
        cJSON_AddStringToObject(fn, "name", tc->name);
        cJSON_AddStringToObject(fn, "arguments", "");
    } else {
        fn = cJSON_AddObjectToObject(call, "function");
        cJSON_AddStringToObject(fn, "arguments", sbuf_str(&tc->args));
    }
    cJSON_AddItemToArray(arr, call);
    return d;
}

// Streaming with tools: the parser decides what of the new text is content
// and what is a tool call. The logprobs go with the first chunk sent.
static void chat_stream_chunk_tools(gen_job *j, gen_choice *c, const char *finish) {
    tc_stream *s = tools_stream(j->p.tools, c->index);
    tc_delta td = {0};
    tc_stream_feed(s, c->delta.p ? c->delta.p : "", c->delta.len, finish != NULL, &td);
    bool lps_sent = false;
    if (td.content.len > 0) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "content", sbuf_str(&td.content));
        chat_send_delta(j, c, d, true, NULL);
        lps_sent = true;
    }
    for (int i = 0; i < td.n_calls; i++) {
        const tc_delta_call *tc = &td.calls[i];
        if (tc->name) {
            chat_send_delta(j, c, tool_call_delta(tc, true), !lps_sent, NULL);
            lps_sent = true;
        }
        if (tc->args.len > 0) {
            chat_send_delta(j, c, tool_call_delta(tc, false), !lps_sent, NULL);
            lps_sent = true;
        }
    }
    if (finish)
        chat_send_delta(j, c, cJSON_CreateObject(), !lps_sent,
                        finish_with_calls(finish, tc_stream_n_calls(s) > 0));
    tc_delta_free(&td);
}

static void chat_stream_chunk(gen_job *j, gen_choice *c, const char *finish) {
    if (parsing_tools(j)) {
        chat_stream_chunk_tools(j, c, finish);
        return;
    }
    cJSON *d = cJSON_CreateObject();
    if (c->delta.len > 0 || !finish) cJSON_AddStringToObject(d, "content", sbuf_str(&c->delta));
    chat_send_delta(j, c, d, true, finish);
}

static cJSON *chat_choice_json(gen_job *j, gen_choice *c) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    cJSON *m = cJSON_AddObjectToObject(ch, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    const char *finish = c->finish_reason;
    if (parsing_tools(j)) {
        char *content;
        cJSON *calls;
        tools_parse_output(j->p.tools, sbuf_str(&c->text), &content, &calls);
        if (content) cJSON_AddStringToObject(m, "content", content);
        else cJSON_AddNullToObject(m, "content");
        if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
        finish = finish_with_calls(finish, calls != NULL);
        free(content);
    } else {
        cJSON_AddStringToObject(m, "content", sbuf_str(&c->text));
    }
    cJSON_AddItemToObject(ch, "logprobs", chat_logprobs_json(j, c));
    add_finish(j, c, ch, finish);
    return ch;
}

static void chat_response(gen_job *j, cJSON *o) {
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < j->n_choices; i++) cJSON_AddItemToArray(chs, chat_choice_json(j, &j->choices[i]));
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    // vLLM puts a chat request's prompt logprobs on the response, not a choice.
    if (j->p.prompt_logprobs >= 0 && j->n_subs > 0)
        cJSON_AddItemToObject(o, "prompt_logprobs", prompt_logprobs_json(j, &j->subs[0], j->p.prompt_logprobs));
}

// --- completions -----------------------------------------------------------------

// One position's top_logprobs: token text -> logprob for the top n, then
// the token itself, each text once (the first wins).
static cJSON *cmpl_top_json(const gen_job *j, const int32_t *ids, const float *lps, int32_t n_top,
                            int32_t id, float lp, sbuf *t) {
    const pg_tokenizer *tok = j->app->tok;
    cJSON *top = cJSON_CreateObject();
    int n = top_count(j, n_top);
    for (int i = 0; i <= n; i++) {
        const char *s = token_str(tok, i < n ? ids[i] : id, t);
        if (!cJSON_GetObjectItemCaseSensitive(top, s))
            cJSON_AddNumberToObject(top, s, logprob_num(i < n ? lps[i] : lp));
    }
    return top;
}

// The echoed prompt's entries of the legacy logprobs (echo + logprobs):
// one per prompt token, the first with null logprob and null top_logprobs
// (nothing scores it), the others from the engine's prompt logprobs;
// text_offset counts the tokens' characters from 0, and c->fmt_offset
// continues from there for the generated tokens (vLLM's offsets).
static void cmpl_prompt_entries(gen_job *j, gen_choice *c, cJSON *toks, cJSON *lps, cJSON *tops,
                                cJSON *offs, sbuf *t) {
    const gen_sub *s = c->sub;
    int64_t off = 0;
    for (int32_t p = 0; p < s->n_ids; p++) {
        const pg_prompt_logprob *e = p > 0 && s->plp ? &s->plp[p] : NULL;
        cJSON_AddItemToArray(toks, cJSON_CreateString(token_str(j->app->tok, s->ids[p], t)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += utf8_chars(t->p ? t->p : "", t->len);
        if (!e) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(logprob_num(e->logprob)));
        cJSON_AddItemToArray(tops, cmpl_top_json(j, e->top_ids, e->top_logprobs, e->n_top, s->ids[p],
                                                 e->logprob, t));
    }
    c->fmt_offset = off;
}

// OpenAI's legacy logprobs object for c->lps[0..n_lps), after the echoed
// prompt's entries when `with_prompt`: tokens, token_logprobs,
// top_logprobs (token text -> logprob, the sampled token always included)
// and text_offset (characters into the choice's text).
static cJSON *cmpl_logprobs_json(gen_job *j, gen_choice *c, bool with_prompt) {
    if (j->p.logprobs < 0) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    sbuf t = {0};
    if (with_prompt) cmpl_prompt_entries(j, c, toks, lps, tops, offs, &t);
    for (int k = 0; k < c->n_lps; k++) {
        const pg_seq_output *so = &c->lps[k];
        cJSON_AddItemToArray(toks, cJSON_CreateString(token_str(j->app->tok, so->token, &t)));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(logprob_num(so->logprob)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)c->fmt_offset));
        c->fmt_offset += utf8_chars(t.p ? t.p : "", t.len);
        cJSON_AddItemToArray(tops, cmpl_top_json(j, so->top_ids, so->top_logprobs, so->n_top, so->token,
                                                 so->logprob, &t));
    }
    sbuf_free(&t);
    return o;
}

// with_prompt: the choice's text starts with the echoed prompt (its
// logprobs first, and prompt_logprobs when asked, as vLLM's first chunk).
static cJSON *cmpl_choice_json(gen_job *j, gen_choice *c, const char *text, const char *finish,
                               bool with_prompt) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    cJSON_AddStringToObject(ch, "text", text);
    cJSON_AddItemToObject(ch, "logprobs", cmpl_logprobs_json(j, c, with_prompt && j->p.echo));
    add_finish(j, c, ch, finish);
    // vLLM's field on the choice (never streamed: k > 0 is refused there).
    if (with_prompt && j->p.prompt_logprobs >= 0 && !j->p.stream)
        cJSON_AddItemToObject(ch, "prompt_logprobs", prompt_logprobs_json(j, c->sub, j->p.prompt_logprobs));
    return ch;
}

// Streamed echo: the prompt as the choice's first chunk, with its logprobs
// when asked (then it waits for the engine's first event, which brings them).
static void cmpl_send_echo(gen_job *j, gen_choice *c) {
    const char *text = c->sub->text ? c->sub->text : "";
    c->fmt_offset = utf8_chars(text, strlen(text));
    c->echo_sent = true;
    int saved = c->n_lps;
    c->n_lps = 0;
    cJSON *ch = cmpl_choice_json(j, c, text, NULL, true);
    c->n_lps = saved;
    send_choice(j, ch);
}

static void cmpl_stream_start(gen_job *j) {
    // Without logprobs every echo goes out now; with them each waits for its
    // prompt's logprobs (cmpl_stream_chunk).
    if (!j->p.echo || j->p.logprobs >= 0) return;
    for (int i = 0; i < j->n_choices; i++) cmpl_send_echo(j, &j->choices[i]);
}

static void cmpl_stream_chunk(gen_job *j, gen_choice *c, const char *finish) {
    if (j->p.echo && !c->echo_sent) cmpl_send_echo(j, c);
    send_choice(j, cmpl_choice_json(j, c, sbuf_str(&c->delta), finish, false));
}

static int cmp_rank(const void *a, const void *b) {
    const gen_choice *x = *(gen_choice *const *)a, *y = *(gen_choice *const *)b;
    if (x->cum_logprob != y->cum_logprob) return x->cum_logprob > y->cum_logprob ? -1 : 1;
    return x->index - y->index;
}

static void cmpl_response(gen_job *j, cJSON *o) {
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    sbuf text = {0};
    // best_of: per prompt, the n best of its best_of sequences, renumbered.
    int keep = j->n_subs > 0 ? j->n_choices / j->n_subs : 1;  // sequences per prompt
    gen_choice **order = pg_xmalloc(sizeof(gen_choice *) * (size_t)(j->n_choices > 0 ? j->n_choices : 1));
    for (int i = 0; i < j->n_choices; i++) order[i] = &j->choices[i];
    int want = j->best_n > 0 ? j->best_n : keep;
    if (want < keep)
        for (int s = 0; s < j->n_subs; s++) qsort(order + s * keep, (size_t)keep, sizeof *order, cmp_rank);
    for (int i = 0; i < j->n_choices; i++) {
        if (i % keep >= want) continue;
        gen_choice *c = order[i];
        c->index = i / keep * want + i % keep;
        sbuf_reset(&text);
        if (j->p.echo && c->sub->text) {
            sbuf_puts(&text, c->sub->text);
            c->fmt_offset = utf8_chars(c->sub->text, strlen(c->sub->text));
        }
        sbuf_append(&text, c->text.p ? c->text.p : "", c->text.len);
        cJSON_AddItemToArray(chs, cmpl_choice_json(j, c, sbuf_str(&text), c->finish_reason, true));
    }
    free(order);
    sbuf_free(&text);
    cJSON_AddItemToObject(o, "usage", usage_json(j));
}

// --- entry points ----------------------------------------------------------------

void api_format_stream_start(gen_job *j) {
    if (j->kind == API_CHAT) chat_stream_start(j);
    else cmpl_stream_start(j);
}

void api_format_stream_chunk(gen_job *j, gen_choice *c, const char *finish) {
    if (j->kind == API_CHAT) chat_stream_chunk(j, c, finish);
    else cmpl_stream_chunk(j, c, finish);
}

void api_format_stream_usage(gen_job *j) {
    cJSON *o = envelope(j);
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    send_chunk(j, o);
}

void api_format_response(gen_job *j, sbuf *out) {
    cJSON *o = envelope(j);
    if (j->kind == API_CHAT) chat_response(j, o);
    else cmpl_response(j, o);
    char *s = cJSON_PrintUnformatted(o);
    sbuf_puts(out, s);
    free(s);
    cJSON_Delete(o);
}
