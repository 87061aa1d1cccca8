/*
 * The codec's CPU kernels, where torch's one-pass-per-operation model costs most: peeling an aggregated
 * sketch, listing the set bits of an aggregated bitmap, and querying an aggregated Bloom filter.
 *
 * peel: sequential peeling of an aggregated partitioned Count Sketch.
 *
 * The torch decoder in peeling.py peels in parallel rounds; on a CPU that costs about a dozen separate
 * passes of random gathers and scatters per candidate, one torch kernel each. This is the same peeling
 * done with one work queue and every touch of a cell in one place: a cell's candidate count, the XOR of
 * its candidates' numbers and its block of values sit side by side in one record, so updating a cell is
 * one cache miss instead of three. The cells are hashed here from the item numbers (no table of cell ids
 * to read), and the loops work in groups of GROUP: first fetch every record the group will touch, then
 * update them, so that the group's cache misses overlap.
 *
 * It peels the same candidates and recovers the same values as the parallel rounds, and reports the same
 * number of rounds: the queue is processed level by level, and level r holds exactly the cells that the
 * parallel decoder finds pure in round r (a cell becomes pure at most once, since counts only fall).
 * Values are summed modulo 2^32 in uint32, which is the int32 wrap-around of the switch's ADD.
 *
 * set_bits: the positions of the set bits of a word array (bits.set_bits), in one pass with ctz instead of
 * the eight torch passes over the set bits of the byte-table method.
 *
 * bloom_hits: every item's membership in a pattern-blocked Bloom filter (index.query_index), as a bit
 * array; one hash, one load and one compare per item, where torch makes a pass over all items for each.
 *
 * Interface (called from peeling.py, bits.py and index.py, which check the dtypes, shapes and contiguity
 * of the tensors whose addresses they pass):
 *   peel(k, table_cells, (seed0, seed1, seed2), block, items, cells, values, peeled) -> rounds
 *     items   const int64[k]          the candidates' item numbers (distinct, < 2^32); their cells are
 *                                     hashed here exactly as sketch.cell_ids does, table by table
 *     cells   const int32[3 * table_cells][block]   the aggregated sketch (not modified)
 *     values  int32[k][block]         out: recovered sums, zero where not peeled (must arrive zeroed)
 *     peeled  uint8[k]                out: 1 where recovered (must arrive zeroed)
 *   popcount(words, n) -> number of set bits of uint32 words[n]
 *   set_bits(words, n, out, count)    out: int64[count], the sorted positions of the set bits
 *   bloom_hits(n_items, words, n_words, seed, masks, n_masks, hits)
 *     words   const uint32[n_words]   the aggregated filter; an item's word and pattern come from one hash
 *     masks   const uint32[n_masks]   the patterns (n_masks a power of two), as index._patterns makes them
 *     hits    uint32[ceil(n_items / 32)]   out: bit i set when item i may be held
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TABLES 3
#define GROUP 16 /* items or queue entries whose cache misses are overlapped by prefetching */

/* A cell record: count, XOR of candidate positions, XOR of their item numbers, then `block` value
 * lanes. For block 1 a record is 16 bytes: every touch of a cell is one cache line. */
#define REC_COUNT 0
#define REC_WHO 1
#define REC_ITEM 2
#define REC_LANES 3

/* hashing.py's hash_items and reduce_range, in uint32/uint64 arithmetic (bit-identical). */
static inline uint32_t mix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 16;
    return h;
}

struct geometry {
    int64_t table_cells;
    int64_t stride;
    uint32_t seeds[TABLES];
};

static inline int64_t cell_of(const struct geometry *g, int t, uint32_t item)
{
    uint64_t h = mix32(item ^ g->seeds[t]);
    return t * g->table_cells + (int64_t)((h * (uint64_t)g->table_cells) >> 32);
}

