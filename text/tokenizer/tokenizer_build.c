// text/tokenizer/tokenizer_build.c - building a pg_tokenizer: vocabulary, lookup
// tables, merges and pre-tokenizer regexes; UTF-8 helpers.
//
// The loaders (tokenizer_load.c) only translate a file format into calls
// here, so both formats end up with identical tables.
#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/err.h"
#include "common/log.h"
#include "text/tokenizer/tokenizer_int.h"

// --- UTF-8 and the byte-level alphabet --------------------------------------

int pg_tok_utf8_next(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;      // no overlong forms
        if (c == 0xED) hi = 0x9F;      // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;      // no overlong forms
        if (c == 0xF4) hi = 0x8F;      // nothing above U+10FFFF
    } else {
        return -1;                     // continuation byte, C0, C1, F5..FF
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        if (b < lo || b > hi) return -i;
        lo = 0x80;
        hi = 0xBF;
    }
    return len;
}

int pg_tok_utf8_put(uint32_t cp, char *buf) {
    unsigned char *o = (unsigned char *)buf;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

// GPT-2's reversible byte -> printable character map: the printable bytes of
// Latin-1 stand for themselves, the other 68 bytes take code points 256.. in
// byte order.
static bool byte_is_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

// The non-printable bytes, in order, are 0..32, 127..160 and 173.
uint32_t pg_tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33u + (b - 127u);
    return 256u + 67u;  // 173
}

int pg_tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    uint32_t k = cp - 256;
    if (k <= 32) return (int)k;
    if (k <= 66) return (int)(127 + k - 33);
    if (k == 67) return 173;
    return -1;
}

// Decodes one code point from well-formed UTF-8 (len from pg_tok_utf8_next).
static uint32_t utf8_cp(const unsigned char *s, int len) {
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

// --- allocation -------------------------------------------------------------

int pg_tok_alloc(pg_tok_kind kind, int32_t n_vocab, pg_tokenizer **out) {
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > (INT32_MAX / 4))
        return pg_err_set(PG_EFORMAT, "tokenizer: bad vocabulary size %d", (int)n_vocab);
    pg_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->text_off = calloc((size_t)n_vocab, sizeof *t->text_off);
    t->text_len = calloc((size_t)n_vocab, sizeof *t->text_len);
    t->dec_off = calloc((size_t)n_vocab, sizeof *t->dec_off);
    t->dec_len = calloc((size_t)n_vocab, sizeof *t->dec_len);
    t->scores = calloc((size_t)n_vocab, sizeof *t->scores);
    t->type = calloc((size_t)n_vocab, sizeof *t->type);
    t->flags = calloc((size_t)n_vocab, sizeof *t->flags);
    if (!t->text_off || !t->text_len || !t->dec_off || !t->dec_len || !t->scores || !t->type ||
        !t->flags) {
        pg_tokenizer_free(t);
        return pg_err_set(PG_ENOMEM, "tokenizer: out of memory for %d tokens", (int)n_vocab);
    }
    t->bos = t->eos = t->unk = t->pad = t->unk_fallback = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    *out = t;
    return PG_OK;
}

void pg_tokenizer_free(pg_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_stages; i++) pcre2_code_free(t->stages[i].re);
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    free(t->scores);
    free(t->type);
    free(t->flags);
    free(t->vocab.ids);
    free(t->vocab.hash);
    free(t->merges.slots);
    free(t->special_ids);
    free(t);
}

// Appends n bytes to a growing pool; *off receives their offset.
static int pool_append(char **pool, size_t *used, size_t *cap, const char *s, size_t n,
                       uint32_t *off) {
    if (*used + n > UINT32_MAX)
        return pg_err_set(PG_EFORMAT, "tokenizer: vocabulary text larger than 4 GiB");
    if (*used + n > *cap) {
        size_t nc = *cap ? *cap : 4096;
        while (nc < *used + n) nc *= 2;
        char *p = realloc(*pool, nc);
        if (!p) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
        *pool = p;
        *cap = nc;
    }
    if (n) memcpy(*pool + *used, s, n);
    *off = (uint32_t)*used;
    *used += n;
    return PG_OK;
}

int pg_tok_set_token(pg_tokenizer *t, int32_t id, const char *text, size_t len, int type) {
    if (id < 0 || id >= t->n_vocab)
        return pg_err_set(PG_EFORMAT, "tokenizer: token id %d out of range", (int)id);
    if (len > (1u << 20))
        return pg_err_set(PG_EFORMAT, "tokenizer: token %d is %zu bytes long", (int)id, len);
    if (type < PG_TOK_T_UNDEF || type > PG_TOK_T_BYTE) type = PG_TOK_T_NORMAL;
    PG_TRY(pool_append(&t->text, &t->text_used, &t->text_cap, text, len, &t->text_off[id]));
    t->text_len[id] = (uint32_t)len;
    t->type[id] = (uint8_t)type;
    return PG_OK;
}

