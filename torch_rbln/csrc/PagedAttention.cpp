// The attention of a paged decode step (runtime/executors.py's paged_causal_attn_decode, the
// NPU's paged decode kernel): each sequence's one new query attends to its cached keys, read
// in place through its block table (no gather of its pages). The numerics are the host's
// fused attention kernel's on reduced-precision operands: the scores in fp32, the softmax in
// fp32, its unnormalized weights rounded to the operands' dtype for the sum over the values
// (accumulated in fp32), divided by the fp32 sum, one rounding of the output.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "Vec.h"

namespace torch_rbln {
namespace {

// a weight as the operands' dtype holds it (the kernel multiplies the values by that)
template <typename T>
float rounded(float x) {
  return static_cast<float>(static_cast<T>(x));
}

struct Shape {
  int64_t B, H, Hkv, D, bs, pages;
  float scale;
};

// The rows of tokens 0 .. P-1 of sequence `b` (each its KV heads' keys and values, side by
// side), page by page: no division per token.
template <typename T>
void rows_of(const T* cache, const int64_t* table, const Shape& s, int64_t b, int64_t P,
             std::vector<const T*>& rows) {
  rows.resize(static_cast<size_t>(P));
  const int64_t token = s.Hkv * 2 * s.D;  // elements per token row of a page
  for (int64_t i = 0, p = 0; p < P; ++i) {
    const T* base = cache + table[b * s.pages + i] * s.bs * token;
    for (int64_t slot = 0; slot < s.bs && p < P; ++slot, ++p) {
      rows[p] = base + slot * token;
    }
  }
}

// q . k over D elements, in fp32.
template <typename T>
float dot_scalar(const float* q, const T* k, int64_t D) {
  float acc = 0.0f;
  for (int64_t d = 0; d < D; ++d) {
    acc += q[d] * static_cast<float>(k[d]);
  }
  return acc;
}

template <typename T>
void axpy_scalar(float w, const T* v, float* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) {
    acc[d] += w * static_cast<float>(v[d]);
  }
}

#ifdef TORCH_RBLN_X86_VEC
template <typename T>
__attribute__((target("avx2,fma,f16c"))) float dot_avx2(const float* q, const T* k, int64_t D) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load8(k + d + 8), a1);
  }
  for (; d + 8 <= D; d += 8) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + d), a0);
  }
  const __m256 a = _mm256_add_ps(a0, a1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

template <typename T>
__attribute__((target("avx2,fma,f16c"))) void axpy_avx2(float w, const T* v, float* acc,
                                                         int64_t D) {
  const __m256 ww = _mm256_set1_ps(w);
  for (int64_t d = 0; d + 8 <= D; d += 8) {
    _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(ww, load8(v + d), _mm256_loadu_ps(acc + d)));
  }
}

// The scores of one query head against tokens rows[0..P) (keys at `off` in each row), four
// tokens at a time: four independent FMA chains instead of one (each FMA waits for the last).
template <typename T>
__attribute__((target("avx2,fma,f16c"))) void scores_avx2(const float* q, const T* const* rows,
                                                           int64_t off, int64_t P, int64_t D,
                                                           float scale, float* out) {
  int64_t p = 0;
  for (; p + 4 <= P; p += 4) {
    const T *k0 = rows[p] + off, *k1 = rows[p + 1] + off, *k2 = rows[p + 2] + off,
            *k3 = rows[p + 3] + off;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qd, load8(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qd, load8(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qd, load8(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qd, load8(k3 + d), a3);
    }
    // the four sums at once: pairwise adds of the lanes
    const __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
    const __m256 s = _mm256_hadd_ps(s01, s23);  // per 128-bit half: a0 a1 a2 a3 partials
    const __m128 r = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    _mm_storeu_ps(out + p, _mm_mul_ps(r, _mm_set1_ps(scale)));
  }
  for (; p < P; ++p) {
    out[p] = dot_avx2(q, rows[p] + off, D) * scale;
  }
}

// acc[0..64) += sum over tokens of w[p] * values (at `off` in each row): the 64 sums stay in
// registers across the tokens.
template <typename T>
__attribute__((target("avx2,fma,f16c"))) void values64_avx2(const float* w, const T* const* rows,
                                                            int64_t off, int64_t P, float* acc) {
  __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8),
         a2 = _mm256_loadu_ps(acc + 16), a3 = _mm256_loadu_ps(acc + 24),
         a4 = _mm256_loadu_ps(acc + 32), a5 = _mm256_loadu_ps(acc + 40),
         a6 = _mm256_loadu_ps(acc + 48), a7 = _mm256_loadu_ps(acc + 56);
  for (int64_t p = 0; p < P; ++p) {
    const T* v = rows[p] + off;
    const __m256 ww = _mm256_set1_ps(w[p]);
    a0 = _mm256_fmadd_ps(ww, load8(v), a0);
    a1 = _mm256_fmadd_ps(ww, load8(v + 8), a1);
    a2 = _mm256_fmadd_ps(ww, load8(v + 16), a2);
    a3 = _mm256_fmadd_ps(ww, load8(v + 24), a3);
    a4 = _mm256_fmadd_ps(ww, load8(v + 32), a4);
    a5 = _mm256_fmadd_ps(ww, load8(v + 40), a5);
    a6 = _mm256_fmadd_ps(ww, load8(v + 48), a6);
    a7 = _mm256_fmadd_ps(ww, load8(v + 56), a7);
  }
  _mm256_storeu_ps(acc, a0);
  _mm256_storeu_ps(acc + 8, a1);
  _mm256_storeu_ps(acc + 16, a2);
  _mm256_storeu_ps(acc + 24, a3);
  _mm256_storeu_ps(acc + 32, a4);
  _mm256_storeu_ps(acc + 40, a5);
  _mm256_storeu_ps(acc + 48, a6);
  _mm256_storeu_ps(acc + 56, a7);
}

