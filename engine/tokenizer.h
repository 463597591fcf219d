// engine/tokenizer.h - text <-> token ids.
//
// Two model families:
//   - byte-level BPE (GPT-2 style: gpt2, llama3, qwen2, smollm/starcoder
//     pre-tokenizers), pre-tokenized with PCRE2 regexes (Unicode properties);
//   - SentencePiece-style BPE with byte fallback (Llama-2, Mistral).
// Added/special tokens are matched in the text before BPE runs.
// Loaded from GGUF metadata or from a Hugging Face tokenizer.json.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;
typedef struct pg_tokenizer pg_tokenizer;

typedef enum { PG_TOK_BPE_BYTE = 0, PG_TOK_SPM = 1 } pg_tok_kind;

int pg_tokenizer_from_gguf(const struct gguf_file *f, pg_tokenizer **out);
// `tokenizer_json_path`: tokenizer.json; `config_path`: tokenizer_config.json
// (may be NULL) for add_bos_token / special token names.
int pg_tokenizer_from_hf(const char *tokenizer_json_path, const char *config_path,
                         pg_tokenizer **out);
void pg_tokenizer_free(pg_tokenizer *t);

pg_tok_kind pg_tokenizer_kind(const pg_tokenizer *t);
int32_t pg_tokenizer_vocab_size(const pg_tokenizer *t);
int32_t pg_tokenizer_bos(const pg_tokenizer *t);   // -1 when none
int32_t pg_tokenizer_eos(const pg_tokenizer *t);   // -1 when none
bool pg_tokenizer_add_bos(const pg_tokenizer *t);  // prepend BOS by default
// True for control/special tokens (skipped by skip_special_tokens).
bool pg_tokenizer_is_special(const pg_tokenizer *t, int32_t id);
// The id of an exact token string (e.g. "<|im_end|>"), or -1.
int32_t pg_tokenizer_find(const pg_tokenizer *t, const char *piece);

// Encodes `len` bytes of UTF-8 text. `add_bos` prepends BOS when the model
// has one; `parse_special` matches special-token text ("<|im_start|>") as
// those tokens, otherwise it is encoded as plain text. Invalid UTF-8 is
// encoded byte by byte, never rejected. Writes up to `cap` ids into `ids`
// and returns the total count needed (call again with a larger buffer when
// the return exceeds cap), or a negative error.
int pg_tokenizer_encode(const pg_tokenizer *t, const char *text, size_t len, bool add_bos,
                        bool parse_special, int32_t *ids, int cap);

// The bytes a token decodes to (byte-level BPE: Ġ -> space etc., SPM: ▁ ->
// space, <0xAB> -> byte 0xAB). May be a partial UTF-8 sequence. Returns the
// byte count written (<= cap) or the needed size if larger than cap; a
// negative error for an id outside the vocabulary.
int pg_tokenizer_token_bytes(const pg_tokenizer *t, int32_t id, char *buf, int cap);

// Incremental detokenizer: feed ids one at a time and get only complete
// UTF-8 text out; a character split across tokens is held back until it is
// complete. Matches a full decode of the same ids.
typedef struct {
    const pg_tokenizer *tok;
    bool skip_special;
    bool first;           // SPM: strip the leading space of the first piece
    char pending[8];      // bytes of an incomplete UTF-8 character
    int n_pending;
} pg_detok;

void pg_detok_init(pg_detok *d, const pg_tokenizer *t, bool skip_special);
// Appends the newly complete text for `id` to `out` (NUL-terminated; `cap`
// >= 64 + the longest token). Returns bytes appended or negative on error.
int pg_detok_feed(pg_detok *d, int32_t id, char *out, int cap);
// Flushes held-back bytes at the end of a sequence as U+FFFD replacements.
int pg_detok_flush(pg_detok *d, char *out, int cap);

// Full decode into a malloc'd NUL-terminated string (caller frees).
int pg_tokenizer_decode(const pg_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                        char **out);
