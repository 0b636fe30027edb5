// mesos::slave::Isolator over the C ABI of libmesos_gpu (ffi/include/mesos_gpu.h).
//
// Each method serializes its protobuf arguments, calls the matching mgpu_ function, grows the
// answer buffer on MGPU_BUFFER_TOO_SMALL, parses the answer, and turns any other status into a
// process::Failure carrying the library's error text. Nothing else happens here: every decision
// is made in Rust. The calls are synchronous and short (prepare and cleanup write one cgroup);
// `watch` polls without blocking, once per second, on the libprocess clock.
//
// `prepare` retries MGPU_NOT_ENOUGH_GPUS every 250 ms for up to 30 s, without blocking: Mesos
// offers GPUs by its own count, which can name GPUs the module does not hand out at that moment
// (one the health monitor took out of the pool until an operator marks it healthy, GPUs a
// container still holds until its cleanup). The task then waits for them instead of failing at
// once, and fails with the module's reason when they do not come.
//
// One isolator state per agent: the first `create` makes the handle, later ones (the module
// loaded for more than one containerizer) share it, so every container draws from one GPU pool.
//
// The handle also serves the library's metrics (mgpu_metrics) and each container's GPU usage
// (mgpu_containers) on the agent's own HTTP port, as the libprocess process `mesos-gpu`:
// GET http://<agent>:5051/mesos-gpu/metrics and /mesos-gpu/containers. The latter exists because
// Mesos's /monitor/statistics drops the GPU figures usage() returns in the unknown field 1000.
//
// Build: ffi/mesos-module/CMakeLists.txt, against the installed Mesos the agent runs, in strict
// ISO C++17 with the protobuf headers of the agent's protobuf (checked at build time; at start,
// a second protobuf runtime in the process refuses the module).

#include <link.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <glog/logging.h>

#include <google/protobuf/stubs/common.h>

#include <mesos/mesos.hpp>
#include <mesos/module/isolator.hpp>
#include <mesos/resources.hpp>
#include <mesos/slave/isolator.hpp>

#include <process/after.hpp>
#include <process/clock.hpp>
#include <process/future.hpp>
#include <process/http.hpp>
#include <process/loop.hpp>
#include <process/process.hpp>

#include <stout/duration.hpp>
#include <stout/hashset.hpp>
#include <stout/error.hpp>
#include <stout/nothing.hpp>
#include <stout/option.hpp>
#include <stout/try.hpp>

#include "mesos_gpu.h"

using mesos::ContainerID;
using mesos::ContainerStatus;
using mesos::Parameters;
using mesos::Resource;
using mesos::Resources;
using mesos::ResourceStatistics;
using mesos::Value;
using mesos::slave::ContainerConfig;
using mesos::slave::ContainerLaunchInfo;
using mesos::slave::ContainerLimitation;
using mesos::slave::ContainerRecoverInfo;
using mesos::slave::ContainerState;
using mesos::slave::Isolator;
using process::Failure;
using process::Future;

