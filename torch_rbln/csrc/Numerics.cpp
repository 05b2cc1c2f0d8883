// The error statistics of a compare region (compare/stats.py's `errors`) in one pass over a
// result and its golden reference: every op of a region pays them, and NumPy's form reads both
// sides about a dozen times. What the statistics mean, and the rare inputs they take another
// route for (a NaN or Inf on either side), stay in stats.py; this file only counts.
//
// A record's summary of one result (stats.py's `reduce`: its finite min and max, its NaN/Inf
// count and the elements at fixed positions) is one pass here too.
//
// Each element is computed in the reference's dtype with the same operations in the same order
// as stats.py's NumPy form, so the maxima and the count are the same numbers; the dot products
// (the cosine) are summed in double.
#include <torch/extension.h>

#include "Vec.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace torch_rbln {
namespace {

constexpr int kLanes = 16;  // the generic form's independent accumulators (no sum reordered)

template <typename T>
struct Errors {
  T max_abs = 0, ref_max = 0, ratio_max = 0, max_rel = 0;
  int64_t outside = 0;
  double dot = 0, aa = 0, rr = 0;
  bool finite = true;
};

// Per-lane accumulators: kLanes independent maxima, counts and sums.
template <typename T>
struct Lanes {
  T max_abs[kLanes] = {}, ref_max[kLanes] = {}, ratio_max[kLanes] = {}, max_rel[kLanes] = {};
  T check[kLanes] = {};  // d * 0 + |r| * 0: NaN exactly where a value of either side is not finite
  double dot[kLanes] = {}, aa[kLanes] = {}, rr[kLanes] = {};
  int64_t outside[kLanes] = {};
};

// One element pair into lane `j`.
template <typename T>
inline void step(Lanes<T>& l, int j, T x, T y, T atol, T rtol, T shift, bool ratio) {
  const T d = std::abs(x - y);
  const T ar = std::abs(y);
  l.check[j] += d * T(0) + ar * T(0);
  l.max_abs[j] = d > l.max_abs[j] ? d : l.max_abs[j];
  l.ref_max[j] = ar > l.ref_max[j] ? ar : l.ref_max[j];
  if (ratio) {
    const T q = d / (ar + shift);
    l.ratio_max[j] = q > l.ratio_max[j] ? q : l.ratio_max[j];
  }
  const T rel = d / (ar > atol ? ar : atol);
  l.max_rel[j] = rel > l.max_rel[j] ? rel : l.max_rel[j];
  l.outside[j] += d > ar * rtol + atol;
  l.dot[j] += double(x) * double(y);
  l.aa[j] += double(x) * double(x);
  l.rr[j] += double(y) * double(y);
}

// `n` paired elements of `a` (the result) and `r` (the reference) into `e`. `shift` is
// atol / rtol: the ratio to the tolerance's bound is |a - r| / (shift + |r|) (over rtol).
template <typename T>
void accumulate(const T* a, const T* r, int64_t n, T atol, T rtol, T shift, Errors<T>& e) {
  Lanes<T> l;
  const bool ratio = rtol > 0;
  const int64_t full = n / kLanes * kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      step(l, j, a[i + j], r[i + j], atol, rtol, shift, ratio);
    }
  }
  for (int64_t i = full; i < n; ++i) {
    step(l, static_cast<int>(i - full), a[i], r[i], atol, rtol, shift, ratio);
  }
  for (int j = 0; j < kLanes; ++j) {
    e.finite = e.finite && !std::isnan(l.check[j]);
    e.max_abs = std::max(e.max_abs, l.max_abs[j]);
    e.ref_max = std::max(e.ref_max, l.ref_max[j]);
    e.ratio_max = std::max(e.ratio_max, l.ratio_max[j]);
    e.max_rel = std::max(e.max_rel, l.max_rel[j]);
    e.outside += l.outside[j];
    e.dot += l.dot[j];
    e.aa += l.aa[j];
    e.rr += l.rr[j];
  }
}

