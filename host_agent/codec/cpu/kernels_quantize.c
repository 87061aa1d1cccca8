/*
 * Quantizing a float32 bucket to int32 and the int32 sums back, one pass each (quantize.py's quantize and
 * dequantize, whose torch code takes four passes and two, each through memory). The same arithmetic in
 * the same order, so the same bits: x times 2^scale as quantize.py's _mul_pow2 does it (factors of at
 * most 2^126, each exact and a normal float32), the clamp of an assumed scale, then rounding half to even
 * (the default rounding mode, as torch.round). A dense round's first pass reads a bucket once for all it
 * needs: its nonzero count, its largest magnitude and, at an assumed scale, its words (scan_quantize).
 */
#include <math.h>

#include "kernels.h"

/* quantize.py's _mul_pow2 split of 2^e into factors that are normal float32 values, padded with ones to
 * MAX_POW2_FACTORS: a product by 1.0f changes no bit, and a fixed count of factors lets the loops below
 * run eight elements at a time. 0 when 2^e needs more factors than that. */
static int pow2_factors(int e, float factors[MAX_POW2_FACTORS])
{
    int count = 0;
    while (e > 0 && count < MAX_POW2_FACTORS) {
        const int step = e < 126 ? e : 126;
        factors[count++] = ldexpf(1.0f, step);
        e -= step;
    }
    while (e < 0 && count < MAX_POW2_FACTORS) {
        const int step = e > -126 ? e : -126;
        factors[count++] = ldexpf(1.0f, step);
        e -= step;
    }
    while (count < MAX_POW2_FACTORS) {
        factors[count++] = 1.0f;
    }
    return e == 0;
}

/* x times each factor in turn, as _mul_pow2 multiplies. */
static inline float times_factors(float x, const float factors[MAX_POW2_FACTORS])
{
    for (int f = 0; f < MAX_POW2_FACTORS; f++) {
        x *= factors[f];
    }
    return x;
}

/* The clamp of an assumed scale; a NaN stays NaN, as torch.clamp keeps it. */
static inline float clamped(float y)
{
    const float lo = QUANTIZE_CLAMP_LO, hi = QUANTIZE_CLAMP_HI;
    return y < lo ? lo : (y > hi ? hi : y);
}

/* The float32 bits of |x|: as unsigned integers they order like the magnitudes, inf above every finite
 * value and NaN above inf, so their maximum answers both "largest |x|" and "all finite?". */
static inline uint32_t magnitude_bits(float x)
{
    union {
        float f;
        uint32_t u;
    } bits = {x};
    return bits.u & MAGNITUDE_MASK;
}

/* quantize.py's quantize for float32: round(x * 2^scale) as int32 (one loop per clamp choice, so that
 * neither branches per element). */
VECTOR_CLONES static void quantize_loop(const float *x, int64_t n, const float *factors, int32_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        out[i] = (int32_t)rintf(times_factors(x[i], factors));
    }
}

VECTOR_CLONES static void quantize_clamped_loop(const float *x, int64_t n, const float *factors, int32_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        out[i] = (int32_t)rintf(clamped(times_factors(x[i], factors)));
    }
}

int quantize_pow2(const float *x, int64_t n, int scale, int clamp, int32_t *out)
{
    float factors[MAX_POW2_FACTORS];
    if (!pow2_factors(scale, factors)) {
        return 0;
    }
    if (clamp) {
        quantize_clamped_loop(x, n, factors, out);
    } else {
        quantize_loop(x, n, factors, out);
    }
    return 1;
}

/* quantize.py's dequantize for float32 output: q as float32 (rounded once), times 2^-scale. */
VECTOR_CLONES static void dequantize_loop(const int32_t *q, int64_t n, const float *factors, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        out[i] = times_factors((float)q[i], factors);
    }
}

int dequantize_pow2(const int32_t *q, int64_t n, int scale, float *out)
{
    float factors[MAX_POW2_FACTORS];
    if (!pow2_factors(-scale, factors)) {
        return 0;
    }
    dequantize_loop(q, n, factors, out);
    return 1;
}

/* items.py's count_nonzero_items (block 1) and quantize.py's exponent_field over one chunk of at most
 * SCAN_CHUNK elements (a 32-bit count keeps the loop eight lanes wide), into the totals. */
VECTOR_CLONES static void scan_chunk(const float *x, int64_t n, int64_t *nonzero, uint32_t *largest)
{
    uint32_t count = 0, top = *largest;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t m = magnitude_bits(x[i]);
        count += m != 0;
        top = m > top ? m : top;
    }
    *nonzero += count;
    *largest = top;
}

/* scan_chunk and quantize_clamped_loop (an assumed scale) in one pass. */
VECTOR_CLONES static void scan_quantize_chunk(const float *x, int64_t n, const float *factors, int32_t *out,
                                              int64_t *nonzero, uint32_t *largest)
{
    uint32_t count = 0, top = *largest;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t m = magnitude_bits(x[i]);
        count += m != 0;
        top = m > top ? m : top;
        out[i] = (int32_t)rintf(clamped(times_factors(x[i], factors)));
    }
    *nonzero += count;
    *largest = top;
}

int scan_quantize(const float *x, int64_t n, int scale, int32_t *out, int64_t *nonzero, uint32_t *largest)
{
    float factors[MAX_POW2_FACTORS];
    if (out != NULL && !pow2_factors(scale, factors)) {
        return 0;
    }
    *nonzero = 0;
    *largest = 0;
    for (int64_t at = 0; at < n; at += SCAN_CHUNK) {
        const int64_t len = n - at < SCAN_CHUNK ? n - at : SCAN_CHUNK;
        if (out == NULL) {
            scan_chunk(x + at, len, nonzero, largest);
        } else {
            scan_quantize_chunk(x + at, len, factors, out + at, nonzero, largest);
        }
    }
    return 1;
}
