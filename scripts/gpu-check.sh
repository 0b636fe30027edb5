#!/usr/bin/env bash
# The real-GPU acceptance check: what an operator (or a developer with a GPU machine) runs on an
# NVIDIA host to see that mesos-gpu works there, end to end. In CI it runs on a simulated node.
#
#   scripts/gpu-check.sh [--bin DIR] [--mesos DIR] [--log FILE] [--simulate NODE] [--keep]
#
#   --bin DIR       mesos-gpu, libmesos_gpu.so, libmesos_gpu_module.so (the agent module, built
#                   against the Mesos of --mesos) and, for --simulate, libnvml_sim.so and the
#                   nvidia-smi stand-in [default: target/release, else target/debug]
#   --mesos DIR     a Mesos install (sbin/mesos-master, sbin/mesos-agent, bin/mesos-execute,
#                   libexec/mesos, lib/), e.g. unpacked from shared/mesos/bundle.sh's archive:
#                   runs a real master and agent with the module [default: none, skipped]
#   --log FILE      the full log of every command [default: gpu-check-<time>.log in $TMPDIR]
#   --simulate NODE run on nvml-sim's NODE (e.g. dgx1-v100) with mknod'ed device nodes
#   --keep          keep the scratch directory
#
# Checks, one line each (PASS/FAIL/SKIP with figures), then a summary; exit 0 when none failed:
#   doctor    `mesos-gpu doctor --smoke`: driver, nodes, cgroups, volume, nvidia-smi -L isolated
#   info      `mesos-gpu info --json` against nvidia-ml-py (names, UUIDs, minors, driver)
#   ldcache   `mesos-gpu ldcache` against `ldconfig -p`: the same lines
#   volume    `volume create`/`verify` into a scratch root; `nvidia-smi -L` from the volume
#   exec-1    `exec --gpus 1`: exactly one GPU node opens, the others EPERM; CUDA sees 1 device
#             and multiplies two matrices (PyTorch, else the driver API through ctypes)
#   exec-0    `exec --gpus 0`: every GPU node EPERM; CUDA sees no device
#   mesos-*   with --mesos: master + agent with the module; a gpus:1 task sees its GPU, a gpus:0
#             task none, and /mesos-gpu/containers shows the first while it runs
#
# It never changes the GPUs' settings (no MIG, compute-mode, persistence or reset changes), runs
# every step under a timeout, and stops and removes everything it started (processes, cgroups,
# mounts, scratch files). Needs root.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=
MESOS=
LOG=
SIM=
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BIN=${2:?--bin needs a directory}; shift 2 ;;
        --mesos) MESOS=${2:?--mesos needs a directory}; shift 2 ;;
        --log) LOG=${2:?--log needs a file}; shift 2 ;;
        --simulate) SIM=${2:?--simulate needs a node name}; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$BIN" ]; then
    for dir in "$ROOT/target/release" "$ROOT/target/debug"; do
        if [ -x "$dir/mesos-gpu" ]; then BIN=$dir; break; fi
    done
fi
BIN=$(cd "${BIN:-.}" && pwd)
MG="$BIN/mesos-gpu"
if [ ! -x "$MG" ]; then
    echo "gpu-check: no mesos-gpu in ${BIN} (build it, or give --bin DIR)" >&2
    exit 2
fi
[ -z "$MESOS" ] || MESOS=$(cd "$MESOS" && pwd)
# Scratch space where programs may run (the volume's nvidia-smi): the temp dir unless it is
# mounted noexec, else /var/tmp.
base=${TMPDIR:-/tmp}
if command -v findmnt >/dev/null && findmnt -no OPTIONS -T "$base" | grep -qw noexec; then
    base=/var/tmp
