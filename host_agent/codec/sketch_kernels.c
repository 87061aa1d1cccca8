/*
 * Sketch encoding, the counting sort by start segment that keeps encoding and peeling in cache, and the
 * two-thread helper (see kernels.h).
 *
 * Why sort: an item's cells lie in `arity` consecutive segments, so items taken in order of their start
 * segment touch a sliding window of a few segments (a few hundred KiB) instead of the whole sketch.
 */
#include "kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* mix32 and reduce32 again, on 32-bit lanes only, so that each loop below vectorizes. */
static inline uint32_t cell_hash(uint32_t item, uint32_t seed, uint32_t size)
{
    uint32_t h = item ^ seed;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 16;
    return (uint32_t)(((uint64_t)h * size) >> 32);
}

VECTOR_CLONES
void hash_cells(const struct geometry *g, const uint32_t *items, int n, int64_t start, uint32_t *at)
{
    const uint32_t seg = (uint32_t)g->seg;
    for (int t = 0; t < g->arity; t++) {
        const uint32_t seed = g->seeds[t], base = (uint32_t)((start + t) * g->seg);
        uint32_t *out = at + t * HASH_CHUNK;
        for (int i = 0; i < n; i++) {
            out[i] = base + cell_hash(items[i], seed, seg);
        }
    }
}

VECTOR_CLONES
void hash_starts(const struct geometry *g, const int64_t *items, int64_t n, uint32_t *start)
{
    if (g->starts <= 1) {
        memset(start, 0, (size_t)n * sizeof(uint32_t));
        return;
    }
    const uint32_t seed = g->start_seed, starts = (uint32_t)g->starts;
    for (int64_t i = 0; i < n; i++) {
        start[i] = cell_hash((uint32_t)items[i], seed, starts);
    }
}

/* Where each start's run begins, from the candidates' starts (bounds has starts + 1 entries). */
static void count_starts(const struct geometry *g, int64_t k, const int64_t *items, uint32_t *start,
                         int64_t *bounds)
{
    memset(bounds, 0, (size_t)(g->starts + 1) * sizeof(int64_t));
    hash_starts(g, items, k, start);
    for (int64_t i = 0; i < k; i++) {
        bounds[start[i] + 1]++;
    }
    for (int64_t s = 0; s < g->starts; s++) {
        bounds[s + 1] += bounds[s];
    }
}

int sort_by_start(const struct geometry *g, int64_t k, const int64_t *items, const int32_t *values,
                  struct by_start *out)
{
    const int64_t starts = g->starts, block = g->block, room = k > 0 ? k : 1;
    char *mem = malloc((size_t)(2 * starts + 1) * sizeof(int64_t) + (size_t)room * (2 + block) * sizeof(uint32_t));
    if (mem == NULL) {
        return 0;
    }
    out->bounds = (int64_t *)mem;
    out->cursor = out->bounds + starts + 1;
    out->item = (uint32_t *)(out->cursor + starts);
    out->start = out->item + room;
    out->values = (int32_t *)(out->start + room);
    count_starts(g, k, items, out->start, out->bounds);
    /* One pass, reading in order and writing `starts` sequential runs (each run's open cache line stays
     * in L1), instead of a random access per candidate. */
    int64_t *cursor = out->cursor;
    memcpy(cursor, out->bounds, (size_t)starts * sizeof(int64_t));
    for (int64_t i = 0; i < k; i++) {
        const int64_t j = cursor[out->start[i]]++;
        out->item[j] = (uint32_t)items[i];
        if (values != NULL) {
            copy_lanes(out->values + j * block, values + i * block, block);
        }
    }
    return 1;
}

void unsort_by_start(const struct geometry *g, int64_t k, const struct by_start *s, const uint8_t *sorted_flags,
                     int32_t *values, uint8_t *flags)
{
    const int64_t block = g->block;
    int64_t *cursor = s->cursor;
    memcpy(cursor, s->bounds, (size_t)g->starts * sizeof(int64_t));
    for (int64_t i = 0; i < k; i++) {
        const int64_t j = cursor[s->start[i]]++;
        flags[i] = sorted_flags[j];
        if (flags[i]) {
            copy_lanes(values + i * block, s->values + j * block, block);
        }
    }
}

void free_by_start(struct by_start *s)
{
    free(s->bounds); /* the one allocation */
    s->bounds = NULL;
}

/* sketch.encode_sketch: every item's `block` values added (mod 2^32) to each of its cells. */
void encode_sketch(int64_t k, const struct geometry *g, const int64_t *items, const int32_t *values,
                   int32_t *out)
{
    const int64_t block = g->block;
    struct by_start sorted;
    int64_t at[MAX_ARITY];
    if (!sort_by_start(g, k, items, values, &sorted)) {
        /* no memory for the sort: the same sums in the caller's order, only slower */
        for (int64_t i = 0; i < k; i++) {
            cells_of(g, (uint32_t)items[i], start_of(g, (uint32_t)items[i]), at);
            for (int t = 0; t < g->arity; t++) {
                for (int64_t l = 0; l < block; l++) {
                    out[at[t] * block + l] = (int32_t)((uint32_t)out[at[t] * block + l] +
                                                       (uint32_t)values[i * block + l]);
                }
            }
        }
        return;
    }
    uint32_t chunk[MAX_ARITY * HASH_CHUNK];
    for (int64_t s = 0; s < g->starts; s++) {
        for (int64_t j0 = sorted.bounds[s]; j0 < sorted.bounds[s + 1]; j0 += HASH_CHUNK) {
            const int64_t left = sorted.bounds[s + 1] - j0;
            const int n = left < HASH_CHUNK ? (int)left : HASH_CHUNK;
            hash_cells(g, sorted.item + j0, n, s, chunk);
            for (int i = 0; i < n; i++) {
                const int32_t *v = sorted.values + (j0 + i) * block;
                for (int t = 0; t < g->arity; t++) {
                    uint32_t *cell = (uint32_t *)out + (int64_t)chunk[t * HASH_CHUNK + i] * block;
                    for (int64_t l = 0; l < block; l++) {
                        cell[l] += (uint32_t)v[l];
                    }
                }
            }
        }
    }
    free_by_start(&sorted);
}

struct pair_call {
    void (*fn)(void *);
    void *arg;
};

static void *pair_main(void *p)
{
    struct pair_call *c = p;
    c->fn(c->arg);
    return NULL;
}

void run_pair(void (*fn)(void *), void *arg_a, void *arg_b, int threads)
{
    pthread_t thread;
    struct pair_call call = {fn, arg_a};
    if (threads > 1 && pthread_create(&thread, NULL, pair_main, &call) == 0) {
        fn(arg_b);
        pthread_join(thread, NULL);
        return;
    }
    fn(arg_a);
    fn(arg_b);
}
