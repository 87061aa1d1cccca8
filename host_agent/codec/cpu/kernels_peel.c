/*
 * peel_sketch: peeling an aggregated sketch over known candidates as a wave that stays in cache, on up
 * to two threads.
 *
 * Each cell gets a record: its candidate count, the XOR of its candidates' numbers in start order, then
 * `block` value lanes, so that every touch of a cell is one cache line. A cell whose count is 1 is pure:
 * its candidate's value is its lanes, and peeling it subtracts the candidate from its cells.
 *
 * The wave (fused layout): an item's cells lie in `arity` consecutive segments, so once the candidates of
 * starts up to s are inserted, no later candidate touches segment s: it is *complete*, and its count-1
 * cells are truly pure. Candidates are inserted start by start; after each start the newly complete
 * segment's pure cells are peeled, with whatever they free in complete segments, at once. A cell in a
 * segment still filling is updated but never judged: its count carries a bias (PENDING) until its
 * segment's scan removes it and judges the cell, so that a count of 1 alone means pure and complete.
 * Peeling thus follows one step behind insertion, within a window of a few segments (a few hundred KiB)
 * instead of a sketch-sized table, and every record is brought into cache about once.
 *
 * Threads: the segments are split into a left and a right zone. The left thread inserts the candidates
 * whose cells lie wholly left, start by start upwards; the right thread those wholly right, downwards
 * (a segment is complete there once every start up to `arity - 1` below it is in). Neither touches the
 * other's records. Then one thread inserts the candidates that straddle the middle, completes the few
 * middle segments and peels what is left.
 *
 * Peeling reaches the same end (the 2-core) in any order, and a peeled candidate's value is its pure
 * cell's sum whichever pure cell is used, so the results are those of peeling.py's rounds whatever the
 * thread count.
 */
#include "kernels.h"

#include <stdlib.h>
#include <string.h>

/* A record's first word: the candidate count in its low COUNT_BITS, the XOR of the candidates' numbers
 * in start order (their index in `sorted`) above; then `block` lanes. 8 bytes at block 1: the window the
 * wave works in stays half as large as with separate words. While its segment fills, the count is
 * PENDING more than the candidates, so a cell counts at most PENDING - 1 = 31 of them. */
#define COUNT_BITS 6
#define COUNT_MASK ((1u << COUNT_BITS) - 1)
#define PENDING (1u << (COUNT_BITS - 1))
#define REC_LANES 1
#define GROUP HASH_GROUP /* pure cells whose cache misses are overlapped */
#define PREFETCH 8   /* candidates ahead whose cells are fetched while inserting wide blocks */
#define NONE UINT32_MAX

struct peel {
    const struct geometry *g;
    int64_t stride;
    uint32_t *rec;
    const int32_t *cells;
    const struct by_start *sorted;
    uint8_t *peeled; /* in start order, like sorted->values */
};

/* One zone's state: its segments [seg_lo, seg_hi), those initialised [init_lo, init_hi), those complete
 * [done_lo, done_hi), and its stack of pure cells (room for each of its cells once, and one more for the
 * branch-free push's spare write). */
struct zone {
    struct peel *p;
    int64_t seg_lo, seg_hi, start_lo, start_hi;
    int upwards;
    int64_t init_lo, init_hi, done_lo, done_hi;
    uint32_t *stack;
    int64_t depth;
    int overflow; /* a cell of the zone would count more candidates than its record holds */
};

static void init_segments(struct peel *p, int64_t seg_lo, int64_t seg_hi)
{
    const int64_t block = p->g->block, seg = p->g->seg;
    for (int64_t c = seg_lo * seg; c < seg_hi * seg; c++) {
        uint32_t *r = p->rec + c * p->stride;
        r[0] = PENDING;
        copy_lanes(r + REC_LANES, p->cells + c * block, block);
    }
}