namespace {

constexpr size_t kErrCap = 4096;
constexpr size_t kFirstCap = 4096;
const Duration kWatchPoll = Seconds(1);
const Duration kPrepareRetry = Milliseconds(250);
const Duration kPrepareWait = Seconds(30);

// Forwards the library's log events to glog.
extern "C" void forwardLog(MgpuLogLevel level, const char* target, const char* message, void*) {
  switch (level) {
    case MGPU_LOG_ERROR: LOG(ERROR) << "[" << target << "] " << message; break;
    case MGPU_LOG_WARN: LOG(WARNING) << "[" << target << "] " << message; break;
    case MGPU_LOG_INFO: LOG(INFO) << "[" << target << "] " << message; break;
    case MGPU_LOG_DEBUG: VLOG(1) << "[" << target << "] " << message; break;
    case MGPU_LOG_TRACE: VLOG(2) << "[" << target << "] " << message; break;
  }
}

std::string failureText(MgpuStatus status, const char* err) {
  const char* name = mgpu_status_name(static_cast<uint32_t>(status));
  return std::string("GPU isolator: ") + (name != nullptr ? name : "MGPU_?") + ": " + err;
}

const uint8_t* bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::string serialize(const google::protobuf::Message& message) {
  std::string out;
  message.SerializeToString(&out);
  return out;
}

// What a call with an output buffer answered: its status, the bytes on MGPU_OK, else the error.
struct Answer {
  MgpuStatus status;
  std::string bytes;
  std::string error;
};

// Calls `call(buf, cap, &len, err, err_cap)`, growing the buffer once when it is too small.
// The library keeps the answer of a call with side effects for that retry.
template <typename Call>
Answer callWithBuffer(Call call) {
  std::string out(kFirstCap, '\0');
  char err[kErrCap] = "";
  size_t len = 0;
  MgpuStatus status = call(reinterpret_cast<uint8_t*>(&out[0]), out.size(), &len, err, kErrCap);
  if (status == MGPU_BUFFER_TOO_SMALL) {
    out.resize(len);
    status = call(reinterpret_cast<uint8_t*>(&out[0]), out.size(), &len, err, kErrCap);
  }
  if (status != MGPU_OK) {
    return Answer{status, std::string(), failureText(status, err)};
  }
  out.resize(len);
  return Answer{status, out, std::string()};
}

template <typename Call>
Try<std::string> withBuffer(Call call) {
  Answer answer = callWithBuffer(call);
  if (answer.status != MGPU_OK) {
    return Error(answer.error);
  }
  return answer.bytes;
}

// Turns a call without an answer into a Future<Nothing>.
template <typename Call>
Future<Nothing> nothing(Call call) {
  char err[kErrCap] = "";
  MgpuStatus status = call(err, kErrCap);
  if (status != MGPU_OK) {
    return Failure(failureText(status, err));
  }
  return Nothing();
}

// Collects the paths of the libprotobuf shared objects loaded in this process.
int collectProtobuf(struct dl_phdr_info* info, size_t, void* data) {
  const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const std::string base = name.substr(name.find_last_of('/') + 1);
  if (base.rfind("libprotobuf.so", 0) == 0) {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
  }
  return 0;
}

// The module shares protobuf classes with libmesos: exactly one protobuf runtime may be loaded.
// Two mean the module was linked against another protobuf than the agent's.
Option<Error> checkProtobufRuntime() {
  std::vector<std::string> loaded;
  dl_iterate_phdr(collectProtobuf, &loaded);
  if (loaded.size() <= 1) {
    return None();
  }
  std::string names;
  for (const std::string& name : loaded) names += (names.empty() ? "" : ", ") + name;
  return Error("GPU isolator: this agent has several protobuf runtimes loaded (" + names +
               "): the module was built with protobuf " +
               google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION) +
               " headers, not the agent's protobuf; rebuild it against the headers of the protobuf "
               "libmesos links");
}

template <typename T>
Future<T> parsed(const Try<std::string>& answer) {
  if (answer.isError()) {
    return Failure(answer.error());
  }
  T message;
  if (!message.ParseFromString(answer.get())) {
    return Failure("GPU isolator: cannot parse the answer as " + message.GetTypeName());
  }
  return message;
}

// Serves GET /mesos-gpu/metrics, the library's OpenMetrics text (collected at most once a second),
// and GET /mesos-gpu/containers, every container's GPUs, health and NVML figures as JSON.
class MetricsProcess : public process::Process<MetricsProcess> {
 public:
  explicit MetricsProcess(const MgpuIsolator* raw) : ProcessBase("mesos-gpu"), raw_(raw) {}

 protected:
  void initialize() override {
    route("/metrics",
          "GPU metrics of the mesos-gpu isolator (Prometheus OpenMetrics text): NVML figures, "
          "health and its reason, XIDs, GPUs allocated, free, quarantined and unhealthy, "
          "allocations and refusals by reason.",
          [this](const process::http::Request&) -> Future<process::http::Response> {
            Try<std::string> text = fetch(mgpu_metrics, "metrics");
            if (text.isError()) return process::http::InternalServerError(text.error());
            process::http::OK ok(text.get());
            ok.headers["Content-Type"] = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            return ok;
          });
    route("/containers",
          "GPU usage per container of the mesos-gpu isolator (JSON): each container's kind, its "
          "GPUs (index, minor, UUID, health, utilisation, memory used by its own processes, "
          "memory in all, processes), MIG devices and share. /monitor/statistics does not show "
          "these: Mesos drops the unknown ResourceStatistics field 1000 that carries them.",
          [this](const process::http::Request&) -> Future<process::http::Response> {
            Try<std::string> json = fetch(mgpu_containers, "containers' GPU usage");
            if (json.isError()) return process::http::InternalServerError(json.error());
            process::http::OK ok(json.get());
            ok.headers["Content-Type"] = "application/json";
            return ok;
          });
  }

 private:
  using Answer = MgpuStatus (*)(const MgpuIsolator*, uint8_t*, size_t, size_t*, char*, size_t);

  // The answer may grow between two calls (a new container): grow the buffer until it fits.
  Try<std::string> fetch(Answer call, const char* what) const {
    std::string out(64 * 1024, '\0');
    char err[kErrCap] = "";
    for (int attempt = 0; attempt < 4; ++attempt) {
      size_t len = 0;
      MgpuStatus status = call(raw_, reinterpret_cast<uint8_t*>(&out[0]), out.size(), &len, err, kErrCap);
      if (status == MGPU_OK) {
        out.resize(len);
        return out;
      }
      if (status != MGPU_BUFFER_TOO_SMALL) return Error(failureText(status, err));
      out.resize(len * 2);
    }
    return Error(std::string("GPU isolator: the ") + what + " kept growing");
  }

