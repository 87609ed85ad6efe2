// MXFP4 decode tables (docs/model.md 2.2): e2m1 code values, e8m0 scales, and the lane order the
// block decode (simd_avx2.h / simd_avx512.h) emits.
//
// Weights are decoded in an ISA-specific lane order that keeps each 32-input group inside known
// vector lanes; instead of shuffling decoded weights back, activations are permuted once per call
// into the same order (perm_src), so every dot product is a plain contiguous one.
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (BLK; the ISA macro OST_AVX2).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace {

// e2m1 code -> value, bit 3 is the sign (docs/model.md 2.2).
alignas(64) const float FP4[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                   -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

struct Tables {
    float e8m0[256];        // scale byte b -> 2^(b-127), 255 -> NaN
    int perm_src[BLK];      // permuted position -> natural index inside a block
    int perm_dst[BLK];      // natural index -> permuted position
    uint8_t fp4_b3[32];     // byte 3 of each FP4 value's float32 bits (twice: both 128-bit lanes)
    uint8_t fp4_b2[32];     // byte 2 of the same
    Tables() {
        for (int b = 0; b < 256; ++b) e8m0[b] = b == 255 ? NAN : ldexpf(1.f, b - 127);
        for (int i = 0; i < BLK; ++i) {
#ifdef OST_AVX2
            // decode64 below emits vector m = 4h + 2a + b (h: high nibble, a: unpack lo/hi, b: even/odd
            // word), lane L (= group), dword p: byte j = 8a + 2p + b of group L, element 2j + h.
            int m = i / 8, L = (i / 4) % 2, p = i % 4, h = m / 4, a = (m / 2) % 2, bb = m % 2;
            perm_src[i] = 32 * L + 2 * (8 * a + 2 * p + bb) + h;
#else
            // decode64 emits vector m = 2L + h, lane j: element 2j + h of group L.
            int m = i / 16, j = i % 16, L = m / 2, h = m % 2;
            perm_src[i] = 32 * L + 2 * j + h;
#endif
        }
        for (int i = 0; i < BLK; ++i) perm_dst[perm_src[i]] = i;
        for (int c = 0; c < 32; ++c) {
            uint32_t bits;
            memcpy(&bits, &FP4[c % 16], 4);
            fp4_b3[c] = bits >> 24;
            fp4_b2[c] = (bits >> 16) & 0xFF;  // bytes 1 and 0 are zero for every FP4 value
        }
    }
};
const Tables TAB;

}  // namespace
