// The warm path of an eager device op: a program-cache hit runs without Python.
//
// Each device op whose program computes its functional aten twin (the table's "direct" form, or
// the widened matmul form) gets this boxed kernel on PrivateUse1; its Python kernel
// (torch_rbln/dispatch/device_op.py, the reference) moves to PrivateUse2, reached by a
// redispatch. On a call the kernel:
//   1. takes the Python path for anything with a decision to explain or report: a listener on
//      the event stream, a failed pre-dispatch check, a key it has not seen run as a device
//      program (cold compile, compile error), a NaN/Inf operand, an unusual argument;
//   2. otherwise does what the Python path does on a cache hit, in the same order and with the
//      same events: `dispatch`, the NaN/Inf scan (d2h of device-latest operands), `warm_hit`,
//      the operands' device reads (h2d of host-latest ones), the program on device aliases
//      (`device_program`), and the result delivered over an adopted block (or into `out`).
// Python decides everything first: a key enters this kernel's cache only after the Python path
// ran a device program for it (and each key here determines the Python key), and dropping the
// program cache drops these too. So every event and count is the Python path's.
//
// The same holds for a warm CPU fallback: when the Python path sends a call to the host for a
// reason that follows from the key alone (device_op.REPLAYED: the dtype rule, the 64-alignment
// rule after a clean NaN/Inf scan) and computes it in its plain host form (the functional op on
// the host views, the result delivered over the host view), it tells this kernel so, and the
// next call with that key replays the decision here: `dispatch`, `cpu_fallback_reason`, the
// operands' host reads (d2h of device-latest ones), the op, the result, `cpu_fallback` with its
// duration (inside a profiler range `rbln::cpu_fallback(<reason>)` while a profile records device
// activity, as the Python path names it). Everything that could change the decision or needs
// Python (a listener: a guard scope, the fallback log, call-site capture; a trace; a dispatch
// mode; TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK; a non-finite operand) takes the Python path.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <unistd.h>  // environ

#if defined(__SSE2__)
#include <emmintrin.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "Events.h"
#include "Storage.h"

namespace py = pybind11;

namespace torch_rbln {

// results.deliver_device of a fresh result (defined below, with the layout helpers)
at::Tensor new_device_result(at::Tensor result, c10::DeviceIndex index);
// the same, with TORCH_RBLN_EAGER_MALLOC as the call read it
at::Tensor new_device_result(at::Tensor result, c10::DeviceIndex index,
                             const char* const* eager_raw);

namespace {

enum class Mode : int8_t { Out = 0, Inplace = 1, Functional = 2 };
// Direct: the functional op on device aliases; Matmul: the same, with fp32 operands and one
// rounding for the dtypes this CPU has no native GEMM for (executors.matmul); Sdpa: the device
// attention op's program without mask or dropout (executors.sdpa_forward's fused form);
// LinearBackward: aten::linear_backward's program (executors.linear_backward)
enum class Form : int8_t { Direct = 0, Matmul = 1, Sdpa = 2, LinearBackward = 3 };

// ------------------------------------------------------------------------------------------
// process-wide switches and the state shared with the Python path

std::atomic<bool> enabled{true};
std::atomic<int64_t> generation{0};  // bumped whenever the program cache is dropped
std::atomic<int64_t> served{0};      // calls the warm path ran itself (tests read it)
std::atomic<int64_t> replayed{0};    // CPU fallbacks it replayed (tests read it)

// the dtypes of the eager dispatch catalog and of the strict set (rules.configure), and the
// half-precision dtypes whose matmuls are widened (executors.matmul_precision)
std::vector<c10::ScalarType> dispatch_dtypes, strict_dtypes, widened_dtypes;
// the dtypes whose linear programs take their weight in the GEMM library's blocked layout
// (executors.packs: the host's packed linear, for the dtypes it has native GEMMs for)
std::vector<c10::ScalarType> packed_dtypes;
int64_t widen_min_rows = 0;  // fewer rows keep the half-precision kernel (executors.widens)

// device programs running on this thread (the `reentrant` rule); both paths raise it
thread_local int program_depth = 0;

// The call this thread's kernel handed to the Python path: the Python path marks it when it
// runs a device program (enter_program), so the key can be cached here.
struct Ticket {
  bool ran = false;
  std::string fallback;  // or: the reason of a host run it may replay (fallback_decided)
};
thread_local Ticket* pending = nullptr;

py::object* python_deliver = nullptr;  // results.deliver_device, for unusual out= deliveries

bool contains(const std::vector<c10::ScalarType>& v, c10::ScalarType d) {
  for (auto x : v) {
    if (x == d) {
      return true;
    }
  }
  return false;
}

// sys.gettrace() of this thread is set. Read without the GIL: only this thread sets its own
// trace function, and it is running this kernel.
bool tracing() {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  return ts != nullptr && ts->c_traceobj != nullptr;
}

// The variables a call reads, as they are now (they are live): TORCH_RBLN_DEPLOY,
// TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK and TORCH_RBLN_EAGER_MALLOC, in one pass over the
// environment (getenv makes a pass per name; three were a twentieth of a small op's work).
// Null where unset; the first entry of a name counts, as for getenv.
struct Env {
  const char* deploy = nullptr;
  const char* disable = nullptr;
  const char* eager = nullptr;
};

// `slot` <- the value of `rest` if it is `name=value` (the first such entry wins, as getenv's);
// the name's length comes from the literal. Whether it took it.
template <size_t N>
bool take_env(const char* rest, const char (&name)[N], const char*& slot) {
  constexpr size_t n = N - 1;
  if (slot == nullptr && std::strncmp(rest, name, n) == 0 && rest[n] == '=') {
    slot = rest + n + 1;
    return true;
  }
  return false;
}

// This thread's last pass over the environment, reused while the environment is as that pass
// left it: a variable set anew is appended (the entry count moves, or the array moves where it
// grows), one unset shifts the later entries down (the count moves), and a value set again
// takes a new string in its entry (glibc keeps every value it has set, so an entry's pointer
// names its content). So: the same array, count and last entry, and the same pointers in the
// entries the pass took the variables' values from.
struct EnvPass {
  char** array = nullptr;
  size_t count = 0;
  const char* last = nullptr;  // the last entry
  std::array<std::pair<size_t, const char*>, 3> found{};  // (entry, its pointer) per value
  size_t n_found = 0;
  Env env;
};

bool unchanged(const EnvPass& pass, char** array) {
  if (array == nullptr || array != pass.array || array[pass.count] != nullptr ||
      (pass.count > 0 && array[pass.count - 1] != pass.last)) {
    return false;
  }
  for (size_t i = 0; i < pass.n_found; ++i) {
    if (array[pass.found[i].first] != pass.found[i].second) {
      return false;
    }
  }
  return true;
}

Env read_env() {
  static constexpr char kPrefix[] = "TORCH_RBLN_";
  constexpr size_t kLen = sizeof(kPrefix) - 1;
  thread_local EnvPass pass;
  char** array = environ;
  if (unchanged(pass, array)) {
    return pass.env;
  }
  pass = EnvPass{};
  pass.array = array;
  Env& e = pass.env;
  for (char** p = array; p != nullptr && *p != nullptr; ++p) {
    ++pass.count;
    const char* s = *p;
    pass.last = s;
    if (s[0] != 'T' || std::strncmp(s, kPrefix, kLen) != 0) {
      continue;
    }
    const char* rest = s + kLen;
    if (take_env(rest, "DEPLOY", e.deploy) ||
        take_env(rest, "DEV_DISABLE_OP_CPU_FALLBACK", e.disable) ||
        take_env(rest, "EAGER_MALLOC", e.eager)) {
      pass.found[pass.n_found++] = {static_cast<size_t>(p - array), s};
    }
  }
  return e;
}

// TORCH_RBLN_DEPLOY: 1 on ("ON"), 0 off (unset, "", "OFF"), -1 a bad value (Python raises)
int deploy(const char* raw) {
  if (raw == nullptr || raw[0] == '\0' || std::strcmp(raw, "OFF") == 0) {
    return 0;
  }
  return std::strcmp(raw, "ON") == 0 ? 1 : -1;
}

// TORCH_RBLN_DEV_DISABLE_OP_CPU_FALLBACK names checks to skip (the Python path warns and skips)
bool checks_disabled(const char* raw) {
  return raw != nullptr && raw[0] != '\0';
}

// layout.spans_storage: offset 0, exactly `nbytes` bytes, each once (contiguous or dense)
bool spans(const at::Tensor& t, int64_t nbytes) {
  if (t.storage_offset() != 0) {
    return false;
  }
  if (t.numel() * static_cast<int64_t>(t.itemsize()) != nbytes) {
    return false;
  }
  if (t.is_contiguous()) {
    return true;
  }
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of size != 1
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) != 1) {
      dims.emplace_back(t.stride(i), t.size(i));
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t need = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != need) {
      return false;
    }
    need *= size;
  }
  return true;
}

