/*
 * What the codec's C kernels share: the sketch geometry and hashes (bit-identical to hashing.py and
 * sketch.py), and a two-thread helper. See _kernels.c for the interface and sketch.py for the layout.
 */
#ifndef LHC_CODEC_KERNELS_H
#define LHC_CODEC_KERNELS_H

#include <stdint.h>
#include <string.h>

#define MAX_ARITY 4

/* A function built twice, for AVX2 (with POPCNT) and for any x86-64, the one to run picked when the
 * library loads: its loops vectorize, and __builtin_popcount is one instruction instead of a call. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* Hand-vectorized AVX2 paths (hashes, Bloom gathers), taken where the CPU has AVX2 and simd_allowed
 * (kernels_hash.c; cpu/__init__.py clears it under LHC_CODEC_SIMD=scalar, so that the scalar loops
 * beside them, which compute the same bits, can run and be tested on any CPU). */
extern int simd_allowed;
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#define AVX2 __attribute__((target("avx2")))
#endif

static inline int avx2_available(void)
{
#ifdef HAVE_AVX2_PATH
    return simd_allowed && __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

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

#ifdef HAVE_AVX2_PATH
/* mix32 and reduce32 on eight 32-bit lanes (size < 2^32): reduce8 takes the high halves of h * size from
 * two 32x32->64 multiplies, of the even lanes and of the odd ones. */
AVX2 static inline __m256i mix8(__m256i h)
{
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x7FEB352D));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x2C1B3C6D));
    return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

AVX2 static inline __m256i reduce8(__m256i h, __m256i size)
{
    return _mm256_blend_epi32(_mm256_srli_epi64(_mm256_mul_epu32(h, size), 32),
                              _mm256_mul_epu32(_mm256_srli_epi64(h, 32), size), 0xAA);
}

AVX2 static inline __m256i hash8(__m256i x, __m256i seed, __m256i size)
{
    return reduce8(mix8(_mm256_xor_si256(x, seed)), size);
}
#endif

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

/* Copy one item's `block` lanes: a plain load and store at block 1 (memcpy of a run-time size is a call). */
static inline void copy_lanes(void *dst, const void *src, int64_t block)
{
    if (block == 1) {
        *(uint32_t *)dst = *(const uint32_t *)src;
    } else {
        memcpy(dst, src, (size_t)block * sizeof(uint32_t));
    }
}

/* Items hashed many at a time (kernels_hash.c, eight lanes with AVX2 where the CPU has it): hash_cells
 * writes the cells of items[0..n) (n <= HASH_CHUNK, all of start segment `start`) as
 * at[t * HASH_CHUNK + i]; hash_starts the start segment of each of n items. */
#define HASH_CHUNK 64
void hash_cells(const struct geometry *g, const uint32_t *items, int n, int64_t start, uint32_t *at);
/* hash_group: the cells of HASH_GROUP items of any start segments (each start hashed too), as
 * at[t * HASH_GROUP + i]; peeling hashes the candidates it frees a group at a time this way. */
#define HASH_GROUP 16
void hash_group(const struct geometry *g, const uint32_t *items, uint32_t *at);
void hash_starts(const struct geometry *g, const int64_t *items, int64_t n, uint32_t *start);

/* Candidates reordered by start segment (a counting sort, kernels_sort.c): their item numbers and
 * `block` value lanes in that order, where each start's run begins (bounds[starts] = k), and each
 * candidate's start in the caller's order (to undo the sort with unsort_by_start). One allocation. */
struct by_start {
    uint32_t *item;
    int32_t *values;
    uint32_t *start;
    int64_t *bounds;
    int64_t *scratch; /* each half's counts and cursors per start */
    int threads;
};
/* `values` (k x block, the caller's order) is carried along when not NULL; else out->values is left for
 * the caller to fill in start order. 0 without memory. */
int sort_by_start(const struct geometry *g, int64_t k, const int64_t *items, const int32_t *values,
                  int threads, struct by_start *out);
/* flags[i] = sorted_flags[j] and values[i] = s->values[j] where that is set, else zeros, candidate i
 * having gone to place j; returns how many flags are set. */
int64_t unsort_by_start(const struct geometry *g, int64_t k, struct by_start *s, const uint8_t *sorted_flags,
                        int32_t *values, uint8_t *flags);
