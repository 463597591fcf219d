// text/template/jinja_parse.c - tokens to an AST, by recursive descent with
// jinja2's precedence (parser.py): condexpr < or < and < not < compare <
// + - < ~ < * / // % < ** < unary < primary with postfix, then filters and
// tests.
#include <string.h>

#include "text/template/jinja_int.h"

#define MAX_NEST 200  // expression and block nesting: bounds the C stack

static jtok *cur(jparse *p) { return &p->toks[p->pos]; }
static jtok *peek(jparse *p, size_t k) {
    size_t i = p->pos + k;
    return &p->toks[i < p->ntoks ? i : p->ntoks - 1];
}
static void adv(jparse *p) {
    if (p->pos + 1 < p->ntoks) p->pos++;
}
static bool tok_is(const jtok *t, jtok_kind k, const char *s) {
    return t->kind == k && t->n == strlen(s) && !memcmp(t->s, s, t->n);
}
static bool is_op(jparse *p, const char *s) { return tok_is(cur(p), TK_OP, s); }
static bool is_name(jparse *p, const char *s) { return tok_is(cur(p), TK_NAME, s); }
static bool accept_op(jparse *p, const char *s) {
    if (!is_op(p, s)) return false;
    adv(p);
    return true;
}
static bool accept_name(jparse *p, const char *s) {
    if (!is_name(p, s)) return false;
    adv(p);
    return true;
}

static const char *tok_desc(jparse *p, const jtok *t) {
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_END: return "'%}'";
    case TK_DATA: return "text";
    case TK_STRING: return "a string";
    case TK_INT: case TK_FLOAT: return "a number";
    default: {
        size_t n = t->n < 40 ? t->n : 40;
        char *s = ja_alloc(p->ar, n + 3);
        s[0] = '\'';
        memcpy(s + 1, t->s, n);
        s[n + 1] = '\'';
        return s;
    }
    }
}

static void expect_op(jparse *p, const char *s) {
    if (!accept_op(p, s)) jp_fail(p, cur(p)->line, "expected '%s', got %s", s, tok_desc(p, cur(p)));
}
static void expect_block_end(jparse *p) {
    if (cur(p)->kind != TK_BLOCK_END) jp_fail(p, cur(p)->line, "expected '%%}', got %s", tok_desc(p, cur(p)));
    adv(p);
}
static const char *expect_ident(jparse *p) {
    jtok *t = cur(p);
    if (t->kind != TK_NAME) jp_fail(p, t->line, "expected a name, got %s", tok_desc(p, t));
    adv(p);
    return ja_strndup(p->ar, t->s, t->n);
}