#if defined(__GNUC__) && defined(__x86_64__)
// The float pass eight elements at a time on CPUs with AVX2 (chosen at run time: the build
// targets every x86-64), the last ones by `accumulate`. No FMA: each bound rounds as NumPy's
// does. maxps(x, m) keeps m where x is NaN (0 / 0 where atol is 0), as the scalar form does.
__attribute__((target("avx2"))) void accumulate_avx2(const float* a, const float* r, int64_t n,
                                                     float atol, float rtol, float shift,
                                                     Errors<float>& e) {
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 zero = _mm256_setzero_ps(), vatol = _mm256_set1_ps(atol),
               vrtol = _mm256_set1_ps(rtol), vshift = _mm256_set1_ps(shift);
  const bool ratio = rtol > 0;
  __m256 max_abs = zero, ref_max = zero, ratio_max = zero, max_rel = zero, check = zero;
  __m256d dot = _mm256_setzero_pd(), aa = dot, rr = dot;
  __m256i outside = _mm256_setzero_si256();  // per lane, as int32: flushed every kFlush vectors
  constexpr int64_t kFlush = int64_t(1) << 24;
  int64_t counted = 0;
  const int64_t vecs = n / 8;
  for (int64_t v = 0; v < vecs; ++v) {
    const __m256 x = _mm256_loadu_ps(a + v * 8), y = _mm256_loadu_ps(r + v * 8);
    const __m256 d = _mm256_and_ps(_mm256_sub_ps(x, y), sign);
    const __m256 ar = _mm256_and_ps(y, sign);
    check = _mm256_add_ps(check, _mm256_add_ps(_mm256_mul_ps(d, zero), _mm256_mul_ps(ar, zero)));
    max_abs = _mm256_max_ps(d, max_abs);
    ref_max = _mm256_max_ps(ar, ref_max);
    if (ratio) {
      ratio_max = _mm256_max_ps(_mm256_div_ps(d, _mm256_add_ps(ar, vshift)), ratio_max);
    }
    max_rel = _mm256_max_ps(_mm256_div_ps(d, _mm256_max_ps(ar, vatol)), max_rel);
    const __m256 out = _mm256_cmp_ps(d, _mm256_add_ps(_mm256_mul_ps(ar, vrtol), vatol),
                                     _CMP_GT_OQ);
    outside = _mm256_sub_epi32(outside, _mm256_castps_si256(out));  // a true lane is -1
    const __m256d xl = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d xh = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    const __m256d yl = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
    const __m256d yh = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
    dot = _mm256_add_pd(dot, _mm256_add_pd(_mm256_mul_pd(xl, yl), _mm256_mul_pd(xh, yh)));
    aa = _mm256_add_pd(aa, _mm256_add_pd(_mm256_mul_pd(xl, xl), _mm256_mul_pd(xh, xh)));
    rr = _mm256_add_pd(rr, _mm256_add_pd(_mm256_mul_pd(yl, yl), _mm256_mul_pd(yh, yh)));
    if (++counted == kFlush || v + 1 == vecs) {
      alignas(32) int32_t c[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(c), outside);
      for (int32_t k : c) {
        e.outside += k;
      }
      outside = _mm256_setzero_si256();
      counted = 0;
    }
  }
  alignas(32) float f[5][8];
  _mm256_store_ps(f[0], max_abs);
  _mm256_store_ps(f[1], ref_max);
  _mm256_store_ps(f[2], ratio_max);
  _mm256_store_ps(f[3], max_rel);
  _mm256_store_ps(f[4], check);
  alignas(32) double s[3][4];
  _mm256_store_pd(s[0], dot);
  _mm256_store_pd(s[1], aa);
  _mm256_store_pd(s[2], rr);
  for (int j = 0; j < 8; ++j) {
    e.finite = e.finite && !std::isnan(f[4][j]);
    e.max_abs = std::max(e.max_abs, f[0][j]);
    e.ref_max = std::max(e.ref_max, f[1][j]);
    e.ratio_max = std::max(e.ratio_max, f[2][j]);
    e.max_rel = std::max(e.max_rel, f[3][j]);
  }
  for (int j = 0; j < 4; ++j) {
    e.dot += s[0][j];
    e.aa += s[1][j];
    e.rr += s[2][j];
  }
  accumulate(a + vecs * 8, r + vecs * 8, n - vecs * 8, atol, rtol, shift, e);
}
const bool kHasAvx2 = __builtin_cpu_supports("avx2");
#endif

