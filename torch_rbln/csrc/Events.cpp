#include "Events.h"

#include <map>
#include <memory>
#include <set>
#include <mutex>
#include <utility>

namespace torch_rbln::events {

namespace {
std::mutex registry_mutex;
// (kind, key) -> counter; never shrinks, so counter addresses stay valid
std::map<std::pair<std::string, std::string>, std::unique_ptr<Counter>>& registry() {
  static auto* r = new std::map<std::pair<std::string, std::string>, std::unique_ptr<Counter>>();
  return *r;
}
std::atomic<Forward> forward_fn{nullptr};
// the kinds the listeners want; empty: every kind (guarded by registry_mutex)
std::set<std::string> wanted_kinds;

bool wanted(const std::string& kind) {
  return wanted_kinds.empty() || wanted_kinds.count(kind) > 0;
}
}  // namespace

namespace detail {
std::atomic<bool> listening{false};
std::atomic<bool> python_path{false};

void forward(const Counter& c, int64_t amount) {
  Forward fn = forward_fn.load();
  if (fn != nullptr) {
    fn(c, amount);
    return;
  }
  auto& mc = const_cast<Counter&>(c);
  mc.count.fetch_add(1, std::memory_order_relaxed);
  mc.amount.fetch_add(amount, std::memory_order_relaxed);
}
}  // namespace detail

Counter* counter(const std::string& kind, const std::string& key) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& slot = registry()[{kind, key}];
  if (!slot) {
    slot = std::make_unique<Counter>(kind, key);
    slot->wanted.store(wanted(kind));
  }
  return slot.get();
}

void set_forward(Forward forward) {
  forward_fn.store(forward);
}

void set_listening(bool listening, bool python_path) {
  detail::python_path.store(python_path);
  detail::listening.store(listening);
}

void set_wanted_kinds(const std::vector<std::string>& kinds) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  wanted_kinds = std::set<std::string>(kinds.begin(), kinds.end());
  for (auto& [name, c] : registry()) {
    c->wanted.store(wanted(name.first));
  }
}

std::vector<Delta> drain() {
  std::vector<Delta> out;
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (auto& [name, c] : registry()) {
    if (c->count.load(std::memory_order_relaxed) == 0) {
      continue;
    }
    int64_t n = c->count.exchange(0);
    int64_t a = c->amount.exchange(0);
    out.push_back({c.get(), n, a});
  }
  return out;
}

}  // namespace torch_rbln::events
