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

// bf16 operands use their own order, "pair order": blocks pair up from the start of a row (of a K chunk,
// which holds an even number of blocks unless it is the whole row), a lone last block where a row has an odd
// count. Block b's 64 inputs form four quarters of 16, Q_k word j = the input of packed byte 2 j + k / 2's
// nibble k % 2 (low nibble first), and a pair (b, b + 1) is stored [Q_0(b) Q_0(b+1) Q_1(b) Q_1(b+1) .. Q_3(b+1)]
// (a lone block [Q_0 Q_1 Q_2 Q_3]). That is what one 64-byte load of a pair's packed bytes gives: read as 32
// words, the LUT indexed by each word (its low 5 bits), by the word >> 4, >> 8 and >> 12 decodes Q_0 .. Q_3 of
// both blocks, one vpermw each and no widening shuffle (an order per block needs a vpmovzxbw and two vpermw a
// block, and shuffles, not the loads or the dot products, bound the GEMV's decode). In each 32-word vector, words
// 8 g .. 8 g + 7 belong to group g of the pair ([b g0, b g1, b+1 g0, b+1 g1]), so after vdpbf16ps each
// 128-bit lane holds one group's partial sums and the pair's 4 scale bytes scale them in one FMA.

// bf16 bits of the 16 FP4 values, twice: vpermw reads the low 5 index bits, so bit 4 of an index (a bit of the
// next nibble) must not matter.
alignas(64) const uint16_t FP4_BF16[32] = {
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0,
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};

// Q_0 .. Q_3 of a pair (w: its 64 packed bytes) or of a lone block (w: its 32 bytes, zero-extended: the upper
// 16 words of each Q decode as +0), unscaled.
inline void decode_pair(__m512i w, __m512i lut, __m512i q[4]) {
    q[0] = _mm512_permutexvar_epi16(w, lut);
    q[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), lut);
    q[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 8), lut);
    q[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 12), lut);
}
inline __m512i load_pair(const uint8_t* p, bool lone) {
    return lone ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)p)) : _mm512_loadu_si512(p);
}

// One float32 row in perm_src order -> pair order, rounded to bf16 (n: the row's length, a multiple of 64).
// Q_k of a block holds elements of nibble k % 2 only, packed byte 2 j + k / 2 of the group's 16 at word
// j (groups 0 then 1): entries 2 j + k / 2 of float32 vectors k % 2 (group 0) and 2 + k % 2 (group 1) side by
// side, one two-source permute.
inline void to_bf16_blocks(const float* src, uint16_t* dst, int64_t n) {
    const int64_t nb = n / BLK;
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t b = 0; b < nb; b += 2) {
        const float* s = src + BLK * b;
        uint16_t* d = dst + BLK * b;
        for (int k = 0; k < 4; ++k) {
            const __m512i idx = k / 2 ? odd : even;
            const int g0 = 16 * (k % 2), g1 = 16 * (2 + k % 2);
            const __m512 qa = _mm512_permutex2var_ps(_mm512_loadu_ps(s + g0), idx, _mm512_loadu_ps(s + g1));
            if (b + 1 < nb) {
                const __m512 qb = _mm512_permutex2var_ps(_mm512_loadu_ps(s + BLK + g0), idx, _mm512_loadu_ps(s + BLK + g1));
                _mm512_storeu_si512(d + 32 * k, (__m512i)_mm512_cvtne2ps_pbh(qb, qa));
            } else {  // a lone last block
                _mm256_storeu_si256((__m256i*)(d + 16 * k), (__m256i)_mm512_cvtneps_pbh(qa));
            }
        }
    }
}

