// The Docker containerizer's side of the node's GPU pool: a Mesos hook module.
//
// Mesos's Docker containerizer never calls isolator modules, so GPUs for Docker tasks are
// reserved here, in `slavePreLaunchDockerTaskExecutorDecorator`, which the agent runs before
// it starts the container `mesos-<container id>` of a task. The hook reads nothing of the task
// itself: it hands the task's resources and container info to the library
// (`mgpu_docker_hook_launch_argv`, ffi/src/hook.rs), which answers the command to run, or none
// for a task asking for no GPU and no MIG device: the operator's `docker_args` command line
// (module parameter, e.g. `/usr/bin/mesos-gpu docker-args --pool-dir /var/lib/mesos-gpu`) with
// the task's `--gpus`, `--mig=mig-<profile>:N`, `--cpus` (with `--numa-pinning`),
// `--container-id` and `--json` appended. `mesos-gpu docker-args` reserves from the node's pool
// for that container name and prints the task's grant as a versioned JSON launch (devices,
// variables, share, cpuset and the node's driver), which the wrapper renders for the image as
// every Docker path renders one. The hook runs
// before the agent pulls the image, so the task's image is given with `--unpulled-image-ok`:
// an image the daemon already has is checked now (an image whose `com.nvidia.cuda.version` is
// newer than the driver's CUDA fails the launch, and so the task, with a message saying so);
// one not pulled yet is checked by the wrapper at `docker run`, which gives the driver volume
// only to an image that asks for the driver. `docker-args` records its parent,
// this agent, as the process that starts the container: the reservation is alive while the
// agent runs, until the wrapper records itself at `docker run`; an agent that dies before that
// leaves a reservation the pool frees once the daemon has no such container. The hook
// hands the launch, unchanged, to the container's `docker run` in the task environment variable
// MESOS_GPU_DOCKER_ARGS, which `mesos-gpu docker-wrapper` (the agent's `--docker` program)
// renders into arguments for the pulled image and removes. When the pool cannot serve the task, the command's error becomes the launch failure
// and so the task's status message. When the agent removes the task's executor
// (`slaveRemoveExecutorHook`), the hook runs the same command line with `--release ID`, so GPUs
// reserved for a container that never ran (its image could not be pulled, its launch failed)
// go back too; the wrapper releases them when `docker run` ends, and a second release is a
// no-op. `--release` keeps the GPUs while the daemon says the container still runs (an executor
// that lost its `docker run` to a dockerd restart with live-restore) and logs why. Which container an executor had is kept in memory only: after an agent restart the
// wrapper's release remains.
//
// The command runs asynchronously (libprocess subprocess and io), so no libprocess thread waits
// for it.
//
// Creating the hook also initializes libmesos's own NVML wrapper when NVML loads. With `docker`
// among --containerizers, Mesos 1.12 creates its Docker GPU allocator whenever NVML loads
// (containerizer.cpp 245-275) and enumerates the `gpus` of --resources through NVML
// (isolators/gpu/allocator.cpp 79-113), but it initializes NVML only when `gpu/nvidia` is in
// --isolation (allocator.cpp 167-175), which the module replaces: the agent would exit with
// "Failed to nvml::deviceGetHandleByIndex: NVML has not been initialized". Hooks are created
// before the containerizer (slave/main.cpp), so initializing here lets it start.

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <glog/logging.h>

#include <mesos/slave/containerizer.hpp>

#include <mesos/hook.hpp>
#include <mesos/mesos.hpp>
#include <mesos/module/hook.hpp>

#include <process/collect.hpp>
#include <process/future.hpp>
#include <process/io.hpp>
#include <process/subprocess.hpp>

#include <stout/foreach.hpp>
#include <stout/nothing.hpp>
#include <stout/option.hpp>
#include <stout/strings.hpp>
#include <stout/try.hpp>

#include "mesos_gpu.h"

// libmesos's NVML wrapper (src/common/nvml.hpp, not installed; exported by libmesos.so).
namespace nvml {
bool isAvailable();
Try<Nothing> initialize();
}  // namespace nvml

using mesos::DockerTaskExecutorPrepareInfo;
using mesos::Environment;
using mesos::ExecutorInfo;
using mesos::FrameworkInfo;
using mesos::Hook;
using mesos::Parameter;
using mesos::Parameters;
using mesos::TaskInfo;
using process::Failure;
using process::Future;
using process::Subprocess;

