//! Issue 34: the operator guide's agent paths, run as written against the real Mesos 1.12 agent.
//!
//! Each test gives a real `mesos-agent` a private view of a simulated node as a driver install
//! lays it out ([`PrivateHost`]: the GPUs' and control nodes in `/dev`, nvml-sim as the
//! `libnvidia-ml.so.1` of `ld.so.cache`), so that Mesos's own `gpu/nvidia` runs beside the
//! module, and `examples/mesos-agent/agent.sh` (shipped as
//! `/usr/share/doc/mesos-gpu/examples/agent.sh`) finds `mesos-gpu` and `mesos-agent` on `PATH`
//! as on an agent host. What only this harness knows (the master's address, the agent's port,
//! its directories and cgroups root) reaches the agent as `MESOS_*` variables, which the
//! documented command's own flags override; `agent-flags` gets the simulated driver's `/proc`
//! files, a scratch pool and the driver's files through `AGENT_FLAGS_OPTS`, put ahead of the
//! documented value, and a scratch volume root through `VOLUME_ROOT`.
//!
//! - every `agent.sh` command in the docs starts the agent and it registers with the module;
//! - an agent advertising GPUs its isolator cannot back (phantom GPUs) does not start, with
//!   Mesos's `gpu/nvidia` and with the module, each saying why in the agent log;
//! - the guide's driver upgrade keeps the agent's ID and its running tasks; naming the driver in
//!   the attributes (`--driver-attributes`) makes Mesos refuse the recovery, as the guide says;
//! - the guide's moves between Mesos's `gpu/nvidia` and the module: in place on cgroup v1; on
//!   cgroup v2 drained first (the guide's `curl` blocks run as written), and what an in-place
//!   move does there instead.

mod agents;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use agents::{
    Hold, TaskProbe, allowed_minors, mesos_gpu_exe, module, probe, probe_command, shell_words,
    task_containers, until,
};
use libtest_mimic::{Arguments, Trial};
use mesos_gpu_testkit::mesos::{
    Agent, AgentCgroups, AgentSpec, DevNode, ISOLATOR_MODULE, Master, MesosInstall, PrivateHost,
    Task, http_get, http_post_json, modules_json,
};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};
use support::{TestResult, check, trial};

