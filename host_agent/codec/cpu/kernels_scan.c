/*
 * The dense bucket to sparse rows and back, each in one pass over the bucket.
 *
 * fill_items: the inverse (items.fill_items): a bucket written whole from sorted rows, zeros between
 * them, so that a decode writes its output once instead of zeroing it and then scattering into it.
 *
 * scan_nonzero: the positions and bit patterns of the nonzero elements of a 32-bit bucket, in one pass
 * (items.nonzero_rows). A float is nonzero unless both its zeros (+0, -0); NaN counts as nonzero, like
 * torch's `x != 0`. Sixteen elements are tested at a time with SSE2 compares (any x86-64), so the cost is
 * one streaming read of the bucket plus O(nonzeros); the two halves of a large bucket go to two threads.
 */
#include "kernels.h"

#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

struct scan {
    const uint32_t *x;
    int64_t lo, hi;
    int is_float;
    int64_t *pos;
    uint32_t *vals;
    int64_t cap;   /* entries `pos`/`vals` hold; counting goes on beyond it */
    int64_t count;
    int grow;      /* 1: write into a private buffer grown as needed (pos/vals/cap are replaced) */
    int failed;
};

/* Bit j of the result: element base + j (j < 16) is nonzero. */
static inline uint32_t nonzero16(const uint32_t *x, int is_float)
{
#ifdef __SSE2__
    const __m128i zero = _mm_setzero_si128();
    uint32_t zeros = 0;
    for (int q = 0; q < 4; q++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(x + 4 * q));
        if (is_float) {
            v = _mm_slli_epi32(v, 1); /* drop the sign: -0.0 is zero */
        }
        zeros |= (uint32_t)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(v, zero))) << (4 * q);
    }
    return ~zeros & 0xFFFFu;
#else
    uint32_t mask = 0;
    for (int j = 0; j < 16; j++) {
        mask |= (uint32_t)((is_float ? x[j] << 1 : x[j]) != 0) << j;
    }
    return mask;
#endif
}

static int push(struct scan *s, int64_t at, uint32_t bits)
{
    if (s->count >= s->cap) {
        if (!s->grow) {
            s->count++; /* only counted: the caller scans again with room for all */
            return 1;
        }
        const int64_t cap = 2 * s->cap + 1024;
        int64_t *pos = realloc(s->pos, (size_t)cap * sizeof(int64_t));
        if (pos == NULL) {
            return 0;
        }
        s->pos = pos;
        uint32_t *vals = realloc(s->vals, (size_t)cap * sizeof(uint32_t));
        if (vals == NULL) {
            return 0;
        }
        s->vals = vals;
        s->cap = cap;
    }
    s->pos[s->count] = at;
    s->vals[s->count++] = bits;
    return 1;
}

static void scan_range(void *arg)
{
    struct scan *s = arg;
    const uint32_t *x = s->x;
    int64_t i = s->lo;
    for (; i + 16 <= s->hi; i += 16) {
        for (uint32_t mask = nonzero16(x + i, s->is_float); mask != 0; mask &= mask - 1) {
            const int64_t at = i + __builtin_ctz(mask);
            if (!push(s, at, x[at])) {
                s->failed = 1;
                return;
            }
        }
    }
    for (; i < s->hi; i++) {
        if ((s->is_float ? x[i] << 1 : x[i]) != 0 && !push(s, i, x[i])) {
            s->failed = 1;
            return;
        }
    }
}

int64_t scan_nonzero(const uint32_t *x, int64_t n, int is_float, int64_t *pos, uint32_t *vals, int64_t cap,
                     int threads)
{
    const int64_t half = threads > 1 && n >= (1 << 20) ? (n / 2) & ~(int64_t)15 : n;
    struct scan a = {x, 0, half, is_float, pos, vals, cap, 0, 0, 0};
    struct scan b = {x, half, n, is_float, NULL, NULL, 0, 0, 1, 0};
    if (half == n) {
        scan_range(&a);
        return a.count;
    }
    run_pair(scan_range, &b, &a, threads);
    int64_t total = -1;
    if (!b.failed) {
        total = a.count + b.count;
        if (total <= cap) {
            memcpy(pos + a.count, b.pos, (size_t)b.count * sizeof(int64_t));
            memcpy(vals + a.count, b.vals, (size_t)b.count * sizeof(uint32_t));
        }
    }
    free(b.pos);
    free(b.vals);
    return total;
}