// --- the text -> id map -----------------------------------------------------

static uint64_t hash_bytes(const char *s, size_t n) { return XXH3_64bits(s, n); }

int32_t pg_tok_lookup(const pg_tokenizer *t, const char *s, size_t len) {
    const pg_tok_strmap *m = &t->vocab;
    if (!m->cap) return -1;
    uint64_t h = hash_bytes(s, len);
    uint32_t mask = m->cap - 1, h32 = (uint32_t)h;
    for (uint32_t i = (uint32_t)(h >> 32) & mask;; i = (i + 1) & mask) {
        int32_t id = m->ids[i];
        if (id < 0) return -1;
        if (m->hash[i] == h32 && t->text_len[id] == len &&
            memcmp(t->text + t->text_off[id], s, len) == 0)
            return id;
    }
}

static int build_vocab_map(pg_tokenizer *t) {
    uint32_t cap = 16;
    while (cap < (uint32_t)t->n_vocab * 2u) cap *= 2;
    t->vocab.ids = malloc((size_t)cap * sizeof *t->vocab.ids);
    t->vocab.hash = malloc((size_t)cap * sizeof *t->vocab.hash);
    if (!t->vocab.ids || !t->vocab.hash) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
    memset(t->vocab.ids, 0xff, (size_t)cap * sizeof *t->vocab.ids);
    t->vocab.cap = cap;
    uint32_t mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->type[id] == PG_TOK_T_UNDEF) continue;
        const char *s = t->text + t->text_off[id];
        size_t n = t->text_len[id];
        uint64_t h = hash_bytes(s, n);
        for (uint32_t i = (uint32_t)(h >> 32) & mask;; i = (i + 1) & mask) {
            int32_t o = t->vocab.ids[i];
            if (o < 0) {
                t->vocab.ids[i] = id;
                t->vocab.hash[i] = (uint32_t)h;
                break;
            }
            if (t->vocab.hash[i] == (uint32_t)h && t->text_len[o] == n &&
                memcmp(t->text + t->text_off[o], s, n) == 0) {
                t->vocab.ids[i] = id;  // duplicate text: the last id wins
                break;
            }
        }
    }
    return PG_OK;
}

// --- decode table -----------------------------------------------------------

// "<0xAB>" -> 0xAB, or -1.
static int parse_byte_token(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        int c = (unsigned char)s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

// Writes what token `id` decodes to into buf (room for 4 * its text length):
// byte-level BPE maps alphabet characters back to bytes (a text with any
// other character is taken as it is, as HF's ByteLevel decoder does); SPM
// turns '▁' into ' ' and <0xAB> into the byte. Control and unknown tokens
// decode to their text.
static size_t decode_token(const pg_tokenizer *t, int32_t id, char *buf) {
    const char *s = t->text + t->text_off[id];
    size_t n = t->text_len[id];
    int type = t->type[id];
    if (type == PG_TOK_T_BYTE) {
        int b = parse_byte_token(s, n);
        if (b >= 0) {
            buf[0] = (char)b;
            return 1;
        }
    }
    if (type == PG_TOK_T_CONTROL || type == PG_TOK_T_UNKNOWN || type == PG_TOK_T_UNDEF) {
        memcpy(buf, s, n);
        return n;
    }
    if (t->kind == PG_TOK_BPE_BYTE && type != PG_TOK_T_USER_DEFINED) {
        size_t w = 0;
        for (size_t i = 0; i < n;) {
            int k = pg_tok_utf8_next((const unsigned char *)s + i, n - i);
            int b = k > 0 ? pg_tok_cp_to_byte(utf8_cp((const unsigned char *)s + i, k)) : -1;
            if (b < 0) {  // not alphabet text: keep the raw bytes
                memcpy(buf, s, n);
                return n;
            }
            buf[w++] = (char)b;
            i += (size_t)k;
        }
        return w;
    }
    if (t->kind == PG_TOK_SPM) {
        size_t w = 0;
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                buf[w++] = ' ';
                i += 3;
            } else {
                buf[w++] = s[i++];
            }
        }
        return w;
    }
    memcpy(buf, s, n);
    return n;
}