const TASK_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let host = Host::probe();
    let v1: &[Need] = &[Need::Root, Need::Cgroup1, Need::Cc, Need::Mesos];
    type Test = fn() -> TestResult;
    let tests: [(&str, Test); 5] = [
        (
            "moving_between_gpu_nvidia_and_the_module_in_place_keeps_every_tasks_gpus",
            moving_between_gpu_nvidia_and_the_module_in_place_keeps_every_tasks_gpus,
        ),
        (
            "every_documented_agent_sh_command_starts_the_real_agent",
            every_documented_agent_sh_command_starts_the_real_agent,
        ),
        (
            "phantom_gpus_stop_the_agent_with_gpu_nvidia_and_with_the_module",
            phantom_gpus_stop_the_agent_with_gpu_nvidia_and_with_the_module,
        ),
        (
            "the_documented_driver_upgrade_keeps_the_agent_id_and_its_tasks",
            the_documented_driver_upgrade_keeps_the_agent_id_and_its_tasks,
        ),
        (
            "driver_attributes_make_mesos_refuse_the_recovery_after_an_upgrade",
            driver_attributes_make_mesos_refuse_the_recovery_after_an_upgrade,
        ),
    ];
    let mut trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, f)| needs(&host, v1, trial(name, f)))
        .collect();
    let v2: &[Need] = &[Need::Root, Need::Cgroup2, Need::Cc, Need::Mesos];
    trials.push(needs(
        &host,
        v2,
        trial(
            "moving_between_gpu_nvidia_and_the_module_on_cgroup_v2_drains_and_keeps_the_agent_id",
            moving_between_gpu_nvidia_and_the_module_on_cgroup_v2_drains_and_keeps_the_agent_id,
        ),
    ));
    trials.push(needs(
        &host,
        v2,
        trial(
            "moving_in_place_on_cgroup_v2_destroys_or_double_books_the_running_tasks",
            moving_in_place_on_cgroup_v2_destroys_or_double_books_the_running_tasks,
        ),
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A simulated node seen through a private host view, with a `PATH` directory holding
/// `mesos-gpu` and `mesos-agent` as a package install puts them there.
struct Node {
    sim: SimNode,
    host: PrivateHost,
    scratch: tempfile::TempDir,
    install: MesosInstall,
}

impl Node {
    fn new(name: &str) -> TestResult<Node> {
        let install = MesosInstall::locate()?;
        let sim = SimNode::shipped(name);
        let minors: Vec<u32> = sim.inventory()?.gpus.iter().map(|g| g.minor).collect();
        let host = PrivateHost::new(&DevNode::nvidia(&minors), &[sim.dir()])?;
        let scratch = tempfile::Builder::new().prefix("mgpu-guide").tempdir()?;
        let bin = scratch.path().join("bin");
        std::fs::create_dir_all(&bin)?;
        std::os::unix::fs::symlink(mesos_gpu_exe()?, bin.join("mesos-gpu"))?;
        let agent = bin.join("mesos-agent");
        std::fs::write(
            &agent,
            format!(
                "#!/bin/sh\nexec {} \"$@\"\n",
                install.sbin("mesos-agent").display()
            ),
        )?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))?;
        let version = sim
            .inventory()?
            .driver
            .map(|d| d.version)
            .unwrap_or_default();
        driver_tree(&scratch.path().join("driver"), &version)?;
        Ok(Node {
            sim,
            host,
            scratch,
            install,
        })
    }

    /// What `agent.sh` needs from this host: `PATH`, the module library, and the options that
    /// point `agent-flags` at the simulated driver's `/proc` files and scratch directories.
    fn env(&self) -> TestResult<Vec<(String, String)>> {
        let s = self.scratch.path();
        let path = format!(
            "{}:{}",
            s.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Ok(vec![
            ("PATH".into(), path),
            ("MODULE_LIBRARY".into(), module()?.display().to_string()),
            (
                "VOLUME_ROOT".into(),
                s.join("volumes").display().to_string(),
            ),
            ("AGENT_FLAGS_OPTS".into(), self.agent_flags_opts()),
        ])
    }

    fn agent_flags_opts(&self) -> String {
        let s = self.scratch.path();
        format!(
            "--proc-root {} --pool-dir {} --module-param driver_root={}",
            self.sim.proc_root().display(),
            s.join("pool").display(),
            s.join("driver").display()
        )
    }

    /// An agent on cgroup v1 started by the documented shell command `command` (see
    /// [`as_run_here`]).
    fn script_spec(&self, master: &Master, command: &str) -> TestResult<AgentSpec> {
        self.script_spec_on(AgentCgroups::V1, master, command)
    }

    /// [`Self::script_spec`] on `cgroups`.
    fn script_spec_on(
        &self,
        cgroups: AgentCgroups,
        master: &Master,
        command: &str,
    ) -> TestResult<AgentSpec> {
        let script = as_run_here(command, master, &self.agent_flags_opts())?;
        let mut spec = AgentSpec::with_script(cgroups, &script, self.env()?);
        spec.private_host = Some(self.host.setup_script());
        spec.work_dir = Some(self.scratch.path().join("work"));
        Ok(spec)
    }
}

/// One `agent.sh` command of the docs.
struct Documented {
    /// The file.
    doc: &'static str,
    /// The heading of the section it is in.
    section: String,
    /// The command, continuation lines joined.
    command: String,
}

/// The driver's libraries as an install lays them out under `root` (`usr/local/nvidia/lib64`,
/// shared objects built by `cc` with their SONAMEs, `etc/ld.so.cache` by `ldconfig -r`), for
/// the module's `driver_volume=build`: nvml-sim is the NVML the processes load, these are the
/// files the volume is built from.
fn driver_tree(root: &Path, version: &str) -> TestResult {
    let lib64 = root.join("usr/local/nvidia/lib64");
    std::fs::create_dir_all(&lib64)?;
    std::fs::create_dir_all(root.join("etc"))?;
    for (name, soname) in [("libnvidia-ml.so", "1"), ("libcuda.so", "1")] {
        let out = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-x", "c", "/dev/null", "-o"])
            .arg(lib64.join(format!("{name}.{version}")))
            .arg(format!("-Wl,-soname,{name}.{soname}"))
            .output()?;
        check(
            out.status.success(),
            format!("cc {name}: {}", String::from_utf8_lossy(&out.stderr)),
        )?;
    }
    std::fs::write(root.join("etc/ld.so.conf"), "/usr/local/nvidia/lib64\n")?;
    let out = std::process::Command::new("ldconfig")
        .arg("-r")
        .arg(root)
        .output()?;
    check(
        out.status.success(),
        format!("ldconfig -r: {}", String::from_utf8_lossy(&out.stderr)),
    )
}

/// Every `agent.sh` command line in the docs' shell blocks.
fn documented_agent_sh_commands() -> TestResult<Vec<Documented>> {
    let mut out = Vec::new();
    for doc in [
        "docs/operator-guide.md",
        "examples/mesos-agent/README.md",
        "README.md",
    ] {
        let text = std::fs::read_to_string(repo().join(doc))?;
        let mut in_shell = false;
        let mut pending = String::new();
        let mut section = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if !in_shell && line.starts_with('#') {
                section = line.trim_start_matches('#').trim().to_owned();
            }
            if trimmed.starts_with("```") {
                in_shell = !in_shell && trimmed.trim_start_matches('`') == "sh";
                continue;
            }
            if !in_shell || trimmed.starts_with('#') {
                continue;
            }
            pending.push_str(trimmed.trim_end_matches('\\'));
            pending.push(' ');
            if trimmed.ends_with('\\') {
                continue;
            }
            let command = std::mem::take(&mut pending);
            if command.contains("agent.sh") {
                out.push(Documented {
                    doc,
                    section: section.clone(),
                    command: command.trim().to_owned(),
                });
            }
        }
    }
    Ok(out)
}

