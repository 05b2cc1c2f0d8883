// Streams and events of the virtual NPU.
//
// Each device has a default stream (id 0) and a fixed pool of streams (ids 1..kStreamPool)
// handed out round robin, as CUDA does. A stream is an in-order queue of work: programs run to
// completion when launched, so today nothing is queued, but work that should overlap with the
// host (a non_blocking copy) is `enqueue`d and runs on the stream's worker thread, in order.
// Events mark a point of a stream's queue; querying, waiting on and synchronizing them
// compare that point with the work the stream has completed.
#pragma once

#include <cstdint>
#include <functional>

#include <c10/core/Stream.h>

namespace torch_rbln {

constexpr int kStreamPool = 32;

c10::Stream default_stream(c10::DeviceIndex index);
c10::Stream current_stream(c10::DeviceIndex index);           // of the calling thread
c10::Stream exchange_stream(c10::Stream stream);              // returns the previous current
c10::Stream new_stream(c10::DeviceIndex index);               // the next stream of the pool

bool query_stream(const c10::Stream& stream);
void synchronize_stream(const c10::Stream& stream);
void synchronize_device(c10::DeviceIndex index);              // every stream of the device

// Queue `work` on `stream` (after everything queued on it before); returns its position.
// `work` runs on the stream's worker thread; an exception it throws is raised by the next
// synchronize of that stream (or device).
uint64_t enqueue(const c10::Stream& stream, std::function<void()> work);

// A point of one stream's queue: reached once the work queued up to it has finished. Storage
// states keep the point of the queued work that uses their memory (see Storage.h).
struct QueuePoint {
  void* queue = nullptr;   // null: nothing to wait for
  uint64_t pos = 0;
  uint64_t generation = 0;   // a forked child has fresh queues: points of its parent count as reached
  explicit operator bool() const { return queue != nullptr; }
};
// `enqueue`, returning the point of `work`
QueuePoint enqueue_point(const c10::Stream& stream, std::function<void()> work);
bool point_reached(const QueuePoint& point);
// The point of the work queued on `stream` so far (what record_stream waits for at a free)
QueuePoint stream_point(const c10::Stream& stream);
// Blocks until `point` is reached (without holding the GIL).
void wait_point(const QueuePoint& point);

// The guard's event interface (an event is an opaque pointer owned by c10::Event).
void record_event(void** event, const c10::Stream& stream);
void block_on_event(void* event, const c10::Stream& stream);
bool query_event(void* event);
void synchronize_event(void* event);
void destroy_event(void* event) noexcept;

}  // namespace torch_rbln
