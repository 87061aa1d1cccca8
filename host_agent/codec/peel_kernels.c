/*
 * peel_sketch: peeling an aggregated sketch over known candidates, in cache and on two threads.
 *
 * Each cell gets a record: candidate count, XOR of the candidates' positions, XOR of their item numbers,
 * then `block` value lanes, so that every touch of a cell is one cache line. A cell whose count is 1 is
 * pure; its candidate's value is its lanes, and peeling it subtracts the candidate from its other cells.
 *
 * Cache: candidates are inserted in order of their start segment (sort_by_start), and peeling follows a
 * work queue; in the fused layout an item's cells lie in `arity` consecutive segments and the peeling
 * proceeds as a wave from each end of the chain of segments, so both stay within a window of a few
 * segments. (peeling.py's torch rounds instead make a dozen passes over the whole sketch per round.)
 *
 * Threads: the segments are split into a left and a right zone. Each thread inserts the candidates whose
 * cells all lie in its zone and peels the pure cells of its zone whose candidate lies wholly in it,
 * setting the others aside; so the threads never touch the same record. Then one thread inserts the
 * candidates that straddle the zones and peels what was set aside and whatever that frees. Peeling
 * reaches the same end (the 2-core) in any order, and a peeled candidate's value is its pure cell's sum
 * whichever pure cell is used, so the results are those of peeling.py's rounds whatever the thread count.
 */
#include "kernels.h"

#include <stdlib.h>
#include <string.h>

#define GROUP 16 /* queue entries whose cache misses are overlapped by prefetching */
#define REC_COUNT 0
#define REC_WHO 1
#define REC_ITEM 2
#define REC_LANES 3

struct peel {
    const struct geometry *g;
    int64_t stride;
    uint32_t *rec;
    const int32_t *cells;
    const struct by_start *sorted;
    int32_t *values;
    uint8_t *peeled;
};

/* One zone's work: segments [seg_lo, seg_hi), and the candidates with starts in [start_lo, start_hi). */
struct zone {
    struct peel *p;
    int64_t seg_lo, seg_hi, start_lo, start_hi;
    uint32_t *queue; /* room for every cell of the zone, plus the set-aside cells behind them */
    int64_t aside;
    int insert;      /* 1: initialise and insert; 0: peel */
};

static void init_segments(struct peel *p, int64_t seg_lo, int64_t seg_hi)
{
    const int64_t block = p->g->block;
    for (int64_t c = seg_lo * p->g->seg; c < seg_hi * p->g->seg; c++) {
        uint32_t *r = p->rec + c * p->stride;
        r[REC_COUNT] = 0;
        r[REC_WHO] = 0;
        r[REC_ITEM] = 0;
        memcpy(r + REC_LANES, p->cells + c * block, (size_t)block * sizeof(uint32_t));
    }
}

/* Insert the candidates with starts in [start_lo, start_hi). With `init`, the records of segments
 * [seg_lo, seg_hi) are initialised too, each just before the first candidate that touches it, so that
 * they are still in cache when the candidates reach them. */
static void insert_starts(struct peel *p, int64_t start_lo, int64_t start_hi, int init, int64_t seg_lo,
                          int64_t seg_hi)
{
    const struct geometry *g = p->g;
    int64_t at[MAX_ARITY], ready = seg_lo;
    for (int64_t s = start_lo; s < start_hi; s++) {
        if (init && ready < s + g->arity) {
            init_segments(p, ready, s + g->arity);
            ready = s + g->arity;
        }
        for (int64_t j = p->sorted->bounds[s]; j < p->sorted->bounds[s + 1]; j++) {
            const uint32_t item = p->sorted->item[j], who = p->sorted->who[j];
            cells_of(g, item, s, at);
            for (int t = 0; t < g->arity; t++) {
                uint32_t *r = p->rec + at[t] * p->stride;
                r[REC_COUNT] += 1;
                r[REC_WHO] ^= who;
                r[REC_ITEM] ^= item;
            }
        }
    }
    if (init && ready < seg_hi) {
        init_segments(p, ready, seg_hi);
    }
}

/* Peel the queue's cells and whatever they free, in groups of GROUP entries whose cache misses overlap:
 * fetch the group's records, then hash their candidates and fetch the cells those touch, then update
 * (only the last pass decides, from fresh counts). A pure cell whose candidate leaves [seg_lo, seg_hi)
 * is set aside at the far end of the room (`room` down), for the final pass. */
