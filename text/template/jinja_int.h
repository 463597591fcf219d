// text/template/jinja_int.h - what the parts of the Jinja engine share (not public).
//
// jinja_lex.c      source -> tokens (whitespace control, trim/lstrip_blocks)
// jinja_parse.c    tokens -> AST
// jinja_value.c    the value type, the arena, str()/repr()/json.dumps(), and
//                  the render's error exits and step count
// jinja_access.c   obj.name, obj[key], iteration as a list, `in`
// jinja_strings.c  string filters and str methods, `%` formatting, escaping
// jinja_filters.c  the filter and method entry points; list, dict and number
//                  filters, dict and list methods
// jinja_tests.c    tests (`is defined`, ...) and the global functions
// jinja_eval.c     statements and expressions over values
//
// Calls between the files go one way (docs/chat_templates.md has the graph,
// tools/file_calls.py checks it): eval -> filters -> strings, tests ->
// access -> value; lex and parse -> value. Nothing below eval calls into
// it, so nothing a filter or test does can re-enter the evaluator.
//
// Memory: everything of one parse (tokens, AST) lives in the template's
// arena, everything of one render (values, strings) in the render's arena;
// both are freed at once, so no value is reference counted. Errors unwind
// with longjmp to the entry point (pg_jinja_parse / pg_jinja_render), which
// is safe because nothing between holds a resource outside an arena.
#pragma once
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// --- arena ----------------------------------------------------------------------

typedef struct jchunk jchunk;
typedef struct jarena {
    jchunk *head;
    size_t total, cap;       // bytes handed out; cap 0 = unbounded
    jmp_buf *on_full;        // where to jump when cap is passed
    char *err;               // message buffer set before the jump
    size_t err_cap;
} jarena;

void *ja_alloc(jarena *a, size_t n);          // zeroed, 8-aligned
char *ja_strndup(jarena *a, const char *s, size_t n);
void ja_free_all(jarena *a);

// --- growable text buffer (in the render arena; output and string building) --------

typedef struct jbuf {
    char *p;
    size_t len, cap;
    size_t limit;            // 0 = unbounded; passing it calls the render error
} jbuf;

// --- values -------------------------------------------------------------------------

typedef enum {
    JT_UNDEF = 0, JT_NONE, JT_BOOL, JT_INT, JT_FLOAT, JT_STR, JT_LIST, JT_DICT,
    JT_NS,      // namespace(): a dict whose attributes `set` may assign
    JT_MACRO,   // a {% macro %} (points at its AST node)
    JT_FUNC,    // a global function (range, namespace, raise_exception, ...)
    JT_LOOP,    // the `loop` variable of a for loop
} jtype;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jloop jloop;
typedef struct jnode jnode;

typedef struct jval {
    jtype t;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *s; size_t n; } s;   // UTF-8, not NUL-terminated
        jlist *l;
        jdict *d;                                  // JT_DICT and JT_NS
        const jnode *macro;
        int func;
        jloop *loop;
    } u;
    const char *name;        // JT_UNDEF: the missing name, for messages (may be NULL)
    bool markup;             // JT_STR from |safe or |escape: markupsafe.Markup, which
                             // escapes the plain string it is added to (as jinja2 does)
} jval;

struct jlist { jval *v; size_t n; bool tuple; };   // tuple: str() as (a, b)
struct jdict { jval *k; jval *v; size_t n, cap; };   // keys are strings (or ints); insertion order
struct jloop {
    const jlist *items;
    size_t i;
};

static inline jval jv_undef(const char *name) { jval v = {.t = JT_UNDEF}; v.name = name; return v; }
static inline jval jv_none(void) { jval v = {.t = JT_NONE}; return v; }
static inline jval jv_bool(bool b) { jval v = {.t = JT_BOOL}; v.u.b = b; return v; }
static inline jval jv_int(int64_t i) { jval v = {.t = JT_INT}; v.u.i = i; return v; }
static inline jval jv_float(double f) { jval v = {.t = JT_FLOAT}; v.u.f = f; return v; }
static inline jval jv_str(const char *s, size_t n) { jval v = {.t = JT_STR}; v.u.s.s = s; v.u.s.n = n; return v; }

// --- the render state (jinja_eval.c drives it; jinja_value.c fails it) ----------------

typedef struct jscope jscope;
typedef struct jrender {
    jarena ar;
    jbuf *out;               // where text goes now (swapped for set blocks, macros)
    jmp_buf jb;
    char err[512];
    jscope *scope, *globals;
    size_t steps, max_steps, max_output;
    int depth, max_depth;
    int line;                // template line of the statement running (for messages)
} jrender;

