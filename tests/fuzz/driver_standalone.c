// tests/fuzz/driver_standalone.c - runs a libFuzzer-style target without
// libFuzzer, so fuzz targets build and run with gcc (+ASan/UBSan).
//
//   fuzz_x [-t SECONDS] [-s SEED] [-o CRASH_PREFIX] [corpus files or dirs...]
//
// Every corpus file (directories: their regular files, one level) is run
// once, then random mutations of the corpus entries (bit flips, byte sets,
// interesting integers, truncation, insertion, deletion, splices, dictionary
// tokens) run until SECONDS have passed (default 10; 0: replay only). There
// is no coverage feedback: it is a cheap smoke fuzzer for CI and machines
// without clang, not a substitute for the libFuzzer build. Each input is
// passed in an exact-size heap buffer, so ASan sees any over-read.
//
// On a crash (sanitizer report or fatal signal) the input that caused it is
// written to CRASH_PREFIX<seed>-<execution>.bin (default ./crash-) and can be
// replayed by passing that file alone. Prints the number of executions.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);
// From the sanitizer runtime when linked with one; NULL otherwise.
__attribute__((weak)) void __sanitizer_set_death_callback(void (*callback)(void));

#define MAX_FILE_BYTES (64u << 20) // larger corpus files are skipped
#define MAX_INPUT_BYTES (1u << 20) // mutations never grow past this
#define POOL_SIZE 64               // recent mutants reused as mutation bases

typedef struct {
    uint8_t *data;
    size_t len;
} input;

typedef struct {
    input *v;
    size_t n, cap;
} input_list;

// --- crash capture -------------------------------------------------------------------

static const uint8_t *volatile cur_data;
static volatile size_t cur_len;
static char crash_prefix[1024] = "./crash-";
static uint64_t run_seed;
static volatile uint64_t cur_exec;

// Async-signal-safe: open/write/close and hand-rolled number formatting.
static size_t fmt_u64(char *p, uint64_t v) {
    char tmp[24];
    size_t n = 0;
    do tmp[n++] = (char)('0' + v % 10), v /= 10;
    while (v);
    for (size_t i = 0; i < n; i++) p[i] = tmp[n - 1 - i];
    return n;
}

static void dump_crash_input(void) {
    static volatile sig_atomic_t dumped;
    if (dumped || !cur_data) return;
    dumped = 1;
    char path[1100];
    size_t o = 0, pl = strlen(crash_prefix);
    memcpy(path, crash_prefix, pl);
    o = pl;
    o += fmt_u64(path + o, run_seed);
    path[o++] = '-';
    o += fmt_u64(path + o, cur_exec);
    memcpy(path + o, ".bin", 5);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        size_t done = 0;
        while (done < cur_len) {
            ssize_t w = write(fd, cur_data + done, cur_len - done);
            if (w <= 0) break;
            done += (size_t)w;
        }
        close(fd);
    }
    static const char msg1[] = "\n==driver== crashing input written to ";
    if (write(2, msg1, sizeof msg1 - 1) < 0) return;
    if (write(2, path, o + 4) < 0) return;
    if (write(2, "\n", 1) < 0) return;
}

static void on_fatal_signal(int sig) {
    dump_crash_input();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_crash_handlers(void) {
    // With a sanitizer its own handlers report the crash (a stack overflow
    // too: they run on an alternate stack) and end in the death callback;
    // ours would replace them (sigaction after its start-up), and a stack
    // overflow then killed the process with no report at all (a CI run of
    // fuzz_jinja, session 21). Without one, these catch the crash.
    if (__sanitizer_set_death_callback) {
        __sanitizer_set_death_callback(dump_crash_input);
        return;
    }
    int sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigaction(sigs[i], &sa, NULL);
    }
}

// --- running one input -----------------------------------------------------------------

static void run_one(const uint8_t *data, size_t len) {
    // An exact-size copy: reads past the end hit the ASan redzone.
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
        fprintf(stderr, "driver: out of memory\n");
        exit(2);
    }
    if (len) memcpy(copy, data, len);
    cur_data = copy;
    cur_len = len;
    LLVMFuzzerTestOneInput(copy, len);
    cur_data = NULL;
    free(copy);
    cur_exec++;
}

// --- corpus loading ---------------------------------------------------------------------

static void list_push(input_list *l, uint8_t *data, size_t len) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) exit(2);
    }
    l->v[l->n++] = (input){data, len};
}

