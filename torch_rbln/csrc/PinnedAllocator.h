// Pinned host memory for rbln: what pin_memory(), is_pinned() and DataLoader(pin_memory=True)
// use. The virtual NPU reads host memory directly, so "pinned" means allocated here: the
// allocator knows every block it handed out, which is what is_pinned() asks, and a
// non_blocking copy from such a block may run on a stream's worker.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace torch_rbln {

at::HostAllocator* pinned_allocator();
bool is_pinned(const void* ptr);

}  // namespace torch_rbln