static int build_decode_table(pg_tokenizer *t) {
    size_t used = 0, cap = t->text_used + 16;
    char *pool = malloc(cap);
    char *tmp = NULL;
    size_t tmp_cap = 0;
    if (!pool) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
    t->max_dec_len = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t need = (size_t)t->text_len[id] + 4;
        if (need > tmp_cap) {
            char *p = realloc(tmp, need);
            if (!p) goto oom;
            tmp = p;
            tmp_cap = need;
        }
        size_t n = decode_token(t, id, tmp);
        if (pool_append(&pool, &used, &cap, tmp, n, &t->dec_off[id]) < 0) goto oom;
        t->dec_len[id] = (uint32_t)n;
        // max_dec_len bounds what one token adds to detok output: its bytes,
        // with each ill-formed subpart (or a truncated tail) counted as the
        // 3 bytes of U+FFFD.
        size_t out = 0;
        for (size_t i = 0; i < n;) {
            int k = pg_tok_utf8_next((const unsigned char *)tmp + i, n - i);
            if (k > 0) {
                out += (size_t)k;
                i += (size_t)k;
            } else {
                out += 3;
                i += k < 0 ? (size_t)-k : n - i;
            }
        }
        if (out < n) out = n;
        if ((int32_t)out > t->max_dec_len) t->max_dec_len = (int32_t)out;
    }
    free(tmp);
    t->dec = pool;
    return PG_OK;
oom:
    free(tmp);
    free(pool);
    return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
}

// --- special tokens ---------------------------------------------------------

// Sort key of a matchable token: first byte, then longer first, then id.
typedef struct {
    uint32_t first;
    uint32_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

static bool is_matchable(int type) {
    return type == PG_TOK_T_CONTROL || type == PG_TOK_T_USER_DEFINED || type == PG_TOK_T_UNKNOWN;
}

static int build_special_index(pg_tokenizer *t) {
    int32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        n += is_matchable(t->type[id]) && t->text_len[id] > 0;
    special_key *keys = malloc((size_t)(n ? n : 1) * sizeof *keys);
    t->special_ids = malloc((size_t)(n ? n : 1) * sizeof *t->special_ids);
    if (!keys || !t->special_ids) {
        free(keys);
        return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
    }
    // Tokens sharing a text: keep only the id the text map resolves to.
    int32_t k = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!is_matchable(t->type[id]) || t->text_len[id] == 0) continue;
        const char *s = t->text + t->text_off[id];
        if (pg_tok_lookup(t, s, t->text_len[id]) != id) continue;
        keys[k++] = (special_key){(unsigned char)s[0], t->text_len[id], id};
    }
    qsort(keys, (size_t)k, sizeof *keys, cmp_special);
    for (int32_t i = 0; i < k; i++) t->special_ids[i] = keys[i].id;
    free(keys);
    t->n_special = k;
    int32_t i = 0;
    for (uint32_t b = 0; b < 256; b++) {
        t->special_first[b] = i;
        while (i < k && (unsigned char)t->text[t->text_off[t->special_ids[i]]] == b) i++;
    }
    t->special_first[256] = k;
    return PG_OK;
}

int pg_tok_finalize_vocab(pg_tokenizer *t) {
    PG_TRY(build_vocab_map(t));
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t n;
        if (t->kind == PG_TOK_BPE_BYTE) {
            n = (size_t)pg_tok_utf8_put(pg_tok_byte_to_cp((uint8_t)b), s);
        } else {
            n = (size_t)snprintf(s, sizeof s, "<0x%02X>", b);
        }
        t->byte_id[b] = pg_tok_lookup(t, s, n);
    }
    PG_TRY(build_decode_table(t));
    PG_TRY(build_special_index(t));
    return PG_OK;
}

// --- merges -----------------------------------------------------------------

// splitmix64's finalizer: a cheap full-avalanche mix for the id-pair keys
// (the hot lookup of every merge step).
static uint32_t pair_hash(uint64_t key) {
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebull;
    key ^= key >> 31;
    return (uint32_t)key;
}

static int pairmap_grow(pg_tok_pairmap *m, uint32_t cap) {
    pg_tok_pair *slots = malloc((size_t)cap * sizeof *slots);
    if (!slots) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory for merges");
    for (uint32_t i = 0; i < cap; i++) slots[i].key = PG_TOK_PAIR_EMPTY;
    for (uint32_t j = 0; j < m->cap; j++) {
        if (m->slots[j].key == PG_TOK_PAIR_EMPTY) continue;
        uint32_t i = pair_hash(m->slots[j].key) & (cap - 1);
        while (slots[i].key != PG_TOK_PAIR_EMPTY) i = (i + 1) & (cap - 1);
        slots[i] = m->slots[j];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return PG_OK;
}

int pg_tok_reserve_merges(pg_tokenizer *t, size_t n) {
    if (n > (1u << 28)) return pg_err_set(PG_EFORMAT, "tokenizer: %zu merges", n);
    uint32_t cap = 16;
    while (cap < n * 2) cap *= 2;
    if (cap <= t->merges.cap) return PG_OK;
    return pairmap_grow(&t->merges, cap);
}

const pg_tok_pair *pg_tok_merge_find(const pg_tokenizer *t, int32_t left, int32_t right) {
    const pg_tok_pairmap *m = &t->merges;
    if (!m->count) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint32_t i = pair_hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == key) return &m->slots[i];
        if (m->slots[i].key == PG_TOK_PAIR_EMPTY) return NULL;
    }
}

