// tests/unit/rng_test_util.h - the seeded random numbers the unit tests draw
// their inputs from (test_attention.c, test_kv_cache.c, test_llama_compat.c,
// test_structured.c, and through backend_test_util.h test_backend_prof.c and
// test_gemma_ops.c): one 64-bit LCG (Knuth's MMIX multiplier and increment)
// and the ways its next state becomes a number. Each test keeps its own state
// and seed, so it draws the sequence it always drew. Static inline functions:
// each test binary is one .c file and gets its own copy.
#ifndef PAGED_TESTS_UNIT_RNG_TEST_UTIL_H
#define PAGED_TESTS_UNIT_RNG_TEST_UTIL_H

#include <stdint.h>

// Advances the LCG at *state one step; returns the new state.
static inline uint64_t lcg_next(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state;
}

// The next of the LCG at *state: uniform in [-1, 1) from the state's top 24
// bits (exact in a float).
static inline float lcg_frand(uint64_t *state) {
    return (float)((lcg_next(state) >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

// The next of the LCG at *state from the state's top 53 bits, centred and
// scaled to [-1, 1) before rounding to float (so a draw within 2^-25 of 1
// rounds to 1.0f). test_llama_compat.c's draws; not the same numbers as
// lcg_frand's.
static inline float lcg_frand53(uint64_t *state) {
    return (float)((int64_t)(lcg_next(state) >> 11) - (1ll << 52)) / (float)(1ll << 52);
}

// The next of the LCG at *state: the state's top 31 bits.
static inline uint32_t lcg_u31(uint64_t *state) {
    return (uint32_t)(lcg_next(state) >> 33);
}

#endif // PAGED_TESTS_UNIT_RNG_TEST_UTIL_H
