// One call's two threaded phases over all its experts. Phase 1 splits (expert, I-row tile) items and
// computes h (gate and up rows, then SwiGLU); phase 2 splits D-row tiles and walks all experts inside
// each item, so every out element has one writer and a fixed summation order (experts, then routes,
// ascending): results do not depend on the thread count or on which thread takes an item (the GEMM
// library aside: see run), and no atomics are needed. Items are handed out dynamically: on a shared
// machine a descheduled thread then delays only its own item instead of stalling the others at the
// barrier. Items are RT rows, or GEMV_RT where every expert of the call takes the GEMV path (a decode step):
// there no tile must fit in a cache, and fewer, longer items cost less per row (the rows' sums are the same).
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (D, I, RT, GEMV_RT, KC, KB; the ISA macros).
#pragma once

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ostinato/bf16dot.h"
#include "ostinato/expert_rows.h"
#include "ostinato/gemm_library.h"
#include "ostinato/mxfp4.h"
#include "ostinato/swiglu.h"

namespace {

struct Call {
    int64_t T, E;
    const int64_t* off;     // [E+1] routes of expert e are off[e] .. off[e+1]-1
    const int64_t* tok;     // [R]
    const float* wgt;       // [R]
    const uint8_t* const* ptr;  // [E, 6]: w1, w1_scale, w3, w3_scale, w2, w2_scale
    const float* xp;        // [T, D] activations, permuted per block
    float* hp;              // [R, I] SwiGLU outputs, permuted per block
    const uint16_t* xb;     // [T, D] bf16 copy of xp (bf16 paths only)
    uint16_t* hb;           // [R, I]
    float* out;             // [T, D]
};

// The call's phases with TILE-row items over its n_active experts (`active`), max_n routes at most an expert.
template <int TILE>
int run_tiles(const Call& c, int n_threads, const int* active, int n_active, int max_n, bool any_gemm) {
    const int64_t R = c.off[c.E];
    const int64_t items1 = (int64_t)n_active * (I / TILE);
    uint16_t* xg = any_gemm ? (uint16_t*)xalloc(sizeof(uint16_t) * R * D) : nullptr;

#pragma omp parallel num_threads(n_threads)
    {
#ifdef OST_BF16DOT
        // The library runs single-threaded inside each of our threads: items stay the unit of
        // parallelism and no thread pools nest. (MKL sums differently outside a parallel region, so
        // with 1 thread the GEMM path's results differ from 2+ threads' at float32 rounding.)
        const int prev_threads = any_gemm && g_set_threads_local ? g_set_threads_local(1) : 0;
#endif
        Scratch sc;
        sc.tile = (float*)xalloc(sizeof(float) * 2 * RT * KC);  // RT: the tiled paths' tiles
        sc.tileb = (uint16_t*)xalloc(sizeof(uint16_t) * 2 * RT * (KB > D ? D : KB));
        sc.acc = nullptr;
        sc.acc_cap = 0;
        const float** xs = (const float**)malloc(sizeof(float*) * max_n);
        const uint16_t** xbs = (const uint16_t**)malloc(sizeof(uint16_t*) * max_n);
        float* y = (float*)xalloc(sizeof(float) * (size_t)max_n * 2 * TILE);
        const uint8_t* rp[2][2 * TILE];  // this item's rows [0] and the next one's [1] (Rows)
        const uint8_t* rs[2][2 * TILE];

        if (xg) {  // the GEMM path's A operand: each route's input row, consecutive per expert
#pragma omp for schedule(static)
            for (int64_t r = 0; r < R; ++r) memcpy(xg + r * D, c.xb + c.tok[r] * D, sizeof(uint16_t) * D);
        }

        // Phase 1: h[r, i] for (expert, I-row tile) items. Gate rows then up rows form one 2 TILE-row tile.
        auto rows1 = [&](int64_t it, const uint8_t** pp, const uint8_t** ps) {
            const uint8_t* const* p = c.ptr + 6 * active[it / (I / TILE)];
            const int i0 = (int)(it % (I / TILE)) * TILE;
            for (int r = 0; r < TILE; ++r) {
                pp[r] = p[0] + (size_t)(i0 + r) * (D / 2);
                ps[r] = p[1] + (size_t)(i0 + r) * (D / 32);
                pp[TILE + r] = p[2] + (size_t)(i0 + r) * (D / 2);
                ps[TILE + r] = p[3] + (size_t)(i0 + r) * (D / 32);
            }
        };
        // dynamic chunks of 2 start at even items: after an even item its thread takes the next one
#pragma omp for schedule(dynamic, 2)
        for (int64_t it = 0; it < items1; ++it) {
            const int e = active[it / (I / TILE)];
            const int i0 = (int)(it % (I / TILE)) * TILE;
            const int64_t r0 = c.off[e];
            const int n = (int)(c.off[e + 1] - r0);
            const bool next = it % 2 == 0 && it + 1 < items1;
            rows1(it, rp[0], rs[0]);
            if (next) rows1(it + 1, rp[1], rs[1]);
            const Rows rows = {rp[0], rs[0], 2 * TILE, rp[1], rs[1], next ? 2 * TILE : 0};
            for (int t = 0; t < n; ++t) {
                xs[t] = c.xp + c.tok[r0 + t] * D;
                if (c.xb) xbs[t] = c.xb + c.tok[r0 + t] * D;
            }
            rows_for(rows, D, xs, c.xb ? xbs : nullptr, xg ? xg + r0 * D : nullptr, n, sc, y, 2 * TILE);
            for (int t = 0; t < n; ++t) {
                const float* yt = y + t * 2 * TILE;  // [gate TILE, up TILE]
                alignas(64) float h[TILE];
                int r = 0;
                for (; r + VW <= TILE; r += VW) vstore(h + r, swiglu_v(vloadu(yt + r), vloadu(yt + TILE + r)));
                for (; r < TILE; ++r) h[r] = swiglu(yt[r], yt[TILE + r]);
                for (r = 0; r < TILE; ++r) {
                    const int i = i0 + r;
                    c.hp[(r0 + t) * I + i / BLK * BLK + TAB.perm_dst[i % BLK]] = h[r];
                }
            }
        }
        // implicit barrier: all of h is written
#ifdef OST_BF16DOT
        if (c.hb) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < R; ++r) to_bf16_blocks(c.hp + r * I, c.hb + r * I, I);
        }
#endif

