#include "Storage.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/native/TensorFactories.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/COW.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "Allocator.h"
#include "Events.h"

namespace torch_rbln {

namespace {

// ------------------------------------------------------------------------------------------
// host pool: recycles host views by rounded size, so creating a tensor rarely calls malloc

class HostPool {
 public:
  static constexpr int64_t kRound = 64;
  static constexpr int64_t kLimit = int64_t(256) << 20;     // bytes kept in all
  static constexpr int64_t kLargest = int64_t(16) << 20;    // bigger views are not kept

  static int64_t rounded(int64_t nbytes) {
    int64_t r = (nbytes + kRound - 1) / kRound * kRound;
    return r < kRound ? kRound : r;
  }

  void* get(int64_t nbytes, int64_t* capacity) {
    const int64_t size = rounded(nbytes);
    *capacity = size;
    if (has_deferred_.load(std::memory_order_relaxed)) {
      take_back_reached();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        bytes_ -= size;
        return p;
      }
    }
    return fresh(size);
  }

  // new memory; a view of a page or more starts on a page, so that its whole pages (those a
  // release gives back) do not depend on where malloc happened to place it
  static void* fresh(int64_t size) {
    static const auto page = static_cast<int64_t>(sysconf(_SC_PAGESIZE));
    void* p = nullptr;
    if (size >= page && posix_memalign(&p, static_cast<size_t>(page), size) == 0) {
      return p;  // freed as c10::alloc_cpu's memory is (c10::free_cpu: free)
    }
    return c10::alloc_cpu(size);
  }

  // `p` is reusable once every point of `uses` is reached (record_stream)
  void put_after(void* p, int64_t size, std::vector<QueuePoint> uses) {
    std::lock_guard<std::mutex> lock(mutex_);
    deferred_.push_back(Deferred{p, size, std::move(uses)});
    has_deferred_.store(true, std::memory_order_relaxed);
  }

  void put(void* p, int64_t size) {
    if (size <= kLargest) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (bytes_ + size <= kLimit) {
        free_[size].push_back(p);
        bytes_ += size;
        return;
      }
    }
    c10::free_cpu(p);
  }

  void take_back_reached() {
    std::vector<Deferred> reached;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      size_t kept = 0;
      for (size_t i = 0; i < deferred_.size(); ++i) {
        auto& d = deferred_[i];
        bool done = true;
        for (const auto& p : d.uses) {
          done = done && point_reached(p);
        }
        if (done) {
          reached.push_back(std::move(d));
        } else {
          if (kept != i) {  // a self-move would empty the entry's points
            deferred_[kept] = std::move(d);
          }
          ++kept;
        }
      }
      deferred_.resize(kept);
      has_deferred_.store(kept != 0, std::memory_order_relaxed);
    }
    for (auto& d : reached) {
      put(d.p, d.size);
    }
  }

  void clear() {
    std::unordered_map<int64_t, std::vector<void*>> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      drop.swap(free_);
      bytes_ = 0;
    }
    for (auto& [size, list] : drop) {
      for (void* p : list) {
        c10::free_cpu(p);
      }
    }
  }

 private:
  std::mutex mutex_;
  struct Deferred {
    void* p;
    int64_t size;
    std::vector<QueuePoint> uses;
  };
  std::unordered_map<int64_t, std::vector<void*>> free_;
  std::vector<Deferred> deferred_;   // freed, waiting for recorded streams
  std::atomic<bool> has_deferred_{false};
  int64_t bytes_ = 0;
};

HostPool& host_pool() {
  static auto* pool = new HostPool();  // never destroyed: storages may die at exit
  return *pool;
}

void release_state(void* ctx) {
  delete static_cast<StorageState*>(ctx);
}

events::Counter* h2d_counter() {
  static events::Counter* c = events::counter("h2d", "");
  return c;
}

events::Counter* d2h_counter() {
  static events::Counter* c = events::counter("d2h", "");
  return c;
}

events::Counter* v2v_counter() {
  static events::Counter* c = events::counter("v2v", "");
  return c;
}

void copy_bytes(void* dst, const void* src, int64_t n) {
  constexpr int64_t kGrain = int64_t(1) << 20;
  if (dst == src) {  // one memory for both sides
    return;
  }
  if (n <= 4 * kGrain) {
    if (n > 0) {
      std::memcpy(dst, src, n);
    }
    return;
  }
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
  });
}