/* The output is written a chunk at a time: each chunk is built in a buffer that stays in the L1 cache
 * (zeros, then the rows that fall in it) and copied out once. In a bucket larger than the cache, chunks
 * are stored past the cache (non-temporal stores): the output would be evicted before it is read anyway,
 * and such a store need not first read the line it overwrites, a third of a copy's memory traffic. */
#define CHUNK_WORDS 1024
#define STREAM_MIN_WORDS (1 << 20) /* 4 MiB */

struct fill {
    uint32_t *out;
    int64_t lo, hi;       /* the elements this part writes */
    const int64_t *items;
    const uint32_t *rows;
    int64_t j_lo, j_hi;   /* the rows that lie in it */
    int64_t block;
    int stream;
    int bad;
};

static void store_words(uint32_t *dst, const uint32_t *src, int64_t words, int stream)
{
    int64_t done = 0;
#ifdef __SSE2__
    if (stream && (uintptr_t)dst % 16 == 0) {
        for (; done + 4 <= words; done += 4) {
            _mm_stream_si128((__m128i *)(dst + done), _mm_load_si128((const __m128i *)(src + done)));
        }
    }
#endif
    (void)stream;
    memcpy(dst + done, src + done, (size_t)(words - done) * sizeof(uint32_t));
}

static void fill_part(void *arg)
{
    struct fill *f = arg;
    const int64_t block = f->block;
    const int64_t item_end = (f->hi + block - 1) / block; /* items whose rows start below hi */
    int64_t j = f->j_lo, end = f->lo; /* the next row, and where the last whole one ended */
    _Alignas(64) uint32_t chunk[CHUNK_WORDS];
    for (int64_t e = f->lo; e < f->hi;) {
        /* up to the next chunk boundary of the output's addresses, so that the stores are aligned */
        const int64_t to_boundary = CHUNK_WORDS - (int64_t)((uintptr_t)(f->out + e) / sizeof(uint32_t) % CHUNK_WORDS);
        const int64_t e_next = e + to_boundary < f->hi ? e + to_boundary : f->hi;
        memset(chunk, 0, (size_t)(e_next - e) * sizeof(uint32_t));
        if (block == 1) { /* the common case, in a tight loop: no row straddles */
            for (; j < f->j_hi && f->items[j] < e_next; j++) {
                if (f->items[j] < end) {
                    f->bad = 1;
                    return;
                }
                chunk[f->items[j] - e] = f->rows[j];
                end = f->items[j] + 1;
            }
        }
        while (j < f->j_hi) {
            if (f->items[j] < 0 || f->items[j] >= item_end) {
                f->bad = 1; /* out of range (tested before the product, which could overflow) */
                return;
            }
            const int64_t start = f->items[j] * block;
            if (start >= e_next) {
                break;
            }
            if (start < end) {
                f->bad = 1; /* not sorted or not distinct: nothing more is written */
                return;
            }
            const int64_t row_end = start + block < f->hi ? start + block : f->hi; /* a short last item */
            if (row_end <= e_next && start >= e) {
                copy_lanes(chunk + (start - e), f->rows + j * block, row_end - start);
            } else { /* the part of a row that straddles chunks in this one */
                const int64_t from = start > e ? start : e, to = row_end < e_next ? row_end : e_next;
                memcpy(chunk + (from - e), f->rows + j * block + (from - start), (size_t)(to - from) * sizeof(uint32_t));
                if (row_end > e_next) {
                    break; /* the row goes on in the next chunk */
                }
            }
            end = row_end;
            j++;
        }
        store_words(f->out + e, chunk, e_next - e, f->stream);
        e = e_next;
    }
    if (j < f->j_hi) {
        f->bad = 1; /* rows beyond the part */
    }
#ifdef __SSE2__
    if (f->stream) {
        _mm_sfence(); /* the streamed stores are visible before the caller reads the output */
    }
#endif
}

int fill_items(uint32_t *out, int64_t n, const int64_t *items, const uint32_t *rows, int64_t k, int64_t block,
               int threads)
{
    const int64_t half = threads > 1 && n >= (1 << 20) && k >= 2 ? k / 2 : k;
    if (half < k && (items[half] < 0 || items[half] > n / block)) {
        return 0; /* the parts' cut would lie outside the bucket */
    }
    const int64_t cut = half < k ? items[half] * block : n;
    const int stream = n >= STREAM_MIN_WORDS;
    struct fill a = {out, 0, cut, items, rows, 0, half, block, stream, 0};
    struct fill b = {out, cut, n, items, rows, half, k, block, stream, 0};
    run_pair(fill_part, &b, &a, half < k ? threads : 1);
    return !a.bad && !b.bad;
}