// May a pair be read in memory order? Both sides in one dense layout (a transpose on both
// sides is read where it lies); any other pair is read row-major (copied contiguous first).
bool same_dense_layout(const at::Tensor& a, const at::Tensor& r) {
  if (a.sizes() != r.sizes() || a.strides() != r.strides() || !a.is_non_overlapping_and_dense()) {
    return false;
  }
  for (int64_t s : a.strides()) {
    if (s < 0) {
      return false;
    }
  }
  return true;
}

template <typename T>
std::optional<Errors<T>> errors_of(const std::vector<at::Tensor>& actual,
                                   const std::vector<at::Tensor>& reference, double atol,
                                   double rtol) {
  Errors<T> e;
  const T atol_t = static_cast<T>(atol), rtol_t = static_cast<T>(rtol);
  const T shift = rtol > 0 ? static_cast<T>(atol / rtol) : T(0);
  for (size_t k = 0; k < actual.size(); ++k) {
    at::Tensor a = actual[k], r = reference[k];
    if (!same_dense_layout(a, r)) {
      a = a.contiguous();
      r = r.contiguous();
    }
    const T* pa = a.const_data_ptr<T>();
    const T* pr = r.const_data_ptr<T>();
    const int64_t n = a.numel();
#if defined(__GNUC__) && defined(__x86_64__)
    if constexpr (std::is_same_v<T, float>) {
      if (kHasAvx2) {
        accumulate_avx2(pa, pr, n, atol_t, rtol_t, shift, e);
        continue;
      }
    }
#endif
    accumulate(pa, pr, n, atol_t, rtol_t, shift, e);
  }
  if (!e.finite) {
    return std::nullopt;
  }
  return e;
}

// Pairs this pass takes: host tensors of one dtype, float or double, equal numel per pair.
bool takes(const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& reference) {
  if (actual.empty() || actual.size() != reference.size()) {
    return false;
  }
  const auto d = reference[0].scalar_type();
  if (d != at::kFloat && d != at::kDouble) {
    return false;
  }
  for (size_t k = 0; k < actual.size(); ++k) {
    const auto& a = actual[k];
    const auto& r = reference[k];
    if (!a.is_cpu() || !r.is_cpu() || a.scalar_type() != d || r.scalar_type() != d ||
        a.numel() != r.numel() || a.layout() != at::kStrided || r.layout() != at::kStrided) {
      return false;
    }
  }
  return true;
}

template <typename T>
pybind11::object as_tuple(const std::optional<Errors<T>>& e) {
  if (!e) {
    return pybind11::none();
  }
  return pybind11::make_tuple(double(e->max_abs), double(e->ref_max), double(e->ratio_max),
                              double(e->max_rel), e->outside, e->dot, e->aa, e->rr);
}

// -- a record's summary ------------------------------------------------------------------------

