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

int sort_by_start(const struct geometry *g, int64_t k, const int64_t *items, struct by_start *out)
{
    const int64_t starts = g->starts;
    size_t bytes = (size_t)(k > 0 ? k : 1) * (2 * sizeof(uint32_t)) + (size_t)(starts + 1) * sizeof(int64_t);
    char *mem = malloc(bytes + (size_t)(k > 0 ? k : 1) * sizeof(uint32_t));
    if (mem == NULL) {
        return 0;
    }
    out->bounds = (int64_t *)mem;
    out->item = (uint32_t *)(mem + (size_t)(starts + 1) * sizeof(int64_t));
    out->who = out->item + (k > 0 ? k : 1);
    uint32_t *start = out->who + (k > 0 ? k : 1); /* scratch: each candidate's start */
    int64_t *bounds = out->bounds;
    memset(bounds, 0, (size_t)(starts + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < k; i++) {
        start[i] = (uint32_t)start_of(g, (uint32_t)items[i]);
        bounds[start[i] + 1]++;
    }
    for (int64_t s = 0; s < starts; s++) {
        bounds[s + 1] += bounds[s];
    }
    /* bounds[s] is where start s's run begins; use bounds[s + 1] - count as a write cursor, restored after */
    int64_t *cursor = malloc((size_t)(starts > 0 ? starts : 1) * sizeof(int64_t));
    if (cursor == NULL) {
        free(mem);
        return 0;
    }
    memcpy(cursor, bounds, (size_t)starts * sizeof(int64_t));
    for (int64_t i = 0; i < k; i++) {
        const int64_t j = cursor[start[i]]++;
        out->item[j] = (uint32_t)items[i];
        out->who[j] = (uint32_t)i;
    }
    free(cursor);
    return 1;
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
    if (!sort_by_start(g, k, items, &sorted)) {
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
    for (int64_t s = 0; s < g->starts; s++) {
        for (int64_t j = sorted.bounds[s]; j < sorted.bounds[s + 1]; j++) {
            const int32_t *v = values + (int64_t)sorted.who[j] * block;
            cells_of(g, sorted.item[j], s, at);
            for (int t = 0; t < g->arity; t++) {
                uint32_t *cell = (uint32_t *)out + at[t] * block;
                for (int64_t l = 0; l < block; l++) {
                    cell[l] += (uint32_t)v[l];
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