/* Make segments [lo, hi) initialised (the zone's initialised range grows only at its ends). */
static void ensure_init(struct zone *z, int64_t lo, int64_t hi)
{
    lo = lo < z->seg_lo ? z->seg_lo : lo;
    hi = hi > z->seg_hi ? z->seg_hi : hi;
    if (z->init_lo == z->init_hi) {
        z->init_lo = z->init_hi = lo;
    }
    if (lo < z->init_lo) {
        init_segments(z->p, lo, z->init_lo);
        z->init_lo = lo;
    }
    if (hi > z->init_hi) {
        init_segments(z->p, z->init_hi, hi);
        z->init_hi = hi;
    }
}

/* Insert start s's candidates; 0 where a cell would overflow its count (the records are then unusable).
 * Records of wide blocks spill the cache, so their cells are fetched PREFETCH candidates ahead; at block 1
 * the window is in L2 already and the fetches would only cost instructions. Inlined, like drain_block,
 * for the fused layout at block 1. */
static inline __attribute__((always_inline)) int insert_block(struct peel *p, int64_t s, const int64_t block,
                                                              const int arity)
{
    const struct geometry *g = p->g;
    const int64_t end = p->sorted->bounds[s + 1], stride = REC_LANES + block;
    uint32_t *const rec = p->rec;
    uint32_t at[MAX_ARITY * HASH_CHUNK];
    for (int64_t j0 = p->sorted->bounds[s]; j0 < end; j0 += HASH_CHUNK) {
        const int n = end - j0 < HASH_CHUNK ? (int)(end - j0) : HASH_CHUNK;
        hash_cells(g, p->sorted->item + j0, n, s, at);
        for (int i = 0; i < n; i++) {
            if (block > 1 && i + PREFETCH < n) {
                for (int t = 0; t < arity; t++) {
                    __builtin_prefetch(rec + (int64_t)at[t * HASH_CHUNK + i + PREFETCH] * stride, 1);
                }
            }
            const uint32_t number = (uint32_t)(j0 + i) << COUNT_BITS;
            for (int t = 0; t < arity; t++) {
                uint32_t *r = rec + (int64_t)at[t * HASH_CHUNK + i] * stride;
                if ((*r & COUNT_MASK) == COUNT_MASK) {
                    return 0;
                }
                *r = (*r + 1) ^ number;
            }
        }
    }
    return 1;
}

static int insert_start(struct peel *p, int64_t s)
{
    if (p->g->block == 1 && p->g->arity == 4) {
        return insert_block(p, s, 1, 4);
    }
    return insert_block(p, s, p->g->block, p->g->arity);
}

/* Peel the stack's cells and whatever they free in complete segments, GROUP cells at a time so that
 * their cache misses overlap: fetch the group's records, then their candidates' item numbers, then hash
 * the items (vectorized) and fetch their cells; only then update, judging each cell afresh (counts only
 * fall once complete, so a cell still at 1 still holds the candidate read before). A cell that falls to
 * 1 is pushed without a branch: whether it does is a coin toss that a branch would often mispredict.
 * Inlined for the fused layout at block 1 (constant loops unroll, the lanes' loop goes away). */