// The scales of a pair's 4 groups (scale bytes s[0..3]; a lone block: s[0..1], the other lanes 0), 2^(b-127)
// as float32 bits b << 23 for 128-bit lane g: one broadcast, one in-lane byte shuffle, one shift. Exact for
// bytes 1..254; pair_scales_table takes bytes 0 (2^-127, subnormal) and 255 (NaN).
inline V pair_scales(const uint8_t* s, bool lone) {
    uint32_t v = 0;
    memcpy(&v, s, lone ? 2 : 4);
    // lane g: byte g of the broadcast into byte 3 of each dword, zeros below (0x80 selects zero)
    const __m512i ctl = _mm512_set_epi32(0x03808080, 0x03808080, 0x03808080, 0x03808080, 0x02808080, 0x02808080, 0x02808080,
                                         0x02808080, 0x01808080, 0x01808080, 0x01808080, 0x01808080, 0x00808080, 0x00808080,
                                         0x00808080, 0x00808080);
    return _mm512_castsi512_ps(_mm512_srli_epi32(_mm512_shuffle_epi8(_mm512_set1_epi32((int)v), ctl), 1));
}
inline V pair_scales_table(const uint8_t* s, bool lone) {
    const __m128 four = _mm_setr_ps(TAB.e8m0[s[0]], TAB.e8m0[s[1]], lone ? 0.f : TAB.e8m0[s[2]], lone ? 0.f : TAB.e8m0[s[3]]);
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), _mm512_castps128_ps512(four));
}
// Whether scale bytes [i0, i1) hold a 0 or a 255 (pair_scales_table's bytes).
inline bool has_edge_scales(const uint8_t* s, int i0, int i1) {
    __mmask64 edge = 0;
    for (int i = i0; i < i1; i += 64) {
        const __mmask64 in = i1 - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (i1 - i)) - 1);
        const __m512i v = _mm512_maskz_loadu_epi8(in, s + i);
        edge |= _mm512_mask_cmpeq_epi8_mask(in, v, _mm512_setzero_si512()) |
                _mm512_mask_cmpeq_epi8_mask(in, v, _mm512_set1_epi8((char)0xFF));
    }
    return edge != 0;
}

// One pair (or lone block) b of a GEMV row into a[t][J] for NT tokens: four vdpbf16ps on its unscaled codes
// give its four groups' dots, then one FMA by their scales (exact: powers of two).
template <int NT, bool EDGE, bool LONE, int J>
inline void gemv_pair_bf16(const uint8_t* p, const uint8_t* s, int b, const uint16_t* const* xs, __m512i lut, V (*a)[2]) {
    __m512i q[4];
    decode_pair(load_pair(p + 32 * b, LONE), lut, q);
    const V sc = EDGE ? pair_scales_table(s + 2 * b, LONE) : pair_scales(s + 2 * b, LONE);
    constexpr int qstride = LONE ? 16 : 32;
    for (int t = 0; t < NT; ++t) {
        const uint16_t* x = xs[t] + BLK * b;
        // a lone block's quarters are 16 words: the upper halves load as zero (the row's end may follow)
        auto xq = [&](int k) {
            return (__m512bh)(LONE ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(x + qstride * k)))
                                   : _mm512_loadu_si512(x + qstride * k));
        };
        // two chains of two, not one of four: as fast from L1, but measured slower streaming from DRAM on Zen 4
        // (likely: a long chain keeps each pair's decoded codes waiting in the FP scheduler, and a full
        // scheduler stops the next pairs' loads from issuing, so fewer misses are in flight)
        const V d0 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)q[0], xq(0)), (__m512bh)q[1], xq(1));
        const V d1 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)q[2], xq(2)), (__m512bh)q[3], xq(3));
        a[t][J] = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), sc, a[t][J]);
    }
}

// gemv_chunk on bf16 inputs (acc[2 t + parity of the pair] for token t), blocks [b0, b1), b0 a multiple of 4
// (gemv_chunk_blocks), b1 odd only at the row's end. Pairs alternate between two accumulators per token: two
// FMA chains. The 32 registers hold 8 tokens' two accumulators beside the decoded codes. Blocks run in order
// whatever [b0, b1) is.
template <int NT, bool EDGE>
inline void gemv_pairs_bf16(const uint8_t* p, const uint8_t* s, int b0, int b1, const uint16_t* const* xs, V* acc) {
    const __m512i lut = _mm512_load_si512(FP4_BF16);
    V a[NT][2];
    for (int t = 0; t < NT; ++t) a[t][0] = acc[2 * t], a[t][1] = acc[2 * t + 1];
    int b = b0;
    for (; b + 4 <= b1; b += 4) {
        gemv_pair_bf16<NT, EDGE, false, 0>(p, s, b, xs, lut, a);
        gemv_pair_bf16<NT, EDGE, false, 1>(p, s, b + 2, xs, lut, a);
    }
    if (b + 2 <= b1) {
        gemv_pair_bf16<NT, EDGE, false, 0>(p, s, b, xs, lut, a);
        b += 2;
    }
    if (b < b1) gemv_pair_bf16<NT, EDGE, true, 1>(p, s, b, xs, lut, a);
    for (int t = 0; t < NT; ++t) acc[2 * t] = a[t][0], acc[2 * t + 1] = a[t][1];
}
template <int NT>
inline void gemv_chunk_bf16(const uint8_t* p, const uint8_t* s, int b0, int b1, const uint16_t* const* xs, V* acc) {
    if (has_edge_scales(s, 2 * b0, 2 * b1))
        gemv_pairs_bf16<NT, true>(p, s, b0, b1, xs, acc);
    else
        gemv_pairs_bf16<NT, false>(p, s, b0, b1, xs, acc);
}

