// One kernel call: argument checks, activations permuted into the decode's lane order (and rounded to
// bf16 for the vdpbf16ps paths), then the two phases (schedule.h).
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (D, I, MAX_EXPERTS; the ISA macros).
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ostinato/bf16dot.h"
#include "ostinato/mxfp4.h"
#include "ostinato/schedule.h"

namespace {

// Returns 0, or a negative code naming the first invalid argument (nothing is written then).
int validate(int64_t T, int64_t E, const int64_t* off, const int64_t* tok, const void* const* ptr, int n_threads) {
    if (T < 0) return -1;
    if (E < 0 || E > MAX_EXPERTS) return -2;
    if (off[0] != 0) return -3;
    for (int64_t e = 0; e < E; ++e)
        if (off[e + 1] < off[e]) return -3;
    for (int64_t r = 0; r < off[E]; ++r)
        if (tok[r] < 0 || tok[r] >= T) return -4;
    for (int64_t e = 0; e < E; ++e)
        if (off[e + 1] > off[e])
            for (int j = 0; j < 6; ++j)
                if (!ptr[6 * e + j]) return -5;
    if (n_threads < 1) return -6;
    return 0;
}

// x [T, D] natural order -> xp [T, D] permuted per block (and its bf16 copy when asked).
template <typename Load>
void permute_rows(int64_t T, Load load, float* xp, int n_threads) {
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (int64_t t = 0; t < T; ++t)
        for (int k = 0; k < D; ++k) xp[t * D + k / BLK * BLK + TAB.perm_dst[k % BLK]] = load(t * D + k);
}

int entry(const float* xf, const uint16_t* xh, int64_t T, int64_t E, const int64_t* off, const int64_t* tok,
          const float* wgt, const void* const* ptr, float* out, int n_threads) {
    const int err = validate(T, E, off, tok, ptr, n_threads);
    if (err || off[E] == 0) return err;
    Call c;
    c.T = T; c.E = E; c.off = off; c.tok = tok; c.wgt = wgt; c.ptr = (const uint8_t* const*)ptr; c.out = out;
    float* xp = (float*)xalloc(sizeof(float) * T * D);
    if (xf)
        permute_rows(T, [=](int64_t i) { return xf[i]; }, xp, n_threads);
    else  // bf16 -> float32 is exact: the high half of the bits
        permute_rows(T, [=](int64_t i) { uint32_t b = (uint32_t)xh[i] << 16; float f; memcpy(&f, &b, 4); return f; }, xp, n_threads);
    c.xp = xp;
    c.hp = (float*)xalloc(sizeof(float) * off[E] * I);
    c.xb = nullptr;
    c.hb = nullptr;
    uint16_t* xb = nullptr;
#ifdef OST_BF16DOT
    if (xh) {  // bf16 activations: every path runs on bf16 dot products (h is rounded to bf16 for the down matmul)
        xb = (uint16_t*)xalloc(sizeof(uint16_t) * T * D);
        for (int64_t t = 0; t < T; ++t) to_bf16_blocks(xp + t * D, xb + t * D, D);  // blocks pair up per row
        c.xb = xb;
        c.hb = (uint16_t*)xalloc(sizeof(uint16_t) * off[E] * I);
    }
#endif
    const int rc = run(c, n_threads);
    free(xp);
    free(c.hp);
    free(xb);
    free(c.hb);
    return rc;
}

}  // namespace
