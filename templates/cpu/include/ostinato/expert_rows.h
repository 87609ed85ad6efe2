// One work item's weight rows against the routes of one expert, by one of three paths chosen by the
// expert's route count n:
//  - n <= GEMV_MAX (up to 8): decode straight into registers and FMA (weights read once; the inputs in
//    chunks that stay in L1 while a group of rows passes: gemv_rows);
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

// Rows ahead whose weights gemv_rows prefetches where a row is one chunk (into L2: measured faster than into
// L1, whose miss buffers the burst of one row's prefetches would fill).
constexpr int PREFETCH_ROWS = 2;
// The prefetch helpers are always inlined: a prefetch has no visible effect, so GCC deems a helper left out of
// line side-effect free and deletes its calls (measured: every prefetch of a build gone).
#define OST_PREFETCH_HELPER inline __attribute__((always_inline))
// The packed bytes of columns [k0, k0 + kb) of every row into L2 while the current chunk is computed:
// the decode reads them next, and with n tokens per weight the compute outlasts the DRAM latency.
OST_PREFETCH_HELPER void prefetch_chunk(const uint8_t* const* rp, const uint8_t* const* rs, int nrows, int k0, int kb) {
    for (int r = 0; r < nrows; ++r) {
        for (int i = 0; i < kb / 2; i += 64) _mm_prefetch((const char*)rp[r] + k0 / 2 + i, _MM_HINT_T1);
        for (int i = 0; i < kb / 32; i += 64) _mm_prefetch((const char*)rs[r] + k0 / 32 + i, _MM_HINT_T1);
    }
}
// During the last chunk of a tile: the next rows' first chunk.
OST_PREFETCH_HELPER void prefetch_after(const Rows& rows, int k0, int kb, int K) {
    if (k0 + kb < K)
        prefetch_chunk(rows.p, rows.s, rows.n, k0 + kb, kb);
    else if (rows.next_n)
        prefetch_chunk(rows.next_p, rows.next_s, rows.next_n, 0, kb);
}

// The GEMV cuts its rows into groups of GEMV_GROUP and each row into chunks of blocks whose inputs, for all n
// tokens, take about GEMV_X_BYTES: a group's rows pass over one chunk of inputs while L1 holds it, then the
// next chunk. (A whole row at a time re-read every token's full input per row: from 2 tokens on more than L1
// holds, and the L2 traffic of 8 float32 input bytes per packed byte per token, not the decode, bounded the
// rate: 1.5x at 4 tokens on Zen 4.)
// The accumulators of a group's rows stay in memory between chunks; each row's blocks still run in order,
// so neither size changes a result.
constexpr int GEMV_GROUP = 16;
constexpr int GEMV_X_BYTES = 16384;
// Blocks per chunk for n tokens of esize-byte inputs: a multiple of 4, >= 4 (the bf16 kernel takes blocks in
// pairs, alternately into two accumulators).
constexpr int gemv_chunk_blocks(int n, int esize) {
    return GEMV_X_BYTES / (BLK * esize * n) / 4 * 4 < 4 ? 4 : GEMV_X_BYTES / (BLK * esize * n) / 4 * 4;
}

// Blocks [b0, b1) of a row into L2.
OST_PREFETCH_HELPER void prefetch_piece(const uint8_t* p, const uint8_t* s, int b0, int b1) {
    for (int i = 32 * b0; i < 32 * b1; i += 64) _mm_prefetch((const char*)p + i, _MM_HINT_T1);
    for (int i = 2 * b0; i < 2 * b1; i += 64) _mm_prefetch((const char*)s + i, _MM_HINT_T1);
}

// Blocks [b0, b1) of row a of rows (past the end: of the next rows), by gemv_rows' rule (below).
OST_PREFETCH_HELPER void prefetch_ahead(const Rows& rows, int a, int K, bool every_row, int b0, int b1) {
    const uint8_t* const* pp = rows.p;
    const uint8_t* const* ps = rows.s;
    const uint8_t* prev[2] = {nullptr, nullptr};  // rows a - 1 and a - 2 where they exist
    if (a >= rows.n) {
        a -= rows.n;
        if (a >= rows.next_n) return;
        pp = rows.next_p, ps = rows.next_s;
        for (int i = 1; i <= 2; ++i)
            prev[i - 1] = a >= i ? pp[a - i] : rows.n + a >= i ? rows.p[rows.n + a - i] : nullptr;
    } else {
        for (int i = 1; i <= 2; ++i) prev[i - 1] = a >= i ? pp[a - i] : nullptr;
    }
    // inside a run of rows contiguous in memory, from its third row on: the hardware prefetcher streams it
    if (!every_row && prev[0] && prev[1] && pp[a] == prev[0] + K / 2 && prev[0] == prev[1] + K / 2) return;
    prefetch_piece(pp[a], ps[a], b0, b1);
}