static void load_file(input_list *l, const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "driver: cannot open %s: %s\n", path, strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_FILE_BYTES) {
        fprintf(stderr, "driver: skipping %s (not a regular file or too large)\n", path);
        fclose(fp);
        return;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, fp) != n) {
        fprintf(stderr, "driver: cannot read %s\n", path);
        free(buf);
        fclose(fp);
        return;
    }
    fclose(fp);
    list_push(l, buf, n);
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void load_path(input_list *l, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "driver: %s: %s\n", path, strerror(errno));
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        load_file(l, path);
        return;
    }
    DIR *d = opendir(path);
    if (!d) return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, cap * sizeof *names);
            if (!names) exit(2);
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, str_cmp); // deterministic order
    for (size_t i = 0; i < n; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) load_file(l, p);
        free(names[i]);
    }
    free(names);
}

// --- mutations -------------------------------------------------------------------------------

static uint64_t rng_state;

static uint64_t rnd(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static const uint64_t interesting[] = {
    0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 1024, 4096, 65535, 65536,
    0x7fffffffu, 0x80000000u, 0xffffffffu, UINT64_C(0x100000000), UINT64_C(1) << 53, (UINT64_C(1) << 53) + 1,
    UINT64_C(0x7fffffffffffffff), UINT64_C(0x8000000000000000), UINT64_MAX, UINT64_MAX - 1, 100000000, 100000001,
};

// Tokens that matter to the formats under test (GGUF magic, JSON syntax,
// safetensors dtype names and big numbers).
static const char *const dict[] = {
    "GGUF", "{", "}", "[", "]", ",", ":", "\"", "\\u0000", "\"dtype\"", "\"shape\"", "\"data_offsets\"",
    "\"__metadata__\"", "\"F32\"", "\"F16\"", "\"BF16\"", "\"I64\"", "-1", "0", "1e308", "1.5",
    "9007199254740993", "18446744073709551615", "null", "true", "general.alignment",
};

// Applies one random mutation to buf[0..*len) (capacity cap).
static void mutate_once(uint8_t *buf, size_t *len, size_t cap, const input_list *corpus) {
    size_t n = *len;
    switch (rnd_below(11)) {
    case 0: // flip a bit
        if (n) buf[rnd_below(n)] ^= (uint8_t)(1u << rnd_below(8));
        break;
    case 1: // random byte
        if (n) buf[rnd_below(n)] = (uint8_t)rnd();
        break;
    case 2: { // interesting integer, 1/2/4/8 bytes little-endian
        static const size_t widths[] = {1, 2, 4, 8};
        size_t w = widths[rnd_below(4)];
        if (n < w) break;
        uint64_t v = interesting[rnd_below(sizeof interesting / sizeof interesting[0])];
        if (rnd() & 1) v = (uint64_t)0 - v;
        size_t at = rnd_below(n - w + 1);
        // Field-aligned positions hit header fields more often.
        if (rnd() & 1) at &= ~(w - 1);
        for (size_t i = 0; i < w; i++) buf[at + i] = (uint8_t)(v >> (8 * i));
        break;
    }
    case 3: { // add a small delta to a 1/4/8-byte field
        static const size_t widths[] = {1, 4, 8};
        size_t w = widths[rnd_below(3)];
        if (n < w) break;
        size_t at = rnd_below(n - w + 1);
        uint64_t v = 0;
        for (size_t i = 0; i < w; i++) v |= (uint64_t)buf[at + i] << (8 * i);
        v += (uint64_t)((int64_t)rnd_below(33) - 16);
        for (size_t i = 0; i < w; i++) buf[at + i] = (uint8_t)(v >> (8 * i));
        break;
    }
    case 4: // truncate
        *len = rnd_below(n + 1);
        break;
    case 5: { // delete a chunk
        if (!n) break;
        size_t at = rnd_below(n), k = 1 + rnd_below(n - at < 64 ? n - at : 64);
        memmove(buf + at, buf + at + k, n - at - k);
        *len = n - k;
        break;
    }
    case 6: { // insert random bytes
        size_t k = 1 + rnd_below(16);
        if (n + k > cap) break;
        size_t at = rnd_below(n + 1);
        memmove(buf + at + k, buf + at, n - at);
        for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)rnd();
        *len = n + k;
        break;
    }
    case 7: { // duplicate or overwrite with a chunk of itself
        if (!n) break;
        size_t from = rnd_below(n), k = 1 + rnd_below(n - from < 128 ? n - from : 128);
        size_t to = rnd_below(n);
        if (to + k > n) k = n - to;
        memmove(buf + to, buf + from, k);
        break;
    }
    case 8: { // splice: our prefix + another entry's suffix
        if (!corpus->n) break;
        const input *o = &corpus->v[rnd_below(corpus->n)];
        size_t keep = rnd_below(n + 1), from = rnd_below(o->len + 1);
        size_t k = o->len - from;
        if (keep + k > cap) k = cap - keep;
        memcpy(buf + keep, o->data + from, k);
        *len = keep + k;
        break;
    }
    case 9: { // insert or overwrite a dictionary token
        const char *t = dict[rnd_below(sizeof dict / sizeof dict[0])];
        size_t k = strlen(t);
        if (rnd() & 1) {
            if (n + k > cap) break;
            size_t at = rnd_below(n + 1);
            memmove(buf + at + k, buf + at, n - at);
            memcpy(buf + at, t, k);
            *len = n + k;
        } else if (n >= k) {
            memcpy(buf + rnd_below(n - k + 1), t, k);
        }
        break;
    }
    default: { // set a run of bytes to one value
        if (!n) break;
        size_t at = rnd_below(n), k = 1 + rnd_below(n - at < 32 ? n - at : 32);
        memset(buf + at, (rnd() & 1) ? 0xff : 0, k);
        break;
    }
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [-t SECONDS] [-s SEED] [-o CRASH_PREFIX] [corpus files or dirs...]\n"
            "  runs every corpus file, then random mutations for SECONDS (default 10, 0: replay only)\n",
            argv0);
}