/// `command` as run on this test host: its words as the shell reads them, `agent.sh` (either
/// path the docs give) this checkout's, `MASTER` the test's master, `host_opts` put ahead of
/// the command's own `AGENT_FLAGS_OPTS`, and run with `exec env` so that the agent keeps the
/// process the harness started.
fn as_run_here(command: &str, master: &Master, host_opts: &str) -> TestResult<String> {
    let words = shell_words(command)?;
    let script = repo().join("examples/mesos-agent/agent.sh");
    let mut out = vec!["exec".to_owned(), "env".to_owned()];
    let mut seen_script = false;
    for word in words {
        let word = if seen_script {
            word
        } else if let Some(value) = word.strip_prefix("AGENT_FLAGS_OPTS=") {
            format!("AGENT_FLAGS_OPTS={host_opts} {value}")
        } else if word.starts_with("MASTER=") {
            format!("MASTER={}", master.address())
        } else if word.ends_with("agent.sh") {
            seen_script = true;
            script.display().to_string()
        } else {
            word
        };
        out.push(format!("'{}'", word.replace('\'', r"'\''")));
    }
    check(seen_script, format!("no agent.sh in {command:?}"))?;
    Ok(out.join(" "))
}

/// The agent's `/state`.
fn state(agent: &Agent) -> TestResult<serde_json::Value> {
    Ok(serde_json::from_str(&http_get(agent.port(), "/state")?)?)
}

/// Every `agent.sh` command the docs show (`--attributes=rack:r7` among them, which the agent
/// refused as a duplicate flag before issue 34), run as written: the agent registers with the
/// module loaded (or Mesos's `gpu/nvidia`, where the command names it), advertising the node's 8
/// GPUs, and keeps the operator's attributes ahead of the GPU attributes.
fn every_documented_agent_sh_command_starts_the_real_agent() -> TestResult {
    let commands = documented_agent_sh_commands()?;
    check(
        commands.len() >= 3,
        format!(
            "the docs show at least three agent.sh commands: {:?}",
            commands.iter().map(|c| &c.command).collect::<Vec<_>>()
        ),
    )?;
    for Documented { doc, command, .. } in commands {
        println!("{doc}: {command}");
        let node = Node::new("dgx1-v100")?;
        let master = Master::start(&node.install)?;
        let spec = node.script_spec(&master, &command)?;
        let agent = Agent::start(&node.install, &master, spec)
            .map_err(|e| format!("{doc}: `{command}` did not start the agent: {e}"))?;
        if !command.contains("gpu/nvidia") {
            agent.wait_log("GPU isolator ready", TASK_TIMEOUT)?;
        }
        let state = state(&agent)?;
        let gpus = state["resources"]["gpus"].as_f64().unwrap_or(0.0);
        check(
            gpus == 8.0,
            format!("{doc}: `{command}`: the agent offers gpus:{gpus}, the node has 8"),
        )?;
        let attributes = &state["attributes"];
        check(
            attributes["gpu_model"] == "Tesla-V100-SXM2-16GB"
                && attributes.get("nvidia_driver").is_none(),
            format!("{doc}: `{command}`: GPU attributes, no driver ones: {attributes}"),
        )?;
        if command.contains("--attributes=rack:r7") {
            check(
                attributes["rack"] == "r7",
                format!("{doc}: `{command}`: the operator's attribute is kept: {attributes}"),
            )?;
        }
    }
    Ok(())
}

/// The isolator whose start-time rules a case checks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Isolator {
    GpuNvidia,
    Module,
}

/// An agent on `node` with `isolator`, `--resources` `resources` and the device list `devices`
/// (`--nvidia_gpu_devices` for `gpu/nvidia`, the module's `nvidia_gpu_devices` parameter).
fn isolator_spec(
    node: &Node,
    isolator: Isolator,
    resources: &str,
    devices: Option<&str>,
) -> TestResult<AgentSpec> {
    let isolation = match isolator {
        Isolator::GpuNvidia => "filesystem/linux,cgroups/devices,gpu/nvidia".to_owned(),
        Isolator::Module => format!("filesystem/linux,cgroups/devices,{ISOLATOR_MODULE}"),
    };
    let mut spec = AgentSpec::new(&isolation, AgentCgroups::V1, 0);
    spec.resources = resources.to_owned();
    spec.private_host = Some(node.host.setup_script());
    match isolator {
        Isolator::GpuNvidia => {
            if let Some(devices) = devices {
                spec.flags.push(format!("--nvidia_gpu_devices={devices}"));
            }
        }
        Isolator::Module => {
            let s = node.scratch.path();
            let mut params: Vec<(String, String)> = vec![
                (
                    "work_dir".into(),
                    s.join("module-work").display().to_string(),
                ),
                ("pool_dir".into(), s.join("pool").display().to_string()),
                (
                    "proc_root".into(),
                    node.sim.proc_root().display().to_string(),
                ),
                ("driver_volume".into(), "off".into()),
            ];
            if let Some(devices) = devices {
                params.push(("nvidia_gpu_devices".into(), devices.to_owned()));
            }
            let modules = s.join("modules.json");
            std::fs::write(&modules, modules_json(&module()?, &params).to_string())?;
            spec.modules = Some(modules);
        }
    }
    Ok(spec)
}