fi
SCRATCH=$(mktemp -d "$base/gpu-check.XXXXXX")
LOG=${LOG:-${TMPDIR:-/tmp}/gpu-check-$(date +%Y%m%d-%H%M%S).log}
: >"$LOG"
PASSED=0 FAILED=0 SKIPPED=0
PIDS=()
CGROUP_ROOT="mesos_gpu_check_$$"

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >>"$LOG"; }
result() {
    local word=$1 name=$2; shift 2
    printf '%-4s %-10s %s\n' "$word" "$name" "$*" | tee -a "$LOG"
    case "$word" in PASS) PASSED=$((PASSED + 1)) ;; FAIL) FAILED=$((FAILED + 1)) ;; SKIP) SKIPPED=$((SKIPPED + 1)) ;; esac
}
# run SECONDS CMD...: runs CMD under a timeout, its output to $OUT (and the log).
OUT="$SCRATCH/out"
run() {
    local limit=$1; shift
    log "\$ $*"
    timeout -k 5 "$limit" "$@" >"$OUT" 2>&1
    local rc=$?
    cat "$OUT" >>"$LOG"
    log "exit $rc"
    [ "$rc" -ne 124 ] || echo "(timed out after ${limit}s)" >>"$OUT"
    return "$rc"
}
have() { command -v "$1" >/dev/null 2>&1; }

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    sleep 1
    for pid in "${PIDS[@]}"; do
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    # The agent's cgroups (and anything left in them), then its mounts under the scratch dir.
    local cg
    for cg in /sys/fs/cgroup/"$CGROUP_ROOT" /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
        [ -d "$cg" ] || continue
        find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    awk -v s="$SCRATCH" 'index($2, s) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null; done
    if [ "$KEEP" = 1 ]; then
        echo "gpu-check: scratch kept in $SCRATCH" >&2
    else
        rm -rf "$SCRATCH"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "gpu-check: bin $BIN, mesos ${MESOS:-none}, simulate ${SIM:-no}, scratch $SCRATCH"
echo "gpu-check: log in $LOG"
if [ "$(id -u)" != 0 ]; then
    echo "gpu-check: needs root (device cgroups, mknod, the agent)" >&2
    exit 2
fi
PY=$(command -v python3 || true)

# --- the node: simulated or real ----------------------------------------------------------------
GLOBAL=()
SMI_ENV=()
DEV=/dev
if [ -n "$SIM" ]; then
    NODE_JSON="$ROOT/nvml-sim/topologies/$SIM.json"
    [ -f "$NODE_JSON" ] || NODE_JSON="/usr/share/mesos-gpu/topologies/$SIM.json"
    if [ ! -f "$NODE_JSON" ] || [ -z "$PY" ]; then
        echo "gpu-check: --simulate $SIM needs python3 and the node description (looked in nvml-sim/topologies, /usr/share/mesos-gpu/topologies)" >&2
        exit 2
    fi
    # A scratch device root numbered as the simulated driver numbers its nodes.
    DEV="$SCRATCH/dev"
    mkdir -p "$DEV"
    "$PY" - "$NODE_JSON" "$DEV" <<'EOF' || { echo "gpu-check: cannot make the simulated device nodes" >&2; exit 2; }
import json, os, sys
node = json.load(open(sys.argv[1]))
dev = sys.argv[2]
uvm = node.get("proc_devices", {}).get("nvidia_uvm", 510)
nodes = [("nvidiactl", 195, 255), ("nvidia-uvm", uvm, 0), ("nvidia-uvm-tools", uvm, 1)]
nodes += [("nvidia%d" % g["minor"], 195, g["minor"]) for g in node["gpus"]]
for name, major, minor in nodes:
    os.mknod(os.path.join(dev, name), 0o666 | 0o020000, os.makedev(major, minor))
EOF
    # nvml-sim as the NVML of every process of this check, as a driver would be.
    SIMLIB="$SCRATCH/sim"
    mkdir -p "$SIMLIB"
    cp "$BIN/libnvml_sim.so" "$SIMLIB/libnvidia-ml.so.1" 2>/dev/null || cp "$BIN/deps/libnvml_sim.so" "$SIMLIB/libnvidia-ml.so.1"
    cp "$NODE_JSON" "$SIMLIB/nvml-sim.json"
    GLOBAL=(--simulate "$SIM" --dev-root "$DEV")
    SMI_ENV=(NVML_SIM_CONFIG="$NODE_JSON" NVML_SIM_DEV_ROOT="$DEV")
fi
# mesos-gpu on this node (the simulated one's options first).
MGN=(env -u NVML_SIM_CONFIG "$MG" "${GLOBAL[@]}")

GPUS=0
if run 60 "${MGN[@]}" info --json && [ -n "$PY" ]; then
    cp "$OUT" "$SCRATCH/info.json"
    GPUS=$("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' "$SCRATCH/info.json" 2>/dev/null || echo 0)
fi
log "GPUs: $GPUS"

# --- doctor --smoke -----------------------------------------------------------------------------
if run 240 "${MGN[@]}" doctor --smoke --json --pool-dir "$SCRATCH/doctor-pool"; then
    result PASS doctor "ready: $(grep -c '"status": "ok"' "$OUT") ok, $(grep -c '"status": "warn"' "$OUT") warn; $(grep -o 'sees exactly its GPU: [^"]*' "$OUT" | head -n 1)"