static int64_t peel_sketch(int64_t k, const struct geometry *g, int64_t block, const int64_t *items,
                           const int32_t *cells, int32_t *values, uint8_t *peeled)
{
    const int64_t m = TABLES * g->table_cells, stride = g->stride;
    uint32_t *rec = malloc((size_t)m * (size_t)stride * sizeof(uint32_t));
    uint32_t *queue = malloc((size_t)(m > 0 ? m : 1) * sizeof(uint32_t));
    if (rec == NULL || queue == NULL) {
        free(rec);
        free(queue);
        return -1;
    }
    for (int64_t c = 0; c < m; c++) {
        uint32_t *r = rec + c * stride;
        r[REC_COUNT] = 0;
        r[REC_WHO] = 0;
        r[REC_ITEM] = 0;
        memcpy(r + REC_LANES, cells + c * block, (size_t)block * sizeof(uint32_t));
    }
    for (int64_t i0 = 0; i0 < k; i0 += GROUP) {
        const int64_t n = k - i0 < GROUP ? k - i0 : GROUP;
        int64_t at[GROUP][TABLES];
        for (int64_t j = 0; j < n; j++) {
            for (int t = 0; t < TABLES; t++) {
                at[j][t] = cell_of(g, t, (uint32_t)items[i0 + j]);
                __builtin_prefetch(rec + at[j][t] * stride, 1);
            }
        }
        for (int64_t j = 0; j < n; j++) {
            for (int t = 0; t < TABLES; t++) {
                uint32_t *r = rec + at[j][t] * stride;
                r[REC_COUNT] += 1;
                r[REC_WHO] ^= (uint32_t)(i0 + j);
                r[REC_ITEM] ^= (uint32_t)items[i0 + j];
            }
        }
    }
    int64_t tail = 0;
    for (int64_t c = 0; c < m; c++) {
        if (rec[c * stride + REC_COUNT] == 1) {
            queue[tail++] = (uint32_t)c;
        }
    }
    int64_t head = 0, rounds = 0;
    int64_t where[GROUP][TABLES];
    while (head < tail) {
        const int64_t level_end = tail;
        int peeled_any = 0;
        while (head < level_end) {
            const int64_t n = level_end - head < GROUP ? level_end - head : GROUP;
            /* Three passes over a group: fetch the pure cells, hash their candidates and fetch the cells
             * those touch, then update. Only the last pass decides anything, from fresh counts. */
            for (int64_t j = 0; j < n; j++) {
                __builtin_prefetch(rec + (int64_t)queue[head + j] * stride);
            }
            for (int64_t j = 0; j < n; j++) {
                const uint32_t *pure = rec + (int64_t)queue[head + j] * stride;
                if (pure[REC_COUNT] != 1) {
                    continue;
                }
                for (int t = 0; t < TABLES; t++) {
                    where[j][t] = cell_of(g, t, pure[REC_ITEM]);
                    __builtin_prefetch(rec + where[j][t] * stride, 1);
                }
                __builtin_prefetch(values + (int64_t)pure[REC_WHO] * block, 1);
            }
            for (int64_t j = 0; j < n; j++) {
                const uint32_t *pure = rec + (int64_t)queue[head + j] * stride;
                if (pure[REC_COUNT] != 1) {
                    continue; /* its candidate was peeled through another cell since */
                }
                const int64_t who = pure[REC_WHO];
                const uint32_t item = pure[REC_ITEM];
                int32_t *out = values + who * block;
                memcpy(out, pure + REC_LANES, (size_t)block * sizeof(uint32_t));
                peeled[who] = 1;
                peeled_any = 1;
                for (int t = 0; t < TABLES; t++) {
                    uint32_t *r = rec + where[j][t] * stride;
                    r[REC_COUNT] -= 1;
                    r[REC_WHO] ^= (uint32_t)who;
                    r[REC_ITEM] ^= item;
                    for (int64_t l = 0; l < block; l++) {
                        r[REC_LANES + l] -= (uint32_t)out[l];
                    }
                    if (r[REC_COUNT] == 1) {
                        queue[tail++] = (uint32_t)where[j][t];
                    }
                }
            }
            head += n;
        }
        rounds += peeled_any;
    }
    free(rec);
    free(queue);
    return rounds;
}

static PyObject *py_peel(PyObject *self, PyObject *args)
{
    (void)self;
    long long k, table_cells, block;
    unsigned long s0, s1, s2;
    unsigned long long items, cells, values, peeled;
    if (!PyArg_ParseTuple(args, "LL(kkk)LKKKK", &k, &table_cells, &s0, &s1, &s2, &block, &items, &cells,
                          &values, &peeled)) {
        return NULL;
    }
    if (k < 0 || table_cells < 1 || table_cells >= (1LL << 31) / TABLES || block < 1 || k >= (1LL << 32)) {
        PyErr_Format(PyExc_ValueError, "peel: bad sizes k=%lld table_cells=%lld block=%lld", k, table_cells,
                     block);
        return NULL;
    }
    const struct geometry g = {table_cells, REC_LANES + block, {(uint32_t)s0, (uint32_t)s1, (uint32_t)s2}};
    int64_t rounds;
    Py_BEGIN_ALLOW_THREADS
    rounds = peel_sketch(k, &g, block, (const int64_t *)(uintptr_t)items, (const int32_t *)(uintptr_t)cells,
                         (int32_t *)(uintptr_t)values, (uint8_t *)(uintptr_t)peeled);
    Py_END_ALLOW_THREADS
    if (rounds < 0) {
        return PyErr_NoMemory();
    }
    return PyLong_FromLongLong(rounds);
}