c10::Storage cpu_storage_over(void* data, int64_t nbytes) {
  // not resizable: a CPU kernel that tries to resize an alias fails loudly instead of moving
  // the memory under the rbln storage
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                      c10::DataPtr(data, c10::Device(c10::kCPU)), /*allocator=*/nullptr,
                      /*resizable=*/false);
}

// A CPU storage over `st`'s memory that keeps `st` alive: an alias made over a block's memory
// stays valid when the storage's host view replaces that memory (StorageState::share_host_view)
c10::Storage cpu_storage_holding(const c10::Storage& st) {
  auto* held = new c10::Storage(st);
  return c10::Storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(st.nbytes()),
                      c10::DataPtr(st.mutable_data(), held,
                                   [](void* p) { delete static_cast<c10::Storage*>(p); },
                                   c10::Device(c10::kCPU)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

// A CPU tensor over `storage`. Always a normal tensor, even under inference mode: aliases may be
// cached and outlive the call, and be written outside inference mode.
at::Tensor tensor_over(const c10::Storage& storage, c10::ScalarType dtype, c10::IntArrayRef sizes,
                       c10::IntArrayRef strides, int64_t offset) {
  std::optional<c10::InferenceMode> normal;
  if (c10::InferenceMode::is_enabled()) {
    normal.emplace(false);
  }
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

// `t`'s metadata and lazy conjugate / negative bits over `storage`
at::Tensor alias_of(const at::Tensor& t, const c10::Storage& storage) {
  auto a = tensor_over(storage, t.scalar_type(), t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) {
    a.unsafeGetTensorImpl()->_set_conj(true);
  }
  if (t.is_neg()) {
    a.unsafeGetTensorImpl()->_set_neg(true);
  }
  return a;
}

// a shared alias with `t`'s lazy bits (a fresh tensor over the same memory if it has any)
at::Tensor with_lazy_bits(const at::Tensor& t, const at::Tensor& shared) {
  if (!t.is_conj() && !t.is_neg()) {
    return shared;
  }
  auto a = tensor_over(shared.storage(), shared.scalar_type(), shared.sizes(), shared.strides(),
                       shared.storage_offset());
  a.unsafeGetTensorImpl()->_set_conj(t.is_conj());
  a.unsafeGetTensorImpl()->_set_neg(t.is_neg());
  return a;
}

void* memory_data(const at::Tensor& memory) {
  return memory.storage().mutable_data();
}

constexpr size_t kInputAliases = 8;  // aliases kept per storage (a KV cache has many views)

std::mutex adopt_mutex;

StorageState* adopt(const c10::Storage& storage) {
  std::lock_guard<std::mutex> lock(adopt_mutex);
  const c10::DataPtr& dp = storage.data_ptr();
  if (dp.get_deleter() == &release_state) {  // adopted meanwhile by another thread
    return static_cast<StorageState*>(dp.get_context());
  }
  TORCH_CHECK_TYPE(storage.device_type() == c10::DeviceType::PrivateUse1,
                   "expected an rbln storage, got one on ", storage.device());
  auto* impl = storage.unsafeGetStorageImpl();
  const c10::DeviceIndex index = storage.device().has_index() ? storage.device().index() : 0;
  void* data = impl->mutable_data();
  const auto nbytes = static_cast<int64_t>(impl->nbytes());
  auto* s = new StorageState(index, nbytes, data, nbytes, /*pooled=*/false);
  s->adopted = true;
  // the storage keeps its memory; the original DataPtr (and what it owns) now lives in the state
  s->host_original = impl->set_data_ptr(c10::DataPtr(
      data, s, &release_state, c10::Device(c10::DeviceType::PrivateUse1, index)));
  return s;
}

bool (*eager_parser)(const char*) = nullptr;

std::atomic<int64_t> live_states{0};
std::atomic<int64_t> released_total{0};

// the whole pages inside [p, p + n)
std::pair<char*, int64_t> whole_pages(void* p, int64_t n) {
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const auto hi = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(n)) / page * page;
  return {reinterpret_cast<char*>(lo), hi > lo ? static_cast<int64_t>(hi - lo) : 0};
}

bool contiguous_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] != 1 && strides[i] != expected) {
      return false;
    }
    expected *= sizes[i];
  }
  return true;
}

