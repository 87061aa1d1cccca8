/*
 * Packing int32 words for a collective that moves bytes (word_packing.py's pack and unpack, whose torch
 * code widens every word to 32 bit lanes): each block of PACK_BLOCK_WORDS zigzag values written in as many
 * bits per value as its widest needs. A dense bucket's quantized gradient uses ~26 of its 32 bits; the
 * sum over the process group moves what is left.
 */
#include "kernels.h"

/* word_packing.py's _payload_offset: the width bytes, rounded up to a whole 32-bit word. */
static inline int64_t payload_offset(int64_t blocks)
{
    return (blocks + 3) & ~(int64_t)3;
}

static inline int64_t block_count(int64_t n)
{
    return (n + PACK_BLOCK_WORDS - 1) / PACK_BLOCK_WORDS;
}

/* word_packing.py's zigzag: small magnitudes of either sign to small unsigned values. */
static inline uint32_t zigzag(int32_t x)
{
    return ((uint32_t)x << 1) ^ (uint32_t)(x >> 31);
}

static inline int32_t unzigzag(uint32_t z)
{
    return (int32_t)((z >> 1) ^ (0u - (z & 1u)));
}

/* Little-endian stores and loads: the layout is bytes, the same on every host. */
static inline void store_le32(uint8_t *at, uint32_t v)
{
    at[0] = (uint8_t)v;
    at[1] = (uint8_t)(v >> 8);
    at[2] = (uint8_t)(v >> 16);
    at[3] = (uint8_t)(v >> 24);
}

static inline uint32_t load_le32(const uint8_t *at)
{
    return (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
}

/* word_packing.py's capacity: the bytes a pack of n words may take (every block at full width). */
int64_t packed_capacity(int64_t n)
{
    return payload_offset(block_count(n)) + block_count(n) * PACK_BLOCK_WORDS * 4;
}

/* word_packing.py's pack: returns the bytes written to out (at most packed_capacity(n)). */
int64_t pack_words(const int32_t *words, int64_t n, uint8_t *out)
{
    const int64_t blocks = block_count(n);
    uint8_t *payload = out + payload_offset(blocks);
    memset(out + blocks, 0, (size_t)(payload_offset(blocks) - blocks));
    for (int64_t b = 0; b < blocks; b++) {
        uint32_t z[PACK_BLOCK_WORDS] = {0};
        const int64_t first = b * PACK_BLOCK_WORDS;
        const int count = n - first < PACK_BLOCK_WORDS ? (int)(n - first) : PACK_BLOCK_WORDS;
        uint32_t any = 0;
        for (int j = 0; j < count; j++) {
            z[j] = zigzag(words[first + j]);
            any |= z[j];
        }
        const int width = any ? PACK_MAX_WIDTH - __builtin_clz(any) : 0;
        out[b] = (uint8_t)width;
        uint64_t pending = 0;
        int bits = 0;
        for (int j = 0; width && j < PACK_BLOCK_WORDS; j++) {
            pending |= (uint64_t)z[j] << bits;
            bits += width;
            if (bits >= 32) {
                store_le32(payload, (uint32_t)pending);
                payload += 4;
                pending >>= 32;
                bits -= 32;
            }
        }
    }
    return payload - out;
}

/* word_packing.py's unpack (add: its unpack with add=True). */
int unpack_words(const uint8_t *packed, int64_t size, int64_t n, int32_t *out, int add)
{
    const int64_t blocks = block_count(n);
    if (size < payload_offset(blocks)) {
        return 0;
    }
    int64_t expected = payload_offset(blocks);
    for (int64_t b = 0; b < blocks; b++) {
        if (packed[b] > PACK_MAX_WIDTH) {
            return 0;
        }
        expected += (int64_t)packed[b] * 4;
    }
    if (expected != size) {
        return 0;
    }
    const uint8_t *payload = packed + payload_offset(blocks);
    for (int64_t b = 0; b < blocks; b++) {
        const int width = packed[b];
        const uint64_t mask = (1ull << width) - 1;
        const int64_t first = b * PACK_BLOCK_WORDS;
        const int count = n - first < PACK_BLOCK_WORDS ? (int)(n - first) : PACK_BLOCK_WORDS;
        uint64_t pending = 0;
        int bits = 0;
        for (int j = 0; j < count; j++) {
            int32_t value = 0;
            if (width) {
                if (bits < width) {
                    pending |= (uint64_t)load_le32(payload) << bits;
                    payload += 4;
                    bits += 32;
                }
                value = unzigzag((uint32_t)(pending & mask));
                pending >>= width;
                bits -= width;
            }
            out[first + j] = add ? (int32_t)((uint32_t)out[first + j] + (uint32_t)value) : value;
        }
        if (count < PACK_BLOCK_WORDS) {
            break; /* the last block: its padding values are zeros, never read */
        }
    }
    return 1;
}