        // Phase 2: out rows [d0, d0 + TILE) for every expert in order; one writer per element. The next rows
        // are the next expert's, or past the last one the next item's first expert's.
        auto rows2 = [&](int64_t it, int a, const uint8_t** pp, const uint8_t** ps) {
            const uint8_t* const* p = c.ptr + 6 * active[a];
            for (int r = 0; r < TILE; ++r) {
                pp[r] = p[4] + (size_t)(it * TILE + r) * (I / 2);
                ps[r] = p[5] + (size_t)(it * TILE + r) * (I / 32);
            }
        };
#pragma omp for schedule(dynamic, 2)
        for (int64_t it = 0; it < D / TILE; ++it) {
            const int d0 = (int)it * TILE;
            for (int a = 0; a < n_active; ++a) {
                const int e = active[a];
                const int64_t r0 = c.off[e];
                const int n = (int)(c.off[e + 1] - r0);
                bool next = true;
                rows2(it, a, rp[0], rs[0]);
                if (a + 1 < n_active)
                    rows2(it, a + 1, rp[1], rs[1]);
                else if ((next = it % 2 == 0 && it + 1 < D / TILE))
                    rows2(it + 1, 0, rp[1], rs[1]);
                const Rows rows = {rp[0], rs[0], TILE, rp[1], rs[1], next ? TILE : 0};
                for (int t = 0; t < n; ++t) {
                    xs[t] = c.hp + (r0 + t) * I;
                    if (c.hb) xbs[t] = c.hb + (r0 + t) * I;
                }
                rows_for(rows, I, xs, c.hb ? xbs : nullptr, c.hb ? c.hb + r0 * I : nullptr, n, sc, y, TILE);
                for (int t = 0; t < n; ++t) {
                    float* o = c.out + c.tok[r0 + t] * D + d0;
                    const float w = c.wgt[r0 + t];
                    for (int r = 0; r < TILE; ++r) o[r] += w * y[t * TILE + r];
                }
            }
        }
        free(sc.tile);
        free(sc.tileb);
        free(sc.acc);
        free(xs);
        free(xbs);
        free(y);
#ifdef OST_BF16DOT
        if (any_gemm && g_set_threads_local) g_set_threads_local(prev_threads);
#endif
    }
    free(xg);
    return 0;
}

int run(const Call& c, int n_threads) {
    // Active experts and their route ranges.
    if (c.off[c.E] == 0) return 0;
    int* active = (int*)malloc(sizeof(int) * c.E);
    int n_active = 0;
    for (int64_t e = 0; e < c.E; ++e)
        if (c.off[e + 1] > c.off[e]) active[n_active++] = (int)e;
    int max_n = 0;
    bool any_gemm = false;
    for (int a = 0; a < n_active; ++a) {
        int n = (int)(c.off[active[a] + 1] - c.off[active[a]]);
        max_n = n > max_n ? n : max_n;
        any_gemm |= path_for(n, c.xb != nullptr) == GEMM;
    }
    const int rc = max_n <= GEMV_MAX ? run_tiles<GEMV_RT>(c, n_threads, active, n_active, max_n, any_gemm)
                                     : run_tiles<RT>(c, n_threads, active, n_active, max_n, any_gemm);
    free(active);
    return rc;
}

}  // namespace