bool spans_own_storage(const at::Tensor& t) {
  return spans(t, static_cast<int64_t>(t.storage().nbytes()));
}

// rules.has_nonfinite for an rbln operand: the floating dtypes the scan looks at
bool scanned(c10::ScalarType d) {
  return d == at::kHalf || d == at::kBFloat16 || d == at::kFloat || d == at::kDouble;
}

// Any of `n` elements of `Bits` bits whose exponent bits (`mask`) are all ones: NaN or an
// infinity. Read once, nothing converted or allocated: 128-bit compares where the CPU has SSE2
// (every x86-64), else 64-bit words of several elements, where a lane of `(w & M) ^ M` is zero
// exactly where an element's exponent is all ones (the zero-lane test below is exact); checked
// per chunk so that a bad value ends the scan early.
template <int Bits>
bool exponent_all_ones(const char* data, int64_t n, uint64_t mask) {
#if defined(__SSE2__)
  if constexpr (Bits == 16 || Bits == 32) {  // x86-64: 128-bit compares, 8 or 4 elements each
    const __m128i m = Bits == 16 ? _mm_set1_epi16(static_cast<int16_t>(mask))
                                 : _mm_set1_epi32(static_cast<int32_t>(mask));
    const int64_t vecs = n / (128 / Bits);
    constexpr int64_t kChunk = 512;
    for (int64_t start = 0; start < vecs; start += kChunk) {
      const int64_t end = std::min(vecs, start + kChunk);
      __m128i hit = _mm_setzero_si128();
      for (int64_t i = start; i < end; ++i) {
        const __m128i x = _mm_and_si128(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + i * 16)), m);
        hit = _mm_or_si128(hit, Bits == 16 ? _mm_cmpeq_epi16(x, m) : _mm_cmpeq_epi32(x, m));
      }
      if (_mm_movemask_epi8(hit)) {
        return true;
      }
    }
    for (int64_t i = vecs * (128 / Bits); i < n; ++i) {  // the last elements, one by one
      uint64_t e = 0;
      std::memcpy(&e, data + i * (Bits / 8), Bits / 8);
      if ((e & mask) == mask) {
        return true;
      }
    }
    return false;
  }
#endif
  constexpr int kLanes = 64 / Bits;
  uint64_t m = 0, low = 0, high = 0;
  for (int i = 0; i < kLanes; ++i) {
    m |= mask << (i * Bits);
    low |= uint64_t(1) << (i * Bits);
    high |= uint64_t(1) << (i * Bits + Bits - 1);
  }
  const int64_t words = n / kLanes;
  constexpr int64_t kChunk = 1024;
  for (int64_t start = 0; start < words; start += kChunk) {
    const int64_t end = std::min(words, start + kChunk);
    uint64_t hit = 0;
    for (int64_t i = start; i < end; ++i) {
      uint64_t w;
      std::memcpy(&w, data + i * 8, 8);
      const uint64_t v = (w & m) ^ m;
      hit |= (v - low) & ~v & high;
    }
    if (hit) {
      return true;
    }
  }
  for (int64_t i = words * kLanes; i < n; ++i) {  // the last elements, one by one
    uint64_t e = 0;
    std::memcpy(&e, data + i * (Bits / 8), Bits / 8);
    if ((e & mask) == mask) {
      return true;
    }
  }
  return false;
}

