// text/tokenizer/tokenizer_int.h - internals shared by the tokenizer's source files.
//
// Not a public header: only text/tokenizer/tokenizer*.c include it.
//   tokenizer_build.c  building a pg_tokenizer: vocabulary, lookup tables,
//                      merges, pre-tokenizer regexes; UTF-8 helpers
//   tokenizer_load.c   the GGUF and tokenizer.json loaders
//   tokenizer.c        encode, decode, incremental detokenization
// A loader fills a pg_tokenizer through pg_tok_* and finishes it with
// pg_tok_finalize(); after that the object is read-only and every encode or
// decode call may run on any thread at the same time (scratch is per call).
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer/tokenizer.h"

// Token types, numbered as GGUF's tokenizer.ggml.token_type.
enum {
    PG_TOK_T_UNDEF = 0,        // a hole in the id space (tokenizer.json)
    PG_TOK_T_NORMAL = 1,
    PG_TOK_T_UNKNOWN = 2,
    PG_TOK_T_CONTROL = 3,
    PG_TOK_T_USER_DEFINED = 4,
    PG_TOK_T_UNUSED = 5,
    PG_TOK_T_BYTE = 6,
};

// Per-token flags (added tokens of tokenizer.json).
enum {
    PG_TOK_F_LSTRIP = 1,       // absorb ASCII whitespace to the left when matched
    PG_TOK_F_RSTRIP = 2,       // absorb ASCII whitespace to the right when matched
};

// Pre-tokenizer families recognised by name (GGUF tokenizer.ggml.pre) or by
// the shape of a tokenizer.json pre_tokenizer.
typedef enum {
    PG_TOK_PRE_NONE = 0,       // SPM: no pre-tokenization
    PG_TOK_PRE_GPT2,
    PG_TOK_PRE_LLAMA3,
    PG_TOK_PRE_QWEN2,
    PG_TOK_PRE_SMOLLM,         // starcoder, smollm, refact...: digits isolated, then gpt2
    PG_TOK_PRE_CUSTOM,         // regexes taken from tokenizer.json as they are
} pg_tok_pre;

#define PG_TOK_MAX_STAGES 8

// SPM: where '▁' is prepended (add_space_prefix / Metaspace prepend_scheme).
typedef enum {
    PG_TOK_PREFIX_NEVER = 0,
    PG_TOK_PREFIX_FIRST,       // only before text at the very start
    PG_TOK_PREFIX_ALWAYS,      // at the start and after every matched special token
} pg_tok_prefix;

// One pre-tokenizer stage: every match of `re` and every gap between
// matches becomes a piece (the "Isolated" split behaviour of HF tokenizers).
typedef struct {
    pcre2_code *re;
} pg_tok_stage;

// Open-addressing map from a token's vocabulary text to its id. The capacity
// is a power of two; an empty slot holds id -1.
typedef struct {
    int32_t *ids;              // [cap]
    uint32_t *hash;            // [cap] low 32 bits of the key's hash
    uint32_t cap;
} pg_tok_strmap;

// Open-addressing map from an ordered id pair to a merge.
typedef struct {
    uint64_t key;              // (left << 32) | right; PG_TOK_PAIR_EMPTY when free
    int32_t rank;              // position in the merges list (lower merges first)
    int32_t merged;            // id of the concatenation
} pg_tok_pair;
#define PG_TOK_PAIR_EMPTY UINT64_MAX

typedef struct {
    pg_tok_pair *slots;        // [cap]
    uint32_t cap;
    uint32_t count;
} pg_tok_pairmap;

struct pg_tokenizer {
    pg_tok_kind kind;
    int32_t n_vocab;

    // Token text as stored in the vocabulary (byte-level alphabet for BPE,
    // '▁' for spaces in SPM): token i is text[text_off[i] .. +text_len[i]).
    char *text;                // pool
    uint32_t *text_off;        // [n_vocab]
    uint32_t *text_len;        // [n_vocab]
    size_t text_used, text_cap;

    // What each token decodes to (raw bytes, possibly partial UTF-8).
    char *dec;                 // pool
    uint32_t *dec_off;         // [n_vocab]
    uint32_t *dec_len;         // [n_vocab]
    int32_t max_dec_len;       // >= every dec_len; also >= a token's bytes with each
                               // ill-formed subpart counted as U+FFFD (3 bytes)

    float *scores;             // [n_vocab] SPM merge priority (higher first)
    uint8_t *type;             // [n_vocab] PG_TOK_T_*
    uint8_t *flags;            // [n_vocab] PG_TOK_F_*

