// AVX-512 vector layer (16 lanes): decode of one 64-input MXFP4 block, its scales, and the GEMV row.
// simd.h includes it when the kernel defines OST_AVX512.
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (BLK).
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include "ostinato/mxfp4.h"

namespace {

typedef __m512 V;
constexpr int VW = 16;
inline float hsum(V v) { return _mm512_reduce_add_ps(v); }

// 32 packed bytes -> 64 unscaled weights in 4 vectors: [group0 even, group0 odd, group1 even, group1 odd].
// vpermps reads only index bits 3:0, so the widened byte indexes the 16-entry LUT by its low nibble
// directly, and by its high nibble after one shift.
inline void decode64(const uint8_t* p, V w[4]) {
    const V lut = _mm512_load_ps(FP4);
    for (int L = 0; L < 2; ++L) {
        const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + 16 * L)));
        w[2 * L] = _mm512_permutexvar_ps(d, lut);
        w[2 * L + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
    }
}
inline V block_scale(const uint8_t* s, int m) { return _mm512_set1_ps(TAB.e8m0[s[m / 2]]); }
constexpr int NDEC = 4;

// One accumulator per group: two independent FMA chains per token instead of one (FMA latency bounds a
// single chain at one block per 8 cycles, below what DRAM delivers).
template <int NT>
inline void gemv_row(const uint8_t* p, const uint8_t* s, int K, const float* const* xs, float* y) {
    V acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int b = 0; b < K / BLK; ++b) {
        V w[4];
        decode64(p + 32 * b, w);
        const V s0 = _mm512_set1_ps(TAB.e8m0[s[2 * b]]), s1 = _mm512_set1_ps(TAB.e8m0[s[2 * b + 1]]);
        for (int t = 0; t < NT; ++t) {
            const float* x = xs[t] + BLK * b;
            V d0 = _mm512_mul_ps(w[0], _mm512_load_ps(x));
            V d1 = _mm512_mul_ps(w[2], _mm512_load_ps(x + 32));
            d0 = _mm512_fmadd_ps(w[1], _mm512_load_ps(x + 16), d0);
            d1 = _mm512_fmadd_ps(w[3], _mm512_load_ps(x + 48), d1);
            acc[t][0] = _mm512_fmadd_ps(d0, s0, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(d1, s1, acc[t][1]);
        }
    }
    for (int t = 0; t < NT; ++t) y[t] = hsum(_mm512_add_ps(acc[t][0], acc[t][1]));
}
// 5..8 tokens: the 32 registers hold 8 tokens' two accumulators, the 4 decoded vectors and the scales.
template <int NT>
inline void gemv_row_wide(const uint8_t* p, const uint8_t* s, int K, const float* const* xs, float* y) {
    static_assert(NT >= 5 && NT <= 8, "5..8 tokens (gemv_row: 1..4)");
    gemv_row<NT>(p, s, K, xs, y);
}

}  // namespace