// gemv_rows for NT tokens; BF16: xs are bf16 (vdpbf16ps builds), else float32.
template <int NT, bool BF16>
void gemv_rows_n(const Rows& rows, int K, const void* const* xs, float* y, int ldy) {
    const int nb = K / BLK;
    constexpr int cb_max = gemv_chunk_blocks(NT, BF16 ? 2 : 4);
    const int cb = cb_max < nb ? cb_max : nb;
    // A piece (row, chunk) is prefetched as far ahead as the rows' order allows: the same chunk of the row
    // GEMV_GROUP rows on where rows are cut into chunks (a group's rows are read strided: the hardware
    // prefetcher does not follow them), else the row PREFETCH_ROWS rows on. With 1 token only the first two
    // rows of each run of rows contiguous in memory: the hardware prefetcher streams the rest of a run, and
    // software prefetches inside it measured 15-20% slower there on Zen 4 (they take the load slots and miss
    // buffers of the stream it already fetches); from 2 tokens on every row measured faster.
    const bool chunked = cb < nb;
    const bool every_row = chunked || NT > 1;
    const int ahead = chunked ? GEMV_GROUP : PREFETCH_ROWS;
    alignas(64) V acc[GEMV_GROUP][NT * GEMV_ACC];
    for (int r = 0; r < ahead && r < rows.n; ++r) prefetch_ahead(rows, r, K, every_row, 0, cb);
    for (int g0 = 0; g0 < rows.n; g0 += GEMV_GROUP) {
        const int gn = rows.n - g0 < GEMV_GROUP ? rows.n - g0 : GEMV_GROUP;
        for (int r = 0; r < gn; ++r)
            for (int i = 0; i < NT * GEMV_ACC; ++i) acc[r][i] = vzero();
        for (int b0 = 0; b0 < nb; b0 += cb) {
            const int b1 = b0 + cb < nb ? b0 + cb : nb;
            for (int r = 0; r < gn; ++r) {
                prefetch_ahead(rows, g0 + r + ahead, K, every_row, b0, b1);  // into the next rows past the end
#ifdef OST_BF16DOT
                if constexpr (BF16) {
                    gemv_chunk_bf16<NT>(rows.p[g0 + r], rows.s[g0 + r], b0, b1, (const uint16_t* const*)xs, acc[r]);
                    continue;
                }
#endif
                gemv_chunk<NT>(rows.p[g0 + r], rows.s[g0 + r], b0, b1, (const float* const*)xs, acc[r]);
            }
        }
        for (int r = 0; r < gn; ++r)
            for (int t = 0; t < NT; ++t) y[t * ldy + g0 + r] = gemv_sum(acc[r] + t * GEMV_ACC);
    }
}

// One work item's rows for n (1..GEMV_MAX) inputs: y[t * ldy + r]. xbs: bf16 inputs (vdpbf16ps builds with bf16
// activations), else null and xs is used. Templates over the token count (a build with GEMV_MAX <= 4
// compiles the wide ones but never calls them).
template <bool BF16>
void gemv_rows_t(const Rows& rows, int K, const void* const* xs, int n, float* y, int ldy) {
    switch (n) {
        case 1: gemv_rows_n<1, BF16>(rows, K, xs, y, ldy); return;
        case 2: gemv_rows_n<2, BF16>(rows, K, xs, y, ldy); return;
        case 3: gemv_rows_n<3, BF16>(rows, K, xs, y, ldy); return;
        case 4: gemv_rows_n<4, BF16>(rows, K, xs, y, ldy); return;
    }
    if constexpr (GEMV_MAX > 4) {
        switch (n) {
            case 5: gemv_rows_n<5, BF16>(rows, K, xs, y, ldy); return;
            case 6: gemv_rows_n<6, BF16>(rows, K, xs, y, ldy); return;
            case 7: gemv_rows_n<7, BF16>(rows, K, xs, y, ldy); return;
            default: gemv_rows_n<8, BF16>(rows, K, xs, y, ldy); return;
        }
    }
}
void gemv_rows(const Rows& rows, int K, const float* const* xs, const uint16_t* const* xbs, int n, float* y, int ldy) {
#ifdef OST_BF16DOT
    if (xbs) return gemv_rows_t<true>(rows, K, (const void* const*)xbs, n, y, ldy);
#endif
    (void)xbs;
    gemv_rows_t<false>(rows, K, (const void* const*)xs, n, y, ldy);
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
