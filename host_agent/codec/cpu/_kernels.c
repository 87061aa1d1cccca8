/*
 * The codec's CPU kernels, where torch's one-pass-per-operation model costs most, and their Python
 * bindings. Each has a torch twin that stays the reference (and the CUDA path); the tests hold the two to
 * identical bits.
 *
 *   peel (kernels_peel.c)            peeling an aggregated sketch, in cache, on up to two threads
 *   encode_sketch (kernels_sketch.c) adding a worker's items into its sketch, in order of start segment
 *   scan_nonzero, fill_items (kernels_scan.c)   a bucket to its nonzero elements and back, one pass each
 *   set_positions                    a bitmap from sorted positions (bits.words_from_positions)
 *   popcount, set_bits               the set bits of a word array, in one pass with ctz (bits.set_bits)
 *   bloom_hits (kernels_bloom.c)     every item's membership in a pattern-blocked Bloom filter, as a bit
 *                                    array; one hash, two loads and one compare per item
 *   quantize, dequantize (kernels_quantize.c)   float32 to int32 at a power-of-two scale and back, one pass
 *   scan_quantize                    a dense round's one pass: nonzero count, largest |x|, (quantized words)
 *                                    (these three bound in _kernels_quantize.c, added to the module here)
 *   pack, unpack (kernels_pack.c)    int32 words in blocks as wide as their widest zigzag value, and back
 *                                    (bound in _kernels_pack.c, added to the module here)
 *
 * Interface (called from peeling.py, sketch.py, items.py, bits.py and index.py, which check the dtypes,
 * shapes and contiguity of the tensors whose addresses they pass):
 *   geometry = (arity, starts, seg, block, start_seed, (seed_0, ..)): sketch_spec.SketchSpec's layout
 *   peel(k, geometry, items, cells, values, peeled, threads) -> how many it peeled, or None where its
 *     records cannot count the candidates (2^26 or more, or 32 in one cell; values and peeled untouched)
 *     items   const int64[k]          the candidates' item numbers (distinct, < 2^32)
 *     cells   const int32[cells][block]   the aggregated sketch (not modified)
 *     values  int32[k][block]         out: recovered sums, zero where not peeled (written whole)
 *     peeled  uint8[k]                out: 1 where recovered (written whole)
 *   encode_sketch(k, geometry, items, values, out, threads)   out: int32 cells, zeroed; values
 *     int32[k][block]
 *   fill_items(out, n, items, rows, k, block, threads)   out: 32-bit words[n] written whole; items int64[k]
 *     sorted, rows 32-bit words[k][block]
 *   scan_nonzero(x, n, is_float, pos, vals, cap, threads) -> count; pos int64[cap], vals uint32[cap] are
 *     complete only when count <= cap
 *   set_positions(positions, k, words, n_words)   words: uint32, zeroed; positions in [0, 32 n_words)
 *   popcount(words, n) -> number of set bits of uint32 words[n]
 *   set_bits(words, n, out, count, threads)   out: int64[count], the sorted positions of the set bits
 *   simd([allowed]) -> "avx2" or "scalar"   the hashes' and the Bloom query's loops (AVX2 where allowed
 *     and the CPU has it)
 *   bloom_hits(n_items, words, n_words, seed, masks, n_masks, hits, threads)
 *     words   const uint32[n_words]   the aggregated filter; an item's word and pattern come from one hash
 *     masks   const uint32[n_masks]   the patterns (n_masks a power of two), as index._patterns makes them
 *     hits    uint32[ceil(n_items / 32)]   out: bit i set when item i may be held
 *   quantize(x, n, scale, clamp, out) -> done   x const float32[n], out int32[n]; False: scale out of reach
 *   dequantize(q, n, scale, out) -> done        q const int32[n], out float32[n]
 *   scan_quantize(x, n, scale, out) -> (nonzero, largest) or None (scale out of reach)   x const float32[n];
 *     out int32[n] quantized at the clamped scale, or 0: the scan alone; largest: the top bits of |x|
 *   pack(words, n, out, capacity) -> bytes written   words const int32[n], out uint8[capacity], capacity at
 *     least packed_capacity(n) (word_packing.capacity)
 *   unpack(packed, size, n, out, add) -> done   packed const uint8[size], out int32[n] written (or added
 *     to, mod 2^32); False: packed does not hold n words (out untouched)
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "kernels.h"

extern PyMethodDef quantize_methods[]; /* _kernels_quantize.c */
extern PyMethodDef pack_methods[];     /* _kernels_pack.c */