/// Every refusal Mesos's `gpu/nvidia` makes at agent start for the `gpus` it advertises
/// (`enumerateGpuResources` and `enumerateGpus`, `isolators/gpu/allocator.cpp`), on an 8-GPU
/// node: the real agent refuses to start with `gpu/nvidia`, and with the module given the same
/// numbers (its `nvidia_gpu_devices` parameter for the device list), each log saying why. The
/// configurations `agent-flags` prints start with both.
fn phantom_gpus_stop_the_agent_with_gpu_nvidia_and_with_the_module() -> TestResult {
    // (--resources, device list, what gpu/nvidia logs, what the module logs)
    let cases: [(&str, Option<&str>, &str, &str); 8] = [
        (
            "cpus:1;gpus:16",
            None,
            "cannot be set without also setting `--nvidia_gpu_devices`",
            "advertise gpus:16, but the GPU module hands out gpus:8",
        ),
        (
            "cpus:1;gpus:2",
            Some("0"),
            "specify different numbers of GPU devices",
            "advertise gpus:2, but the GPU module hands out gpus:1",
        ),
        (
            "cpus:1;gpus:1.5",
            Some("0"),
            "must be an non-negative integer",
            "gpus:1.5: the 'gpus' resource must be a non-negative whole number",
        ),
        (
            "cpus:1;gpus:2",
            Some("0,0"),
            "contains duplicates",
            "contains duplicates: [0]",
        ),
        (
            "cpus:1;gpus:0",
            Some("0"),
            "cannot be specified when '--resources' specifies 0 GPUs",
            "but the agent's --resources specify gpus:0",
        ),
        (
            "cpus:1",
            Some("0,1"),
            "cannot be set without also setting 'gpus'",
            "but the agent's --resources have no 'gpus'",
        ),
        (
            "cpus:1;gpus:9",
            Some("0,1,2,3,4,5,6,7,8"),
            "greater than the number of GPUs available",
            "is greater than the number of GPUs on this node (8)",
        ),
        (
            "cpus:1;gpus:1",
            Some("9"),
            "deviceGetHandleByIndex",
            "lists GPU 9, which this node does not have",
        ),
    ];
    let node = Node::new("dgx1-v100")?;
    let master = Master::start(&node.install)?;
    for (resources, devices, builtin_says, module_says) in cases {
        for (isolator, says) in [
            (Isolator::GpuNvidia, builtin_says),
            (Isolator::Module, module_says),
        ] {
            let spec = isolator_spec(&node, isolator, resources, devices)?;
            let (status, log) = Agent::start_refused(&node.install, &master, spec)?;
            let tail = mesos_gpu_testkit::mesos::tail(&log, 15);
            println!("{isolator:?} --resources={resources} devices={devices:?}: {status}\n{tail}");
            check(
                !status.success() && !log.contains("Registered with master"),
                format!(
                    "{isolator:?} must refuse --resources={resources} devices={devices:?}:\n{tail}"
                ),
            )?;
            check(
                log.contains(says),
                format!(
                    "{isolator:?} --resources={resources} devices={devices:?}: the log must say {says:?}:\n{tail}"
                ),
            )?;
        }
    }
    for (isolator, resources, devices) in [
        (
            Isolator::GpuNvidia,
            "cpus:1;gpus:8",
            Some("0,1,2,3,4,5,6,7"),
        ),
        (Isolator::Module, "cpus:1;gpus:8", None),
        (Isolator::Module, "cpus:1;gpus:2", Some("3,5")),
    ] {
        let spec = isolator_spec(&node, isolator, resources, devices)?;
        let agent = Agent::start(&node.install, &master, spec)
            .map_err(|e| format!("{isolator:?} {resources} {devices:?} must start: {e}"))?;
        drop(agent);
    }
    Ok(())
}

/// The driver the node moves to.
const NEW_DRIVER: (&str, &str) = ("555.42.06", "12.5");

/// The command the guide's "Driver upgrades" section starts the agent with.
fn upgrade_command() -> TestResult<String> {
    let found: Vec<String> = documented_agent_sh_commands()?
        .into_iter()
        .filter(|c| c.doc == "docs/operator-guide.md" && c.section == "Driver upgrades")
        .map(|c| c.command)
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        other => Err(format!(
            "the guide's Driver upgrades section shows one agent.sh command: {other:?}"
        )
        .into()),
    }
}

/// Moves the simulated node to driver `version` (CUDA `cuda`), as installing a new driver and
/// reloading the kernel module would.
fn upgrade_driver(node: &mut Node, version: &str, cuda: &str) -> TestResult {
    let mut description: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(node.sim.config_path())?)?;
    description["driver_version"] = version.into();
    description["cuda_driver_version"] = cuda.into();
    node.sim.set_description(&description.to_string());
    Ok(())
}