// fp32 -> half-precision, as copy_ rounds (to nearest even); exact for values widened from
// that dtype. Outside the dispatcher: no mode or listener sees it (it is no op of the program)
template <typename T>
void narrow_into(T* dst, const float* src, int64_t n) {
  at::parallel_for(0, n, int64_t(1) << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      dst[i] = static_cast<T>(src[i]);
    }
  });
}

// torch.profiler(profile_memory=True) sees each rbln storage come and go, as CUDA's allocator
// reports its blocks (the totals are the arena's); one thread-local check while none records
void report_to_profiler(void* ptr, int64_t nbytes, c10::DeviceIndex index) {
  if (!c10::memoryProfilingEnabled()) {
    return;
  }
  const ArenaStats s = claim(index).stats();
  c10::reportMemoryUsageToProfiler(ptr, nbytes, static_cast<size_t>(s.allocated.current),
                                   static_cast<size_t>(s.reserved.current),
                                   c10::Device(c10::DeviceType::PrivateUse1, index));
}

}  // namespace

// ------------------------------------------------------------------------------------------
// StorageState

StorageState::StorageState(c10::DeviceIndex index_, int64_t nbytes_, void* host_,
                           int64_t host_capacity_, bool pooled_)
    : index(index_), nbytes(nbytes_), host(host_), host_capacity(host_capacity_), pooled(pooled_) {
  live_states.fetch_add(1, std::memory_order_relaxed);
  report_to_profiler(host, nbytes, index);
}

StorageState::~StorageState() {
  try {
    settle();   // the memory goes back to the pool: nothing may still write it
  } catch (...) {
  }
  if (cow != nullptr) {  // the last lazy clone sharing it died unwritten
    forget_cow(this);
  }
  live_states.fetch_sub(1, std::memory_order_relaxed);
  // released pages go back to the pool as they are (fresh memory's contents are unspecified)
  released_total.fetch_sub(released_, std::memory_order_relaxed);
  try {
    report_to_profiler(host, -nbytes, index);
  } catch (...) {
  }
  inputs_.clear();
  device_cpu_ = c10::Storage();
  host_cpu_ = c10::Storage();
  // record_stream: the work queued so far on each recorded stream may still use the memory
  std::vector<QueuePoint> uses;
  for (const auto& s : recorded_streams) {
    QueuePoint p = stream_point(s);
    if (!point_reached(p)) {
      uses.push_back(p);
    }
  }
  try {
    if (block) {
      claim(index).free(std::move(*block), uses);
    }
  } catch (...) {  // nothing to report to at teardown
  }
  if (pooled) {
    if (uses.empty()) {
      host_pool().put(host, host_capacity);
    } else {
      host_pool().put_after(host, host_capacity, std::move(uses));
    }
  }
}

void record_stream(at::Tensor& t, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "record_stream on an rbln tensor expects an rbln stream, got ", stream);
  TORCH_CHECK(stream.device_index() == t.device().index(), "record_stream: the stream is on ",
              stream.device(), ", the tensor on ", t.device());
  stream_point(stream);   // validates the stream id
  StorageState* s = state_of(t);
  for (const auto& r : s->recorded_streams) {
    if (r == stream) {
      return;
    }
  }
  s->recorded_streams.push_back(stream);
}

void StorageState::wait_pending() {
  wait_point(pending);
  pending = QueuePoint();
  pending_source = c10::Storage();
}

const c10::Storage& StorageState::host_cpu_storage() {
  restore_host();
  catch_up_host();
  return host_storage();
}

const c10::Storage& StorageState::host_storage() {
  if (!host_cpu_) {
    host_cpu_ = cpu_storage_over(host, host_capacity);
  }
  return host_cpu_;
}

const c10::Storage& StorageState::device_cpu_storage() {
  restore_host();  // the device memory may be the host view
  if (!device_cpu_) {
    device_cpu_ = cpu_storage_holding(block->memory.storage());
  }
  return device_cpu_;
}

void StorageState::device_memory_changed() {
  drop_released();  // a program's output replaces the contents (adopt_device)
  device_memory_moved();
  widened_.clear();
  packed_.clear();
}

void StorageState::device_memory_moved() {
  inputs_.clear();
  device_cpu_ = c10::Storage();
}

void StorageState::share_host_view() {
  if (!block) {
    block = claim(index).malloc(nbytes, /*with_memory=*/false);
  }
  if (!block->lent) {
    claim(index).lend(*block, tensor_over(host_storage(), at::kByte, {nbytes}, {1}, 0));
    device_memory_moved();  // the same bytes elsewhere: the widened forms stay
  }
}