#if defined(__SSE2__) && defined(__GNUC__)
// The same scan 256 bits at a time, on CPUs with AVX2 (chosen at run time: the build targets
// every x86-64); the elements past the last full vector go to the 128-bit scan.
template <int Bits>
__attribute__((target("avx2"))) bool exponent_all_ones_avx2(const char* data, int64_t n,
                                                            uint64_t mask) {
  const __m256i m = Bits == 16 ? _mm256_set1_epi16(static_cast<int16_t>(mask))
                               : _mm256_set1_epi32(static_cast<int32_t>(mask));
  const int64_t vecs = n / (256 / Bits);
  constexpr int64_t kChunk = 256;
  for (int64_t start = 0; start < vecs; start += kChunk) {
    const int64_t end = std::min(vecs, start + kChunk);
    __m256i hit = _mm256_setzero_si256();
    for (int64_t i = start; i < end; ++i) {
      const __m256i x = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i * 32)), m);
      hit = _mm256_or_si256(hit, Bits == 16 ? _mm256_cmpeq_epi16(x, m) : _mm256_cmpeq_epi32(x, m));
    }
    if (_mm256_movemask_epi8(hit)) {
      return true;
    }
  }
  return exponent_all_ones<Bits>(data + vecs * 32, n - vecs * (256 / Bits), mask);
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");

template <int Bits>
bool exponent_all_ones_fastest(const char* data, int64_t n, uint64_t mask) {
  return kHasAvx2 ? exponent_all_ones_avx2<Bits>(data, n, mask)
                  : exponent_all_ones<Bits>(data, n, mask);
}
#else
template <int Bits>
bool exponent_all_ones_fastest(const char* data, int64_t n, uint64_t mask) {
  return exponent_all_ones<Bits>(data, n, mask);
}
#endif

bool nonfinite_bits(const void* data, int64_t numel, c10::ScalarType d) {
  const auto* p = static_cast<const char*>(data);
  switch (d) {
    case at::kHalf:
      return exponent_all_ones_fastest<16>(p, numel, 0x7C00);
    case at::kBFloat16:
      return exponent_all_ones_fastest<16>(p, numel, 0x7F80);
    case at::kFloat:
      return exponent_all_ones_fastest<32>(p, numel, 0x7F800000u);
    default:
      return exponent_all_ones<64>(p, numel, 0x7FF0000000000000ull);
  }
}

// nonfinite_bits of a strided view whose last dimension is dense (a slice of the last axis, a
// transposed batch): each row of that dimension is one run of memory, scanned as above
bool nonfinite_rows(const char* base, const at::Tensor& t) {
  const int64_t item = static_cast<int64_t>(t.itemsize());
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t outer = t.dim() - 1;
  const int64_t row = sizes[outer];
  std::vector<int64_t> at_(outer, 0);
  int64_t offset = 0;  // of the current row, in elements
  for (int64_t r = 0, rows = t.numel() / row; r < rows; ++r) {
    if (nonfinite_bits(base + offset * item, row, t.scalar_type())) {
      return true;
    }
    for (int64_t d = outer - 1; d >= 0; --d) {  // the next row: an odometer over the outer dims
      offset += strides[d];
      if (++at_[d] < sizes[d]) {
        break;
      }
      offset -= strides[d] * sizes[d];
      at_[d] = 0;
    }
  }
  return false;
}

// the value of a wrapped scalar (a CPU 0-dim tensor) is finite; read in place, no dispatch
bool finite_scalar(const at::Tensor& t) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kHalf:
      return std::isfinite(static_cast<float>(*static_cast<const c10::Half*>(p)));
    case at::kBFloat16:
      return std::isfinite(static_cast<float>(*static_cast<const c10::BFloat16*>(p)));
    case at::kFloat:
      return std::isfinite(*static_cast<const float*>(p));
    case at::kDouble:
      return std::isfinite(*static_cast<const double*>(p));
    default:
      return !t.is_floating_point();  // other floating types: checked by the Python path
  }
}

}  // namespace

// rules.has_nonfinite of an rbln tensor: one pass over its bits. The host
// read's d2h is recorded as the scan's, but the bytes are read where they are: the copy waits
// for a real host reader (most device-latest operands never get one).
bool has_nonfinite(const at::Tensor& t) {
  if (!scanned(t.scalar_type()) || t.numel() == 0) {
    return false;
  }
  StorageState* s = state_of(t);
  if (s->finite_dtype == t.scalar_type()) {
    return false;
  }
  const bool device_side = s->host_read_deferred();
  const bool whole = spans(t, s->nbytes);
  bool bad = false;
  const bool dense_rows = t.dim() > 0 && (t.stride(-1) == 1 || t.size(-1) == 1);
  if (whole || t.is_contiguous() || dense_rows) {  // runs of memory: read the bits
    at::Tensor bytes = device_side ? s->device_bytes() : s->host_bytes();
    const auto* base = static_cast<const char*>(bytes.const_data_ptr());
    const int64_t item = static_cast<int64_t>(t.itemsize());
    bad = whole ? nonfinite_bits(base, s->nbytes / item, t.scalar_type())
          : t.is_contiguous()
              ? nonfinite_bits(base + t.storage_offset() * item, t.numel(), t.scalar_type())
              : nonfinite_rows(base + t.storage_offset() * item, t);
  } else {  // another strided view: one min/max pass (NaN reaches both, an infinity is one of them)
    const auto [lo, hi] = at::aminmax(device_side ? s->device_alias(t) : s->host_alias(t));
    bad = !std::isfinite(lo.item<double>()) || !std::isfinite(hi.item<double>());
  }
  if (whole && !bad) {
    s->finite_dtype = t.scalar_type();
  }
  return bad;
}

namespace {

// ------------------------------------------------------------------------------------------
// the cache key: everything the Python key is made of (and more: strides, the out tensor), so
// one key here always means one key there

// a call's key and the operands met while making it, on the stack: no allocation per call
using Key = c10::SmallVector<int64_t, 64>;
using Seen = c10::SmallVector<const c10::TensorImpl*, 8>;

enum Tag : int64_t {
  kNone = 1, kBool, kInt, kDouble, kString, kIntList, kDevice, kDeviceTensor, kScalarTensor,
  kBoolList,
};

bool key_of_tensor(const at::Tensor& t, Seen& seen, Key& key) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  int64_t first = static_cast<int64_t>(seen.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] == impl) {
      first = static_cast<int64_t>(i);
      break;
    }
  }
  if (first == static_cast<int64_t>(seen.size())) {
    seen.push_back(impl);
  }
  if (t.is_cpu() && t.dim() == 0) {  // a wrapped Python scalar: its value is baked in
    if (t.is_complex()) {
      return false;
    }
    if (!finite_scalar(t)) {
      return false;  // NaN never equals itself: the Python key never hits, every call compiles
    }
    int64_t bits = 0;
    std::memcpy(&bits, t.const_data_ptr(), std::min<size_t>(t.itemsize(), sizeof(bits)));
    key.append({kScalarTensor, static_cast<int64_t>(t.scalar_type()), bits, first});
    return true;
  }
  key.append({kDeviceTensor, static_cast<int64_t>(t.scalar_type()), t.dim(), first});
  key.append(t.sizes().begin(), t.sizes().end());
  key.append(t.strides().begin(), t.strides().end());
  return true;
}