/// The guide's driver upgrade ("Driver upgrades"), step by step on the real agent started by
/// `agent.sh`: a checkpointed task without GPUs and one with a GPU run; the agent stops, the
/// driver changes, the agent starts again with the same command (its flags regenerated). It
/// recovers with the same agent ID, both tasks keep running, and a new task launches.
fn the_documented_driver_upgrade_keeps_the_agent_id_and_its_tasks() -> TestResult {
    let mut node = Node::new("dgx1-v100")?;
    let master = Master::start(&node.install)?;
    let spec = node.script_spec(&master, &upgrade_command()?)?;
    let mut agent = Agent::start(&node.install, &master, spec)?;
    let before = state(&agent)?["id"].clone();
    let mut plain = Task::launch(
        &node.install,
        &master,
        "plain",
        "cpus:0.1;mem:32",
        "sleep 600",
    )?;
    let mut gpu = Task::launch(
        &node.install,
        &master,
        "gpu",
        "cpus:0.1;mem:32;gpus:1",
        "sleep 600",
    )?;
    plain.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    gpu.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;

    agent.kill()?;
    upgrade_driver(&mut node, NEW_DRIVER.0, NEW_DRIVER.1)?;
    agent
        .restart()
        .map_err(|e| format!("the agent must recover after the driver upgrade: {e}"))?;
    let after = state(&agent)?;
    check(
        after["id"] == before,
        format!("the agent keeps its ID: {before} then {}", after["id"]),
    )?;
    let log = agent.log();
    check(
        !log.contains("Incompatible agent info"),
        "Mesos must not find the agent info changed",
    )?;
    check(
        log.contains(&format!("driver={}", NEW_DRIVER.0)),
        format!(
            "the restarted module reads the new driver {}:\n{}",
            NEW_DRIVER.0,
            mesos_gpu_testkit::mesos::tail(&log, 20)
        ),
    )?;
    check(
        plain.is_running() && gpu.is_running(),
        format!(
            "both tasks keep running: {:?} {:?}",
            plain.states(),
            gpu.states()
        ),
    )?;
    let tasks: Vec<String> = after["frameworks"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| f["executors"].as_array().into_iter().flatten())
        .flat_map(|e| e["tasks"].as_array().into_iter().flatten())
        .filter(|t| t["state"] == "TASK_RUNNING")
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    check(
        tasks.contains(&"plain".to_owned()) && tasks.contains(&"gpu".to_owned()),
        format!("the recovered agent runs both tasks: {tasks:?}"),
    )?;
    let mut fresh = Task::launch(
        &node.install,
        &master,
        "fresh",
        "cpus:0.1;mem:32;gpus:1",
        "true",
    )?;
    fresh.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    Ok(())
}

/// With `--driver-attributes` (the opt-in the guide describes), the agent advertises the
/// driver; after the same driver upgrade, Mesos refuses to recover it (the default
/// `--reconfiguration_policy=equal`), as the guide says: the reason the driver stays out of the
/// attributes by default.
fn driver_attributes_make_mesos_refuse_the_recovery_after_an_upgrade() -> TestResult {
    let mut node = Node::new("dgx1-v100")?;
    let master = Master::start(&node.install)?;
    let command = format!(
        "AGENT_FLAGS_OPTS=--driver-attributes {}",
        upgrade_command()?
    );
    let spec = node.script_spec(&master, &command)?;
    let mut agent = Agent::start(&node.install, &master, spec)?;
    let attributes = state(&agent)?["attributes"].clone();
    check(
        attributes["nvidia_driver"] == "550.54.14",
        format!("the driver is advertised: {attributes}"),
    )?;
    agent.kill()?;
    upgrade_driver(&mut node, NEW_DRIVER.0, NEW_DRIVER.1)?;
    let refused = agent.restart();
    check(
        refused.is_err() && agent.log().contains("Incompatible agent info detected"),
        format!(
            "Mesos refuses to recover an agent whose attributes changed: {refused:?}\n{}",
            mesos_gpu_testkit::mesos::tail(&agent.log(), 15)
        ),
    )
}

/// The heading of the guide's section on moving between the isolators.
const MOVING: &str = "Moving between Mesos's gpu/nvidia and the module";

/// The two `agent.sh` commands of the guide's [`MOVING`] section: Mesos's `gpu/nvidia`'s, then
/// the module's.
fn moving_commands() -> TestResult<(String, String)> {
    let commands: Vec<String> = documented_agent_sh_commands()?
        .into_iter()
        .filter(|c| c.doc == "docs/operator-guide.md" && c.section == MOVING)
        .map(|c| c.command)
        .collect();
    match (
        commands.iter().find(|c| c.contains("gpu/nvidia")),
        commands.iter().find(|c| !c.contains("gpu/nvidia")),
    ) {
        (Some(builtin), Some(module)) => Ok((builtin.clone(), module.clone())),
        _ => Err(format!(
            "the guide's {MOVING:?} section shows both agent.sh commands: {commands:?}"
        )
        .into()),
    }
}

/// The GPU minors each running task's devices cgroup allows (cgroup v1), by task name.
fn task_gpus(agent: &Agent) -> TestResult<BTreeMap<String, BTreeSet<u32>>> {
    task_containers(agent)?
        .into_iter()
        .map(|(name, container)| Ok((name, allowed_minors(agent, &container)?)))
        .collect()
}

