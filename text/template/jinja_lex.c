// text/template/jinja_lex.c - Jinja2 source to tokens.
//
// Follows jinja2's lexer with Hugging Face's settings: newlines normalised
// to "\n", one trailing newline dropped (keep_trailing_newline=False),
// "{%-"/"-%}" strip all whitespace on that side, trim_blocks drops the one
// newline after a block or comment tag, and lstrip_blocks drops the blanks
// between a line start and a block or comment tag ("{%+" keeps them). A
// line start is a newline in the text before the tag, or the end of a tag
// that itself consumed a newline, or the start of the template: jinja2's
// own rule (its `line_starting`).
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/template/jinja_int.h"

_Noreturn void jp_fail(jparse *p, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(p->err, sizeof p->err, "jinja line %d: ", line);
    vsnprintf(p->err + k, sizeof p->err - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(p->jb, 1);
}

typedef struct lexer {
    jparse *p;
    const char *s;
    size_t n, pos;
    int line;
    size_t cap;
} lexer;

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static jtok *push(lexer *L, jtok_kind k) {
    jparse *p = L->p;
    if (p->ntoks == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        jtok *t = ja_alloc(p->ar, nc * sizeof *t);
        if (p->ntoks) memcpy(t, p->toks, p->ntoks * sizeof *t);
        p->toks = t;
        L->cap = nc;
    }
    jtok *t = &p->toks[p->ntoks++];
    memset(t, 0, sizeof *t);
    t->kind = k;
    t->line = L->line;
    return t;
}

static void count_lines(lexer *L, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (L->s[i] == '\n') L->line++;
}

static void emit_data(lexer *L, size_t from, size_t to) {
    if (to <= from) return;
    jtok *t = push(L, TK_DATA);
    t->s = L->s + from;
    t->n = to - from;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// A string literal at L->pos (the quote); decodes Python's escapes
// (jinja2 decodes literals with "unicode-escape").
static void lex_string(lexer *L) {
    char q = L->s[L->pos];
    size_t i = L->pos + 1, start = i;
    while (i < L->n && L->s[i] != q) i += L->s[i] == '\\' ? 2 : 1;
    if (i >= L->n) jp_fail(L->p, L->line, "unterminated string literal");
    size_t end = i;
    char *o = ja_alloc(L->p->ar, (end - start) * 2 + 1), *w = o;
    for (size_t k = start; k < end; k++) {
        char c = L->s[k];
        if (c != '\\') { *w++ = c; continue; }
        char e = L->s[++k];
        switch (e) {
        case 'n': *w++ = '\n'; break;
        case 't': *w++ = '\t'; break;
        case 'r': *w++ = '\r'; break;
        case '\\': *w++ = '\\'; break;
        case '\'': *w++ = '\''; break;
        case '"': *w++ = '"'; break;
        case 'a': *w++ = '\a'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'v': *w++ = '\v'; break;
        case '\n': break;  // line continuation
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < nd; d++) {
                int h = k + 1 + (size_t)d < end ? hexval(L->s[k + 1 + (size_t)d]) : -1;
                if (h < 0) jp_fail(L->p, L->line, "bad \\%c escape in a string literal", e);
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
                jp_fail(L->p, L->line, "bad code point in a string literal");
            k += (size_t)nd;
            w += put_utf8(w, cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && k + 1 < end && L->s[k + 1] >= '0' && L->s[k + 1] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(L->s[++k] - '0');
                w += put_utf8(w, cp);
            } else {  // unknown escape: kept as written
                *w++ = '\\';
                *w++ = e;
            }
        }
    }
    count_lines(L, L->pos, end);
    jtok *t = push(L, TK_STRING);
    t->s = o;
    t->n = (size_t)(w - o);
    L->pos = end + 1;
}

static void lex_number(lexer *L, bool int_only) {
    size_t i = L->pos;
    char buf[64];
    size_t b = 0;
    bool is_float = false;
    while (i < L->n && (is_digit(L->s[i]) || (L->s[i] == '_' && i + 1 < L->n && is_digit(L->s[i + 1])))) {
        if (L->s[i] != '_' && b < sizeof buf - 1) buf[b++] = L->s[i];
        i++;
    }
    if (!int_only && i + 1 < L->n && L->s[i] == '.' && is_digit(L->s[i + 1])) {
        is_float = true;
        if (b < sizeof buf - 1) buf[b++] = '.';
        i++;
        while (i < L->n && (is_digit(L->s[i]) || L->s[i] == '_')) {
            if (L->s[i] != '_' && b < sizeof buf - 1) buf[b++] = L->s[i];
            i++;
        }
    }
    if (!int_only && i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < L->n && (L->s[j] == '+' || L->s[j] == '-')) j++;
        if (j < L->n && is_digit(L->s[j])) {
            is_float = true;
            for (size_t k = i; k < j && b < sizeof buf - 1; k++) buf[b++] = L->s[k];
            i = j;
            while (i < L->n && is_digit(L->s[i])) {
                if (b < sizeof buf - 1) buf[b++] = L->s[i];
                i++;
            }
        }
    }
    buf[b] = 0;
    jtok *t = push(L, is_float ? TK_FLOAT : TK_INT);
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        unsigned long long v = strtoull(buf, NULL, 10);
        if (b >= sizeof buf - 1 || v > INT64_MAX) jp_fail(L->p, L->line, "integer literal too large");
        t->i = (int64_t)v;
    }
    L->pos = i;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char OPS1[] = "+-*/%~()[]{},.:|=<>;";

// The inside of a {{ }} or {% %} tag from L->pos up to and including its
// end; "-}}"/"-%}" also consume the whitespace after it.
static void lex_tag(lexer *L, bool block) {
    int depth = 0;
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->n) jp_fail(L->p, L->line, "unterminated %s tag", block ? "{%" : "{{");
        const char *s = L->s + L->pos;
        size_t left = L->n - L->pos;
        char close = block ? '%' : '}';
        if (depth == 0) {
            bool minus = left >= 3 && s[0] == '-' && s[1] == close && s[2] == '}';
            bool plain = left >= 2 && s[0] == close && s[1] == '}';
            if (minus || plain) {
                push(L, block ? TK_BLOCK_END : TK_VAR_END);
                L->pos += minus ? 3 : 2;
                if (minus) {
                    size_t st = L->pos;
                    while (L->pos < L->n && is_ws(L->s[L->pos])) L->pos++;
                    count_lines(L, st, L->pos);
                } else if (block && L->pos < L->n && L->s[L->pos] == '\n') {  // trim_blocks
                    L->pos++;
                    L->line++;
                }
                return;
            }
        }
        char c = s[0];
        if (is_alpha(c)) {
            size_t i = 1;
            while (i < left && (is_alpha(s[i]) || is_digit(s[i]))) i++;
            jtok *t = push(L, TK_NAME);
            t->s = s;
            t->n = i;
            L->pos += i;
        } else if (is_digit(c)) {
            bool after_dot = L->p->ntoks && L->p->toks[L->p->ntoks - 1].kind == TK_OP &&
                             L->p->toks[L->p->ntoks - 1].n == 1 && L->p->toks[L->p->ntoks - 1].s[0] == '.';
            lex_number(L, after_dot);
        } else if (c == '\'' || c == '"') {
            lex_string(L);
        } else {
            size_t len = 0;
            for (int k = 0; OPS2[k]; k++)
                if (left >= 2 && s[0] == OPS2[k][0] && s[1] == OPS2[k][1]) len = 2;
            if (!len && strchr(OPS1, c) && c) len = 1;
            if (!len) jp_fail(L->p, L->line, "unexpected character '%c'", c);
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            jtok *t = push(L, TK_OP);
            t->s = s;
            t->n = len;
            L->pos += len;
        }
    }
}