elif grep -q '"ready": false' "$OUT"; then
    failing=$("$PY" -c 'import json,sys; print(", ".join(c["name"] + ": " + c["summary"] for c in json.load(open(sys.argv[1]))["checks"] if c["status"] == "fail"))' "$OUT" 2>/dev/null)
    result FAIL doctor "not ready: ${failing:-see the log}"
else
    result FAIL doctor "did not run: $(tail -n 3 "$OUT" | tr '\n' ' ')"
fi

# --- info against nvidia-ml-py ------------------------------------------------------------------
if [ -z "$PY" ] || ! "$PY" -c 'import pynvml' >/dev/null 2>&1; then
    result SKIP info "nvidia-ml-py (pynvml) is not installed for ${PY:-python3}"
elif [ ! -s "$SCRATCH/info.json" ]; then
    result FAIL info "mesos-gpu info --json failed: $(tail -n 3 "$OUT" | tr '\n' ' ')"
else
    pyenv=()
    [ -z "$SIM" ] || pyenv=(env LD_LIBRARY_PATH="$SIMLIB" NVML_SIM_CONFIG="$NODE_JSON")
    if run 60 "${pyenv[@]}" "$PY" - "$SCRATCH/info.json" <<'EOF'
import json, sys, pynvml
ours = json.load(open(sys.argv[1]))
pynvml.nvmlInit()
def text(v):
    return v.decode() if isinstance(v, bytes) else v
theirs = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    theirs.append((i, text(pynvml.nvmlDeviceGetName(h)), text(pynvml.nvmlDeviceGetUUID(h)), pynvml.nvmlDeviceGetMinorNumber(h)))
driver = text(pynvml.nvmlSystemGetDriverVersion())
mine = [(g["index"], g["name"], g["uuid"], g["minor"]) for g in ours["gpus"]]
if mine != theirs or ours["driver"]["version"] != driver:
    print("mesos-gpu:", mine, ours["driver"]["version"])
    print("pynvml:   ", theirs, driver)
    sys.exit(1)
print("%d GPU(s), driver %s: %s" % (len(mine), driver, "; ".join("%d %s %s minor %d" % g for g in mine)))
EOF
    then
        result PASS info "agrees with nvidia-ml-py: $(tail -n 1 "$OUT")"
    else
        result FAIL info "differs from nvidia-ml-py: $(tr '\n' ' ' <"$OUT" | cut -c1-400)"
    fi
fi

# --- ldcache against ldconfig -p ----------------------------------------------------------------
if ! have ldconfig; then
    result SKIP ldcache "ldconfig is not installed"
elif run 30 "$MG" ldcache && cp "$OUT" "$SCRATCH/ours" && run 30 ldconfig -p && cp "$OUT" "$SCRATCH/theirs"; then
    if cmp -s "$SCRATCH/ours" "$SCRATCH/theirs"; then
        result PASS ldcache "same $(wc -l <"$SCRATCH/ours") lines as ldconfig -p"
    else
        result FAIL ldcache "differs from ldconfig -p: $(diff "$SCRATCH/ours" "$SCRATCH/theirs" | head -n 4 | tr '\n' ' ')"
    fi
else
    result FAIL ldcache "$(tail -n 2 "$OUT" | tr '\n' ' ')"
fi

# --- the driver volume and nvidia-smi from it ---------------------------------------------------
VOLROOT="$SCRATCH/volumes"
if ! run 120 "${MGN[@]}" volume create --root "$VOLROOT" --json; then
    result FAIL volume "volume create: $(tail -n 3 "$OUT" | tr '\n' ' ')"
