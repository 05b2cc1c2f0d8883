// torch.profiler on the NPU: a Kineto activity profiler for PrivateUse1.
//
// torch's profiler (ProfilerActivity.PrivateUse1) creates one session of this profiler per
// profile (PrivateUse1ProfilerRegistry forwards our factory to Kineto). While a session
// records, the event stream's tap (Events.h) turns every device program and every physical
// copy into an activity here, at the call that counts the event, so the profiler and explain
// read one stream. Each activity becomes, in the trace:
//   * a slice on the NPU's row (process "rbln:N"): the program (CONCURRENT_KERNEL) or the copy
//     (GPU_MEMCPY, with its bytes), for the time the virtual NPU spent on it;
//   * a launch slice on the host thread that ran it (PRIVATEUSE1_RUNTIME), with a flow arrow to
//     the device slice, as cudaLaunchKernel has;
// both linked to the aten op open on that thread (the correlation id torch pushes for every op),
// which is how key_averages() gives that op its device time.
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/utils/pybind.h>

#include <IActivityProfiler.h>
#include <ThreadUtil.h>
#include <libkineto.h>
#include <output_base.h>

#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "Events.h"

namespace py = pybind11;

namespace torch_rbln {

// ------------------------------------------------------------------------------------------
// the tap: what the event stream hands over while a session records

namespace events::tap {
std::atomic<bool> on{false};

int64_t now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace events::tap

namespace {

struct Recorded {
  const events::Counter* counter;  // its kind says program or copy, its key names it
  int device;
  int64_t start, end, bytes;
  uint64_t op;     // correlation id of the aten op open on the thread (0: none)
  int32_t thread;  // the host thread (system id), for the launch slice
};

std::mutex recorded_mutex;
std::vector<Recorded> recorded;  // since the running session started

// the correlation ids of the ops open on this thread, innermost last (torch pushes one per op)
thread_local std::vector<uint64_t> open_ops;
thread_local int32_t thread_id = 0;

// the Python side's copy of `on` (events._tap_on), set when a session starts and stops
py::object* python_switch = nullptr;

void set_recording(bool recording) {
  events::tap::on.store(recording);
  if (python_switch != nullptr && Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    try {
      (*python_switch)(recording);
    } catch (py::error_already_set& e) {
      e.restore();  // reported by Python, not thrown through Kineto
      PyErr_WriteUnraisable(nullptr);
    }
  }
}

}  // namespace

namespace events::tap {
void activity(const Counter& c, int device, int64_t start_ns, int64_t end_ns, int64_t bytes) {
  if (thread_id == 0) {
    thread_id = libkineto::systemThreadId();
  }
  const uint64_t op = open_ops.empty() ? 0 : open_ops.back();
  std::lock_guard<std::mutex> lock(recorded_mutex);
  recorded.push_back({&c, device, start_ns, end_ns, bytes, op, thread_id});
}
}  // namespace events::tap

namespace {

// ------------------------------------------------------------------------------------------
// the Kineto session and profiler

const char* copy_name(const std::string& kind) {
  if (kind == "h2d") {
    return "Memcpy HtoD (rbln)";
  }
  if (kind == "d2h") {
    return "Memcpy DtoH (rbln)";
  }
  return "Memcpy DtoD (rbln)";
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> lock(recorded_mutex);
      recorded.clear();
    }
    start_ns_ = events::tap::now();
    set_recording(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    set_recording(false);
    end_ns_ = events::tap::now();
    std::lock_guard<std::mutex> lock(recorded_mutex);
    mine_.swap(recorded);
    recorded.clear();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    return {};
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; },
                 start_ns_, end_ns_);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked_op, int64_t /*start*/,
                    int64_t /*end*/) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns_, end_ns_, "rbln");
    buffer_->gpuOpCount = 0;
    // one process row per NPU that ran something (rbln:0's comes from getDeviceInfo)
    std::set<int> devices{0};
    for (const auto& r : mine_) {
      devices.insert(r.device);
    }
    for (int d : devices) {
      if (d != 0) {
        logger.handleDeviceInfo(row(d), start_ns_);
      }
      logger.handleResourceInfo(libkineto::ResourceInfo{0, 0, d, "programs and copies"},
                                start_ns_);
    }
    const int32_t pid = libkineto::processId();
    for (const auto& r : mine_) {
      const bool program = r.counter->kind == "device_program";
      const uint32_t flow = ++flows_;
      const libkineto::ITraceActivity* op =
          r.op != 0 ? linked_op(static_cast<int32_t>(r.op)) : nullptr;
      // the launch, on the host thread
      buffer_->emplace_activity(buffer_->span, libkineto::ActivityType::PRIVATEUSE1_RUNTIME,
                                program ? "rbln_launch_program" : "rbln_memcpy");
      auto& launch = *buffer_->activities.back();
      fill(launch, r, flow, op);
      launch.device = pid;
      launch.resource = r.thread;
      launch.flow.start = 1;
      // the NPU's work
      buffer_->emplace_activity(
          buffer_->span,
          program ? libkineto::ActivityType::CONCURRENT_KERNEL : libkineto::ActivityType::GPU_MEMCPY,
          program ? "program: " + r.counter->key : std::string(copy_name(r.counter->kind)));
      auto& work = *buffer_->activities.back();
      fill(work, r, flow, op);
      work.device = r.device;
      work.resource = 0;
      work.flow.start = 0;
      work.addMetadataQuoted("device", "rbln:" + std::to_string(r.device));
      if (!program) {
        work.addMetadataQuoted("bytes", std::to_string(r.bytes));
      }
      buffer_->gpuOpCount += 1;
      buffer_->span.opCount += 1;
    }
    for (const auto& a : buffer_->activities) {
      a->log(logger);
    }
    mine_.clear();
  }

  // a session that names its row also keeps Kineto from naming rows 0-15 "GPU n"
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(row(0));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return {};
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);  // Kineto keeps the activities alive with the trace
  }

  void pushCorrelationId(uint64_t id) override {
    open_ops.push_back(id);
  }

  void popCorrelationId() override {
    if (!open_ops.empty()) {
      open_ops.pop_back();
    }
  }

 private:
  // the NPU's process row, below the host's (as Kineto places GPU rows)
  static libkineto::DeviceInfo row(int device) {
    const std::string name = "rbln:" + std::to_string(device);
    return libkineto::DeviceInfo{device, libkineto::kExceedMaxPid + device, name, name};
  }

  static void fill(libkineto::GenericTraceActivity& a, const Recorded& r, uint32_t flow,
                   const libkineto::ITraceActivity* op) {
    a.startTime = r.start;
    a.endTime = r.end;
    a.id = static_cast<int32_t>(flow);
    a.threadId = r.thread;
    a.linked = op;
    if (op != nullptr) {
      a.flow.id = flow;
      a.flow.type = libkineto::kLinkAsyncCpuGpu;
    }
  }

  int64_t start_ns_ = 0, end_ns_ = 0;
  std::vector<Recorded> mine_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  uint32_t flows_ = 0;
};

class Profiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    return name_;
  }

  const std::set<libkineto::ActivityType>& availableActivities() const override {
    return activities_;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config& /*config*/) override {
    // PRIVATEUSE1_RUNTIME is among the CPU types too: only device work asks for a session
    if (types.count(libkineto::ActivityType::CONCURRENT_KERNEL) != 0 ||
        types.count(libkineto::ActivityType::GPU_MEMCPY) != 0) {
      return std::make_unique<Session>();
    }
    return nullptr;  // a profile without PrivateUse1 activity: the tap stays off
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"rbln"};
  std::set<libkineto::ActivityType> activities_{
      libkineto::ActivityType::CONCURRENT_KERNEL, libkineto::ActivityType::GPU_MEMCPY,
      libkineto::ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(Profiler);

}  // namespace

void bind_profiler(py::module_& m) {
  m.def("set_tap_switch", [](py::object fn) {
    if (python_switch == nullptr) {
      python_switch = new py::object();  // never freed: a session may stop at exit
    }
    *python_switch = std::move(fn);
  }, "Python's copy of the tap's switch: called with True/False as a profile starts/stops.");
  m.def("tap_activity",
        [](const std::string& kind, const std::string& key, int device, int64_t start_ns,
           int64_t end_ns, int64_t bytes) {
          events::tap::activity(*events::counter(kind, key), device, start_ns, end_ns, bytes);
        },
        "A device activity of an event Python recorded (events.record_program/record_copy).");
  m.def("tap_now", &events::tap::now);
  m.def("tap_registered", []() {
    return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory();
  });
}

}  // namespace torch_rbln