/* Geometry from Python: (arity, starts, seg, block, start_seed, (seed_0, .. seed_{arity-1})), checked. */
static int parse_geometry(PyObject *tuple, struct geometry *g)
{
    long long starts, seg, block;
    unsigned long start_seed;
    PyObject *seeds;
    if (!PyArg_ParseTuple(tuple, "iLLLkO!", &g->arity, &starts, &seg, &block, &start_seed, &PyTuple_Type,
                          &seeds)) {
        return 0;
    }
    if (g->arity < 1 || g->arity > MAX_ARITY || PyTuple_GET_SIZE(seeds) != g->arity || starts < 1 || seg < 1 ||
        block < 1 || (starts + g->arity - 1) * seg >= (1LL << 31)) {
        PyErr_Format(PyExc_ValueError, "bad sketch geometry: arity %d, %lld starts, %lld cells per segment,"
                     " block %lld", g->arity, starts, seg, block);
        return 0;
    }
    for (int t = 0; t < g->arity; t++) {
        const unsigned long seed = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(seeds, t));
        if (PyErr_Occurred()) {
            return 0;
        }
        g->seeds[t] = (uint32_t)seed;
    }
    g->starts = starts;
    g->seg = seg;
    g->block = block;
    g->start_seed = (uint32_t)start_seed;
    return 1;
}

static PyObject *py_peel(PyObject *self, PyObject *args)
{
    (void)self;
    long long k;
    int threads;
    PyObject *geometry;
    unsigned long long items, cells, values, peeled;
    struct geometry g;
    if (!PyArg_ParseTuple(args, "LOKKKKi", &k, &geometry, &items, &cells, &values, &peeled, &threads) ||
        !parse_geometry(geometry, &g)) {
        return NULL;
    }
    if (k < 0 || k >= (1LL << 31)) {
        PyErr_Format(PyExc_ValueError, "peel: bad candidate count %lld", k);
        return NULL;
    }
    int64_t status;
    Py_BEGIN_ALLOW_THREADS
    status = peel_sketch(k, &g, (const int64_t *)(uintptr_t)items, (const int32_t *)(uintptr_t)cells,
                         (int32_t *)(uintptr_t)values, (uint8_t *)(uintptr_t)peeled, threads);
    Py_END_ALLOW_THREADS
    if (status == PEEL_TOO_MANY) {
        Py_RETURN_NONE;
    }
    if (status < 0) {
        return PyErr_NoMemory();
    }
    return PyLong_FromLongLong(status);
}