static inline __attribute__((always_inline)) void drain_block(struct zone *z, const int64_t block,
                                                               const int arity)
{
    const struct peel *p = z->p;
    const struct geometry *g = p->g;
    const int64_t stride = REC_LANES + block;
    uint32_t *const rec = p->rec, *const stack = z->stack;
    const uint32_t *const item_of = p->sorted->item;
    int32_t *const values = p->sorted->values;
    uint8_t *const peeled = p->peeled;
    int64_t depth = z->depth;
    uint32_t cell[GROUP], cand[GROUP], item[GROUP], at[MAX_ARITY * GROUP];
    while (depth > 0) {
        const int n = depth < GROUP ? (int)depth : GROUP;
        depth -= n;
        for (int i = 0; i < n; i++) {
            cell[i] = stack[depth + i];
            __builtin_prefetch(rec + (int64_t)cell[i] * stride, 1);
        }
        for (int i = 0; i < n; i++) {
            const uint32_t word = rec[(int64_t)cell[i] * stride];
            cand[i] = (word & COUNT_MASK) == 1 ? word >> COUNT_BITS : NONE;
            if (cand[i] != NONE) {
                __builtin_prefetch(item_of + cand[i]);
            }
        }
        for (int i = 0; i < GROUP; i++) {
            item[i] = i < n && cand[i] != NONE ? item_of[cand[i]] : 0;
        }
        hash_group(g, item, at);
        for (int i = 0; i < n; i++) {
            for (int t = 0; t < arity && cand[i] != NONE; t++) {
                __builtin_prefetch(rec + (int64_t)at[t * GROUP + i] * stride, 1);
            }
        }
        for (int i = 0; i < n; i++) {
            const uint32_t *pure = rec + (int64_t)cell[i] * stride, j = cand[i];
            if (j == NONE || (pure[0] & COUNT_MASK) != 1) {
                continue; /* not pure, or its candidate was peeled through another cell since */
            }
            int32_t *out = values + (int64_t)j * block;
            copy_lanes(out, pure + REC_LANES, block);
            peeled[j] = 1;
            for (int t = 0; t < arity; t++) {
                const uint32_t c = at[t * GROUP + i];
                uint32_t *r = rec + (int64_t)c * stride;
                for (int64_t l = 0; l < block; l++) {
                    r[REC_LANES + l] -= (uint32_t)out[l];
                }
                const uint32_t word = (r[0] ^ (j << COUNT_BITS)) - 1;
                r[0] = word;
                stack[depth] = c; /* kept only where c is now pure (so complete: PENDING) */
                depth += (word & COUNT_MASK) == 1;
            }
        }
    }
    z->depth = depth;
}

static void drain(struct zone *z)
{
    if (z->p->g->block == 1 && z->p->g->arity == 4) {
        drain_block(z, 1, 4);
    } else {
        drain_block(z, z->p->g->block, z->p->g->arity);
    }
}

/* Segments [lo, hi) are now complete: take their counts' bias off, stack their pure cells and peel. */
static void scan_and_drain(struct zone *z, int64_t lo, int64_t hi)
{
    const int64_t seg = z->p->g->seg, stride = z->p->stride;
    for (int64_t c = lo * seg; c < hi * seg; c++) {
        uint32_t *r = z->p->rec + c * stride;
        *r -= PENDING;
        if ((*r & COUNT_MASK) == 1) {
            z->stack[z->depth++] = (uint32_t)c;
        }
    }
    drain(z);
}

static void set_done(struct zone *z, int64_t lo, int64_t hi)
{
    z->done_lo = lo;
    z->done_hi = hi;
}

/* Mark segments [lo, hi), adjacent to the complete range, complete; peel their pure cells. */
static void complete_segments(struct zone *z, int64_t lo, int64_t hi)
{
    if (lo >= hi) {
        return;
    }
    if (z->done_lo == z->done_hi) {
        set_done(z, lo, hi);
    } else {
        set_done(z, lo < z->done_lo ? lo : z->done_lo, hi > z->done_hi ? hi : z->done_hi);
    }
    scan_and_drain(z, lo, hi);
}

/* Insert the zone's starts one by one, peeling each segment as it completes. [done_limit_lo,
 * done_limit_hi) bounds the segments this zone may complete on its own (no straddler touches them). */
