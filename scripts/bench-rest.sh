#!/bin/sh
# Requests per second and latency of the REST API's /docker/cli under concurrent clients, on
# loopback: starts `mesos-gpu serve --simulate dgx1-v100` on 127.0.0.1, runs Debian's `wrk`
# (-t2 -c32 -d10s --latency) against it, prints wrk's report and stops the server.
#
# Usage: scripts/bench-rest.sh [PATH-TO-mesos-gpu]
#   default binary: $CARGO_TARGET_DIR (or target)/release/mesos-gpu, built if missing.
# Environment: PORT (default 34760), URL_PATH (default /v1.0/docker/cli?dev=0+1+2+3),
#   DURATION (default 10s), CONNECTIONS (default 32), THREADS (default 2).
set -eu

cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
bin=${1:-$target/release/mesos-gpu}
if [ ! -x "$bin" ]; then
    cargo build --release -p mesos-gpu
fi
command -v wrk >/dev/null || { echo "bench-rest: wrk is not installed (apt-get install wrk)" >&2; exit 1; }

port=${PORT:-34760}
path=${URL_PATH:-/v1.0/docker/cli?dev=0+1+2+3}
duration=${DURATION:-10s}
tmp=$(mktemp -d /tmp/mgpu-bench-rest.XXXXXX)
log=$tmp/serve.log

# Bounded in time whatever happens: the server gets 60 s more than the run.
MESOS_GPU_LOG=warn timeout 120 "$bin" --simulate dgx1-v100 serve \
    --listen "127.0.0.1:$port" --plugin-socket "$tmp/nvidia-docker.sock" \
    --volume-root "$tmp/volumes" --docker-state-dir "$tmp/work" --docker-socket "$tmp/no-docker.sock" \
    --driver-poll 0 >"$log" 2>&1 &
server=$!
cleanup() {
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

url="http://127.0.0.1:$port$path"
tries=0
until curl -fs -o /dev/null "$url"; do
    tries=$((tries + 1))
    if [ "$tries" -gt 100 ] || ! kill -0 "$server" 2>/dev/null; then
        echo "bench-rest: the server did not answer on $url" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.1
done
echo "GET $url -> $(curl -fs "$url")"
timeout 60 wrk -t"${THREADS:-2}" -c"${CONNECTIONS:-32}" -d"$duration" --latency "$url"
