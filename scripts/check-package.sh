#!/usr/bin/env bash
# Builds the Debian package (scripts/package.sh) and checks what it holds:
# - control fields (name, $auto dependencies, docker.io only suggested);
# - every expected path, with its mode, and nothing installed outside the expected directories;
# - /etc/default/mesos-gpu marked as conffile, maintainer scripts that parse and never enable or
#   start the service by themselves;
# - the unit is the one in examples/systemd, passes `systemd-analyze verify` (or, without
#   systemd-analyze, has the required keys), and its flags are accepted by the packaged binary;
# - everything the operator guide points to is there: the agent examples (`agent.sh`,
#   `modules.json`, `modules-docker.json`) and the Docker wrapper `/usr/bin/mesos-gpu-docker`;
#   each is the one in examples/mesos-agent, the scripts parse, the JSON files parse, and the
#   mesos-gpu command lines they hold (the wrapper's, the hook's `docker_args`) are accepted by
#   the packaged binary; the guide names no packaged path that is missing;
# - the header's functions are exported by the packaged module library;
# - the packaged binary runs every shipped topology with --simulate, finding the packaged
#   simulator in /usr/lib/mesos-gpu (through <exe dir>/../lib/mesos-gpu).
#
#   scripts/check-package.sh [package.sh options, e.g. --profile dev]
#   scripts/check-package.sh --deb FILE     (check a package already built)
#
# Exits 0 when every check passes, 1 on the first failure (with the reason on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }
fail() { printf 'check-package: FAIL: %s\n' "$*" >&2; exit 1; }
pass() { printf 'check-package: ok: %s\n' "$*" >&2; }

if [ "${1:-}" = --deb ]; then
    deb="${2:?--deb needs a file}"
    [ -f "$deb" ] || fail "no package at $deb"
else
    deb=$(scripts/package.sh "$@")
fi
log "checking $deb"

work=$(mktemp -d /tmp/mesos-gpu-check-package.XXXXXX)
trap 'rm -rf "$work"' EXIT

# --- control fields -----------------------------------------------------------------------------
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = mesos-gpu ] || fail "Package is '$(field Package)', expected mesos-gpu"
depends=$(field Depends)
case "$depends" in
    *libc6*) ;;
    *) fail "Depends '$depends' lacks libc6: \$auto (dpkg-shlibdeps) did not run" ;;
esac
case "$depends" in
    *docker*) fail "Depends '$depends' names Docker; docker.io must only be suggested" ;;
esac
case "$(field Suggests)" in
    *docker.io*) ;;
    *) fail "Suggests '$(field Suggests)' lacks docker.io" ;;
esac
[ -n "$(field Description)" ] || fail "no Description"
pass "control: $(field Package) $(field Version) $(field Architecture); Depends: $depends"

# --- contents -----------------------------------------------------------------------------------
# `dpkg-deb -c` prints: mode owner/group size date time ./path [-> target]
dpkg-deb -c "$deb" | awk '{ print $1, $2, $6 }' | sed 's| \./| /|; s|/$||' > "$work/contents"
mode_of() { awk -v p="$1" '$3 == p { print $1 }' "$work/contents"; }

expect() { # path mode
    local got
    got=$(mode_of "$1")
    [ -n "$got" ] || fail "the package lacks $1"
    [ "$got" = "$2" ] || fail "$1 has mode $got, expected $2"
}

unit=
for candidate in /lib/systemd/system/mesos-gpu.service /usr/lib/systemd/system/mesos-gpu.service; do
    [ -n "$(mode_of "$candidate")" ] && unit=$candidate
done
[ -n "$unit" ] || fail "the package holds no mesos-gpu.service under /lib or /usr/lib/systemd/system"

expect /usr/bin/mesos-gpu -rwxr-xr-x
expect /usr/lib/mesos-gpu/libmesos_gpu.so -rw-r--r--
expect /usr/lib/mesos-gpu/libnvml_sim.so -rw-r--r--
expect /usr/lib/mesos-gpu/nvidia-smi -rwxr-xr-x
expect /usr/include/mesos_gpu.h -rw-r--r--
for f in CMakeLists.txt gpu_isolator.cpp gpu_docker_hook.cpp; do
    expect "/usr/share/mesos-gpu/module/$f" -rw-r--r--
