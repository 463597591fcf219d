// server/api_format.h - the OpenAI JSON of a generation: the whole
// response bodies of /v1/chat/completions (chat.completion) and
// /v1/completions (text_completion), and the streamed chunks of both
// (chat.completion.chunk / text_completion).
//
// One formatter for both routes, streamed or not, so the envelope (id,
// object, created, model), the choices (text, or message / delta), each
// route's logprobs shape, finish_reason / stop_reason and usage are written
// in one place. It reads a gen_job (server/gen_job.h) and picks the route's
// shape from j->kind; the job decides when a chunk or the body is due.
#pragma once
#include <stdint.h>

#include "server/gen_job.h"
#include "server/sbuf.h"
#include "text/tokenizer/tokenizer.h"

// Streamed: what follows the event-stream headers. Chat: one role chunk per
// choice; completions with echo and without logprobs: each echoed prompt
// (with logprobs it waits for the engine's first event, which brings them).
void api_format_stream_start(gen_job *j);

// Streamed: the chunk(s) for choice `c` with c->delta and c->lps[0..n_lps);
// `finish` is the finish reason when the choice ended with this event, else
// NULL. Chat with tools sends content, tool-call name and argument chunks
// as the parser finds them. Sent on j->req.
void api_format_stream_chunk(gen_job *j, gen_choice *c, const char *finish);

// Streamed: the last chunk before [DONE] for stream_options.include_usage
// (empty choices, usage).
void api_format_stream_usage(gen_job *j);

// The whole response body (200) once every choice has finished. Completions
// with best_of keep the n best choices per prompt and renumber them (their
// c->index changes).
void api_format_response(gen_job *j, sbuf *out);

// A token's text for logprobs and /tokenize's token_strs: its bytes, with
// ill-formed UTF-8 replaced by U+FFFD (appended to `out`).
void api_format_token_text(const pg_tokenizer *t, int32_t id, sbuf *out);
