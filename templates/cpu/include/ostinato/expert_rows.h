// One work item's weight rows against the routes of one expert, by one of three paths chosen by the
// expert's route count n:
//  - n <= GEMV_MAX (up to 8): decode straight into registers and FMA (weights read once; 5..8 tokens
//    through gemv_row_wide, whose accumulators fit the registers);
//  - n >= GEMM_MIN, bf16 activations, a GEMM library passed in (ost_set_gemm): decode a rows x KB tile
//    to bf16 into an L2-sized buffer and hand it to the library (MKL's cblas_gemm_bf16bf16f32, which
//    picks AMX where the CPU has it); GEMM_MIN = 0: never;
//  - otherwise: decode a tile once into a cache-sized buffer and reuse it for all n tokens (float32
//    FMA, or vdpbf16ps on bf16 activations where the CPU has AVX512_BF16).
// bf16 activations on AVX512_BF16 also run the GEMV on vdpbf16ps (bf16dot.h).
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (RT, KC, KB, GEMV_MAX, GEMM_MIN, kb_for; the ISA macros).
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "ostinato/bf16dot.h"
#include "ostinato/gemm_library.h"
#include "ostinato/simd.h"
#include "ostinato/tile_f32.h"

namespace {

void* xalloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

// Rows i of one matrix (K inputs) for the n inputs xs: y[t * RTOT + row] for rows [0, nrows).
// Small n: GEMV; large n: tile dequantized once per K chunk, reused by every token.
struct Scratch {
    float* tile;      // [2 RT, KC]
    uint16_t* tileb;  // [2 RT, KB]
    V* acc;           // [n, 2 RT]
    int acc_cap;
    void reserve(int n) {
        if (n > acc_cap) {
            free(acc);
            acc = (V*)xalloc(sizeof(V) * (size_t)n * 2 * RT);
            acc_cap = n;
        }
    }
};

// The weight rows of one work item (packed bytes, scales), and those its thread takes next (or none),
// whose first bytes are prefetched while this one finishes: the rows of a work item need not be
// contiguous (gate rows then up rows; an expert's rows then the next one's), which the hardware
// prefetcher cannot guess, and one core's decode alone does not keep enough misses in flight to
// saturate DRAM.
struct Rows {
    const uint8_t* const* p;
    const uint8_t* const* s;
    int n;
    const uint8_t* const* next_p;
    const uint8_t* const* next_s;
    int next_n;  // 0: no next rows
};

// Rows ahead whose weights gemv_rows prefetches (into L2: measured faster than into L1, whose miss
// buffers the burst of one row's prefetches would fill).
constexpr int PREFETCH_ROWS = 2;
inline void prefetch_row(const uint8_t* p, const uint8_t* s, int K) {
    for (int i = 0; i < K / 2; i += 64) _mm_prefetch((const char*)p + i, _MM_HINT_T1);
    for (int i = 0; i < K / 32; i += 64) _mm_prefetch((const char*)s + i, _MM_HINT_T1);
}
// The packed bytes of columns [k0, k0 + kb) of every row into L2 while the current chunk is computed:
// the decode reads them next, and with n tokens per weight the compute outlasts the DRAM latency.
inline void prefetch_chunk(const uint8_t* const* rp, const uint8_t* const* rs, int nrows, int k0, int kb) {
    for (int r = 0; r < nrows; ++r) {
        for (int i = 0; i < kb / 2; i += 64) _mm_prefetch((const char*)rp[r] + k0 / 2 + i, _MM_HINT_T1);
        for (int i = 0; i < kb / 32; i += 64) _mm_prefetch((const char*)rs[r] + k0 / 32 + i, _MM_HINT_T1);
    }
}
// During the last chunk of a tile: the next rows' first chunk.
inline void prefetch_after(const Rows& rows, int k0, int kb, int K) {
    if (k0 + kb < K)
        prefetch_chunk(rows.p, rows.s, rows.n, k0 + kb, kb);
    else if (rows.next_n)
        prefetch_chunk(rows.next_p, rows.next_s, rows.next_n, 0, kb);
}

// One row for n (1..GEMV_MAX) inputs: the row kernels are templates over the token count (a build with
// GEMV_MAX <= 4 compiles the wide ones but never calls them).
inline void gemv_row_n(int n, const uint8_t* p, const uint8_t* s, int K, const float* const* xs, float* y) {
    switch (n) {
        case 1: gemv_row<1>(p, s, K, xs, y); return;
        case 2: gemv_row<2>(p, s, K, xs, y); return;
        case 3: gemv_row<3>(p, s, K, xs, y); return;
        case 4: gemv_row<4>(p, s, K, xs, y); return;
    }
    if constexpr (GEMV_MAX > 4) {
        switch (n) {
            case 5: gemv_row_wide<5>(p, s, K, xs, y); return;
            case 6: gemv_row_wide<6>(p, s, K, xs, y); return;
            case 7: gemv_row_wide<7>(p, s, K, xs, y); return;
            default: gemv_row_wide<8>(p, s, K, xs, y); return;
        }
    }
}
#ifdef OST_BF16DOT
// 8 tokens' two accumulators fit the 32 registers beside the decoded codes: one kernel for 1..8.
inline void gemv_row_bf16_n(int n, const uint8_t* p, const uint8_t* s, int K, const uint16_t* const* xs, float* y) {
    switch (n) {
        case 1: gemv_row_bf16<1>(p, s, K, xs, y); return;
        case 2: gemv_row_bf16<2>(p, s, K, xs, y); return;
        case 3: gemv_row_bf16<3>(p, s, K, xs, y); return;
        case 4: gemv_row_bf16<4>(p, s, K, xs, y); return;
    }
    if constexpr (GEMV_MAX > 4) {
        switch (n) {
            case 5: gemv_row_bf16<5>(p, s, K, xs, y); return;
            case 6: gemv_row_bf16<6>(p, s, K, xs, y); return;
            case 7: gemv_row_bf16<7>(p, s, K, xs, y); return;
            default: gemv_row_bf16<8>(p, s, K, xs, y); return;
        }
    }
}
#endif

// xbs: bf16 inputs (vdpbf16ps builds with bf16 activations), else null and xs is used.
void gemv_rows(const Rows& rows, int K, const float* const* xs, const uint16_t* const* xbs, int n, float* y, int ldy) {
    const uint8_t* const* rp = rows.p;
    const uint8_t* const* rs = rows.s;
    float v[8];  // the widest gemv_row
    for (int r = 0; r < PREFETCH_ROWS && r < rows.n; ++r) prefetch_row(rp[r], rs[r], K);
    for (int r = 0; r < rows.n; ++r) {
        const int a = r + PREFETCH_ROWS;  // into the next rows past the end
        if (a < rows.n)
            prefetch_row(rp[a], rs[a], K);
        else if (a - rows.n < rows.next_n)
            prefetch_row(rows.next_p[a - rows.n], rows.next_s[a - rows.n], K);
#ifdef OST_BF16DOT
        if (xbs) {
            gemv_row_bf16_n(n, rp[r], rs[r], K, xbs, v);
            for (int t = 0; t < n; ++t) y[t * ldy + r] = v[t];
            continue;
        }
#endif
        gemv_row_n(n, rp[r], rs[r], K, xs, v);
        for (int t = 0; t < n; ++t) y[t * ldy + r] = v[t];
    }
}

void tiled_rows(const uint8_t* const* rp, const uint8_t* const* rs, int nrows, int K, const float* const* xs, int n,
                Scratch& sc, float* y, int ldy) {
    sc.reserve(n);
    for (int i = 0; i < n * nrows; ++i) sc.acc[i] = vzero();
    for (int k0 = 0; k0 < K; k0 += KC) {
        dequant_tile(rp, rs, nrows, k0, sc.tile);
        for (int t0 = 0; t0 < n; t0 += NR_MAX) {
            const int nr = n - t0 < NR_MAX ? n - t0 : NR_MAX;
            for (int r0 = 0; r0 < nrows; r0 += 4) {
                V* a = sc.acc + t0 * nrows + r0;
                const float* const* x = xs + t0;
                const float* tl = sc.tile + r0 * KC;
                switch (nr) {
                    case 1: micro<1>(tl, x, k0, a, nrows); break;
                    case 2: micro<2>(tl, x, k0, a, nrows); break;
                    case 3: micro<3>(tl, x, k0, a, nrows); break;
                    default: micro<NR_MAX>(tl, x, k0, a, nrows); break;
                }
            }
        }
    }
    for (int t = 0; t < n; ++t)
        for (int r = 0; r < nrows; ++r) y[t * ldy + r] = hsum(sc.acc[t * nrows + r]);
}

#ifdef OST_BF16DOT
// tiled_rows on bf16 inputs: a [nrows, KB] bf16 tile (L2) per K chunk; per token group, its KB inputs
// stay in L1 while every row group streams past them.
void tiled_rows_bf16(const Rows& rows, int K, const uint16_t* const* xbs, int n, Scratch& sc, float* y, int ldy) {
    const int nrows = rows.n;
    sc.reserve(n);
    const int kb = kb_for(K);
    for (int k0 = 0; k0 < K; k0 += kb) {
        dequant_tile_bf16(rows.p, rows.s, nrows, k0, kb, sc.tileb);
        prefetch_after(rows, k0, kb, K);
        for (int t0 = 0; t0 < n; t0 += NR_B) {
            const int nr = n - t0 < NR_B ? n - t0 : NR_B;
            const uint16_t* const* x = xbs + t0;
            float* yt = k0 + kb < K ? nullptr : y + t0 * ldy;
            for (int r0 = 0; r0 < nrows; r0 += MR_B) {
                V* a = sc.acc + t0 * nrows + r0;
                const uint16_t* tb = sc.tileb + (size_t)r0 * kb;
                micro_bf16_n<NR_B>(nr, tb, kb, x, k0, kb, a, nrows, yt ? yt + r0 : nullptr, ldy);
            }
        }
    }
}

// The same rows through the GEMM library: y[n, nrows] = a[n, K] . tile^T, one call per K chunk, the
// library's own threading off (each of our threads calls it on its own tile: ost_set_gemm's note).
void gemm_rows(const Rows& rows, int K, const uint16_t* a, int lda, int n, Scratch& sc, float* y, int ldy) {
    const int kb = kb_for(K);
    for (int k0 = 0; k0 < K; k0 += kb) {
        dequant_tile_bf16(rows.p, rows.s, rows.n, k0, kb, sc.tileb);
        prefetch_after(rows, k0, kb, K);
        g_gemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, n, rows.n, kb, 1.f, a + k0, lda, sc.tileb, kb,
               k0 ? 1.f : 0.f, y, ldy);
    }
}
#endif