// The finite min and max of `n` elements and the count of the others, element by element.
template <typename T, typename F>
void range_scalar(const T* p, int64_t n, F& lo, F& hi, int64_t& bad) {
  for (int64_t i = 0; i < n; ++i) {
    const F x = static_cast<F>(p[i]);
    if (!std::isfinite(x)) {
      ++bad;
      continue;
    }
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
}

#if defined(__GNUC__) && defined(__x86_64__)
// Eight elements into one set of lanes: a value that is not finite is counted and turned into
// a NaN, which minps/maxps pass over.
__attribute__((target("avx2,f16c"))) inline void range8(__m256 x, __m256& mn, __m256& mx,
                                                         __m256i& count) {
  const __m256 z = _mm256_sub_ps(x, x);  // NaN exactly where x is NaN or infinite
  const __m256 off = _mm256_cmp_ps(z, z, _CMP_UNORD_Q);
  count = _mm256_sub_epi32(count, _mm256_castps_si256(off));  // a true lane is -1
  const __m256 xf = _mm256_or_ps(x, off);
  mn = _mm256_min_ps(xf, mn);
  mx = _mm256_max_ps(xf, mx);
}

// 32 elements at a time, in four independent sets of lanes (a min or max waits for the one
// before it in its lanes: one set would wait on each).
template <typename T>
__attribute__((target("avx2,f16c"))) void range_avx2(const T* p, int64_t n, float& lo, float& hi,
                                                     int64_t& bad) {
  const __m256 top = _mm256_set1_ps(INFINITY), bottom = _mm256_set1_ps(-INFINITY);
  __m256 mn0 = top, mn1 = top, mn2 = top, mn3 = top;
  __m256 mx0 = bottom, mx1 = bottom, mx2 = bottom, mx3 = bottom;
  const int64_t blocks = n / 32;
  constexpr int64_t kChunk = int64_t(1) << 24;  // blocks per int32 count
  for (int64_t start = 0; start < blocks; start += kChunk) {
    const int64_t end = std::min(blocks, start + kChunk);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t b = start; b < end; ++b) {
      const T* q = p + b * 32;
      range8(load8(q), mn0, mx0, c0);
      range8(load8(q + 8), mn1, mx1, c1);
      range8(load8(q + 16), mn2, mx2, c2);
      range8(load8(q + 24), mn3, mx3, c3);
    }
    alignas(32) int32_t c[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(c),
                       _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)));
    for (int32_t k : c) {
      bad += k;
    }
  }
  alignas(32) float a[8], b[8];
  _mm256_store_ps(a, _mm256_min_ps(_mm256_min_ps(mn0, mn1), _mm256_min_ps(mn2, mn3)));
  _mm256_store_ps(b, _mm256_max_ps(_mm256_max_ps(mx0, mx1), _mm256_max_ps(mx2, mx3)));
  for (int j = 0; j < 8; ++j) {
    lo = std::min(lo, a[j]);
    hi = std::max(hi, b[j]);
  }
  range_scalar(p + blocks * 32, n - blocks * 32, lo, hi, bad);
}
// The common case's pass: the min and max of `n` elements, and whether all are finite (false:
// the values say nothing, `range_avx2` takes them), 32 at a time in four sets of lanes. A NaN
// or an infinity makes x * 0 a NaN, which the sum keeps.
template <typename T>
__attribute__((target("avx2,f16c"))) bool finite_range_avx2(const T* p, int64_t n, float& lo,
                                                            float& hi) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 mn0 = _mm256_set1_ps(INFINITY), mn1 = mn0, mn2 = mn0, mn3 = mn0;
  __m256 mx0 = _mm256_set1_ps(-INFINITY), mx1 = mx0, mx2 = mx0, mx3 = mx0;
  __m256 s0 = zero, s1 = zero;
  const int64_t blocks = n / 32;
  for (int64_t b = 0; b < blocks; ++b) {
    const T* q = p + b * 32;
    const __m256 x0 = load8(q), x1 = load8(q + 8), x2 = load8(q + 16), x3 = load8(q + 24);
    mn0 = _mm256_min_ps(x0, mn0);
    mx0 = _mm256_max_ps(x0, mx0);
    mn1 = _mm256_min_ps(x1, mn1);
    mx1 = _mm256_max_ps(x1, mx1);
    mn2 = _mm256_min_ps(x2, mn2);
    mx2 = _mm256_max_ps(x2, mx2);
    mn3 = _mm256_min_ps(x3, mn3);
    mx3 = _mm256_max_ps(x3, mx3);
    s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_add_ps(x0, x1), zero));
    s1 = _mm256_add_ps(s1, _mm256_mul_ps(_mm256_add_ps(x2, x3), zero));
  }
  alignas(32) float a[8], b[8], c[8];
  _mm256_store_ps(a, _mm256_min_ps(_mm256_min_ps(mn0, mn1), _mm256_min_ps(mn2, mn3)));
  _mm256_store_ps(b, _mm256_max_ps(_mm256_max_ps(mx0, mx1), _mm256_max_ps(mx2, mx3)));
  _mm256_store_ps(c, _mm256_add_ps(s0, s1));
  bool finite = true;
  for (int j = 0; j < 8; ++j) {
    lo = std::min(lo, a[j]);
    hi = std::max(hi, b[j]);
    finite = finite && !std::isnan(c[j]);
  }
  int64_t bad = 0;
  range_scalar(p + blocks * 32, n - blocks * 32, lo, hi, bad);
  return finite && bad == 0;
}

const bool kHasF16c = has_avx2_f16c();
#endif

