/*
 * What the codec's C kernels share: the sketch geometry and hashes (bit-identical to hashing.py and
 * sketch.py), and a two-thread helper. See _native.c for the interface and sketch.py for the layout.
 */
#ifndef LHC_CODEC_KERNELS_H
#define LHC_CODEC_KERNELS_H

#include <stdint.h>

#define MAX_ARITY 4

/* hashing.py's mix32 in uint32 arithmetic. */
static inline uint32_t mix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 16;
    return h;
}

/* hashing.py's reduce_range: multiply-shift of a 32-bit hash into [0, size). */
static inline int64_t reduce32(uint32_t h, int64_t size)
{
    return (int64_t)(((uint64_t)h * (uint64_t)size) >> 32);
}

/* sketch.py's layout: `segments` = starts + arity - 1 segments of `seg` cells; an item hashes to a start
 * segment s < starts (always 0 when starts == 1, the plain 3-table layout) and to one cell in each of the
 * segments s .. s + arity - 1. */
struct geometry {
    int arity;
    int64_t starts;
    int64_t seg;
    int64_t block;
    uint32_t start_seed;
    uint32_t seeds[MAX_ARITY];
};

static inline int64_t segments_of(const struct geometry *g)
{
    return g->starts + g->arity - 1;
}

static inline int64_t start_of(const struct geometry *g, uint32_t item)
{
    return g->starts > 1 ? reduce32(mix32(item ^ g->start_seed), g->starts) : 0;
}

static inline void cells_of(const struct geometry *g, uint32_t item, int64_t start, int64_t *out)
{
    for (int t = 0; t < g->arity; t++) {
        out[t] = (start + t) * g->seg + reduce32(mix32(item ^ g->seeds[t]), g->seg);
    }
}

/* Candidates reordered by start segment (a counting sort): their item numbers and their positions in the
 * caller's list, and where each start's run begins (bounds[starts] = k). One allocation; 0 on failure. */
struct by_start {
    uint32_t *item;
    uint32_t *who;
    int64_t *bounds;
};
int sort_by_start(const struct geometry *g, int64_t k, const int64_t *items, struct by_start *out);
void free_by_start(struct by_start *s);

/* Run fn(arg_a) on a second thread and fn(arg_b) on this one, or both here when no thread can be
 * started: the results never depend on which. */
void run_pair(void (*fn)(void *), void *arg_a, void *arg_b, int threads);

int64_t peel_sketch(int64_t k, const struct geometry *g, const int64_t *items, const int32_t *cells,
                    int32_t *values, uint8_t *peeled, int threads);
void encode_sketch(int64_t k, const struct geometry *g, const int64_t *items, const int32_t *values,
                   int32_t *out);
int64_t scan_nonzero(const uint32_t *x, int64_t n, int is_float, int64_t *pos, uint32_t *vals, int64_t cap,
                     int threads);

#endif
