// Float32 tiles: dequantize a tile of rows once per K chunk, then a 4-row x NR-token register
// micro-kernel reuses it for every token (the tiled path on float32 activations).
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (BLK, KC).
#pragma once

#include <stdint.h>

#include "ostinato/simd.h"

namespace {

// Dequantize rows [0, nrows) of a K-column matrix, columns [k0, k0 + KC), scaled, into tile [nrows, KC]
// (permuted order inside each block, matching the permuted activations).
inline void dequant_tile(const uint8_t* const* rows_p, const uint8_t* const* rows_s, int nrows, int k0, float* tile) {
    for (int r = 0; r < nrows; ++r) {
        for (int b = 0; b < KC / BLK; ++b) {
            const int kb = k0 / BLK + b;
            V w[NDEC];
            decode64(rows_p[r] + 32 * kb, w);
            float* dst = tile + r * KC + BLK * b;
            for (int m = 0; m < NDEC; ++m) vstore(dst + VW * m, vmul(w[m], block_scale(rows_s[r] + 2 * kb, m)));
        }
    }
}

// acc[t * ld + i] += tile row i . x_t  over one K chunk, for 4 rows x NR tokens held in registers.
template <int NR>
inline void micro(const float* tile, const float* const* xs, int k0, V* acc, int ld) {
    V c[4][NR];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < NR; ++j) c[i][j] = acc[j * ld + i];
    for (int k = 0; k < KC; k += VW) {
        V xv[NR];
        for (int j = 0; j < NR; ++j) xv[j] = vload(xs[j] + k0 + k);
        for (int i = 0; i < 4; ++i) {
            const V w = vload(tile + i * KC + k);
            for (int j = 0; j < NR; ++j) c[i][j] = vfma(w, xv[j], c[i][j]);
        }
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < NR; ++j) acc[j * ld + i] = c[i][j];
}
constexpr int NR_MAX = VW == 8 ? 3 : 4;  // 4 x NR accumulators + NR inputs + 1 weight fit the register file

}  // namespace
