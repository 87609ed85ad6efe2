// The exported C symbols of the CPU expert kernel (called through ctypes: runtime/kernels/cpu_experts.py).
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it last, after its
// constants and ISA macros.
#pragma once

#include <stdint.h>
#include <stdio.h>

#include "ostinato/cold_task.h"
#include "ostinato/entry.h"
#include "ostinato/gemm_library.h"

extern "C" {
// The host function of a decode step's cold routes (see ColdTask); the result is in task->status.
void ost_cold_task_run(void* task) {
    ColdTask* tk = (ColdTask*)task;
    tk->status = run_cold_task(*tk);
}
// out[T, D] (float32) += sum over routes of weight * expert(x[token]); the layout: Call (schedule.h).
int ost_moe_experts_f32(const float* x, int64_t T, int64_t E, const int64_t* route_offsets, const int64_t* route_token,
                        const float* route_weight, const void* const* expert_ptrs, float* out, int n_threads) {
    return entry(x, nullptr, T, E, route_offsets, route_token, route_weight, expert_ptrs, out, n_threads);
}
int ost_moe_experts_bf16(const uint16_t* x, int64_t T, int64_t E, const int64_t* route_offsets,
                         const int64_t* route_token, const float* route_weight, const void* const* expert_ptrs,
                         float* out, int n_threads) {
    return entry(nullptr, x, T, E, route_offsets, route_token, route_weight, expert_ptrs, out, n_threads);
}
// The GEMM library for the bf16 path past GEMM_MIN tokens: MKL's cblas_gemm_bf16bf16f32 and
// MKL_Set_Num_Threads_Local (C API: by value), or nulls (own tiled path). Call before any kernel call;
// builds without AVX512_BF16 ignore it. Returns 1 when the build uses it.
int ost_set_gemm(void* gemm_bf16, void* set_threads_local) {
#ifdef OST_BF16DOT
    g_gemm = (GemmBf16Fn)gemm_bf16;
    g_set_threads_local = (SetThreadsLocalFn)set_threads_local;
    return 1;
#else
    (void)gemm_bf16;
    (void)set_threads_local;
    return 0;
#endif
}
const char* ost_moe_experts_info(void) {
    static char buf[200];
    snprintf(buf, sizeof buf, "D=%d I=%d isa=%s max_experts=%d gemv_max=%d gemm_min=%d row_tile=%d k_chunk=%d bf16_k_chunk=%d",
             D, I, OST_ISA, MAX_EXPERTS, GEMV_MAX, GEMM_MIN, RT, KC, KB);
    return buf;
}
}  // extern "C"
