// bf16 activations on vdpbf16ps (pairs of bf16 multiplied exactly, summed in float32): the GEMV's partial dots,
// bf16 tile dequantization and the bf16 micro-kernel. AVX512_BF16 builds only (OST_BF16DOT); e2m1 codes
// are exact in bf16, and the group's 2^k scale is applied to the float32 partial sum.
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (BLK; OST_BF16DOT).
#pragma once

#ifdef OST_BF16DOT
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "ostinato/simd.h"

namespace {

// bf16 operands use their own order inside each 64-input block, "bf16 order": [group 0 even elements,
// group 1 even, group 0 odd, group 1 odd] (16 each) = the float32 order (perm_src: [g0 even, g0 odd,
// g1 even, g1 odd]) with its middle vectors swapped (to_bf16_blocks). Widening the 32 packed bytes of a
// block to words then gives the low nibbles in the first 32 words and the high ones after a shift, and
// one vdpbf16ps sums group 0 into lanes 0-7 and group 1 into lanes 8-15.

// bf16 bits of the 16 FP4 values, twice: vpermw reads the low 5 index bits, so a zero-extended byte
// indexes it directly (its low nibble; bit 4 selects the copy) and its high nibble after a shift.
alignas(64) const uint16_t FP4_BF16[32] = {
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0,
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};

// float32 rows in perm_src order -> bf16 order (n a multiple of 64).
inline void to_bf16_blocks(const float* src, uint16_t* dst, int64_t n) {
    for (int64_t i = 0; i < n; i += BLK) {
        const float* s = src + i;
        _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 32), _mm512_loadu_ps(s)));
        _mm512_storeu_si512(dst + i + 32, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 48), _mm512_loadu_ps(s + 16)));
    }
}

// gemv_chunk on bf16 inputs (acc[2 t + parity of the block] for token t): per block, two vdpbf16ps on its
// unscaled codes give both groups' dots, then one FMA by [scale 0 x 8, scale 1 x 8] (exact: powers of two).
// Even and odd blocks accumulate apart: two FMA chains per token. The 32 registers hold 8 tokens' two
// accumulators beside the decoded codes. Blocks run in order whatever [b0, b1) is.
template <int NT>
inline void gemv_chunk_bf16(const uint8_t* p, const uint8_t* s, int b0, int b1, const uint16_t* const* xs, V* acc) {
    const __m512i lut = _mm512_load_si512(FP4_BF16);
    V a[NT][2];
    for (int t = 0; t < NT; ++t) a[t][0] = acc[2 * t], a[t][1] = acc[2 * t + 1];
    for (int bp = b0; bp < b1; bp += 2)  // b0 is even: j is the block's parity, a constant per unrolled step
        for (int j = 0; j < 2 && bp + j < b1; ++j) {
            const int b = bp + j;
            const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(p + 32 * b)));
            const __m512bh lo = (__m512bh)_mm512_permutexvar_epi16(w, lut);
            const __m512bh hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), lut);
            const V sc = _mm512_insertf32x8(_mm512_set1_ps(TAB.e8m0[s[2 * b]]), _mm256_set1_ps(TAB.e8m0[s[2 * b + 1]]), 1);
            for (int t = 0; t < NT; ++t) {
                const uint16_t* x = xs[t] + BLK * b;
                V d = _mm512_dpbf16_ps(_mm512_setzero_ps(), lo, (__m512bh)_mm512_load_si512(x));
                d = _mm512_dpbf16_ps(d, hi, (__m512bh)_mm512_load_si512(x + 32));
                a[t][j] = _mm512_fmadd_ps(d, sc, a[t][j]);
            }
        }
    for (int t = 0; t < NT; ++t) acc[2 * t] = a[t][0], acc[2 * t + 1] = a[t][1];
}

// LUT entries that scaling changes: all but codes 0 and 8 (+0, -0), in both halves.
constexpr __mmask32 FP4_NONZERO = ~((1u << 0) | (1u << 8) | (1u << 16) | (1u << 24));

// Rows [0, nrows) of a K-column matrix, columns [k0, k0 + kb), scaled, into tile [nrows, kb] bf16 (bf16
// order). Scaling by 2^(b-127) adds b-127 to the exponent field of the nonzero entries of a LUT whose
// lower half serves group 0 and upper half group 1, exactly while the result stays a normal number:
// scale bytes 2..252 (|code| in [0.5, 6]). Blocks with other bytes (real checkpoints hardly have them)
// take the float32 product, whose conversion to bf16 is exact except that it flushes subnormals
// (|w| < 2^-126) to zero; byte 255 (NaN) stays NaN.
inline void dequant_tile_bf16(const uint8_t* const* rows_p, const uint8_t* const* rows_s, int nrows, int k0, int kb,
                              uint16_t* tile) {
    const __m512i lut = _mm512_load_si512(FP4_BF16);
    const __m512i upper = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);  // group 1's half
    const __m512i nib = _mm512_set1_epi16(0x0F);
    for (int r = 0; r < nrows; ++r)
        for (int b = 0; b < kb / BLK; ++b) {
            const int kblk = k0 / BLK + b;
            const uint8_t* p = rows_p[r] + 32 * kblk;
            const int s0 = rows_s[r][2 * kblk], s1 = rows_s[r][2 * kblk + 1];
            uint16_t* dst = tile + (size_t)r * kb + BLK * b;
            if (s0 >= 2 && s0 <= 252 && s1 >= 2 && s1 <= 252) {
                const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
                const __m512i add = _mm512_inserti64x4(_mm512_set1_epi16((short)((s0 - 127) << 7)),
                                                       _mm256_set1_epi16((short)((s1 - 127) << 7)), 1);
                const __m512i scaled = _mm512_mask_add_epi16(lut, FP4_NONZERO, lut, add);
                const __m512i lo = _mm512_ternarylogic_epi32(w, nib, upper, 0xEA);  // (w & 0xF) | upper
                const __m512i hi = _mm512_or_si512(_mm512_srli_epi16(w, 4), upper);
                _mm512_store_si512(dst, _mm512_permutexvar_epi16(lo, scaled));
                _mm512_store_si512(dst + 32, _mm512_permutexvar_epi16(hi, scaled));
            } else {
                V w[4];  // [g0 even, g0 odd, g1 even, g1 odd]
                decode64(p, w);
                const V sc0 = _mm512_set1_ps(TAB.e8m0[s0]), sc1 = _mm512_set1_ps(TAB.e8m0[s1]);
                _mm512_store_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(w[2], sc1), _mm512_mul_ps(w[0], sc0)));
                _mm512_store_si512(dst + 32, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(w[3], sc1), _mm512_mul_ps(w[1], sc0)));
            }
        }
}

