// text/grammar/structured_gbnf_ir.c - the back half of the GBNF compiler
// (structured_gbnf.c parses): the rules while they are built (names,
// alternatives, the element budget of lim->max_elements), code-point
// classes split into UTF-8 byte sequences (so the matcher works on bytes
// only), and at the end the checks (left recursion) and the flattening into
// the rule IR of structured_int.h that the automaton runs on.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_gbnf_int.h"

// --- the IR ----------------------------------------------------------------------

void sg_ir_free(sg_ir *ir) {
    free(ir->el);
    free(ir->alts);
    free(ir->rules);
    free(ir->sets);
    free(ir->names);
    memset(ir, 0, sizeof *ir);
}

// --- parser state ----------------------------------------------------------------

int sg_gbnf_fail(parser *ps, int code, const char *fmt, ...) {
    if (ps->rc) return ps->rc;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = 1;
    for (const char *q = ps->s; q < ps->p && q < ps->end; q++) line += *q == '\n';
    if (ps->err_cap) snprintf(ps->err, ps->err_cap, "grammar line %d: %s", line, msg);
    ps->rc = code;
    return code;
}

static uint32_t hash_name(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static void hash_insert(parser *ps, int32_t id);

static void hash_rebuild(parser *ps) {
    free(ps->hash);
    ps->hash_cap = ps->hash_cap ? ps->hash_cap * 2 : 256;
    ps->hash = pg_xmalloc(sizeof(int32_t) * (size_t)ps->hash_cap);
    for (int32_t i = 0; i < ps->hash_cap; i++) ps->hash[i] = -1;
    for (int32_t i = 0; i < ps->n_rules; i++) hash_insert(ps, i);
}

static void hash_insert(parser *ps, int32_t id) {
    const char *nm = ps->rules[id].name;
    uint32_t h = hash_name(nm, strlen(nm)) & (uint32_t)(ps->hash_cap - 1);
    while (ps->hash[h] >= 0) h = (h + 1) & (uint32_t)(ps->hash_cap - 1);
    ps->hash[h] = id;
}

static int32_t rule_new(parser *ps, const char *name, size_t n) {
    if (ps->n_rules == ps->cap_rules) {
        ps->cap_rules = ps->cap_rules ? ps->cap_rules * 2 : 64;
        ps->rules = pg_xrealloc(ps->rules, sizeof(prule) * (size_t)ps->cap_rules);
    }
    prule *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof *r);
    r->name = pg_xmalloc(n + 1);
    memcpy(r->name, name, n);
    r->name[n] = 0;
    int32_t id = ps->n_rules++;
    if ((int64_t)ps->n_rules * 2 > ps->hash_cap)
        hash_rebuild(ps);
    else
        hash_insert(ps, id);
    return id;
}

int32_t sg_gbnf_rule_find_or_add(parser *ps, const char *name, size_t n) {
    if (ps->hash_cap) {
        uint32_t h = hash_name(name, n) & (uint32_t)(ps->hash_cap - 1);
        for (; ps->hash[h] >= 0; h = (h + 1) & (uint32_t)(ps->hash_cap - 1)) {
            const char *nm = ps->rules[ps->hash[h]].name;
            if (strlen(nm) == n && !memcmp(nm, name, n)) return ps->hash[h];
        }
    }
    return rule_new(ps, name, n);
}

int32_t sg_gbnf_helper_rule(parser *ps) {
    char nm[32];
    int n = snprintf(nm, sizeof nm, "_h%d", ps->n_helpers++);
    int32_t id = rule_new(ps, nm, (size_t)n);
    ps->rules[id].defined = true;
    return id;
}