static void drain(struct peel *p, uint32_t *queue, int64_t tail, int64_t seg_lo, int64_t seg_hi,
                  int64_t *aside, int64_t room)
{
    const struct geometry *g = p->g;
    const int64_t block = g->block, stride = p->stride;
    int64_t at[GROUP][MAX_ARITY], start[GROUP];
    for (int64_t head = 0; head < tail;) {
        const int64_t n = tail - head < GROUP ? tail - head : GROUP;
        for (int64_t j = 0; j < n; j++) {
            __builtin_prefetch(p->rec + (int64_t)queue[head + j] * stride);
        }
        for (int64_t j = 0; j < n; j++) {
            const uint32_t *pure = p->rec + (int64_t)queue[head + j] * stride;
            start[j] = -1;
            if (pure[REC_COUNT] == 1) {
                start[j] = start_of(g, pure[REC_ITEM]);
                cells_of(g, pure[REC_ITEM], start[j], at[j]);
                for (int t = 0; t < g->arity; t++) {
                    __builtin_prefetch(p->rec + at[j][t] * stride, 1);
                }
            }
        }
        for (int64_t j = 0; j < n; j++) {
            const uint32_t cell = queue[head + j];
            const uint32_t *pure = p->rec + (int64_t)cell * stride;
            if (start[j] < 0 || pure[REC_COUNT] != 1) {
                continue; /* not pure, or its candidate was peeled through another cell since */
            }
            if (start[j] < seg_lo || start[j] + g->arity > seg_hi) {
                queue[room - 1 - (*aside)++] = cell;
                continue;
            }
            const uint32_t who = pure[REC_WHO], item = pure[REC_ITEM];
            int32_t *out = p->values + (int64_t)who * block;
            memcpy(out, pure + REC_LANES, (size_t)block * sizeof(uint32_t));
            p->peeled[who] = 1;
            for (int t = 0; t < g->arity; t++) {
                uint32_t *r = p->rec + at[j][t] * stride;
                r[REC_COUNT] -= 1;
                r[REC_WHO] ^= who;
                r[REC_ITEM] ^= item;
                for (int64_t l = 0; l < block; l++) {
                    r[REC_LANES + l] -= (uint32_t)out[l];
                }
                if (r[REC_COUNT] == 1) {
                    queue[tail++] = (uint32_t)at[j][t];
                }
            }
        }
        head += n;
    }
}

/* A zone's queue: every cell of the zone may be queued once, and every queued cell set aside once. */
static int64_t zone_room(const struct zone *z)
{
    return 2 * (z->seg_hi - z->seg_lo) * z->p->g->seg;
}

static void zone_main(void *arg)
{
    struct zone *z = arg;
    struct peel *p = z->p;
    if (z->insert) {
        insert_starts(p, z->start_lo, z->start_hi, 1, z->seg_lo, z->seg_hi);
        return;
    }
    const int64_t seg = p->g->seg;
    int64_t tail = 0;
    for (int64_t c = z->seg_lo * seg; c < z->seg_hi * seg; c++) {
        if (p->rec[c * p->stride + REC_COUNT] == 1) {
            z->queue[tail++] = (uint32_t)c;
        }
    }
    z->aside = 0;
    drain(p, z->queue, tail, z->seg_lo, z->seg_hi, &z->aside, zone_room(z));
}

int64_t peel_sketch(int64_t k, const struct geometry *g, const int64_t *items, const int32_t *cells,
                    int32_t *values, uint8_t *peeled, int threads)
{
    const int64_t segments = segments_of(g), m = segments * g->seg;
    struct by_start sorted;
    if (!sort_by_start(g, k, items, &sorted)) {
        return -1;
    }
    struct peel p = {g, REC_LANES + g->block, NULL, cells, &sorted, values, peeled};
    p.rec = malloc((size_t)(m > 0 ? m : 1) * (size_t)p.stride * sizeof(uint32_t));
    uint32_t *queue = malloc((size_t)(2 * m + 1) * sizeof(uint32_t));  /* both zones' rooms */
    if (p.rec == NULL || queue == NULL) {
        free(p.rec);
        free(queue);
        free_by_start(&sorted);
        return -1;
    }
    /* Two zones only where each holds whole candidates and the work pays for a thread. */
    const int split = threads > 1 && g->starts >= 8 * g->arity && k >= 65536;
    const int64_t mid = split ? segments / 2 : segments;
    struct zone a = {&p, 0, mid, 0, split ? mid - g->arity + 1 : g->starts, queue, 0, 1};
    struct zone b = {&p, mid, segments, mid, g->starts, queue + 2 * mid * g->seg, 0, 1};
    if (split) {
        run_pair(zone_main, &b, &a, threads);
        insert_starts(&p, a.start_hi, b.start_lo, 0, 0, 0); /* the candidates straddling the zones */
        a.insert = b.insert = 0;
        run_pair(zone_main, &b, &a, threads);
    } else {
        zone_main(&a);
        a.insert = 0;
        zone_main(&a);
    }
    /* The final pass, over every segment: the set-aside cells of both zones, then what they free (each
     * cell is queued at most once more, so 2m entries hold them all). */
    const struct zone *zones[2] = {&a, &b};
    const int used = split ? 2 : 1;
    int64_t tail = 0;
    uint32_t *aside_cells = malloc((size_t)(a.aside + b.aside + 1) * sizeof(uint32_t));
    if (aside_cells == NULL) {
        free(p.rec);
        free(queue);
        free_by_start(&sorted);
        return -1;
    }
    for (int z = 0; z < used; z++) {
        for (int64_t i = 0; i < zones[z]->aside; i++) {
            aside_cells[tail++] = zones[z]->queue[zone_room(zones[z]) - 1 - i];
        }
    }
    memcpy(queue, aside_cells, (size_t)tail * sizeof(uint32_t));
    free(aside_cells);
    int64_t aside = 0;
    drain(&p, queue, tail, 0, segments, &aside, 2 * m);
    free(p.rec);
    free(queue);
    free_by_start(&sorted);
    return 0;
}