    pg_tok_strmap vocab;       // token text -> id (the last id wins on duplicates)
    pg_tok_pairmap merges;     // (left id, right id) -> rank, merged id
    bool merge_by_score;       // SPM from GGUF: merge the adjacent pair whose
                               // concatenation is the best-scoring token
    bool ignore_merges;        // a piece that is itself a token is emitted whole
    bool byte_fallback;        // characters outside the vocabulary become <0xXX>

    // Byte-level BPE: id of the token of each byte's alphabet character.
    // SPM: id of <0xXX>. -1 where the vocabulary lacks it.
    int32_t byte_id[256];

    // Tokens matched in the raw text before BPE (control, user-defined,
    // unknown), sorted by first byte, then by length descending:
    // special_ids[special_first[b] .. special_first[b + 1]) start with byte b.
    int32_t *special_ids;
    int32_t n_special;
    int32_t special_first[257];

    pg_tok_pre pre;
    char pre_name[64];
    pg_tok_stage stages[PG_TOK_MAX_STAGES];
    int n_stages;
    bool prefix_space;         // byte-level: ' ' before every text fragment
                               // not starting with one (ByteLevel add_prefix_space)

    pg_tok_prefix spm_prefix;  // SPM: when '▁' is prepended to a text fragment
    bool add_bos_default;
    int32_t bos, eos, unk, pad;
    int32_t unk_fallback;      // what a character/byte without a token becomes:
                               // the model's unknown token, or -1 to drop it
                               // (GGUF files often name <|endoftext|> as unk)
};

// --- building (tokenizer_build.c) -------------------------------------------

// Allocates an empty tokenizer of `n_vocab` tokens, all PG_TOK_T_UNDEF with
// empty text. Free it with pg_tokenizer_free.
int pg_tok_alloc(pg_tok_kind kind, int32_t n_vocab, pg_tokenizer **out);
// Sets the vocabulary text (copied) and the type of token `id`.
int pg_tok_set_token(pg_tokenizer *t, int32_t id, const char *text, size_t len, int type);
// Compiles the pre-tokenizer stages of a known family (replacing any).
int pg_tok_set_pre_family(pg_tokenizer *t, pg_tok_pre family, const char *name);
// Appends a stage with a regex in the Oniguruma/PCRE syntax of tokenizer.json.
int pg_tok_add_stage(pg_tokenizer *t, const char *pattern, size_t len);
// Builds the text map, byte table, decode table and special-token index. Call
// once every token is set, before pg_tok_add_merge.
int pg_tok_finalize_vocab(pg_tokenizer *t);
// Reserves room for `n` merges.
int pg_tok_reserve_merges(pg_tokenizer *t, size_t n);
// Adds the merge of rank `rank` of two token texts. Returns 1 when added, 0
// when skipped (a part or the result is not a token, or a duplicate pair: the
// first rank wins), negative on allocation failure.
int pg_tok_add_merge(pg_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                     int32_t rank);
// Final consistency checks; call last.
int pg_tok_finalize(pg_tokenizer *t);

// A token by its vocabulary text; -1 when absent. Thread-safe after
// pg_tok_finalize_vocab.
int32_t pg_tok_lookup(const pg_tokenizer *t, const char *s, size_t len);
// The merge of an id pair, or NULL.
const pg_tok_pair *pg_tok_merge_find(const pg_tokenizer *t, int32_t left, int32_t right);

// Pre-tokenizer family of a GGUF tokenizer.ggml.pre name; PG_TOK_PRE_NONE
// when the name is unknown. Sets *ignore_merges and *add_bos to the family's
// defaults.
pg_tok_pre pg_tok_pre_from_name(const char *name, bool *ignore_merges, bool *add_bos);

// The single regex of the gpt2 / llama3 / qwen2 families ("" for others),
// exactly as their tokenizer.json files write it; and a family's name.
const char *pg_tok_family_regex(pg_tok_pre family);
const char *pg_tok_pre_family_name(pg_tok_pre family);

// --- UTF-8 helpers (tokenizer_build.c) -------------------------------------

// Classifies the bytes at s[0 .. n), n > 0:
//   k > 0  a well-formed character of k bytes;
//   0      a truncated but so far well-formed sequence (more bytes may finish it);
//   -k     ill-formed: the first k bytes are a maximal ill-formed subpart,
//          replaced by one U+FFFD (Unicode "maximal subpart" practice).
int pg_tok_utf8_next(const unsigned char *s, size_t n);
// The byte-level BPE alphabet (GPT-2): byte -> code point and back (-1 when
// the code point is not in the alphabet).
uint32_t pg_tok_byte_to_cp(uint8_t b);
int pg_tok_cp_to_byte(uint32_t cp);
// Writes code point cp (< 0x110000) as UTF-8; returns the length 1..4.
int pg_tok_utf8_put(uint32_t cp, char *buf);
