#include "Stream.h"

#include <pthread.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include <pybind11/pybind11.h>

#include "Guard.h"

namespace py = pybind11;

namespace torch_rbln {
namespace {

constexpr int kMaxDevices = 128;   // c10::DeviceIndex is an int8_t

// One stream's queue. Positions count queued work: `queued` is the position of the last item
// queued, `done` that of the last item finished; a position is reached when done >= it.
class Queue {
 public:
  uint64_t enqueue(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(work));
    if (!worker_started_) {
      // the queue lives for the process (never destroyed), so the worker may outlive main()
      std::thread([this] { run(); }).detach();
      worker_started_ = true;
    }
    cv_.notify_all();
    return ++queued_;
  }

  uint64_t queued() {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_;
  }

  bool reached(uint64_t pos) const { return done_.load(std::memory_order_acquire) >= pos; }

  // Blocks until `pos` is reached, without holding the GIL (queued work may need it).
  void wait(uint64_t pos) {
    if (reached(pos)) {
      return;
    }
    auto block = [&] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return reached(pos); });
    };
    if (Py_IsInitialized() && PyGILState_Check()) {
      PyThreadState* state = PyEval_SaveThread();
      block();
      PyEval_RestoreThread(state);
    } else {
      block();
    }
  }

  // The first failure of queued work since the last call, raised once.
  void raise_failure(const c10::Stream& s) {
    std::string msg;
    {
      std::lock_guard<std::mutex> lock(mu_);
      msg.swap(failure_);
    }
    TORCH_CHECK(msg.empty(), "asynchronous work on ", s.device(), " stream ", s.id(),
                " failed: ", msg);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !tasks_.empty(); });
      std::function<void()> work = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      std::string error;
      try {
        work();
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown error";
      }
      work = nullptr;   // release what the work holds before it counts as done
      lock.lock();
      if (!error.empty() && failure_.empty()) {
        failure_ = std::move(error);
      }
      done_.fetch_add(1, std::memory_order_release);
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  uint64_t queued_ = 0;
  std::atomic<uint64_t> done_{0};
  bool worker_started_ = false;
  std::string failure_;
};

struct DeviceStreams {
  std::array<Queue, kStreamPool + 1> queues;   // [0] is the default stream
  std::atomic<uint32_t> next{0};
};

std::array<std::atomic<DeviceStreams*>, kMaxDevices> devices{};
std::mutex devices_mu;
thread_local std::array<c10::StreamId, kMaxDevices> tls_current{};   // 0: the default stream

DeviceStreams& streams_of(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "invalid rbln device index ",
              static_cast<int>(index));
  DeviceStreams* ds = devices[index].load(std::memory_order_acquire);
  if (ds == nullptr) {
    std::lock_guard<std::mutex> lock(devices_mu);
    ds = devices[index].load();
    if (ds == nullptr) {
      ds = new DeviceStreams();   // lives for the process
      devices[index].store(ds, std::memory_order_release);
    }
  }
  return *ds;
}

Queue& queue_of(const c10::Stream& s) {
  TORCH_CHECK(s.device_type() == c10::DeviceType::PrivateUse1, "expected an rbln stream, got ",
              s);
  TORCH_CHECK(s.id() >= 0 && s.id() <= kStreamPool, "invalid rbln stream id ", s.id());
  return streams_of(s.device_index()).queues[s.id()];
}

c10::Stream make(c10::DeviceIndex index, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, index), id);
}

std::atomic<uint64_t> generation{0};   // moves at every fork (in the child)

// A forked child (a DataLoader worker) has no worker threads: give it fresh, empty queues.
void reset_after_fork() {
  for (auto& d : devices) {
    d.store(nullptr);
  }
  generation.fetch_add(1);
}
[[maybe_unused]] const int fork_handler = pthread_atfork(nullptr, nullptr, reset_after_fork);

struct Event {
  Queue* queue = nullptr;   // null until recorded
  c10::DeviceIndex device = -1;
  uint64_t pos = 0;
};

}  // namespace

c10::Stream default_stream(c10::DeviceIndex index) { return make(index_or_current(index), 0); }

c10::Stream current_stream(c10::DeviceIndex index) {
  index = index_or_current(index);
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "invalid rbln device index ",
              static_cast<int>(index));
  return make(index, tls_current[index]);
}

c10::Stream exchange_stream(c10::Stream s) {
  queue_of(s);   // validates
  c10::Stream prev = current_stream(s.device_index());
  tls_current[s.device_index()] = s.id();
  return prev;
}

