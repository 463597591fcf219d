// tests/fuzz/fuzz_tokenizer.c - fuzz target for encode / decode / detok.
//
// Input: byte 0 picks the mode, the tokenizer and the flags; the rest is the
// text (arbitrary bytes: invalid UTF-8, NULs, special-token text...), or,
// in the loader modes (byte 0 & 0x60), a tokenizer.json text or a GGUF image
// that is loaded and, when it loads, used to encode and decode a fixed text
// (loader errors must leave nothing behind: ASan/LSan watch).
// Tokenizers: two small ones built in memory (byte-level BPE with a
// digits+ByteLevel pre-tokenizer and special tokens; SPM-style BPE with byte
// fallback), or the GGUF / tokenizer.json named by $PG_FUZZ_TOKENIZER.
// Checked on every input:
//   - encode succeeds, is deterministic, reports the same count for any cap,
//     and writes only ids inside the vocabulary;
//   - incremental detok chunks are valid UTF-8 and concatenate to the full
//     decode;
//   - built-in tokenizers, parse_special off: the token bytes concatenate to
//     exactly the input (byte-level) or ' ' + input (SPM): nothing lost.
// Built with the standalone driver (build/fuzz/fuzz_tokenizer) and with
// libFuzzer (build/fuzz/libfuzzer_tokenizer).
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "formats/gguf.h"
#include "text/tokenizer/tokenizer.h"

#define CHECK(c)                                                                          \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "fuzz_tokenizer: %s:%d: %s (%s)\n", __FILE__, __LINE__, #c,   \
                    pg_err_msg());                                                        \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

// --- built-in tokenizers ----------------------------------------------------------

// GPT-2 byte alphabet: the printable Latin-1 bytes stand for themselves.
static int put_alpha(unsigned b, char *o) {
    unsigned cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        unsigned k = 0;
        for (unsigned i = 0; i < b; i++)
            k += !((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174);
        cp = 256 + k;
    }
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static void alpha(const char *raw, size_t n, char *out) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) w += (size_t)put_alpha((unsigned char)raw[i], out + w);
    out[w] = '\0';
}

// SPM text: ' ' -> '▁'.
static void meta(const char *raw, size_t n, char *out) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (raw[i] == ' ') {
            memcpy(out + w, "\xe2\x96\x81", 3);
            w += 3;
        } else {
            out[w++] = raw[i];
        }
    }
    out[w] = '\0';
}

static const char *const words[] = {"the", " the", "in", "ing", " a", "er", "  ", "    ", "\n\n", "ab",
                                    "abc", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "12", "<|",
                                    "'s", " world", "hello"};

// Adds merges building each word left to right, and the needed vocab entries.
static void add_word_merges(cJSON *vocab, cJSON *merges, int *next_id, bool spm) {
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
        const char *s = words[w];
        size_t n = strlen(s);
        char left[64], right[64], both[64];
        // Units: bytes for byte-level, characters for SPM (all here are UTF-8).
        size_t cut = 0;
        for (size_t i = 1; i <= n; i++) {
            if (spm && i < n && ((unsigned char)s[i] & 0xC0) == 0x80) continue;
            if (cut == 0) {
                cut = i;
                if (spm && !cJSON_GetObjectItemCaseSensitive(vocab, (meta(s, cut, left), left)))
                    cJSON_AddNumberToObject(vocab, left, (*next_id)++);
                continue;
            }
            if (spm) {
                meta(s, cut, left), meta(s + cut, i - cut, right), meta(s, i, both);
            } else {
                alpha(s, cut, left), alpha(s + cut, i - cut, right), alpha(s, i, both);
            }
            if (spm && !cJSON_GetObjectItemCaseSensitive(vocab, right))
                cJSON_AddNumberToObject(vocab, right, (*next_id)++);
            if (!cJSON_GetObjectItemCaseSensitive(vocab, both))
                cJSON_AddNumberToObject(vocab, both, (*next_id)++);
            char m[200];
            snprintf(m, sizeof m, "%s %s", left, right);
            cJSON_AddItemToArray(merges, cJSON_CreateString(m));
            cut = i;
        }
    }
}

