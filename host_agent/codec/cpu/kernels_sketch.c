/*
 * Sketch encoding in order of start segment (in cache, see kernels_sort.c).
 */
#include "kernels.h"

#include <stdlib.h>
#include <string.h>

/* Add the candidates of starts [start_lo, start_hi) to the sketch. */
struct encode_part {
    const struct geometry *g;
    const struct by_start *sorted;
    int64_t start_lo, start_hi;
    uint32_t *out;
};

/* Inlined for a constant block of 1 (the lanes' loop then goes away). */
static inline __attribute__((always_inline)) void encode_starts_block(const struct encode_part *e,
                                                                       const int64_t block)
{
    const struct geometry *g = e->g;
    uint32_t chunk[MAX_ARITY * HASH_CHUNK];
    for (int64_t s = e->start_lo; s < e->start_hi; s++) {
        const int64_t end = e->sorted->bounds[s + 1];
        for (int64_t j0 = e->sorted->bounds[s]; j0 < end; j0 += HASH_CHUNK) {
            const int n = end - j0 < HASH_CHUNK ? (int)(end - j0) : HASH_CHUNK;
            hash_cells(g, e->sorted->item + j0, n, s, chunk);
            for (int i = 0; i < n; i++) {
                const int32_t *v = e->sorted->values + (j0 + i) * block;
                for (int t = 0; t < g->arity; t++) {
                    uint32_t *cell = e->out + (int64_t)chunk[t * HASH_CHUNK + i] * block;
                    for (int64_t l = 0; l < block; l++) {
                        cell[l] += (uint32_t)v[l];
                    }
                }
            }
        }
    }
}

static void encode_starts(void *arg)
{
    const struct encode_part *e = arg;
    if (e->g->block == 1) {
        encode_starts_block(e, 1);
    } else {
        encode_starts_block(e, e->g->block);
    }
}

/* sketch.encode_sketch: every item's `block` values added (mod 2^32) to each of its cells. Threads: the
 * starts whose cells lie left of the middle segment on one, those right of it on the other, then the
 * few that straddle it (the sums do not depend on the order). */
void encode_sketch(int64_t k, const struct geometry *g, const int64_t *items, const int32_t *values,
                   int32_t *out, int threads)
{
    const int64_t block = g->block;
    struct by_start sorted;
    if (!sort_by_start(g, k, items, values, threads, &sorted)) {
        /* no memory for the sort: the same sums in the caller's order, only slower */
        int64_t at[MAX_ARITY];
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
    const int split = threads > 1 && g->starts >= 8 * g->arity && k >= 65536;
    const int64_t mid = split ? segments_of(g) / 2 : g->starts;
    struct encode_part left = {g, &sorted, 0, split ? mid - g->arity + 1 : g->starts, (uint32_t *)out};
    if (split) {
        struct encode_part right = {g, &sorted, mid, g->starts, (uint32_t *)out};
        struct encode_part middle = {g, &sorted, left.start_hi, mid, (uint32_t *)out};
        run_pair(encode_starts, &right, &left, threads);
        encode_starts(&middle);
    } else {
        encode_starts(&left);
    }
    free_by_start(&sorted);
}