int sg_gbnf_seq_push(parser *ps, seq *q, uint8_t kind, int32_t arg) {
    if (++ps->n_elems > ps->lim->max_elements)
        return sg_gbnf_fail(ps, PG_EUNSUPP, "the grammar expands to more than %d elements",
                    ps->lim->max_elements);
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 8;
        q->el = pg_xrealloc(q->el, sizeof(sg_elem) * (size_t)q->cap);
    }
    q->el[q->n++] = (sg_elem){kind, arg};
    return 0;
}

// Adds an alternative (taking q's storage) to rule r.
void sg_gbnf_rule_add_alt(parser *ps, int32_t r, seq *q) {
    prule *pr = &ps->rules[r];
    if (pr->n_alts == pr->cap_alts) {
        pr->cap_alts = pr->cap_alts ? pr->cap_alts * 2 : 2;
        pr->alts = pg_xrealloc(pr->alts, sizeof(seq) * (size_t)pr->cap_alts);
    }
    pr->alts[pr->n_alts++] = *q;
    memset(q, 0, sizeof *q);
    ps->n_elems++;  // its END
}

static int32_t set_new(parser *ps, const uint32_t bits[8]) {
    // Single bytes share the first 256 sets.
    int pop = 0, one = -1;
    for (int w = 0; w < 8; w++) {
        pop += __builtin_popcount(bits[w]);
        if (bits[w] && one < 0) one = w * 32 + __builtin_ctz(bits[w]);
    }
    if (pop == 1) return one;
    if (ps->n_sets == ps->cap_sets) {
        ps->cap_sets *= 2;
        ps->sets = pg_xrealloc(ps->sets, sizeof *ps->sets * (size_t)ps->cap_sets);
    }
    memcpy(ps->sets[ps->n_sets], bits, 32);
    return ps->n_sets++;
}

// --- UTF-8 splitting -------------------------------------------------------------

int sg_utf8_encode(uint32_t c, uint8_t *o) {
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

// Byte-range sequences of a code point class: single bytes gathered into
// one set, longer sequences one alternative each.
typedef struct {
    uint32_t ascii[8];
    bool any_ascii;
    uint8_t (*lo)[4], (*hi)[4];
    int *len;
    int n, cap;
} utf8_split;

static void split_emit(utf8_split *u, uint32_t lo, uint32_t hi) {
    uint8_t a[4], b[4];
    int n = sg_utf8_encode(lo, a);
    sg_utf8_encode(hi, b);
    if (n == 1) {
        for (uint32_t c = lo; c <= hi; c++) u->ascii[c >> 5] |= 1u << (c & 31);
        u->any_ascii = true;
        return;
    }
    if (u->n == u->cap) {
        u->cap = u->cap ? u->cap * 2 : 8;
        u->lo = pg_xrealloc(u->lo, 4 * (size_t)u->cap);
        u->hi = pg_xrealloc(u->hi, 4 * (size_t)u->cap);
        u->len = pg_xrealloc(u->len, sizeof(int) * (size_t)u->cap);
    }
    memcpy(u->lo[u->n], a, 4);
    memcpy(u->hi[u->n], b, 4);
    u->len[u->n++] = n;
}

// The UTF-8 range split of [lo, hi] (no surrogates inside), as in the
// classic regex-engine construction: cut at encoding-length boundaries,
// then until every continuation byte spans a full or aligned range.
static void split_range(utf8_split *u, uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    static const uint32_t maxes[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= maxes[i] && maxes[i] < hi) {
            split_range(u, lo, maxes[i]);
            split_range(u, maxes[i] + 1, hi);
            return;
        }
    if (hi < 0x80) {
        split_emit(u, lo, hi);
        return;
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                split_range(u, lo, lo | m);
                split_range(u, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                split_range(u, lo, (hi & ~m) - 1);
                split_range(u, hi & ~m, hi);
                return;
            }
        }
    }
    split_emit(u, lo, hi);
}

