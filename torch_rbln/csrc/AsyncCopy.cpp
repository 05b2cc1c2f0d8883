// Asynchronous host -> device copies: `copy_(pinned_cpu, non_blocking=True)` and
// `pinned.to("rbln", non_blocking=True)`.
//
// The copy is queued on the destination device's current stream and runs on that stream's
// worker (the virtual NPU's copy engine), in order with the stream's other work, so
// synchronize(), stream and event queries and waits see it. It writes the destination's host
// view, as a blocking copy does, and records no transfer: the h2d push happens at the first
// device use, exactly as after a blocking copy. The destination's storage state keeps the
// copy's queue point and the source's storage: every transition and alias of that storage
// waits for the copy first, and the pinned block is neither freed nor reused before the copy
// has read it. The worker touches raw memory only (no Python object, no storage state).
// Which copies take this path is decided in Python (torch_rbln/dispatch/copy.py).
#include <torch/csrc/utils/pybind.h>

#include <cstring>

#include "PinnedAllocator.h"
#include "Storage.h"
#include "Stream.h"

namespace py = pybind11;

namespace torch_rbln {

void copy_h2d_async(const at::Tensor& src, const at::Tensor& dst) {
  TORCH_CHECK(src.device().is_cpu() && dst.device().type() == c10::DeviceType::PrivateUse1,
              "an asynchronous host to device copy goes from a CPU tensor to an rbln tensor");
  TORCH_CHECK(src.scalar_type() == dst.scalar_type() && src.sizes().equals(dst.sizes()) &&
                  src.is_contiguous() && dst.is_contiguous() && !src.is_conj() &&
                  !src.is_neg() && !dst.is_conj() && !dst.is_neg(),
              "an asynchronous host to device copy needs contiguous tensors of one dtype and "
              "shape");
  const int64_t n = dst.numel() * static_cast<int64_t>(dst.element_size());
  if (n == 0) {
    return;
  }
  const char* from = static_cast<const char*>(src.const_data_ptr());
  TORCH_CHECK(is_pinned(from), "an asynchronous host to device copy reads pinned memory");
  StorageState* s = state_for_write(dst);
  s->host_write(covers(dst, *s));   // waits for earlier queued work on this storage
  char* to = static_cast<char*>(s->host) + dst.storage_offset() * dst.element_size();
  if (from < to + n && to < from + n) {   // the destination's memory is the source's
    std::memmove(to, from, n);
    return;
  }
  s->pending = enqueue_point(current_stream(s->index), [to, from, n] { std::memcpy(to, from, n); });
  s->pending_source = src.storage();
}

void bind_async_copy(py::module_& m) {
  m.def("copy_h2d_async", &copy_h2d_async,
        "Queue the copy of pinned `src` into `dst` (same dtype and shape, both contiguous) on "
        "the current stream of dst's device.");
}

}  // namespace torch_rbln