else
    VOL=$(sed -n 's/^  "path": "\(.*\)",$/\1/p' "$OUT" | head -n 1)
    files=$(sed -n 's/^  "files": \([0-9]*\),$/\1/p' "$OUT" | head -n 1)
    run 60 "${MGN[@]}" volume plan --json
    smi_from=$(grep -A3 '"name": "nvidia-smi"' "$OUT" | sed -n 's/.*"found_as": "\(.*\)",/\1/p' | head -n 1)
    # A simulated driver tree is made afresh (elsewhere) by each command: check the volume
    # against its manifest only there.
    verify=(volume verify --root "$VOLROOT")
    [ -z "$SIM" ] || verify+=(--volume-only)
    if ! run 120 "${MGN[@]}" "${verify[@]}"; then
        result FAIL volume "verify: $(tail -n 3 "$OUT" | tr '\n' ' ')"
    elif [ ! -x "$VOL/bin/nvidia-smi" ]; then
        result FAIL volume "$VOL has no bin/nvidia-smi ($files files)"
    elif run 60 env "${SMI_ENV[@]}" LD_LIBRARY_PATH="$VOL/lib64:$VOL/lib" "$VOL/bin/nvidia-smi" -L &&
        [ "$(grep -c '^GPU ' "$OUT")" = "$GPUS" ]; then
        result PASS volume "$files files, intact; nvidia-smi (from $smi_from) in it lists $GPUS GPU(s)"
    else
        result FAIL volume "nvidia-smi -L from $VOL lists $(grep -c '^GPU ' "$OUT") of $GPUS GPU(s): $(head -n 3 "$OUT" | tr '\n' ' ')"
    fi
fi

# --- exec isolation: device nodes and CUDA ------------------------------------------------------
cat >"$SCRATCH/probe.py" <<'EOF'
# Opens every /dev/nvidia* character device (each line: node and OK or the errno name), then asks
# CUDA how many devices it sees and multiplies two matrices on the first (PyTorch, else the
# driver API through ctypes). With a file argument it then waits for that file (a Mesos task).
import errno, os, stat, sys, time
dev = sys.argv[1]
for name in sorted(os.listdir(dev)):
    path = os.path.join(dev, name)
    if not name.startswith("nvidia") or not stat.S_ISCHR(os.stat(path).st_mode):
        continue
    try:
        os.close(os.open(path, os.O_RDWR))
        print("node", name, "OK")
    except OSError as e:
        print("node", name, errno.errorcode.get(e.errno, str(e.errno)))
sys.stdout.flush()
if os.environ.get("PROBE_CUDA") == "1":
    try:
        import torch
        n = torch.cuda.device_count()
        print("cuda torch devices", n)
        if n > 0:
            a = torch.randn(2048, 2048, device="cuda")
            print("cuda matmul", float((a @ a).abs().sum().item()) > 0)
    except ImportError:
        import ctypes
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        rc = cuda.cuInit(0)
        if rc == 0:
            rc = cuda.cuDeviceGetCount(ctypes.byref(count))
        print("cuda driver-api devices", count.value if rc == 0 else 0, "(cuInit/cuDeviceGetCount rc %d)" % rc)
    sys.stdout.flush()
print("probe done", flush=True)
if len(sys.argv) > 2:
    deadline = time.time() + 120
    while not os.path.exists(sys.argv[2]) and time.time() < deadline:
        time.sleep(0.2)
EOF
CUDA=0
CUDA_WHY="a simulated node has no CUDA"
if [ -z "$SIM" ]; then
    if [ -n "$PY" ] && "$PY" -c 'import torch' >/dev/null 2>&1; then
        CUDA=1 CUDA_WHY="PyTorch"
    elif [ -n "$PY" ] && "$PY" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' >/dev/null 2>&1; then
        CUDA=1 CUDA_WHY="the CUDA driver API (ctypes)"
    else
        CUDA_WHY="neither PyTorch nor libcuda.so.1 for python3"
    fi
fi
# judge COUNT: reads the probe's output in $OUT; prints figures; fails unless exactly COUNT GPU
# nodes open (the others EPERM) and, with CUDA, CUDA sees COUNT devices (and multiplies).
judge() {
    local want=$1 open denied other cuda
    open=$(grep -cE '^node nvidia[0-9]+ (OK|ENXIO)$' "$OUT")
    denied=$(grep -cE '^node nvidia[0-9]+ EPERM$' "$OUT")
    other=$(grep -E '^node nvidia[0-9]+ ' "$OUT" | grep -cvE ' (OK|ENXIO|EPERM)$')
    cuda=$(sed -n 's/^cuda [a-z-]* devices \([0-9]*\).*/\1/p' "$OUT" | head -n 1)
    printf '%s GPU node(s) open, %s EPERM; nvidiactl %s; ' "$open" "$denied" \
        "$(sed -n 's/^node nvidiactl //p' "$OUT")"
    [ "$CUDA" = 1 ] && printf 'CUDA (%s) sees %s device(s)%s' "$CUDA_WHY" "${cuda:-?}" \
        "$(grep -q '^cuda matmul True' "$OUT" && echo ', matmul ok')"
    [ "$CUDA" = 1 ] || printf 'CUDA skipped: %s' "$CUDA_WHY"
    [ "$open" = "$want" ] && [ "$other" = 0 ] && [ $((open + denied)) = "$GPUS" ] || return 1
    [ "$CUDA" = 0 ] || [ "${cuda:-x}" = "$want" ] || return 1
    [ "$CUDA" = 0 ] || [ "$want" = 0 ] || grep -q '^cuda matmul True' "$OUT"
}
if [ -z "$PY" ]; then
    result SKIP exec-1 "python3 is not installed (it runs the probe)"
    result SKIP exec-0 "python3 is not installed (it runs the probe)"