bool key_of(const c10::IValue& v, Seen& seen, Key& key) {
  if (v.isTensor()) {
    return key_of_tensor(v.toTensor(), seen, key);
  }
  if (v.isNone()) {
    key.push_back(kNone);
  } else if (v.isBool()) {
    key.append({kBool, v.toBool()});
  } else if (v.isInt()) {
    key.append({kInt, v.toInt()});
  } else if (v.isDouble()) {
    double d = v.toDouble();
    if (std::isnan(d)) {
      return false;  // as a NaN scalar operand: a fresh Python float never matches its key
    }
    int64_t bits = 0;
    std::memcpy(&bits, &d, sizeof(bits));
    key.append({kDouble, bits});
  } else if (v.isString()) {
    const auto& s = v.toStringRef();
    key.append({kString, static_cast<int64_t>(s.size())});
    for (char c : s) {
      key.push_back(c);
    }
  } else if (v.isBoolList()) {
    auto l = v.toBoolList();
    key.append({kBoolList, static_cast<int64_t>(l.size())});
    for (bool x : l) {
      key.push_back(x);
    }
  } else if (v.isIntList()) {
    auto l = v.toIntList();
    key.append({kIntList, static_cast<int64_t>(l.size())});
    for (int64_t x : l) {
      key.push_back(x);
    }
  } else if (v.isDevice()) {
    auto d = v.toDevice();
    key.append({kDevice, static_cast<int64_t>(d.type()), d.index()});
  } else {
    return false;  // lists of tensors, generators, complex scalars...: the Python path
  }
  return true;
}

// FNV-1a over the key's words (a bucket's keys are compared whole, so a collision costs a
// comparison, never a wrong program)
uint64_t hash_key(c10::ArrayRef<int64_t> key) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t x : key) {
    h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
  }
  return h;
}

// ------------------------------------------------------------------------------------------
// the kernel

struct Program {
  std::vector<int64_t> key;
  int64_t generation;
  std::vector<int64_t> out_sizes;   // out= / in-place: the result's shape
  // a CPU fallback's reason (`cpu_fallback_reason` counter), null for a device program
  events::Counter* fallback = nullptr;
};

// what one call needs to know before it runs
struct Call {
  c10::DeviceIndex index = 0;
  c10::ScalarType dtype = at::kHalf;  // the operands' dtype (a widened matmul rounds to it)
  int deploy = 0;
  const char* eager_raw = nullptr;  // TORCH_RBLN_EAGER_MALLOC as read for this call
  bool device_rules = true;  // the dtype rule passes (the later rules, the NaN/Inf scan, apply)
  bool aligned = true;       // ... and the 64-alignment rule
};

class WarmKernel final : public c10::OperatorKernel {
 public:
  WarmKernel(const std::string& op_name, c10::OperatorHandle fn, Mode mode, int out_arg,
             std::vector<int> slots, std::vector<int> skip_dtype, bool align64, Form form,
             std::vector<int> fn_args, int left, bool batched)
      : fn_(std::move(fn)), mode_(mode), out_arg_(out_arg), slots_(std::move(slots)),
        skip_dtype_(std::move(skip_dtype)), align64_(align64), form_(form),
        fn_args_(std::move(fn_args)), left_(left), batched_(batched),
        linear_(fn_.schema().name() == "aten::linear"),
        dispatch_(events::counter("dispatch", op_name)),
        cpu_fallback_(events::counter("cpu_fallback", op_name)),
        warm_hit_(events::counter("warm_hit", op_name)),
        program_(events::counter("device_program", op_name)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t n = schema.arguments().size();
    c10::ArrayRef<c10::IValue> args(stack->data() + stack->size() - n, n);
    Key key;
    Call call;
    if (!enabled.load(std::memory_order_relaxed) || !admissible(schema, args, key, call)) {
      python_path(op, stack, {});
      return;
    }
    std::vector<int64_t> out_sizes;
    events::Counter* fallback = nullptr;
    if (!lookup(key, out_sizes, fallback)) {
      python_path(op, stack, std::vector<int64_t>(key.begin(), key.end()));
      return;
    }
    if (mode_ != Mode::Functional && args[out_arg_].toTensor().sizes() != out_sizes) {
      python_path(op, stack, {});   // the out= tensor is resized (and warned about)
      return;
    }
    if (fallback == nullptr && !(call.device_rules && call.aligned)) {
      python_path(op, stack, {});  // a program for a key the rules send to the host: never cached
      return;
    }
    if (fallback != nullptr) {
      if (mode_ != Mode::Functional && writes_an_operand(args)) {
        python_path(op, stack, {});  // PyTorch's overlap rules for in-place operands apply
        return;
      }
      if (!call.device_rules) {  // the dtype rule failed: the Python path scans nothing either
        replay_fallback(schema, stack, n, call, fallback);
        return;
      }
    }
    // the NaN/Inf scan; a non-finite operand is the Python path's to report (redoing the scan
    // there records nothing new: the data is host-readable now, finite storages are marked)
    if (call.deploy == 0) {
      for (int i : slots_) {
        if (i >= static_cast<int>(n) || !args[i].isTensor()) {
          continue;
        }
        const auto& t = args[i].toTensor();
        if (t.is_privateuseone() && has_nonfinite(t)) {
          python_path(op, stack, {});
          return;
        }
      }
    }
    if (fallback != nullptr) {
      replay_fallback(schema, stack, n, call, fallback);
      return;
    }
    events::record(dispatch_);
    events::record(warm_hit_);
    served.fetch_add(1, std::memory_order_relaxed);
    if (form_ == Form::Sdpa) {
      run_attention(stack, n, call);
    } else if (form_ == Form::LinearBackward) {
      run_linear_backward(stack, n, call);
    } else {
      run(schema, stack, n, call);
    }
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    cache_.clear();
  }

