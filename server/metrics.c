// server/metrics.c - Prometheus registry and text exposition.
#include "server/metrics.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define MET_MAX_LABELS 4
#define MET_MAX_BUCKETS 64

struct met_child {
    const met_family *family;
    char **values;         // [family n_labels]
    double value;          // counter / gauge
    double sum;            // histogram
    double count;
    double *buckets;       // histograms: [n_buckets] per-bucket counts (cumulated at render)
    met_child *next;
};

struct met_family {
    char *name, *help;
    met_type type;
    int n_labels;
    char *labels[MET_MAX_LABELS];
    int n_buckets;
    double bounds[MET_MAX_BUCKETS];
    met_child *children;   // in creation order
    met_child **tail;
    met_family *next;
};

struct met_registry {
    met_family *head, **tail;
};

met_registry *met_registry_create(void) {
    met_registry *r = pg_xcalloc(1, sizeof *r);
    r->tail = &r->head;
    return r;
}

static void child_free(met_child *c, int n_labels) {
    for (int i = 0; i < n_labels; i++) free(c->values[i]);
    free(c->values);
    free(c->buckets);
    free(c);
}

void met_registry_free(met_registry *r) {
    if (!r) return;
    for (met_family *f = r->head; f;) {
        met_family *nf = f->next;
        for (met_child *c = f->children; c;) {
            met_child *nc = c->next;
            child_free(c, f->n_labels);
            c = nc;
        }
        for (int i = 0; i < f->n_labels; i++) free(f->labels[i]);
        free(f->name);
        free(f->help);
        free(f);
        f = nf;
    }
    free(r);
}

// Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names the same without ':'.
static bool valid_name(const char *s, size_t n, bool colon) {
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
                  (colon && ch == ':') || (i > 0 && ch >= '0' && ch <= '9');
        if (!ok) return false;
    }
    return true;
}

static met_family *family_new(met_registry *r, const char *name, const char *help,
                              const char *labels, met_type type) {
    if (!name || !valid_name(name, strlen(name), true)) return NULL;
    met_family *f = pg_xcalloc(1, sizeof *f);
    f->name = pg_xstrdup(name);
    f->help = pg_xstrdup(help ? help : "");
    f->type = type;
    f->tail = &f->children;
    for (const char *p = labels; p && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (f->n_labels == MET_MAX_LABELS || !valid_name(p, n, false) ||
            (n == 2 && !memcmp(p, "le", 2) && type == MET_HISTOGRAM)) {
            for (int i = 0; i < f->n_labels; i++) free(f->labels[i]);
            free(f->name);
            free(f->help);
            free(f);
            return NULL;
        }
        f->labels[f->n_labels] = pg_xmalloc(n + 1);
        memcpy(f->labels[f->n_labels], p, n);
        f->labels[f->n_labels++][n] = 0;
        p = e ? e + 1 : p + n;
    }
    *r->tail = f;
    r->tail = &f->next;
    return f;
}

met_family *met_counter(met_registry *r, const char *name, const char *help, const char *labels) {
    return family_new(r, name, help, labels, MET_COUNTER);
}

met_family *met_gauge(met_registry *r, const char *name, const char *help, const char *labels) {
    return family_new(r, name, help, labels, MET_GAUGE);
}

met_family *met_histogram(met_registry *r, const char *name, const char *help, const char *labels,
                          const double *buckets, int n_buckets) {
    if (n_buckets < 1 || n_buckets > MET_MAX_BUCKETS) return NULL;
    for (int i = 0; i < n_buckets; i++)
        if (!isfinite(buckets[i]) || (i > 0 && !(buckets[i] > buckets[i - 1]))) return NULL;
    met_family *f = family_new(r, name, help, labels, MET_HISTOGRAM);
    if (!f) return NULL;
    f->n_buckets = n_buckets;
    memcpy(f->bounds, buckets, sizeof(double) * (size_t)n_buckets);
    return f;
}

void met_family_clear(met_family *f) {
    for (met_child *c = f->children; c;) {
        met_child *nc = c->next;
        child_free(c, f->n_labels);
        c = nc;
    }
    f->children = NULL;
    f->tail = &f->children;
}

met_child *met_child_get(met_family *f, const char *const *values) {
    for (met_child *c = f->children; c; c = c->next) {
        bool same = true;
        for (int i = 0; i < f->n_labels && same; i++) same = !strcmp(c->values[i], values[i]);
        if (same) return c;
    }
    met_child *c = pg_xcalloc(1, sizeof *c);
    c->family = f;
    c->values = pg_xcalloc((size_t)(f->n_labels ? f->n_labels : 1), sizeof(char *));
    for (int i = 0; i < f->n_labels; i++) c->values[i] = pg_xstrdup(values[i] ? values[i] : "");
    if (f->type == MET_HISTOGRAM) c->buckets = pg_xcalloc((size_t)f->n_buckets, sizeof(double));
    *f->tail = c;
    f->tail = &c->next;
    return c;
}

