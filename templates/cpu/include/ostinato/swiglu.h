// SwiGLU with the model's clamp, h = silu(min(g, L)) * clamp(u, -L, L): scalar, and on VW lanes with the
// vector exp it needs.
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (LIMIT).
#pragma once

#include <math.h>

#include "ostinato/simd.h"

namespace {

inline float swiglu(float g, float u) {
    // comparisons, not fminf / fmaxf (library calls without -ffinite-math-only); same result for NaN
    g = g < LIMIT ? g : LIMIT;
    u = u > -LIMIT ? u : -LIMIT;
    u = u < LIMIT ? u : LIMIT;
    return g / (1.f + expf(-g)) * u;
}

// exp on VW lanes, for x in [-100, 100] (callers clamp): 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2,
// and Cephes expf's polynomial (within 2 ulp of expf); 2^n is applied in two halves so that n up to
// +-145 overflows to inf and underflows to 0 as expf does.
inline V vexp(V x) {
#ifdef OST_AVX2
    const V n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
    V r = vfma(n, vload_bcast(-0.693359375f), x);  // ln 2 in two parts: r exact to float32
    r = vfma(n, vload_bcast(2.12194440e-4f), r);
    V p = vload_bcast(1.9875691500e-4f);
    static const float poly[5] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
    for (float k : poly) p = vfma(p, r, vload_bcast(k));
    p = vfma(p, vmul(r, r), vadd(r, vload_bcast(1.f)));
#ifdef OST_AVX2
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
#else
    return _mm512_scalef_ps(p, n);
#endif
}

// swiglu on VW lanes (h of VW rows of one token); min / max return their second operand for NaN, as
// swiglu's comparisons do.
inline V swiglu_v(V g, V u) {
    const V lim = vload_bcast(LIMIT), nlim = vload_bcast(-LIMIT);
#ifdef OST_AVX2
    g = _mm256_min_ps(g, lim);
    u = _mm256_min_ps(_mm256_max_ps(u, nlim), lim);
    // exp(-g) for g far below 0 must saturate, not wrap: this vexp builds 2^n from shifted integer bits,
    // which overflow past n ~ 254 (g < -177). exp(100) is already inf in float, and g / inf = -0 = silu(g).
    const V e = vexp(_mm256_min_ps(_mm256_sub_ps(vzero(), g), vload_bcast(100.f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(vload_bcast(1.f), e)), u);
#else
    g = _mm512_min_ps(g, lim);
    u = _mm512_min_ps(_mm512_max_ps(u, nlim), lim);
    const V e = vexp(_mm512_max_ps(_mm512_sub_ps(vzero(), g), vload_bcast(-100.f)));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(vload_bcast(1.f), e)), u);
#endif
}

}  // namespace