// e^x for x <= 0, eight at a time (Cephes' expf: the exponent by rounding, a degree-6
// polynomial for the rest; within 2 ulp of expf, as the fused kernel's own vector exp is):
// below -87.3 it is 0.
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// Eight floats as the dtype T holds them (round to nearest even), as floats.
template <typename T>
__attribute__((target("avx2,f16c"))) inline __m256 round8(__m256 x) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i up = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(int(0xffff0000))));
  } else {
    return x;
  }
}

// The softmax of P scores in place, unnormalized: each becomes e^(score - max) as T holds it;
// returns the sum of the e^ before rounding.
template <typename T>
__attribute__((target("avx2,fma,f16c"))) float softmax_avx2(float* x, int64_t P) {
  const int64_t full = P / 8 * 8;
  float m = -INFINITY;
  if (full) {
    __m256 mv = _mm256_loadu_ps(x);
    for (int64_t p = 8; p < full; p += 8) {
      mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + p));
    }
    alignas(32) float l[8];
    _mm256_store_ps(l, mv);
    m = *std::max_element(l, l + 8);
  }
  for (int64_t p = full; p < P; ++p) {
    m = std::max(m, x[p]);
  }
  const __m256 mm = _mm256_set1_ps(m);
  __m256 sv = _mm256_setzero_ps();
  for (int64_t p = 0; p < full; p += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + p), mm));
    sv = _mm256_add_ps(sv, e);
    _mm256_storeu_ps(x + p, round8<T>(e));
  }
  alignas(32) float l[8];
  _mm256_store_ps(l, sv);
  float sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  for (int64_t p = full; p < P; ++p) {
    const float e = std::exp(x[p] - m);
    sum += e;
    x[p] = rounded<T>(e);
  }
  return sum;
}
#endif

// Buffers reused across the sequences of a call.
struct Scratch {
  std::vector<float> q, scores, acc, sums;
};

// One sequence: its H query heads `q` ([H, D]) over its P cached tokens (query head h reads KV
// head h / G). With AVX2 and D a multiple of 64, head by head, a head's tokens at once
// (independent sums in registers); otherwise token by token, every head of a token's row.
template <typename T, bool kVec>
void attend(const T* q, const std::vector<const T*>& rows, const Shape& s, int64_t P,
            Scratch& w, T* out) {
  const int64_t D = s.D, H = s.H, G = s.H / s.Hkv;
  w.q.resize(static_cast<size_t>(H * D));
  for (int64_t i = 0; i < H * D; ++i) {
    w.q[i] = static_cast<float>(q[i]);
  }
  w.scores.resize(static_cast<size_t>(H * P));
  float* scores = w.scores.data();
#ifdef TORCH_RBLN_X86_VEC
  const bool blocked = kVec && D % 64 == 0;
  if (blocked) {
    for (int64_t h = 0; h < H; ++h) {
      scores_avx2(w.q.data() + h * D, rows.data(), h / G * 2 * D, P, D, s.scale, scores + h * P);
    }
  }
#else
  const bool blocked = false;
#endif
  for (int64_t p = 0; p < P && !blocked; ++p) {
    for (int64_t g = 0, h = 0; g < s.Hkv; ++g) {
      const T* k = rows[p] + g * 2 * D;
      for (int64_t j = 0; j < G; ++j, ++h) {
#ifdef TORCH_RBLN_X86_VEC
        const float x = kVec ? dot_avx2(w.q.data() + h * D, k, D)
                             : dot_scalar(w.q.data() + h * D, k, D);
#else
        const float x = dot_scalar(w.q.data() + h * D, k, D);
#endif
        scores[h * P + p] = x * s.scale;
      }
    }
  }
  w.acc.assign(static_cast<size_t>(H * D), 0.0f);
  w.sums.resize(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) {
    float* sh = scores + h * P;
#ifdef TORCH_RBLN_X86_VEC
    if (blocked) {
      w.sums[h] = softmax_avx2<T>(sh, P);
      continue;
    }
#endif
    const float m = *std::max_element(sh, sh + P);
    float sum = 0.0f;
    for (int64_t p = 0; p < P; ++p) {
      const float e = std::exp(sh[p] - m);
      sum += e;
      sh[p] = rounded<T>(e);
    }
    w.sums[h] = sum;
  }
  float* acc = w.acc.data();
#ifdef TORCH_RBLN_X86_VEC
  if (blocked) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < D; d += 64) {
        values64_avx2(scores + h * P, rows.data(), h / G * 2 * D + D + d, P, acc + h * D + d);
      }
    }
  }
