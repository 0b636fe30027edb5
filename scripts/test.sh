#!/usr/bin/env bash
# Runs every test of the workspace on this machine, installing and starting what the tests need.
#
# Needs root (cgroups, mknod, dockerd). Privileged tests listed in MESOS_GPU_REQUIRE fail instead
# of being ignored when the host lacks what they need; this script requires all of them.
set -euo pipefail
cd "$(dirname "$0")/.."

export MESOS_GPU_REQUIRE="${MESOS_GPU_REQUIRE:-root,cgroup1,cgroup2,dockerd,cc,mesos}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

log() { printf '== %s\n' "$*" >&2; }

install_packages() {
    local missing=() pkg
    # libprotobuf-dev and cmake: the module shim and the libprotobuf probe are built against the
    # Mesos install (testkit's Need::Mesos), with the protobuf headers it was built with.
    for pkg in docker.io busybox-static gcc-multilib g++ wrk dpkg-dev libprotobuf-dev cmake; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
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
start_dockerd

log "C header is fresh (cbindgen, pinned)"
./scripts/check-header.sh

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

log "cargo test"
cargo test --workspace --no-fail-fast

log "benchmarks compile"
cargo bench --workspace --no-run --quiet

# The package is built with the dev profile here to keep the run short; scripts/package.sh
# builds release packages.
log "Debian package builds and holds what it should"
./scripts/check-package.sh --profile dev
