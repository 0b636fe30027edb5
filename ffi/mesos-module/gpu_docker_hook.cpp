// The Docker containerizer's side of the node's GPU pool: a Mesos hook module.
//
// Mesos's Docker containerizer never calls isolator modules, so GPUs for Docker tasks are
// reserved here, in `slavePreLaunchDockerTaskExecutorDecorator`, which the agent runs before
// it starts the container `mesos-<container id>` of a task. For a task with `gpus` > 0 the hook
// runs the operator's `docker_args` command line (module parameter, e.g. `/usr/bin/mesos-gpu
// docker-args --pool-dir /var/lib/mesos-gpu`) with `--gpus N --container-id ID --image IMAGE
// --json` appended: `mesos-gpu docker-args` reserves the GPUs from the node's pool for that
// container name and prints the `docker run` arguments that give them. The hook hands them to
// the container's `docker run` in the task environment variable MESOS_GPU_DOCKER_ARGS, which
// `mesos-gpu docker-wrapper` (the agent's `--docker` program) turns back into arguments and
// removes. When the pool cannot serve the task, the command's error becomes the launch failure
// and so the task's status message.
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
#include <string>
#include <vector>

#include <glog/logging.h>

#include <mesos/hook.hpp>
#include <mesos/mesos.hpp>
#include <mesos/module/hook.hpp>
#include <mesos/resources.hpp>

#include <process/collect.hpp>
#include <process/future.hpp>
#include <process/io.hpp>
#include <process/subprocess.hpp>

#include <stout/foreach.hpp>
#include <stout/nothing.hpp>
#include <stout/option.hpp>
#include <stout/strings.hpp>
#include <stout/try.hpp>

// libmesos's NVML wrapper (src/common/nvml.hpp, not installed; exported by libmesos.so).
namespace nvml {
bool isAvailable();
Try<Nothing> initialize();
}  // namespace nvml

using mesos::DockerTaskExecutorPrepareInfo;
using mesos::Environment;
using mesos::ExecutorInfo;
using mesos::Hook;
using mesos::Parameter;
using mesos::Parameters;
using mesos::Resources;
using mesos::TaskInfo;
using process::Failure;
using process::Future;
using process::Subprocess;

namespace {

// The task environment variable that carries the `docker run` arguments to the wrapper.
const char kArgsVariable[] = "MESOS_GPU_DOCKER_ARGS";
// Docker containerizer containers are named this prefix and the Mesos container id.
const char kNamePrefix[] = "mesos-";

class MesosGpuDockerHook : public Hook {
 public:
  explicit MesosGpuDockerHook(std::vector<std::string> command) : command_(std::move(command)) {}

  Future<Option<DockerTaskExecutorPrepareInfo>> slavePreLaunchDockerTaskExecutorDecorator(
      const Option<TaskInfo>& taskInfo, const ExecutorInfo& executorInfo,
      const std::string& containerName, const std::string&, const std::string&,
      const Option<std::map<std::string, std::string>>&) override {
    Resources resources =
        taskInfo.isSome() ? Resources(taskInfo->resources()) : Resources(executorInfo.resources());
    Option<double> gpus = resources.gpus();
    if (gpus.isNone() || gpus.get() <= 0) {
      return None();
    }
    if (!strings::startsWith(containerName, kNamePrefix)) {
      return Failure("GPU docker hook: container name '" + containerName +
                     "' is not mesos-<container id>");
    }
    const mesos::ContainerInfo& container =
        taskInfo.isSome() && taskInfo->has_container() ? taskInfo->container()
                                                       : executorInfo.container();
    std::vector<std::string> argv = command_;
    argv.push_back("--gpus=" + std::to_string(static_cast<long long>(gpus.get())));
    argv.push_back("--container-id=" + containerName.substr(sizeof(kNamePrefix) - 1));
    if (container.has_docker() && !container.docker().image().empty()) {
      argv.push_back("--image=" + container.docker().image());
    }
    argv.push_back("--json");

    Try<Subprocess> child = process::subprocess(argv[0], argv, Subprocess::PATH("/dev/null"),
                                                Subprocess::PIPE(), Subprocess::PIPE());
    if (child.isError()) {
      return Failure("GPU docker hook: cannot run '" + argv[0] + "': " + child.error());
    }
    const std::string line = strings::join(" ", argv);
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

 private:
  std::vector<std::string> command_;
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
  return new MesosGpuDockerHook(strings::tokenize(line.get(), " "));
}

}  // namespace

// The module's name in modules.json and --hooks is this variable's name.
mesos::modules::Module<Hook> org_apache_mesos_gpu_MesosGpuDockerHook(
    MESOS_MODULE_API_VERSION, MESOS_VERSION, "mesos-gpu", "mesos-gpu@example.invalid",
    "GPUs from the node's pool for Docker containerizer tasks (mesos-gpu docker-args)", nullptr,
    createHook);
