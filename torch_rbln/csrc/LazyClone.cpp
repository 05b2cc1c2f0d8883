// Lazy clones of rbln tensors (Tensor._lazy_clone(): copy-on-write), as PyTorch makes them on the
// CPU (c10/core/impl/COW.cpp). A storage and its lazy clones share one memory through PyTorch's
// COWDeleterContext, which owns the original DataPtr's context: here the storage's StorageState,
// so they share one host view, one device block (booked and counted once) and one residency.
// Their DataPtrs are PyTorch's copy-on-write ones (torch._C._is_cow_tensor sees them), and the
// siblings find the shared state through `shared` below, keyed by their context (state_of's slow
// path; the hot path is untouched).
//
// A write into one of them (every write of the runtime takes its state through state_for_write,
// and PyTorch's own mutable_data_ptr() calls the materializer too) gives that storage memory of
// its own first: a copy made where the latest data is (Storage.cpp: copy_of), or, when it is the
// last storage sharing the memory, the memory and its state themselves (no copy, the data
// pointer unchanged), as on the CPU. Reads share. PyTorch's rule holds: no materialization inside
// the loop of at::parallel_for.
//
// c10's own materializer cannot serve here: it hands the last storage back its original context
// only when that context is the data pointer, and it copies with Allocator::clone, which knows
// nothing of residency. So the storages made here take this file's materializer.
#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/COW.h>
#include <c10/core/impl/COWDeleter.h>
#include <c10/util/ParallelGuard.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <variant>

#include "Storage.h"

namespace torch_rbln {

namespace cow = c10::impl::cow;

namespace {

// copy-on-write context -> the state its storages share. The mutex also orders a context's
// last materialization (which frees the context) before any new context reusing its address is
// entered.
std::mutex mutex;

std::unordered_map<const void*, StorageState*>& shared() {
  static auto* m = new std::unordered_map<const void*, StorageState*>();  // storages may die at exit
  return *m;
}

std::atomic<int64_t> shared_count{0};  // shared().size(), read without the mutex

StorageState* lookup(const void* ctx) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = shared().find(ctx);
  TORCH_CHECK(it != shared().end(),
              "an rbln storage shares its memory copy-on-write through a context torch_rbln did "
              "not make; make lazy clones of rbln tensors with Tensor._lazy_clone()");
  return it->second;
}

void forget_locked(StorageState* s) {
  auto it = shared().find(s->cow);
  if (it != shared().end() && it->second == s) {
    shared().erase(it);
    shared_count.store(static_cast<int64_t>(shared().size()), std::memory_order_relaxed);
  }
  s->cow = nullptr;
}

void materialize(c10::StorageImpl* impl) {
  TORCH_CHECK(!c10::ParallelGuard::is_enabled(),
              "Materializing a storage in the loop function of at::parallel_for is forbidden");
  c10::DataPtr& dp = impl->_mutable_data_ptr_no_checks();
  auto* ctx = dp.cast_context<cow::COWDeleterContext>(&cow::cow_deleter);
  TORCH_INTERNAL_ASSERT(ctx != nullptr, "an rbln storage to materialize is no lazy clone");
  StorageState* s = lookup(ctx);
  s->settle();
  std::unique_lock<std::mutex> lock(mutex);
  auto ref = ctx->decrement_refcount();
  if (auto* last = std::get_if<cow::COWDeleterContext::LastReference>(&ref)) {
    // the last storage sharing the memory: it takes the memory and its state back
    forget_locked(s);
    lock.unlock();
    TORCH_INTERNAL_ASSERT(last->get() == s);
    last->release();
    dp.release_context();  // the context is gone (decrement_refcount freed it)
    impl->set_data_ptr_noswap(owning_data_ptr(s));
    return;
  }
  lock.unlock();
  // others still share the memory (`ref`, a shared lock, keeps it alive meanwhile): a copy
  c10::DataPtr own;
  try {
    own = copy_of(*s);
  } catch (...) {
    ctx->increment_refcount();  // the storage still shares the memory; the next write retries
    throw;
  }
  dp.release_context();  // its count was given up above
  impl->set_data_ptr_noswap(std::move(own));
}

}  // namespace

StorageState* cow_state(const c10::Storage& storage) {
  return lookup(storage.data_ptr().get_context());
}

int64_t shared_states() {
  return shared_count.load(std::memory_order_relaxed);
}

void forget_cow(StorageState* s) {
  std::lock_guard<std::mutex> lock(mutex);
  forget_locked(s);
}

at::Tensor lazy_clone(const at::Tensor& self) {
  c10::StorageImpl* impl = self.storage().unsafeGetStorageImpl();
  StorageState* s = state_of(self.storage());  // a storage made outside the allocator is adopted
  c10::DataPtr& dp = impl->_mutable_data_ptr_no_checks();
  void* data = dp.get();
  const c10::Device device = dp.device();
  cow::COWDeleterContext* ctx = nullptr;
  if (cow::is_cow_data_ptr(dp)) {  // a lazy clone of a lazy clone: one more sibling
    ctx = dp.cast_context<cow::COWDeleterContext>(&cow::cow_deleter);
    ctx->increment_refcount();
  } else {
    // the context takes the state (released with the last sibling that stays unwritten)
    ctx = new cow::COWDeleterContext(std::move(dp.move_context()));
    ctx->increment_refcount();  // this storage and the clone
    {
      std::lock_guard<std::mutex> lock(mutex);
      shared()[ctx] = s;
      shared_count.store(static_cast<int64_t>(shared().size()), std::memory_order_relaxed);
      s->cow = ctx;
    }
    impl->set_data_ptr_noswap(c10::DataPtr(data, ctx, &cow::cow_deleter, device));
    impl->set_materializer(&materialize);
  }
  auto storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->sym_nbytes(),
      c10::DataPtr(data, ctx, &cow::cow_deleter, device), impl->allocator(), impl->resizable());
  storage->set_materializer(&materialize);
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(storage)),
                                                    self.key_set(), self.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(self.sym_sizes(), self.sym_strides(),
                                                 self.sym_storage_offset());
  return t;
}

}  // namespace torch_rbln