 private:
  // May this call take the warm path (before the key lookup)? Fills `key`. Every failed check
  // here is the Python path's to decide (and report).
  bool admissible(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                  Key& key, Call& call) {
    if (events::python_path_wanted() || program_depth > 0 ||
        c10::impl::TorchDispatchModeTLS::stack_len() > 0 || tracing()) {
      return false;
    }
    const Env env = read_env();
    if (checks_disabled(env.disable)) {
      return false;
    }
    if (form_ == Form::Sdpa && !plain_attention(args)) {
      return false;  // a mask, dropout, the debug weights or not 4-D: the Python program's
    }
    const int dep = deploy(env.deploy);
    if (dep < 0) {
      return false;
    }
    // the operands (rules.classify): rbln tensors, wrapped scalars
    std::optional<c10::DeviceIndex> index;
    std::optional<c10::ScalarType> d0;
    bool scalar_only = true, dtype_ok = true, unaligned = false;
    for (int i : slots_) {
      if (i >= static_cast<int>(args.size()) || !args[i].isTensor()) {
        continue;
      }
      const auto& t = args[i].toTensor();
      if (!t.defined()) {
        continue;
      }
      if (t.key_set().has(c10::DispatchKey::Python)) {
        return false;
      }
      const bool skip = std::find(skip_dtype_.begin(), skip_dtype_.end(), i) != skip_dtype_.end();
      if (t.is_privateuseone()) {
        const auto d = t.device().index();
        if (index && *index != d) {
          return false;  // mixed devices: the Python path raises
        }
        index = d;
        if (t.dim() != 0) {
          scalar_only = false;
          if (align64_ && t.size(-1) % 64 != 0 && !contains(strict_dtypes, t.scalar_type())) {
            unaligned = true;  // a CPU fallback the key decides (its entry says so)
          }
        }
        if (t.storage_offset() != 0 && t.is_contiguous()) {
          return false;
        }
      } else if (t.is_cpu() && t.dim() == 0) {
        if (dep == 0 && !finite_scalar(t)) {
          return false;
        }
        continue;
      } else {
        return false;  // a host or meta operand with elements
      }
      if (t.numel() == 0) {
        return false;
      }
      if (!skip) {
        if (!d0) {
          d0 = t.scalar_type();
          if (!contains(dispatch_dtypes, *d0)) {
            dtype_ok = false;  // the dtype rule fails: a CPU fallback the key decides
          }
        } else if (t.scalar_type() != *d0) {
          dtype_ok = false;
        }
      }
    }
    if (!index || (scalar_only && dtype_ok)) {
      return false;  // (the dtype rule comes first: a 0-dim fp32 operand is its fallback)
    }
    call.index = *index;
    call.dtype = d0.value_or(at::kHalf);
    call.deploy = dep;
    call.eager_raw = env.eager;
    call.device_rules = dtype_ok;
    call.aligned = !unaligned;
    // Python floats among the positional arguments (the NaN/Inf rule), and the key
    Seen seen;
    key.push_back(*index);
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& v = args[i];
      const auto& a = schema.arguments()[i];
      if (v.isTensor() && static_cast<int>(i) != out_arg_) {
        const auto& t = v.toTensor();
        if (t.defined() && !t.is_privateuseone() && !(t.is_cpu() && t.dim() == 0)) {
          return false;
        }
        if (t.defined() && t.is_privateuseone() && a.kwarg_only()) {
          return false;
        }
        if (t.defined() && t.key_set().has(c10::DispatchKey::Python)) {
          return false;
        }
      }
      if (dep == 0 && !a.kwarg_only() && v.isDouble() && !std::isfinite(v.toDouble())) {
        return false;
      }
      if (v.isTensor() && !v.toTensor().defined()) {
        key.push_back(kNone);
      } else if (!key_of(v, seen, key)) {
        return false;
      }
    }
    if (mode_ != Mode::Functional) {
      const auto& out = args[out_arg_].toTensor();
      if (!out.is_privateuseone() || out.device().index() != *index) {
        return false;
      }
    }
    return true;
  }

  bool lookup(c10::ArrayRef<int64_t> key, std::vector<int64_t>& out_sizes,
              events::Counter*& fallback) {
    const int64_t gen = generation.load(std::memory_order_acquire);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(hash_key(key));
    if (it == cache_.end()) {
      return false;
    }
    for (const auto& p : it->second) {
      if (key.equals(p.key)) {
        if (p.generation != gen) {
          return false;
        }
        out_sizes = p.out_sizes;
        fallback = p.fallback;
        return true;
      }
    }
    return false;
  }

  void remember(std::vector<int64_t> key, std::vector<int64_t> out_sizes, int64_t gen,
                events::Counter* fallback) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& bucket = cache_[hash_key(key)];
    for (auto& p : bucket) {
      if (p.key == key) {
        p = Program{std::move(key), gen, std::move(out_sizes), fallback};
        return;
      }
    }
    bucket.push_back(Program{std::move(key), gen, std::move(out_sizes), fallback});
  }

  // The Python kernel (the reference) on PrivateUse2; a call that ran a device program there
  // makes its key a hit here.
  void python_path(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                   std::vector<int64_t> key) {
    const int64_t gen = generation.load(std::memory_order_acquire);
    std::optional<at::Tensor> out;
    if (!key.empty() && mode_ != Mode::Functional) {
      const size_t n = op.schema().arguments().size();
      out = (*stack)[stack->size() - n + out_arg_].toTensor();
    }
    Ticket ticket;
    Ticket* outer = pending;
    pending = key.empty() ? nullptr : &ticket;
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
    } catch (...) {
      pending = outer;
      throw;
    }
    pending = outer;
    if (ticket.ran) {
      remember(std::move(key), out ? out->sizes().vec() : std::vector<int64_t>{}, gen, nullptr);
    } else if (!ticket.fallback.empty()) {
      remember(std::move(key), out ? out->sizes().vec() : std::vector<int64_t>{}, gen,
               events::counter("cpu_fallback_reason", ticket.fallback));
    }
  }

  // another operand shares the output's memory (the key holds shapes, not storages)
  bool writes_an_operand(c10::ArrayRef<c10::IValue> args) const {
    const at::Tensor& out = args[out_arg_].toTensor();
    const c10::StorageImpl* mem = out.storage().unsafeGetStorageImpl();
    for (size_t i = 0; i < args.size(); ++i) {
      if (static_cast<int>(i) == out_arg_ || !args[i].isTensor()) {
        continue;
      }
      const at::Tensor& t = args[i].toTensor();
      if (t.defined() && t.is_privateuseone() && !t.is_same(out) &&
          t.storage().unsafeGetStorageImpl() == mem) {
        return true;
      }
    }
    return false;
  }

  // A CPU fallback the Python path decided for this key, replayed (device_op._fallback's plain
  // host form): the functional op on the operands' host views, the result over a host view
  void replay_fallback(const c10::FunctionSchema& schema, torch::jit::Stack* stack, size_t n,
                       const Call& call, events::Counter* reason) {
    events::record(dispatch_);
    events::record(reason);
    replayed.fetch_add(1, std::memory_order_relaxed);
    // a profile's trace names the host run and why, as the Python path's record_function does
    std::optional<at::RecordFunction> range;
    if (events::tap::on.load(std::memory_order_relaxed)) {
      range.emplace(at::RecordScope::USER_SCOPE);
      if (range->isActive()) {
        range->before("rbln::cpu_fallback(" + reason->key + ")");
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    struct Done {  // `cpu_fallback` with its duration, recorded however the run ends
      events::Counter* c;
      std::chrono::steady_clock::time_point t0;
      ~Done() {
        events::record(c, std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - t0).count());
      }
    } done{cpu_fallback_, t0};
    auto args = torch::jit::pop(*stack, n);
    std::vector<at::Tensor> inputs(n);  // host views of the positional rbln arguments
    for (size_t i = 0; i < n; ++i) {
      const auto& v = args[i];
      if (v.isTensor() && !schema.arguments()[i].kwarg_only()) {
        const auto& t = v.toTensor();
        if (t.defined() && t.is_privateuseone()) {
          StorageState* s = state_of(t);
          s->host_read();
          inputs[i] = s->host_alias(t);
        }
      }
    }
    torch::jit::Stack fn_stack = fn_stack_of(args, inputs);
    fn_.callBoxed(fn_stack);
    at::Tensor result = fn_stack.back().toTensor();
    if (mode_ == Mode::Functional) {  // results.wrap_result
      if (!spans_own_storage(result)) {
        result = result.clone(at::MemoryFormat::Contiguous);
      }
      stack->emplace_back(wrap_host(result, call.index));
      return;
    }
    const at::Tensor& out = args[out_arg_].toTensor();  // results.deliver_host (same shape)
    StorageState* s = state_for_write(out);
    s->host_write(spans(out, s->nbytes));
    s->host_alias(out).copy_(result);
    stack->emplace_back(out);
  }

  // the device program on device aliases, and its result delivered (device_op.kernel)
  void run(const c10::FunctionSchema& schema, torch::jit::Stack* stack, size_t n,
           const Call& call) {
    // the arguments stay on the stack until the result replaces them
    c10::ArrayRef<c10::IValue> args(stack->data() + stack->size() - n, n);
    bool widen = form_ == Form::Matmul && contains(widened_dtypes, call.dtype);
    if (widen) {  // rows of the left operand, per batch entry (executors.widens)
      const int src = fn_args_[left_];
      const at::Tensor* lhs = src >= 0 && args[src].isTensor() ? &args[src].toTensor() : nullptr;
      if (lhs != nullptr && lhs->defined() && lhs->is_privateuseone() && lhs->dim() >= 2) {
        const auto sizes = lhs->sizes();
        int64_t rows = 1;
        for (size_t d = 0; d + 1 < sizes.size(); ++d) {
          rows *= sizes[d];
        }
        if (batched_) {
          rows /= std::max<int64_t>(sizes[0], 1);
        }
        widen = rows >= widen_min_rows;
      }
    }
    // the program's operand aliases, per argument; a widened operand's half-precision bytes
    // are not taken (its kept fp32 form serves, below)
    c10::SmallVector<at::Tensor, 8> inputs(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& v = args[i];
      if (v.isTensor() && !schema.arguments()[i].kwarg_only()) {
        const auto& t = v.toTensor();
        if (t.defined() && t.is_privateuseone()) {
          inputs[i] = program_operand(t, widen);
        }
      }
    }
    // linear(input, weight, bias): a 2-D weight in the GEMM library's layout (executors.packs)
    const bool pack = linear_ && !widen && contains(packed_dtypes, call.dtype) &&
                      inputs.size() > 1 && inputs[1].defined() && inputs[1].dim() == 2;
    if (pack) {
      inputs[1] = state_of(args[1].toTensor())->device_input_packed(args[1].toTensor());
    }
    const int64_t t0 = events::span_start();  // the program: operands in, result out
    at::Tensor result;
    if (pack) {
      static const auto packed_linear =
          c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
      torch::jit::Stack pl{inputs[0], inputs[1],
                           inputs.size() > 2 && inputs[2].defined() ? c10::IValue(inputs[2])
                                                                    : c10::IValue(),
                           c10::IValue(std::string("none")),
                           c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue()};
      Depth depth;
      packed_linear.callBoxed(pl);
      result = pl.back().toTensor();
    } else {
      // this thread's scratch stack: a program runs no other program's run() (Depth), and the
      // stack keeps its capacity, so a call allocates none
      thread_local torch::jit::Stack fn_stack;
      struct Cleared {  // holds no operand after the call, however it ends
        torch::jit::Stack& s;
        ~Cleared() { s.clear(); }
      } cleared{fn_stack};
      fill_fn_stack(fn_stack, args, inputs);
      Depth depth;
      fn_.callBoxed(fn_stack);
      result = std::move(fn_stack.back()).toTensor();
    }
    if (widen && result.scalar_type() != call.dtype) {
      result = result.to(call.dtype);
    }
    for (const auto& a : inputs) {
      // an operand's device memory (or a view of it, which may be its storage's host view):
      // the output needs its own (a packed weight is memory of its own)
      if (a.defined() && !a.is_mkldnn() && (result.unsafeGetTensorImpl() == a.unsafeGetTensorImpl() ||
                          result.storage().data() == a.storage().data())) {
        result = result.clone();
        break;
      }
    }
    events::record_program(program_, call.index, t0);
    if (mode_ == Mode::Functional) {
      inputs.clear();
      torch::jit::drop(*stack, n);
      stack->emplace_back(new_device_result(std::move(result), call.index, &call.eager_raw));
      return;
    }
    const at::Tensor out = args[out_arg_].toTensor();
    inputs.clear();
    torch::jit::drop(*stack, n);
    if (out.sizes() != result.sizes()) {
      py::gil_scoped_acquire gil;
      (*python_deliver)(result, out, static_cast<int>(call.index));
    } else {
      StorageState* s = state_for_write(out);
      const bool whole = spans(out, s->nbytes);
      if (whole && result.scalar_type() == out.scalar_type() && result.strides() == out.strides() &&
          spans_own_storage(result)) {
        s->adopt_device(result);
      } else {
        s->device_write(whole);
        s->device_alias(out).copy_(result);
      }
    }
    stack->emplace_back(out);
  }

  // a program's operand (device_op.kernel): its device read, then its alias, or for a widening
  // program a half-precision operand's kept fp32 form (kept if read again)
  static at::Tensor program_operand(const at::Tensor& t, bool widen) {
    StorageState* s = state_of(t);
    s->device_read();
    if (widen && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16)) {
      return s->device_input_widened(t);
    }
    return s->device_input_alias(t);
  }

  // _scaled_dot_product_fused_attention_overrideable(q, k, v, attn_bias, dropout_p, is_causal,
  // return_debug_mask, *, scale): the calls the native program takes
  static bool plain_attention(c10::ArrayRef<c10::IValue> args) {
    if (args.size() < 8 || !args[0].isTensor() || args[0].toTensor().dim() != 4 ||
        !args[3].isNone() || !args[4].isDouble() || args[4].toDouble() != 0.0 ||
        !args[5].isBool() || !args[6].isBool() || args[6].toBool()) {
      return false;
    }
    return args[7].isNone() || args[7].isDouble();
  }

  // the attention program (executors.sdpa_forward without mask or dropout: the host's fused
  // kernel on the widened operands, the output rounded once) and its nine results delivered
  // (device_op.kernel, results.deliver_device)
  void run_attention(torch::jit::Stack* stack, size_t n, const Call& call) {
    auto args = torch::jit::pop(*stack, n);
    at::Tensor in[3];  // q, k, v: their kept widened forms, as the Python program reads them
    for (int i = 0; i < 3; ++i) {
      in[i] = program_operand(args[i].toTensor(), /*widen=*/true);
    }
    const bool is_causal = args[5].toBool();
    const double scale = args[7].isNone() ? 1.0 / std::sqrt(static_cast<double>(in[0].size(-1)))
                                          : args[7].toDouble();
    const int64_t t0 = events::span_start();
    at::Tensor out, lse;
    {
      Depth depth;
      std::tie(out, lse) = at::_scaled_dot_product_flash_attention_for_cpu(
          in[0], in[1], in[2], 0.0, is_causal, std::nullopt, scale);
      out = out.to(call.dtype);
    }
    const int64_t L = in[0].size(2), S = in[1].size(2);
    const auto i64 = at::TensorOptions().dtype(at::kLong);
    at::Tensor results[] = {out, lse, at::empty({0}, i64), at::empty({0}, i64),
                            at::empty({}, i64), at::empty({}, i64),
                            at::empty({0}, at::TensorOptions().dtype(call.dtype))};
    events::record_program(program_, call.index, t0);
    for (int i = 0; i < 4; ++i) {
      stack->emplace_back(new_device_result(std::move(results[i]), call.index));
    }
    stack->emplace_back(c10::SymInt(L));
    stack->emplace_back(c10::SymInt(S));
    for (int i = 4; i < 7; ++i) {
      stack->emplace_back(new_device_result(std::move(results[i]), call.index));
    }
  }

  // linear_backward(x, grad_output, weight, output_mask): executors.linear_backward. Where the
  // matrix units widen the dtype, the operands are read widened (a weight's kept form), the
  // GEMMs run in fp32 and each result rounds once; else the dtype's own GEMMs (fp32
  // accumulation). The three results delivered, an undefined one where the mask says so.
  void run_linear_backward(torch::jit::Stack* stack, size_t n, const Call& call) {
    auto args = torch::jit::pop(*stack, n);
    const bool widen = contains(widened_dtypes, call.dtype);
    const at::Tensor x = program_operand(args[0].toTensor(), widen);
    const at::Tensor gy = program_operand(args[1].toTensor(), widen);
    const at::Tensor w = program_operand(args[2].toTensor(), widen);
    const auto mask = args[3].toBoolList();
    const int64_t t0 = events::span_start();
    at::Tensor results[3];
    {
      Depth depth;
      const at::Tensor g = gy.reshape({-1, gy.size(-1)});
      auto rounded = [&](at::Tensor r) { return widen ? r.to(call.dtype) : r; };
      if (mask[0]) {
        auto shape = x.sizes().vec();
        shape.back() = w.size(-1);
        results[0] = at::_unsafe_view(rounded(at::mm(g, w)), shape);
      }
      if (mask[1]) {
        results[1] = rounded(at::mm(g.t(), x.reshape({-1, x.size(-1)})));
      }
      if (mask[2]) {
        results[2] = rounded(g.sum(0));
      }
    }
    events::record_program(program_, call.index, t0);
    for (auto& r : results) {
      stack->emplace_back(r.defined() ? new_device_result(std::move(r), call.index) : at::Tensor());
    }
  }

  struct Depth {
    Depth() { ++program_depth; }
    ~Depth() { --program_depth; }
  };

  c10::OperatorHandle fn_;
  Mode mode_;
  int out_arg_;
  std::vector<int> slots_, skip_dtype_;
  bool align64_;
  Form form_;
  // fn's arguments: the alias in `inputs` where there is one, else the registered op's own
  // argument, else fn's default
  torch::jit::Stack fn_stack_of(c10::ArrayRef<c10::IValue> args,
                                c10::ArrayRef<at::Tensor> inputs) const {
    torch::jit::Stack fn_stack;
    fill_fn_stack(fn_stack, args, inputs);
    return fn_stack;
  }

  void fill_fn_stack(torch::jit::Stack& fn_stack, c10::ArrayRef<c10::IValue> args,
                     c10::ArrayRef<at::Tensor> inputs) const {
    fn_stack.clear();
    fn_stack.reserve(fn_args_.size());
    const auto& fn_schema = fn_.schema();
    for (size_t j = 0; j < fn_args_.size(); ++j) {
      const int src = fn_args_[j];
      if (src < 0) {
        fn_stack.push_back(*fn_schema.arguments()[j].default_value());
      } else if (inputs[src].defined()) {
        fn_stack.emplace_back(inputs[src]);
      } else {
        fn_stack.push_back(args[src]);
      }
    }
  }

  std::vector<int> fn_args_;  // per argument of fn: the registered op's argument, or -1
  bool linear_;               // fn is aten::linear (its weight may be packed)
  int left_;                  // a matmul's left operand among fn's arguments
  bool batched_;              // ... and its first dimension is the batch (bmm)
  events::Counter* dispatch_;
  events::Counter* cpu_fallback_;
  events::Counter* warm_hit_;
  events::Counter* program_;
  std::mutex mutex_;
  std::unordered_map<uint64_t, std::vector<Program>> cache_;
};