enum Path { GEMV, TILED, GEMM };
inline Path path_for(int n, bool bf16) {
    if (n <= GEMV_MAX) return GEMV;
#ifdef OST_BF16DOT
    if (bf16 && g_gemm && GEMM_MIN > 0 && n >= GEMM_MIN) return GEMM;
#endif
    (void)bf16;
    return TILED;
}

// One work item's rows for the n inputs of one expert: y[t * ldy + r], r in [0, nrows).
// a: the n inputs as consecutive bf16 rows of length K (the GEMM path's operand), or null.
void rows_for(const Rows& rows, int K, const float* const* xs, const uint16_t* const* xbs, const uint16_t* a, int n,
              Scratch& sc, float* y, int ldy) {
    switch (path_for(n, xbs != nullptr)) {
        case GEMV: gemv_rows(rows, K, xs, xbs, n, y, ldy); return;
#ifdef OST_BF16DOT
        case GEMM: gemm_rows(rows, K, a, K, n, sc, y, ldy); return;
        case TILED:
            if (xbs) { tiled_rows_bf16(rows, K, xbs, n, sc, y, ldy); return; }
            break;
#else
        default: break;
#endif
    }
    (void)a;
    tiled_rows(rows.p, rows.s, rows.n, K, xs, n, sc, y, ldy);
}

}  // namespace
