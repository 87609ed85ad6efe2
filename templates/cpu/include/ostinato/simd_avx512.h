// AVX-512 vector layer (16 lanes): decode of one 64-input MXFP4 block, its scales, and the GEMV's partial dots.
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

// The GEMV's partial dots (expert_rows.h gemv_rows): acc[GEMV_ACC t + L] += group L's part of row . x_t over
// blocks [b0, b1), the row's packed bytes p and scales s. One accumulator per group: two independent FMA chains
// per token instead of one (FMA latency bounds a single chain at one block per 8 cycles, below what DRAM
// delivers). The 32 registers hold 8 tokens' two accumulators, the 4 decoded vectors and the scales. Blocks run
// in order whatever [b0, b1) is, so how gemv_rows cuts a row into chunks changes no result.
constexpr int GEMV_ACC = 2;
template <int NT>
inline void gemv_chunk(const uint8_t* p, const uint8_t* s, int b0, int b1, const float* const* xs, V* acc) {
    V a[NT][2];
    for (int t = 0; t < NT; ++t) a[t][0] = acc[2 * t], a[t][1] = acc[2 * t + 1];
    for (int b = b0; b < b1; ++b) {
        V w[4];
        decode64(p + 32 * b, w);
        const V s0 = _mm512_set1_ps(TAB.e8m0[s[2 * b]]), s1 = _mm512_set1_ps(TAB.e8m0[s[2 * b + 1]]);
        for (int t = 0; t < NT; ++t) {
            const float* x = xs[t] + BLK * b;
            V d0 = _mm512_mul_ps(w[0], _mm512_load_ps(x));
            V d1 = _mm512_mul_ps(w[2], _mm512_load_ps(x + 32));
            d0 = _mm512_fmadd_ps(w[1], _mm512_load_ps(x + 16), d0);
            d1 = _mm512_fmadd_ps(w[3], _mm512_load_ps(x + 48), d1);
            a[t][0] = _mm512_fmadd_ps(d0, s0, a[t][0]);
            a[t][1] = _mm512_fmadd_ps(d1, s1, a[t][1]);
        }
    }
    for (int t = 0; t < NT; ++t) acc[2 * t] = a[t][0], acc[2 * t + 1] = a[t][1];
}
inline float gemv_sum(const V* acc) { return hsum(_mm512_add_ps(acc[0], acc[1])); }

}  // namespace