// Appends to q the elements matching one code point of `ranges` (sorted,
// merged, surrogates excluded): one byte set when all are ASCII, else a
// helper rule with one alternative per byte-sequence shape.
int sg_gbnf_emit_class(parser *ps, seq *q, const cp_range *ranges, int n) {
    utf8_split u = {0};
    for (int i = 0; i < n; i++) split_range(&u, ranges[i].lo, ranges[i].hi);
    int rc = 0;
    if (u.n == 0) {
        if (!u.any_ascii) {
            rc = sg_gbnf_fail(ps, PG_EINVAL, "a character class matches nothing");
        } else {
            rc = sg_gbnf_seq_push(ps, q, SG_BYTES, set_new(ps, u.ascii));
        }
        goto out;
    }
    int32_t h = sg_gbnf_helper_rule(ps);
    if (u.any_ascii) {
        seq a = {0};
        if ((rc = sg_gbnf_seq_push(ps, &a, SG_BYTES, set_new(ps, u.ascii))) < 0) goto out;
        sg_gbnf_rule_add_alt(ps, h, &a);
    }
    for (int i = 0; i < u.n; i++) {
        seq a = {0};
        for (int k = 0; k < u.len[i]; k++) {
            uint32_t bits[8] = {0};
            for (unsigned c = u.lo[i][k]; c <= u.hi[i][k]; c++) bits[c >> 5] |= 1u << (c & 31);
            if ((rc = sg_gbnf_seq_push(ps, &a, SG_BYTES, set_new(ps, bits))) < 0) {
                free(a.el);
                goto out;
            }
        }
        sg_gbnf_rule_add_alt(ps, h, &a);
    }
    rc = sg_gbnf_seq_push(ps, q, SG_REF, h);
out:
    free(u.lo);
    free(u.hi);
    free(u.len);
    return rc;
}

static int cmp_range(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

// Sorts and merges ranges in place, optionally complements them over
// [0, 0x10FFFF], and removes surrogates. Returns the new count; `out` must
// hold n + 2 ranges.
int sg_gbnf_normalize_ranges(cp_range *r, int n, bool negate, cp_range *out) {
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    int k = 0;
    cp_range *src = r;
    cp_range *comp = NULL;
    if (negate) {
        comp = pg_xmalloc(sizeof(cp_range) * (size_t)(m + 1));
        uint32_t next = 0;
        int c = 0;
        for (int i = 0; i < m; i++) {
            if (r[i].lo > next) comp[c++] = (cp_range){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= 0x10FFFF) comp[c++] = (cp_range){next, 0x10FFFF};
        src = comp;
        m = c;
    }
    for (int i = 0; i < m; i++) {
        uint32_t lo = src[i].lo, hi = src[i].hi > 0x10FFFF ? 0x10FFFF : src[i].hi;
        if (lo > hi) continue;
        if (lo < 0xD800 && hi > 0xDFFF) {
            out[k++] = (cp_range){lo, 0xD7FF};
            out[k++] = (cp_range){0xE000, hi};
        } else if (lo >= 0xD800 && hi <= 0xDFFF) {
            continue;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            out[k++] = (cp_range){0xE000, hi};
        } else if (hi >= 0xD800 && hi <= 0xDFFF) {
            out[k++] = (cp_range){lo, 0xD7FF};
        } else {
            out[k++] = (cp_range){lo, hi};
        }
    }
    free(comp);
    return k;
}

// --- checks and flattening -------------------------------------------------------

// Left recursion (a rule reaching itself before consuming a byte) would
// make the matcher's closure loop forever: refused here.
int sg_gbnf_check_left_recursion(parser *ps, sg_ir *ir) {
    int32_t nr = ir->n_rules;
    bool *nullable = pg_xcalloc((size_t)nr, 1);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < nr; r++) {
            if (nullable[r]) continue;
            for (int32_t a = 0; a < ir->rules[r].n_alts && !nullable[r]; a++) {
                int32_t p = ir->alts[ir->rules[r].first_alt + a];
                while (ir->el[p].kind == SG_REF && nullable[ir->el[p].arg]) p++;
                if (ir->el[p].kind == SG_END) nullable[r] = changed = true;
            }
        }
    }
    // Iterative DFS over "may start with" edges; colour 1 = on the path.
    uint8_t *colour = pg_xcalloc((size_t)nr, 1);
    int32_t *stack_r = pg_xmalloc(sizeof(int32_t) * (2 * (size_t)nr + 2));
    int32_t *stack_i = stack_r + nr + 1;
    int rc = 0;
    for (int32_t s = 0; s < nr && !rc; s++) {
        if (colour[s]) continue;
        int sp = 0;
        stack_r[0] = s;
        stack_i[0] = 0;
        colour[s] = 1;
        // stack_i counts edges visited: (alt, elem) flattened by walking.
        while (sp >= 0 && !rc) {
            int32_t r = stack_r[sp];
            // enumerate edges of r: the k-th left-reachable REF
            int32_t k = stack_i[sp]++, seen = 0, target = -1;
            for (int32_t a = 0; a < ir->rules[r].n_alts && target < 0; a++) {
                for (int32_t p = ir->alts[ir->rules[r].first_alt + a]; ir->el[p].kind == SG_REF; p++) {
                    if (seen++ == k) {
                        target = ir->el[p].arg;
                        break;
                    }
                    if (!nullable[ir->el[p].arg]) break;
                }
            }
            if (target < 0) {
                colour[r] = 2;
                sp--;
                continue;
            }
            if (colour[target] == 1) {
                ps->p = ps->s;
                rc = sg_gbnf_fail(ps, PG_EINVAL, "left recursion through rule '%s'",
                          ir->names + ir->rules[target].name);
            } else if (colour[target] == 0) {
                colour[target] = 1;
                sp++;
                stack_r[sp] = target;
                stack_i[sp] = 0;
            }
        }
    }
    free(stack_r);
    free(colour);
    free(nullable);
    return rc;
}

