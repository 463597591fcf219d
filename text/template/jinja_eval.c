// text/template/jinja_eval.c - rendering: statements, expressions, scopes, and the
// public entry points of text/template/jinja.h.
//
// Scopes follow jinja2: the render variables and top-level sets form the
// global scope; each for-loop iteration gets a fresh scope (a set inside a
// loop does not survive the iteration, hence namespace()); a macro call
// gets a scope whose parent is the global scope as it is at call time.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/template/jinja.h"
#include "text/template/jinja_int.h"

struct pg_jinja_template {
    jarena ar;
    jnode *root;
};

struct jscope {
    jscope *parent;
    jdict vars;
};

void pg_jinja_limits_default(pg_jinja_limits *l) {
    l->max_output = 8u << 20;
    l->max_memory = 64u << 20;
    l->max_steps = 20u * 1000 * 1000;
    l->max_depth = 64;
}

// --- scopes -------------------------------------------------------------------------

static jval lookup(jrender *r, const char *name, bool *found) {
    size_t n = strlen(name);
    for (jscope *s = r->scope; s; s = s->parent) {
        jval v = jd_get(&s->vars, name, n, found);
        if (*found) return v;
    }
    for (int f = 0; f < JF_COUNT; f++)
        if (!strcmp(name, jfunc_names[f])) {
            jval v = {.t = JT_FUNC};
            v.u.func = f;
            *found = true;
            return v;
        }
    *found = false;
    return jv_undef(name);
}

static void assign(jrender *r, const char *name, jval v) {
    jd_set(r, &r->scope->vars, jv_strz(r, name), v);
}

static jscope *push_scope(jrender *r, jscope *parent) {
    jscope *s = ja_alloc(&r->ar, sizeof *s);
    s->parent = parent;
    return s;
}

// Python slice semantics over n items: the selected indices.
static size_t slice_indices(jrender *r, int64_t n, jval a, jval b, jval c, int64_t *start, int64_t *step) {
    int64_t st = 1;
    if (c.t != JT_NONE && c.t != JT_UNDEF && !jv_as_index(c, &st)) jr_fail(r, "slice indices must be integers");
    if (st == 0) jr_fail(r, "slice step cannot be zero");
    int64_t lo = 0, hi = 0;
    bool has_a = a.t != JT_NONE && a.t != JT_UNDEF, has_b = b.t != JT_NONE && b.t != JT_UNDEF;
    if ((has_a && !jv_as_index(a, &lo)) || (has_b && !jv_as_index(b, &hi))) jr_fail(r, "slice indices must be integers");
    if (st > 0) {
        if (!has_a) lo = 0;
        else if (lo < 0) lo = lo + n < 0 ? 0 : lo + n;
        else if (lo > n) lo = n;
        if (!has_b) hi = n;
        else if (hi < 0) hi = hi + n < 0 ? 0 : hi + n;
        else if (hi > n) hi = n;
        *start = lo;
        *step = st;
        return hi > lo ? (size_t)((hi - lo + st - 1) / st) : 0;
    }
    if (!has_a) lo = n - 1;
    else if (lo < 0) lo = lo + n < 0 ? -1 : lo + n;
    else if (lo >= n) lo = n - 1;
    if (!has_b) hi = -1;
    else if (hi < 0) hi = hi + n < 0 ? -1 : hi + n;
    else if (hi >= n) hi = n - 1;
    *start = lo;
    *step = st;
    return lo > hi ? (size_t)((lo - hi - st - 1) / -st) : 0;
}