/// The guide's in-place move between Mesos's `gpu/nvidia` and the module ([`MOVING`]), its
/// two `agent.sh` commands as written, on cgroup v1: a task with GPUs and one without keep
/// running across each agent restart (before issue 34 the module did not know the first one's
/// container and the agent destroyed it at its first `update`), keep their GPUs (the module
/// adopts them from the devices cgroup, `gpu/nvidia` recovers them from it), and the other
/// isolator never hands those GPUs to a new task; the agent keeps its ID.
fn moving_between_gpu_nvidia_and_the_module_in_place_keeps_every_tasks_gpus() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let master = Master::start(&node.install)?;
    let (builtin, module) = moving_commands()?;
    let (builtin, module) = (&builtin, &module);
    let spec = node.script_spec(&master, builtin)?;
    let mut agent = Agent::start(&node.install, &master, spec)?;
    let id = state(&agent)?["id"].clone();
    let go = node.scratch.path().join("go");
    let (go_a, go_b, go_c) = (
        go.with_extension("a"),
        go.with_extension("b"),
        go.with_extension("c"),
    );
    let mut a = Task::launch(
        &node.install,
        &master,
        "a",
        "cpus:0.1;mem:32;gpus:2",
        &until(&go_a),
    )?;
    let go_p = go.with_extension("p");
    let mut p = Task::launch(
        &node.install,
        &master,
        "p",
        "cpus:0.1;mem:32",
        &until(&go_p),
    )?;
    a.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    p.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let before = task_gpus(&agent)?;
    println!("gpu/nvidia: {before:?}");

    // gpu/nvidia -> the module, task a running.
    agent.kill()?;
    agent.spec_mut().script = Some(as_run_here(module, &master, &node.agent_flags_opts())?);
    agent.restart()?;
    agent.wait_log("GPU isolator ready", TASK_TIMEOUT)?;
    check(
        state(&agent)?["id"] == id,
        "the agent keeps its ID (module)",
    )?;
    let mut b = Task::launch(
        &node.install,
        &master,
        "b",
        "cpus:0.1;mem:32;gpus:6",
        &until(&go_b),
    )?;
    b.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let moved = task_gpus(&agent)?;
    println!(
        "module: {moved:?}\n{}",
        mesos_gpu_testkit::mesos::tail(&agent.log(), 40)
    );
    check(
        moved["a"] == before["a"] && moved["a"].is_disjoint(&moved["b"]) && moved["b"].len() == 6,
        format!("a keeps its GPUs and b gets others: {moved:?}"),
    )?;
    std::fs::write(&go_a, "")?;
    a.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;

    // The module -> gpu/nvidia, task b running.
    agent.kill()?;
    agent.spec_mut().script = Some(as_run_here(builtin, &master, &node.agent_flags_opts())?);
    agent.restart()?;
    check(
        state(&agent)?["id"] == id,
        "the agent keeps its ID (gpu/nvidia)",
    )?;
    let mut c = Task::launch(
        &node.install,
        &master,
        "c",
        "cpus:0.1;mem:32;gpus:2",
        &until(&go_c),
    )?;
    c.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let back = task_gpus(&agent)?;
    println!(
        "gpu/nvidia again: {back:?}\n{}",
        mesos_gpu_testkit::mesos::tail(&agent.log(), 40)
    );
    check(
        back["b"] == moved["b"] && back["b"].is_disjoint(&back["c"]) && back["c"].len() == 2,
        format!("b keeps its GPUs and c gets others: {back:?}"),
    )?;
    check(
        back["p"].is_empty(),
        format!("the task without GPUs ran through both moves with none: {back:?}"),
    )?;
    for go in [&go_b, &go_c, &go_p] {
        std::fs::write(go, "")?;
    }
    b.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    c.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    p.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    Ok(())
}

/// The heading of the guide's cgroup v2 procedure, below [`MOVING`].
const MOVING_V2: &str = "On cgroup v2: drain, restart, reactivate";

/// The shell blocks (```` ```sh ````) of the guide's section `section`, each as written.
fn guide_shell_blocks(section: &str) -> TestResult<Vec<String>> {
    let text = std::fs::read_to_string(repo().join("docs/operator-guide.md"))?;
    let mut blocks = Vec::new();
    let mut heading = "";
    // In a fenced block: `Some(text)` for a shell block, `Some(None)` for another language.
    let mut fenced: Option<Option<String>> = None;
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut fenced, fence) {
            (None, true) => fenced = Some((line.trim() == "```sh").then(String::new)),
            (None, false) if line.starts_with('#') => {
                heading = line.trim_start_matches('#').trim();
            }
            (None, false) => {}
            (Some(block), true) => {
                if let Some(block) = block.take().filter(|_| heading == section) {
                    blocks.push(block);
                }
                fenced = None;
            }
            (Some(Some(block)), false) => {
                block.push_str(line);
                block.push('\n');
            }
            (Some(None), false) => {}
        }
    }
    Ok(blocks)
}

/// The guide's cgroup v2 procedure ([`MOVING_V2`]): its three shell blocks, the one that names
/// the agent and the master and defines `api`, the drain (it ends when the agent runs no
/// container), and the reactivation (once the master says `DRAINED`).
struct V2Procedure {
    setup: String,
    drain: String,
    reactivate: String,
}

impl V2Procedure {
    fn from_guide() -> TestResult<V2Procedure> {
        let blocks = guide_shell_blocks(MOVING_V2)?;
        let find = |needle: &str| {
            let found: Vec<&String> = blocks.iter().filter(|b| b.contains(needle)).collect();
            match found.as_slice() {
                [one] => Ok((*one).clone()),
                other => Err(format!(
                    "the guide's {MOVING_V2:?} section has one shell block with {needle}: {other:?}"
                )),
            }
        };
        Ok(V2Procedure {
            setup: find("MASTER_API=")?,
            drain: find("DRAIN_AGENT")?,
            reactivate: find("REACTIVATE_AGENT")?,
        })
    }