std::vector<WarmKernel*>& kernels() {
  static auto* k = new std::vector<WarmKernel*>();
  return *k;
}

torch::Library& library() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

c10::OperatorHandle find_op(const std::string& name) {
  auto dot = name.find('.');
  std::string base = "aten::" + name.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
  if (overload == "default") {
    overload = "";
  }
  return c10::Dispatcher::singleton().findSchemaOrThrow(base.c_str(), overload.c_str());
}

}  // namespace

bool warm_path_on() {
  return enabled.load(std::memory_order_relaxed);
}

bool spans_whole_storage(const at::Tensor& t) {
  return spans_own_storage(t);
}

bool spans_bytes(const at::Tensor& t, int64_t nbytes) {
  return spans(t, nbytes);
}

at::Tensor new_device_result(at::Tensor result, c10::DeviceIndex index,
                             const char* const* eager_raw) {
  if (result.is_view() || !spans_own_storage(result)) {
    result = result.clone(at::MemoryFormat::Contiguous);
  }
  return new_device_tensor(result, result.numel() * static_cast<int64_t>(result.itemsize()), index,
                           eager_raw);
}

at::Tensor new_device_result(at::Tensor result, c10::DeviceIndex index) {
  return new_device_result(std::move(result), index, nullptr);
}

void bind_warm_path(py::module_& m) {
  m.def("warm_register",
        [](const std::string& name, const std::string& op_name, const std::string& fn_name,
           int mode, std::vector<int> slots, std::vector<int> skip_dtype, bool align64,
           int form, int left, bool batched) {
          auto op = find_op(name);
          auto fn = find_op(fn_name);
          const auto& args = op.schema().arguments();
          TORCH_CHECK(static_cast<Form>(form) == Form::Sdpa ||
                          static_cast<Form>(form) == Form::LinearBackward ||
                          (op.schema().returns().size() == 1 && fn.schema().returns().size() == 1),
                      name, ": the warm path serves ops with one result");
          TORCH_CHECK(static_cast<Form>(form) != Form::LinearBackward ||
                          (name == "linear_backward" && static_cast<Mode>(mode) == Mode::Functional),
                      name, ": the linear backward form serves aten::linear_backward");
          TORCH_CHECK(static_cast<Form>(form) != Form::Sdpa ||
                          (name == "_scaled_dot_product_fused_attention_overrideable" &&
                           static_cast<Mode>(mode) == Mode::Functional),
                      name, ": the attention form serves the device attention op");
          int out_arg = -1;
          if (static_cast<Mode>(mode) == Mode::Out) {
            for (size_t i = 0; i < args.size(); ++i) {
              if (args[i].kwarg_only() && args[i].alias_info() && args[i].alias_info()->isWrite()) {
                out_arg = static_cast<int>(i);
              }
            }
            TORCH_CHECK(out_arg >= 0, name, ": no out= argument");
          } else if (static_cast<Mode>(mode) == Mode::Inplace) {
            out_arg = 0;
          }
          std::vector<int> fn_args;
          for (const auto& fa : fn.schema().arguments()) {
            int src = -1;
            for (size_t i = 0; i < args.size(); ++i) {
              const bool is_out = static_cast<Mode>(mode) == Mode::Out && static_cast<int>(i) == out_arg;
              if (args[i].name() == fa.name() && !is_out) {
                src = static_cast<int>(i);
              }
            }
            TORCH_CHECK(src >= 0 || fa.default_value(), name, ": ", fn_name, "'s argument ",
                        fa.name(), " has no source");
            fn_args.push_back(src);
          }
          auto kernel = std::make_unique<WarmKernel>(op_name, fn, static_cast<Mode>(mode), out_arg,
                                                     std::move(slots), std::move(skip_dtype),
                                                     align64, static_cast<Form>(form),
                                                     std::move(fn_args), left, batched);
          kernels().push_back(kernel.get());
          library().impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)));
        },
        "Serve the device op `name` from the native warm path; its Python kernel must be "
        "registered on PrivateUse2.");
  m.def("warm_configure",
        [](std::vector<c10::ScalarType> dispatch, std::vector<c10::ScalarType> strict,
           std::vector<c10::ScalarType> widened, int64_t min_rows, py::object deliver,
           std::vector<c10::ScalarType> packed) {
          dispatch_dtypes = std::move(dispatch);
          strict_dtypes = std::move(strict);
          widened_dtypes = std::move(widened);
          packed_dtypes = std::move(packed);
          widen_min_rows = min_rows;
          if (python_deliver == nullptr) {
            python_deliver = new py::object();  // never freed: kernels may call it until exit
          }
          *python_deliver = std::move(deliver);
        });
  m.def("warm_clear", []() {
    generation.fetch_add(1, std::memory_order_acq_rel);
    for (auto* k : kernels()) {
      k->clear();
    }
  }, "Drop the warm path's programs (the program cache was dropped).");
  m.def("set_warm_path", [](bool on) { enabled.store(on); },
        "Take the warm path on cache hits (True) or always the Python path (False).");
  m.def("warm_path_enabled", []() { return enabled.load(); });
  m.def("warm_path_served", []() { return served.load(); },
        "Calls the warm path ran itself since the process started.");
  m.def("has_nonfinite", &has_nonfinite,
        "The NaN/Inf scan of an rbln tensor (rules.has_nonfinite; marks a finite storage).");
  m.def("warm_path_replayed", []() { return replayed.load(); },
        "CPU fallbacks the warm path replayed since the process started.");
  m.def("fallback_decided", [](const std::string& reason) {
    if (pending != nullptr) {
      pending->fallback = reason;
      pending = nullptr;
    }
  }, "The Python path sends this thread's pending call to the host for `reason` in the plain "
     "host form, a decision its key determines: the warm path may replay it.");
  m.def("enter_program", []() {
    if (pending != nullptr) {
      pending->ran = true;
      pending = nullptr;
    }
    return program_depth++;
  }, "A device program starts on this thread; returns the depth before it.");
  m.def("leave_program", [](int depth) { program_depth = depth; });
  m.def("program_depth", []() { return program_depth; });
}

}  // namespace torch_rbln
