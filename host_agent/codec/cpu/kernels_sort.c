/*
 * The counting sort of candidates by start segment that keeps encoding and peeling in cache, and its
 * inverse (see kernels.h), each on up to two threads.
 *
 * Why sort: an item's cells lie in `arity` consecutive segments, so items taken in order of their start
 * segment touch a sliding window of a few segments (a few hundred KiB) instead of the whole sketch. The
 * sort reads the candidates in order and writes `starts` sequential runs (each run's open cache line
 * stays in cache) instead of making a random access per candidate.
 *
 * Two threads: each takes one half of the candidates and counts its starts; the first half's candidates
 * of a start then go before the second half's, so the order is that of one thread.
 */
#include "kernels.h"

#include <stdlib.h>
#include <string.h>

#define SORT_SPLIT_MIN 65536 /* candidates below which a second thread does not pay */

/* One half's part: candidates [lo, hi), its count per start, and its write cursor per start. */
struct half {
    const struct geometry *g;
    const int64_t *items;
    const int32_t *values;
    struct by_start *out;
    int64_t lo, hi;
    int64_t *count;
    int64_t *cursor;
    const uint8_t *flags; /* unsort: the sorted flags */
    int32_t *dst_values;  /* unsort: the caller's values and flags */
    uint8_t *dst_flags;
    int64_t found;        /* unsort: flags set */
};

static void count_half(void *arg)
{
    struct half *h = arg;
    hash_starts(h->g, h->items + h->lo, h->hi - h->lo, h->out->start + h->lo);
    memset(h->count, 0, (size_t)h->g->starts * sizeof(int64_t));
    for (int64_t i = h->lo; i < h->hi; i++) {
        h->count[h->out->start[i]]++;
    }
}

static void scatter_half(void *arg)
{
    struct half *h = arg;
    const int64_t block = h->g->block;
    struct by_start *out = h->out;
    for (int64_t i = h->lo; i < h->hi; i++) {
        const int64_t j = h->cursor[out->start[i]]++;
        out->item[j] = (uint32_t)h->items[i];
        if (h->values != NULL) {
            copy_lanes(out->values + j * block, h->values + i * block, block);
        }
    }
}

static void gather_half(void *arg)
{
    struct half *h = arg;
    const int64_t block = h->g->block;
    const struct by_start *s = h->out;
    int64_t found = 0;
    for (int64_t i = h->lo; i < h->hi; i++) {
        const int64_t j = h->cursor[s->start[i]]++;
        h->dst_flags[i] = h->flags[j];
        found += h->flags[j];
        if (h->flags[j]) {
            copy_lanes(h->dst_values + i * block, s->values + j * block, block);
        } else {
            memset(h->dst_values + i * block, 0, (size_t)block * sizeof(int32_t));
        }
    }
    h->found = found;
}

/* The two halves of k candidates, each with its count and cursor arrays from `scratch` (4 * starts). */
static void halves(const struct geometry *g, int64_t k, int threads, struct by_start *out, struct half *a,
                   struct half *b)
{
    const int64_t mid = threads > 1 && k >= SORT_SPLIT_MIN ? k / 2 : k, starts = g->starts;
    *a = (struct half){g, NULL, NULL, out, 0, mid, out->scratch, out->scratch + starts, NULL, NULL, NULL, 0};
    *b = (struct half){g, NULL, NULL, out, mid, k, out->scratch + 2 * starts, out->scratch + 3 * starts,
                       NULL, NULL, NULL, 0};
}

int sort_by_start(const struct geometry *g, int64_t k, const int64_t *items, const int32_t *values,
                  int threads, struct by_start *out)
{
    const int64_t starts = g->starts, block = g->block, room = k > 0 ? k : 1;
    char *mem = malloc((size_t)(5 * starts + 1) * sizeof(int64_t) + (size_t)room * (2 + block) * sizeof(uint32_t));
    if (mem == NULL) {
        return 0;
    }
    out->bounds = (int64_t *)mem;
    out->scratch = out->bounds + starts + 1;
    out->item = (uint32_t *)(out->scratch + 4 * starts);
    out->start = out->item + room;
    out->values = (int32_t *)(out->start + room);
    out->threads = threads;
    struct half a, b;
    halves(g, k, threads, out, &a, &b);
    a.items = b.items = items;
    a.values = b.values = values;
    run_pair(count_half, &b, &a, b.lo < b.hi ? threads : 1);
    out->bounds[0] = 0;
    for (int64_t s = 0; s < starts; s++) {
        a.cursor[s] = out->bounds[s];
        b.cursor[s] = out->bounds[s] + a.count[s];
        out->bounds[s + 1] = b.cursor[s] + b.count[s];
    }
    run_pair(scatter_half, &b, &a, b.lo < b.hi ? threads : 1);
    return 1;
}

int64_t unsort_by_start(const struct geometry *g, int64_t k, struct by_start *s, const uint8_t *sorted_flags,
                        int32_t *values, uint8_t *flags)
{
    struct half a, b;
    halves(g, k, s->threads, s, &a, &b);
    for (int64_t t = 0; t < g->starts; t++) { /* the counts are the sort's: each half's runs again */
        a.cursor[t] = s->bounds[t];
        b.cursor[t] = s->bounds[t] + a.count[t];
    }
    a.flags = b.flags = sorted_flags;
    a.dst_values = b.dst_values = values;
    a.dst_flags = b.dst_flags = flags;
    run_pair(gather_half, &b, &a, b.lo < b.hi ? s->threads : 1);
    return a.found + b.found;
}

void free_by_start(struct by_start *s)
{
    free(s->bounds); /* the one allocation */
    s->bounds = NULL;
}
