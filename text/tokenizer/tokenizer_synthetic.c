// text/tokenizer/tokenizer_synthetic.c - a byte-level tokenizer for a model with no
// tokenizer of its own (--load-format dummy without --tokenizer).
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/tokenizer/tokenizer.h"

// GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest
// to U+0100 + n in order.
static uint32_t byte_char(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (uint32_t)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256u + (uint32_t)n;
}

static int put_utf8(uint32_t cp, char *s) {
    if (cp < 0x80) {
        s[0] = (char)cp;
        return 1;
    }
    s[0] = (char)(0xC0 | (cp >> 6));
    s[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

int pg_tokenizer_synthetic_bytes(int32_t vocab, pg_tokenizer **out) {
    *out = NULL;
    if (vocab < 256)
        return pg_err_set(PG_EINVAL, "synthetic tokenizer: vocabulary %d < 256 bytes", vocab);
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *v = cJSON_AddObjectToObject(model, "vocab");
    cJSON_AddArrayToObject(model, "merges");
    char key[32];
    for (int32_t i = 0; i < vocab; i++) {
        if (i < 256) {
            int n = put_utf8(byte_char(i), key);
            key[n] = 0;
        } else {
            snprintf(key, sizeof key, "<t%d>", (int)i);
        }
        cJSON_AddNumberToObject(v, key, i);
    }
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddFalseToObject(pre, "add_prefix_space");
    cJSON_AddFalseToObject(pre, "use_regex");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return pg_err_set(PG_ENOMEM, "synthetic tokenizer: out of memory");
    int rc =
        pg_tokenizer_from_hf_memory(json, strlen(json), NULL, 0, "synthetic byte tokenizer", out);
    free(json);
    return rc;
}
