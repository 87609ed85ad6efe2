// AVX2 vector layer (8 lanes): decode of one 64-input MXFP4 block, its scales, and the GEMV's partial dots.
// simd.h includes it when the kernel defines OST_AVX2.
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (BLK).
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include "ostinato/mxfp4.h"

namespace {

typedef __m256 V;
constexpr int VW = 8;
inline float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 32 packed bytes -> 64 unscaled weights in 8 vectors; lane 0 holds group 0, lane 1 group 1.
// Each FP4 value's float32 bits are (b3 << 24 | b2 << 16): two 16-entry byte LUTs (vpshufb) give a
// bf16 word, and interleaving with zero words widens it to float32 exactly.
inline void decode64(const uint8_t* p, V w[8]) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)p);
    const __m256i m = _mm256_set1_epi8(0x0F);
    const __m256i b3 = _mm256_load_si256((const __m256i*)TAB.fp4_b3);
    const __m256i b2 = _mm256_load_si256((const __m256i*)TAB.fp4_b2);
    const __m256i hw = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i nib[2] = {_mm256_and_si256(v, m), _mm256_and_si256(_mm256_srli_epi16(v, 4), m)};
    for (int h = 0; h < 2; ++h) {
        const __m256i hi = _mm256_shuffle_epi8(b3, nib[h]), lo = _mm256_shuffle_epi8(b2, nib[h]);
        const __m256i wa = _mm256_unpacklo_epi8(lo, hi), wb = _mm256_unpackhi_epi8(lo, hi);  // bf16 words
        // each dword holds two bf16 words: shifting / masking widens both without another shuffle
        w[4 * h + 0] = _mm256_castsi256_ps(_mm256_slli_epi32(wa, 16));
        w[4 * h + 1] = _mm256_castsi256_ps(_mm256_and_si256(wa, hw));
        w[4 * h + 2] = _mm256_castsi256_ps(_mm256_slli_epi32(wb, 16));
        w[4 * h + 3] = _mm256_castsi256_ps(_mm256_and_si256(wb, hw));
    }
}
// Scale of decoded vector m of a block whose scale bytes are s[0], s[1]: lane-wise (same for all m).
inline V block_scale(const uint8_t* s, int) {
    return _mm256_set_m128(_mm_set1_ps(TAB.e8m0[s[1]]), _mm_set1_ps(TAB.e8m0[s[0]]));
}
constexpr int NDEC = 8;

// The GEMV's partial dots (expert_rows.h gemv_rows): acc[t] += row . x_t over blocks [b0, b1), the row's
// packed bytes p and scales s. GEMV_ACC accumulators per token; expert_rows.h sums their lanes once per row.
// Blocks run in order whatever [b0, b1) is, so how gemv_rows cuts a row into chunks changes no result.
constexpr int GEMV_ACC = 1;
template <int NT>
inline void gemv_chunk(const uint8_t* p, const uint8_t* s, int b0, int b1, const float* const* xs, V* acc) {
    const __m256i m = _mm256_set1_epi8(0x0F);
    const __m256i b3 = _mm256_load_si256((const __m256i*)TAB.fp4_b3);
    const __m256i b2 = _mm256_load_si256((const __m256i*)TAB.fp4_b2);
    const __m256i hw = _mm256_set1_epi32((int)0xFFFF0000u);
    V a[NT];
    for (int t = 0; t < NT; ++t) a[t] = acc[t];
    for (int b = b0; b < b1; ++b) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(p + 32 * b));
        const V sv = block_scale(s + 2 * b, 0);
        // the lane order of decode64: vectors 4h .. 4h + 3 from nibble h, decoded a half (4 vectors) at a time
        auto half = [&](int h, V w[4]) {
            const __m256i nib = h ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m) : _mm256_and_si256(v, m);
            const __m256i hi = _mm256_shuffle_epi8(b3, nib), lo = _mm256_shuffle_epi8(b2, nib);
            const __m256i wa = _mm256_unpacklo_epi8(lo, hi), wb = _mm256_unpackhi_epi8(lo, hi);
            w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(wa, 16));
            w[1] = _mm256_castsi256_ps(_mm256_and_si256(wa, hw));
            w[2] = _mm256_castsi256_ps(_mm256_slli_epi32(wb, 16));
            w[3] = _mm256_castsi256_ps(_mm256_and_si256(wb, hw));
        };
        V w[4];
        if constexpr (NT <= 2) {
            // two short chains (low / high nibbles) per token instead of one long one: FMA latency
            V d[2][NT];
            for (int h = 0; h < 2; ++h) {
                half(h, w);
                for (int t = 0; t < NT; ++t) {
                    const float* x = xs[t] + BLK * b + 32 * h;
                    V dd = _mm256_mul_ps(w[0], _mm256_load_ps(x));
                    for (int q = 1; q < 4; ++q) dd = _mm256_fmadd_ps(w[q], _mm256_load_ps(x + 8 * q), dd);
                    d[h][t] = dd;
                }
            }
            for (int t = 0; t < NT; ++t) a[t] = _mm256_fmadd_ps(_mm256_add_ps(d[0][t], d[1][t]), sv, a[t]);
        } else if constexpr (NT <= 4) {
            // NT chains cover the FMA latency; the scale once per block and token
            V d[NT];
            for (int h = 0; h < 2; ++h) {
                half(h, w);
                for (int t = 0; t < NT; ++t) {
                    const float* x = xs[t] + BLK * b + 32 * h;
                    V dd = h ? _mm256_fmadd_ps(w[0], _mm256_load_ps(x), d[t]) : _mm256_mul_ps(w[0], _mm256_load_ps(x));
                    for (int q = 1; q < 4; ++q) dd = _mm256_fmadd_ps(w[q], _mm256_load_ps(x + 8 * q), dd);
                    d[t] = dd;
                }
            }
            for (int t = 0; t < NT; ++t) a[t] = _mm256_fmadd_ps(d[t], sv, a[t]);
        } else {
            // 5..8 tokens: the 16 registers cannot also hold a partial sum per token, so the half's weights are
            // scaled once for all tokens (a power of two: exact, the product tile_f32.h's tiles hold) and FMAed
            // straight into each token's accumulator
            for (int h = 0; h < 2; ++h) {
                half(h, w);
                for (int q = 0; q < 4; ++q) w[q] = _mm256_mul_ps(w[q], sv);
                for (int t = 0; t < NT; ++t) {
                    const float* x = xs[t] + BLK * b + 32 * h;
                    for (int q = 0; q < 4; ++q) a[t] = _mm256_fmadd_ps(w[q], _mm256_load_ps(x + 8 * q), a[t]);
                }
            }
        }
    }
    for (int t = 0; t < NT; ++t) acc[t] = a[t];
}
inline float gemv_sum(const V* acc) { return hsum(acc[0]); }

}  // namespace