static int64_t popcount_words(const uint32_t *words, int64_t n)
{
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        total += __builtin_popcount(words[i]);
    }
    return total;
}

static void list_set_bits(const uint32_t *words, int64_t n, int64_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        for (uint32_t w = words[i]; w != 0; w &= w - 1) {
            *out++ = i * 32 + __builtin_ctz(w);
        }
    }
}

static PyObject *py_popcount(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long words;
    long long n;
    if (!PyArg_ParseTuple(args, "KL", &words, &n)) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "popcount: negative length");
        return NULL;
    }
    int64_t total;
    Py_BEGIN_ALLOW_THREADS
    total = popcount_words((const uint32_t *)(uintptr_t)words, n);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(total);
}

static PyObject *py_set_bits(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long words, out;
    long long n, count;
    if (!PyArg_ParseTuple(args, "KLKL", &words, &n, &out, &count)) {
        return NULL;
    }
    /* The caller sized `out` by popcount; recount rather than trust it, so a bad size cannot overflow. */
    int64_t total;
    Py_BEGIN_ALLOW_THREADS
    total = n < 0 ? -1 : popcount_words((const uint32_t *)(uintptr_t)words, n);
    if (total == count) {
        list_set_bits((const uint32_t *)(uintptr_t)words, n, (int64_t *)(uintptr_t)out);
    }
    Py_END_ALLOW_THREADS
    if (total != count) {
        PyErr_Format(PyExc_ValueError, "set_bits: output holds %lld positions, the words have %lld set bits",
                     count, (long long)total);
        return NULL;
    }
    Py_RETURN_NONE;
}

static void bloom_hits(int64_t n_items, const uint32_t *words, int64_t n_words, uint32_t seed,
                       const uint32_t *masks, uint32_t mask_bits, uint32_t *hits)
{
    for (int64_t base = 0; base < n_items; base += 32) {
        const int64_t n = n_items - base < 32 ? n_items - base : 32;
        uint32_t found = 0;
        for (int64_t b = 0; b < n; b++) {
            const uint32_t h = mix32((uint32_t)(base + b) ^ seed);
            const uint32_t mask = masks[h & mask_bits];
            const uint32_t word = words[((uint64_t)h * (uint64_t)n_words) >> 32];
            found |= (uint32_t)((word & mask) == mask) << b;
        }
        hits[base / 32] = found;
    }
}

static PyObject *py_bloom_hits(PyObject *self, PyObject *args)
{
    (void)self;
    long long n_items, n_words, n_masks;
    unsigned long seed;
    unsigned long long words, masks, hits;
    if (!PyArg_ParseTuple(args, "LKLkKLK", &n_items, &words, &n_words, &seed, &masks, &n_masks, &hits)) {
        return NULL;
    }
    if (n_items < 0 || n_items > (1LL << 32) || n_words < 1 || n_words >= (1LL << 32) || n_masks < 1 ||
        (n_masks & (n_masks - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "bloom_hits: bad sizes n_items=%lld n_words=%lld n_masks=%lld", n_items,
                     n_words, n_masks);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    bloom_hits(n_items, (const uint32_t *)(uintptr_t)words, n_words, (uint32_t)seed,
               (const uint32_t *)(uintptr_t)masks, (uint32_t)(n_masks - 1), (uint32_t *)(uintptr_t)hits);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"peel", py_peel, METH_VARARGS, "Peel an aggregated sketch (see the comment at the top of _native.c)."},
    {"popcount", py_popcount, METH_VARARGS, "Number of set bits of uint32 words."},
    {"set_bits", py_set_bits, METH_VARARGS, "Sorted positions of the set bits of uint32 words."},
    {"bloom_hits", py_bloom_hits, METH_VARARGS, "Bit array of the items a Bloom filter may hold."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The codec's compiled CPU kernels (peeling, set bits, Bloom query).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
