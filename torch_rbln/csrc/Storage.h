// rbln storages: a host view PyTorch sees, a device block the NPU uses, and residency.
//
// Every rbln storage's DataPtr has a StorageState as its context:
//   host       the storage's own memory (its data pointer, the "virtual address" PyTorch sees),
//              from a size-bucketed host pool;
//   block      the device memory, a Block of the device's arena, booked at the first device use
//              (or at creation with TORCH_RBLN_EAGER_MALLOC=1). Its RAM is the host view itself
//              (lent to the block: one physical copy, whichever side is latest). A fresh
//              program output is both (new_device_tensor: its memory becomes the host view
//              too); one written into an existing storage (adopt_device) is the device memory
//              until the next transfer: the d2h copies into the host view, the h2d drops the
//              output, and from then on the host view serves again. Only physical memory differs from
//              two copies: every transfer, transition and statistic is recorded as before;
//              where the host view serves, a transfer moves no bytes. Writes on either side
//              land in that one memory: the side the residency calls stale is never read
//              before a transition, which records the transfer. The deleter frees the block
//              (dropping the lent view; the arena never caches it) before the host view goes
//              back to the pool;
//              While a kept fp32 (widened) form covers the whole storage and the scan found
//              it finite, the half-precision bytes are redundant (narrowing the fp32 form gives
//              them back bit for bit): the host view's whole pages are released (MADV_DONTNEED;
//              the pointer stays valid), as an NPU keeps a weight in its own layout only. Every
//              route that hands out or reads the bytes (restore_host) narrows them back first;
//              a whole write forgets them. Nothing is recorded: it is not a transfer;
//   residency  which side holds the latest data: Host, Device or Synced (both);
//   pending    queued work (a non_blocking copy on a stream's worker) that writes the memory:
//              every transition, alias and the deleter wait for it first, so nothing reads or
//              frees the memory while the worker writes it.
// The DataPtr's deleter returns the block to the arena and the host memory to the pool.
// A storage and its lazy clones (Tensor._lazy_clone(), copy-on-write) share one state: their
// DataPtrs are PyTorch's copy-on-write ones, whose context owns the state (LazyClone.cpp); every
// write asks for the state through state_for_write, which gives the storage memory of its own
// first.
// Transitions and the events they record are listed in torch_rbln/runtime/storage.py.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "Arena.h"
#include "Stream.h"

namespace torch_rbln {

enum class Residency : int8_t { Host = 0, Device = 1, Synced = 2 };

struct StorageState {
  StorageState(c10::DeviceIndex index, int64_t nbytes, void* host, int64_t host_capacity,
               bool pooled);
  ~StorageState();
  StorageState(const StorageState&) = delete;
  StorageState& operator=(const StorageState&) = delete;

  const c10::DeviceIndex index;
  const int64_t nbytes;
  void* const host;
  const int64_t host_capacity;  // bytes behind `host` (the pool's rounded size, or the owner's)
  const bool pooled;            // the host memory goes back to the host pool
  c10::Storage host_owner;      // memory the state wraps instead of owning (wrap_host)
  c10::DataPtr host_original;   // the original DataPtr of a storage made outside the allocator
  bool adopted = false;         // made outside the allocator; its memory became the host view
  // the copy-on-write context through which lazy clones share this state (LazyClone.cpp)
  const void* cow = nullptr;
  std::optional<Block> block;
  Residency residency = Residency::Host;
  // the dtype as which the NaN/Inf scan found the whole storage finite; cleared by every write
  std::optional<c10::ScalarType> finite_dtype;

  // the queued work that uses this storage's memory, and the memory it reads (a pinned
  // source), kept alive until it has run; cleared by `settle`
  QueuePoint pending;
  c10::Storage pending_source;
  // streams `record_stream` named: at the free, the work queued on them so far must finish
  // before the host view or the device block is reused
  std::vector<c10::Stream> recorded_streams;
  // waits for the pending work (a no-op when there is none)
  void settle() {
    if (C10_UNLIKELY(static_cast<bool>(pending))) {
      wait_pending();
    }
  }

  // residency transitions (recording h2d / d2h)
  void host_read();
  void host_write(bool whole);
  void device_read();
  void device_write(bool whole);
  // `memory` (a program's contiguous output covering this whole storage) becomes the device
  // memory: the program wrote straight into it, nothing is copied
  void adopt_device(at::Tensor memory);
  // host_read for a reader that can take the device side instead (the NaN/Inf scan): the d2h is
  // recorded and the state becomes Synced as host_read makes it, but the copy waits until the
  // host view is read (host_read, host_write, any host_* view). True: read the device side.
  bool host_read_deferred();
  // books the device block (the host view lent as its memory) if the storage has none yet
  void ensure_device_memory();
  bool has_device_memory() const { return block.has_value() && block->memory.defined(); }
  // the device block's memory is the host view (no second physical copy)
  bool shares_host_view() const;
  // bytes of the host view's pages released while the whole widened form stands for them
  int64_t host_released() const { return released_; }