template <typename T>
void range_of(const T* p, int64_t n, double& lo, double& hi, int64_t& bad) {
  if constexpr (std::is_same_v<T, double>) {
    range_scalar(p, n, lo, hi, bad);
  } else {
    float l = INFINITY, h = -INFINITY;
#if defined(__GNUC__) && defined(__x86_64__)
    if (kHasF16c) {
      if (!finite_range_avx2(p, n, l, h)) {  // a NaN or an Inf: counted, the range without them
        l = INFINITY, h = -INFINITY;
        range_avx2(p, n, l, h, bad);
      }
    } else {
      range_scalar(p, n, l, h, bad);
    }
#else
    range_scalar(p, n, l, h, bad);
#endif
    lo = l;
    hi = h;
  }
}

// The elements at row-major `positions` of `t` (laid out by its strides from `base`), as float32.
template <typename T>
void gather_samples(const T* base, const at::Tensor& t, const at::Tensor& positions,
                    float* out) {
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  for (int64_t k = 0; k < positions.numel(); ++k) {
    int64_t rest = pos[k], at = 0;
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
      at += rest % sizes[d] * strides[d];
      rest /= sizes[d];
    }
    out[k] = static_cast<float>(base[at]);
  }
}

template <typename T>
pybind11::object summary_of(const at::Tensor& t, const at::Tensor& positions) {
  // its memory, read where it lies in any dense layout (min and max do not depend on the order)
  at::Tensor x = t;
  bool dense = t.is_non_overlapping_and_dense();
  for (int64_t s : t.strides()) {
    dense = dense && s >= 0;
  }
  if (!dense) {
    x = t.contiguous();
  }
  const T* base = x.const_data_ptr<T>();
  double lo = INFINITY, hi = -INFINITY;
  int64_t bad = 0;
  std::string samples(static_cast<size_t>(positions.numel()) * sizeof(float), '\0');
  {
    pybind11::gil_scoped_release nogil;
    range_of(base, x.numel(), lo, hi, bad);
    gather_samples(base, x, positions, reinterpret_cast<float*>(samples.data()));
  }
  if (bad == x.numel()) {  // nothing finite
    lo = hi = 0.0;
  }
  return pybind11::make_tuple(lo, hi, bad, pybind11::bytes(samples));
}

}  // namespace

void bind_numerics(pybind11::module_& m) {
  m.def(
      "compare_errors",
      [](const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& reference,
         double atol, double rtol) -> pybind11::object {
        if (!takes(actual, reference)) {
          return pybind11::none();
        }
        if (reference[0].scalar_type() == at::kFloat) {
          std::optional<Errors<float>> e;
          {
            pybind11::gil_scoped_release nogil;
            e = errors_of<float>(actual, reference, atol, rtol);
          }
          return as_tuple(e);
        }
        std::optional<Errors<double>> e;
        {
          pybind11::gil_scoped_release nogil;
          e = errors_of<double>(actual, reference, atol, rtol);
        }
        return as_tuple(e);
      },
      "(max |a-r|, max |r|, max |a-r|/(atol/rtol+|r|), max |a-r|/max(|r|,atol), elements "
      "outside atol+rtol*|r|, a.r, a.a, r.r) of paired host float/double tensors in one pass; "
      "None where a value is NaN or Inf or the pairs are not host tensors of one such dtype");
  m.def(
      "record_summary",
      [](const at::Tensor& t, const at::Tensor& positions) -> pybind11::object {
        if (!t.is_cpu() || t.layout() != at::kStrided || t.numel() == 0 ||
            positions.scalar_type() != at::kLong || !positions.is_contiguous()) {
          return pybind11::none();
        }
        switch (t.scalar_type()) {
          case at::kHalf:
            return summary_of<c10::Half>(t, positions);
          case at::kBFloat16:
            return summary_of<c10::BFloat16>(t, positions);
          case at::kFloat:
            return summary_of<float>(t, positions);
          case at::kDouble:
            return summary_of<double>(t, positions);
          default:
            return pybind11::none();
        }
      },
      "(finite min, finite max, NaN/Inf count, the elements at the row-major `positions` as "
      "float32 bytes) of a host float16/bfloat16/float32/float64 tensor in one pass; None for "
      "any other tensor");
}

}  // namespace torch_rbln