// Fails the render with a message (never returns).
_Noreturn void jr_fail(jrender *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// raise_exception(msg): fails with msg verbatim (never returns).
_Noreturn void jr_raise(jrender *r, const char *msg, size_t n);
void jr_step(jrender *r);    // counts one step, fails past the limit

// --- jinja_value.c --------------------------------------------------------------------

// The name an undefined value was looked up under, for messages.
static inline const char *jv_undef_name(jval v) { return v.name ? v.name : "value"; }
// An int or bool key as an index (Python's __index__).
static inline bool jv_as_index(jval k, int64_t *out) {
    if (k.t == JT_INT) { *out = k.u.i; return true; }
    if (k.t == JT_BOOL) { *out = k.u.b; return true; }
    return false;
}

void jb_add(jrender *r, jbuf *b, const char *s, size_t n);
void jb_addc(jrender *r, jbuf *b, char c);
void jb_addz(jrender *r, jbuf *b, const char *s);
jval jb_to_str(jrender *r, jbuf *b);   // the text as a JT_STR; b is left empty

jval jv_strz(jrender *r, const char *s);
jval jv_list(jrender *r, size_t n);          // n undef items, to be filled
jval jv_dict(jrender *r);
void jl_push(jrender *r, jval *l, size_t *cap, jval v);   // append, growing *cap
void jd_set(jrender *r, jdict *d, jval k, jval v);
jval jd_get(const jdict *d, const char *k, size_t n, bool *found);
jval jv_from_json(jrender *r, const void *cjson);

bool jv_truthy(jval v);
bool jv_equal(jval a, jval b);
bool jv_is_num(jval v);                      // int, float or bool
double jv_num(jval v);
const char *jv_type_name(jval v);
// Python's str(v) appended to b; repr(v) for strings inside containers.
void jv_str_into(jrender *r, jbuf *b, jval v);
void jv_repr_into(jrender *r, jbuf *b, jval v);
jval jv_to_string(jrender *r, jval v);       // a JT_STR (v itself when it is one)
// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys): indent
// NULL for none; seps NULL for Python's defaults.
void jv_json_into(jrender *r, jbuf *b, jval v, const char *indent, const char *item_sep,
                  const char *key_sep, bool sort_keys, int level);
void jfloat_repr(double f, char *out, size_t cap);
size_t utf8_len(const char *s, size_t n);           // code points
size_t utf8_offset(const char *s, size_t n, size_t cp);   // byte offset of code point cp

// --- AST --------------------------------------------------------------------------------

typedef enum {
    // statements
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_FILTERBLOCK, N_BREAK, N_CONTINUE,
    N_BLOCK,        // a list of statements (kids)
    // expressions
    E_CONST, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG, E_POS,
    E_BIN, E_AND, E_OR, E_COND, E_LIST, E_TUPLE, E_DICT, E_CONCAT, E_CMP,
} jkind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW,
               OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN } jop;

struct jnode {
    jkind kind;
    int line;
    int op;                  // E_BIN/E_CMP: jop; E_TEST: negated
    const char *name;        // E_NAME, E_ATTR, E_FILTER, E_TEST, N_MACRO, N_SETBLOCK
    jval cval;               // E_CONST (strings point into the template arena)
    jnode *a, *b, *c;        // operands / cond / iter / value
    jnode **kids;            // args, items, statements, targets
    int nkids;
    const char **kw;         // keyword names of a call, filter or test; macro params
    jnode **kwv;             // their values; macro param defaults (NULL = none)
    int nkw;
    jnode *body, *orelse;    // N_BLOCK bodies
};

// --- lexer / parser ------------------------------------------------------------------

typedef enum { TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME,
               TK_STRING, TK_INT, TK_FLOAT, TK_OP, TK_EOF } jtok_kind;

typedef struct jtok {
    jtok_kind kind;
    int line;
    const char *s;           // TK_DATA/TK_STRING: decoded text; TK_NAME/TK_OP: the text
    size_t n;
    int64_t i;
    double f;
} jtok;

typedef struct jparse {
    jarena *ar;
    jmp_buf jb;
    char err[256];
    jtok *toks;
    size_t ntoks, pos;
    int depth;
} jparse;

_Noreturn void jp_fail(jparse *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// Tokenizes src into p->toks (arena).
void jlex(jparse *p, const char *src, size_t len);
// Parses the token stream into a N_BLOCK.
jnode *jparse_template(jparse *p);

// --- jinja_eval.c ---------------------------------------------------------------------

jval jeval(jrender *r, const jnode *e);
jval jcall_macro(jrender *r, const jnode *m, const jval *args, int nargs, const char **kw,
                 const jval *kwv, int nkw);

// --- the builtins: jinja_filters.c, jinja_tests.c, jinja_strings.c ------------------------

// Filters, tests, methods and global functions. `name` is the filter/test/method.
jval jfilter(jrender *r, const char *name, jval v, const jval *args, int nargs, const char **kw,
             const jval *kwv, int nkw, int line);
bool jtest(jrender *r, const char *name, jval v, const jval *args, int nargs, int line);
bool jmethod(jrender *r, jval self, const char *name, const jval *args, int nargs,
             const char **kw, const jval *kwv, int nkw, jval *out);
jval jcall_func(jrender *r, int func, const jval *args, int nargs, const char **kw,
                const jval *kwv, int nkw);
enum { JF_RANGE, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME, JF_COUNT };
extern const char *const jfunc_names[JF_COUNT];

// --- jinja_access.c -------------------------------------------------------------------

// obj.name for a loop object, a namespace or a dict (attribute lookup order as
// Jinja's getattr: attribute first, then item).
jval jgetattr(jrender *r, jval obj, const char *name, size_t n);
jval jgetitem(jrender *r, jval obj, jval key);
jval jiter_list(jrender *r, jval v);   // a JT_LIST of the items of v (dict: keys; string: chars)
bool jcontains(jrender *r, jval hay, jval needle);   // Python's `needle in hay`

// --- jinja_strings.c ---------------------------------------------------------------------

jval jhtml_escape(jrender *r, jval s);                // markupsafe.escape (a Markup)
jval jformat_percent(jrender *r, jval fmt, jval args); // Python's `fmt % args`
