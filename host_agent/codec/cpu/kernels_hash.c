/*
 * The sketch's hashes (hashing.py's mix32 and reduce_range, bit for bit) over many items at once, which
 * encoding and peeling spend a fifth of their instructions on: eight lanes at a time with AVX2, one at a
 * time otherwise (and for the tails).
 */
#include "kernels.h"

#include <string.h>

int simd_allowed = 1;

static inline uint32_t cell_hash(uint32_t item, uint32_t seed, uint32_t size)
{
    return (uint32_t)reduce32(mix32(item ^ seed), size);
}

#ifdef HAVE_AVX2_PATH
AVX2 static int hash_cells_avx2(const struct geometry *g, const uint32_t *items, int n, int64_t start, uint32_t *at)
{
    const __m256i size = _mm256_set1_epi32((int)(uint32_t)g->seg);
    const int whole = n / 8 * 8;
    for (int t = 0; t < g->arity; t++) {
        const __m256i seed = _mm256_set1_epi32((int)g->seeds[t]);
        const __m256i base = _mm256_set1_epi32((int)(uint32_t)((start + t) * g->seg));
        for (int i = 0; i < whole; i += 8) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(items + i));
            _mm256_storeu_si256((__m256i *)(at + t * HASH_CHUNK + i), _mm256_add_epi32(base, hash8(x, seed, size)));
        }
    }
    return whole;
}

AVX2 static void hash_group_avx2(const struct geometry *g, const uint32_t *items, uint32_t *at)
{
    const __m256i seg = _mm256_set1_epi32((int)(uint32_t)g->seg);
    for (int i = 0; i < HASH_GROUP; i += 8) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(items + i));
        __m256i base = _mm256_setzero_si256();
        if (g->starts > 1) {
            const __m256i starts = _mm256_set1_epi32((int)(uint32_t)g->starts);
            base = _mm256_mullo_epi32(hash8(x, _mm256_set1_epi32((int)g->start_seed), starts), seg);
        }
        for (int t = 0; t < g->arity; t++) {
            const __m256i cell = hash8(x, _mm256_set1_epi32((int)g->seeds[t]), seg);
            _mm256_storeu_si256((__m256i *)(at + t * HASH_GROUP + i), _mm256_add_epi32(base, cell));
            base = _mm256_add_epi32(base, seg);
        }
    }
}

/* The low halves of eight int64 items (item numbers are below 2^32). */
AVX2 static inline __m256i low_halves8(const int64_t *items)
{
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m256i a = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)items), even);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(items + 4)), even);
    return _mm256_permute2x128_si256(a, b, 0x20);
}

AVX2 static int64_t hash_starts_avx2(const struct geometry *g, const int64_t *items, int64_t n, uint32_t *start)
{
    const __m256i seed = _mm256_set1_epi32((int)g->start_seed), starts = _mm256_set1_epi32((int)(uint32_t)g->starts);
    const int64_t whole = n / 8 * 8;
    for (int64_t i = 0; i < whole; i += 8) {
        _mm256_storeu_si256((__m256i *)(start + i), hash8(low_halves8(items + i), seed, starts));
    }
    return whole;
}
#endif

void hash_cells(const struct geometry *g, const uint32_t *items, int n, int64_t start, uint32_t *at)
{
    int done = 0;
#ifdef HAVE_AVX2_PATH
    if (avx2_available()) {
        done = hash_cells_avx2(g, items, n, start, at);
    }
#endif
    const uint32_t seg = (uint32_t)g->seg;
    for (int t = 0; t < g->arity; t++) {
        const uint32_t seed = g->seeds[t], base = (uint32_t)((start + t) * g->seg);
        for (int i = done; i < n; i++) {
            at[t * HASH_CHUNK + i] = base + cell_hash(items[i], seed, seg);
        }
    }
}

void hash_group(const struct geometry *g, const uint32_t *items, uint32_t *at)
{
#ifdef HAVE_AVX2_PATH
    if (avx2_available()) {
        hash_group_avx2(g, items, at);
        return;
    }
#endif
    const uint32_t seg = (uint32_t)g->seg;
    for (int i = 0; i < HASH_GROUP; i++) {
        const uint32_t base = g->starts > 1 ? cell_hash(items[i], g->start_seed, (uint32_t)g->starts) * seg : 0;
        for (int t = 0; t < g->arity; t++) {
            at[t * HASH_GROUP + i] = base + (uint32_t)t * seg + cell_hash(items[i], g->seeds[t], seg);
        }
    }
}

void hash_starts(const struct geometry *g, const int64_t *items, int64_t n, uint32_t *start)
{
    if (g->starts <= 1) {
        memset(start, 0, (size_t)n * sizeof(uint32_t));
        return;
    }
    int64_t done = 0;
#ifdef HAVE_AVX2_PATH
    if (avx2_available()) {
        done = hash_starts_avx2(g, items, n, start);
    }
#endif
    for (int64_t i = done; i < n; i++) {
        start[i] = cell_hash((uint32_t)items[i], g->start_seed, (uint32_t)g->starts);
    }
}