void sg_gbnf_flatten(parser *ps, sg_ir *ir) {
    int64_t n_el = 0, n_alts = 0;
    size_t names = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        n_alts += ps->rules[r].n_alts;
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) n_el += ps->rules[r].alts[a].n + 1;
        names += strlen(ps->rules[r].name) + 1;
    }
    ir->el = pg_xmalloc(sizeof(sg_elem) * (size_t)(n_el + 1));
    ir->alts = pg_xmalloc(sizeof(int32_t) * (size_t)(n_alts + 1));
    ir->rules = pg_xmalloc(sizeof(sg_rule) * (size_t)ps->n_rules);
    ir->names = pg_xmalloc(names + 1);
    ir->n_rules = ps->n_rules;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        prule *pr = &ps->rules[r];
        ir->rules[r] = (sg_rule){ir->n_alts, pr->n_alts, (int32_t)ir->names_len};
        size_t nl = strlen(pr->name) + 1;
        memcpy(ir->names + ir->names_len, pr->name, nl);
        ir->names_len += nl;
        for (int32_t a = 0; a < pr->n_alts; a++) {
            ir->alts[ir->n_alts++] = ir->n_el;
            if (pr->alts[a].n)
                memcpy(ir->el + ir->n_el, pr->alts[a].el, sizeof(sg_elem) * (size_t)pr->alts[a].n);
            ir->n_el += pr->alts[a].n;
            ir->el[ir->n_el++] = (sg_elem){SG_END, 0};
        }
    }
    ir->sets = ps->sets;
    ir->n_sets = ps->n_sets;
    ps->sets = NULL;
}

void sg_gbnf_parser_free(parser *ps) {
    for (int32_t r = 0; r < ps->n_rules; r++) {
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) free(ps->rules[r].alts[a].el);
        free(ps->rules[r].alts);
        free(ps->rules[r].name);
    }
    free(ps->rules);
    free(ps->hash);
    free(ps->sets);
}