static jval do_slice(jrender *r, jval obj, jval a, jval b, jval c) {
    int64_t start, step;
    if (obj.t == JT_LIST) {
        size_t cnt = slice_indices(r, (int64_t)obj.u.l->n, a, b, c, &start, &step);
        jval l = jv_list(r, cnt);
        for (size_t i = 0; i < cnt; i++) l.u.l->v[i] = obj.u.l->v[start + (int64_t)i * step];
        return l;
    }
    if (obj.t == JT_STR) {
        jval chars = jiter_list(r, obj);
        size_t cnt = slice_indices(r, (int64_t)chars.u.l->n, a, b, c, &start, &step);
        if (step == 1) {  // contiguous: no copy
            if (!cnt) return jv_str("", 0);
            const char *s0 = chars.u.l->v[start].u.s.s;
            const jval *last = &chars.u.l->v[start + (int64_t)cnt - 1];
            return jv_str(s0, (size_t)(last->u.s.s + last->u.s.n - s0));
        }
        jbuf out = {0};
        for (size_t i = 0; i < cnt; i++) {
            jval ch = chars.u.l->v[start + (int64_t)i * step];
            jb_add(r, &out, ch.u.s.s, ch.u.s.n);
        }
        return jb_to_str(r, &out);
    }
    if (obj.t == JT_UNDEF) jr_fail(r, "'%s' is undefined", jv_undef_name(obj));
    return jv_undef(NULL);
}

// --- operators --------------------------------------------------------------------------

static _Noreturn void bad_operands(jrender *r, const char *op, jval a, jval b) {
    if (a.t == JT_UNDEF) jr_fail(r, "'%s' is undefined", jv_undef_name(a));
    if (b.t == JT_UNDEF) jr_fail(r, "'%s' is undefined", jv_undef_name(b));
    jr_fail(r, "unsupported operand types for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static bool both_int(jval a, jval b) {
    return (a.t == JT_INT || a.t == JT_BOOL) && (b.t == JT_INT || b.t == JT_BOOL);
}
static int64_t ival(jval v) { return v.t == JT_BOOL ? v.u.b : v.u.i; }

static jval repeat(jrender *r, jval seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq.t == JT_STR) {
        if (seq.u.s.n && (uint64_t)k > r->max_output / seq.u.s.n) jr_fail(r, "string repetition too large");
        jbuf b = {0};
        for (int64_t i = 0; i < k; i++) jb_add(r, &b, seq.u.s.s, seq.u.s.n);
        return b.p ? jb_to_str(r, &b) : jv_str("", 0);
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)k > r->max_steps / n) jr_fail(r, "list repetition too large");
    jval l = jv_list(r, n * (size_t)k);
    for (int64_t i = 0; i < k; i++) memcpy(l.u.l->v + (size_t)i * n, seq.u.l->v, n * sizeof(jval));
    return l;
}