static void zone_wave(struct zone *z, int64_t done_limit_lo, int64_t done_limit_hi)
{
    const int arity = z->p->g->arity;
    if (z->upwards) {
        for (int64_t s = z->start_lo; s < z->start_hi; s++) {
            ensure_init(z, s, s + arity);
            if (!insert_start(z->p, s)) {
                z->overflow = 1;
                return;
            }
            const int64_t lo = z->done_hi > done_limit_lo ? z->done_hi : done_limit_lo;
            complete_segments(z, lo, s + 1 < done_limit_hi ? s + 1 : done_limit_hi);
        }
    } else {
        for (int64_t s = z->start_hi - 1; s >= z->start_lo; s--) {
            ensure_init(z, s, s + arity);
            if (!insert_start(z->p, s)) {
                z->overflow = 1;
                return;
            }
            const int64_t hi = z->done_lo < z->done_hi ? z->done_lo : done_limit_hi;
            const int64_t lo = s + arity - 1 > done_limit_lo ? s + arity - 1 : done_limit_lo;
            complete_segments(z, lo, hi);
        }
    }
    ensure_init(z, z->seg_lo, z->seg_hi);
}

struct zone_call {
    struct zone *z;
    int64_t limit_lo, limit_hi;
};

static void zone_main(void *arg)
{
    struct zone_call *c = arg;
    zone_wave(c->z, c->limit_lo, c->limit_hi);
}

int64_t peel_sketch(int64_t k, const struct geometry *g, const int64_t *items, const int32_t *cells,
                    int32_t *values, uint8_t *peeled, int threads)
{
    const int64_t segments = segments_of(g), m = segments * g->seg, arity = g->arity;
    if (k >= PEEL_MAX_CANDIDATES) {
        return PEEL_TOO_MANY;
    }
    struct by_start sorted;
    if (!sort_by_start(g, k, items, NULL, threads, &sorted)) {
        return -1;
    }
    struct peel p = {g, REC_LANES + g->block, NULL, cells, &sorted, NULL};
    p.rec = malloc((size_t)(m > 0 ? m : 1) * (size_t)p.stride * sizeof(uint32_t));
    uint32_t *stack = malloc((size_t)(m + 2) * sizeof(uint32_t));
    p.peeled = calloc((size_t)(k > 0 ? k : 1), 1);
    if (p.rec == NULL || stack == NULL || p.peeled == NULL) {
        free(p.rec);
        free(stack);
        free(p.peeled);
        free_by_start(&sorted);
        return -1;
    }
    /* Two zones only where each holds whole candidates and the work pays for a thread. */
    const int split = threads > 1 && g->starts >= 8 * arity && k >= 65536;
    const int64_t mid = split ? segments / 2 : segments;
    struct zone a = {.p = &p, .seg_hi = mid, .start_hi = split ? mid - arity + 1 : g->starts, .upwards = 1,
                     .stack = stack};
    struct zone b = {.p = &p, .seg_lo = mid, .seg_hi = segments, .start_lo = mid, .start_hi = g->starts,
                     .stack = stack + mid * g->seg + 1};
    int overflow = 0;
    if (split) {
        struct zone_call left = {&a, 0, mid - arity + 1}, right = {&b, mid + arity - 1, segments};
        run_pair(zone_main, &right, &left, threads);
        /* The middle, on this thread: the straddlers complete every segment; peel the middle's pure
         * cells and what they free anywhere. */
        struct zone all = {.p = &p, .seg_hi = segments, .start_hi = g->starts, .upwards = 1,
                           .init_hi = segments, .stack = stack};
        overflow = a.overflow || b.overflow;
        for (int64_t s = a.start_hi; s < b.start_lo && !overflow; s++) {
            overflow = !insert_start(&p, s);
        }
        if (!overflow) {
            scan_and_drain(&all, a.done_hi, b.done_lo); /* the zones completed the rest */
        }
    } else {
        struct zone_call whole = {&a, 0, segments};
        zone_main(&whole);
        overflow = a.overflow;
        if (!overflow) {
            complete_segments(&a, a.done_hi, segments);
        }
    }
    free(p.rec);
    free(stack);
    const int64_t found = overflow ? PEEL_TOO_MANY : unsort_by_start(g, k, &sorted, p.peeled, values, peeled);
    free(p.peeled);
    free_by_start(&sorted);
    return found;
}