  // CPU tensors over either side, with `t`'s dtype, sizes, strides, offset and lazy
  // conjugate / negative bits; no residency change
  at::Tensor host_alias(const at::Tensor& t);
  at::Tensor device_alias(const at::Tensor& t);
  // device_alias for a program operand, only ever read, so it may be shared between calls: the
  // adopted output that *is* the device memory when `t` spans it unchanged, else an alias cached
  // per metadata (dropped whenever the device memory changes)
  at::Tensor device_input_alias(const at::Tensor& t);
  // device_input_alias in fp32, for a program that computes a half-precision operand widened
  // (executors: the fp32 and matmul forms, custom bodies). An operand read many times and
  // written rarely (a weight) keeps its widened form: from the second widening read of a view
  // since the storage's last write (from the first, when the contents before that write were
  // read widened twice or more, the kept form serving some of those reads: a weight an
  // optimizer updates between a forward and a backward), the fp32 copy is kept (host memory,
  // outside the device's accounting, as an NPU keeps weights in its own layout) until the next
  // write drops it.
  at::Tensor device_input_widened(const at::Tensor& t);
  // widened forms kept now (a test and the memory report read it)
  int64_t widened_bytes() const;
  // a 2-D half-precision weight `t` in the host GEMM library's own blocked layout (oneDNN's,
  // as PyTorch's packed linear takes it), for the matrix units' linear: made from the device
  // bytes on the first read, kept until the next write (host memory, outside the device's
  // accounting, as an NPU keeps weights in its own layout); the same values, the same results
  at::Tensor device_input_packed(const at::Tensor& t);
  int64_t packed_bytes() const;
  // the whole storage as a flat CPU tensor of `dtype` over the host view, on a CPU storage of
  // exactly `nbytes` (a nested tensor's kernels take its storage's size as its buffer's)
  at::Tensor host_flat(c10::ScalarType dtype);
  // the storage's `nbytes` bytes on either side, as flat uint8 CPU tensors
  at::Tensor host_bytes();
  at::Tensor device_bytes();

 private:
  void push();
  void pull();
  const c10::Storage& host_cpu_storage();
  const c10::Storage& host_storage();  // host_cpu_storage without catching the host up
  const c10::Storage& device_cpu_storage();
  // books the block if needed and lends it the host view, which holds the device's bytes
  void share_host_view();
  void device_memory_changed();  // new device memory and contents
  void device_memory_moved();    // the same bytes in other memory: the aliases are stale
  // every write: the scan's mark and the widened forms are stale (released bytes are
  // narrowed back first unless the write is `whole`)
  void contents_changed(bool whole);
  // the release of the host view's bytes (see the top of this file): every route that hands out
  // or reads them calls restore_host first; drop_released forgets them (a whole write)
  void restore_host() {
    if (C10_UNLIKELY(released_ != 0)) {
      regenerate_host();
    }
  }
  void regenerate_host();
  void drop_released();
  void try_release_host();
  bool aliased_outside() const;
  void wait_pending();
  void catch_up_host();