static PyObject *py_encode_sketch(PyObject *self, PyObject *args)
{
    (void)self;
    long long k;
    PyObject *geometry;
    unsigned long long items, values, out;
    int threads;
    struct geometry g;
    if (!PyArg_ParseTuple(args, "LOKKKi", &k, &geometry, &items, &values, &out, &threads) ||
        !parse_geometry(geometry, &g)) {
        return NULL;
    }
    if (k < 0 || k >= (1LL << 31)) {
        PyErr_Format(PyExc_ValueError, "encode_sketch: bad item count %lld", k);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    encode_sketch(k, &g, (const int64_t *)(uintptr_t)items, (const int32_t *)(uintptr_t)values,
                  (int32_t *)(uintptr_t)out, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_fill_items(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long out, items, rows;
    long long n, k, block;
    int threads, ok;
    if (!PyArg_ParseTuple(args, "KLKKLLi", &out, &n, &items, &rows, &k, &block, &threads)) {
        return NULL;
    }
    if (n < 0 || k < 0 || block < 1) {
        PyErr_Format(PyExc_ValueError, "fill_items: bad sizes n=%lld k=%lld block=%lld", n, k, block);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = fill_items((uint32_t *)(uintptr_t)out, n, (const int64_t *)(uintptr_t)items,
                    (const uint32_t *)(uintptr_t)rows, k, block, threads);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "fill_items: the items are not sorted, distinct and within the bucket");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_scan_nonzero(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long x, pos, vals;
    long long n, cap;
    int is_float, threads;
    if (!PyArg_ParseTuple(args, "KLpKKLi", &x, &n, &is_float, &pos, &vals, &cap, &threads)) {
        return NULL;
    }
    if (n < 0 || cap < 0) {
        PyErr_SetString(PyExc_ValueError, "scan_nonzero: negative size");
        return NULL;
    }
    int64_t count;
    Py_BEGIN_ALLOW_THREADS
    count = scan_nonzero((const uint32_t *)(uintptr_t)x, n, is_float, (int64_t *)(uintptr_t)pos,
                         (uint32_t *)(uintptr_t)vals, cap, threads);
    Py_END_ALLOW_THREADS
    if (count < 0) {
        return PyErr_NoMemory();
    }
    return PyLong_FromLongLong(count);
}

static void set_positions(const int64_t *positions, int64_t k, uint32_t *words)
{
    for (int64_t i = 0; i < k; i++) {
        words[positions[i] >> 5] |= 1u << (positions[i] & 31);
    }
}

static PyObject *py_set_positions(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long positions, words;
    long long k, n_words;
    if (!PyArg_ParseTuple(args, "KLKL", &positions, &k, &words, &n_words)) {
        return NULL;
    }
    /* positions are checked by the caller to lie in [0, 32 * n_words) */
    if (k < 0 || n_words < 0) {
        PyErr_SetString(PyExc_ValueError, "set_positions: negative size");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    set_positions((const int64_t *)(uintptr_t)positions, k, (uint32_t *)(uintptr_t)words);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

VECTOR_CLONES
static int64_t popcount_words(const uint32_t *words, int64_t n)
{
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        total += __builtin_popcount(words[i]);
    }
    return total;
}

/* The set bits of words [lo, hi), listed in out[0..end - out). */
struct set_bits_part {
    const uint32_t *words;
    int64_t lo, hi;
    int64_t *out, *end;
};

#define LOW_BIT_OR_31(w) __builtin_ctz((w) | 0x80000000u) /* ctz, and 31 (never undefined) for 0 */

/* Four positions are written for every word whatever its count, and only `count` kept: a branch on the
 * count, a coin toss at the densities the index sees, would mispredict about once per word. Within the
 * last 32 places of the part, where the spare writes would run past it, bit by bit. */
VECTOR_CLONES
static void list_set_bits(void *arg)
{
    const struct set_bits_part *part = arg;
    int64_t *out = part->out;
    for (int64_t i = part->lo; i < part->hi; i++) {
        uint32_t w = part->words[i];
        const int64_t base = i * 32;
        if (part->end - out < 32) {
            for (; w != 0; w &= w - 1) {
                *out++ = base + __builtin_ctz(w);
            }
            continue;
        }
        const int count = __builtin_popcount(w);
        for (int b = 0; b == 0 || b < count; b += 4) {
            out[b] = base + LOW_BIT_OR_31(w);
            w &= w - 1;
            out[b + 1] = base + LOW_BIT_OR_31(w);
            w &= w - 1;
            out[b + 2] = base + LOW_BIT_OR_31(w);
            w &= w - 1;
            out[b + 3] = base + LOW_BIT_OR_31(w);
            w &= w - 1;
        }
        out += count;
    }
}

/* simd([allowed]) -> "avx2" or "scalar": which loops the hashes and the Bloom query run, after allowing or
 * forbidding the AVX2 ones when given. */
static PyObject *py_simd(PyObject *self, PyObject *args)
{
    (void)self;
    int allowed = -1;
    if (!PyArg_ParseTuple(args, "|p", &allowed)) {
        return NULL;
    }
    if (allowed >= 0) {
        simd_allowed = allowed;
    }
    return PyUnicode_FromString(avx2_available() ? "avx2" : "scalar");
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
    int threads;
    if (!PyArg_ParseTuple(args, "KLKLi", &words, &n, &out, &count, &threads)) {
        return NULL;
    }
    /* The caller sized `out` by popcount; recount rather than trust it, so a bad size cannot overflow.
     * Two threads list the two halves of a large array, the second from the first half's count on. */
    int64_t total = -1;
    Py_BEGIN_ALLOW_THREADS
    const uint32_t *w = (const uint32_t *)(uintptr_t)words;
    const int64_t half = threads > 1 && n >= (1 << 16) ? n / 2 : n;
    if (n >= 0) {
        const int64_t first = popcount_words(w, half);
        total = first + popcount_words(w + half, n - half);
        int64_t *const list = (int64_t *)(uintptr_t)out;
        struct set_bits_part a = {w, 0, half, list, list + first};
        struct set_bits_part b = {w, half, n, list + first, list + total};
        if (total == count) {
            run_pair(list_set_bits, &b, &a, half < n ? threads : 1);
        }
    }
    Py_END_ALLOW_THREADS
    if (total != count) {
        PyErr_Format(PyExc_ValueError, "set_bits: output holds %lld positions, the words have %lld set bits",
                     count, (long long)total);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_bloom_hits(PyObject *self, PyObject *args)
{
    (void)self;
    long long n_items, n_words, n_masks;
    unsigned long seed;
    unsigned long long words, masks, hits;
    int threads;
    if (!PyArg_ParseTuple(args, "LKLkKLKi", &n_items, &words, &n_words, &seed, &masks, &n_masks, &hits,
                          &threads)) {
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
               (const uint32_t *)(uintptr_t)masks, (uint32_t)(n_masks - 1), (uint32_t *)(uintptr_t)hits, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"peel", py_peel, METH_VARARGS, "Peel an aggregated sketch (kernels_peel.c)."},
    {"encode_sketch", py_encode_sketch, METH_VARARGS, "Add items' values into their sketch cells."},
    {"fill_items", py_fill_items, METH_VARARGS, "A bucket written whole from sorted rows, zeros between."},
    {"simd", py_simd, METH_VARARGS, "Which loops the hashes and the Bloom query run: avx2 or scalar."},
    {"scan_nonzero", py_scan_nonzero, METH_VARARGS, "Positions and bits of a bucket's nonzero elements."},
    {"set_positions", py_set_positions, METH_VARARGS, "Set the bits at given positions of uint32 words."},
    {"popcount", py_popcount, METH_VARARGS, "Number of set bits of uint32 words."},
    {"set_bits", py_set_bits, METH_VARARGS, "Sorted positions of the set bits of uint32 words."},
    {"bloom_hits", py_bloom_hits, METH_VARARGS, "Bit array of the items a Bloom filter may hold."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels", "The codec's compiled CPU kernels (peeling, set bits, Bloom query).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    PyObject *created = PyModule_Create(&module);
    if (created != NULL &&
        (PyModule_AddFunctions(created, quantize_methods) < 0 || PyModule_AddFunctions(created, pack_methods) < 0)) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
