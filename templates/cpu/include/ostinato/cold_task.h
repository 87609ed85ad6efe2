// The cold routes of one fixed-shape decode step as one host function: one call, one pointer.
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (D).
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ostinato/entry.h"

namespace {

// A CUDA graph runs this as a host node (cuLaunchHostFunc takes exactly `void fn(void*)`) after copying
// the step's activations and routes into the task's pinned buffers; without CUDA the runtime calls it
// directly, so the same code runs in both. Routes whose expert is not in this layer's cold table
// (cold_of < 0) belong to the GPU and are skipped. A host node cannot return an error: it is left in
// `status` for the runtime to check after the step.
struct ColdTask {
    const void* x;              // [T, D] float32, or bf16 bits when x_bf16
    int64_t x_bf16;
    int64_t T, k;               // T tokens x k routes each
    const int64_t* expert_ids;  // [T, k] model expert ids
    const float* weights;       // [T, k]
    const int64_t* cold_of;     // [n_model_experts] index into the cold table, or -1
    int64_t n_model_experts;
    int64_t n_cold;             // experts in the table
    const void* const* ptrs;    // [n_cold, 6]
    float* out;                 // [T, D] float32, overwritten: the cold routes' sum (zero if none)
    int64_t n_threads;
    int64_t status;             // 0, or the negative code of the first invalid argument
};

int run_cold_task(const ColdTask& tk) {
    const int64_t R = tk.T * tk.k;
    for (int64_t r = 0; r < R; ++r)
        if (tk.expert_ids[r] < 0 || tk.expert_ids[r] >= tk.n_model_experts) return -7;
    memset(tk.out, 0, sizeof(float) * tk.T * D);
    // group the cold routes by table index; tokens ascend inside each group (the kernel's contract)
    int64_t* off = (int64_t*)calloc(tk.n_cold + 1, sizeof(int64_t));
    int64_t* tok = (int64_t*)malloc(sizeof(int64_t) * (R + 1));
    float* wgt = (float*)malloc(sizeof(float) * (R + 1));
    for (int64_t r = 0; r < R; ++r) {
        const int64_t c = tk.cold_of[tk.expert_ids[r]];
        if (c >= tk.n_cold) { free(off); free(tok); free(wgt); return -8; }
        if (c >= 0) ++off[c + 1];
    }
    for (int64_t c = 0; c < tk.n_cold; ++c) off[c + 1] += off[c];
    int64_t* fill = (int64_t*)malloc(sizeof(int64_t) * (tk.n_cold + 1));
    memcpy(fill, off, sizeof(int64_t) * (tk.n_cold + 1));
    for (int64_t r = 0; r < R; ++r) {
        const int64_t c = tk.cold_of[tk.expert_ids[r]];
        if (c < 0) continue;
        tok[fill[c]] = r / tk.k;
        wgt[fill[c]++] = tk.weights[r];
    }
    int rc = 0;
    if (off[tk.n_cold] > 0)
        rc = entry(tk.x_bf16 ? nullptr : (const float*)tk.x, tk.x_bf16 ? (const uint16_t*)tk.x : nullptr, tk.T,
                   tk.n_cold, off, tok, wgt, tk.ptrs, tk.out, (int)tk.n_threads);
    free(off); free(tok); free(wgt); free(fill);
    return rc;
}

}  // namespace
