// Device memory of the virtual NPU: one arena per logical device with a caching allocator.
//
// A block is host RAM standing in for device DRAM. Requests are rounded up to kBlockRound bytes;
// freed blocks stay cached (reserved) for a request of the same rounded size until
// empty_cache(). An arena never reserves past its capacity: it first releases its cache and
// retries (num_alloc_retries), then throws c10::OutOfMemoryError (torch.OutOfMemoryError in
// Python) and leaves every statistic as it was, num_ooms aside.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "Stream.h"

namespace torch_rbln {

constexpr int64_t kBlockRound = 512;

inline int64_t round_block(int64_t nbytes) {
  int64_t r = (nbytes + kBlockRound - 1) / kBlockRound * kBlockRound;
  return r < kBlockRound ? kBlockRound : r;
}

// A device allocation of `size` bytes. `memory` is its RAM: a flat uint8 CPU tensor, a program's
// output adopted as the block's memory (StorageState::adopt_device), the storage's host view
// lent to it (`lent`: one memory for both sides, Arena::lend), or undefined while the caller has
// booked the block without memory.
struct Block {
  int64_t size = 0;
  at::Tensor memory;
  // the memory is the storage's host view: the arena never keeps it. At the free the block is
  // cached without memory (made at its reuse) when the memory it stands for would have been
  // cached (`lent_cacheable`), so every statistic moves as with memory of its own.
  bool lent = false;
  bool lent_cacheable = false;
};

// current / peak / total allocated / total freed of one quantity (bytes)
struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void add(int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) {
      peak = current;
    }
  }
  void sub(int64_t n) {
    current -= n;
    freed += n;
  }
};

struct ArenaStats {
  Stat allocated;  // bytes in blocks held by tensors
  Stat reserved;   // + cached free blocks
  Stat active;
  int64_t cached = 0;
  int64_t num_alloc_retries = 0, num_ooms = 0;
  int64_t num_device_alloc = 0, num_device_free = 0;
  int64_t reserved_peak_ever = 0;  // process-wide high-water mark (explain's gauge), never reset
  // bytes of reserved blocks without memory of their own: in use over a lent host view, or
  // cached / waiting for recorded streams without memory (reserved - borrowed: the device
  // memory physically held)
  int64_t borrowed = 0;
};

class Arena {
 public:
  Arena(c10::DeviceIndex index, int64_t capacity) : index_(index), capacity_(capacity) {}

  // A block of at least `nbytes`. Without memory, the block is booked and its RAM is left to the
  // caller (a program's output becomes it).
  Block malloc(int64_t nbytes, bool with_memory);
  // `uses`: points of the streams a tensor on the block was recorded on (record_stream) that
  // had work queued when it was freed. Until every one is reached the block is neither cached
  // nor reused (it stays reserved and active, as in CUDA's caching allocator); malloc and
  // empty_cache take it back once they are.
  void free(Block&& block, std::vector<QueuePoint> uses = {});
  // waits for the deferred blocks' streams, then releases every cached block
  void empty_cache();
  // `host_view` (memory over the block's storage's host view, which holds the device's bytes)
  // becomes the block's memory; its own memory, if any, is let go. Books nothing.
  void lend(Block& block, at::Tensor host_view);
  // `own` (a program's output) becomes the memory of a block that was lent the host view
  void take_own(Block& block, at::Tensor own);

  ArenaStats stats() const;
  void reset_peak();
  void reset_accumulated();

  c10::DeviceIndex index() const { return index_; }
  int64_t capacity() const { return capacity_; }

 private:
  [[noreturn]] void out_of_memory(int64_t size);
  std::vector<at::Tensor> release_cache_locked();
  void cache_locked(int64_t size, at::Tensor& mem, bool lent, bool bare);
  void take_back_reached_locked(std::vector<at::Tensor>& dropped);

  struct Deferred {
    int64_t size;
    at::Tensor memory;
    std::vector<QueuePoint> uses;
    bool lent, bare;  // a block lent its storage's host view (Arena::cache_locked)
  };

  const c10::DeviceIndex index_;
  const int64_t capacity_;
  mutable std::mutex mutex_;
  // rounded size -> free blocks (an undefined tensor: a block cached without memory)
  std::unordered_map<int64_t, std::vector<at::Tensor>> cache_;
  std::vector<Deferred> deferred_;  // freed, waiting for recorded streams
  ArenaStats stats_;
};

// The device mapping lives in Python (runtime/devices.py plans it from the environment and
// commits it at the first real use); the bindings tell the native core how to ask for it.
struct MappingSource {
  // commits the mapping; the capacity in bytes of each logical device (throws Python's error)
  std::vector<int64_t> (*commit)() = nullptr;
  // throws the detailed error for an index outside the committed mapping
  void (*index_error)(c10::DeviceIndex index) = nullptr;
};
void set_mapping_source(MappingSource source);

// The first real use of logical device `index` (a storage on it): commits the mapping on the
// first call (an atomic flag afterwards) and checks the index. Returns the device's arena.
Arena& claim(c10::DeviceIndex index);

// Every logical device's arena once the mapping is committed; empty before.
std::vector<Arena*> committed_arenas();

}  // namespace torch_rbln
