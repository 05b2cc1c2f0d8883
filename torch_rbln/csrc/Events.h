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
  // handed to Python while a listener listens: some listener wants this kind
  std::atomic<bool> wanted{true};
};

// The counter of (kind, key), made on first use. Its address never changes, so a hot path looks
// it up once and records through the pointer.
Counter* counter(const std::string& kind, const std::string& key);

// Hands one event to Python's stream (set by the bindings): while a Python listener is attached
// (the fallback log, call-site capture), events reach it in order and from the recording thread.
using Forward = void (*)(const Counter&, int64_t amount);
void set_forward(Forward forward);
// `listening`: some listener is attached (events go to Python); `python_path`: one of them needs
// every decision made by the Python kernels (the fallback log, a guard scope), so the native
// paths step aside. A passive listener (explain's call-site capture) only reads the events: the
// native paths keep serving and hand it theirs.
void set_listening(bool listening, bool python_path);
// The kinds the listeners want (each listener names its own, or takes every kind): events of
// other kinds stay in the native counters while listeners listen. Empty: every kind.
void set_wanted_kinds(const std::vector<std::string>& kinds);

namespace detail {
extern std::atomic<bool> listening;
extern std::atomic<bool> python_path;
void forward(const Counter& c, int64_t amount);
}  // namespace detail

// Whether the native paths leave this call to the Python kernels for a listener's sake.
inline bool python_path_wanted() {
  return detail::python_path.load(std::memory_order_relaxed);
}

// Count one event: one or two relaxed atomic adds, or the Python stream while a listener wants it.
inline void record(Counter* c, int64_t amount = 0) {
  if (detail::listening.load(std::memory_order_relaxed) &&
      c->wanted.load(std::memory_order_relaxed)) {
    detail::forward(*c, amount);
    return;
  }
  c->count.fetch_add(1, std::memory_order_relaxed);
  if (amount != 0) {  // most events carry none: one locked add less
    c->amount.fetch_add(amount, std::memory_order_relaxed);
  }
}

// ------------------------------------------------------------------------------------------
// The profiler's tap (Profiler.cpp). While a torch.profiler session with PrivateUse1 activity
// records, each device program and each physical copy counted here also becomes a device
// activity, from the same call: the profiler and explain read one stream. Otherwise a call
// costs one relaxed load more than `record`.
namespace tap {
extern std::atomic<bool> on;
int64_t now();  // the profiler's clock: ns since the epoch (kineto's, torch's CPU ops')
// a device activity of counter `c` on NPU `device`, from `start_ns` to `end_ns`
void activity(const Counter& c, int device, int64_t start_ns, int64_t end_ns, int64_t bytes);
}  // namespace tap

// Where a timed event starts: now while the profiler records, else 0 (nothing is timed).
inline int64_t span_start() {
  return tap::on.load(std::memory_order_relaxed) ? tap::now() : 0;
}

// A device program ran on NPU `device` since `start_ns` (span_start()): one event of `c`
// (amount: its ns while the profiler records, else 0) and, while it records, its activity.
inline void record_program(Counter* c, int device, int64_t start_ns) {
  if (!tap::on.load(std::memory_order_relaxed)) {
    record(c, 0);
    return;
  }
  const int64_t end = tap::now();
  const int64_t start = start_ns != 0 ? start_ns : end;
  record(c, end - start);
  tap::activity(*c, device, start, end, 0);
}

// A physical copy of `bytes` on NPU `device` since `start_ns` (0: an instant, e.g. a transfer
// whose bytes are read in place later): one event of `c` and, while it records, its activity.
inline void record_copy(Counter* c, int64_t bytes, int device, int64_t start_ns) {
  record(c, bytes);
  if (tap::on.load(std::memory_order_relaxed)) {
    const int64_t end = tap::now();
    tap::activity(*c, device, start_ns != 0 ? start_ns : end, end, bytes);
  }
}

// What was counted since the previous drain; the counters restart from zero.
struct Delta {
  const Counter* counter;
  int64_t count;
  int64_t amount;
};
std::vector<Delta> drain();

}  // namespace torch_rbln::events