int main(int argc, char **argv) {
    double seconds = 10;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int opt;
    while ((opt = getopt(argc, argv, "t:s:o:h")) != -1) {
        switch (opt) {
        case 't': seconds = atof(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 0); break;
        case 'o': snprintf(crash_prefix, sizeof crash_prefix, "%s", optarg); break;
        default: usage(argv[0]); return opt == 'h' ? 0 : 2;
        }
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    run_seed = seed;
    rng_state = seed;
    install_crash_handlers();

    input_list corpus = {0};
    for (int i = optind; i < argc; i++) load_path(&corpus, argv[i]);
    size_t max_len = 4096;
    for (size_t i = 0; i < corpus.n; i++)
        if (corpus.v[i].len * 2 > max_len) max_len = corpus.v[i].len * 2;
    if (max_len > MAX_INPUT_BYTES) max_len = MAX_INPUT_BYTES;

    double t0 = now_s();
    for (size_t i = 0; i < corpus.n; i++) run_one(corpus.v[i].data, corpus.v[i].len);
    uint64_t replayed = cur_exec;

    // Mutation phase. The pool keeps recent mutants so mutations compound.
    uint8_t *buf = malloc(max_len);
    input pool[POOL_SIZE] = {{0}};
    size_t pool_n = 0;
    while (seconds > 0 && buf) {
        if ((cur_exec & 63) == 0 && now_s() - t0 >= seconds) break;
        size_t len = 0;
        const input *base = NULL;
        if (pool_n && rnd_below(4) == 0) base = &pool[rnd_below(pool_n)];
        else if (corpus.n) base = &corpus.v[rnd_below(corpus.n)];
        if (base) {
            len = base->len < max_len ? base->len : max_len;
            memcpy(buf, base->data, len);
        }
        int k = 1 + (int)rnd_below(6);
        for (int i = 0; i < k; i++) mutate_once(buf, &len, max_len, &corpus);
        run_one(buf, len);
        if (rnd_below(16) == 0) { // remember this mutant
            size_t slot = pool_n < POOL_SIZE ? pool_n++ : rnd_below(POOL_SIZE);
            uint8_t *p = realloc(pool[slot].data, len ? len : 1);
            if (p) {
                memcpy(p, buf, len);
                pool[slot] = (input){p, len};
            }
        }
    }
    double dt = now_s() - t0;
    printf("%s: %llu executions (%llu corpus inputs, %llu mutations) in %.1f s, seed %llu: no crash\n", argv[0],
           (unsigned long long)cur_exec, (unsigned long long)replayed, (unsigned long long)(cur_exec - replayed), dt,
           (unsigned long long)seed);

    for (size_t i = 0; i < pool_n; i++) free(pool[i].data);
    for (size_t i = 0; i < corpus.n; i++) free(corpus.v[i].data);
    free(corpus.v);
    free(buf);
    return 0;
}