void met_inc(met_child *c, double v) {
    if (c) c->value += v;
}

void met_set(met_child *c, double v) {
    if (c) c->value = v;
}

double met_value(const met_child *c) { return c ? (c->buckets ? c->count : c->value) : 0; }
double met_hist_sum(const met_child *c) { return c ? c->sum : 0; }

void met_observe(met_child *c, double v) {
    if (!c || !c->buckets || isnan(v)) return;
    int n = c->family->n_buckets;
    const double *b = c->family->bounds;
    c->sum += v;
    c->count += 1;
    for (int i = 0; i < n; i++)
        if (v <= b[i]) {
            c->buckets[i] += 1;
            return;
        }
}

int met_buckets_exp(double *out, int n, double start, double factor) {
    double v = start;
    for (int i = 0; i < n; i++, v *= factor) out[i] = v;
    return n;
}

// --- rendering ------------------------------------------------------------------

static void put_number(sbuf *o, double v) {
    if (isnan(v))
        sbuf_puts(o, "NaN");
    else if (isinf(v))
        sbuf_puts(o, v > 0 ? "+Inf" : "-Inf");
    else if (v == (double)(long long)v && fabs(v) < 1e15)
        sbuf_printf(o, "%lld", (long long)v);
    else {
        // The shortest form that reads back exactly (0.1, not 0.10000000000000001).
        char buf[32];
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
        sbuf_puts(o, buf);
    }
}

static void put_escaped(sbuf *o, const char *s, bool help) {
    for (; *s; s++) {
        if (*s == '\\')
            sbuf_puts(o, "\\\\");
        else if (*s == '\n')
            sbuf_puts(o, "\\n");
        else if (*s == '"' && !help)
            sbuf_puts(o, "\\\"");
        else
            sbuf_append(o, s, 1);
    }
}

// {a="x",b="y"[,le="..."]}; nothing when there are no labels and no le.
static void put_labels(sbuf *o, const met_family *f, const met_child *c, const char *le) {
    if (f->n_labels == 0 && !le) return;
    sbuf_puts(o, "{");
    for (int i = 0; i < f->n_labels; i++) {
        if (i) sbuf_puts(o, ",");
        sbuf_printf(o, "%s=\"", f->labels[i]);
        put_escaped(o, c->values[i], false);
        sbuf_puts(o, "\"");
    }
    if (le) sbuf_printf(o, "%sle=\"%s\"", f->n_labels ? "," : "", le);
    sbuf_puts(o, "}");
}

// One family under `name` (its own, or an alias).
static void render_family(sbuf *o, const met_family *f, const char *name) {
    static const char *types[] = {"counter", "gauge", "histogram"};
    sbuf_printf(o, "# HELP %s ", name);
    put_escaped(o, f->help, true);
    sbuf_printf(o, "\n# TYPE %s %s\n", name, types[f->type]);
    for (const met_child *c = f->children; c; c = c->next) {
        if (f->type != MET_HISTOGRAM) {
            sbuf_puts(o, name);
            put_labels(o, f, c, NULL);
            sbuf_puts(o, " ");
            put_number(o, c->value);
            sbuf_puts(o, "\n");
            continue;
        }
        double cum = 0;
        char le[64];
        for (int i = 0; i < f->n_buckets; i++) {
            cum += c->buckets[i];
            sbuf_printf(o, "%s_bucket", name);
            sbuf tmp = {0};
            put_number(&tmp, f->bounds[i]);
            snprintf(le, sizeof le, "%s", sbuf_str(&tmp));
            sbuf_free(&tmp);
            put_labels(o, f, c, le);
            sbuf_puts(o, " ");
            put_number(o, cum);
            sbuf_puts(o, "\n");
        }
        sbuf_printf(o, "%s_bucket", name);
        put_labels(o, f, c, "+Inf");
        sbuf_puts(o, " ");
        put_number(o, c->count);
        sbuf_printf(o, "\n%s_sum", name);
        put_labels(o, f, c, NULL);
        sbuf_puts(o, " ");
        put_number(o, c->sum);
        sbuf_printf(o, "\n%s_count", name);
        put_labels(o, f, c, NULL);
        sbuf_puts(o, " ");
        put_number(o, c->count);
        sbuf_puts(o, "\n");
    }
}

void met_render(const met_registry *r, sbuf *o) {
    for (const met_family *f = r->head; f; f = f->next) render_family(o, f, f->name);
}

void met_render_alias(const met_registry *r, sbuf *o, const char *from, const char *to,
                      const char *const *names) {
    size_t nf = strlen(from);
    for (const met_family *f = r->head; f; f = f->next) {
        if (strncmp(f->name, from, nf)) continue;
        const char *rest = f->name + nf;
        bool listed = false;
        for (const char *const *n = names; *n && !listed; n++) listed = !strcmp(*n, rest);
        if (!listed) continue;
        sbuf alias = {0};
        sbuf_printf(&alias, "%s%s", to, rest);
        render_family(o, f, sbuf_str(&alias));
        sbuf_free(&alias);
    }
}
