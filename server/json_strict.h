// server/json_strict.h - an RFC 8259 grammar check run before cJSON.
//
// cJSON is lenient: it reads `01`, `1.`, `-`, `.5` and raw control
// characters inside strings. A request that another component (a proxy, a
// logger, a Python client) reads differently is a smuggling and
// confusion risk, so request bodies are checked against the grammar first
// and cJSON only ever sees text that is strict JSON. Duplicate object keys
// are refused as well (json_strict_dup_key): RFC 8259 leaves their meaning
// open (cJSON takes the first, Python the last), so paged takes neither.
//
// Pure functions, any thread.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

// Deepest nesting of arrays and objects accepted (cJSON's own limit is 1000).
#define JSON_STRICT_MAX_DEPTH 512

// Checks that s[0..n) is exactly one JSON value (RFC 8259 grammar) with only
// whitespace around it and nesting at most JSON_STRICT_MAX_DEPTH. Returns
// true when it is; otherwise false with *err_off the byte offset of the
// first offending byte and *why a static reason ("leading zero in a
// number", ...). UTF-8 validity is not checked here (api_utf8_valid is).
bool json_strict_check(const char *s, size_t n, size_t *err_off, const char **why);

// The first object key (depth-first) that appears twice in one object of
// the parsed tree, or NULL when every object's keys are distinct.
// O(k log k) per object of k keys.
const char *json_strict_dup_key(const cJSON *root);
