#include "Arena.h"

#include <ATen/EmptyTensor.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

namespace torch_rbln {

namespace {

std::string fmt_bytes(int64_t n) {
  static const struct {
    const char* unit;
    int64_t div;
  } units[] = {{"GiB", int64_t(1) << 30}, {"MiB", int64_t(1) << 20}, {"KiB", int64_t(1) << 10}};
  for (const auto& u : units) {
    if (n >= u.div) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.2f %s", double(n) / double(u.div), u.unit);
      return buf;
    }
  }
  return std::to_string(n) + " bytes";
}

bool all_reached(const std::vector<QueuePoint>& points) {
  for (const auto& p : points) {
    if (!point_reached(p)) {
      return false;
    }
  }
  return true;
}

bool reusable(const at::Tensor& m, int64_t size) {
  return m.defined() && m.scalar_type() == at::kByte && m.numel() == size && m.is_contiguous();
}

}  // namespace

Block Arena::malloc(int64_t nbytes, bool with_memory) {
  const int64_t size = round_block(nbytes);
  // memory let go of here is destroyed after the lock is released (a tensor's teardown may
  // need the GIL, which a thread waiting for this lock may hold)
  at::Tensor dropped;
  std::vector<at::Tensor> released;
  std::vector<QueuePoint> waits;  // before the second try: the recorded streams' work
  for (bool retried = false;; retried = true) {
    for (const auto& p : waits) {  // without the lock: that work may allocate
      wait_point(p);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!deferred_.empty()) {
      take_back_reached_locked(released);
    }
    auto it = cache_.find(size);
    if (it != cache_.end() && !it->second.empty()) {
      at::Tensor mem = std::move(it->second.back());
      it->second.pop_back();
      stats_.cached -= size;
      stats_.allocated.add(size);
      stats_.active.add(size);
      if (!mem.defined()) {  // cached without memory: made below when asked for
        stats_.borrowed -= size;
      } else if (with_memory) {
        return Block{size, std::move(mem)};
      }
      dropped = std::move(mem);
      break;
    }
    if (stats_.reserved.current + size > capacity_ && stats_.cached) {
      stats_.num_alloc_retries += 1;
      for (auto& m : release_cache_locked()) {
        released.push_back(std::move(m));
      }
    }
    if (stats_.reserved.current + size > capacity_) {
      if (!retried && !deferred_.empty()) {
        // as CUDA's allocator before it gives up: blocks freed while a recorded stream may
        // still use them come back once that work is done, then the request is tried again
        for (const auto& d : deferred_) {
          waits.insert(waits.end(), d.uses.begin(), d.uses.end());
        }
        continue;
      }
      stats_.num_ooms += 1;
      out_of_memory(size);
    }
    stats_.reserved.add(size);
    stats_.allocated.add(size);
    stats_.active.add(size);
    stats_.num_device_alloc += 1;
    if (stats_.reserved.current > stats_.reserved_peak_ever) {
      stats_.reserved_peak_ever = stats_.reserved.current;
    }
    break;
  }
  if (!with_memory) {
    return Block{size, at::Tensor()};
  }
  return Block{size, at::detail::empty_cpu({size}, at::kByte)};
}

void Arena::out_of_memory(int64_t size) {
  const auto& s = stats_;
  TORCH_CHECK_WITH(OutOfMemoryError, false,
      "RBLN out of memory on rbln:", int(index_), ": tried to allocate ", fmt_bytes(size), " (",
      size, " bytes); device capacity ", fmt_bytes(capacity_), " (", capacity_, " bytes), ",
      fmt_bytes(s.allocated.current), " (", s.allocated.current, " bytes) allocated by tensors, ",
      fmt_bytes(s.reserved.current), " (", s.reserved.current, " bytes) reserved in total. "
      "Free tensors, call torch.rbln.empty_cache(), or raise TORCH_RBLN_DEVICE_MEMORY.");
}

void Arena::free(Block&& block, std::vector<QueuePoint> uses) {
  const int64_t size = block.size;
  at::Tensor mem = std::move(block.memory);  // declared first: destroyed after the lock is released
  const bool lent = block.lent;
  const bool bare = lent && block.lent_cacheable;
  if (lent) {
    mem.reset();  // the host view goes back with its storage, never into the cache
  }
  block.size = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.allocated.sub(size);
  if (!all_reached(uses)) {
    deferred_.push_back(Deferred{size, std::move(mem), std::move(uses), lent, bare});
    return;
  }
  cache_locked(size, mem, lent, bare);
}

// `mem` is moved into the cache when reusable; otherwise it stays with the caller, who lets go
// of it after the lock is released. `lent`: a block that was lent its storage's host view (counted
// as borrowed), without memory now; `bare`: cached so, as the memory it stood for would have been.
void Arena::cache_locked(int64_t size, at::Tensor& mem, bool lent, bool bare) {
  stats_.active.sub(size);
  if (bare) {
    cache_[size].push_back(at::Tensor());
    stats_.cached += size;
  } else if (!lent && reusable(mem, size)) {
    cache_[size].push_back(std::move(mem));
    stats_.cached += size;
  } else {
    // adopted memory is not reusable as a raw block: give it back now
    stats_.reserved.sub(size);
    stats_.num_device_free += 1;
    if (lent) {
      stats_.borrowed -= size;
    }
  }
}