    /// Runs the setup block then `block` in one shell, as an operator pastes them, with the
    /// guide's example hosts (`agent1:5051`, `master1:5050`) this test's agent and master;
    /// returns what it printed.
    fn run(&self, block: &str, agent: &Agent, master: &Master) -> TestResult<String> {
        let hosts = [
            ("agent1:5051", format!("127.0.0.1:{}", agent.port())),
            ("master1:5050", master.address()),
        ];
        let mut setup = self.setup.clone();
        for (example, here) in &hosts {
            check(
                setup.contains(example),
                format!("the guide's setup names {example}: {setup}"),
            )?;
            setup = setup.replace(example, here);
        }
        let out = std::process::Command::new("timeout")
            .args(["120", "sh", "-c"])
            .arg(format!("{setup}{block}"))
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            let agents = http_post_json(master.port(), "/api/v1", r#"{"type":"GET_AGENTS"}"#)
                .ok()
                .and_then(|a| serde_json::from_str::<serde_json::Value>(&a).ok())
                .unwrap_or_default();
            let drain: Vec<&serde_json::Value> = agents["get_agents"]["agents"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| &a["drain_info"])
                .collect();
            let master_log: Vec<String> = master
                .log()
                .lines()
                .filter(|l| l.contains("rain") || l.contains("task"))
                .map(str::to_owned)
                .collect();
            return Err(format!(
                "the guide's block failed ({}):\n{block}\nstdout: {stdout}\nstderr: {}\n\
                 the master's drain_info: {drain:?}\nmaster log:\n{}\nagent log:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                mesos_gpu_testkit::mesos::tail(&master_log.join("\n"), 40),
                mesos_gpu_testkit::mesos::tail(&agent.log(), 30)
            )
            .into());
        }
        Ok(stdout)
    }
}

/// A task of `gpus` GPUs (none for 0) that probes every `nvidia*` node of its `/dev` (the
/// private host's), then holds them until `go` exists.
fn probe_task(node: &Node, master: &Master, name: &str, gpus: u32, go: &Path) -> TestResult<Task> {
    let resources = match gpus {
        0 => "cpus:0.1;mem:32".to_owned(),
        n => format!("cpus:0.1;mem:32;gpus:{n}"),
    };
    let command = probe_command(&probe()?, Path::new("/dev"), Hold::Until(go), 0);
    Ok(Task::launch(
        &node.install,
        master,
        name,
        &resources,
        &command,
    )?)
}

/// The GPU minors task `name` could open, from its probe at start (cgroup v2: Mesos's or the
/// module's device program decides, as a process in the task sees it).
fn opened_gpus(agent: &Agent, name: &str) -> TestResult<BTreeSet<u32>> {
    let stdout = agent.wait_stdout(name, "probed", TASK_TIMEOUT)?;
    Ok(TaskProbe::parse(&stdout).gpus().into_iter().collect())
}

/// The guide's cgroup v2 move ([`MOVING_V2`]) on a real agent on cgroup v2, both ways, every
/// command as written: `agent.sh` with `gpu/nvidia` (which, since issue 34, gets
/// `--agent_subsystems=` from `agent-flags`; before, the agent aborted at its first task), tasks
/// with and without GPUs; the drain block kills them (`TASK_KILLED`, reason
/// `REASON_AGENT_DRAINING`) and ends with no container left; `agent.sh` for the module; the
/// reactivation block; new tasks open exactly their GPUs, disjoint; then the same back to
/// `gpu/nvidia`. The agent keeps its ID throughout.
fn moving_between_gpu_nvidia_and_the_module_on_cgroup_v2_drains_and_keeps_the_agent_id()
-> TestResult {
    let node = Node::new("dgx1-v100")?;
    let master = Master::start(&node.install)?;
    let (builtin, module) = moving_commands()?;
    let procedure = V2Procedure::from_guide()?;
    let spec = node.script_spec_on(AgentCgroups::V2, &master, &builtin)?;
    let mut agent = Agent::start(&node.install, &master, spec)?;
    let id = state(&agent)?["id"].clone();
    let go = node.scratch.path().join("go");
    let mut running = vec![
        (
            probe_task(&node, &master, "a", 2, &go.with_extension("a"))?,
            2,
        ),
        (
            probe_task(&node, &master, "p", 0, &go.with_extension("p"))?,
            0,
        ),
    ];
    let check_exact = |agent: &Agent, tasks: &mut [(Task, u32)], isolator: &str| -> TestResult {
        let mut seen = BTreeSet::new();
        for (task, count) in tasks.iter_mut() {
            task.wait_state("TASK_RUNNING", TASK_TIMEOUT).map_err(|e| {
                format!(
                    "{isolator}: {e}\nagent log:\n{}",
                    mesos_gpu_testkit::mesos::tail(&agent.log(), 15)
                )
            })?;
            let gpus = opened_gpus(agent, task.name())?;
            println!("{isolator}: {} opened {gpus:?}", task.name());
            check(
                gpus.len() == *count as usize && gpus.is_disjoint(&seen),
                format!(
                    "{isolator}: task {} (gpus:{count}) opens exactly its own GPUs: {gpus:?}, \
                     others hold {seen:?}",
                    task.name()
                ),
            )?;
            seen.extend(gpus);
        }
        Ok(())
    };
    check_exact(&agent, &mut running, "gpu/nvidia")?;

    for (isolator, command, counts) in [
        ("the module", &module, [("b", 6), ("c", 2)]),
        ("gpu/nvidia", &builtin, [("d", 2), ("e", 6)]),
    ] {
        procedure.run(&procedure.drain, &agent, &master)?;
        let containers = http_get(agent.port(), "/containers")?;
        check(
            containers.trim() == "[]",
            format!("the drained agent runs no container: {containers}"),
        )?;
        for (task, _) in &mut running {
            task.wait_state("TASK_KILLED", TASK_TIMEOUT)?;
            check(
                task.output().contains("reason: REASON_AGENT_DRAINING"),
                format!(
                    "{} was killed by the drain: {}",
                    task.name(),
                    mesos_gpu_testkit::mesos::tail(&task.output(), 8)
                ),
            )?;
        }
        agent.kill()?;
        agent.spec_mut().script = Some(as_run_here(command, &master, &node.agent_flags_opts())?);
        agent
            .restart()
            .map_err(|e| format!("the drained agent starts with {isolator}: {e}"))?;
        if isolator == "the module" {
            agent.wait_log("GPU isolator ready", TASK_TIMEOUT)?;
        }
        check(
            state(&agent)?["id"] == id,
            format!("the agent keeps its ID ({isolator})"),
        )?;
        procedure.run(&procedure.reactivate, &agent, &master)?;
        running = counts
            .into_iter()
            .map(|(name, n)| {
                Ok((
                    probe_task(&node, &master, name, n, &go.with_extension(name))?,
                    n,
                ))
            })
            .collect::<TestResult<_>>()?;
        check_exact(&agent, &mut running, isolator)?;
    }
    for (task, _) in &mut running {
        std::fs::write(go.with_extension(task.name()), "")?;
        task.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    }
    Ok(())
}