  // CPU storages over each side (not resizable), made on first use: the host view's does not
  // own it; the device memory's keeps that memory alive (an alias outlives its replacement)
  c10::Storage host_cpu_;
  c10::Storage device_cpu_;
  struct CachedInput {
    c10::ScalarType dtype;
    std::vector<int64_t> sizes, strides;
    int64_t offset;
    at::Tensor alias;
  };
  std::vector<CachedInput> inputs_;
  std::vector<CachedInput> widened_;  // fp32 copies of views (device_input_widened)
  std::vector<CachedInput> packed_;   // blocked layouts of weights (device_input_packed)
  const CachedInput* whole_widened() const;  // the kept form covering the whole storage
  int widen_reads_ = 0;               // widening reads since the last write (up to 2)
  bool reread_ = false;               // ... and before it there were two or more
  bool host_behind_ = false;  // Synced, but the recorded d2h copy has not been made yet
  int64_t released_ = 0;      // bytes of the host view's pages released (restore_host)
  bool restored_ = false;     // narrowed back since the last write: kept until the next one
};

// The state of an rbln storage. A storage made outside the allocator (a PyTorch path that
// brought its own memory) is adopted: its memory becomes the host view.
StorageState* state_of(const c10::Storage& storage);
inline StorageState* state_of(const at::TensorBase& t) {
  return state_of(t.storage());
}

// The state of `t`'s storage for a write into it: a lazy clone's storage that still shares its
// memory gets memory of its own first (its materializer: LazyClone.cpp), as PyTorch's kernels
// materialize a copy-on-write storage when they take its mutable data pointer. One flag test
// for every other storage.
inline StorageState* state_for_write(const at::TensorBase& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  if (C10_UNLIKELY(impl->has_materializer())) {
    impl->mutable_data();
  }
  return state_of(t.storage());
}

// Lazy clones (LazyClone.cpp). The state a copy-on-write storage shares with its siblings; a
// state that dies while shared forgets its context.
StorageState* cow_state(const c10::Storage& storage);
void forget_cow(StorageState* s);
// states shared by lazy clones now (0: no storage shares its memory copy-on-write)
int64_t shared_states();
// aten::_lazy_clone on rbln tensors
at::Tensor lazy_clone(const at::Tensor& self);

// The DataPtr that owns `s` (and through it the storage's memory): every rbln storage's, and the
// one the last lazy clone still sharing some memory takes back.
c10::DataPtr owning_data_ptr(StorageState* s);
// Memory of its own for a storage that shares `s`'s and is about to be written (a lazy clone):
// a copy of the contents made where their latest data is, as clone() makes it: on the device
// (a `v2v` copy into a new block; device-latest) when the device holds them, else on the host
// views (host-latest, nothing recorded).
c10::DataPtr copy_of(StorageState& s);

// Deterministic mode (torch.use_deterministic_algorithms(True) and
// torch.utils.deterministic.fill_uninitialized_memory) is on: new memory is filled.
bool fill_uninitialized_memory();
// Fills `t`'s elements as PyTorch fills uninitialized memory in deterministic mode
// (at::native::fill_empty_deterministic_: NaN, an integer type's largest value, true), where
// the storage's data is: `fresh` (a new storage, no contents yet) or device-latest on the device
// (its block booked; nothing crosses), else on the host view.
void fill_uninitialized(const at::Tensor& t, bool fresh);

// `t` is contiguous and spans its whole storage: a write to it overwrites everything
bool covers(const at::TensorBase& t, const StorageState& s);

// bytes a tensor of these sizes and strides spans from its storage offset
int64_t storage_nbytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t itemsize);

// The memory of a new rbln storage of `nbytes` on logical device `index`: a host view from the
// pool with a fresh state as the DataPtr context (commits the device mapping and checks the
// index; books the device block too under TORCH_RBLN_EAGER_MALLOC=1).
c10::DataPtr new_host_view(int64_t nbytes, c10::DeviceIndex index);

// A fresh rbln tensor: host view from the pool, device memory booked lazily.
at::Tensor new_tensor(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                      c10::DeviceIndex index);
// A fresh rbln tensor whose device memory *is* `memory`, a program output that owns its whole
// dense storage of `nbytes` bytes: device-latest, nothing copied (one step per op output). The
// same memory is its host view (as wrap_host's), lent to the block: a d2h moves no bytes.
// `eager_raw`: TORCH_RBLN_EAGER_MALLOC as the caller read it for this call (null: read it here)
at::Tensor new_device_tensor(const at::Tensor& memory, int64_t nbytes, c10::DeviceIndex index,
                             const char* const* eager_raw = nullptr);
// new_device_tensor's storage memory: the DataPtr of a device-latest state over `memory`
c10::DataPtr device_data_ptr(const at::Tensor& memory, int64_t nbytes, c10::DeviceIndex index,
                             const char* const* eager_raw = nullptr);
// An rbln tensor whose host view *is* `cpu`'s storage (zero copy), host-latest.
at::Tensor wrap_host(const at::Tensor& cpu, c10::DeviceIndex index);

// Tensor.record_stream(stream) on an rbln tensor (the aten::record_stream kernel).
void record_stream(at::Tensor& t, c10::Stream stream);

// Frees the host views the pool keeps for reuse.
void host_pool_clear();

// Bytes of host-view pages released now, over all storages (a diagnostic; see StorageState).
int64_t released_host_bytes();

// Storage states alive now (every rbln storage has one): a leak check reads it.
int64_t live_storage_states();

// TORCH_RBLN_EAGER_MALLOC now (read at every allocation). Python validates a value it cannot
// read as a flag (the bindings set the parser).
bool eager_malloc();
// the same for a value the caller read (null: the variable is unset)
bool eager_malloc_of(const char* raw);
void set_eager_malloc_parser(bool (*parse)(const char* raw));

}  // namespace torch_rbln
