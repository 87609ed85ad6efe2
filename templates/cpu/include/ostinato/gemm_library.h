// The GEMM library hook of the bf16 path: MKL's C API, resolved by the runtime from the loaded torch
// (no link-time dependency); null where it is missing. Set before the first call (ost_set_gemm).
// AVX512_BF16 builds only (OST_BF16DOT).
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (OST_BF16DOT).
#pragma once

#ifdef OST_BF16DOT
#include <stdint.h>

namespace {

typedef void (*GemmBf16Fn)(int layout, int transa, int transb, int m, int n, int k, float alpha, const uint16_t* a,
                           int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc);
typedef int (*SetThreadsLocalFn)(int);
GemmBf16Fn g_gemm = nullptr;
SetThreadsLocalFn g_set_threads_local = nullptr;
constexpr int CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112;

}  // namespace
#endif  // OST_BF16DOT
