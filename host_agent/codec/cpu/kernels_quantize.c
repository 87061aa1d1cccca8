/*
 * Quantizing a float32 bucket to int32 and the int32 sums back, one pass each (quantize.py's quantize and
 * dequantize, whose torch code takes four passes and two, each through memory). The same arithmetic in
 * the same order, so the same bits: x times 2^scale as quantize.py's _mul_pow2 does it (factors of at
 * most 2^126, each exact and a normal float32), the clamp of an assumed scale, then rounding half to even
 * (the default rounding mode, as torch.round).
 */
#include <math.h>

#include "kernels.h"

/* quantize.py's _mul_pow2 split of 2^e into factors that are normal float32 values; returns how many. */
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
    return e == 0 ? count : -1;
}

/* quantize.py's quantize for float32: round(x * 2^scale) as int32, clamped first where clamp is set (a
 * NaN stays NaN through the clamp, as torch.clamp keeps it). */
VECTOR_CLONES static void quantize_loop(const float *x, int64_t n, const float *factors, int count, int clamp,
                                        int32_t *out)
{
    const float lo = QUANTIZE_CLAMP_LO, hi = QUANTIZE_CLAMP_HI;
    for (int64_t i = 0; i < n; i++) {
        float y = x[i];
        for (int f = 0; f < count; f++) {
            y *= factors[f];
        }
        if (clamp) {
            y = y < lo ? lo : (y > hi ? hi : y);
        }
        out[i] = (int32_t)rintf(y);
    }
}

int quantize_pow2(const float *x, int64_t n, int scale, int clamp, int32_t *out)
{
    float factors[MAX_POW2_FACTORS];
    const int count = pow2_factors(scale, factors);
    if (count < 0) {
        return 0;
    }
    quantize_loop(x, n, factors, count, clamp, out);
    return 1;
}

/* quantize.py's dequantize for float32 output: q as float32 (rounded once), times 2^-scale. */
VECTOR_CLONES static void dequantize_loop(const int32_t *q, int64_t n, const float *factors, int count, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        float y = (float)q[i];
        for (int f = 0; f < count; f++) {
            y *= factors[f];
        }
        out[i] = y;
    }
}

int dequantize_pow2(const int32_t *q, int64_t n, int scale, float *out)
{
    float factors[MAX_POW2_FACTORS];
    const int count = pow2_factors(-scale, factors);
    if (count < 0) {
        return 0;
    }
    dequantize_loop(q, n, factors, count, out);
    return 1;
}