bool StorageState::shares_host_view() const {
  return block.has_value() && block->lent;
}

void StorageState::contents_changed(bool whole) {
  if (whole) {
    drop_released();
  } else {
    restore_host();  // the widened form that gives the bytes back is dropped below
  }
  restored_ = false;
  finite_dtype.reset();
  widened_.clear();
  packed_.clear();
  // widened again and again before this write (a weight between optimizer steps): the next
  // contents are kept from their first widening
  reread_ = widen_reads_ >= 2;
  widen_reads_ = 0;
}

const StorageState::CachedInput* StorageState::whole_widened() const {
  for (const auto& e : widened_) {
    if (e.offset == 0 && e.alias.is_contiguous() &&
        e.alias.numel() * static_cast<int64_t>(c10::elementSize(e.dtype)) == nbytes &&
        contiguous_strides(e.sizes, e.strides)) {
      return &e;
    }
  }
  return nullptr;
}

// Any tensor or storage over the host view's memory (or over the device memory's CPU storage
// made over it) that the state does not hold itself: a reader that would not pass restore_host.
bool StorageState::aliased_outside() const {
  if (!host_cpu_ || !block || !block->lent) {
    return true;
  }
  int64_t own = 2;  // host_cpu_ and the lent block's memory
  if (block->memory.use_count() != 1) {
    return true;
  }
  if (device_cpu_) {
    own += 1;  // device_cpu_ holds the block's memory's storage
    if (device_cpu_.use_count() != 1 + static_cast<int64_t>(inputs_.size())) {
      return true;
    }
    for (const auto& e : inputs_) {
      if (e.alias.use_count() != 1) {
        return true;
      }
    }
  } else if (!inputs_.empty()) {
    return true;
  }
  return host_cpu_.use_count() != own;
}

// Releases the host view's whole pages where a kept fp32 form covers the storage, the scan
// found it finite as that form's dtype (no NaN: narrowing gives back the very bits), the host
// view is the pool's memory (no other allocation shares its pages) and serves as the device
// memory, and no alias of it is held outside the state. Once narrowed back, the bytes stay until
// the next write: a weight other routes read too is not released again and again.
void StorageState::try_release_host() {
  if (released_ != 0 || restored_ || !pooled || adopted || static_cast<bool>(host_owner) ||
      !shares_host_view() || static_cast<bool>(pending)) {
    return;
  }
  const CachedInput* e = whole_widened();
  if (e == nullptr || finite_dtype != e->dtype ||
      (e->dtype != at::kHalf && e->dtype != at::kBFloat16) || aliased_outside()) {
    return;
  }
  const auto [start, n] = whole_pages(host, host_capacity);
  if (n == 0 || madvise(start, static_cast<size_t>(n), MADV_DONTNEED) != 0) {
    return;
  }
  released_ = n;
  released_total.fetch_add(n, std::memory_order_relaxed);
}

// narrows the whole widened form back into the host view (records nothing: no transfer)
void StorageState::regenerate_host() {
  const CachedInput* e = whole_widened();
  TORCH_INTERNAL_ASSERT(e != nullptr, "released host bytes without their widened form");
  const float* src = e->alias.const_data_ptr<float>();
  const int64_t n = e->alias.numel();
  if (e->dtype == at::kHalf) {
    narrow_into(static_cast<c10::Half*>(host), src, n);
  } else {
    narrow_into(static_cast<c10::BFloat16*>(host), src, n);
  }
  drop_released();
  restored_ = true;
}

void StorageState::drop_released() {
  if (released_ != 0) {
    released_total.fetch_sub(released_, std::memory_order_relaxed);
    released_ = 0;
  }
}

void StorageState::ensure_device_memory() {
  settle();
  if (!block || !block->memory.defined()) {
    share_host_view();  // booked now; the host view serves as its memory
  }
}

// h2d: the device's bytes become the host view's. Device memory of its own (a program's output
// the host has overwritten since) is let go: the host view serves as the device memory.
void StorageState::push() {
  const int64_t t0 = events::span_start();
  share_host_view();
  events::record_copy(h2d_counter(), nbytes, index, t0);
}