static void add_token(cJSON *added, int id, const char *s, bool special) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", id);
    cJSON_AddStringToObject(t, "content", s);
    cJSON_AddBoolToObject(t, "special", special);
    cJSON_AddItemToArray(added, t);
}

static pg_tokenizer *build(bool spm) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    int id = 0;
    char buf[64];
    if (spm) {
        cJSON_AddNumberToObject(vocab, "<unk>", id++);
        cJSON_AddNumberToObject(vocab, "<s>", id++);
        cJSON_AddNumberToObject(vocab, "</s>", id++);
        for (int b = 0; b < 256; b++) {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            cJSON_AddNumberToObject(vocab, buf, id++);
        }
        cJSON_AddNumberToObject(vocab, "\xe2\x96\x81", id++);
    } else {
        for (int b = 0; b < 256; b++) {
            buf[put_alpha((unsigned)b, buf)] = '\0';
            cJSON_AddNumberToObject(vocab, buf, id++);
        }
    }
    add_word_merges(vocab, merges, &id, spm);
    if (spm) {
        add_token(added, 0, "<unk>", true);
        add_token(added, 1, "<s>", true);
        add_token(added, 2, "</s>", true);
    } else {
        add_token(added, id++, "<|s|>", true);
        add_token(added, id++, "<|s|>x", true);  // overlapping: longest wins
        add_token(added, id++, "<u>", false);    // user-defined: always matched
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddBoolToObject(model, "byte_fallback", spm);
    if (spm) cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens", added);
    if (spm) {
        const char *n = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                        "\"\xe2\x96\x81\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                        "\"content\": \"\xe2\x96\x81\"}]}";
        cJSON_AddItemToObject(root, "normalizer", cJSON_Parse(n));
        cJSON_AddNullToObject(root, "pre_tokenizer");
    } else {
        const char *p = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
                        "\"individual_digits\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                        "false, \"use_regex\": true}]}";
        cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(p));
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    const char *cfg = spm ? "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_bos_token\": true}"
                          : "{\"bos_token\": \"<|s|>\", \"eos_token\": \"<|s|>\"}";
    pg_tokenizer *t = NULL;
    int rc = pg_tokenizer_from_hf_memory(json, strlen(json), cfg, strlen(cfg), "builtin", &t);
    free(json);
    CHECK(rc == 0);
    return t;
}

static pg_tokenizer *builtin[2];
static pg_tokenizer *external;
static gguf_file *external_gguf;

static void init_once(void) {
    static bool done;
    if (done) return;
    done = true;
    pg_log_set_level(PG_LOG_ERROR);  // loader warnings on mutated files are noise
    builtin[0] = build(false);
    builtin[1] = build(true);
    const char *path = getenv("PG_FUZZ_TOKENIZER");
    if (path && *path) {
        size_t n = strlen(path);
        int rc;
        if (n > 5 && strcmp(path + n - 5, ".gguf") == 0) {
            rc = gguf_open(path, &external_gguf);
            if (rc == 0) rc = pg_tokenizer_from_gguf(external_gguf, &external);
        } else {
            rc = pg_tokenizer_from_hf(path, NULL, &external);
        }
        CHECK(rc == 0);
    }
}

// --- checks -----------------------------------------------------------------------

static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (i + len > n) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