/// Why the guide drains on cgroup v2 ([`MOVING_V2`]): the guide's two `agent.sh` commands run in
/// place, without the drain, on a real v2 agent. From `gpu/nvidia` to the module, the module
/// knows none of the running containers and refuses the agent's first `update` of each, so the
/// agent destroys every task (`TASK_GONE`). From the module to `gpu/nvidia`, the module's task
/// keeps running with its GPUs, but `gpu/nvidia` finds no device-manager state for its cgroup
/// (`isolators/gpu/isolator.cpp` 348-356), counts its GPUs as free, and a new task opens some
/// of them too.
fn moving_in_place_on_cgroup_v2_destroys_or_double_books_the_running_tasks() -> TestResult {
    let (builtin, module) = moving_commands()?;

    // gpu/nvidia -> the module, in place.
    let node = Node::new("dgx1-v100")?;
    let master = Master::start(&node.install)?;
    let spec = node.script_spec_on(AgentCgroups::V2, &master, &builtin)?;
    let mut agent = Agent::start(&node.install, &master, spec)?;
    let go = node.scratch.path().join("go");
    let mut tasks = [
        probe_task(&node, &master, "a", 2, &go)?,
        probe_task(&node, &master, "p", 0, &go)?,
    ];
    for task in &mut tasks {
        task.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    }
    agent.kill()?;
    agent.spec_mut().script = Some(as_run_here(&module, &master, &node.agent_flags_opts())?);
    agent.restart()?;
    for task in &mut tasks {
        task.wait_state("TASK_GONE", TASK_TIMEOUT).map_err(|e| {
            format!(
                "in place to the module, the agent destroys {}: {e}\n{}",
                task.name(),
                mesos_gpu_testkit::mesos::tail(&agent.log(), 20)
            )
        })?;
    }
    let log = agent.log();
    check(
        log.contains("MGPU_UNKNOWN_CONTAINER") && log.contains("destroying container"),
        format!(
            "the agent log says why: {}",
            mesos_gpu_testkit::mesos::tail(&log, 20)
        ),
    )?;
    drop(agent);

    // The module -> gpu/nvidia, in place.
    let node = Node::new("dgx1-v100")?;
    let master = Master::start(&node.install)?;
    let spec = node.script_spec_on(AgentCgroups::V2, &master, &module)?;
    let mut agent = Agent::start(&node.install, &master, spec)?;
    let go = node.scratch.path().join("go");
    let mut held = probe_task(&node, &master, "held", 2, &go)?;
    held.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let before = opened_gpus(&agent, "held")?;
    agent.kill()?;
    agent.spec_mut().script = Some(as_run_here(&builtin, &master, &node.agent_flags_opts())?);
    agent.restart()?;
    let mut fresh = probe_task(&node, &master, "fresh", 6, &go)?;
    fresh.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let fresh_gpus = opened_gpus(&agent, "fresh")?;
    println!("module's task: {before:?}, gpu/nvidia's new task: {fresh_gpus:?}");
    check(
        held.is_running()
            && held.task_states("held").last().map(String::as_str) == Some("TASK_RUNNING"),
        format!("the module's task keeps running: {:?}", held.states()),
    )?;
    let log = agent.log();
    check(
        log.contains("in the device manager for container"),
        format!(
            "gpu/nvidia finds no device state for the module's container:\n{}",
            mesos_gpu_testkit::mesos::tail(&log, 20)
        ),
    )?;
    check(
        !before.is_disjoint(&fresh_gpus),
        format!(
            "gpu/nvidia hands the module's task's GPUs {before:?} to a new task: {fresh_gpus:?}"
        ),
    )?;
    std::fs::write(&go, "")?;
    held.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    fresh.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    Ok(())
}
