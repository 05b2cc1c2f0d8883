// Eight elements as float, for the native passes that read half-precision tensors
// (Numerics.cpp, PagedAttention.cpp): fp16 widened with F16C, bf16 by a shift, float as it is.
// Exact (every half-precision value is a float). Only for code compiled for AVX2 and F16C
// (`target("avx2,f16c")`), chosen at run time by `has_avx2_f16c()`.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define TORCH_RBLN_X86_VEC 1

namespace torch_rbln {

template <typename T>
__attribute__((target("avx2,f16c"))) inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
}

inline bool has_avx2_f16c() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
}

}  // namespace torch_rbln
#endif