// Rows [0, nrows) of a K-column matrix, columns [k0, k0 + kb), scaled, into tile [nrows, kb] bf16 (pair
// order; k0 at a pair's start). Scaling by 2^(b-127) adds b-127 to the exponent field of every nonzero decoded
// word, exactly while the result stays a normal number: scale bytes 2..252 (|code| in [0.5, 6]). Pairs with
// other bytes (real checkpoints hardly have them) take the float32 product, whose conversion to bf16 is exact
// except that it flushes subnormals (|w| < 2^-126) to zero; byte 255 (NaN) stays NaN.
inline void dequant_tile_bf16(const uint8_t* const* rows_p, const uint8_t* const* rows_s, int nrows, int k0, int kb,
                              uint16_t* tile) {
    const __m512i lut = _mm512_load_si512(FP4_BF16);
    const __m512i group_of_word = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1,
                                                   0, 0, 0, 0, 0, 0, 0, 0);
    const int nb = kb / BLK;
    for (int r = 0; r < nrows; ++r)
        for (int b = 0; b < nb; b += 2) {
            const int kblk = k0 / BLK + b;
            const bool lone = b + 1 == nb;
            const uint8_t* sb = rows_s[r] + 2 * kblk;
            const int ns = lone ? 2 : 4;
            bool normal = true;
            for (int i = 0; i < ns; ++i) normal &= sb[i] >= 2 && sb[i] <= 252;
            __m512i q[4];
            decode_pair(load_pair(rows_p[r] + 32 * kblk, lone), lut, q);
            if (normal) {
                uint32_t v = 0;
                memcpy(&v, sb, ns);
                // word j: (byte of group j / 8) - 127, in the exponent field
                const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_cvtsi32_si128((int)v)));
                const __m512i add = _mm512_slli_epi16(
                    _mm512_sub_epi16(_mm512_permutexvar_epi16(group_of_word, bytes), _mm512_set1_epi16(127)), 7);
                for (int k = 0; k < 4; ++k)  // +-0 stay zero
                    q[k] = _mm512_mask_add_epi16(q[k], _mm512_test_epi16_mask(q[k], _mm512_set1_epi16(0x7FFF)), q[k], add);
            } else {
                // lanes 0-7 | 8-15 of each half: groups (b, 0) | (b, 1), then (b + 1, 0) | (b + 1, 1)
                const V sc = pair_scales_table(sb, lone);
                const V sc_lo = _mm512_permutexvar_ps(_mm512_set_epi32(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0), sc);
                const V sc_hi = _mm512_permutexvar_ps(_mm512_set_epi32(12, 12, 12, 12, 12, 12, 12, 12, 8, 8, 8, 8, 8, 8, 8, 8), sc);
                for (int k = 0; k < 4; ++k) {
                    const V lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(q[k])), 16));
                    const V hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(q[k], 1)), 16));
                    q[k] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, sc_hi), _mm512_mul_ps(lo, sc_lo));
                }
            }
            uint16_t* dst = tile + (size_t)r * kb + BLK * b;
            for (int k = 0; k < 4; ++k) {
                if (lone)
                    _mm256_storeu_si256((__m256i*)(dst + 16 * k), _mm512_castsi512_si256(q[k]));
                else
                    _mm512_storeu_si512(dst + 32 * k, q[k]);
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