static jnode *node(jparse *p, jkind k, int line) {
    jnode *n = ja_alloc(p->ar, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}

// A growable array of node pointers, copied into the arena at the end.
typedef struct { jnode **v; int n, cap; } nvec;
static void nv_push(jparse *p, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        jnode **a = ja_alloc(p->ar, sizeof *a * (size_t)nc);
        if (v->n) memcpy(a, v->v, sizeof *a * (size_t)v->n);
        v->v = a;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static void enter(jparse *p) {
    if (++p->depth > MAX_NEST) jp_fail(p, cur(p)->line, "template nested too deeply");
}

// One more level of a left-deep chain (a.b.c, x|f|g, 1+1+1, a and b and
// c): each link is a tree level that evaluation and its checks recurse
// through, so it counts against MAX_NEST like a nested expression; the
// chain's function gives its links back (p->depth -= links) when it
// returns. Unbounded chains overran the C stack (fuzz_jinja, session 21:
// "{{a" + ".b" * 20000 + "}}").
static void chain_link(jparse *p, int *links) {
    enter(p);
    (*links)++;
}

static jnode *parse_expr(jparse *p);
static jnode *parse_or(jparse *p);
static jnode *parse_unary(jparse *p, bool with_filter);
static jnode *parse_primary(jparse *p);

// --- expressions --------------------------------------------------------------------

// (args): positional and keyword arguments into n->kids / n->kw / n->kwv.
static void parse_call_args(jparse *p, jnode *n) {
    expect_op(p, "(");
    nvec pos = {0}, kwv = {0};
    const char **kw = NULL;
    int nkw = 0, kwcap = 0;
    while (!is_op(p, ")")) {
        if (pos.n + nkw > 0) {
            expect_op(p, ",");
            if (is_op(p, ")")) break;
        }
        if (is_op(p, "*") || is_op(p, "**")) jp_fail(p, cur(p)->line, "*args and **kwargs in calls are not supported");
        if (cur(p)->kind == TK_NAME && tok_is(peek(p, 1), TK_OP, "=")) {
            const char *k = expect_ident(p);
            adv(p);
            if (nkw == kwcap) {
                kwcap = kwcap ? kwcap * 2 : 4;
                const char **a = ja_alloc(p->ar, sizeof *a * (size_t)kwcap);
                if (nkw) memcpy(a, kw, sizeof *a * (size_t)nkw);
                kw = a;
            }
            kw[nkw++] = k;
            nv_push(p, &kwv, parse_expr(p));
        } else {
            if (nkw) jp_fail(p, cur(p)->line, "a positional argument follows a keyword argument");
            nv_push(p, &pos, parse_expr(p));
        }
    }
    adv(p);
    n->kids = pos.v;
    n->nkids = pos.n;
    n->kw = kw;
    n->kwv = kwv.v;
    n->nkw = nkw;
}

static jnode *parse_subscript(jparse *p, jnode *obj) {
    int line = cur(p)->line;
    expect_op(p, "[");
    jnode *parts[3] = {0};
    bool slice = false;
    if (!is_op(p, ":")) parts[0] = parse_expr(p);
    if (accept_op(p, ":")) {
        slice = true;
        if (!is_op(p, "]") && !is_op(p, ":")) parts[1] = parse_expr(p);
        if (accept_op(p, ":") && !is_op(p, "]")) parts[2] = parse_expr(p);
    }
    expect_op(p, "]");
    jnode *n = node(p, slice ? E_SLICE : E_ITEM, line);
    n->a = obj;
    n->b = parts[0];
    if (slice) {
        n->kids = ja_alloc(p->ar, sizeof(jnode *) * 3);
        memcpy(n->kids, parts, sizeof parts);
        n->nkids = 3;
    }
    return n;
}

static jnode *parse_postfix(jparse *p, jnode *e) {
    int links = 0;
    for (;;) {
        int line = cur(p)->line;
        if (is_op(p, ".") || is_op(p, "[") || is_op(p, "(")) chain_link(p, &links);
        if (is_op(p, ".")) {
            adv(p);
            jtok *t = cur(p);
            if (t->kind == TK_NAME) {
                jnode *n = node(p, E_ATTR, line);
                n->a = e;
                n->name = expect_ident(p);
                e = n;
            } else if (t->kind == TK_INT) {
                jnode *k = node(p, E_CONST, line);
                k->cval = jv_int(t->i);
                adv(p);
                jnode *n = node(p, E_ITEM, line);
                n->a = e;
                n->b = k;
                e = n;
            } else {
                jp_fail(p, line, "expected a name after '.', got %s", tok_desc(p, t));
            }
        } else if (is_op(p, "[")) {
            e = parse_subscript(p, e);
        } else if (is_op(p, "(")) {
            jnode *n = node(p, E_CALL, line);
            n->a = e;
            parse_call_args(p, n);
            e = n;
        } else {
            p->depth -= links;
            return e;
        }
    }
}

static jnode *parse_filter(jparse *p, jnode *operand) {
    int line = cur(p)->line;
    jnode *n = node(p, E_FILTER, line);
    n->a = operand;
    n->name = expect_ident(p);
    if (is_op(p, "(")) parse_call_args(p, n);
    return n;
}

static jnode *parse_test(jparse *p, jnode *operand) {
    int line = cur(p)->line;
    jnode *n = node(p, E_TEST, line);
    n->a = operand;
    n->op = accept_name(p, "not");
    n->name = expect_ident(p);
    jtok *t = cur(p);
    if (is_op(p, "(")) {
        parse_call_args(p, n);
    } else if ((t->kind == TK_NAME || t->kind == TK_STRING || t->kind == TK_INT || t->kind == TK_FLOAT ||
                is_op(p, "[") || is_op(p, "{")) &&
               !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
        if (is_name(p, "is")) jp_fail(p, line, "tests cannot be chained with 'is'");
        n->kids = ja_alloc(p->ar, sizeof(jnode *));
        n->kids[0] = parse_postfix(p, parse_primary(p));
        n->nkids = 1;
    }
    return n;
}

static jnode *parse_filter_expr(jparse *p, jnode *e) {
    int links = 0;
    for (;;) {
        if (is_op(p, "|") || is_name(p, "is") || is_op(p, "(")) chain_link(p, &links);
        if (accept_op(p, "|"))
            e = parse_filter(p, e);
        else if (accept_name(p, "is"))
            e = parse_test(p, e);
        else if (is_op(p, "(")) {
            jnode *n = node(p, E_CALL, cur(p)->line);
            n->a = e;
            parse_call_args(p, n);
            e = n;
        } else {
            p->depth -= links;
            return e;
        }
    }
}

static jnode *parse_primary(jparse *p) {
    enter(p);
    jtok *t = cur(p);
    jnode *n = NULL;
    int line = t->line;
    if (t->kind == TK_NAME) {
        n = node(p, E_CONST, line);
        if (tok_is(t, TK_NAME, "true") || tok_is(t, TK_NAME, "True")) n->cval = jv_bool(true);
        else if (tok_is(t, TK_NAME, "false") || tok_is(t, TK_NAME, "False")) n->cval = jv_bool(false);
        else if (tok_is(t, TK_NAME, "none") || tok_is(t, TK_NAME, "None")) n->cval = jv_none();
        else {
            n->kind = E_NAME;
            n->name = ja_strndup(p->ar, t->s, t->n);
        }
        adv(p);
    } else if (t->kind == TK_STRING) {
        // Adjacent literals concatenate ("a" "b").
        size_t total = 0;
        size_t i = p->pos;
        while (p->toks[i].kind == TK_STRING) total += p->toks[i++].n;
        char *s = ja_alloc(p->ar, total + 1);
        size_t w = 0;
        while (cur(p)->kind == TK_STRING) {
            memcpy(s + w, cur(p)->s, cur(p)->n);
            w += cur(p)->n;
            adv(p);
        }
        n = node(p, E_CONST, line);
        n->cval = jv_str(s, w);
    } else if (t->kind == TK_INT || t->kind == TK_FLOAT) {
        n = node(p, E_CONST, line);
        n->cval = t->kind == TK_INT ? jv_int(t->i) : jv_float(t->f);
        adv(p);
    } else if (is_op(p, "(")) {
        adv(p);
        if (accept_op(p, ")")) {
            n = node(p, E_TUPLE, line);
        } else {
            jnode *first = parse_expr(p);
            if (is_op(p, ",")) {
                nvec v = {0};
                nv_push(p, &v, first);
                while (accept_op(p, ",") && !is_op(p, ")")) nv_push(p, &v, parse_expr(p));
                n = node(p, E_TUPLE, line);
                n->kids = v.v;
                n->nkids = v.n;
            } else {
                n = first;
            }
            expect_op(p, ")");
        }
    } else if (is_op(p, "[")) {
        adv(p);
        nvec v = {0};
        while (!is_op(p, "]")) {
            if (v.n) {
                expect_op(p, ",");
                if (is_op(p, "]")) break;
            }
            nv_push(p, &v, parse_expr(p));
        }
        adv(p);
        n = node(p, E_LIST, line);
        n->kids = v.v;
        n->nkids = v.n;
    } else if (is_op(p, "{")) {
        adv(p);
        nvec v = {0};  // key, value, key, value...
        while (!is_op(p, "}")) {
            if (v.n) {
                expect_op(p, ",");
                if (is_op(p, "}")) break;
            }
            nv_push(p, &v, parse_expr(p));
            expect_op(p, ":");
            nv_push(p, &v, parse_expr(p));
        }
        adv(p);
        n = node(p, E_DICT, line);
        n->kids = v.v;
        n->nkids = v.n;
    } else {
        jp_fail(p, line, "unexpected %s", tok_desc(p, t));
    }
    p->depth--;
    return n;
}

static jnode *parse_unary(jparse *p, bool with_filter) {
    enter(p);
    int line = cur(p)->line;
    jnode *n;
    if (accept_op(p, "-")) {
        n = node(p, E_NEG, line);
        n->a = parse_unary(p, false);
    } else if (accept_op(p, "+")) {
        n = node(p, E_POS, line);
        n->a = parse_unary(p, false);
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    if (with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static jnode *binop(jparse *p, jop op, jnode *a, jnode *b, int line) {
    jnode *n = node(p, E_BIN, line);
    n->op = (int)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(jparse *p) {
    jnode *a = parse_unary(p, true);
    int links = 0;
    while (is_op(p, "**")) {
        int line = cur(p)->line;
        chain_link(p, &links);
        adv(p);
        a = binop(p, OP_POW, a, parse_unary(p, true), line);
    }
    p->depth -= links;
    return a;
}

static jnode *parse_math2(jparse *p) {
    jnode *a = parse_pow(p);
    int links = 0;
    for (;;) {
        int line = cur(p)->line;
        jop op;
        if (is_op(p, "*")) op = OP_MUL;
        else if (is_op(p, "/")) op = OP_DIV;
        else if (is_op(p, "//")) op = OP_FDIV;
        else if (is_op(p, "%")) op = OP_MOD;
        else {
            p->depth -= links;
            return a;
        }
        chain_link(p, &links);
        adv(p);
        a = binop(p, op, a, parse_pow(p), line);
    }
}

static jnode *parse_concat(jparse *p) {
    jnode *a = parse_math2(p);
    if (!is_op(p, "~")) return a;
    nvec v = {0};
    nv_push(p, &v, a);
    int line = cur(p)->line;
    while (accept_op(p, "~")) nv_push(p, &v, parse_math2(p));
    jnode *n = node(p, E_CONCAT, line);
    n->kids = v.v;
    n->nkids = v.n;
    return n;
}

static jnode *parse_math1(jparse *p) {
    jnode *a = parse_concat(p);
    int links = 0;
    for (;;) {
        int line = cur(p)->line;
        jop op;
        if (is_op(p, "+")) op = OP_ADD;
        else if (is_op(p, "-")) op = OP_SUB;
        else {
            p->depth -= links;
            return a;
        }
        chain_link(p, &links);
        adv(p);
        a = binop(p, op, a, parse_concat(p), line);
    }
}

// Comparisons; a chain a < b < c becomes (a < b) and (b < c).
static jnode *parse_compare(jparse *p) {
    jnode *a = parse_math1(p), *result = NULL;
    int links = 0;
    for (;;) {
        int line = cur(p)->line;
        jop op;
        if (is_op(p, "==")) op = OP_EQ;
        else if (is_op(p, "!=")) op = OP_NE;
        else if (is_op(p, "<")) op = OP_LT;
        else if (is_op(p, "<=")) op = OP_LE;
        else if (is_op(p, ">")) op = OP_GT;
        else if (is_op(p, ">=")) op = OP_GE;
        else if (is_name(p, "in")) op = OP_IN;
        else if (is_name(p, "not") && tok_is(peek(p, 1), TK_NAME, "in")) {
            adv(p);
            op = OP_NOTIN;
        } else {
            p->depth -= links;
            return result ? result : a;
        }
        chain_link(p, &links);
        adv(p);
        jnode *b = parse_math1(p);
        jnode *c = node(p, E_CMP, line);
        c->op = (int)op;
        c->a = a;
        c->b = b;
        if (result) {
            jnode *both = node(p, E_AND, line);
            both->a = result;
            both->b = c;
            result = both;
        } else {
            result = c;
        }
        a = b;
    }
}

static jnode *parse_not(jparse *p) {
    if (is_name(p, "not")) {
        enter(p);
        jnode *n = node(p, E_NOT, cur(p)->line);
        adv(p);
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_and(jparse *p) {
    jnode *a = parse_not(p);
    int links = 0;
    while (is_name(p, "and")) {
        chain_link(p, &links);
        jnode *n = node(p, E_AND, cur(p)->line);
        adv(p);
        n->a = a;
        n->b = parse_not(p);
        a = n;
    }
    p->depth -= links;
    return a;
}

static jnode *parse_or(jparse *p) {
    jnode *a = parse_and(p);
    int links = 0;
    while (is_name(p, "or")) {
        chain_link(p, &links);
        jnode *n = node(p, E_OR, cur(p)->line);
        adv(p);
        n->a = a;
        n->b = parse_and(p);
        a = n;
    }
    p->depth -= links;
    return a;
}

static jnode *parse_expr(jparse *p) {
    enter(p);
    jnode *a = parse_or(p);
    int links = 0;
    while (is_name(p, "if")) {
        chain_link(p, &links);
        jnode *n = node(p, E_COND, cur(p)->line);
        adv(p);
        n->c = parse_or(p);
        n->a = a;
        if (accept_name(p, "else")) n->b = parse_expr(p);
        a = n;
    }
    p->depth -= 1 + links;
    return a;
}

// expr {, expr}: a tuple when there is a comma. `cond` false: no inline if
// (a for loop's `if` is its filter).
static jnode *parse_tuple(jparse *p, bool cond) {
    int line = cur(p)->line;
    jnode *first = cond ? parse_expr(p) : parse_or(p);
    if (!is_op(p, ",")) return first;
    nvec v = {0};
    nv_push(p, &v, first);
    while (accept_op(p, ",")) {
        if (cur(p)->kind == TK_BLOCK_END || cur(p)->kind == TK_VAR_END || is_name(p, "in")) break;
        nv_push(p, &v, cond ? parse_expr(p) : parse_or(p));
    }
    jnode *n = node(p, E_TUPLE, line);
    n->kids = v.v;
    n->nkids = v.n;
    return n;
}

// name | name.attr (set only) | name, name ... (optionally parenthesised)
static jnode *parse_target(jparse *p, bool allow_attr) {
    int line = cur(p)->line;
    bool paren = accept_op(p, "(");
    nvec v = {0};
    do {
        jnode *n = node(p, E_NAME, line);
        n->name = expect_ident(p);
        if (allow_attr && !paren && accept_op(p, ".")) {
            jnode *a = node(p, E_ATTR, line);
            a->a = n;
            a->name = expect_ident(p);
            n = a;
        }
        nv_push(p, &v, n);
    } while (accept_op(p, ","));
    if (paren) expect_op(p, ")");
    if (v.n == 1 && !paren) return v.v[0];
    jnode *t = node(p, E_TUPLE, line);
    t->kids = v.v;
    t->nkids = v.n;
    return t;
}

// --- statements ---------------------------------------------------------------------

static jnode *parse_block(jparse *p, const char *const *ends, const char **hit);

static jnode *parse_if(jparse *p, int line) {
    jnode *n = node(p, N_IF, line);
    n->a = parse_tuple(p, true);
    expect_block_end(p);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *hit;
    n->body = parse_block(p, ends, &hit);
    if (!strcmp(hit, "elif")) {
        n->orelse = parse_if(p, cur(p)->line);
        return n;  // the nested if consumed the endif
    }
    if (!strcmp(hit, "else")) {
        expect_block_end(p);
        static const char *const e2[] = {"endif", NULL};
        n->orelse = parse_block(p, e2, &hit);
    }
    expect_block_end(p);
    return n;
}

static jnode *parse_for(jparse *p, int line) {
    jnode *n = node(p, N_FOR, line);
    n->a = parse_target(p, false);
    if (!accept_name(p, "in")) jp_fail(p, cur(p)->line, "expected 'in' in a for loop");
    n->b = parse_tuple(p, false);
    if (accept_name(p, "if")) n->c = parse_expr(p);
    if (is_name(p, "recursive")) jp_fail(p, line, "recursive for loops are not supported");
    expect_block_end(p);
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *hit;
    n->body = parse_block(p, ends, &hit);
    if (!strcmp(hit, "else")) {
        expect_block_end(p);
        static const char *const e2[] = {"endfor", NULL};
        n->orelse = parse_block(p, e2, &hit);
    }
    expect_block_end(p);
    return n;
}

// A chain of filters applied to the placeholder operand NULL (filter
// blocks, block sets): "name(args) | name2 ...".
static jnode *parse_filter_chain(jparse *p) {
    jnode *e = parse_filter(p, NULL);
    int links = 0;
    while (is_op(p, "|")) {
        chain_link(p, &links);
        adv(p);
        e = parse_filter(p, e);
    }
    p->depth -= links;
    return e;
}

static jnode *parse_set(jparse *p, int line) {
    jnode *target = parse_target(p, true);
    if (accept_op(p, "=")) {
        jnode *n = node(p, N_SET, line);
        n->a = target;
        n->b = parse_tuple(p, true);
        expect_block_end(p);
        return n;
    }
    if (target->kind != E_NAME) jp_fail(p, line, "a block set assigns one name");
    jnode *n = node(p, N_SETBLOCK, line);
    n->name = target->name;
    if (accept_op(p, "|")) n->a = parse_filter_chain(p);
    expect_block_end(p);
    static const char *const ends[] = {"endset", NULL};
    const char *hit;
    n->body = parse_block(p, ends, &hit);
    expect_block_end(p);
    return n;
}

static jnode *parse_macro(jparse *p, int line) {
    jnode *n = node(p, N_MACRO, line);
    n->name = expect_ident(p);
    expect_op(p, "(");
    nvec defs = {0};
    const char **names = NULL;
    int np = 0, cap = 0;
    while (!is_op(p, ")")) {
        if (np) expect_op(p, ",");
        if (is_op(p, ")")) break;
        if (np == cap) {
            cap = cap ? cap * 2 : 4;
            const char **a = ja_alloc(p->ar, sizeof *a * (size_t)cap);
            if (np) memcpy(a, names, sizeof *a * (size_t)np);
            names = a;
        }
        names[np++] = expect_ident(p);
        nv_push(p, &defs, accept_op(p, "=") ? parse_expr(p) : NULL);
    }
    adv(p);
    n->kw = names;
    n->kwv = defs.v;
    n->nkw = np;
    expect_block_end(p);
    static const char *const ends[] = {"endmacro", NULL};
    const char *hit;
    n->body = parse_block(p, ends, &hit);
    if (cur(p)->kind == TK_NAME) adv(p);  // {% endmacro name %}
    expect_block_end(p);
    return n;
}

static jnode *parse_statement(jparse *p) {
    jtok *t = cur(p);
    int line = t->line;
    if (t->kind != TK_NAME) jp_fail(p, line, "expected a statement name, got %s", tok_desc(p, t));
    if (accept_name(p, "if")) return parse_if(p, line);
    if (accept_name(p, "for")) return parse_for(p, line);
    if (accept_name(p, "set")) return parse_set(p, line);
    if (accept_name(p, "macro")) return parse_macro(p, line);
    if (accept_name(p, "break") || accept_name(p, "continue")) {
        jnode *n = node(p, tok_is(t, TK_NAME, "break") ? N_BREAK : N_CONTINUE, line);
        expect_block_end(p);
        return n;
    }
    if (accept_name(p, "filter")) {
        jnode *n = node(p, N_FILTERBLOCK, line);
        n->a = parse_filter_chain(p);
        expect_block_end(p);
        static const char *const ends[] = {"endfilter", NULL};
        const char *hit;
        n->body = parse_block(p, ends, &hit);
        expect_block_end(p);
        return n;
    }
    if (accept_name(p, "generation")) {  // HF's assistant-mask tag: renders its body
        expect_block_end(p);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *hit;
        jnode *b = parse_block(p, ends, &hit);
        expect_block_end(p);
        return b;
    }
    jp_fail(p, line, "unknown or unsupported statement %s", tok_desc(p, t));
}

// Statements up to one of `ends` (a block tag whose name is listed, left
// after its name for the caller) or the end of the template when ends is
// NULL.
static jnode *parse_block(jparse *p, const char *const *ends, const char **hit) {
    enter(p);
    int line = cur(p)->line;
    nvec v = {0};
    for (;;) {
        jtok *t = cur(p);
        if (t->kind == TK_EOF) {
            if (ends) jp_fail(p, t->line, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->kind == TK_DATA) {
            jnode *n = node(p, N_TEXT, t->line);
            n->cval = jv_str(t->s, t->n);
            nv_push(p, &v, n);
            adv(p);
        } else if (t->kind == TK_VAR_BEGIN) {
            adv(p);
            jnode *n = node(p, N_OUT, t->line);
            n->a = parse_tuple(p, true);
            if (cur(p)->kind != TK_VAR_END)
                jp_fail(p, cur(p)->line, "expected '}}', got %s", tok_desc(p, cur(p)));
            adv(p);
            nv_push(p, &v, n);
        } else if (t->kind == TK_BLOCK_BEGIN) {
            jtok *name = peek(p, 1);
            bool end = false;
            for (int i = 0; ends && ends[i]; i++)
                if (tok_is(name, TK_NAME, ends[i])) {
                    *hit = ends[i];
                    end = true;
                }
            adv(p);
            if (end) {
                adv(p);
                break;
            }
            if (name->kind == TK_NAME && name->n > 3 && !memcmp(name->s, "end", 3))
                jp_fail(p, name->line, "unexpected %s%s%s", tok_desc(p, name),
                        ends ? ", expected " : "", ends ? ends[0] : "");
            nv_push(p, &v, parse_statement(p));
        } else {
            jp_fail(p, t->line, "unexpected %s", tok_desc(p, t));
        }
    }
    jnode *b = node(p, N_BLOCK, line);
    b->kids = v.v;
    b->nkids = v.n;
    p->depth--;
    return b;
}

jnode *jparse_template(jparse *p) {
    const char *hit = NULL;
    return parse_block(p, NULL, &hit);
}