done
expect /etc/default/mesos-gpu -rw-r--r--
expect "$unit" -rw-r--r--
expect /usr/bin/mesos-gpu-docker -rwxr-xr-x
expect /usr/share/doc/mesos-gpu/examples/modules.json -rw-r--r--
expect /usr/share/doc/mesos-gpu/examples/modules-docker.json -rw-r--r--
expect /usr/share/doc/mesos-gpu/examples/agent.sh -rwxr-xr-x
expect /usr/share/doc/mesos-gpu/examples/README.md -rw-r--r--
expect /usr/share/doc/mesos-gpu/operator-guide.md -rw-r--r--
expect /usr/share/doc/mesos-gpu/architecture.md -rw-r--r--
expect /usr/share/doc/mesos-gpu/copyright -rw-r--r--
topologies=0
for topo in nvml-sim/topologies/*.json; do
    expect "/usr/share/mesos-gpu/topologies/$(basename "$topo")" -rw-r--r--
    topologies=$((topologies + 1))
done
[ "$topologies" -gt 0 ] || fail "nvml-sim/topologies holds no node description"

if awk '$2 != "root/root" && $2 != "0/0"' "$work/contents" | grep -q .; then
    fail "files not owned by root (0/0): $(awk '$2 != "root/root" && $2 != "0/0"' "$work/contents" | head -3)"
fi
stray=$(awk '$1 !~ /^d/ { print $3 }' "$work/contents" |
    grep -Ev '^/(usr/bin/mesos-gpu|usr/bin/mesos-gpu-docker|usr/lib/mesos-gpu/[^/]+|usr/include/mesos_gpu\.h|etc/default/mesos-gpu|(usr/)?lib/systemd/system/mesos-gpu\.service|usr/share/doc/mesos-gpu/.+|usr/share/mesos-gpu/topologies/[^/]+\.json|usr/share/mesos-gpu/module/(CMakeLists\.txt|gpu_isolator\.cpp|gpu_docker_hook\.cpp))$' || true)
[ -z "$stray" ] || fail "unexpected files in the package: $stray"
pass "contents: $(grep -vc '^d' "$work/contents") files, $topologies topologies, unit at $unit"

# --- control archive: conffiles and maintainer scripts ------------------------------------------
dpkg-deb -e "$deb" "$work/control"
grep -qx /etc/default/mesos-gpu "$work/control/conffiles" ||
    fail "/etc/default/mesos-gpu is not a conffile (conffiles: $(tr '\n' ' ' < "$work/control/conffiles"))"
for script in preinst postinst prerm postrm; do
    f="$work/control/$script"
    [ -e "$f" ] || continue
    [ -x "$f" ] || fail "$script is not executable"
    sh -n "$f" || fail "$script does not parse"
    if grep -Eq 'deb-systemd-invoke (start|restart)|deb-systemd-helper enable' "$f" &&
        ! grep -q 'was-enabled' "$f"; then
        fail "$script enables or starts mesos-gpu.service unconditionally"
    fi
done
[ -e "$work/control/postrm" ] && grep -q 'daemon-reload' "$work/control/postrm" ||
    fail "postrm does not reload systemd after the unit is removed"
pass "conffiles and maintainer scripts ($(ls "$work/control" | tr '\n' ' '))"

# --- unpacked files -----------------------------------------------------------------------------
root="$work/root"
dpkg-deb -x "$deb" "$root"
cmp -s "$root$unit" examples/systemd/mesos-gpu.service ||
    fail "$unit differs from examples/systemd/mesos-gpu.service"
cmp -s "$root/etc/default/mesos-gpu" examples/default/mesos-gpu ||
    fail "/etc/default/mesos-gpu differs from examples/default/mesos-gpu"

bin="$root/usr/bin/mesos-gpu"
"$bin" --version >/dev/null || fail "the packaged mesos-gpu does not run"

# The flags the unit passes (ExecStart and MESOS_GPU_SERVE_OPTS) must parse: clap validates every
# flag and value given before --help, and fails on an unknown flag or a bad value.
exec_start=$(sed -n 's/^ExecStart=//p' "$root$unit")
[ "$(printf '%s\n' "$exec_start" | wc -l)" = 1 ] || fail "the unit has not exactly one ExecStart"
read -r -a exec_words <<< "$exec_start"
[ "${exec_words[0]}" = /usr/bin/mesos-gpu ] || fail "ExecStart runs ${exec_words[0]}, not /usr/bin/mesos-gpu"
opts=$(sed -n 's/^MESOS_GPU_SERVE_OPTS="\(.*\)"$/\1/p' "$root/etc/default/mesos-gpu")
[ -n "$opts" ] || fail "/etc/default/mesos-gpu sets no MESOS_GPU_SERVE_OPTS=\"…\""
args=()
for word in "${exec_words[@]:1}"; do
    if [ "$word" = '$MESOS_GPU_SERVE_OPTS' ]; then
        read -r -a more <<< "$opts"
        args+=("${more[@]}")
    else
        args+=("$word")
    fi
done
"$bin" "${args[@]}" --help >/dev/null 2>"$work/serve-help.err" ||
    fail "the packaged binary refuses the unit's command line (${args[*]}): $(cat "$work/serve-help.err")"
pass "ExecStart: mesos-gpu ${args[*]}"

if command -v systemd-analyze >/dev/null; then
    # verify checks that ExecStart's binary exists: point it at the unpacked one.
    mkdir -p "$work/units"
    sed "s|^ExecStart=/usr/bin/mesos-gpu |ExecStart=$bin |" "$root$unit" > "$work/units/mesos-gpu.service"
    if ! SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$work/units/mesos-gpu.service" \
        >"$work/verify.out" 2>&1; then
        fail "systemd-analyze verify: $(cat "$work/verify.out")"
    fi
    if grep -i 'mesos-gpu.service' "$work/verify.out" | grep -q .; then
        fail "systemd-analyze verify warns about the unit: $(cat "$work/verify.out")"
    fi
    pass "systemd-analyze verify"
else
    for key in '^\[Unit\]$' '^\[Service\]$' '^\[Install\]$' '^EnvironmentFile=-/etc/default/mesos-gpu$' \
        '^Restart=on-failure$' '^WantedBy=multi-user.target$'; do
        grep -Eq "$key" "$root$unit" || fail "the unit lacks a line matching $key"
    done
    pass "unit keys (systemd-analyze not installed)"
fi

# The module's sources are the source tree's, and the packaged binary has the command that builds
# them (cli/tests/module.rs builds them against a real Mesos).
for f in CMakeLists.txt gpu_isolator.cpp gpu_docker_hook.cpp; do
    cmp -s "$root/usr/share/mesos-gpu/module/$f" "ffi/mesos-module/$f" ||
        fail "/usr/share/mesos-gpu/module/$f differs from ffi/mesos-module/$f"
done
"$bin" module build --help >/dev/null || fail "the packaged binary has no \`module build\`"
pass "the module's sources in /usr/share/mesos-gpu/module and \`mesos-gpu module build\`"

# The agent examples and the Docker wrapper are the source tree's, parse, and hold command lines
# the packaged binary accepts (clap checks every flag given before --help).
for f in agent.sh modules.json modules-docker.json README.md; do
    cmp -s "$root/usr/share/doc/mesos-gpu/examples/$f" "examples/mesos-agent/$f" ||
        fail "/usr/share/doc/mesos-gpu/examples/$f differs from examples/mesos-agent/$f"
done
cmp -s "$root/usr/bin/mesos-gpu-docker" examples/mesos-agent/mesos-gpu-docker ||
    fail "/usr/bin/mesos-gpu-docker differs from examples/mesos-agent/mesos-gpu-docker"
for script in "$root/usr/share/doc/mesos-gpu/examples/agent.sh" "$root/usr/bin/mesos-gpu-docker"; do
    sh -n "$script" || fail "$script does not parse"
done
for json in modules.json modules-docker.json; do
    python3 -m json.tool "$root/usr/share/doc/mesos-gpu/examples/$json" >/dev/null ||
        fail "/usr/share/doc/mesos-gpu/examples/$json is not JSON"
done
accepted() { # the words of a `/usr/bin/mesos-gpu …` command line, without the program
    "$bin" "$@" --help >/dev/null 2>"$work/cmdline.err" ||
        fail "the packaged binary refuses: mesos-gpu $* ($(cat "$work/cmdline.err"))"
}
wrapper=$(awk '{ if (sub(/\\$/, "")) printf "%s ", $0; else print }' "$root/usr/bin/mesos-gpu-docker" |
    sed -n 's|^exec /usr/bin/mesos-gpu \(.*\) -- "\$@"$|\1|p')
[ -n "$wrapper" ] || fail "/usr/bin/mesos-gpu-docker does not exec /usr/bin/mesos-gpu … -- \"\$@\""
read -r -a words <<< "$wrapper"
accepted "${words[@]}"
hook=$(python3 -c 'import json,sys
for lib in json.load(open(sys.argv[1]))["libraries"]:
    for m in lib["modules"]:
        for p in m.get("parameters", []):
            if p["key"] == "docker_args": print(p["value"])' \
    "$root/usr/share/doc/mesos-gpu/examples/modules-docker.json")
[ -n "$hook" ] || fail "modules-docker.json has no docker_args parameter"
read -r -a words <<< "$hook"
[ "${words[0]}" = /usr/bin/mesos-gpu ] || fail "docker_args runs ${words[0]}, not /usr/bin/mesos-gpu"
accepted "${words[@]:1}"
# Every packaged path the guide names is in the package.
for path in $(grep -o '`/\(usr\|etc\|lib\)/[^` ]*`' "$root/usr/share/doc/mesos-gpu/operator-guide.md" |
    tr -d '`' | grep -E '^/(usr/bin/mesos-gpu|usr/lib/mesos-gpu/|usr/share/doc/mesos-gpu/|usr/share/mesos-gpu/|usr/include/mesos_gpu|etc/default/mesos-gpu)' |
    grep -v '[*<]' | sort -u); do
    [ -e "$root$path" ] || fail "the operator guide names $path, which the package lacks"
done
pass "agent examples, /usr/bin/mesos-gpu-docker and the hook's command line; the guide's paths"

# The header's functions are exported by the packaged library.
lib="$root/usr/lib/mesos-gpu/libmesos_gpu.so"
grep -oE '\bmgpu_[a-z0-9_]+[[:space:]]*\(' "$root/usr/include/mesos_gpu.h" | tr -d '( \t' | sort -u \
    > "$work/declared"
[ -s "$work/declared" ] || fail "mesos_gpu.h declares no mgpu_ function"
nm -D --defined-only "$lib" | awk '$2 == "T" { print $3 }' | sort -u > "$work/exported"
missing=$(comm -23 "$work/declared" "$work/exported" | tr '\n' ' ')
[ -z "$missing" ] || fail "libmesos_gpu.so does not export: $missing"
pass "libmesos_gpu.so exports the header's $(wc -l < "$work/declared") functions"

# The packaged binary simulates every packaged topology with the packaged simulator.
for topo in "$root"/usr/share/mesos-gpu/topologies/*.json; do
    env -u MESOS_GPU_NVML_SIM -u NVML_SIM_CONFIG -u MESOS_GPU_NVML_LIB MESOS_GPU_LOG=warn \
        "$bin" info --simulate "$topo" >"$work/info.out" 2>&1 ||
        fail "mesos-gpu info --simulate $(basename "$topo") with the packaged files: $(cat "$work/info.out")"
done
pass "mesos-gpu info --simulate runs each of the $topologies packaged topologies"

# A simulated node's driver tree takes its nvidia-smi from the packaged stand-in, and the volume
# planned from it holds that program.
env -u MESOS_GPU_NVML_SIM -u NVML_SIM_CONFIG -u MESOS_GPU_NVML_LIB MESOS_GPU_LOG=warn \
    "$bin" --simulate "$root/usr/share/mesos-gpu/topologies/dgx1-v100.json" volume plan --json \
    >"$work/plan.json" 2>"$work/plan.err" ||
    fail "mesos-gpu --simulate … volume plan with the packaged files: $(cat "$work/plan.err")"
grep -q '"name": "nvidia-smi"' "$work/plan.json" ||
    fail "the simulated driver's volume plan has no nvidia-smi: $(head -c 2000 "$work/plan.json")"
grep -q '"origin": "driver_bin"' "$work/plan.json" ||
    fail "the simulated driver's nvidia-smi was not taken from its bin: $(head -c 2000 "$work/plan.json")"
if grep -q 'stand-in is not built' "$work/plan.err"; then
    fail "the packaged binary did not find the packaged nvidia-smi stand-in: $(cat "$work/plan.err")"
fi
pass "mesos-gpu --simulate volume plan takes nvidia-smi from the packaged stand-in"

echo "check-package: all checks passed for $deb" >&2
