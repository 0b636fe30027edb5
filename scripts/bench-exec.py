#!/usr/bin/env python3
"""Where one `mesos-gpu exec` spends its time (issue 36).

Runs `mesos-gpu [--simulate NODE] --log-format json exec --gpus G --pool-dir TMP -- true` N times,
one after the other, and prints p50/p95/p99 of: the whole run as the caller sees it (fork to
exit), each phase of the exec's `exec timings` debug line (simulation set-up, NVML open and
discovery, device nodes, runtime and signal set-up, isolator recover, prepare, start = launcher
spawned + moved into the cgroup + released, command = the command run and waited for, cleanup),
the lifecycle steps inside them, and what is outside the phases (process start before `run`,
the simulation's removal, exit).

Usage: scripts/bench-exec.py [N] [PATH-TO-mesos-gpu]   (root: exec makes a device cgroup)
  default: N=50, $CARGO_TARGET_DIR (or target)/release/mesos-gpu.
Environment: NODE (default dgx1-v100; empty: no --simulate, the host's own GPUs and NVML),
  GPUS (default 1).
"""

import json
import os
import subprocess
import sys
import tempfile
import time


def percentile(values, p):
    """The nearest-rank percentile: the smallest value with at least p % of values at or below."""
    s = sorted(values)
    for i in range(1, len(s) + 1):
        if i >= p / 100.0 * len(s):
            return s[i - 1]
    return s[-1]


def fields(text):
    """`a=1 b=2x3` -> {a: 1, b: 2} (microseconds; a count suffix dropped)."""
    out = {}
    for item in text.split():
        if "=" in item:
            k, v = item.split("=", 1)
            out[k] = int(v.split("x")[0])
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    exe = sys.argv[2] if len(sys.argv) > 2 else os.path.join(target, "release", "mesos-gpu")
    node = os.environ.get("NODE", "dgx1-v100")
    gpus = os.environ.get("GPUS", "1")
    env = dict(os.environ, MESOS_GPU_LOG="mesos_gpu::cmd::exec=debug")
    walls, phases, steps, inside = [], {}, {}, []
    with tempfile.TemporaryDirectory(prefix="mgpu-bench-exec") as pool:
        simulate = ["--simulate", node] if node else []
        cmd = [exe, *simulate, "--log-format", "json", "exec", "--gpus", gpus,
               "--pool-dir", pool, "--", "true"]
        for _ in range(n):
            t0 = time.perf_counter()
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            walls.append((time.perf_counter() - t0) * 1e6)
            if run.returncode != 0:
                sys.exit(f"bench-exec: {' '.join(cmd)} exited {run.returncode}:\n{run.stderr}")
            line = next((json.loads(l) for l in run.stderr.splitlines()
                         if l.startswith("{") and "exec timings" in l), None)
            if line is None:
                sys.exit(f"bench-exec: no `exec timings` line in:\n{run.stderr}")
            f = line["fields"]
            inside.append(int(f["us"]))
            for k, v in fields(f["phases"]).items():
                phases.setdefault(k, []).append(v)
            for k, v in fields(f["steps"]).items():
                steps.setdefault(k, []).append(v)
    with open("/proc/loadavg", encoding="ascii") as f:
        load = " ".join(f.read().split()[:3])
    print(f"bench-exec: {n} runs of {' '.join(cmd[:-4])} <pool> -- true; loadavg {load}")
    print(f"| | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|")

    def row(name, us):
        cells = " | ".join(f"{percentile(us, p) / 1000:.2f}" for p in (50, 95, 99))
        print(f"| {name} | {cells} |")

    row("**whole run** (fork to exit)", walls)
    row("outside the phases (process start, simulation removal, exit)",
        [w - i for w, i in zip(walls, inside)])
    row("phases together", inside)
    for k, v in phases.items():
        row(k, v)
    for k, v in steps.items():
        row(f"  step {k} (recover, prepare, isolate and cleanup together)", v)


if __name__ == "__main__":
    main()