// d2h: the host view takes the device's bytes, then serves as the device memory (the program
// output that held them is let go)
void StorageState::pull() {
  const int64_t t0 = events::span_start();
  if (!block->lent) {
    copy_bytes(host, memory_data(block->memory), nbytes);
    share_host_view();
  }
  events::record_copy(d2h_counter(), nbytes, index, t0);
}

void StorageState::catch_up_host() {
  if (host_behind_) {
    host_behind_ = false;
    copy_bytes(host, memory_data(block->memory), nbytes);
    share_host_view();
  }
}

bool StorageState::host_read_deferred() {
  settle();
  if (residency == Residency::Device) {
    events::record_copy(d2h_counter(), nbytes, index, 0);  // the bytes move later, in place
    residency = Residency::Synced;
    host_behind_ = !shares_host_view();  // one memory: nothing to move
  }
  return host_behind_;
}

void StorageState::host_read() {
  settle();
  restore_host();  // raw readers of `host` follow (resize)
  catch_up_host();
  if (residency == Residency::Device) {
    pull();
    residency = Residency::Synced;
  }
}

void StorageState::host_write(bool whole) {
  settle();
  contents_changed(whole);
  if (!whole) {
    catch_up_host();
  }
  host_behind_ = false;
  if (residency == Residency::Device && !whole) {
    pull();
  }
  residency = Residency::Host;
}

void StorageState::device_read() {
  settle();
  if (residency == Residency::Host) {
    push();
    residency = Residency::Synced;
  } else if (!has_device_memory()) {  // Synced / Device always have memory
    ensure_device_memory();
  }
}

void StorageState::device_write(bool whole) {
  settle();
  contents_changed(whole);
  host_behind_ = false;
  if (residency == Residency::Host && !whole) {
    push();
  } else {
    ensure_device_memory();
  }
  residency = Residency::Device;
}

void StorageState::adopt_device(at::Tensor memory) {
  settle();
  if (!block) {
    block = claim(index).malloc(nbytes, /*with_memory=*/false);
  }
  if (block->lent) {
    claim(index).take_own(*block, std::move(memory));  // the host view keeps its bytes
  } else {
    block->memory = std::move(memory);
  }
  device_memory_changed();
  host_behind_ = false;
  residency = Residency::Device;
  contents_changed(/*whole=*/true);
}

at::Tensor StorageState::host_alias(const at::Tensor& t) {
  settle();
  return alias_of(t, host_cpu_storage());
}

at::Tensor StorageState::device_alias(const at::Tensor& t) {
  settle();
  return alias_of(t, device_cpu_storage());
}

at::Tensor StorageState::device_input_alias(const at::Tensor& t) {
  settle();
  restore_host();
  const at::Tensor& mem = block->memory;
  const auto dtype = t.scalar_type();
  const int64_t offset = t.storage_offset();
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  if (mem.scalar_type() == dtype && offset == 0 && mem.sizes() == sizes && mem.strides() == strides) {
    return with_lazy_bits(t, mem);
  }
  for (const auto& e : inputs_) {
    if (e.dtype == dtype && e.offset == offset && sizes.equals(e.sizes) && strides.equals(e.strides)) {
      return with_lazy_bits(t, e.alias);
    }
  }
  if (inputs_.size() >= kInputAliases) {
    inputs_.clear();
  }
  auto a = tensor_over(device_cpu_storage(), dtype, sizes, strides, offset);
  inputs_.push_back({dtype, sizes.vec(), strides.vec(), offset, a});
  return with_lazy_bits(t, a);
}

at::Tensor StorageState::device_input_widened(const at::Tensor& t) {
  settle();
  const auto dtype = t.scalar_type();
  const int64_t offset = t.storage_offset();
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  // every widening read counts, those the kept form serves too: a weight read once in the
  // forward (widened, kept) and once in the backward (served) is read twice per write, so its
  // next contents are kept from their first widening as well (the count stops at 2: only
  // "read again" matters)
  widen_reads_ = std::min(widen_reads_ + 1, 2);
  for (const auto& e : widened_) {  // the kept form: the half-precision bytes are not read
    if (e.dtype == dtype && e.offset == offset && sizes.equals(e.sizes) && strides.equals(e.strides)) {
      at::Tensor w = e.alias;
      try_release_host();
      return w;
    }
  }
  at::Tensor w = device_input_alias(t).to(at::kFloat);
  // read again before any write: keep it. Not a lazily negated view's form: its values are not
  // the storage's (the kept forms are found, and the released bytes narrowed back, by metadata)
  if ((widen_reads_ >= 2 || reread_) && !t.is_neg() && !t.is_conj()) {
    if (widened_.size() >= kInputAliases) {
      restore_host();  // the evicted form may be the one the released bytes come back from
      widened_.erase(widened_.begin());
    }
    widened_.push_back({dtype, sizes.vec(), strides.vec(), offset, w});
    try_release_host();
  }
  return w;
}