void Arena::lend(Block& block, at::Tensor host_view) {
  at::Tensor own = std::move(block.memory);  // declared first: destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mutex_);
  if (!block.lent) {
    // with no memory yet the block would have been given a reusable one
    block.lent_cacheable = !own.defined() || reusable(own, block.size);
    block.lent = true;
    stats_.borrowed += block.size;
  }
  block.memory = std::move(host_view);
}

void Arena::take_own(Block& block, at::Tensor own) {
  at::Tensor lent = std::move(block.memory);
  std::lock_guard<std::mutex> lock(mutex_);
  if (block.lent) {
    block.lent = false;
    stats_.borrowed -= block.size;
  }
  block.memory = std::move(own);
}

void Arena::take_back_reached_locked(std::vector<at::Tensor>& dropped) {
  size_t kept = 0;
  for (size_t i = 0; i < deferred_.size(); ++i) {
    auto& d = deferred_[i];
    if (all_reached(d.uses)) {
      cache_locked(d.size, d.memory, d.lent, d.bare);
      if (d.memory.defined()) {
        dropped.push_back(std::move(d.memory));
      }
    } else {
      if (kept != i) {  // a self-move would empty the entry's points and memory
        deferred_[kept] = std::move(d);
      }
      ++kept;
    }
  }
  deferred_.resize(kept);
}

std::vector<at::Tensor> Arena::release_cache_locked() {
  std::vector<at::Tensor> out;
  for (auto& [size, list] : cache_) {
    const auto n = static_cast<int64_t>(list.size());
    stats_.reserved.sub(size * n);
    stats_.num_device_free += n;
    for (auto& m : list) {
      if (m.defined()) {
        out.push_back(std::move(m));
      } else {
        stats_.borrowed -= size;
      }
    }
  }
  cache_.clear();
  stats_.cached = 0;
  return out;
}

void Arena::empty_cache() {
  // as CUDA's emptyCache: the recorded streams' work is waited for (without the lock: that work
  // may allocate), then those blocks are free like the others
  std::vector<QueuePoint> waits;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& d : deferred_) {
      waits.insert(waits.end(), d.uses.begin(), d.uses.end());
    }
  }
  for (const auto& p : waits) {
    wait_point(p);
  }
  std::vector<at::Tensor> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    take_back_reached_locked(released);
    auto cached = release_cache_locked();
    released.insert(released.end(), std::make_move_iterator(cached.begin()),
                    std::make_move_iterator(cached.end()));
  }
}

ArenaStats Arena::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void Arena::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* s : {&stats_.allocated, &stats_.reserved, &stats_.active}) {
    s->peak = s->current;
  }
}

void Arena::reset_accumulated() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* s : {&stats_.allocated, &stats_.reserved, &stats_.active}) {
    s->allocated = s->freed = 0;
  }
  stats_.num_alloc_retries = stats_.num_ooms = 0;
  stats_.num_device_alloc = stats_.num_device_free = 0;
}

// ------------------------------------------------------------------------------------------
// the committed device mapping: one arena per logical device

namespace {
MappingSource source;
std::mutex mapping_mutex;
std::vector<std::unique_ptr<Arena>>* mapping_arenas = nullptr;  // published once, never freed
std::atomic<bool> committed{false};

std::vector<std::unique_ptr<Arena>>& committed_mapping() {
  if (!committed.load(std::memory_order_acquire)) {
    TORCH_CHECK(source.commit != nullptr, "torch_rbln: the native runtime is not initialised");
    // Python is asked without holding a lock: it may need the GIL another thread holds
    std::vector<int64_t> capacities = source.commit();
    std::lock_guard<std::mutex> lock(mapping_mutex);
    if (!committed.load(std::memory_order_relaxed)) {
      auto* arenas = new std::vector<std::unique_ptr<Arena>>();
      for (size_t i = 0; i < capacities.size(); ++i) {
        arenas->push_back(std::make_unique<Arena>(static_cast<c10::DeviceIndex>(i), capacities[i]));
      }
      mapping_arenas = arenas;
      committed.store(true, std::memory_order_release);
    }
  }
  return *mapping_arenas;
}
}  // namespace

void set_mapping_source(MappingSource s) {
  source = s;
}

Arena& claim(c10::DeviceIndex index) {
  auto& arenas = committed_mapping();
  if (index < 0 || static_cast<size_t>(index) >= arenas.size()) {
    if (source.index_error != nullptr) {
      source.index_error(index);
    }
    TORCH_CHECK(false, "rbln device index ", int(index), " is out of range [0, ", arenas.size(), ")");
  }
  return *arenas[index];
}

std::vector<Arena*> committed_arenas() {
  std::vector<Arena*> out;
  if (committed.load(std::memory_order_acquire)) {
    for (auto& a : *mapping_arenas) {
      out.push_back(a.get());
    }
  }
  return out;
}

}  // namespace torch_rbln
