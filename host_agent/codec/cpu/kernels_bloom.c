/*
 * The Bloom filter query (index.query_bloom_native): every entry of the index is tested, so its cost is
 * a pass over all of them, one hash, two loads and a compare each. With AVX2 eight entries go at once
 * (the two loads as gathers from the filter and the patterns, both small enough to stay in cache); the
 * two halves of the entries go to two threads. The scalar loop is the same test one entry at a time.
 */
#include "kernels.h"

struct bloom_part {
    int64_t lo, hi; /* entries; lo a multiple of 32 */
    const uint32_t *words, *masks;
    int64_t n_words;
    uint32_t seed, mask_bits;
    uint32_t *hits;
    int avx2;
};

/* Entries base .. base + n - 1, one at a time: each hit when its pattern's bits are all set in its word. */
static uint32_t hits_scalar(const struct bloom_part *q, int64_t base, int64_t n)
{
    const uint32_t *words = q->words, *masks = q->masks, seed = q->seed, mask_bits = q->mask_bits;
    const int64_t n_words = q->n_words;
    uint32_t found = 0;
    for (int64_t b = 0; b < n; b++) {
        const uint32_t h = mix32((uint32_t)(base + b) ^ seed);
        const uint32_t mask = masks[h & mask_bits], word = words[reduce32(h, n_words)];
        found |= (uint32_t)((word & mask) == mask) << b;
    }
    return found;
}

#ifdef HAVE_AVX2_PATH
/* Entries base .. base + 31, eight at a time: the hashes in lanes, then the two gathers. */
AVX2 static uint32_t hits32_avx2(const struct bloom_part *q, int64_t base)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), seed = _mm256_set1_epi32((int)q->seed);
    const __m256i mask_bits = _mm256_set1_epi32((int)q->mask_bits), n_words = _mm256_set1_epi32((int)q->n_words);
    uint32_t found = 0;
    for (int b = 0; b < 32; b += 8) {
        const __m256i entry = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)(base + b)), lanes);
        const __m256i h = mix8(_mm256_xor_si256(entry, seed));
        const __m256i mask = _mm256_i32gather_epi32((const int *)q->masks, _mm256_and_si256(h, mask_bits), 4);
        const __m256i word = _mm256_i32gather_epi32((const int *)q->words, reduce8(h, n_words), 4);
        const __m256i hit = _mm256_cmpeq_epi32(_mm256_and_si256(word, mask), mask);
        found |= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(hit)) << b;
    }
    return found;
}
#endif

static void bloom_part_run(void *arg)
{
    const struct bloom_part *q = arg;
    for (int64_t base = q->lo; base < q->hi; base += 32) {
        const int64_t n = q->hi - base < 32 ? q->hi - base : 32;
#ifdef HAVE_AVX2_PATH
        if (n == 32 && q->avx2) {
            q->hits[base / 32] = hits32_avx2(q, base);
            continue;
        }
#endif
        q->hits[base / 32] = hits_scalar(q, base, n);
    }
}

void bloom_hits(int64_t n_items, const uint32_t *words, int64_t n_words, uint32_t seed, const uint32_t *masks,
                uint32_t mask_bits, uint32_t *hits, int threads)
{
    int avx2 = 0;
#ifdef HAVE_AVX2_PATH
    /* the gathers take signed 32-bit indices */
    avx2 = avx2_available() && n_words < (1LL << 31) && mask_bits < (1u << 31);
#endif
    const int64_t half = threads > 1 && n_items >= (1 << 16) ? n_items / 2 / 32 * 32 : n_items;
    struct bloom_part a = {0, half, words, masks, n_words, seed, mask_bits, hits, avx2};
    struct bloom_part b = {half, n_items, words, masks, n_words, seed, mask_bits, hits, avx2};
    run_pair(bloom_part_run, &b, &a, half < n_items ? threads : 1);
}
