#!/usr/bin/env bash
# Runs every test of the workspace on this machine, installing and starting what the tests need.
#
# Needs root (cgroups, mknod, dockerd). Privileged tests listed in MESOS_GPU_REQUIRE fail instead
# of being ignored when the host lacks what they need; this script requires all of them.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

log() { printf '== %s\n' "$*" >&2; }

# The real Apache Mesos the end-to-end tests run (ffi/tests/mesos_agent.rs): shared/mesos beside
# the checkout (further up for a worktree), as testkit's MesosInstall::locate looks for it.
mesos_dir() {
    local dir
    dir="$(cd .. && pwd)"
    while [ "$dir" != / ]; do
        if [ -x "$dir/shared/mesos/install/sbin/mesos-agent" ]; then
            printf '%s\n' "$dir/shared/mesos"
            return
        fi
        dir="$(dirname "$dir")"
    done
}
MESOS_DIR="$(mesos_dir)"
# Not required: cgroup2-cpuset (the cpuset controller on cgroup2), which a hybrid host like the CI
# machine cannot offer while cpuset is bound to its v1 hierarchy; its tests are counted as ignored.
if [ -n "$MESOS_DIR" ]; then
    export MESOS_GPU_REQUIRE="${MESOS_GPU_REQUIRE:-root,cgroup1,cgroup2,cpuset1,dockerd,cc,pynvml,podman,mesos,pymesos,dpkg,systemd}"
else
    log "no shared/mesos/install beside this checkout: the real mesos-agent tests are ignored"
    export MESOS_GPU_REQUIRE="${MESOS_GPU_REQUIRE:-root,cgroup1,cgroup2,cpuset1,dockerd,cc,pynvml,podman,dpkg,systemd}"
fi

install_packages() {
    local missing=() pkg packages
    packages=(docker.io busybox-static gcc-multilib g++ wrk dpkg-dev podman systemd)
    if [ -n "$MESOS_DIR" ]; then
        # Mesos's run-time libraries, and what building the module against its headers needs.
        packages+=(cmake libprotobuf-dev libgoogle-glog-dev libgflags-dev libcurl4-openssl-dev)
        mapfile -t -O "${#packages[@]}" packages < <(grep -v '^\s*\(#\|$\)' "$MESOS_DIR/runtime-packages.txt")
    fi
    for pkg in "${packages[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# NVIDIA's Python NVML binding: nvml-sim's tests check that it reads the simulated nodes right.
install_pynvml() {
    if python3 -c 'import pynvml' >/dev/null 2>&1; then
        return
    fi
    if ! python3 -m pip --version >/dev/null 2>&1; then
        log "installing python3-pip"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null
    fi
    log "installing nvidia-ml-py (module pynvml)"
    python3 -m pip install --quiet nvidia-ml-py \
        || python3 -m pip install --quiet --break-system-packages nvidia-ml-py
    python3 -c 'import pynvml'
}

# pymesos, the Mesos client library of the real-agent frameworks (testkit/python/gpu_framework.py).
# Its dependency http-parser 0.9.0 ships a C extension generated for Pythons before 3.11 that
# no longer compiles; the package's pure-Python parser (what it installs on PyPy) serves pymesos
# the same, so when the extension does not build, http-parser is installed without it.
install_pymesos() {
    if python3 -c 'import pymesos' >/dev/null 2>&1; then
        return
    fi
    log "installing pymesos"
    if ! python3 -c 'import http_parser' >/dev/null 2>&1 \
        && ! python3 -m pip install --quiet http-parser >/dev/null 2>&1; then
        local tmp
        tmp="$(mktemp -d)"
        python3 -m pip download --quiet --no-deps --no-binary :all: -d "$tmp" http-parser==0.9.0
        tar -xzf "$tmp"/http-parser-0.9.0.tar.gz -C "$tmp"
        sed -i 's/run_setup(not IS_PYPY)/run_setup(False)/' "$tmp"/http-parser-0.9.0/setup.py
        python3 -m pip install --quiet "$tmp"/http-parser-0.9.0 \
            || python3 -m pip install --quiet --break-system-packages "$tmp"/http-parser-0.9.0
        rm -rf "$tmp"
    fi
    python3 -m pip install --quiet pymesos \
        || python3 -m pip install --quiet --break-system-packages pymesos
    python3 -c 'import pymesos'
}

start_dockerd() {
    if docker version >/dev/null 2>&1; then
        return
    fi
    log "starting dockerd (log: /tmp/mesos-gpu-dockerd.log)"
    nohup dockerd >/tmp/mesos-gpu-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do
        docker version >/dev/null 2>&1 && return
        sleep 1
    done
    log "dockerd did not start; last lines of its log:"
    tail -n 30 /tmp/mesos-gpu-dockerd.log >&2
    exit 1
}

install_packages
install_pynvml
install_pymesos
start_dockerd

log "C header is fresh (cbindgen, pinned)"
./scripts/check-header.sh

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

log "cargo test"
cargo test --workspace --no-fail-fast

# In the dev profile, reusing what the tests built: a release build of the workspace would
# double CI's compile time. Figures come from `cargo bench`.
log "benchmarks compile"
cargo build --workspace --benches --quiet

# A real agent through 200 tasks (and an agent SIGKILL): no GPU open to two tasks at once, none
# lost, nothing left behind; the full soak is `cargo bench -p mesos-gpu-ffi --bench agent_soak`
# (docs/benchmarks/agent-soak.md).
if [ -n "$MESOS_DIR" ]; then
    log "real-agent soak, 200 tasks"
    cargo bench --profile dev --quiet -p mesos-gpu-ffi --bench agent_soak -- --tasks 200
fi

# The package is built with the dev profile here to keep the run short; scripts/package.sh
# builds release packages.
log "Debian package builds and holds what it should"
./scripts/check-package.sh --profile dev
