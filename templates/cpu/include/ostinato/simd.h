// The vector layer: the ISA's vector type V (VW float32 lanes), its MXFP4 block decode and GEMV partial dots
// (simd_avx2.h or simd_avx512.h, chosen by the kernel's ISA macro), and ISA-neutral wrappers over it.
//
// Part of the CPU expert kernel: templates/cpu/moe_experts.cpp.j2 includes it after its constants
// (BLK; exactly one of the ISA macros OST_AVX2, OST_AVX512).
#pragma once

#if defined(OST_AVX2) == defined(OST_AVX512)
#error "define exactly one of OST_AVX2, OST_AVX512 before including ostinato/simd.h (the kernel template does)"
#endif

#include <immintrin.h>

#ifdef OST_AVX2
#include "ostinato/simd_avx2.h"
#else
#include "ostinato/simd_avx512.h"
#endif

namespace {

inline V vload(const float* p) {
#ifdef OST_AVX2
    return _mm256_load_ps(p);
#else
    return _mm512_load_ps(p);
#endif
}
inline void vstore(float* p, V v) {
#ifdef OST_AVX2
    _mm256_store_ps(p, v);
#else
    _mm512_store_ps(p, v);
#endif
}
inline V vfma(V a, V b, V c) {
#ifdef OST_AVX2
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm512_fmadd_ps(a, b, c);
#endif
}
inline V vzero() {
#ifdef OST_AVX2
    return _mm256_setzero_ps();
#else
    return _mm512_setzero_ps();
#endif
}
inline V vmul(V a, V b) {
#ifdef OST_AVX2
    return _mm256_mul_ps(a, b);
#else
    return _mm512_mul_ps(a, b);
#endif
}
inline V vadd(V a, V b) {
#ifdef OST_AVX2
    return _mm256_add_ps(a, b);
#else
    return _mm512_add_ps(a, b);
#endif
}
inline V vloadu(const float* p) {
#ifdef OST_AVX2
    return _mm256_loadu_ps(p);
#else
    return _mm512_loadu_ps(p);
#endif
}
inline V vload_bcast(float f) {
#ifdef OST_AVX2
    return _mm256_set1_ps(f);
#else
    return _mm512_set1_ps(f);
#endif
}

}  // namespace