// The 16 sums of v[0..15] in one vector, lane p = sum of the input at HSUM16_SLOT[p]: a transpose-and-add
// tree of 45 shuffles and adds, a third of 16 separate reductions.
constexpr int HSUM16_SLOT[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
inline V hsum16(const V* v) {
    V s[8], t[4], u[2];
    for (int k = 0; k < 8; ++k)  // 128-bit lanes: [v_k, v_k, v_k+8, v_k+8]
        s[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[k], v[k + 8], 0x44), _mm512_shuffle_f32x4(v[k], v[k + 8], 0xEE));
    for (int k = 0; k < 4; ++k)  // [v_k, v_k+8, v_k+4, v_k+12]
        t[k] = _mm512_add_ps(_mm512_shuffle_f32x4(s[k], s[k + 4], 0x88), _mm512_shuffle_f32x4(s[k], s[k + 4], 0xDD));
    for (int k = 0; k < 2; ++k)  // per lane: two floats of t_k's vector, two of t_k+2's
        u[k] = _mm512_add_ps(_mm512_shuffle_ps(t[k], t[k + 2], 0x44), _mm512_shuffle_ps(t[k], t[k + 2], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88), _mm512_shuffle_ps(u[0], u[1], 0xDD));
}

// Tile rows i . x_t over kn inputs from k0, MR rows x NR tokens held in registers, starting from zero
// (k0 = 0) or acc[t * ld + i]; at the last chunk (y set) reduced into y[t * ldy + i], else kept in acc.
// MR = 4, NR = 4 (measured on Zen 4: 3.4 G vdpbf16ps/s; 4x5, 4x6 no faster, 8x3 and 2x8 slower): 8 loads
// per 16 vdpbf16ps.
constexpr int MR_B = 4, NR_B = 4;
template <int NR>
inline void micro_bf16(const uint16_t* tile, int ldt, const uint16_t* const* xs, int k0, int kn, V* acc, int ld,
                       float* y, int ldy) {
    V c[MR_B][NR];
    for (int i = 0; i < MR_B; ++i)
        for (int j = 0; j < NR; ++j) c[i][j] = k0 ? acc[j * ld + i] : _mm512_setzero_ps();
    for (int k = 0; k < kn; k += 32) {
        __m512bh xv[NR];
        for (int j = 0; j < NR; ++j) xv[j] = (__m512bh)_mm512_load_si512(xs[j] + k0 + k);
        for (int i = 0; i < MR_B; ++i) {
            const __m512bh w = (__m512bh)_mm512_load_si512(tile + (size_t)i * ldt + k);
            for (int j = 0; j < NR; ++j) c[i][j] = _mm512_dpbf16_ps(c[i][j], w, xv[j]);
        }
    }
    if (!y) {
        for (int i = 0; i < MR_B; ++i)
            for (int j = 0; j < NR; ++j) acc[j * ld + i] = c[i][j];
        return;
    }
    static_assert(MR_B == 4 && NR_B == 4, "hsum16 reduces 4 x 4 accumulators");
    V v[16];
    for (int p = 0; p < 16; ++p) v[HSUM16_SLOT[p]] = p / 4 < NR ? c[p % 4][p / 4] : _mm512_setzero_ps();
    const V sums = hsum16(v);  // lane 4 j + i: row i, token j
    alignas(64) float buf[16];
    _mm512_store_ps(buf, sums);
    for (int j = 0; j < NR; ++j) memcpy(y + j * ldy, buf + 4 * j, 4 * sizeof(float));
}
// micro_bf16<nr> for a runtime nr in [1, NR].
template <int NR>
inline void micro_bf16_n(int nr, const uint16_t* tile, int ldt, const uint16_t* const* xs, int k0, int kn, V* acc, int ld,
                         float* y, int ldy) {
    if constexpr (NR > 1)
        if (nr < NR) return micro_bf16_n<NR - 1>(nr, tile, ldt, xs, k0, kn, acc, ld, y, ldy);
    micro_bf16<NR>(tile, ldt, xs, k0, kn, acc, ld, y, ldy);
}

}  // namespace
#endif  // OST_BF16DOT