static jval binary(jrender *r, jop op, jval a, jval b) {
    int64_t x;
    switch (op) {
    case OP_ADD:
        if (both_int(a, b)) {
            if (__builtin_add_overflow(ival(a), ival(b), &x)) jr_fail(r, "integer overflow");
            return jv_int(x);
        }
        if (jv_is_num(a) && jv_is_num(b)) return jv_float(jv_num(a) + jv_num(b));
        if (a.t == JT_STR && b.t == JT_STR) {
            bool markup = a.markup || b.markup;
            if (markup && !a.markup) a = jhtml_escape(r, a);
            if (markup && !b.markup) b = jhtml_escape(r, b);
            jbuf s = {0};
            jb_add(r, &s, a.u.s.s, a.u.s.n);
            jb_add(r, &s, b.u.s.s, b.u.s.n);
            jval out = s.p ? jb_to_str(r, &s) : jv_str("", 0);
            out.markup = markup;
            return out;
        }
        if (a.t == JT_LIST && b.t == JT_LIST) {
            jval l = jv_list(r, a.u.l->n + b.u.l->n);
            if (a.u.l->n) memcpy(l.u.l->v, a.u.l->v, a.u.l->n * sizeof(jval));
            if (b.u.l->n) memcpy(l.u.l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jval));
            return l;
        }
        bad_operands(r, "+", a, b);
    case OP_SUB:
        if (both_int(a, b)) {
            if (__builtin_sub_overflow(ival(a), ival(b), &x)) jr_fail(r, "integer overflow");
            return jv_int(x);
        }
        if (jv_is_num(a) && jv_is_num(b)) return jv_float(jv_num(a) - jv_num(b));
        bad_operands(r, "-", a, b);
    case OP_MUL:
        if (both_int(a, b)) {
            if (__builtin_mul_overflow(ival(a), ival(b), &x)) jr_fail(r, "integer overflow");
            return jv_int(x);
        }
        if (jv_is_num(a) && jv_is_num(b)) return jv_float(jv_num(a) * jv_num(b));
        if ((a.t == JT_STR || a.t == JT_LIST) && (b.t == JT_INT || b.t == JT_BOOL)) return repeat(r, a, ival(b));
        if ((b.t == JT_STR || b.t == JT_LIST) && (a.t == JT_INT || a.t == JT_BOOL)) return repeat(r, b, ival(a));
        bad_operands(r, "*", a, b);
    case OP_DIV:
        if (jv_is_num(a) && jv_is_num(b)) {
            if (jv_num(b) == 0) jr_fail(r, "division by zero");
            return jv_float(jv_num(a) / jv_num(b));
        }
        bad_operands(r, "/", a, b);
    case OP_FDIV:
        if (both_int(a, b)) {
            int64_t p = ival(a), q = ival(b);
            if (q == 0) jr_fail(r, "integer division by zero");
            if (p == INT64_MIN && q == -1) jr_fail(r, "integer overflow");
            int64_t d = p / q;
            if ((p % q != 0) && ((p < 0) != (q < 0))) d--;
            return jv_int(d);
        }
        if (jv_is_num(a) && jv_is_num(b)) {
            if (jv_num(b) == 0) jr_fail(r, "float floor division by zero");
            return jv_float(floor(jv_num(a) / jv_num(b)));
        }
        bad_operands(r, "//", a, b);
    case OP_MOD:
        if (a.t == JT_STR) return jformat_percent(r, a, b);
        if (both_int(a, b)) {
            int64_t p = ival(a), q = ival(b);
            if (q == 0) jr_fail(r, "integer modulo by zero");
            if (q == -1) return jv_int(0);
            int64_t m = p % q;
            if (m != 0 && ((m < 0) != (q < 0))) m += q;
            return jv_int(m);
        }
        if (jv_is_num(a) && jv_is_num(b)) {
            double q = jv_num(b);
            if (q == 0) jr_fail(r, "float modulo");
            double m = fmod(jv_num(a), q);
            if (m != 0 && ((m < 0) != (q < 0))) m += q;
            return jv_float(m);
        }
        bad_operands(r, "%", a, b);
    case OP_POW:
        if (both_int(a, b) && ival(b) >= 0) {
            int64_t base = ival(a), e = ival(b), acc = 1;
            while (e--) {
                if (__builtin_mul_overflow(acc, base, &acc)) jr_fail(r, "integer overflow");
                jr_step(r);
            }
            return jv_int(acc);
        }
        if (jv_is_num(a) && jv_is_num(b)) return jv_float(pow(jv_num(a), jv_num(b)));
        bad_operands(r, "**", a, b);
    default: break;
    }
    jr_fail(r, "bad operator");
}