at::Tensor StorageState::device_input_packed(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  const int64_t offset = t.storage_offset();
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (const auto& e : packed_) {
    if (e.dtype == dtype && e.offset == offset && sizes.equals(e.sizes) && strides.equals(e.strides)) {
      return e.alias;
    }
  }
  static const auto reorder = c10::Dispatcher::singleton()
      .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
      .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  at::Tensor packed = reorder.call(device_input_alias(t).contiguous(), std::nullopt);
  if (packed_.size() >= kInputAliases) {
    packed_.erase(packed_.begin());
  }
  packed_.push_back({dtype, sizes.vec(), strides.vec(), offset, packed});
  return packed;
}

int64_t StorageState::packed_bytes() const {
  int64_t n = 0;
  for (const auto& e : packed_) {
    n += static_cast<int64_t>(e.alias.numel() * e.alias.element_size());
  }
  return n;
}

int64_t StorageState::widened_bytes() const {
  int64_t n = 0;
  for (const auto& e : widened_) {
    n += static_cast<int64_t>(e.alias.storage().nbytes());
  }
  return n;
}

at::Tensor StorageState::host_flat(c10::ScalarType dtype) {
  settle();
  host_cpu_storage();  // the host view's bytes restored and caught up
  const int64_t n = nbytes / static_cast<int64_t>(c10::elementSize(dtype));
  return tensor_over(cpu_storage_over(host, nbytes), dtype, {n}, {1}, 0);
}

at::Tensor StorageState::host_bytes() {
  settle();
  return tensor_over(host_cpu_storage(), at::kByte, {nbytes}, {1}, 0);
}

at::Tensor StorageState::device_bytes() {
  settle();
  return tensor_over(device_cpu_storage(), at::kByte, {nbytes}, {1}, 0);
}

// ------------------------------------------------------------------------------------------

StorageState* state_of(const c10::Storage& storage) {
  const c10::DataPtr& dp = storage.data_ptr();
  if (C10_LIKELY(dp.get_deleter() == &release_state)) {
    return static_cast<StorageState*>(dp.get_context());
  }
  if (c10::impl::cow::is_cow_data_ptr(dp)) {  // a lazy clone sharing its memory
    return cow_state(storage);
  }
  return adopt(storage);
}

c10::DataPtr owning_data_ptr(StorageState* s) {
  return c10::DataPtr(s->host, s, &release_state, c10::Device(c10::DeviceType::PrivateUse1, s->index));
}

c10::DataPtr copy_of(StorageState& s) {
  s.settle();
  if (s.residency == Residency::Host || s.nbytes == 0) {
    c10::DataPtr dp = new_host_view(s.nbytes, s.index);
    s.host_read();  // released pages narrowed back (host-latest: nothing moves)
    copy_bytes(dp.get(), s.host, s.nbytes);
    return dp;
  }
  const int64_t t0 = events::span_start();
  s.device_read();
  c10::DataPtr dp = device_data_ptr(s.device_bytes().clone(), s.nbytes, s.index);
  events::record_copy(v2v_counter(), s.nbytes, s.index, t0);
  return dp;
}

bool fill_uninitialized_memory() {
  const auto& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

void fill_uninitialized(const at::Tensor& t, bool fresh) {
  if (t.numel() == 0) {
    return;
  }
  StorageState* s = state_for_write(t);
  at::Tensor alias;
  if (fresh || s->residency == Residency::Device) {
    // nothing older to keep in a fresh storage: a whole write, no push
    s->device_write(fresh || covers(t, *s));
    alias = s->device_alias(t);
  } else {
    s->host_write(covers(t, *s));
    alias = s->host_alias(t);
  }
  at::native::fill_empty_deterministic_(alias);
}

bool covers(const at::TensorBase& t, const StorageState& s) {
  return t.storage_offset() == 0 && t.is_contiguous() &&
      t.numel() * static_cast<int64_t>(t.itemsize()) == s.nbytes;
}

int64_t storage_nbytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t itemsize) {
  int64_t n = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      return 0;
    }
    n += (sizes[i] - 1) * strides[i];
  }
  return n * itemsize;
}