int pg_tok_add_merge(pg_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                     int32_t rank) {
    int32_t ia = pg_tok_lookup(t, a, alen), ib = pg_tok_lookup(t, b, blen);
    if (ia < 0 || ib < 0) return 0;
    char small[256];
    char *cat = alen + blen <= sizeof small ? small : malloc(alen + blen);
    if (!cat) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    int32_t im = pg_tok_lookup(t, cat, alen + blen);
    if (cat != small) free(cat);
    if (im < 0) return 0;
    if (pg_tok_merge_find(t, ia, ib)) return 0;  // first rank wins
    pg_tok_pairmap *m = &t->merges;
    if ((m->count + 1) * 2 > m->cap) PG_TRY(pairmap_grow(m, m->cap ? m->cap * 2 : 1024));
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    uint32_t i = pair_hash(key) & (m->cap - 1);
    while (m->slots[i].key != PG_TOK_PAIR_EMPTY) i = (i + 1) & (m->cap - 1);
    m->slots[i] = (pg_tok_pair){.key = key, .rank = rank, .merged = im};
    m->count++;
    return 1;
}

// --- pre-tokenizer ----------------------------------------------------------

// The families' patterns, as in their tokenizer.json files. `\s` is mapped to
// the Unicode White_Space property when compiled (see compile_stage).
static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_DIGIT[] = "\\p{N}";

// Compiles a tokenizer.json (Oniguruma) regex with PCRE2 in UTF + UCP mode.
// `\s` / `\S` become \p{White_Space} / \P{White_Space}: the Unicode property
// that Oniguruma, Rust and llama.cpp use (PCRE2's \s also takes U+180E).
// MATCH_INVALID_UTF lets invalid UTF-8 through: it never matches, so such
// bytes end up in the gaps between matches and are encoded byte by byte.
static int compile_stage(const char *pat, size_t len, pcre2_code **out) {
    *out = NULL;
    size_t cap = len * 8 + 1, w = 0;
    char *buf = malloc(cap);
    if (!buf) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < len; i++) {
        if (pat[i] == '\\' && i + 1 < len) {
            const char *rep = NULL;
            if (pat[i + 1] == 's') rep = "\\p{White_Space}";
            if (pat[i + 1] == 'S') rep = "\\P{White_Space}";
            if (rep) {
                size_t rl = strlen(rep);
                memcpy(buf + w, rep, rl);
                w += rl;
            } else {
                buf[w++] = pat[i];
                buf[w++] = pat[i + 1];
            }
            i++;
        } else {
            buf[w++] = pat[i];
        }
    }
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)buf, w, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                                   &errcode, &erroff, NULL);
    free(buf);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return pg_err_set(PG_EUNSUPP, "tokenizer: pre-tokenizer regex /%.*s/ does not compile: %s",
                          (int)(len > 200 ? 200 : len), pat, (const char *)msg);
    }
    // JIT is an optimisation: without it (unsupported CPU) matching still works.
    int jrc = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    if (jrc < 0) PG_LOGD("tokenizer: PCRE2 JIT unavailable (%d), using the interpreter", jrc);
    *out = re;
    return PG_OK;
}

int pg_tok_add_stage(pg_tokenizer *t, const char *pattern, size_t len) {
    if (t->n_stages >= PG_TOK_MAX_STAGES)
        return pg_err_set(PG_EUNSUPP, "tokenizer: more than %d pre-tokenizer stages", PG_TOK_MAX_STAGES);
    pcre2_code *re;
    PG_TRY(compile_stage(pattern, len, &re));
    t->stages[t->n_stages++].re = re;
    return PG_OK;
}

