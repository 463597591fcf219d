// server/json_strict.c - RFC 8259 grammar check and duplicate-key scan.
#include "server/json_strict.h"

#include <stdlib.h>
#include <string.h>

// --- the grammar ----------------------------------------------------------------
// An iterative recogniser: a stack of open containers ('[' or '{') and, at
// each point, whether a value, a key, or a separator is expected. No
// recursion, so a deep input cannot exhaust the loop thread's stack.

typedef struct cur {
    const char *s;
    size_t n, i;
    const char *why;
} cur;

static void skip_ws(cur *c) {
    while (c->i < c->n) {
        char ch = c->s[c->i];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') break;
        c->i++;
    }
}

static bool fail(cur *c, const char *why) {
    c->why = why;
    return false;
}

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static bool is_hex(char ch) {
    return is_digit(ch) || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

// number = [ "-" ] int [ frac ] [ exp ]; int = "0" / digit1-9 *digit
static bool scan_number(cur *c) {
    if (c->i < c->n && c->s[c->i] == '-') c->i++;
    if (c->i >= c->n || !is_digit(c->s[c->i])) return fail(c, "a number needs a digit");
    if (c->s[c->i] == '0') {
        c->i++;
        if (c->i < c->n && is_digit(c->s[c->i])) return fail(c, "leading zero in a number");
    } else {
        while (c->i < c->n && is_digit(c->s[c->i])) c->i++;
    }
    if (c->i < c->n && c->s[c->i] == '.') {
        c->i++;
        if (c->i >= c->n || !is_digit(c->s[c->i])) return fail(c, "a digit must follow the decimal point");
        while (c->i < c->n && is_digit(c->s[c->i])) c->i++;
    }
    if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
        c->i++;
        if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-')) c->i++;
        if (c->i >= c->n || !is_digit(c->s[c->i])) return fail(c, "a digit must follow the exponent");
        while (c->i < c->n && is_digit(c->s[c->i])) c->i++;
    }
    return true;
}

// string = quotation-mark *char quotation-mark; no byte below 0x20 unescaped.
static bool scan_string(cur *c) {
    c->i++;  // the opening quote
    while (c->i < c->n) {
        unsigned char ch = (unsigned char)c->s[c->i];
        if (ch == '"') {
            c->i++;
            return true;
        }
        if (ch < 0x20) return fail(c, "a raw control character inside a string (escape it)");
        if (ch == '\\') {
            if (++c->i >= c->n) break;
            char e = c->s[c->i];
            if (e == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (c->i + (size_t)k >= c->n || !is_hex(c->s[c->i + (size_t)k]))
                        return fail(c, "\\u needs four hex digits");
                c->i += 4;
            } else if (!strchr("\"\\/bfnrt", e) || !e) {
                return fail(c, "an invalid escape in a string");
            }
        }
        c->i++;
    }
    return fail(c, "an unterminated string");
}

static bool scan_literal(cur *c, const char *lit) {
    size_t l = strlen(lit);
    if (c->n - c->i < l || memcmp(c->s + c->i, lit, l)) return fail(c, "an invalid literal");
    c->i += l;
    return true;
}

bool json_strict_check(const char *s, size_t n, size_t *err_off, const char **why) {
    cur c = {s, n, 0, NULL};
    char stack[JSON_STRICT_MAX_DEPTH];
    int depth = 0;
    bool ok = true;
    skip_ws(&c);
    // Each turn reads one value; containers push and continue with their
    // first element, the end of a value pops as many containers as close.
    for (;;) {
        if (c.i >= c.n) {
            ok = fail(&c, "the JSON text ends early");
            break;
        }
        char ch = s[c.i];
        bool opened = false;
        if (ch == '{' || ch == '[') {
            if (depth >= JSON_STRICT_MAX_DEPTH) {
                ok = fail(&c, "nesting too deep");
                break;
            }
            stack[depth++] = ch;
            c.i++;
            skip_ws(&c);
            char close = ch == '{' ? '}' : ']';
            if (c.i < c.n && s[c.i] == close) {
                c.i++;
                depth--;
            } else {
                opened = true;
            }
        } else if (ch == '"') {
            ok = scan_string(&c);
        } else if (ch == '-' || is_digit(ch)) {
            ok = scan_number(&c);
        } else if (ch == 't') {
            ok = scan_literal(&c, "true");
        } else if (ch == 'f') {
            ok = scan_literal(&c, "false");
        } else if (ch == 'n') {
            ok = scan_literal(&c, "null");
        } else {
            ok = fail(&c, "a value was expected");
        }
        if (!ok) break;
        // An opened object wants its first key, as after a comma.
        bool need_key = opened && stack[depth - 1] == '{';
        if (!opened) {
            // After a complete value: close containers, or a separator.
            for (;;) {
                skip_ws(&c);
                if (depth == 0) break;
                char close = stack[depth - 1] == '{' ? '}' : ']';
                if (c.i < c.n && s[c.i] == close) {
                    c.i++;
                    depth--;
                    continue;
                }
                if (c.i < c.n && s[c.i] == ',') {
                    c.i++;
                    skip_ws(&c);
                    need_key = stack[depth - 1] == '{';
                    break;
                }
                ok = fail(&c, stack[depth - 1] == '{' ? "',' or '}' was expected" : "',' or ']' was expected");
                break;
            }
            if (!ok) break;
            if (depth == 0) break;  // the top-level value is complete
        }
        if (need_key) {
            if (c.i >= c.n || s[c.i] != '"') {
                ok = fail(&c, "an object key (a string) was expected");
                break;
            }
            if (!(ok = scan_string(&c))) break;
            skip_ws(&c);
            if (c.i >= c.n || s[c.i] != ':') {
                ok = fail(&c, "':' was expected after an object key");
                break;
            }
            c.i++;
            skip_ws(&c);
        }
    }
    if (ok && c.i < c.n) ok = fail(&c, "trailing data after the JSON value");
    if (!ok) {
        *err_off = c.i < n ? c.i : n;
        *why = c.why;
    }
    return ok;
}

// --- duplicate keys ----------------------------------------------------------------

static int cmp_key(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Iterative depth-first walk: cJSON nodes link to their parent's next
// sibling through `next`, and the walk climbs with an explicit stack.
const char *json_strict_dup_key(const cJSON *root) {
    const cJSON *stack[JSON_STRICT_MAX_DEPTH + 2];
    int depth = 0;
    const char **keys = NULL;
    size_t cap = 0;
    const char *dup = NULL;
    const cJSON *node = root;
    while (node && !dup) {
        if ((cJSON_IsObject(node) || cJSON_IsArray(node)) && node->child) {
            if (cJSON_IsObject(node) && node->child->next) {
                size_t k = 0;
                for (const cJSON *it = node->child; it; it = it->next) k++;
                if (k > cap) {
                    cap = k;
                    keys = realloc(keys, cap * sizeof *keys);
                    if (!keys) abort();
                }
                k = 0;
                for (const cJSON *it = node->child; it; it = it->next) keys[k++] = it->string ? it->string : "";
                qsort(keys, k, sizeof *keys, cmp_key);
                for (size_t i = 1; i < k && !dup; i++)
                    if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
            }
            if (depth < JSON_STRICT_MAX_DEPTH + 2) {
                stack[depth++] = node;
                node = node->child;
                continue;
            }
        }
        // Next sibling, climbing while there is none.
        while (node && !node->next && depth > 0) node = stack[--depth];
        node = node && depth > 0 ? node->next : NULL;
    }
    free(keys);
    return dup;
}