static int compare(jrender *r, jval a, jval b, const char *op) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (both_int(a, b)) return (ival(a) > ival(b)) - (ival(a) < ival(b));
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int k = memcmp(a.u.s.s, b.u.s.s, n);
        if (k) return k < 0 ? -1 : 1;
        return (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if (a.t == JT_LIST && b.t == JT_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return compare(r, a.u.l->v[i], b.u.l->v[i], op);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    if (a.t == JT_UNDEF) jr_fail(r, "'%s' is undefined", jv_undef_name(a));
    if (b.t == JT_UNDEF) jr_fail(r, "'%s' is undefined", jv_undef_name(b));
    jr_fail(r, "'%s' not supported between instances of '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static jval cmp_op(jrender *r, jop op, jval a, jval b) {
    switch (op) {
    case OP_EQ: return jv_bool(jv_equal(a, b));
    case OP_NE: return jv_bool(!jv_equal(a, b));
    case OP_LT: return jv_bool(compare(r, a, b, "<") < 0);
    case OP_LE: return jv_bool(compare(r, a, b, "<=") <= 0);
    case OP_GT: return jv_bool(compare(r, a, b, ">") > 0);
    case OP_GE: return jv_bool(compare(r, a, b, ">=") >= 0);
    case OP_IN: return jv_bool(jcontains(r, b, a));
    case OP_NOTIN: return jv_bool(!jcontains(r, b, a));
    default: jr_fail(r, "bad comparison");
    }
}

// --- calls ----------------------------------------------------------------------------------

typedef struct {
    jval *args;
    int nargs;
    const char **kw;
    jval *kwv;
    int nkw;
} jargs;

static jargs eval_args(jrender *r, const jnode *n) {
    jargs a = {0};
    a.nargs = n->nkids;
    a.args = n->nkids ? ja_alloc(&r->ar, sizeof(jval) * (size_t)n->nkids) : NULL;
    for (int i = 0; i < n->nkids; i++) a.args[i] = jeval(r, n->kids[i]);
    a.nkw = n->nkw;
    a.kw = n->kw;
    a.kwv = n->nkw ? ja_alloc(&r->ar, sizeof(jval) * (size_t)n->nkw) : NULL;
    for (int i = 0; i < n->nkw; i++) a.kwv[i] = jeval(r, n->kwv[i]);
    return a;
}

static void exec_block(jrender *r, const jnode *b, int *ctl);

jval jcall_macro(jrender *r, const jnode *m, const jval *args, int nargs, const char **kw,
                 const jval *kwv, int nkw) {
    if (r->depth >= r->max_depth) jr_fail(r, "macro calls nested deeper than %d", r->max_depth);
    if (nargs > m->nkw) jr_fail(r, "macro '%s' takes not more than %d argument(s)", m->name, m->nkw);
    jscope *saved = r->scope;
    jbuf *saved_out = r->out;
    jscope *s = push_scope(r, r->globals);
    r->scope = s;
    for (int i = 0; i < m->nkw; i++) {
        jval v = jv_undef(m->kw[i]);
        bool set = false;
        if (i < nargs) {
            v = args[i];
            set = true;
        }
        for (int k = 0; k < nkw; k++)
            if (!strcmp(kw[k], m->kw[i])) {
                v = kwv[k];
                set = true;
            }
        if (!set && m->kwv[i]) v = jeval(r, m->kwv[i]);
        assign(r, m->kw[i], v);
    }
    for (int k = 0; k < nkw; k++) {
        bool known = false;
        for (int i = 0; i < m->nkw; i++) known |= !strcmp(kw[k], m->kw[i]);
        if (!known) jr_fail(r, "macro '%s' has no argument '%s'", m->name, kw[k]);
    }
    jbuf out = {.limit = r->max_output};
    r->out = &out;
    r->depth++;
    int ctl = 0;
    exec_block(r, m->body, &ctl);
    r->depth--;
    r->out = saved_out;
    r->scope = saved;
    return out.p ? jb_to_str(r, &out) : jv_str("", 0);
}

static jval call_value(jrender *r, jval callee, jargs a) {
    switch (callee.t) {
    case JT_MACRO: return jcall_macro(r, callee.u.macro, a.args, a.nargs, a.kw, a.kwv, a.nkw);
    case JT_FUNC: return jcall_func(r, callee.u.func, a.args, a.nargs, a.kw, a.kwv, a.nkw);
    case JT_UNDEF: jr_fail(r, "'%s' is undefined", jv_undef_name(callee));
    default: jr_fail(r, "'%s' object is not callable", jv_type_name(callee));
    }
}

static jval eval_call(jrender *r, const jnode *e) {
    const jnode *f = e->a;
    if (f->kind == E_ATTR) {
        jval obj = jeval(r, f->a);
        if (obj.t == JT_UNDEF) jr_fail(r, "'%s' is undefined", jv_undef_name(obj));
        jargs a = eval_args(r, e);
        jval out;
        if (jmethod(r, obj, f->name, a.args, a.nargs, a.kw, a.kwv, a.nkw, &out)) return out;
        return call_value(r, jgetattr(r, obj, f->name, strlen(f->name)), a);
    }
    jval callee = jeval(r, f);
    return call_value(r, callee, eval_args(r, e));
}

// A filter node applied to `operand` (for chains in filter blocks, the
// innermost node has no operand: the block's text is it).
static jval apply_filter(jrender *r, const jnode *e, jval operand) {
    jargs a = eval_args(r, e);
    return jfilter(r, e->name, operand, a.args, a.nargs, a.kw, a.kwv, a.nkw, e->line);
}

static jval apply_chain(jrender *r, const jnode *e, jval text) {
    jval v = e->a ? apply_chain(r, e->a, text) : text;
    return apply_filter(r, e, v);
}

// --- expressions --------------------------------------------------------------------------

jval jeval(jrender *r, const jnode *e) {
    jr_step(r);
    switch (e->kind) {
    case E_CONST: return e->cval;
    case E_NAME: {
        bool found;
        return lookup(r, e->name, &found);
    }
    case E_ATTR: return jgetattr(r, jeval(r, e->a), e->name, strlen(e->name));
    case E_ITEM: {
        jval obj = jeval(r, e->a);
        return jgetitem(r, obj, jeval(r, e->b));
    }
    case E_SLICE: {
        jval obj = jeval(r, e->a);
        jval parts[3];
        for (int i = 0; i < 3; i++) parts[i] = e->kids[i] ? jeval(r, e->kids[i]) : jv_none();
        return do_slice(r, obj, parts[0], parts[1], parts[2]);
    }
    case E_CALL: return eval_call(r, e);
    case E_FILTER: {
        if (!e->a) jr_fail(r, "filter without an operand");
        jval v = jeval(r, e->a);
        return apply_filter(r, e, v);
    }
    case E_TEST: {
        jval v = jeval(r, e->a);
        jargs a = eval_args(r, e);
        bool t = jtest(r, e->name, v, a.args, a.nargs, e->line);
        return jv_bool(e->op ? !t : t);
    }
    case E_NOT: return jv_bool(!jv_truthy(jeval(r, e->a)));
    case E_NEG: {
        jval v = jeval(r, e->a);
        if (v.t == JT_INT || v.t == JT_BOOL) {
            if (ival(v) == INT64_MIN) jr_fail(r, "integer overflow");
            return jv_int(-ival(v));
        }
        if (v.t == JT_FLOAT) return jv_float(-v.u.f);
        jr_fail(r, "bad operand type for unary -: '%s'", jv_type_name(v));
    }
    case E_POS: {
        jval v = jeval(r, e->a);
        if (!jv_is_num(v)) jr_fail(r, "bad operand type for unary +: '%s'", jv_type_name(v));
        return v.t == JT_BOOL ? jv_int(v.u.b) : v;
    }
    case E_BIN: {
        jval a = jeval(r, e->a);
        return binary(r, (jop)e->op, a, jeval(r, e->b));
    }
    case E_CMP: {
        jval a = jeval(r, e->a);
        return cmp_op(r, (jop)e->op, a, jeval(r, e->b));
    }
    case E_AND: {
        jval a = jeval(r, e->a);
        return jv_truthy(a) ? jeval(r, e->b) : a;
    }
    case E_OR: {
        jval a = jeval(r, e->a);
        return jv_truthy(a) ? a : jeval(r, e->b);
    }
    case E_COND:
        if (jv_truthy(jeval(r, e->c))) return jeval(r, e->a);
        return e->b ? jeval(r, e->b) : jv_undef(NULL);
    case E_LIST: case E_TUPLE: {
        jval l = jv_list(r, (size_t)e->nkids);
        l.u.l->tuple = e->kind == E_TUPLE;
        for (int i = 0; i < e->nkids; i++) l.u.l->v[i] = jeval(r, e->kids[i]);
        return l;
    }
    case E_DICT: {
        jval d = jv_dict(r);
        for (int i = 0; i + 1 < e->nkids; i += 2) {
            jval k = jeval(r, e->kids[i]);
            jd_set(r, d.u.d, k, jeval(r, e->kids[i + 1]));
        }
        return d;
    }
    case E_CONCAT: {
        jbuf b = {0};
        for (int i = 0; i < e->nkids; i++) jv_str_into(r, &b, jeval(r, e->kids[i]));
        return b.p ? jb_to_str(r, &b) : jv_str("", 0);
    }
    default: jr_fail(r, "not an expression");
    }
}

// --- statements --------------------------------------------------------------------------

enum { CTL_NONE = 0, CTL_BREAK = 1, CTL_CONTINUE = 2 };

static void bind_target(jrender *r, const jnode *t, jval v) {
    if (t->kind == E_NAME) {
        assign(r, t->name, v);
        return;
    }
    if (t->kind == E_ATTR) {
        bool found;
        jval ns = lookup(r, t->a->name, &found);
        if (ns.t != JT_NS) jr_fail(r, "cannot assign attribute on non-namespace object");
        jd_set(r, ns.u.d, jv_strz(r, t->name), v);
        return;
    }
    // a tuple of names: unpack
    jval items = jiter_list(r, v);
    if ((int)items.u.l->n != t->nkids)
        jr_fail(r, "cannot unpack %zu values into %d names", items.u.l->n, t->nkids);
    for (int i = 0; i < t->nkids; i++) bind_target(r, t->kids[i], items.u.l->v[i]);
}

static jval capture(jrender *r, const jnode *body) {
    jbuf *saved = r->out;
    jbuf out = {.limit = r->max_output};
    r->out = &out;
    int ctl = 0;
    exec_block(r, body, &ctl);
    r->out = saved;
    return out.p ? jb_to_str(r, &out) : jv_str("", 0);
}

static void exec_for(jrender *r, const jnode *n) {
    jval items = jiter_list(r, jeval(r, n->b));
    jscope *outer = r->scope;
    if (n->c) {  // the loop filter runs first: loop.index and length count kept items only
        jval kept = jv_list(r, items.u.l->n);
        size_t k = 0;
        jscope *fs = push_scope(r, outer);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jr_step(r);
            fs->vars.n = 0;
            r->scope = fs;
            bind_target(r, n->a, items.u.l->v[i]);
            if (jv_truthy(jeval(r, n->c))) kept.u.l->v[k++] = items.u.l->v[i];
            r->scope = outer;
        }
        kept.u.l->n = k;
        items = kept;
    }
    jloop *lp = ja_alloc(&r->ar, sizeof *lp);
    lp->items = items.u.l;
    jval loopv = {.t = JT_LOOP};
    loopv.u.loop = lp;
    // One scope for all iterations, emptied at each: a set inside the body
    // does not outlive its iteration (jinja2), and a long loop does not
    // allocate per iteration (nothing keeps a pointer into a scope).
    jscope *is = push_scope(r, outer);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jr_step(r);
        lp->i = i;
        is->vars.n = 0;
        r->scope = is;
        bind_target(r, n->a, items.u.l->v[i]);
        assign(r, "loop", loopv);
        int ctl = CTL_NONE;
        exec_block(r, n->body, &ctl);
        r->scope = outer;
        if (ctl == CTL_BREAK) break;
    }
    if (!items.u.l->n && n->orelse) {
        int ctl = 0;
        exec_block(r, n->orelse, &ctl);
    }
}