c10::Stream new_stream(c10::DeviceIndex index) {
  index = index_or_current(index);
  check_index(index);
  uint32_t n = streams_of(index).next.fetch_add(1);
  return make(index, static_cast<c10::StreamId>(n % kStreamPool + 1));
}

bool query_stream(const c10::Stream& s) {
  Queue& q = queue_of(s);
  return q.reached(q.queued());
}

void synchronize_stream(const c10::Stream& s) {
  Queue& q = queue_of(s);
  q.wait(q.queued());
  q.raise_failure(s);
}

void synchronize_device(c10::DeviceIndex index) {
  for (c10::StreamId id = 0; id <= kStreamPool; ++id) {
    synchronize_stream(make(index, id));
  }
}

uint64_t enqueue(const c10::Stream& s, std::function<void()> work) {
  return queue_of(s).enqueue(std::move(work));
}

QueuePoint enqueue_point(const c10::Stream& s, std::function<void()> work) {
  Queue& q = queue_of(s);
  QueuePoint p;
  p.generation = generation.load();
  p.pos = q.enqueue(std::move(work));
  p.queue = &q;
  return p;
}

QueuePoint stream_point(const c10::Stream& s) {
  Queue& q = queue_of(s);
  QueuePoint p;
  p.generation = generation.load();
  p.pos = q.queued();
  p.queue = p.pos ? &q : nullptr;
  return p;
}

bool point_reached(const QueuePoint& p) {
  return !p || p.generation != generation.load() || static_cast<Queue*>(p.queue)->reached(p.pos);
}

void wait_point(const QueuePoint& p) {
  if (!point_reached(p)) {
    static_cast<Queue*>(p.queue)->wait(p.pos);
  }
}

void record_event(void** event, const c10::Stream& s) {
  auto* ev = static_cast<Event*>(*event);
  if (ev == nullptr) {
    ev = new Event();
    *event = ev;
  }
  ev->queue = &queue_of(s);
  ev->device = s.device_index();
  ev->pos = ev->queue->queued();
}

void block_on_event(void* event, const c10::Stream& s) {
  auto* ev = static_cast<Event*>(event);
  if (ev == nullptr || ev->queue == nullptr || ev->queue->reached(ev->pos)) {
    return;   // never recorded, or its work is done: nothing to wait for
  }
  Queue& target = queue_of(s);
  if (&target == ev->queue) {
    return;   // a stream runs its work in order
  }
  if (ev->device != s.device_index()) {
    ev->queue->wait(ev->pos);   // across devices there is no device-side fence: the host waits
    return;
  }
  // a device-side fence: work queued on `s` after this waits for the event's work
  Queue* q = ev->queue;
  uint64_t pos = ev->pos;
  target.enqueue([q, pos] { q->wait(pos); });
}

bool query_event(void* event) {
  auto* ev = static_cast<Event*>(event);
  return ev == nullptr || ev->queue == nullptr || ev->queue->reached(ev->pos);
}

void synchronize_event(void* event) {
  auto* ev = static_cast<Event*>(event);
  if (ev != nullptr && ev->queue != nullptr) {
    ev->queue->wait(ev->pos);
  }
}

void destroy_event(void* event) noexcept { delete static_cast<Event*>(event); }

void bind_stream(py::module_& m) {
  auto pack = [](const c10::Stream& s) {
    return py::make_tuple(s.id(), static_cast<int>(s.device_index()),
                          static_cast<int>(s.device_type()));
  };
  m.def("_current_stream", [pack](int index) { return pack(current_stream(index)); });
  m.def("_default_stream", [pack](int index) { return pack(default_stream(index)); });
  m.def("_set_stream", [](int64_t id, int index) {
    exchange_stream(make(static_cast<c10::DeviceIndex>(index), id));
  });
  m.def("_synchronize_device", [](int index) { synchronize_device(index); });
  // Queue a Python callable on a stream (the worker takes the GIL to run it).
  m.def("_enqueue", [](int64_t id, int index, py::function fn) {
    auto holder = std::shared_ptr<PyObject>(fn.release().ptr(), [](PyObject* o) {
      py::gil_scoped_acquire gil;
      Py_DECREF(o);
    });
    return enqueue(make(static_cast<c10::DeviceIndex>(index), id), [holder] {
      py::gil_scoped_acquire gil;
      try {
        py::handle(holder.get())();
      } catch (py::error_already_set& e) {
        throw std::runtime_error(e.what());
      }
    });
  });
}

}  // namespace torch_rbln