  const MgpuIsolator* raw_;
};

// The handle shared by every isolator this module creates in the agent.
class Handle {
 public:
  static Try<std::shared_ptr<Handle>> get(const Parameters& parameters) {
    static std::mutex mutex;
    static std::weak_ptr<Handle> shared;
    static std::string sharedParams;
    std::lock_guard<std::mutex> lock(mutex);
    const std::string params = serialize(parameters);
    if (std::shared_ptr<Handle> existing = shared.lock()) {
      if (params != sharedParams) {
        return Error("GPU isolator: the module is already loaded with other parameters");
      }
      return existing;
    }
    Option<Error> runtime = checkProtobufRuntime();
    if (runtime.isSome()) {
      return runtime.get();
    }
    LOG(INFO) << "GPU isolator module " << mgpu_version() << " built for Mesos " << MESOS_VERSION
              << " with protobuf " << google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION);
    char err[kErrCap] = "";
    mgpu_set_log_callback(forwardLog, nullptr, VLOG_IS_ON(2) ? MGPU_LOG_TRACE
                                             : VLOG_IS_ON(1) ? MGPU_LOG_DEBUG : MGPU_LOG_INFO,
                          err, kErrCap);
    MgpuIsolator* raw = nullptr;
    MgpuStatus status = mgpu_isolator_new(bytes(params), params.size(), &raw, err, kErrCap);
    if (status != MGPU_OK) {
      return Error(failureText(status, err));
    }
    std::shared_ptr<Handle> handle(new Handle(raw));
    shared = handle;
    sharedParams = params;
    return handle;
  }

  ~Handle() {
    process::terminate(metrics_.get());
    process::wait(metrics_.get());
    mgpu_isolator_free(raw_);
  }
  const MgpuIsolator* raw() const { return raw_; }

 private:
  explicit Handle(MgpuIsolator* raw) : raw_(raw), metrics_(new MetricsProcess(raw)) {
    process::spawn(metrics_.get());
  }
  MgpuIsolator* raw_;
  std::unique_ptr<MetricsProcess> metrics_;
};

class MesosGpuIsolator : public Isolator {
 public:
  explicit MesosGpuIsolator(std::shared_ptr<Handle> handle) : handle_(std::move(handle)) {}
  ~MesosGpuIsolator() override = default;

  bool supportsNesting() override { return true; }
  bool supportsStandalone() override { return true; }

  Future<Nothing> recover(const std::vector<ContainerState>& states,
                          const hashset<ContainerID>& orphans) override {
    ContainerRecoverInfo info;
    for (const ContainerState& state : states) info.add_checkpointed_container_states()->CopyFrom(state);
    for (const ContainerID& orphan : orphans) info.add_orphan_container_ids()->CopyFrom(orphan);
    const std::string in = serialize(info);
    return nothing([&](char* err, size_t cap) { return mgpu_recover(h(), bytes(in), in.size(), err, cap); });
  }

  Future<Option<ContainerLaunchInfo>> prepare(const ContainerID& id, const ContainerConfig& config) override {
    const std::string idBytes = serialize(id), in = serialize(config);
    std::shared_ptr<Handle> handle = handle_;
    auto attempt = [handle, idBytes, in]() {
      return callWithBuffer([&](uint8_t* buf, size_t cap, size_t* len, char* err, size_t ecap) {
        return mgpu_prepare(handle->raw(), bytes(idBytes), idBytes.size(), bytes(in), in.size(), buf, cap,
                            len, err, ecap);
      });
    };
    Answer first = attempt();
    if (first.status != MGPU_NOT_ENOUGH_GPUS) {
      return launchInfo(first);
    }
    LOG(INFO) << "GPU isolator: container " << id << " waits up to " << kPrepareWait
              << " for GPUs Mesos offered but the module does not hand out now (" << first.error << ")";
    const process::Time deadline = process::Clock::now() + kPrepareWait;
    return process::loop(
               [] { return process::after(kPrepareRetry); },
               [attempt, deadline](const Nothing&) -> Future<process::ControlFlow<Answer>> {
                 Answer answer = attempt();
                 if (answer.status == MGPU_NOT_ENOUGH_GPUS && process::Clock::now() < deadline) {
                   return process::Continue();
                 }
                 return process::Break(answer);
               })
        .then([](const Answer& answer) { return launchInfo(answer); });
  }

