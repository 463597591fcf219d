// text/template/jinja_access.c - what an expression does to a value without
// evaluating anything: obj.name, obj[key], iterating a value as a list and
// Python's `in`. The evaluator and the builtins (filters such as map or
// selectattr, tests such as `in`) both need them; here, below both, they
// keep the builtins from calling back into the evaluator.
#include <string.h>

#include "text/template/jinja_int.h"

jval jgetattr(jrender *r, jval obj, const char *name, size_t n) {
    switch (obj.t) {
    case JT_UNDEF: jr_fail(r, "'%s' is undefined", jv_undef_name(obj));
    case JT_DICT: case JT_NS: {
        bool found;
        jval v = jd_get(obj.u.d, name, n, &found);
        return found ? v : jv_undef(name);
    }
    case JT_LOOP: {
        const jloop *l = obj.u.loop;
        int64_t i = (int64_t)l->i, len = (int64_t)l->items->n;
#define IS(s) (n == strlen(s) && !memcmp(name, s, n))
        if (IS("index")) return jv_int(i + 1);
        if (IS("index0")) return jv_int(i);
        if (IS("revindex")) return jv_int(len - i);
        if (IS("revindex0")) return jv_int(len - i - 1);
        if (IS("first")) return jv_bool(i == 0);
        if (IS("last")) return jv_bool(i == len - 1);
        if (IS("length")) return jv_int(len);
        if (IS("depth")) return jv_int(1);
        if (IS("depth0")) return jv_int(0);
        if (IS("previtem")) return i > 0 ? l->items->v[i - 1] : jv_undef("previtem");
        if (IS("nextitem")) return i + 1 < len ? l->items->v[i + 1] : jv_undef("nextitem");
#undef IS
        return jv_undef(name);
    }
    default: return jv_undef(name);
    }
}

jval jgetitem(jrender *r, jval obj, jval key) {
    int64_t i;
    switch (obj.t) {
    case JT_UNDEF: jr_fail(r, "'%s' is undefined", jv_undef_name(obj));
    case JT_DICT: case JT_NS:
        for (size_t k = 0; k < obj.u.d->n; k++)
            if (jv_equal(obj.u.d->k[k], key)) return obj.u.d->v[k];
        return jv_undef(key.t == JT_STR ? ja_strndup(&r->ar, key.u.s.s, key.u.s.n) : NULL);
    case JT_LIST:
        if (!jv_as_index(key, &i)) return jv_undef(NULL);
        if (i < 0) i += (int64_t)obj.u.l->n;
        if (i < 0 || i >= (int64_t)obj.u.l->n) return jv_undef(NULL);
        return obj.u.l->v[i];
    case JT_STR: {
        if (!jv_as_index(key, &i)) return jv_undef(NULL);
        int64_t len = (int64_t)utf8_len(obj.u.s.s, obj.u.s.n);
        if (i < 0) i += len;
        if (i < 0 || i >= len) return jv_undef(NULL);
        size_t a = utf8_offset(obj.u.s.s, obj.u.s.n, (size_t)i), b = utf8_offset(obj.u.s.s, obj.u.s.n, (size_t)i + 1);
        return jv_str(obj.u.s.s + a, b - a);
    }
    case JT_LOOP:
        if (key.t == JT_STR) return jgetattr(r, obj, key.u.s.s, key.u.s.n);
        return jv_undef(NULL);
    default: return jv_undef(NULL);
    }
}

jval jiter_list(jrender *r, jval v) {
    switch (v.t) {
    case JT_UNDEF: return jv_list(r, 0);
    case JT_LIST: return v;
    case JT_DICT: {
        jval l = jv_list(r, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) l.u.l->v[i] = v.u.d->k[i];
        return l;
    }
    case JT_STR: {
        size_t n = utf8_len(v.u.s.s, v.u.s.n);
        jval l = jv_list(r, n);
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            size_t e = off + 1;
            while (e < v.u.s.n && ((unsigned char)v.u.s.s[e] & 0xC0) == 0x80) e++;
            l.u.l->v[i] = jv_str(v.u.s.s + off, e - off);
            off = e;
        }
        return l;
    }
    default: jr_fail(r, "'%s' object is not iterable", jv_type_name(v));
    }
}

bool jcontains(jrender *r, jval hay, jval needle) {
    jr_step(r);
    switch (hay.t) {
    case JT_STR:
        if (needle.t != JT_STR) jr_fail(r, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        if (!needle.u.s.n) return true;
        return memmem(hay.u.s.s, hay.u.s.n, needle.u.s.s, needle.u.s.n) != NULL;
    case JT_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jv_equal(hay.u.l->v[i], needle)) return true;
        return false;
    case JT_DICT: case JT_NS:
        for (size_t i = 0; i < hay.u.d->n; i++)
            if (jv_equal(hay.u.d->k[i], needle)) return true;
        return false;
    case JT_UNDEF: return false;
    default: jr_fail(r, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}