void free_by_start(struct by_start *s);

/* Run fn(arg_a) on a second thread and fn(arg_b) on this one, or both here when no thread can be
 * started: the results never depend on which (kernels_threads.c). */
void run_pair(void (*fn)(void *), void *arg_a, void *arg_b, int threads);

/* peel_sketch returns how many candidates it peeled, -1 without memory, or PEEL_TOO_MANY where its
 * records cannot count the candidates (k >= PEEL_MAX_CANDIDATES, or 32 in one cell): the caller then
 * peels with torch. */
#define PEEL_TOO_MANY (-2)
#define PEEL_MAX_CANDIDATES (1LL << 26)
int64_t peel_sketch(int64_t k, const struct geometry *g, const int64_t *items, const int32_t *cells,
                    int32_t *values, uint8_t *peeled, int threads);
void encode_sketch(int64_t k, const struct geometry *g, const int64_t *items, const int32_t *values,
                   int32_t *out, int threads);
/* out[0..n): the `block` words of row j at element items[j] * block (clipped at n), zeros elsewhere;
 * 0 where items are not sorted, distinct and below n (out is then partly written). */
int fill_items(uint32_t *out, int64_t n, const int64_t *items, const uint32_t *rows, int64_t k, int64_t block,
               int threads);
/* hits[i / 32] bit i % 32: whether entry i (of n_items) may be in the filter `words` (index._bloom_slots's
 * word and pattern from one hash of i ^ seed, masks[] the patterns, mask_bits = len(masks) - 1). */
void bloom_hits(int64_t n_items, const uint32_t *words, int64_t n_words, uint32_t seed, const uint32_t *masks,
                uint32_t mask_bits, uint32_t *hits, int threads);
int64_t scan_nonzero(const uint32_t *x, int64_t n, int is_float, int64_t *pos, uint32_t *vals, int64_t cap,
                     int threads);

/* quantize.py's quantize and dequantize for float32 (kernels_quantize.c): 1 when done, 0 for a scale whose
 * power of two needs more than MAX_POW2_FACTORS normal factors (the caller then runs the torch code). The
 * clamp of an assumed scale keeps CLAMP_MARGIN below 2^31 on either side (quantize.py's CLAMP_MARGIN). */
#define MAX_POW2_FACTORS 4
#define CLAMP_MARGIN 128
#define QUANTIZE_CLAMP_HI (2147483648.0f - CLAMP_MARGIN)
#define QUANTIZE_CLAMP_LO (-2147483648.0f + CLAMP_MARGIN)
int quantize_pow2(const float *x, int64_t n, int scale, int clamp, int32_t *out);
int dequantize_pow2(const int32_t *q, int64_t n, int scale, float *out);
/* quantize.py's scan_quantize: x's nonzero count and the largest float32 bits of |x| (MAGNITUDE_MASK'd: at
 * least infinity's where any x is not finite) and, where out is not NULL, x quantized at an assumed
 * (clamped) scale; 0 for a scale out of reach, as quantize_pow2. */
#define MAGNITUDE_MASK 0x7FFFFFFFu
#define SCAN_CHUNK (1 << 20) /* elements a 32-bit count covers at a time */
int scan_quantize(const float *x, int64_t n, int scale, int32_t *out, int64_t *nonzero, uint32_t *largest);

/* word_packing.py's pack and unpack (kernels_pack.c): int32 words to blocks of PACK_BLOCK_WORDS zigzag
 * values, each block as wide as its widest value, and back. The layout is word_packing.py's docstring. */
#define PACK_BLOCK_WORDS 32
#define PACK_MAX_WIDTH 32
/* The most words one call takes: far above any bucket, far below where a capacity overflows int64. */
#define PACK_MAX_WORDS (1LL << 40)
int64_t packed_capacity(int64_t n);
int64_t pack_words(const int32_t *words, int64_t n, uint8_t *out);
/* 1 when `packed` (size bytes) holds exactly n words (then written to out, or added to it mod 2^32 when
 * add); 0 for a malformed buffer (a width over PACK_MAX_WIDTH, or a size that disagrees: out untouched). */
int unpack_words(const uint8_t *packed, int64_t size, int64_t n, int32_t *out, int add);

#endif