#endif
  for (int64_t p = 0; p < P && !blocked; ++p) {
    for (int64_t g = 0, h = 0; g < s.Hkv; ++g) {
      const T* v = rows[p] + g * 2 * D + D;
      for (int64_t j = 0; j < G; ++j, ++h) {
#ifdef TORCH_RBLN_X86_VEC
        if (kVec) {
          axpy_avx2(scores[h * P + p], v, acc + h * D, D);
          continue;
        }
#endif
        axpy_scalar(scores[h * P + p], v, acc + h * D, D);
      }
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    const float inv = 1.0f / w.sums[h];
    for (int64_t d = 0; d < D; ++d) {
      out[h * D + d] = static_cast<T>(acc[h * D + d] * inv);
    }
  }
}

template <typename T>
void decode(const T* q, const T* cache, const int64_t* seq, const int64_t* table, const Shape& s,
            T* out) {
#ifdef TORCH_RBLN_X86_VEC
  const bool vec = has_avx2_f16c() && __builtin_cpu_supports("fma") && s.D % 8 == 0;
#else
  const bool vec = false;
#endif
  Scratch w;
  std::vector<const T*> rows;
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t P = seq[b] + 1;
    rows_of(cache, table, s, b, P, rows);
    const T* qb = q + b * s.H * s.D;
    T* ob = out + b * s.H * s.D;
    if constexpr (!std::is_same_v<T, double>) {  // (load8 reads half precision and float)
      if (vec) {
        attend<T, true>(qb, rows, s, P, w, ob);
        continue;
      }
    }
    attend<T, false>(qb, rows, s, P, w, ob);
  }
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& kv_cache,
                                  const at::Tensor& seq, const at::Tensor& block_table,
                                  double scale) {
  TORCH_CHECK(q.dim() == 3 && kv_cache.dim() == 4 && kv_cache.is_contiguous() && q.is_cpu() &&
                  kv_cache.is_cpu() && q.scalar_type() == kv_cache.scalar_type(),
              "paged_decode_attention: q [B, H, D] and a contiguous kv_cache [blocks, "
              "block_size, Hkv, 2 * D] of one dtype, on the host");
  const at::Tensor qc = q.contiguous();
  const at::Tensor sq = seq.to(at::kLong).contiguous();
  const at::Tensor tb = block_table.to(at::kLong).contiguous();
  Shape s{q.size(0), q.size(1), kv_cache.size(2), q.size(2), kv_cache.size(1), tb.size(1),
          static_cast<float>(scale)};
  TORCH_CHECK(kv_cache.size(3) == 2 * s.D && s.Hkv > 0 && s.H % s.Hkv == 0 &&
                  sq.numel() == s.B && tb.dim() == 2 && tb.size(0) == s.B,
              "paged_decode_attention: shapes do not agree");
  // every page a sequence reads is in its table and in the cache
  const int64_t blocks = kv_cache.size(0);
  const int64_t* sp = sq.const_data_ptr<int64_t>();
  const int64_t* tp = tb.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < s.B; ++b) {
    TORCH_CHECK(sp[b] >= 0 && sp[b] / s.bs < s.pages, "paged_decode_attention: position ",
                sp[b], " of sequence ", b, " is past its ", s.pages, " pages");
    for (int64_t i = 0; i <= sp[b] / s.bs; ++i) {
      TORCH_CHECK(tp[b * s.pages + i] >= 0 && tp[b * s.pages + i] < blocks,
                  "paged_decode_attention: page ", tp[b * s.pages + i], " of sequence ", b,
                  " is not one of the cache's ", blocks, " blocks");
    }
  }
  at::Tensor out = at::empty_like(qc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "paged_decode", [&] {
    pybind11::gil_scoped_release nogil;
    decode<scalar_t>(qc.const_data_ptr<scalar_t>(), kv_cache.const_data_ptr<scalar_t>(), sp, tp,
                     s, out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace

void bind_paged_attention(pybind11::module_& m) {
  m.def("paged_decode_attention", &paged_decode_attention,
        "The attention of a paged decode step: q [B, H, D] against each sequence's cached "
        "tokens 0 .. seq[b] of kv_cache [blocks, block_size, Hkv, 2 * D] (keys then values), "
        "read through block_table [B, pages]; returns [B, H, D]");
}

}  // namespace torch_rbln
