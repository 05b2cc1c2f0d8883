#include "PinnedAllocator.h"

#include <cstring>
#include <map>
#include <mutex>

#include <c10/core/impl/alloc_cpu.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace torch_rbln {
namespace {

std::mutex mu;
std::map<uintptr_t, size_t> blocks;   // start -> size of every live pinned block
at::HostStats stats;

void release(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it != blocks.end()) {
      stats.active_requests.decrease(1);
      stats.active_bytes.decrease(it->second);
      stats.allocations.decrease(1);
      stats.allocated_bytes.decrease(it->second);
      stats.num_host_free += 1;
      blocks.erase(it);
    }
  }
  c10::free_cpu(ptr);
}

// Not a caching allocator: a block goes back to the system when its storage dies. A
// non_blocking copy from a pinned block must therefore keep the source storage alive until
// the copy has run (which also makes record_event unnecessary).
struct PinnedAllocator final : public at::HostAllocator {
  at::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(mu);
      blocks.emplace(reinterpret_cast<uintptr_t>(data), nbytes);
      stats.active_requests.increase(1);
      stats.active_bytes.increase(nbytes);
      stats.allocations.increase(1);
      stats.allocated_bytes.increase(nbytes);
      stats.num_host_alloc += 1;
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}   // nothing is cached
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mu);
    return stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mu);
    for (c10::CachingAllocator::Stat* s : {&stats.active_requests, &stats.active_bytes,
                                           &stats.allocations, &stats.allocated_bytes}) {
      s->reset_accumulated();
    }
    stats.num_host_alloc = stats.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mu);
    for (c10::CachingAllocator::Stat* s : {&stats.active_requests, &stats.active_bytes,
                                           &stats.allocations, &stats.allocated_bytes}) {
      s->reset_peak();
    }
  }
};

PinnedAllocator allocator;
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &allocator)

}  // namespace

at::HostAllocator* pinned_allocator() { return &allocator; }

bool is_pinned(const void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mu);
  auto it = blocks.upper_bound(p);   // the first block starting after p
  if (it == blocks.begin()) {
    return false;
  }
  --it;
  return p < it->first + it->second;
}

void bind_pinned_allocator(py::module_& m) {
  m.def("_pinned_memory_stats", [] {
    at::HostStats s = allocator.get_stats();
    py::dict d;
    d["active_requests"] = s.active_requests.current;
    d["active_bytes"] = s.active_bytes.current;
    d["active_bytes.peak"] = s.active_bytes.peak;
    d["num_host_alloc"] = s.num_host_alloc;
    d["num_host_free"] = s.num_host_free;
    return d;
  });
  m.def("_pinned_memory_reset_peak", [] { allocator.reset_peak_stats(); });
  m.def("_pinned_memory_reset_accumulated", [] { allocator.reset_accumulated_stats(); });
}

}  // namespace torch_rbln