namespace {

// The task environment variable that carries `docker-args`' launch (JSON) to the wrapper.
const char kArgsVariable[] = "MESOS_GPU_DOCKER_ARGS";
// Room for the library's error message.
const size_t kErrCap = 4096;

// The library's answer of `call(buf, cap, &len, err, err_cap)`, NUL-separated arguments, with the
// buffer grown once when it is too small; an empty vector when it answered no bytes.
template <typename Call>
Try<std::vector<std::string>> argvFrom(Call call) {
  std::string out(4096, '\0');
  char err[kErrCap] = "";
  size_t len = 0;
  MgpuStatus status = call(reinterpret_cast<uint8_t*>(&out[0]), out.size(), &len, err, kErrCap);
  if (status == MGPU_BUFFER_TOO_SMALL) {
    out.resize(len);
    status = call(reinterpret_cast<uint8_t*>(&out[0]), out.size(), &len, err, kErrCap);
  }
  if (status != MGPU_OK) {
    const char* name = mgpu_status_name(static_cast<uint32_t>(status));
    return Error(std::string(name != nullptr ? name : "MGPU_?") + ": " + err);
  }
  std::vector<std::string> argv;
  size_t start = 0;
  for (size_t i = 0; i < len; ++i) {
    if (out[i] == '\0') {
      argv.push_back(out.substr(start, i - start));
      start = i + 1;
    }
  }
  return argv;
}

class MesosGpuDockerHook : public Hook {
 public:
  explicit MesosGpuDockerHook(std::string line) : line_(std::move(line)) {}

  Future<Option<DockerTaskExecutorPrepareInfo>> slavePreLaunchDockerTaskExecutorDecorator(
      const Option<TaskInfo>& taskInfo, const ExecutorInfo& executorInfo,
      const std::string& containerName, const std::string&, const std::string&,
      const Option<std::map<std::string, std::string>>&) override {
    // The task's resources and image, for the library to read.
    mesos::slave::ContainerConfig config;
    config.mutable_command_info();
    config.set_directory("");
    config.mutable_resources()->CopyFrom(taskInfo.isSome() ? taskInfo->resources()
                                                           : executorInfo.resources());
    if (taskInfo.isSome() && taskInfo->has_container()) {
      config.mutable_container_info()->CopyFrom(taskInfo->container());
    } else if (executorInfo.has_container()) {
      config.mutable_container_info()->CopyFrom(executorInfo.container());
    }
    // Whose task it is (the library passes it on as --executor-id, --framework-id, --task-id
    // and --task-name): the ids only, with the fields TaskInfo requires.
    config.mutable_executor_info()->mutable_executor_id()->CopyFrom(executorInfo.executor_id());
    if (executorInfo.has_framework_id()) {
      config.mutable_executor_info()->mutable_framework_id()->CopyFrom(
          executorInfo.framework_id());
    }
    if (taskInfo.isSome()) {
      mesos::TaskInfo* task = config.mutable_task_info();
      task->set_name(taskInfo->name());
      task->mutable_task_id()->CopyFrom(taskInfo->task_id());
      task->mutable_slave_id()->CopyFrom(taskInfo->slave_id());
    }
    std::string serialized;
    config.SerializeToString(&serialized);
    Try<std::vector<std::string>> argv = argvFrom([&](uint8_t* buf, size_t cap, size_t* len,
                                                      char* err, size_t ecap) {
      return mgpu_docker_hook_launch_argv(line_.c_str(),
                                          reinterpret_cast<const uint8_t*>(serialized.data()),
                                          serialized.size(), containerName.c_str(), buf, cap, len,
                                          err, ecap);
    });
    if (argv.isError()) {
      return Failure("GPU docker hook: " + argv.error());
    }
    if (argv->empty()) {
      return None();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      containers_[key(executorInfo)] = containerName.substr(std::string("mesos-").size());
    }

    Try<Subprocess> child = process::subprocess(argv->front(), argv.get(),
                                                Subprocess::PATH("/dev/null"), Subprocess::PIPE(),
                                                Subprocess::PIPE());
    if (child.isError()) {
      return Failure("GPU docker hook: cannot run '" + argv->front() + "': " + child.error());
    }
    const std::string line = strings::join(" ", argv.get());
    LOG(INFO) << "GPU docker hook: " << line;
    return process::await(child->status(), process::io::read(child->out().get()),
                          process::io::read(child->err().get()))
        .then([line](const std::tuple<Future<Option<int>>, Future<std::string>,
                                      Future<std::string>>& done)
                  -> Future<Option<DockerTaskExecutorPrepareInfo>> {
          const Future<Option<int>>& status = std::get<0>(done);
          const Future<std::string>& out = std::get<1>(done);
          const Future<std::string>& err = std::get<2>(done);
          if (!status.isReady() || status->isNone() || !out.isReady()) {
            return Failure("GPU docker hook: '" + line + "' could not be waited for");
          }
          if (status->get() != 0) {
            std::string why = err.isReady() ? strings::trim(err.get()) : "";
            return Failure("no GPUs for this Docker task: " +
                           (why.empty() ? "'" + line + "' failed" : why));
          }
          DockerTaskExecutorPrepareInfo info;
          Environment::Variable* variable = info.mutable_taskenvironment()->add_variables();
          variable->set_name(kArgsVariable);
          variable->set_value(strings::trim(out.get()));
          return info;
        });
  }