// Loader modes: the input is a tokenizer.json text (0x20) or a GGUF image (0x40).
static void fuzz_loader(uint8_t sel, const uint8_t *data, size_t size) {
    pg_tokenizer *t = NULL;
    gguf_file *f = NULL;
    int rc;
    if (sel & 0x20) {
        rc = pg_tokenizer_from_hf_memory((const char *)data, size, NULL, 0, "fuzz", &t);
    } else {
        rc = gguf_open_memory(data, size, "fuzz", &f);
        if (rc == 0) rc = pg_tokenizer_from_gguf(f, &t);
    }
    CHECK((rc == 0) == (t != NULL));
    if (t) {
        static const char text[] = "Hello world <s> 123 \xe4\xb8\xad\xf0\x9f\x98\x80 \xff <|im_start|>";
        int32_t ids[256];
        int n = pg_tokenizer_encode(t, text, sizeof text - 1, true, sel & 2, ids, 256);
        CHECK(n >= 0 && n <= 256);
        for (int i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < pg_tokenizer_vocab_size(t));
        char *out = NULL;
        CHECK(pg_tokenizer_decode(t, ids, n, sel & 16, &out) == 0);
        free(out);
        pg_tokenizer_free(t);
    }
    gguf_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init_once();
    if (size == 0) return 0;
    uint8_t sel = data[0];
    if (sel & 0x60) {
        fuzz_loader(sel, data + 1, size - 1);
        return 0;
    }
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int which = sel & 1;
    pg_tokenizer *t = (sel & 8) && external ? external : builtin[which];
    bool exact = t != external;
    bool parse_special = sel & 2, add_bos = sel & 4, skip_special = sel & 16;
    int32_t n_vocab = pg_tokenizer_vocab_size(t);

    int n = pg_tokenizer_encode(t, text, len, add_bos, parse_special, NULL, 0);
    CHECK(n >= 0);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    CHECK(pg_tokenizer_encode(t, text, len, add_bos, parse_special, ids, n) == n);
    for (int i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < n_vocab);
    if (n > 1) {  // a short buffer: same count, same prefix
        int32_t part[1];
        CHECK(pg_tokenizer_encode(t, text, len, add_bos, parse_special, part, 1) == n);
        CHECK(part[0] == ids[0]);
    }

    // Lossless: the token bytes are the input (SPM: with its ' ' prefix; an
    // input holding '▁' itself decodes to ' ', as in every SPM model).
    if (exact && !parse_special && !(which == 1 && memmem(text, len, "\xe2\x96\x81", 3))) {
        size_t cap = 3 * len + 64, w = 0;
        char *cat = malloc(cap);
        int first = add_bos && n > 0 ? 1 : 0;
        for (int i = first; i < n; i++) {
            int r = pg_tokenizer_token_bytes(t, ids[i], cat + w, (int)(cap - w));
            CHECK(r >= 0 && (size_t)r <= cap - w);
            w += (size_t)r;
        }
        if (which == 1 && len > 0) {
            CHECK(w == len + 1 && cat[0] == ' ' && memcmp(cat + 1, text, len) == 0);
        } else {
            CHECK(w == len && memcmp(cat, text, len) == 0);
        }
        free(cat);
    }

    // Incremental detokenization equals the full decode; chunks are UTF-8.
    int cap = pg_tokenizer_max_token_bytes(t) + 64;
    char *chunk = malloc((size_t)cap);
    size_t acc_cap = 3 * len + 3 * (size_t)n * (size_t)(pg_tokenizer_max_token_bytes(t) + 4) + 16, w = 0;
    char *acc = malloc(acc_cap);
    pg_detok d;
    pg_detok_init(&d, t, skip_special);
    for (int i = 0; i <= n; i++) {
        int r = i < n ? pg_detok_feed(&d, ids[i], chunk, cap) : pg_detok_flush(&d, chunk, cap);
        CHECK(r >= 0 && r <= 3 + pg_tokenizer_max_token_bytes(t) && chunk[r] == '\0');
        CHECK(valid_utf8((const unsigned char *)chunk, (size_t)r));
        CHECK(w + (size_t)r <= acc_cap);
        memcpy(acc + w, chunk, (size_t)r);
        w += (size_t)r;
    }
    char *full = NULL;
    CHECK(pg_tokenizer_decode(t, ids, n, skip_special, &full) == 0);
    CHECK(memcmp(full, acc, w) == 0 && full[w] == '\0');
    free(full);
    free(acc);
    free(chunk);
    free(ids);
    return 0;
}