c10::DataPtr new_host_view(int64_t nbytes, c10::DeviceIndex index) {
  claim(index);
  int64_t capacity = 0;
  void* host = host_pool().get(nbytes, &capacity);
  auto* s = new StorageState(index, nbytes, host, capacity, /*pooled=*/true);
  c10::DataPtr dp(host, s, &release_state, c10::Device(c10::DeviceType::PrivateUse1, index));
  if (eager_malloc()) {
    s->ensure_device_memory();  // an out-of-memory error frees the host view again (dp)
  }
  return dp;
}

namespace {
at::Tensor tensor_on(c10::DataPtr data, int64_t nbytes, c10::ScalarType dtype,
                     c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), allocator(),
      /*resizable=*/true));
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}
}  // namespace

at::Tensor new_tensor(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                      c10::DeviceIndex index) {
  AllocationDevice on(index);
  return at::detail::empty_strided_generic(
      sizes, strides, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
}

at::Tensor new_device_tensor(const at::Tensor& memory, int64_t nbytes, c10::DeviceIndex index,
                             const char* const* eager_raw) {
  return tensor_on(device_data_ptr(memory, nbytes, index, eager_raw), nbytes, memory.scalar_type(),
                   memory.sizes(), memory.strides(), 0);
}

c10::DataPtr device_data_ptr(const at::Tensor& memory, int64_t nbytes, c10::DeviceIndex index,
                             const char* const* eager_raw) {
  Arena& arena = claim(index);
  // the output's memory is the host view too (one physical copy, as wrap_host's): a later d2h
  // records its transfer and moves no bytes
  const c10::Storage& ms = memory.storage();
  void* host = ms.mutable_data();
  auto* s = new StorageState(index, nbytes, host, static_cast<int64_t>(ms.nbytes()),
                             /*pooled=*/false);
  s->host_owner = ms;
  c10::DataPtr dp(host, s, &release_state, c10::Device(c10::DeviceType::PrivateUse1, index));
  // the variable is validated as at every allocation, but an adopted output is booked now
  // either way (with or without it, the arena's statistics move alike)
  if (eager_raw != nullptr) {
    eager_malloc_of(*eager_raw);
  } else {
    eager_malloc();
  }
  s->block = arena.malloc(nbytes, /*with_memory=*/false);
  s->block->memory = memory;  // booked with the output's memory (its caching at the free) ...
  arena.lend(*s->block, memory);  // ... which the host view is
  s->residency = Residency::Device;
  return dp;
}

at::Tensor wrap_host(const at::Tensor& cpu, c10::DeviceIndex index) {
  claim(index);
  const c10::Storage& cs = cpu.storage();
  const auto nbytes = static_cast<int64_t>(cs.nbytes());
  void* data = cs.mutable_data();
  auto* s = new StorageState(index, nbytes, data, nbytes, /*pooled=*/false);
  s->host_owner = cs;
  c10::DataPtr dp(data, s, &release_state, c10::Device(c10::DeviceType::PrivateUse1, index));
  if (eager_malloc()) {
    s->ensure_device_memory();
  }
  return tensor_on(std::move(dp), nbytes, cpu.scalar_type(), cpu.sizes(), cpu.strides(),
                   cpu.storage_offset());
}

void host_pool_clear() {
  host_pool().clear();
}

int64_t released_host_bytes() {
  return released_total.load();
}

int64_t live_storage_states() {
  return live_states.load();
}

bool eager_malloc() {
  return eager_malloc_of(std::getenv("TORCH_RBLN_EAGER_MALLOC"));
}

bool eager_malloc_of(const char* raw) {
  if (raw == nullptr) {
    return false;
  }
  // the last value read, per thread: parsing happens again only when the variable changes
  thread_local std::string last_raw;
  thread_local bool last_value = false;
  thread_local bool cached = false;
  if (cached && last_raw == raw) {
    return last_value;
  }
  bool value = eager_parser != nullptr ? eager_parser(raw) : std::strcmp(raw, "1") == 0;
  last_raw = raw;
  last_value = value;
  cached = true;
  return value;
}

void set_eager_malloc_parser(bool (*parse)(const char* raw)) {
  eager_parser = parse;
}

}  // namespace torch_rbln