  // Mesos's `None` for no bytes, else the parsed ContainerLaunchInfo.
  static Future<Option<ContainerLaunchInfo>> launchInfo(const Answer& answer) {
    if (answer.status != MGPU_OK) return Failure(answer.error);
    if (answer.bytes.empty()) return None();
    ContainerLaunchInfo info;
    if (!info.ParseFromString(answer.bytes)) {
      return Failure("GPU isolator: cannot parse the answer as " + info.GetTypeName());
    }
    return Option<ContainerLaunchInfo>(info);
  }

  Future<Nothing> isolate(const ContainerID& id, pid_t pid) override {
    const std::string idBytes = serialize(id);
    return nothing([&](char* err, size_t cap) {
      return mgpu_isolate(h(), bytes(idBytes), idBytes.size(), pid, err, cap);
    });
  }

  Future<ContainerLimitation> watch(const ContainerID& id) override {
    const std::string idBytes = serialize(id);
    std::shared_ptr<Handle> handle = handle_;
    return process::loop(
        [] { return process::after(kWatchPoll); },
        [handle, idBytes](const Nothing&) -> Future<process::ControlFlow<ContainerLimitation>> {
          char err[kErrCap] = "";
          std::string out(kFirstCap, '\0');
          size_t len = 0;
          MgpuStatus status = mgpu_watch(handle->raw(), bytes(idBytes), idBytes.size(), 0,
                                         reinterpret_cast<uint8_t*>(&out[0]), out.size(), &len, err, kErrCap);
          if (status == MGPU_BUFFER_TOO_SMALL) {
            out.resize(len);
            status = mgpu_watch(handle->raw(), bytes(idBytes), idBytes.size(), 0,
                                reinterpret_cast<uint8_t*>(&out[0]), out.size(), &len, err, kErrCap);
          }
          switch (status) {
            case MGPU_TIMED_OUT: return process::Continue();
            // Cleaned up: no limitation will come; never resolve, as Mesos's default watch.
            case MGPU_UNKNOWN_CONTAINER: return Future<process::ControlFlow<ContainerLimitation>>();
            case MGPU_OK: {
              ContainerLimitation limitation;
              if (!limitation.ParseFromArray(out.data(), static_cast<int>(len))) {
                return Failure("GPU isolator: cannot parse the ContainerLimitation");
              }
              return process::Break(limitation);
            }
            default: return Failure(failureText(status, err));
          }
        });
  }

  Future<Nothing> update(const ContainerID& id, const Resources& requests,
                         const google::protobuf::Map<std::string, Value::Scalar>& limits) override {
    ContainerConfig carrier;  // only `resources` and `limits` are read
    for (const Resource& resource : requests) carrier.add_resources()->CopyFrom(resource);
    carrier.mutable_limits()->insert(limits.begin(), limits.end());
    std::string in;
    carrier.SerializePartialToString(&in);
    const std::string idBytes = serialize(id);
    return nothing([&](char* err, size_t cap) {
      return mgpu_update(h(), bytes(idBytes), idBytes.size(), bytes(in), in.size(), err, cap);
    });
  }

  Future<ResourceStatistics> usage(const ContainerID& id) override {
    const std::string idBytes = serialize(id);
    return parsed<ResourceStatistics>(withBuffer([&](uint8_t* buf, size_t cap, size_t* len, char* err, size_t ecap) {
      return mgpu_usage(h(), bytes(idBytes), idBytes.size(), buf, cap, len, err, ecap);
    }));
  }

  Future<ContainerStatus> status(const ContainerID& id) override {
    const std::string idBytes = serialize(id);
    return parsed<ContainerStatus>(withBuffer([&](uint8_t* buf, size_t cap, size_t* len, char* err, size_t ecap) {
      return mgpu_status(h(), bytes(idBytes), idBytes.size(), buf, cap, len, err, ecap);
    }));
  }

  Future<Nothing> cleanup(const ContainerID& id) override {
    const std::string idBytes = serialize(id);
    return nothing([&](char* err, size_t cap) { return mgpu_cleanup(h(), bytes(idBytes), idBytes.size(), err, cap); });
  }

 private:
  const MgpuIsolator* h() const { return handle_->raw(); }
  std::shared_ptr<Handle> handle_;
};

Isolator* createIsolator(const Parameters& parameters) {
  Try<std::shared_ptr<Handle>> handle = Handle::get(parameters);
  if (handle.isError()) {
    LOG(ERROR) << "Cannot create the GPU isolator: " << handle.error();
    return nullptr;
  }
  return new MesosGpuIsolator(handle.get());
}

}  // namespace

// The module's name in modules.json and --isolation is this variable's name.
mesos::modules::Module<Isolator> org_apache_mesos_gpu_MesosGpuIsolator(
    MESOS_MODULE_API_VERSION,
    MESOS_VERSION,
    "mesos-gpu",
    "mesos-gpu@example.invalid",
    "NVIDIA GPU isolator: allocation, device cgroups, driver volume (libmesos_gpu)",
    nullptr,
    createIsolator);
