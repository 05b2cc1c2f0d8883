// The native side of the one event stream (torch_rbln/events.py): counters that C++ code moves
// without the GIL. Python folds them into its own counters whenever a tool reads the stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_rbln::events {

// One counter of the stream, (kind, key) -> (count, amount); amount is bytes or nanoseconds.
struct Counter {
  Counter(std::string kind_, std::string key_) : kind(std::move(kind_)), key(std::move(key_)) {}
  const std::string kind;
  const std::string key;
  std::atomic<int64_t> count{0};
  std::atomic<int64_t> amount{0};
};

// The counter of (kind, key), made on first use. Its address never changes, so a hot path looks
// it up once and records through the pointer.
Counter* counter(const std::string& kind, const std::string& key);

// Hands one event to Python's stream (set by the bindings): while a Python listener is attached
// (the fallback log, call-site capture), events reach it in order and from the recording thread.
using Forward = void (*)(const Counter&, int64_t amount);
void set_forward(Forward forward);
void set_listening(bool listening);

namespace detail {
extern std::atomic<bool> listening;
void forward(const Counter& c, int64_t amount);
}  // namespace detail

// Count one event: two relaxed atomic adds, or the Python stream while it has a listener.
inline void record(Counter* c, int64_t amount = 0) {
  if (detail::listening.load(std::memory_order_relaxed)) {
    detail::forward(*c, amount);
    return;
  }
  c->count.fetch_add(1, std::memory_order_relaxed);
  c->amount.fetch_add(amount, std::memory_order_relaxed);
}

// What was counted since the previous drain; the counters restart from zero.
struct Delta {
  const Counter* counter;
  int64_t count;
  int64_t amount;
};
std::vector<Delta> drain();

}  // namespace torch_rbln::events