  Try<Nothing> slaveRemoveExecutorHook(const FrameworkInfo&,
                                       const ExecutorInfo& executorInfo) override {
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = containers_.find(key(executorInfo));
      if (found == containers_.end()) {
        return Nothing();
      }
      id = found->second;
      containers_.erase(found);
    }
    Try<std::vector<std::string>> argv = argvFrom([&](uint8_t* buf, size_t cap, size_t* len,
                                                      char* err, size_t ecap) {
      return mgpu_docker_hook_release_argv(line_.c_str(), id.c_str(), buf, cap, len, err, ecap);
    });
    if (argv.isError() || argv->empty()) {
      LOG(ERROR) << "GPU docker hook: no command to release the GPUs of " << id << ": "
                 << (argv.isError() ? argv.error() : "empty");
      return Nothing();
    }
    Try<Subprocess> child = process::subprocess(argv->front(), argv.get(),
                                                Subprocess::PATH("/dev/null"),
                                                Subprocess::PATH("/dev/null"), Subprocess::PIPE());
    if (child.isError()) {
      LOG(ERROR) << "GPU docker hook: cannot run '" << argv->front() << "' to release the GPUs of "
                 << id << ": " << child.error();
      return Nothing();
    }
    const std::string line = strings::join(" ", argv.get());
    process::await(child->status(), process::io::read(child->err().get()))
        .onAny([line](const Future<std::tuple<Future<Option<int>>, Future<std::string>>>& done) {
          if (done.isReady()) {
            const Future<Option<int>>& status = std::get<0>(done.get());
            if (status.isReady() && status->isSome() && status->get() == 0) {
              LOG(INFO) << "GPU docker hook: " << line;
              return;
            }
            const Future<std::string>& err = std::get<1>(done.get());
            LOG(ERROR) << "GPU docker hook: '" << line
                       << "' failed: " << (err.isReady() ? strings::trim(err.get()) : "");
            return;
          }
          LOG(ERROR) << "GPU docker hook: '" << line << "' could not be waited for";
        });
    return Nothing();
  }

 private:
  static std::string key(const ExecutorInfo& executor) {
    return executor.framework_id().value() + "/" + executor.executor_id().value();
  }

  // The operator's `docker_args` command line; the library splits it.
  std::string line_;
  std::mutex mutex_;
  // Executor (framework id/executor id) → the Mesos id of its Docker container with GPUs.
  std::map<std::string, std::string> containers_;
};

Hook* createHook(const Parameters& parameters) {
  Option<std::string> line;
  foreach (const Parameter& parameter, parameters.parameter()) {
    if (parameter.key() == "docker_args") {
      line = parameter.value();
    } else {
      LOG(ERROR) << "GPU docker hook: unknown parameter '" << parameter.key()
                 << "' (accepted: docker_args)";
      return nullptr;
    }
  }
  if (line.isNone() || strings::tokenize(line.get(), " ").empty()) {
    LOG(ERROR) << "GPU docker hook: parameter docker_args is required, e.g. "
                  "'/usr/bin/mesos-gpu docker-args --pool-dir /var/lib/mesos-gpu'";
    return nullptr;
  }
  if (nvml::isAvailable()) {
    Try<Nothing> initialized = nvml::initialize();
    if (initialized.isError()) {
      LOG(ERROR) << "GPU docker hook: cannot initialize NVML: " << initialized.error();
      return nullptr;
    }
  }
  return new MesosGpuDockerHook(line.get());
}

}  // namespace

// The module's name in modules.json and --hooks is this variable's name.
mesos::modules::Module<Hook> org_apache_mesos_gpu_MesosGpuDockerHook(
    MESOS_MODULE_API_VERSION, MESOS_VERSION, "mesos-gpu", "mesos-gpu@example.invalid",
    "GPUs from the node's pool for Docker containerizer tasks (mesos-gpu docker-args)", nullptr,
    createHook);
