#!/bin/sh
# Starts mesos-agent with the GPU isolator loaded as a module (see README.md).
#
#   MASTER=zk://zk1:2181/mesos RESOURCES='cpus:32;mem:245760' ./agent.sh [more mesos-agent flags]
#
# Everything GPU-related comes from `mesos-gpu agent-flags`, which discovers the GPUs as the
# module does and prints, one shell-quoted flag per line: --isolation for this host's cgroup
# version (Mesos's cgroups/devices on v1 only), --resources and --attributes advertising the GPUs
# (or the MIG devices), --agent_subsystems= on cgroup v2, and --modules with the module's
# parameters matching them (work_dir, pool_dir, volume_root, mig_strategy, …). On a node without
# GPUs it prints the same --isolation without the module (and no --modules), says why on stderr,
# and the agent starts without the module.
#
# Your own mesos-agent flags go to agent-flags too, after `--`, which prints them back merged with
# its own, each once (mesos-agent refuses a flag given twice): --attributes=rack:r7 is kept ahead
# of the GPU attributes, --resources and --work_dir are the agent's (they override RESOURCES and
# WORK_DIR), --isolation is checked as the module checks it, --modules keeps your libraries and
# gains the module, any other flag passes through unchanged.
#
# MASTER, WORK_DIR, RESOURCES: the agent's --master, --work_dir and --resources (given to the
#   agent as MESOS_MASTER, MESOS_WORK_DIR and MESOS_RESOURCES, which its command line overrides).
# MODULE_LIBRARY: the module library --modules loads.
# VOLUME_ROOT: the module's volume_root, the same as serve's --volume-root in
#   /etc/default/mesos-gpu (both /var/lib/mesos-gpu/volumes as shipped).
# AGENT_FLAGS_OPTS: more options of `mesos-gpu agent-flags`, split at spaces, e.g.
#   AGENT_FLAGS_OPTS='--mig-strategy mixed --module-param driver_volume=build'
set -eu

MESOS_MASTER=${MASTER:-${MESOS_MASTER:-zk://localhost:2181/mesos}}
MESOS_WORK_DIR=${WORK_DIR:-${MESOS_WORK_DIR:-/var/lib/mesos}}
MESOS_RESOURCES=${RESOURCES:-${MESOS_RESOURCES:-cpus:8;mem:32768}}
MESOS_CONTAINERIZERS=${MESOS_CONTAINERIZERS:-mesos}
export MESOS_MASTER MESOS_WORK_DIR MESOS_RESOURCES MESOS_CONTAINERIZERS
MODULE_LIBRARY=${MODULE_LIBRARY:-/usr/lib/mesos/modules/libmesos_gpu_module.so}
VOLUME_ROOT=${VOLUME_ROOT:-/var/lib/mesos-gpu/volumes}
AGENT_FLAGS_OPTS=${AGENT_FLAGS_OPTS:-}

# shellcheck disable=SC2086 # AGENT_FLAGS_OPTS is split on purpose
flags=$(mesos-gpu agent-flags --module-library "$MODULE_LIBRARY" --volume-root "$VOLUME_ROOT" \
  $AGENT_FLAGS_OPTS -- "$@")
# Each line is one flag, shell-quoted by mesos-gpu: its own, then yours.
eval "set -- $(printf '%s\n' "$flags" | tr '\n' ' ')"

exec mesos-agent "$@"
