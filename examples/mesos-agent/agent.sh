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

flags=$(mesos-gpu agent-flags --isolation gpu/nvidia --resources "$RESOURCES" | grep -v '^--nvidia_gpu_devices')
# Each line is one flag, shell-quoted by mesos-gpu.
eval "set -- $(printf '%s\n' "$flags" | tr '\n' ' ')"

# The module comes after cgroups/devices: its isolate() moves the task into its own device
# cgroup (cgroups_root=mesos_gpu) last, and its cleanup removes that cgroup.
exec mesos-agent \
  --master="$MASTER" \
  --work_dir="$WORK_DIR" \
  --containerizers=mesos \
  --modules="file://$MODULES" \
  --isolation="filesystem/linux,cgroups/devices,$MODULE_NAME" \
  "$@"
