#!/bin/sh
# Starts mesos-agent with the GPU isolator loaded as a module (see README.md).
#
#   MASTER=zk://zk1:2181/mesos RESOURCES='cpus:32;mem:245760' ./agent.sh
#
# The GPU resources and attributes come from `mesos-gpu agent-flags`, which discovers the GPUs
# the same way the module does. Its --nvidia_gpu_devices line is dropped: that flag belongs to
# Mesos's built-in gpu/nvidia isolator, which is not loaded (give the module the
# `nvidia_gpu_devices` parameter instead).
set -eu

MASTER=${MASTER:-zk://localhost:2181/mesos}
WORK_DIR=${WORK_DIR:-/var/lib/mesos}
RESOURCES=${RESOURCES:-cpus:8;mem:32768}
MODULES=${MODULES:-$(dirname "$0")/modules.json}
MODULE_NAME=org_apache_mesos_gpu_MesosGpuIsolator

# Mesos runs cgroup v2 exactly when cgroup2 is mounted at /sys/fs/cgroup. There, Mesos's
# cgroups/devices would attach a device program of its own that denies the GPUs, so it is left
# out: the module attaches its program (Mesos's default whitelist plus the GPUs) to the container
# cgroup Mesos makes, and the agent makes its --cgroups_root cgroup at start only with
# --agent_subsystems. On cgroup v1, cgroups/devices makes each container's devices cgroup and the
# module adds the GPUs to it.
if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
    ISOLATION="filesystem/linux,cgroups/cpu,cgroups/mem,$MODULE_NAME"
    set -- --agent_subsystems=
else
    ISOLATION="filesystem/linux,cgroups/cpu,cgroups/mem,cgroups/devices,$MODULE_NAME"
    set --
fi

flags=$(mesos-gpu agent-flags --isolation gpu/nvidia --resources "$RESOURCES" | grep -v '^--nvidia_gpu_devices')
# Each line is one flag, shell-quoted by mesos-gpu.
eval "set -- \"\$@\" $(printf '%s\n' "$flags" | tr '\n' ' ')"

# The module reads these flags at start and refuses a configuration it cannot isolate (see
# docs/operator-guide.md, "The isolator module"); its cgroups root is the agent's.
exec mesos-agent \
  --master="$MASTER" \
  --work_dir="$WORK_DIR" \
  --containerizers=mesos \
  --modules="file://$MODULES" \
  --isolation="$ISOLATION" \
  "$@"
