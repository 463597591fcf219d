// text/tokenizer/tokenizer.h - text <-> token ids.
//
// Two model families:
//   - byte-level BPE (GPT-2 style: gpt2, llama3, qwen2, smollm/starcoder
//     pre-tokenizers), pre-tokenized with PCRE2 regexes (Unicode properties);
//   - SentencePiece-style BPE with byte fallback (Llama-2, Mistral).
// Added/special tokens are matched in the text before BPE runs.
// Loaded from GGUF metadata or from a Hugging Face tokenizer.json.
//
// A loaded tokenizer is immutable: every function taking a const
// pg_tokenizer * may run on any number of threads at once (encode keeps its
// scratch per call). Design and known differences: docs/tokenizer.md.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;
typedef struct pg_tokenizer pg_tokenizer;

typedef enum { PG_TOK_BPE_BYTE = 0, PG_TOK_SPM = 1 } pg_tok_kind;

// Builds a tokenizer from tokenizer.ggml.* metadata (model "gpt2" or
// "llama"; the pre-tokenizer from tokenizer.ggml.pre). Copies what it needs:
// `f` may be closed afterwards. On failure returns PG_ENOTFOUND (missing
// key), PG_EFORMAT (malformed arrays), PG_EUNSUPP (another model or an
// unknown pre-tokenizer) or PG_ENOMEM, with *out NULL and nothing leaked.
int pg_tokenizer_from_gguf(const struct gguf_file *f, pg_tokenizer **out);
// `tokenizer_json_path`: tokenizer.json; `config_path`: tokenizer_config.json
// (may be NULL) for add_bos_token / special token names. A BPE model with a
// ByteLevel pre-tokenizer or decoder is byte-level BPE (Split / Digits /
// ByteLevel stages, regexes compiled as written); one with byte_fallback or
// a Metaspace / Prepend+Replace('▁') rule is SPM-style. Anything else
// (Unigram, WordPiece, other normalizers) is PG_EUNSUPP, not approximated.
int pg_tokenizer_from_hf(const char *tokenizer_json_path, const char *config_path,
                         pg_tokenizer **out);
// The same from JSON texts in memory (`config_json` may be NULL); `name`
// labels error messages. The texts need not be NUL-terminated.
int pg_tokenizer_from_hf_memory(const char *json, size_t len, const char *config_json,
                                size_t config_len, const char *name, pg_tokenizer **out);
void pg_tokenizer_free(pg_tokenizer *t);  // NULL is a no-op

pg_tok_kind pg_tokenizer_kind(const pg_tokenizer *t);
int32_t pg_tokenizer_vocab_size(const pg_tokenizer *t);
int32_t pg_tokenizer_bos(const pg_tokenizer *t);   // -1 when none
int32_t pg_tokenizer_eos(const pg_tokenizer *t);   // -1 when none
bool pg_tokenizer_add_bos(const pg_tokenizer *t);  // prepend BOS by default
// True for control/special tokens (skipped by skip_special_tokens).
bool pg_tokenizer_is_special(const pg_tokenizer *t, int32_t id);
// The id of an exact vocabulary string (e.g. "<|im_end|>"; byte-level BPE
// spells spaces 'Ġ', SPM '▁'), or -1.
int32_t pg_tokenizer_find(const pg_tokenizer *t, const char *piece);
// An upper bound on what one token decodes to: the longest
// pg_tokenizer_token_bytes, with ill-formed bytes counted as the 3 bytes of
// U+FFFD, so `64 + pg_tokenizer_max_token_bytes()` is always a large enough
// cap for pg_detok_feed.
int32_t pg_tokenizer_max_token_bytes(const pg_tokenizer *t);
// The pre-tokenizer in use, for logs: a GGUF tokenizer.ggml.pre name
// ("smollm", "llama-bpe"...), a family recognised in tokenizer.json, or
// "custom"; "" for SPM.
const char *pg_tokenizer_pre_name(const pg_tokenizer *t);

// Encodes `len` bytes of UTF-8 text. `add_bos` prepends BOS when the model
// has one; `parse_special` matches special-token text ("<|im_start|>") as
// those tokens, otherwise it is encoded as plain text (user-defined added
// tokens are matched either way, as llama.cpp and HF do). Invalid UTF-8 is
// encoded byte by byte, never rejected; a byte the vocabulary has no token
// for becomes the unknown token, or is dropped when there is none (HF). Text
// may contain NULs. Writes up to `cap` ids into `ids` (may be NULL when cap
// is 0) and returns the total count needed (call again with a larger buffer
// when the return exceeds cap), or a negative error (PG_EINVAL for bad
// arguments or text over INT_MAX / 4 bytes, PG_ENOMEM).
int pg_tokenizer_encode(const pg_tokenizer *t, const char *text, size_t len, bool add_bos,
                        bool parse_special, int32_t *ids, int cap);
// pg_tokenizer_encode into an array it allocates: on success returns the
// count n >= 0 and sets *ids_out to a malloc'd array of n ids (never NULL,
// even for n == 0), which the caller frees with free(); the ids are exactly
// what pg_tokenizer_encode gives for the same arguments. On error returns
// pg_tokenizer_encode's negative error (message set) with *ids_out NULL.
// Usually one encode pass: the first guess (len + 16 ids) is enough for
// most texts, and a second pass at the exact size covers the rest.
int pg_tokenizer_encode_alloc(const pg_tokenizer *t, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t **ids_out);

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
// >= 64 + pg_tokenizer_max_token_bytes()). Returns bytes appended (the text
// itself may hold NULs that were in the encoded text) or negative on error:
// PG_EINVAL for an id outside the vocabulary. With skip_special, control
// and unknown tokens (pg_tokenizer_is_special) produce nothing.
// Bytes that can never form a character (ill-formed UTF-8) come out as
// U+FFFD, one per maximal ill-formed subpart, so every chunk is valid UTF-8.
// A chunk never exceeds 3 + pg_tokenizer_max_token_bytes() bytes; a cap too
// small for it gives PG_ENOSPC with `d` unchanged.
// Thread-safe for distinct `d` on a shared tokenizer.
int pg_detok_feed(pg_detok *d, int32_t id, char *out, int cap);
// Flushes held-back bytes at the end of a sequence as U+FFFD replacements.
int pg_detok_flush(pg_detok *d, char *out, int cap);

// Full decode into a malloc'd NUL-terminated string (caller frees): exactly
// the concatenation of pg_detok_feed over `ids` and a final pg_detok_flush.
// Returns 0, or negative (with *out NULL) for an id outside the vocabulary.
int pg_tokenizer_decode(const pg_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                        char **out);

// A byte-level tokenizer covering `vocab` ids: ids 0..255 are the 256 bytes
// (GPT-2's byte-to-unicode alphabet, no merges), ids 256.. decode to the
// text "<tN>" and are never produced by encoding. Honest about what it is:
// text round-trips byte by byte; a dummy model's output ids print as <tN>.
int pg_tokenizer_synthetic_bytes(int32_t vocab, pg_tokenizer **out);