static void exec_stmt(jrender *r, const jnode *n, int *ctl) {
    jr_step(r);
    r->line = n->line;
    switch (n->kind) {
    case N_TEXT: jb_add(r, r->out, n->cval.u.s.s, n->cval.u.s.n); return;
    case N_OUT: jv_str_into(r, r->out, jeval(r, n->a)); return;
    case N_IF:
        if (jv_truthy(jeval(r, n->a))) exec_block(r, n->body, ctl);
        else if (n->orelse) n->orelse->kind == N_IF ? exec_stmt(r, n->orelse, ctl) : exec_block(r, n->orelse, ctl);
        return;
    case N_FOR: exec_for(r, n); return;
    case N_SET: bind_target(r, n->a, jeval(r, n->b)); return;
    case N_SETBLOCK: {
        jval v = capture(r, n->body);
        if (n->a) v = apply_chain(r, n->a, v);
        assign(r, n->name, v);
        return;
    }
    case N_MACRO: {
        jval m = {.t = JT_MACRO};
        m.u.macro = n;
        assign(r, n->name, m);
        return;
    }
    case N_FILTERBLOCK: jv_str_into(r, r->out, apply_chain(r, n->a, capture(r, n->body))); return;
    case N_BREAK: *ctl = CTL_BREAK; return;
    case N_CONTINUE: *ctl = CTL_CONTINUE; return;
    case N_BLOCK: exec_block(r, n, ctl); return;
    default: jr_fail(r, "not a statement");
    }
}