// After `{% raw %}`: the text up to `{% endraw %}` is data.
static void lex_raw(lexer *L) {
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (L->s[i] != '{' || L->s[i + 1] != '%') continue;
        size_t j = i + 2;
        bool minus = j < L->n && L->s[j] == '-';
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+')) j++;
        while (j < L->n && is_ws(L->s[j])) j++;
        if (j + 6 > L->n || memcmp(L->s + j, "endraw", 6)) continue;
        j += 6;
        while (j < L->n && is_ws(L->s[j])) j++;
        bool emin = j < L->n && L->s[j] == '-';
        if (emin) j++;
        if (j + 2 > L->n || L->s[j] != '%' || L->s[j + 1] != '}') continue;
        size_t end = i;
        if (minus)
            while (end > L->pos && is_ws(L->s[end - 1])) end--;
        emit_data(L, L->pos, end);
        count_lines(L, L->pos, j);
        L->pos = j + 2;
        if (emin) {
            while (L->pos < L->n && is_ws(L->s[L->pos])) L->pos += L->s[L->pos] == '\n' ? (L->line++, 1) : 1;
        } else if (L->pos < L->n && L->s[L->pos] == '\n') {
            L->pos++;
            L->line++;
        }
        return;
    }
    jp_fail(L->p, L->line, "unterminated raw block");
}

void jlex(jparse *p, const char *src, size_t len) {
    // Newlines to "\n", one trailing newline dropped.
    char *s = ja_alloc(p->ar, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    lexer L = {.p = p, .s = s, .n = n, .line = 1};
    bool line_starting = true;
    while (L.pos < n) {
        size_t t = L.pos;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= n) {
            emit_data(&L, L.pos, n);
            break;
        }
        char kind = s[t + 1];
        char mod = t + 2 < n ? s[t + 2] : 0;
        size_t text_end = t;
        if (mod == '-') {
            while (text_end > L.pos && is_ws(s[text_end - 1])) text_end--;
        } else if (kind != '{' && mod != '+') {
            size_t l = text_end;
            while (l > L.pos && s[l - 1] != '\n') l--;
            if (l > L.pos || line_starting) {
                bool blank = l < text_end;
                for (size_t k = l; k < text_end && blank; k++) blank = is_ws(s[k]);
                if (blank) text_end = l;
            }
        }
        emit_data(&L, L.pos, text_end);
        count_lines(&L, L.pos, t);
        L.pos = t + 2 + (mod == '-' || mod == '+' ? 1 : 0);
        if (kind == '#') {
            size_t i = L.pos;
            while (i + 1 < n && !(s[i] == '#' && s[i + 1] == '}')) i++;
            if (i + 1 >= n) jp_fail(p, L.line, "unterminated comment");
            bool minus = i > L.pos && s[i - 1] == '-';
            count_lines(&L, L.pos, i);
            L.pos = i + 2;
            if (minus) {
                size_t st = L.pos;
                while (L.pos < n && is_ws(s[L.pos])) L.pos++;
                count_lines(&L, st, L.pos);
            } else if (L.pos < n && s[L.pos] == '\n') {
                L.pos++;
                L.line++;
            }
        } else {
            push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN);
            size_t first = p->ntoks;
            lex_tag(&L, kind == '%');
            if (kind == '%' && p->ntoks == first + 2 && p->toks[first].kind == TK_NAME &&
                p->toks[first].n == 3 && !memcmp(p->toks[first].s, "raw", 3)) {
                p->ntoks = first - 1;  // the raw tag itself produces no tokens
                lex_raw(&L);
            }
        }
        line_starting = L.pos > 0 && s[L.pos - 1] == '\n';
    }
    push(&L, TK_EOF);
}