int pg_tok_set_pre_family(pg_tokenizer *t, pg_tok_pre family, const char *name) {
    for (int i = 0; i < t->n_stages; i++) pcre2_code_free(t->stages[i].re);
    t->n_stages = 0;
    t->pre = family;
    snprintf(t->pre_name, sizeof t->pre_name, "%s", name ? name : "");
    switch (family) {
    case PG_TOK_PRE_NONE:
    case PG_TOK_PRE_CUSTOM: return PG_OK;
    case PG_TOK_PRE_GPT2: return pg_tok_add_stage(t, RE_GPT2, strlen(RE_GPT2));
    case PG_TOK_PRE_LLAMA3: return pg_tok_add_stage(t, RE_LLAMA3, strlen(RE_LLAMA3));
    case PG_TOK_PRE_QWEN2: return pg_tok_add_stage(t, RE_QWEN2, strlen(RE_QWEN2));
    case PG_TOK_PRE_SMOLLM:
        PG_TRY(pg_tok_add_stage(t, RE_DIGIT, strlen(RE_DIGIT)));
        return pg_tok_add_stage(t, RE_GPT2, strlen(RE_GPT2));
    }
    return pg_err_set(PG_EINVAL, "tokenizer: bad pre-tokenizer family %d", (int)family);
}

const char *pg_tok_family_regex(pg_tok_pre family) {
    switch (family) {
    case PG_TOK_PRE_GPT2: return RE_GPT2;
    case PG_TOK_PRE_LLAMA3: return RE_LLAMA3;
    case PG_TOK_PRE_QWEN2: return RE_QWEN2;
    default: return "";
    }
}

const char *pg_tok_pre_family_name(pg_tok_pre family) {
    switch (family) {
    case PG_TOK_PRE_GPT2: return "gpt2";
    case PG_TOK_PRE_LLAMA3: return "llama3";
    case PG_TOK_PRE_QWEN2: return "qwen2";
    case PG_TOK_PRE_SMOLLM: return "smollm";
    case PG_TOK_PRE_CUSTOM: return "custom";
    default: return "";
    }
}

static bool name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcmp(name, *list) == 0) return true;
    return false;
}

pg_tok_pre pg_tok_pre_from_name(const char *name, bool *ignore_merges, bool *add_bos) {
    // Names as written by llama.cpp's convert_hf_to_gguf.py, grouped by the
    // pre-tokenizer regexes the models use.
    static const char *const llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                         "pixtral", "midm-2.0", "lfm2", NULL};
    static const char *const llama3_like[] = {"dbrx", "smaug-bpe", "chatglm-bpe", NULL};
    static const char *const qwen2[] = {"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", NULL};
    static const char *const smollm[] = {"smollm", "starcoder", "refact", "command-r",
                                         "codeshell", "exaone", "minerva-7b", NULL};
    static const char *const gpt2[] = {"gpt2", "gpt-2", "default", "phi-2", "mpt", "olmo", "jais",
                                       "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
                                       "jina-v1-en", "jina-v2-code", "roberta-bpe", "gigachat",
                                       "exaone4", "mellum", "modern-bert", "trillion",
                                       "granite-docling", NULL};
    *ignore_merges = false;
    *add_bos = false;
    if (name_in(name, llama3)) {
        *ignore_merges = true;
        *add_bos = true;
        return PG_TOK_PRE_LLAMA3;
    }
    if (name_in(name, llama3_like)) return PG_TOK_PRE_LLAMA3;
    if (name_in(name, qwen2)) return PG_TOK_PRE_QWEN2;
    if (name_in(name, smollm)) return PG_TOK_PRE_SMOLLM;
    if (name_in(name, gpt2)) return PG_TOK_PRE_GPT2;
    return PG_TOK_PRE_NONE;
}

// --- final checks -----------------------------------------------------------

int pg_tok_finalize(pg_tokenizer *t) {
    int32_t *ids[] = {&t->bos, &t->eos, &t->unk, &t->pad, &t->unk_fallback};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        if (*ids[i] >= t->n_vocab) {
            PG_LOGW("tokenizer: special id %d outside the vocabulary, ignored", (int)*ids[i]);
            *ids[i] = -1;
        }
    }
    if (t->kind == PG_TOK_BPE_BYTE) {
        int missing = 0;
        for (int b = 0; b < 256; b++) missing += t->byte_id[b] < 0;
        // Common (SmolLM2 lacks 21 bytes); llama.cpp and HF drop such bytes too.
        if (missing)
            PG_LOGD("tokenizer: %d of the 256 byte tokens are missing; such bytes are %s", missing,
                    t->unk_fallback >= 0 ? "encoded as the unknown token" : "dropped");
    }
    if (!t->merge_by_score && t->merges.count == 0 && t->kind == PG_TOK_BPE_BYTE)
        PG_LOGW("tokenizer: BPE vocabulary without merges");
    return PG_OK;
}