elif [ "$GPUS" = 0 ]; then
    result FAIL exec-1 "the node has no GPU"
else
    for want in 1 0; do
        if run 180 "${MGN[@]}" exec --gpus "$want" --pool-dir "$SCRATCH/pool" -- \
            env PROBE_CUDA="$CUDA" "$PY" "$SCRATCH/probe.py" "$DEV"; then
            if figures=$(judge "$want"); then
                result PASS "exec-$want" "$figures"
            else
                result FAIL "exec-$want" "$figures"
            fi
        else
            result FAIL "exec-$want" "exec failed: $(tail -n 3 "$OUT" | tr '\n' ' ')"
        fi
    done
fi

# --- a real Mesos master and agent with the module ----------------------------------------------
mesos_check() {
    local module="$BIN/libmesos_gpu_module.so" lib="$MESOS/lib" port mport iso work v2=0
    for f in sbin/mesos-master sbin/mesos-agent bin/mesos-execute; do
        [ -x "$MESOS/$f" ] || { result SKIP mesos "$MESOS/$f is missing"; return; }
    done
    [ -f "$module" ] || { result SKIP mesos "no libmesos_gpu_module.so in $BIN (build it against this Mesos: ffi/mesos-module/CMakeLists.txt)"; return; }
    [ -n "$PY" ] || { result SKIP mesos "python3 is not installed (it runs the probe)"; return; }
    if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
        v2=1 iso="filesystem/linux,org_apache_mesos_gpu_MesosGpuIsolator"
    else
        iso="filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator"
    fi
    mport=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    work="$SCRATCH/mesos"
    mkdir -p "$work/master" "$work/agent" "$work/runtime"
    local nvml="" dev_param=""
    [ -z "$SIM" ] || nvml=",{\"key\": \"nvml_lib\", \"value\": \"$SIMLIB/libnvidia-ml.so.1\"}"
    [ "$DEV" = /dev ] || dev_param=",{\"key\": \"dev_root\", \"value\": \"$DEV\"}"
    cat >"$work/modules.json" <<EOF
{"libraries": [{"file": "$module", "modules": [{"name": "org_apache_mesos_gpu_MesosGpuIsolator",
  "parameters": [{"key": "work_dir", "value": "$work/agent"}, {"key": "pool_dir", "value": "$work/pool"},
                 {"key": "driver_volume", "value": "off"}$nvml$dev_param]}]}]}
EOF
    log "modules.json: $(cat "$work/modules.json")"
    # Mesos's libraries for Mesos's processes only; executors get them from the agent, tasks
    # drop them (their own programs, Python and CUDA, must not load Mesos's bundled libraries).
    env LD_LIBRARY_PATH="$lib" "$MESOS/sbin/mesos-master" --ip=127.0.0.1 --port="$mport" \
        --work_dir="$work/master" --registry=in_memory >>"$LOG" 2>&1 &
    PIDS+=($!)
    local flags=(--master="127.0.0.1:$mport" --ip=127.0.0.1 --port="$port" --work_dir="$work/agent"
        --runtime_dir="$work/runtime" --launcher_dir="$MESOS/libexec/mesos" --isolation="$iso"
        --cgroups_root="$CGROUP_ROOT" --resources="cpus:2;mem:2048;gpus:$GPUS"
        --modules="file://$work/modules.json" --no-systemd_enable_support
        --executor_registration_timeout=60secs
        --executor_environment_variables="{\"LD_LIBRARY_PATH\": \"$lib:$BIN\", \"PATH\": \"$PATH\"}")
    [ "$v2" = 0 ] || flags+=(--agent_subsystems=)
    env LD_LIBRARY_PATH="$lib:$BIN" "$MESOS/sbin/mesos-agent" "${flags[@]}" >"$work/agent.log" 2>&1 &
    PIDS+=($!)
    local up=0
    for _ in $(seq 1 60); do
        if "$PY" -c 'import json,sys,urllib.request as u; s=json.load(u.urlopen("http://127.0.0.1:%s/master/state" % sys.argv[1], timeout=2)); sys.exit(0 if s.get("activated_slaves", 0) >= 1 else 1)' "$mport" 2>/dev/null; then
            up=1; break
        fi
        sleep 1
    done
    cat "$work/agent.log" >>"$LOG"
    if [ "$up" = 0 ]; then
        result FAIL mesos "the agent did not register within 60 s: $(grep -E '^[EF]|rror' "$work/agent.log" | tail -n 3 | tr '\n' ' ')"
        return
    fi
    local task_cmd="env -u LD_LIBRARY_PATH PROBE_CUDA=$CUDA $PY $SCRATCH/probe.py $DEV"
    launch() { # NAME GPUS [GOFILE]
        env LD_LIBRARY_PATH="$lib" timeout -k 5 240 "$MESOS/bin/mesos-execute" --master="127.0.0.1:$mport" \
            --name="$1" --framework_capabilities=GPU_RESOURCES --resources="cpus:0.1;mem:256;gpus:$2" \
            --command="$task_cmd ${3:-}" >"$work/$1.execute" 2>&1 &
        PIDS+=($!)
    }
    stdout_of() { cat "$work"/agent/slaves/*/frameworks/*/executors/"$1"/runs/latest/stdout 2>/dev/null; }
    # probed NAME GPUS: waits up to 120 s for task NAME's probe and judges it (mesos-NAME).
    probed() {
        local seen=0
        for _ in $(seq 1 120); do
            stdout_of "$1" | grep -q '^probe done' && { seen=1; break; }
            sleep 1
        done
        if [ "$seen" = 0 ]; then
            result FAIL "mesos-$1" "the gpus:$2 task did not run its probe in 120 s: $(tail -n 3 "$work/$1.execute" | tr '\n' ' ')"
            cat "$work"/agent/slaves/*/frameworks/*/executors/"$1"/runs/latest/stderr >>"$LOG" 2>/dev/null
            return 1
        fi
        stdout_of "$1" >"$OUT"
        if figures=$(judge "$2"); then result PASS "mesos-$1" "$figures"; else result FAIL "mesos-$1" "$figures"; fi
    }
    launch gpu1 1 "$work/gpu1.go"
    if probed gpu1 1; then
        # While it runs: the module's endpoint shows its container with one GPU.
        local id
        id=$(basename "$(readlink "$(ls -d "$work"/agent/slaves/*/frameworks/*/executors/gpu1/runs/latest)")")
        if run 20 "$PY" - "$port" "$id" <<'EOF'
import json, sys, urllib.request as u
body = u.urlopen("http://127.0.0.1:%s/mesos-gpu/containers" % sys.argv[1], timeout=10).read()
view = json.loads(body)
mine = [c for c in view["containers"] if c["container"] == sys.argv[2]]
if len(mine) != 1 or len(mine[0]["gpus"]) != 1:
    print("container %s not listed with one GPU: %s" % (sys.argv[2], body.decode()[:600]))
    sys.exit(1)
g = mine[0]["gpus"][0]
print("container %s: GPU %s %s, %s%% busy, %s of %s bytes used by its processes %s, health %s"
      % (sys.argv[2][:8], g["index"], g["uuid"], g["utilization_gpu"], g["memory_used"],
         g["memory_total"], g["processes"], (g["health"] or {}).get("state")))
EOF
        then
            result PASS mesos-view "$(tail -n 1 "$OUT")"
        else
            result FAIL mesos-view "$(tr '\n' ' ' <"$OUT" | cut -c1-400)"
        fi
    fi
    touch "$work/gpu1.go"
    launch gpu0 0
    probed gpu0 0
    for name in gpu1 gpu0; do
        for _ in $(seq 1 60); do
            grep -q 'TASK_FINISHED\|TASK_FAILED\|TASK_KILLED\|TASK_LOST\|TASK_ERROR' "$work/$name.execute" && break
            sleep 1
        done
        cat "$work/$name.execute" >>"$LOG"
    done
    cat "$work/agent.log" >>"$LOG"
}
if [ -z "$MESOS" ]; then
    result SKIP mesos "no --mesos DIR given"
elif [ "$GPUS" = 0 ]; then
    result FAIL mesos "the node has no GPU"
else
    mesos_check
fi

echo "gpu-check: $PASSED passed, $FAILED failed, $SKIPPED skipped (log: $LOG)" | tee -a "$LOG"
[ "$FAILED" = 0 ]