static void exec_block(jrender *r, const jnode *b, int *ctl) {
    for (int i = 0; i < b->nkids && *ctl == CTL_NONE; i++) exec_stmt(r, b->kids[i], ctl);
}

// --- entry points ----------------------------------------------------------------------------

int pg_jinja_parse(const char *src, size_t len, pg_jinja_template **out) {
    *out = NULL;
    pg_jinja_template *t = pg_xcalloc(1, sizeof *t);
    jparse *p = pg_xcalloc(1, sizeof *p);
    p->ar = &t->ar;
    if (setjmp(p->jb)) {
        int rc = pg_err_set(PG_EINVAL, "%s", p->err);
        free(p);
        pg_jinja_free(t);
        return rc;
    }
    jlex(p, src, len);
    t->root = jparse_template(p);
    free(p);
    *out = t;
    return 0;
}

void pg_jinja_free(pg_jinja_template *t) {
    if (!t) return;
    ja_free_all(&t->ar);
    free(t);
}

int pg_jinja_render(const pg_jinja_template *t, const cJSON *ctx, const pg_jinja_limits *lim,
                    char **out) {
    *out = NULL;
    pg_jinja_limits L;
    if (lim) L = *lim;
    else pg_jinja_limits_default(&L);
    jrender *r = pg_xcalloc(1, sizeof *r);
    r->ar.cap = L.max_memory;
    r->ar.on_full = &r->jb;
    r->ar.err = r->err;
    r->ar.err_cap = sizeof r->err;
    r->max_steps = L.max_steps;
    r->max_output = L.max_output;
    r->max_depth = L.max_depth;
    int rc = 0;
    if (setjmp(r->jb)) {
        rc = pg_err_set(PG_EINVAL, "%s", r->err);
        goto done;
    }
    r->globals = r->scope = push_scope(r, NULL);
    if (ctx) {
        const cJSON *it;
        cJSON_ArrayForEach(it, ctx) if (it->string) assign(r, it->string, jv_from_json(r, it));
    }
    jbuf text = {.limit = L.max_output};
    r->out = &text;
    int ctl = 0;
    exec_block(r, t->root, &ctl);
    *out = pg_xmalloc(text.len + 1);
    if (text.len) memcpy(*out, text.p, text.len);
    (*out)[text.len] = 0;
done:
    ja_free_all(&r->ar);
    free(r);
    return rc;
}
