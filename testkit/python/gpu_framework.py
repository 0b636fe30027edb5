#!/usr/bin/env python3
"""A Mesos framework for the real-agent benchmarks and tests, written with pymesos.

pymesos (PyPI) is a pure-Python client of Mesos's HTTP scheduler API (v1); nothing in it was
written for this project. This script is driven through its standard input and reports through
a file, so that a Rust test or benchmark can launch many tasks through one framework
(`mesos-execute` registers one framework per task):

stdin, one JSON object a line:
    {"op": "launch", "id": ID, "resources": {"cpus": 0.1, "mem": 32, "gpus": 2},
     "command": SHELL, "port": AGENT_PORT (optional: only on that agent),
     "container": CONTAINER_INFO (optional, as JSON: e.g. a Docker image)}
    {"op": "kill", "id": ID}
    {"op": "stop"}                      tears the framework down (its tasks are killed)

--events FILE, one JSON object a line, flushed as it happens; `t` is CLOCK_BOOTTIME in seconds,
the clock of /proc/uptime, so a task's own timestamps compare with the framework's:
    {"event": "registered", "framework_id": ..., "t": ...}
    {"event": "offer", "port": ..., "agent_id": ..., "resources": {NAME: VALUE}, "t": ...}
    {"event": "accept", "id": ..., "port": ..., "agent_id": ..., "t": ...}
    {"event": "status", "id": ..., "state": "TASK_RUNNING", "message": ..., "reason": ...,
     "source": ..., "agent_id": ..., "t": ...}
    {"event": "error", "message": ..., "t": ...}

A launch waits for the first offer (from the named agent, if any) holding all its resources;
tasks are taken in order, a task that fits no offer now leaving the offer to the next ones.

pymesos adds the GPU_RESOURCES capability to every framework on Mesos >= 1.0; --no-gpu-capability
takes it out again (a framework that does not declare it, as Mesos's --filter_gpu_resources
means).
"""

import argparse
import json
import logging
import sys
import threading
import time

from pymesos import MesosSchedulerDriver, Scheduler


def now():
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Events:
    """The events file: one JSON object a line."""

    def __init__(self, path):
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, event, **fields):
        fields["event"] = event
        fields["t"] = now()
        line = json.dumps(fields, sort_keys=True)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def scalars(resources):
    """NAME -> summed scalar value of an offer's resources."""
    total = {}
    for r in resources:
        if r.get("type") == "SCALAR":
            total[r["name"]] = total.get(r["name"], 0.0) + r["scalar"]["value"]
    return total


def agent_port(offer):
    return offer.get("url", {}).get("address", {}).get("port")


class GpuScheduler(Scheduler):
    def __init__(self, events):
        self.events = events
        self.lock = threading.Lock()
        self.pending = []  # launch commands not yet placed, in order

    def registered(self, driver, framework_id, master_info):
        self.events.write("registered", framework_id=framework_id["value"])

    def reregistered(self, driver, master_info):
        self.events.write("reregistered")

    def add(self, driver, task):
        with self.lock:
            self.pending.append(task)
        driver.reviveOffers()

    def resourceOffers(self, driver, offers):
        for offer in offers:
            free = scalars(offer.get("resources", []))
            port = agent_port(offer)
            self.events.write(
                "offer", port=port, agent_id=offer["agent_id"]["value"], resources=free
            )
            launch = []
            with self.lock:
                for task in list(self.pending):
                    want = task["resources"]
                    if task.get("port") not in (None, port):
                        continue
                    if any(free.get(k, 0.0) + 1e-9 < v for k, v in want.items() if v > 0):
                        continue
                    for k, v in want.items():
                        free[k] = free.get(k, 0.0) - v
                    self.pending.remove(task)
                    launch.append(task)
                idle = not self.pending
            if not launch:
                # Refuse this agent's resources for a while when nothing waits; a new launch
                # revives offers.
                driver.declineOffer(
                    offer["id"], filters={"refuse_seconds": 30.0 if idle else 0.2}
                )
                continue
            infos = []
            for task in launch:
                infos.append(
                    {
                        "name": task["id"],
                        "task_id": {"value": task["id"]},
                        "agent_id": offer["agent_id"],
                        "resources": [
                            {"name": k, "type": "SCALAR", "scalar": {"value": v}}
                            for k, v in task["resources"].items()
                            if v > 0
                        ],
                        "command": {"value": task["command"], "shell": True},
                    }
                )
                if "container" in task:
                    infos[-1]["container"] = task["container"]
            driver.launchTasks(offer["id"], infos, filters={"refuse_seconds": 0.2})
            for task in launch:
                self.events.write(
                    "accept", id=task["id"], port=port, agent_id=offer["agent_id"]["value"]
                )

    def statusUpdate(self, driver, status):
        self.events.write(
            "status",
            id=status["task_id"]["value"],
            state=status["state"],
            message=status.get("message", ""),
            reason=status.get("reason", ""),
            source=status.get("source", ""),
            agent_id=status.get("agent_id", {}).get("value", ""),
        )

    def error(self, driver, message):
        self.events.write("error", message=message)


class Driver(MesosSchedulerDriver):
    """pymesos's driver, optionally without the GPU_RESOURCES capability it always adds."""

    def __init__(self, *args, gpu_capability=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.gpu_capability = gpu_capability

    @property
    def framework(self):
        framework = super().framework
        if not self.gpu_capability:
            caps = [c for c in framework.get("capabilities", []) if c["type"] != "GPU_RESOURCES"]
            if caps:
                framework["capabilities"] = caps
            else:
                framework.pop("capabilities", None)
        return framework


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True, help="HOST:PORT of the Mesos master")
    parser.add_argument("--events", required=True, help="file the events are appended to")
    parser.add_argument("--name", default="mesos-gpu-framework")
    parser.add_argument("--role", default="*")
    parser.add_argument("--no-gpu-capability", action="store_true")
    parser.add_argument("--no-checkpoint", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    events = Events(args.events)
    framework = {
        "user": "root",
        "name": args.name,
        "hostname": "127.0.0.1",
        "checkpoint": not args.no_checkpoint,
        "failover_timeout": 120.0,
    }
    if args.role != "*":
        framework["role"] = args.role
    scheduler = GpuScheduler(events)
    driver = Driver(
        scheduler,
        framework,
        args.master,
        use_addict=False,
        gpu_capability=not args.no_gpu_capability,
    )
    driver.start()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        if cmd["op"] == "launch":
            scheduler.add(driver, cmd)
        elif cmd["op"] == "kill":
            driver.killTask({"value": cmd["id"]})
        elif cmd["op"] == "stop":
            break
        else:
            events.write("error", message="unknown op %r" % cmd["op"])
    driver.stop()
    driver.join()


if __name__ == "__main__":
    main()
