// server/metrics.h - a small Prometheus registry: counters, gauges and
// histograms with labels, rendered in the text exposition format 0.0.4.
//
// Single-threaded (the loop thread owns it). Families are created once at
// start-up; a child (one label-value combination) is created on first use.
// Names follow vLLM's metrics under a `paged:` prefix (docs/server.md).
#pragma once
#include <stddef.h>

#include "server/sbuf.h"

typedef enum { MET_COUNTER = 0, MET_GAUGE = 1, MET_HISTOGRAM = 2 } met_type;

typedef struct met_registry met_registry;
typedef struct met_family met_family;
typedef struct met_child met_child;

met_registry *met_registry_create(void);
void met_registry_free(met_registry *r);

// Registers a family. `name` is the exposition name (counters end in
// `_total`, as prometheus_client writes them). `labels` is a comma-separated
// list of label names ("" or NULL for none). Histogram buckets are upper
// bounds in ascending order (+Inf is added). Returns NULL on a bad name,
// label list or bucket list (a programming error: the caller PG_CHECKs).
met_family *met_counter(met_registry *r, const char *name, const char *help, const char *labels);
met_family *met_gauge(met_registry *r, const char *name, const char *help, const char *labels);
met_family *met_histogram(met_registry *r, const char *name, const char *help, const char *labels,
                          const double *buckets, int n_buckets);

// The child for these label values (as many as the family has labels;
// NULL for a family without labels). Created on first use.
met_child *met_child_get(met_family *f, const char *const *values);
// Drops every child of f (an info gauge whose labels change: one series).
// Children got before are freed.
void met_family_clear(met_family *f);

void met_inc(met_child *c, double v);      // counters (v >= 0) and gauges
void met_set(met_child *c, double v);      // gauges; counters mirrored from a monotonic source
void met_observe(met_child *c, double v);  // histograms

// Shorthands for families without labels.
static inline void met_inc0(met_family *f, double v) { met_inc(met_child_get(f, NULL), v); }
static inline void met_set0(met_family *f, double v) { met_set(met_child_get(f, NULL), v); }
static inline void met_observe0(met_family *f, double v) { met_observe(met_child_get(f, NULL), v); }
// Shorthand for one label.
static inline met_child *met_child1(met_family *f, const char *v) { return met_child_get(f, &v); }

// Current value of a counter/gauge child, or the count of a histogram.
double met_value(const met_child *c);
double met_hist_sum(const met_child *c);

// Appends the whole registry in the text format to `out`.
void met_render(const met_registry *r, sbuf *out);

// Appends, a second time and under other names, the families named
// `from` + one of `names` (NULL-terminated suffixes): each as `to` + suffix,
// same help, type, labels and values. For compatibility names
// (paged:num_requests_running also as vllm:num_requests_running).
void met_render_alias(const met_registry *r, sbuf *out, const char *from, const char *to,
                      const char *const *names);

// Bucket helpers: n exponential buckets start, start*factor, ...
int met_buckets_exp(double *out, int n, double start, double factor);
