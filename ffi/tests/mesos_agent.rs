//! Issue 11: the module inside a real `mesos-agent`, end to end.
//!
//! The C++ shim is built with its CMakeLists.txt against the Mesos in `../shared/mesos/install`
//! (strict ISO C++17, the protobuf Mesos was built with, warnings as errors) and loaded with
//! `--modules` into a real agent registered with a real master on 127.0.0.1. nvml-sim (a DGX-1:
//! 8 GPUs, minors 0-7) is the agent's `libnvidia-ml.so.1` through `LD_LIBRARY_PATH`, and the
//! GPUs' and control devices' nodes are mknod'ed in a private directory the module is told about
//! (`dev_root`). Tasks are launched with `mesos-execute --framework_capabilities=GPU_RESOURCES
//! --resources='cpus:0.1;mem:32;gpus:N'`; they run a static probe that opens every node: `ENXIO`
//! means the device cgroup allows it (no driver behind it), `EPERM` that it denies it.
//!
//! cgroup v1 runs on the host's hierarchies; cgroup v2 runs the agent in a private mount
//! namespace with cgroup2 at `/sys/fs/cgroup`, where Mesos looks for it (see
//! `mesos_gpu_testkit::mesos`). Needs root, cgroups, `cc`, cmake and the Mesos install.

mod agents;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use agents::docker::{
    DockerTools, Images, PrivateDockerd, STALL, Wrapper, docker_reservations, launch_docker_task,
    one_docker_agent,
};
use agents::{mesos_gpu_exe, module, probe, shell_words};
use libtest_mimic::{Arguments, Trial};
use mesos_gpu::proto::mesos::ContainerId;
use mesos_gpu::{MgpuStatus, proto::mesos::Parameter};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_testkit::mesos::{
    Agent, AgentCgroups, AgentSpec, DevNodes, ISOLATOR_MODULE, Master, MesosInstall, ProbeReport,
    Task, http_get, http_post_json, modules_json, wait_for,
};
use mesos_gpu_testkit::mps::MpsControl;
use mesos_gpu_testkit::nvml_sim::{SimNode, mknod_mig_caps};
use mesos_gpu_testkit::{Host, Need, needs};
use support::{Handle, TestResult, cdylib, check, config, mesos_gpu_bin, trial};

/// The module's name in modules.json and `--isolation`.
const MODULE: &str = ISOLATOR_MODULE;
/// The simulated node: 8 GPUs, minors 0 to 7.
const NODE: &str = "dgx1-v100";
const MINORS: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
/// Control devices every GPU task may open.
const CONTROL: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];
const TASK_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let host = Host::probe();
    let v1: &[Need] = &[Need::Root, Need::Cgroup1, Need::Cc, Need::Mesos];
    let v2: &[Need] = &[Need::Root, Need::Cgroup2, Need::Cc, Need::Mesos];
    let build: &[Need] = &[Need::Cc, Need::Mesos];
    let docker: &[Need] = &[
        Need::Root,
        Need::Cgroup1,
        Need::Cc,
        Need::Mesos,
        Need::Dockerd,
    ];
    let docker_v2: &[Need] = &[
        Need::Root,
        Need::Cgroup2,
        Need::Cc,
        Need::Mesos,
        Need::Dockerd,
    ];
    type Test = fn() -> TestResult;
    let tests: [(&str, &[Need], Test); 36] = [
        ("module_builds_strict_iso", build, module_builds_strict_iso),
        (
            "v1_gpus_on_mesos_devices_cgroup",
            v1,
            v1_gpus_on_mesos_devices_cgroup,
        ),
        (
            "v1_concurrent_tasks_get_disjoint_gpus",
            v1,
            v1_concurrent_tasks_get_disjoint_gpus,
        ),
        (
            "v1_more_gpus_than_free_stay_pending",
            v1,
            v1_more_gpus_than_free_stay_pending,
        ),
        ("v1_agent_sigkill_recovery", v1, || {
            agent_sigkill_recovery(AgentCgroups::V1)
        }),
        (
            "v1_prepare_waits_for_gpus_mesos_counts_free",
            v1,
            v1_prepare_waits_for_gpus,
        ),
        (
            "v1_own_devices_cgroup_without_cgroups_devices",
            v1,
            v1_own_devices_cgroup,
        ),
        (
            "v1_unsupported_configurations_refused_at_start",
            v1,
            v1_unsupported_refused,
        ),
        ("v1_nested_task_group", v1, || {
            nested_task_group(AgentCgroups::V1)
        }),
        (
            "v1_agent_serves_the_module_metrics",
            v1,
            v1_agent_serves_the_module_metrics,
        ),
        (
            "v1_gpu_agents_are_shared_as_the_guide_says",
            v1,
            v1_gpu_agents_are_shared_as_the_guide_says,
        ),
        (
            "v1_exec_beside_the_agent_gets_other_gpus",
            v1,
            v1_exec_beside_the_agent,
        ),
        (
            "v1_docker_task_gets_exactly_its_gpus",
            docker,
            v1_docker_task_gets_exactly_its_gpus,
        ),
        (
            "v1_docker_and_mesos_tasks_one_pool",
            docker,
            v1_docker_and_mesos_tasks_one_pool,
        ),
        (
            "v1_docker_task_the_pool_cannot_serve_fails_saying_why",
            docker,
            v1_docker_task_the_pool_cannot_serve_fails_saying_why,
        ),
        (
            "v1_docker_agent_sigkill_keeps_gpus",
            docker,
            v1_docker_agent_sigkill_keeps_gpus,
        ),
        (
            "v1_docker_launch_failure_gives_gpus_back",
            docker,
            v1_docker_launch_failure_gives_gpus_back,
        ),
        (
            "v1_docker_container_dies_gives_gpus_back",
            docker,
            v1_docker_container_dies_gives_gpus_back,
        ),
        (
            "v1_docker_agent_sigkill_before_docker_run_frees_gpus",
            docker,
            v1_docker_agent_sigkill_before_docker_run_frees_gpus,
        ),
        (
            "v1_docker_image_needing_newer_cuda_fails_saying_so",
            docker,
            v1_docker_image_needing_newer_cuda_fails_saying_so,
        ),
        ("v1_docker_daemon_restart", docker, v1_docker_daemon_restart),
        (
            "v1_metrics_label_each_gpu_with_its_task_and_drop_them_after",
            docker,
            v1_metrics_label_each_gpu_with_its_task_and_drop_them_after,
        ),
        (
            "v1_gpu_comes_back_on_evidence_nobody_marks_it",
            v1,
            v1_gpu_comes_back_on_evidence_nobody_marks_it,
        ),
        (
            "v1_exclusive_time_sliced_and_mps_gpus_side_by_side",
            v1,
            v1_exclusive_time_sliced_and_mps_gpus_side_by_side,
        ),
        ("v1_shared_gpus", v1, || shared_gpus(false)),
        ("v1_shared_gpus_mps", v1, || shared_gpus(true)),
        ("v1_mig_tasks", v1, || mig_tasks(AgentCgroups::V1)),
        (
            "v1_two_tasks_share_one_mig_device_under_mps",
            v1,
            v1_two_tasks_share_one_mig_device_under_mps,
        ),
        ("v2_mig_tasks", v2, || mig_tasks(AgentCgroups::V2)),
        (
            "v1_docker_task_gets_its_mig_device",
            docker,
            v1_docker_task_gets_its_mig_device,
        ),
        (
            "v1_docker_containerizer_cannot_offer_shares",
            docker,
            v1_docker_containerizer_cannot_offer_shares,
        ),
        (
            "v2_docker_containerizer_refused_by_mesos",
            docker_v2,
            v2_docker_containerizer_refused_by_mesos,
        ),
        (
            "v2_program_on_mesos_container_cgroup",
            v2,
            v2_program_on_mesos_cgroup,
        ),
        ("v2_agent_sigkill_recovery", v2, || {
            agent_sigkill_recovery(AgentCgroups::V2)
        }),
        ("v2_cgroups_devices_refused", v2, v2_cgroups_devices_refused),
        ("v2_nested_task_group", v2, || {
            nested_task_group(AgentCgroups::V2)
        }),
    ];
    let mut trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, need, f)| needs(&host, need, trial(name, f)))
        .collect();
    trials.extend(numa_trials(&host));
    trials.push(needs(
        &host,
        docker,
        trial(
            "v1_docker_tasks_get_disjoint_gpus_through_the_shipped_wrapper",
            v1_docker_tasks_get_disjoint_gpus_through_the_shipped_wrapper,
        ),
    ));
    trials.push(needs(
        &host,
        v1,
        trial("v1_agent_serves_each_containers_gpu_usage", || {
            agent_serves_each_containers_gpu_usage(
                AgentCgroups::V1,
                &format!("filesystem/linux,cgroups/devices,{MODULE}"),
            )
        }),
    ));
    trials.push(needs(
        &host,
        v2,
        trial("v2_agent_serves_each_containers_gpu_usage", || {
            agent_serves_each_containers_gpu_usage(
                AgentCgroups::V2,
                &format!("filesystem/linux,{MODULE}"),
            )
        }),
    ));
    trials.push(needs(
        &host,
        &[
            Need::Root,
            Need::Cgroup1,
            Need::Cc,
            Need::Mesos,
            Need::Pynvml,
        ],
        trial(
            "gpu_check_script_passes_on_a_simulated_node",
            gpu_check_script,
        ),
    ));
    trials.extend(agent_flags_trials(&host));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// The Mesos install.
fn install() -> TestResult<MesosInstall> {
    Ok(MesosInstall::locate()?)
}

/// The module builds with its CMakeLists.txt, in strict ISO C++17 with Mesos's defines, against
/// the protobuf Mesos was built with, warnings as errors, every override marked.
fn module_builds_strict_iso() -> TestResult {
    let module = module()?;
    let commands = module.with_file_name("compile_commands.json");
    let text = std::fs::read_to_string(&commands)?;
    for want in [
        "-std=c++17",
        "-DPICOJSON_USE_INT64",
        "-D__STDC_FORMAT_MACROS",
        "-Wsuggest-override",
        "-Werror",
    ] {
        check(
            text.contains(want),
            format!("{want} missing from {}: {text}", commands.display()),
        )?;
    }
    check(!text.contains("gnu++"), format!("GNU extensions in {text}"))?;
    Ok(())
}

/// A master, an agent loading the module on a simulated node, and what the tasks need.
struct Cluster {
    install: MesosInstall,
    sim: SimNode,
    dev: DevNodes,
    scratch: tempfile::TempDir,
    master: Master,
    agent: Agent,
}

/// How the module is set up in modules.json.
struct ModuleSetup<'a> {
    /// Give `cgroups_root` explicitly, equal to the agent's (else the module takes the agent's).
    explicit_root: bool,
    /// More parameters.
    extra: &'a [(&'a str, &'a str)],
    /// The shipped nvml-sim node (default [`NODE`]); one with MIG devices gets their
    /// capability nodes made and the module its `/proc` files (`proc_root`).
    node: Option<&'a str>,
    /// More arguments for the Docker hook's `docker-args` command line.
    docker_args: &'a [&'a str],
    /// The module loads the simulated NVML through its `nvml_lib` parameter.
    nvml_lib: bool,
    /// The agent's `--docker` is `examples/mesos-agent/mesos-gpu-docker` with this test's paths:
    /// no `--nvml-lib`, no `--dev-root`, as shipped.
    shipped_wrapper: bool,
}

const EXPLICIT_ROOT: ModuleSetup<'static> = ModuleSetup {
    explicit_root: true,
    extra: &[],
    node: None,
    docker_args: &[],
    nvml_lib: false,
    shipped_wrapper: false,
};

impl Cluster {
    /// [`Cluster::start`] with the agent's `--resources` set to `resources`.
    fn start_offering(
        cgroups: AgentCgroups,
        isolation: &str,
        setup: &ModuleSetup<'_>,
        resources: &str,
    ) -> TestResult<Cluster> {
        Cluster::start_with(cgroups, isolation, setup, Some(resources))
    }

    fn start(
        cgroups: AgentCgroups,
        isolation: &str,
        setup: &ModuleSetup<'_>,
    ) -> TestResult<Cluster> {
        Cluster::start_with(cgroups, isolation, setup, None)
    }

    /// A master and an agent; `resources`, when given, replaces the agent's `--resources`.
    fn start_with(
        cgroups: AgentCgroups,
        isolation: &str,
        setup: &ModuleSetup<'_>,
        resources: Option<&str>,
    ) -> TestResult<Cluster> {
        let ((install, sim, dev, scratch, master), mut spec) =
            Cluster::prepare(cgroups, isolation, setup)?;
        if let Some(resources) = resources {
            spec.resources = resources.to_owned();
        }
        let agent = Agent::start(&install, &master, spec)?;
        Ok(Cluster {
            install,
            sim,
            dev,
            scratch,
            master,
            agent,
        })
    }

    #[allow(clippy::type_complexity)]
    fn prepare(
        cgroups: AgentCgroups,
        isolation: &str,
        setup: &ModuleSetup<'_>,
    ) -> TestResult<(
        (MesosInstall, SimNode, DevNodes, tempfile::TempDir, Master),
        AgentSpec,
    )> {
        let install = install()?;
        let module = module()?;
        let (sim, _, dev) = sim_with_nodes(setup.node.unwrap_or(NODE))?;
        let scratch = tempfile::Builder::new()
            .prefix("mgpu-mesos-e2e")
            .tempdir()?;
        let master = Master::start(&install)?;
        let mut spec = AgentSpec::new(isolation, cgroups, 8);
        let module_work = scratch.path().join("module-work");
        let mut params: Vec<(String, String)> = vec![
            ("work_dir".into(), module_work.display().to_string()),
            (
                "pool_dir".into(),
                scratch.path().join("pool").display().to_string(),
            ),
            ("dev_root".into(), dev.path().display().to_string()),
            ("driver_volume".into(), "off".into()),
            ("policy".into(), "first-fit".into()),
        ];
        if setup.explicit_root {
            params.push(("cgroups_root".into(), spec.cgroups_root.clone()));
        }
        if setup.node.is_some() {
            params.push(("proc_root".into(), sim.proc_root().display().to_string()));
        }
        if setup.nvml_lib {
            params.push(("nvml_lib".into(), sim.lib_path().display().to_string()));
        }
        params.extend(
            setup
                .extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let modules = scratch.path().join("modules.json");
        std::fs::write(&modules, modules_json(&module, &params).to_string())?;
        spec.modules = Some(modules);
        spec.env
            .push(("LD_LIBRARY_PATH".into(), sim.dir().display().to_string()));
        Ok(((install, sim, dev, scratch, master), spec))
    }

    /// Launches task `name` asking for `gpus` GPUs running the probe; with `wait`, the probe
    /// waits for the file `<scratch>/<name>.go` before probing again and exiting.
    fn launch(&self, name: &str, gpus: u32, wait: bool) -> TestResult<Task> {
        self.launch_env(name, gpus, wait, &[])
    }

    fn go_file(&self, name: &str) -> PathBuf {
        self.scratch.path().join(format!("{name}.go"))
    }

    /// Launches task `name` as [`Cluster::launch`] with `env` in its environment.
    fn launch_env(
        &self,
        name: &str,
        gpus: u32,
        wait: bool,
        env: &[(&str, &str)],
    ) -> TestResult<Task> {
        let probe = probe()?;
        let mut command = format!("{} {}", probe.display(), self.dev.path().display());
        if wait {
            command.push_str(&format!(" {}", self.go_file(name).display()));
        }
        let mut framework = vec![
            "--framework_capabilities=GPU_RESOURCES".to_owned(),
            "--checkpoint".to_owned(),
        ];
        if !env.is_empty() {
            let env: serde_json::Map<String, serde_json::Value> = env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
                .collect();
            framework.push(format!("--env={}", serde_json::Value::Object(env)));
        }
        let framework: Vec<&str> = framework.iter().map(String::as_str).collect();
        Ok(Task::launch_with(
            &self.install,
            &self.master,
            name,
            &format!("cpus:0.1;mem:32;gpus:{gpus}"),
            &command,
            &framework,
        )?)
    }

    /// Lets a waiting probe finish.
    fn release(&self, name: &str) -> TestResult {
        Ok(std::fs::write(self.go_file(name), b"")?)
    }

    /// The probe report of task `name`, once its first probe printed.
    fn report(&self, name: &str) -> TestResult<ProbeReport> {
        let text = self
            .agent
            .wait_stdout(name, "env CUDA_VISIBLE_DEVICES", TASK_TIMEOUT)?;
        Ok(ProbeReport::parse(&text))
    }

    /// The report once the second probe printed too.
    fn final_report(&self, name: &str) -> TestResult<ProbeReport> {
        self.agent
            .wait_stdout(name, "after nvidiactl", TASK_TIMEOUT)?;
        self.report(name)
    }

    /// The UUIDs of the GPUs with `minors`, from the node description, in minor order.
    fn uuids(&self, minors: &[u32]) -> TestResult<Vec<String>> {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.sim.config_path())?)?;
        let mut found = Vec::new();
        for gpu in json["gpus"]
            .as_array()
            .ok_or("no gpus in the description")?
        {
            let minor = u32::try_from(gpu["minor"].as_u64().ok_or("no minor")?)?;
            if minors.contains(&minor) {
                found.push((minor, gpu["uuid"].as_str().ok_or("no uuid")?.to_owned()));
            }
        }
        found.sort();
        Ok(found.into_iter().map(|(_, u)| u).collect())
    }

    /// The module's checkpoint.
    fn checkpoint(&self) -> TestResult<serde_json::Value> {
        let path = self.scratch.path().join("module-work/gpu/allocations.json");
        Ok(serde_json::from_str(&std::fs::read_to_string(&path)?)?)
    }

    /// Waits until the module's checkpoint holds no container and no quarantined GPU.
    fn wait_all_released(&self) -> TestResult {
        wait_for(
            TASK_TIMEOUT,
            || {
                format!(
                    "every GPU released; checkpoint: {:?}",
                    self.checkpoint().ok()
                )
            },
            || {
                let c = self.checkpoint().ok()?;
                let empty = |k: &str| c[k].as_object().is_none_or(serde_json::Map::is_empty);
                (empty("containers") && empty("quarantine")).then_some(())
            },
        )?;
        Ok(())
    }
}

/// The shipped nvml-sim node `name`, what it reports (discovered as the module does), and its
/// device nodes mknod'ed in a private directory: GPUs, control devices and MIG capability nodes.
fn sim_with_nodes(name: &str) -> TestResult<(SimNode, Inventory, DevNodes)> {
    let sim = SimNode::shipped(name);
    let inventory = sim.inventory()?;
    let minors: Vec<u32> = inventory.gpus.iter().map(|g| g.minor).collect();
    let dev = DevNodes::nvidia(&minors)?;
    mknod_mig_caps(dev.path(), &inventory)?;
    Ok((sim, inventory, dev))
}

/// Checks that `report` opened exactly the GPUs `minors` (and the control devices when there
/// are any), and no other.
fn expect_exactly(report: &ProbeReport, minors: &[u32], after: bool) -> TestResult {
    let map = if after { &report.after } else { &report.before };
    let mut wrong = Vec::new();
    for m in MINORS {
        let want = if minors.contains(&m) {
            "ENXIO"
        } else {
            "EPERM"
        };
        let got = map
            .get(&format!("nvidia{m}"))
            .map_or("missing", String::as_str);
        if got != want {
            wrong.push(format!("nvidia{m}: {got}, expected {want}"));
        }
    }
    let control = if minors.is_empty() { "EPERM" } else { "ENXIO" };
    for node in CONTROL {
        let got = map.get(node).map_or("missing", String::as_str);
        if got != control {
            wrong.push(format!("{node}: {got}, expected {control}"));
        }
    }
    check(
        wrong.is_empty(),
        format!("{}: {report:?}", wrong.join("; ")),
    )
}

/// The GPU minors a probe opened, as a set.
fn opened(report: &ProbeReport, after: bool) -> BTreeSet<u32> {
    report.gpus(after).into_iter().collect()
}

/// v1 with `cgroups/devices`, the module's `cgroups_root` equal to the agent's (what failed
/// before: "container … already has a cgroup"): a `gpus:2` task opens exactly two GPUs and the
/// control devices, with their UUIDs in its environment, inside Mesos's devices cgroup; a
/// `gpus:0` task opens none and gets no GPU variable; every GPU is released afterwards.
fn v1_gpus_on_mesos_devices_cgroup() -> TestResult {
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &EXPLICIT_ROOT,
    )?;
    let mut two = c.launch("two", 2, false)?;
    two.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let report = c.report("two")?;
    let minors = report.gpus(false);
    check(minors.len() == 2, format!("two GPUs expected: {report:?}"))?;
    expect_exactly(&report, &minors, false)?;
    let uuids = c.uuids(&minors)?.join(",");
    check(
        report.env.get("NVIDIA_VISIBLE_DEVICES") == Some(&uuids)
            && report.env.get("CUDA_VISIBLE_DEVICES") == Some(&uuids),
        format!("expected {uuids} in {:?}", report.env),
    )?;
    let root = &c.agent.spec().cgroups_root;
    check(
        report
            .cgroups
            .iter()
            .any(|l| l.contains(&format!(":devices:/{root}/"))),
        format!(
            "the task must run in Mesos's devices cgroup under {root}: {:?}",
            report.cgroups
        ),
    )?;
    check(
        c.agent.log().contains("joined Mesos's container cgroup"),
        "the module did not join Mesos's cgroup",
    )?;

    let mut zero = c.launch("zero", 0, false)?;
    zero.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let report = c.report("zero")?;
    expect_exactly(&report, &[], false)?;
    for var in ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"] {
        check(
            report.env.get(var).map(String::as_str) == Some("(unset)"),
            format!("{var} must be unset for gpus:0: {:?}", report.env),
        )?;
    }
    c.wait_all_released()
}

/// Issue 17: a real agent whose module shares GPUs 0 and 1 four ways and keeps 2-7 whole
/// (`gpu_replicas=4,2=1,…,7=1`, offered as `gpus:14`). Four tasks at once: `gpus:1` and `gpus:2`
/// pack onto one shared GPU, `gpus:4` takes all of the other, `gpus:5` five whole GPUs; each opens exactly
/// its GPUs and is told its share; the pool records the shares while they run and none after.
/// With `mps`, the module starts one MPS daemon per shared GPU (nvml-sim's stand-in, run by
/// the agent's module itself) and each share owner gets its k/4 limits; after an agent
/// SIGKILL and restart the tasks keep their shares and the daemons are adopted; when the daemon
/// of the 1- and 2-unit shares' GPU is killed, the module starts it again and those two owners
/// fail saying why.
fn shared_gpus(mps: bool) -> TestResult {
    let control = MpsControl::install("{}");
    let program = control.program().display().to_string();
    let scratch_mps = tempfile::Builder::new().prefix("mgpu-mps").tempdir()?;
    let mps_root = scratch_mps.path().display().to_string();
    let mut extra = vec![("gpu_replicas", "4,2=1,3=1,4=1,5=1,6=1,7=1")];
    if mps {
        extra.extend([
            ("gpu_sharing", "mps"),
            ("mps_control", program.as_str()),
            ("mps_root", mps_root.as_str()),
        ]);
    }
    let setup = ModuleSetup {
        explicit_root: true,
        extra: &extra,
        ..EXPLICIT_ROOT
    };
    let isolation = format!("filesystem/linux,cgroups/devices,{MODULE}");
    let mut c = Cluster::start_offering(
        AgentCgroups::V1,
        &isolation,
        &setup,
        "cpus:4;mem:4096;gpus:14",
    )?;
    // (task, gpus, share, MPS thread percentage, MPS memory limit of a 16 GiB V100)
    let asks = [
        ("one", 1, "1/4", "25", "0=4040M"),
        ("two", 2, "2/4", "50", "0=8080M"),
        ("four", 4, "4/4", "100", "0=16160M"),
        ("five", 5, "(unset)", "(unset)", "(unset)"),
    ];
    let mut tasks = Vec::new();
    for (name, gpus, ..) in asks {
        tasks.push(c.launch(name, gpus, true)?);
    }
    let mut held = BTreeMap::new();
    for (name, _, share, threads, memory) in asks {
        let text = c
            .agent
            .wait_stdout(name, "env CUDA_VISIBLE_DEVICES", TASK_TIMEOUT)?;
        println!("task {name} printed:\n{}", text.trim_end());
        let report = ProbeReport::parse(&text);
        let minors = report.gpus(false);
        expect_exactly(&report, &minors, false)?;
        let var = |k: &str| report.env.get(k).map_or("missing", String::as_str);
        let (threads, memory) = if mps {
            (threads, memory)
        } else {
            ("(unset)", "(unset)")
        };
        check(
            var("MESOS_GPU_SHARE") == share
                && var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == threads
                && var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == memory,
            format!(
                "task {name}: {:?}, expected share {share}, {threads} %, {memory}",
                report.env
            ),
        )?;
        held.insert(name, minors);
    }
    // Mesos prepares concurrent tasks in any order; packing always puts the 1- and 2-unit
    // shares on one shared GPU and the 4-unit share alone on the other.
    let pair = held["one"].first().copied().unwrap_or(u32::MAX);
    check(
        pair < 2
            && held["one"] == [pair]
            && held["two"] == [pair]
            && held["four"] == [1 - pair]
            && held["five"].len() == 5
            && held["five"].iter().all(|&m| m >= 2),
        format!("placement: {held:?}"),
    )?;
    let pool_path = c.scratch.path().join("pool/gpu/pool.json");
    let pool: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&pool_path)?)?;
    let mut units: Vec<u64> = pool["shares"]
        .as_object()
        .map(|m| {
            m.values()
                .filter_map(|s| s["grant"]["units"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    units.sort_unstable();
    check(units == [1, 2, 4], format!("the pool's shares: {pool}"))?;
    let starts = |control: &MpsControl| -> Vec<String> {
        control
            .records()
            .iter()
            .filter(|r| r["event"] == "start")
            .map(|r| {
                r["env"]["CUDA_VISIBLE_DEVICES"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    let daemons = |path: &Path| -> TestResult<BTreeMap<String, u64>> {
        let pool: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        Ok(pool["mps"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(gpu, d)| {
                        Some((gpu.clone(), d["daemon"]["process"]["pid"].as_u64()?))
                    })
                    .collect()
            })
            .unwrap_or_default())
    };
    // The daemons outlive the agent: stop them whatever happens below.
    let stop_daemons = || {
        for pid in daemons(&pool_path).unwrap_or_default().values() {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
    };
    let result = (|| -> TestResult {
        let want: Vec<String> = if mps { c.uuids(&[0, 1])? } else { Vec::new() };
        let mut started = starts(&control);
        started.sort();
        let recorded = daemons(&pool_path)?;
        check(
            started == want && recorded.keys().cloned().collect::<Vec<_>>() == want,
            format!(
                "MPS daemons started for {started:?}, recorded {recorded:?}; expected {want:?}"
            ),
        )?;
        if !mps {
            return Ok(());
        }
        // Agent SIGKILL and restart: the tasks run on, the module recovers their shares and
        // adopts the running daemons (no new start).
        c.agent.kill()?;
        c.agent.restart()?;
        c.agent.wait_log("recovered GPU", TASK_TIMEOUT)?;
        let after: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&pool_path)?)?;
        check(
            after["shares"].as_object().map(serde_json::Map::len) == Some(3)
                && starts(&control).len() == 2,
            format!(
                "after the agent's restart: {after}, starts {:?}",
                starts(&control)
            ),
        )?;
        // GPU 0's daemon dies: the module's supervisor starts it again and the owners of its
        // shares fail saying why; GPU 1's owner runs on.
        // The daemon of the GPU the 1- and 2-unit shares are on.
        let gpu0 = c.uuids(&[pair])?.concat();
        let old = *recorded.get(&gpu0).ok_or(format!("no daemon for {gpu0}"))?;
        std::process::Command::new("kill")
            .args(["-KILL", &old.to_string()])
            .status()?;
        for i in [0, 1] {
            tasks[i].wait_state("TASK_FAILED", TASK_TIMEOUT)?;
            let out = tasks[i].output();
            println!(
                "mesos-execute for {} printed:\n{}",
                asks[i].0,
                mesos_gpu_testkit::mesos::tail(&out, 4)
            );
            check(
                out.contains(&format!("MPS control daemon of GPU {pair}")) && out.contains("died"),
                format!("task {} was not told why: {out}", asks[i].0),
            )?;
        }
        check(
            starts(&control).iter().filter(|g| **g == gpu0).count() == 2
                && daemons(&pool_path)?.get(&gpu0).is_some_and(|&p| p != old),
            format!("GPU {pair}'s daemon restarted: {:?}", starts(&control)),
        )?;
        check(
            !tasks[2].states().iter().any(|s| s == "TASK_FAILED"),
            "the other shared GPU's owner runs on",
        )
    })();
    stop_daemons();
    result?;
    let running: &[usize] = if mps { &[2, 3] } else { &[0, 1, 2, 3] };
    for &i in running {
        c.release(asks[i].0)?;
        tasks[i].wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    }
    c.wait_all_released()?;
    let pool = std::fs::read_to_string(&pool_path)?;
    check(!pool.contains("\"shares\""), format!("shares left: {pool}"))
}

/// nvml-sim's node with whole GPUs (0-3) and GPUs in MIG mode (4-7, 3g+2g+1g+1g each).
const MIG_NODE: &str = "dgx-a100-mixed";

/// Issue 16, on cgroups v1 and v2: a real agent on nvml-sim's `dgx-a100-mixed` (GPUs 0-3 whole, 4-7 split), the
/// module with `mig_strategy=mixed`, offering what `agent-flags --mig-strategy mixed` prints. A
/// `mig-1g.5gb:1` task without CAP_SYS_ADMIN (`linux/capabilities`, effective capabilities set)
/// opens its parent GPU and its two capability nodes (ENXIO) and gets EPERM on every other GPU
/// and capability node, with `NVIDIA_VISIBLE_DEVICES=MIG-…`; a task asking for two MIG devices,
/// and a root task with the agent's capabilities, fail saying why; a `gpus:2` task gets two
/// whole GPUs; everything is given back.
fn mig_tasks(cgroups: AgentCgroups) -> TestResult {
    use mesos_gpu_isolator::{agent_flags::MigOffer, agent_flags::MigStrategy};
    let install = install()?;
    let module = module()?;
    let (sim, inventory, dev) = sim_with_nodes(MIG_NODE)?;
    let minors: Vec<u32> = inventory.gpus.iter().map(|g| g.minor).collect();
    let scratch = tempfile::Builder::new()
        .prefix("mgpu-mesos-mig")
        .tempdir()?;
    let master = Master::start(&install)?;
    // On v2 the module attaches its device program to Mesos's container cgroup (no
    // `cgroups/devices` there).
    let isolation = match cgroups {
        AgentCgroups::V1 => format!("filesystem/linux,linux/capabilities,cgroups/devices,{MODULE}"),
        AgentCgroups::V2 => format!("filesystem/linux,linux/capabilities,{MODULE}"),
    };
    let mut spec = AgentSpec::new(&isolation, cgroups, 0);
    let offer = MigOffer::of(&inventory, MigStrategy::Mixed);
    spec.resources = format!("cpus:4;mem:4096;{}", offer.resources().join(";"));
    let params: Vec<(String, String)> = vec![
        (
            "work_dir".into(),
            scratch.path().join("module-work").display().to_string(),
        ),
        (
            "pool_dir".into(),
            scratch.path().join("pool").display().to_string(),
        ),
        ("dev_root".into(), dev.path().display().to_string()),
        ("proc_root".into(), sim.proc_root().display().to_string()),
        ("driver_volume".into(), "off".into()),
        ("cgroups_root".into(), spec.cgroups_root.clone()),
        ("mig_strategy".into(), "mixed".into()),
    ];
    let modules = scratch.path().join("modules.json");
    std::fs::write(&modules, modules_json(&module, &params).to_string())?;
    spec.modules = Some(modules);
    spec.env
        .push(("LD_LIBRARY_PATH".into(), sim.dir().display().to_string()));
    let agent = Agent::start(&install, &master, spec)?;
    let probe = probe()?;
    let command = format!(
        "{0} {1}; {0} {1}/nvidia-caps",
        probe.display(),
        dev.path().display()
    );
    // Without CAP_SYS_ADMIN (which grants every MIG capability whatever the device files).
    let no_admin: &[&str] = &[
        "--framework_capabilities=GPU_RESOURCES",
        r#"--effective_capabilities={"capabilities":["CHOWN","DAC_OVERRIDE"]}"#,
    ];
    let mut one = Task::launch_with(
        &install,
        &master,
        "mig-one",
        "cpus:0.1;mem:32;mig-1g.5gb:1",
        &command,
        no_admin,
    )?;
    one.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let out = agent.wait_stdout("mig-one", "nvidia-cap", TASK_TIMEOUT)?;
    println!("mig-one printed:\n{}", out.trim_end());
    let opened: Vec<&str> = out
        .lines()
        .filter(|l| l.ends_with(" ENXIO"))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let gpus: Vec<&&str> = opened
        .iter()
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|m| m.parse::<u32>().is_ok())
        })
        .collect();
    let caps: Vec<&&str> = opened
        .iter()
        .filter(|n| n.starts_with("nvidia-cap"))
        .collect();
    let visible = out
        .lines()
        .find_map(|l| l.strip_prefix("env NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_default();
    let device = inventory
        .mig
        .by_uuid(visible)
        .ok_or(format!("not a MIG device: {visible:?}"))?;
    let dcaps = device.caps.as_ref().ok_or("no caps")?;
    let want_caps = [
        format!("nvidia-cap{}", dcaps.gpu_instance.minor),
        format!("nvidia-cap{}", dcaps.compute_instance.minor),
    ];
    check(
        gpus == [&format!("nvidia{}", device.parent_minor).as_str()]
            && caps.len() == 2
            && caps.iter().all(|c| want_caps.iter().any(|w| w == **c))
            && opened.contains(&"nvidiactl")
            && device.profile == Some(19),
        format!("mig-one opened {opened:?} holding {visible}: {out}"),
    )?;
    check(
        out.lines().filter(|l| l.ends_with(" EPERM")).count()
            == minors.len() - 1 + 2 * inventory.mig.devices.len() - 2,
        format!("every other GPU and capability node must be EPERM: {out}"),
    )?;
    let mut two = Task::launch_with(
        &install,
        &master,
        "mig-two",
        "cpus:0.1;mem:32;mig-1g.5gb:2",
        &command,
        no_admin,
    )?;
    two.wait_state("TASK_FAILED", TASK_TIMEOUT)?;
    let failed = two.output();
    println!("mig-two: {}", mesos_gpu_testkit::mesos::tail(&failed, 4));
    check(
        failed.contains("CUDA uses only one MIG device per process"),
        format!("the refusal does not say why: {failed}"),
    )?;
    // A root task with the agent's capabilities (CAP_SYS_ADMIN among them) gets no MIG device.
    let mut root = Task::launch(
        &install,
        &master,
        "mig-root",
        "cpus:0.1;mem:32;mig-1g.5gb:1",
        &command,
    )?;
    root.wait_state("TASK_FAILED", TASK_TIMEOUT)?;
    let refused = root.output();
    println!("mig-root: {}", mesos_gpu_testkit::mesos::tail(&refused, 4));
    check(
        refused.contains("would run with CAP_SYS_ADMIN"),
        format!("the CAP_SYS_ADMIN refusal does not say why: {refused}"),
    )?;
    let mut whole = Task::launch(
        &install,
        &master,
        "whole-two",
        "cpus:0.1;mem:32;gpus:2",
        &command,
    )?;
    whole.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let out = agent.wait_stdout("whole-two", "nvidia-cap", TASK_TIMEOUT)?;
    let whole_gpus: Vec<u32> = out
        .lines()
        .filter(|l| l.ends_with(" ENXIO"))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(1)?
                .strip_prefix("nvidia")?
                .parse()
                .ok()
        })
        .collect();
    check(
        whole_gpus.len() == 2 && whole_gpus.iter().all(|&m| !inventory.mig.is_enabled(m)),
        format!("whole-two opened {whole_gpus:?}: {out}"),
    )?;
    wait_for(
        TASK_TIMEOUT,
        || "the module's checkpoint to be empty".to_owned(),
        || {
            let text =
                std::fs::read_to_string(scratch.path().join("module-work/gpu/allocations.json"))
                    .ok()?;
            let c: serde_json::Value = serde_json::from_str(&text).ok()?;
            c["containers"]
                .as_object()
                .is_some_and(serde_json::Map::is_empty)
                .then_some(())
        },
    )?;
    Ok(())
}

/// Issue 28: MIG devices shared under MPS in a real agent. nvml-sim's `dgx-a100-mixed` (GPUs
/// 0-3 whole, 4-7 split 3g+2g+1g+1g), the module with `mig_strategy=mixed`,
/// `gpu_sharing=mps,0-3=none` and `gpu_replicas=2`, offering each MIG device twice in its
/// profile's scalar. Two `mig-1g.5gb:1` tasks running at once share one 1g device: each opens
/// its parent GPU and its two capability nodes (ENXIO) and no other GPU or capability node
/// (EPERM), with `NVIDIA_VISIBLE_DEVICES`/`CUDA_VISIBLE_DEVICES` its MIG UUID, `1/2` of it and
/// the pipe directory of the device's daemon; one MPS daemon runs, started with
/// `CUDA_VISIBLE_DEVICES=<MIG UUID>`, and it quits once both tasks ended.
fn v1_two_tasks_share_one_mig_device_under_mps() -> TestResult {
    use mesos_gpu_isolator::agent_flags::{MigOffer, MigStrategy};
    let control = MpsControl::install("{}");
    let program = control.program().display().to_string();
    let scratch_mps = tempfile::Builder::new().prefix("mgpu-mps").tempdir()?;
    let mps_root = scratch_mps.path().display().to_string();
    let extra = [
        ("mig_strategy", "mixed"),
        ("gpu_replicas", "2"),
        ("gpu_sharing", "mps,0-3=none"),
        ("mps_control", program.as_str()),
        ("mps_root", mps_root.as_str()),
    ];
    let setup = ModuleSetup {
        extra: &extra,
        node: Some(MIG_NODE),
        ..EXPLICIT_ROOT
    };
    let (_, inventory, _) = sim_with_nodes(MIG_NODE)?;
    // What `agent-flags --mig-strategy mixed --gpu-replicas 2 --gpu-sharing mps,0-3=none`
    // advertises: every MIG device twice.
    let mut offer = MigOffer::of(&inventory, MigStrategy::Mixed);
    for profile in &mut offer.profiles {
        profile.count *= 2;
    }
    let isolation = format!("filesystem/linux,linux/capabilities,cgroups/devices,{MODULE}");
    let c = Cluster::start_offering(
        AgentCgroups::V1,
        &isolation,
        &setup,
        &format!("cpus:4;mem:4096;{}", offer.resources().join(";")),
    )?;
    let probe = probe()?;
    let no_admin: &[&str] = &[
        "--framework_capabilities=GPU_RESOURCES",
        "--checkpoint",
        r#"--effective_capabilities={"capabilities":["CHOWN","DAC_OVERRIDE"]}"#,
    ];
    let names = ["share-one", "share-two"];
    let mut tasks = Vec::new();
    for name in names {
        let command = format!(
            "echo env CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY; {0} {1}; {0} {1}/nvidia-caps {2}",
            probe.display(),
            c.dev.path().display(),
            c.go_file(name).display()
        );
        tasks.push(Task::launch_with(
            &c.install,
            &c.master,
            name,
            "cpus:0.1;mem:32;mig-1g.5gb:1",
            &command,
            no_admin,
        )?);
    }
    let result = (|| -> TestResult<(String, u64)> {
        let mut seen = Vec::new();
        for name in names {
            let out = c.agent.wait_stdout(name, "waiting for", TASK_TIMEOUT)?;
            println!("{name} printed:\n{}", out.trim_end());
            let opened = |outcome: &str| -> Vec<String> {
                out.lines()
                    .filter(|l| l.starts_with("before ") && l.ends_with(outcome))
                    .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
                    .collect()
            };
            let var = |k: &str| {
                out.lines()
                    .find_map(|l| l.strip_prefix(&format!("env {k}=")))
                    .unwrap_or_default()
                    .to_owned()
            };
            let visible = var("NVIDIA_VISIBLE_DEVICES");
            let device = inventory
                .mig
                .by_uuid(&visible)
                .ok_or(format!("{name}: not a MIG device: {visible:?}"))?;
            let caps = device.caps.as_ref().ok_or("no caps")?;
            let mut want = vec![
                format!("nvidia{}", device.parent_minor),
                format!("nvidia-cap{}", caps.gpu_instance.minor),
                format!("nvidia-cap{}", caps.compute_instance.minor),
            ];
            want.sort();
            let all = opened(" ENXIO");
            let numbered = |n: &&String| {
                let tail = n
                    .strip_prefix("nvidia-cap")
                    .or_else(|| n.strip_prefix("nvidia"))
                    .unwrap_or_default();
                tail.parse::<u32>().is_ok()
            };
            let mut got: Vec<String> = all.iter().filter(numbered).cloned().collect();
            got.sort();
            check(
                got == want && all.iter().any(|n| n == "nvidiactl"),
                format!("{name} opened {all:?}, expected {want:?} and the control nodes"),
            )?;
            let denied = opened(" EPERM").len();
            check(
                denied == inventory.gpus.len() - 1 + 2 * inventory.mig.devices.len() - 2,
                format!("{name}: every other GPU and capability node must be EPERM ({denied})"),
            )?;
            let pipe = Path::new(&mps_root).join(&visible).join("pipe");
            check(
                var("CUDA_VISIBLE_DEVICES") == visible
                    && device.profile == Some(19)
                    && var("MESOS_GPU_SHARE") == "1/2"
                    && var("MESOS_GPU_SHARING") == "mps"
                    && var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "50"
                    && var("CUDA_MPS_PIPE_DIRECTORY") == pipe.display().to_string(),
                format!("{name}'s environment: {out}"),
            )?;
            seen.push(visible);
        }
        check(
            seen[0] == seen[1],
            format!("the two tasks are on one MIG device: {seen:?}"),
        )?;
        let starts: Vec<(String, u64)> = control
            .records()
            .iter()
            .filter(|r| r["event"] == "start")
            .filter_map(|r| {
                Some((
                    r["env"]["CUDA_VISIBLE_DEVICES"].as_str()?.to_owned(),
                    r["daemon_pid"].as_u64()?,
                ))
            })
            .collect();
        check(
            starts.len() == 1 && starts[0].0 == seen[0],
            format!("one MPS daemon, for the shared MIG device: {starts:?}"),
        )?;
        Ok(starts[0].clone())
    })();
    let (uuid, pid) = match result {
        Ok(daemon) => daemon,
        Err(e) => {
            control.kill_daemons();
            return Err(e);
        }
    };
    for (i, name) in names.iter().enumerate() {
        c.release(name)?;
        tasks[i].wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    }
    c.wait_all_released()?;
    let quit = wait_for(
        TASK_TIMEOUT,
        || format!("the MPS daemon of {uuid} to quit: {:?}", control.records()),
        || {
            control
                .records()
                .iter()
                .any(|r| r["event"] == "exit" && r["reason"] == "quit" && r["daemon_pid"] == pid)
                .then_some(())
        },
    );
    if quit.is_err() {
        control.kill_daemons();
    }
    quit?;
    // The supervisor commits the pool once the daemon quit.
    let pool_path = c.scratch.path().join("pool/gpu/pool.json");
    let pool = || std::fs::read_to_string(&pool_path).unwrap_or_default();
    wait_for(
        TASK_TIMEOUT,
        || format!("no share or daemon left in the pool: {}", pool()),
        || (!pool().contains("MIG-")).then_some(()),
    )?;
    Ok(())
}

/// Issue 17: Mesos's Docker containerizer cannot run on an agent that offers shares: it builds
/// its own GPU allocator from `--resources` and looks up NVML indices 0 to gpus-1
/// (`isolators/gpu/allocator.cpp`, `enumerateGpus`), so `gpus:14` on 8 GPUs stops the agent at
/// start. The operator guide tells operators to run sharing agents with `--containerizers=mesos`.
fn v1_docker_containerizer_cannot_offer_shares() -> TestResult {
    let setup = ModuleSetup {
        explicit_root: true,
        extra: &[("gpu_replicas", "4,2=1,3=1,4=1,5=1,6=1,7=1")],
        ..EXPLICIT_ROOT
    };
    let Err(e) = DockerCluster::start_with(
        None,
        AgentCgroups::V1,
        &setup,
        Some("cpus:4;mem:4096;gpus:14"),
    ) else {
        return Err(
            "an agent with the Docker containerizer started offering gpus:14 on 8 GPUs".into(),
        );
    };
    let text = e.to_string();
    println!("{}", mesos_gpu_testkit::mesos::tail(&text, 3));
    check(
        text.contains("Failed to create a containerizer")
            && text.contains("deviceGetHandleByIndex"),
        format!("the agent did not fail as expected: {text}"),
    )
}

/// Three tasks at once (4 + 3 + 1 GPUs of 8) get disjoint GPUs covering the node, each exactly
/// its own.
fn v1_concurrent_tasks_get_disjoint_gpus() -> TestResult {
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &EXPLICIT_ROOT,
    )?;
    let asks = [("four", 4), ("three", 3), ("one", 1)];
    let mut tasks = Vec::new();
    for (name, gpus) in asks {
        tasks.push(c.launch(name, gpus, true)?);
    }
    let mut seen = BTreeSet::new();
    for ((name, gpus), task) in asks.iter().zip(tasks.iter_mut()) {
        task.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
        let report = c.report(name)?;
        let mine = opened(&report, false);
        check(
            mine.len() == *gpus as usize,
            format!("{name}: {gpus} GPUs expected: {report:?}"),
        )?;
        expect_exactly(&report, &report.gpus(false), false)?;
        check(
            mine.is_disjoint(&seen),
            format!("{name} got {mine:?}, already held: {seen:?}"),
        )?;
        seen.extend(mine);
    }
    check(seen.len() == 8, format!("all 8 GPUs in use: {seen:?}"))?;
    for ((name, _), task) in asks.iter().zip(tasks.iter_mut()) {
        c.release(name)?;
        task.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    }
    c.wait_all_released()
}

/// Issue 13: the module and an `exec` beside the agent draw from the node's one pool. While a
/// `gpus:5` task runs, an exec isolator (the code `mesos-gpu exec` runs, in this process) on the
/// same pool directory is refused 4 GPUs with the pool's counts and gets the other 3.
fn v1_exec_beside_the_agent() -> TestResult {
    use mesos_gpu_isolator::{
        lifecycle::CgroupChoice, lifecycle::ContainerId as Cid, lifecycle::Isolator,
        lifecycle::IsolatorConfig, lifecycle::PoolConfig, lifecycle::PoolRole,
        lifecycle::PrepareConfig,
    };
    use mesos_gpu_node::devices::DeviceNodes;
    use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &EXPLICIT_ROOT,
    )?;
    let mut task = c.launch("five", 5, true)?;
    task.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let held = opened(&c.report("five")?, false);
    check(held.len() == 5, format!("the task holds {held:?}"))?;
    let Discovery::Driver(driver) = GpuDriver::open(Some(&c.sim.lib_path()))? else {
        return Err("nvml-sim reported no driver".into());
    };
    let inventory = driver.inventory().clone();
    let nodes = DeviceNodes::scan(c.dev.path(), &inventory)?;
    let private = c.scratch.path().join("exec");
    let mut config = IsolatorConfig::new(&private);
    config.cgroup_version = CgroupChoice::V1;
    config.cgroups_root = mesos_gpu_testkit::unique_name("beside");
    config.pool = Some(PoolConfig {
        dir: c.scratch.path().join("pool"),
        role: PoolRole::Exec {
            private_dir: private.clone(),
        },
    });
    let parent = Path::new("/sys/fs/cgroup/devices").join(&config.cgroups_root);
    let exec = Isolator::new(config, inventory, nodes)?;
    exec.recover(&[], &[])?;
    let id = Cid::new("exec-1-beside")?;
    let ask = |gpus: f64| PrepareConfig {
        gpus,
        ..PrepareConfig::default()
    };
    let result = (|| -> TestResult {
        let refused = exec.prepare(&id, ask(4.0)).err().ok_or("4 GPUs granted")?;
        check(
            refused.is_not_enough()
                && refused
                    .to_string()
                    .contains("4 asked; 3 free, 0 unhealthy, 0 quarantined, 5 held"),
            format!("{refused}"),
        )?;
        let info = exec.prepare(&id, ask(3.0))?;
        let mine: BTreeSet<u32> = info.gpus.iter().map(|g| g.minor).collect();
        check(
            mine.len() == 3 && mine.is_disjoint(&held),
            format!("exec got {mine:?}, the task holds {held:?}"),
        )?;
        exec.cleanup(&id)?;
        Ok(())
    })();
    let _ = std::fs::remove_dir(&parent);
    result?;
    c.release("five")?;
    task.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    c.wait_all_released()
}

/// Evidence-based recovery in a real agent, nobody running `mark-healthy`. XID 48 takes GPU 6
/// out for good (it needs a reset); XID 94 takes GPU 7 out while its probe (`mesos-gpu gpu probe`
/// in a one-GPU cgroup, with a stand-in `libcuda.so.1` whose `cuMemAlloc` fails) fails: a task
/// asking 7 GPUs is refused. Once the probe passes, GPU 7 is back by itself and a task asking 7
/// GPUs gets every GPU but 6, which was never probed; the metrics and `gpu health` say so at each
/// step, and the trial prints them with the agent's log of the transitions.
fn v1_gpu_comes_back_on_evidence_nobody_marks_it() -> TestResult {
    let cuda = mesos_gpu_testkit::cuda_sim::FakeCuda::build()?;
    let bin = mesos_gpu_bin()?;
    let probe_cmd = format!(
        "{} gpu probe --gpu {{uuid}} --mib 1 --cuda-lib {}",
        bin.display(),
        cuda.lib_path().display()
    );
    let extra = [
        ("health_quiet", "1s"),
        ("health_retry", "1s,4s"),
        ("health_probe", probe_cmd.as_str()),
        ("health_probe_timeout", "30s"),
    ];
    let setup = ModuleSetup {
        extra: &extra,
        ..EXPLICIT_ROOT
    };
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &setup,
    )?;
    let uuids = c.uuids(&[6, 7])?;
    let work = c.scratch.path().join("module-work");
    // What the metrics and `gpu health` say of GPUs 6 and 7, printed under `when`.
    let show = |when: &str| -> TestResult<String> {
        let body = http_get(c.agent.port(), "/mesos-gpu/metrics")?;
        let mine: Vec<&str> = body
            .lines()
            .filter(|l| {
                (l.starts_with("mesos_gpu_health{")
                    || l.starts_with("mesos_gpu_health_recoveries_total")
                    || l.starts_with("mesos_gpu_health_probe_failures_total"))
                    && uuids.iter().any(|u| l.contains(u.as_str()))
            })
            .collect();
        let health = std::process::Command::new(&bin)
            .args(["gpu", "health", "--work-dir"])
            .arg(&work)
            .output()?;
        println!("== {when}\nthe module's metrics (GPUs 6 and 7):");
        for line in &mine {
            println!("  {line}");
        }
        println!("`mesos-gpu gpu health --work-dir <agent work_dir>`:");
        for line in String::from_utf8_lossy(&health.stdout).lines() {
            println!("  {line}");
        }
        Ok(body)
    };
    let metric = |body: &str, want: String| {
        check(
            body.contains(&want),
            format!("{want} missing from:\n{body}"),
        )
    };
    cuda.set_failing(true)?;
    c.sim.append_event("xid 6 48");
    c.sim.append_event("xid 7 94");
    c.agent.wait_log("XID 48", TASK_TIMEOUT)?;
    c.agent.wait_log("XID 94", TASK_TIMEOUT)?;
    c.agent
        .wait_log("GPU stays out of the pool: the probe failed", TASK_TIMEOUT)?;
    let out = show("GPU 7's first probe failed")?;
    metric(
        &out,
        format!(
            r#"mesos_gpu_health{{gpu="7",uuid="{}",state="unhealthy",reason="xid_94",recovery="backoff"}} 1"#,
            uuids[1]
        ),
    )?;
    metric(
        &out,
        format!(
            r#"mesos_gpu_health{{gpu="6",uuid="{}",state="unhealthy",reason="xid_48",recovery="gpu_reset"}} 1"#,
            uuids[0]
        ),
    )?;
    // Mesos offers 8 GPUs; the module hands out 6: a task asking 7 waits, then is refused.
    let mut refused = c.launch("refused", 7, false)?;
    refused.wait_state("TASK_FAILED", Duration::from_secs(120))?;
    let said = refused.output();
    println!(
        "mesos-execute for the refused task printed:\n{}",
        mesos_gpu_testkit::mesos::tail(&said, 4)
    );
    check(
        said.contains("7 asked") && said.contains("unhealthy"),
        format!("refused without saying why: {said}"),
    )?;
    // The probe passes from now on: GPU 7 comes back by itself, GPU 6 does not.
    cuda.set_failing(false)?;
    c.agent
        .wait_log("GPU is back in the pool by itself", TASK_TIMEOUT)?;
    let mut granted = c.launch("granted", 7, false)?;
    granted.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let got = opened(&c.report("granted")?, false);
    println!("the task asking 7 GPUs after the recovery opened GPUs {got:?}");
    check(
        got == (0..8).filter(|&m| m != 6).collect::<BTreeSet<u32>>(),
        format!("granted task got {got:?}"),
    )?;
    let requests = work.join("gpu/health-requests");
    check(
        std::fs::read_dir(&requests).map_or(0, |d| d.count()) == 0,
        "nobody asked the monitor to mark a GPU healthy",
    )?;
    let log = c.agent.log();
    println!("== the agent logged GPUs 6 and 7:");
    for line in log
        .lines()
        .filter(|l| l.contains("gpu=6 ") || l.contains("gpu=7 "))
    {
        println!("  {line}");
    }
    check(
        !log.lines().any(|l| {
            l.contains("gpu=6 ") && (l.contains("GPU recovery") || l.contains("the pool"))
        }),
        "GPU 6 (XID 48, needs a reset) was never checked for recovery",
    )?;
    let back = show("after GPU 7 came back and the task asking 7 GPUs ran")?;
    metric(
        &back,
        format!(
            r#"mesos_gpu_health{{gpu="7",uuid="{}",state="healthy",reason="",recovery=""}} 1"#,
            uuids[1]
        ),
    )?;
    metric(
        &back,
        format!(
            r#"mesos_gpu_health_recoveries_total{{gpu="7",uuid="{}"}} 1"#,
            uuids[1]
        ),
    )?;
    metric(
        &back,
        format!(
            r#"mesos_gpu_health{{gpu="6",uuid="{}",state="unhealthy",reason="xid_48",recovery="gpu_reset"}} 1"#,
            uuids[0]
        ),
    )?;
    metric(
        &back,
        format!(
            r#"mesos_gpu_health_probe_failures_total{{gpu="6",uuid="{}"}} 0"#,
            uuids[0]
        ),
    )?;
    check(
        !back.contains(&format!(
            r#"mesos_gpu_health_probe_failures_total{{gpu="7",uuid="{}"}} 0"#,
            uuids[1]
        )),
        "failed probes counted",
    )?;
    c.wait_all_released()
}

/// A mode per GPU in a real agent: GPUs 0-1 shared two ways under MPS, 2-3 two ways under
/// time-slicing, 4-7 whole (`gpu_sharing=mps,2-3=time-slicing,4-7=none`). Tasks asking one GPU
/// with `MESOS_GPU_SHARE_MODE` mps, time-slicing and none get, side by side, an MPS share (its
/// client limits, a daemon started for that GPU only), a time-sliced share (no MPS variable), and
/// a whole GPU of its own.
fn v1_exclusive_time_sliced_and_mps_gpus_side_by_side() -> TestResult {
    let control = MpsControl::install("{}");
    let program = control.program().display().to_string();
    let scratch_mps = tempfile::Builder::new().prefix("mgpu-mps").tempdir()?;
    let mps_root = scratch_mps.path().display().to_string();
    let extra = [
        ("gpu_replicas", "2"),
        ("gpu_sharing", "mps,2-3=time-slicing,4-7=none"),
        ("mps_control", program.as_str()),
        ("mps_root", mps_root.as_str()),
    ];
    let setup = ModuleSetup {
        extra: &extra,
        ..EXPLICIT_ROOT
    };
    let isolation = format!("filesystem/linux,cgroups/devices,{MODULE}");
    let c = Cluster::start_offering(
        AgentCgroups::V1,
        &isolation,
        &setup,
        "cpus:4;mem:4096;gpus:12",
    )?;
    let asks = [("m", "mps"), ("t", "time-slicing"), ("x", "none")];
    let mut tasks = Vec::new();
    for (name, mode) in asks {
        tasks.push(c.launch_env(name, 1, true, &[("MESOS_GPU_SHARE_MODE", mode)])?);
    }
    let result = (|| -> TestResult {
        let mut got = BTreeMap::new();
        for (name, _) in asks {
            let text = c
                .agent
                .wait_stdout(name, "env CUDA_VISIBLE_DEVICES", TASK_TIMEOUT)?;
            let report = ProbeReport::parse(&text);
            let minors = report.gpus(false);
            expect_exactly(&report, &minors, false)?;
            let var = |k: &str| {
                report
                    .env
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| "(unset)".into())
            };
            println!(
                "task {name}: GPUs {minors:?}, MESOS_GPU_SHARE={}, MESOS_GPU_SHARING={}, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}",
                var("MESOS_GPU_SHARE"),
                var("MESOS_GPU_SHARING"),
                var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            );
            got.insert(
                name,
                (
                    minors,
                    var("MESOS_GPU_SHARE"),
                    var("MESOS_GPU_SHARING"),
                    var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                ),
            );
        }
        let (m, t, x) = (&got["m"], &got["t"], &got["x"]);
        check(
            m.0.len() == 1 && m.0[0] < 2 && m.1 == "1/2" && m.2 == "mps" && m.3 == "50",
            format!("the MPS task: {m:?}"),
        )?;
        check(
            t.0.len() == 1
                && (2..4).contains(&t.0[0])
                && t.1 == "1/2"
                && t.2 == "time-slicing"
                && t.3 == "(unset)",
            format!("the time-sliced task: {t:?}"),
        )?;
        check(
            x.0.len() == 1 && x.0[0] >= 4 && x.1 == "(unset)" && x.3 == "(unset)",
            format!("the exclusive task: {x:?}"),
        )?;
        let started: Vec<String> = control
            .records()
            .iter()
            .filter(|r| r["event"] == "start")
            .filter_map(|r| r["env"]["CUDA_VISIBLE_DEVICES"].as_str().map(str::to_owned))
            .collect();
        check(
            started == c.uuids(&[m.0[0]])?,
            format!("one MPS daemon, for the MPS task's GPU: {started:?}"),
        )
    })();
    control.kill_daemons();
    result?;
    for (i, (name, _)) in asks.iter().enumerate() {
        c.release(name)?;
        tasks[i].wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    }
    c.wait_all_released()
}

/// With all 8 GPUs held, Mesos offers no GPU: a `gpus:1` task stays pending and so does a
/// `gpus:9` task on the 8-GPU agent (`mesos-execute` declines an offer that does not hold all it
/// asks for and suppresses further offers, `cli/execute.cpp` 515, 624-641, so both stay pending
/// for good). Once the first task finished (Mesos updates its container to the executor's own
/// resources, and the module releases the GPUs then), a `gpus:8` task gets all eight.
fn v1_more_gpus_than_free_stay_pending() -> TestResult {
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &EXPLICIT_ROOT,
    )?;
    let mut all = c.launch("all", 8, true)?;
    all.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let mut one = c.launch("one", 1, false)?;
    let mut nine = c.launch("nine", 9, false)?;
    std::thread::sleep(Duration::from_secs(3));
    for (name, task) in [("one", &mut one), ("nine", &mut nine)] {
        check(
            task.states().is_empty() && task.is_running() && c.agent.sandbox(name).is_err(),
            format!("{name} must stay pending: {}", task.output()),
        )?;
    }
    c.release("all")?;
    all.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let mut again = c.launch("again", 8, false)?;
    again.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    expect_exactly(&c.report("again")?, &MINORS, false)?;
    check(
        one.states().is_empty() && nine.states().is_empty(),
        "the suppressed frameworks launched nothing",
    )?;
    c.wait_all_released()
}

/// Mesos counts a GPU free that the module does not hand out (here: taken out of the pool by an
/// XID 79, which Mesos does not know about): a task asking for all eight is offered them, and its
/// `prepare` waits, without blocking the agent, instead of failing at once; once the GPU is back
/// (`gpu mark-healthy`) the task gets all eight.
fn v1_prepare_waits_for_gpus() -> TestResult {
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &EXPLICIT_ROOT,
    )?;
    c.sim.append_event("xid 7 79");
    c.agent.wait_log("XID 79", TASK_TIMEOUT)?;
    let mut all = c.launch("all", 8, false)?;
    c.agent.wait_log("waits up to", TASK_TIMEOUT)?;
    check(
        all.states().is_empty(),
        format!("no status while waiting: {:?}", all.states()),
    )?;
    let health = mesos_gpu_health::HealthStore::at(&c.scratch.path().join("module-work"));
    health.request_mark_healthy(&mesos_gpu_health::GpuRef::Index(7))?;
    all.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    expect_exactly(&c.report("all")?, &MINORS, false)?;
    c.wait_all_released()
}

/// The agent is SIGKILLed while two tasks hold GPUs; one task finishes while it is down. After
/// the restart the running task keeps exactly its GPUs, the finished one's are given back, and
/// a new task gets exactly the free GPUs: nothing is double-booked.
fn agent_sigkill_recovery(cgroups: AgentCgroups) -> TestResult {
    let isolation = match cgroups {
        AgentCgroups::V1 => format!("filesystem/linux,cgroups/devices,{MODULE}"),
        AgentCgroups::V2 => format!("filesystem/linux,{MODULE}"),
    };
    let mut c = Cluster::start(cgroups, &isolation, &EXPLICIT_ROOT)?;
    let mut keep = c.launch("keep", 3, true)?;
    let mut done = c.launch("done", 3, true)?;
    keep.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    done.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let kept = opened(&c.report("keep")?, false);
    let freed = opened(&c.report("done")?, false);
    check(
        kept.len() == 3 && freed.len() == 3 && kept.is_disjoint(&freed),
        format!("{kept:?} {freed:?}"),
    )?;

    c.agent.kill()?;
    c.release("done")?;
    c.agent
        .wait_stdout("done", "after nvidiactl", TASK_TIMEOUT)?;
    c.agent.restart()?;
    done.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    check(
        c.agent.log().contains("recovered GPU"),
        "the module did not recover",
    )?;

    let mut fresh = c.launch("fresh", 5, true)?;
    fresh.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let got = opened(&c.report("fresh")?, false);
    let expected: BTreeSet<u32> = MINORS
        .iter()
        .copied()
        .filter(|m| !kept.contains(m))
        .collect();
    check(
        got == expected,
        format!("the new task must get exactly the free GPUs {expected:?}, got {got:?}"),
    )?;

    c.release("keep")?;
    keep.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let report = c.final_report("keep")?;
    check(
        opened(&report, true) == kept,
        format!("the running task keeps its GPUs {kept:?}: {report:?}"),
    )?;
    expect_exactly(&report, &kept.iter().copied().collect::<Vec<_>>(), true)?;
    c.release("fresh")?;
    fresh.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    c.wait_all_released()
}

/// v1 without `cgroups/devices`: Mesos makes no devices cgroup, so the module makes its own,
/// under the agent's `--cgroups_root` (taken from the agent, not given), and isolates exactly.
/// (With the linux launcher a v1 agent needs some `cgroups/*` isolator: without any, Mesos
/// aborts creating its forced cgroups isolator, `isolators/cgroups/cgroups.cpp` 155.)
fn v1_own_devices_cgroup() -> TestResult {
    let setup = ModuleSetup {
        explicit_root: false,
        extra: &[],
        ..EXPLICIT_ROOT
    };
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/cpu,cgroups/mem,{MODULE}"),
        &setup,
    )?;
    let mut two = c.launch("two", 2, false)?;
    let mut zero = c.launch("zero", 0, false)?;
    two.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    zero.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let report = c.report("two")?;
    check(report.gpus(false).len() == 2, format!("{report:?}"))?;
    expect_exactly(&report, &report.gpus(false), false)?;
    let root = &c.agent.spec().cgroups_root;
    check(
        report
            .cgroups
            .iter()
            .any(|l| l.contains(&format!(":devices:/{root}/"))),
        format!(
            "the module's own devices cgroup is under the agent's root {root}: {:?}",
            report.cgroups
        ),
    )?;
    expect_exactly(&c.report("zero")?, &[], false)?;
    c.wait_all_released()
}

/// Module parameters that contradict the agent are refused when the agent starts, with the
/// reason: a `cgroups_root` other than the agent's, and `container_cgroups=own` where Mesos makes
/// the devices cgroups. (`gpu/nvidia` next to the module is refused too, by the same check, unit
/// tested: a real `gpu/nvidia` cannot start here, it needs `/dev/nvidiactl` on the host.)
fn v1_unsupported_refused() -> TestResult {
    let cases: [(ModuleSetup<'_>, &str); 2] = [
        (
            ModuleSetup {
                explicit_root: false,
                extra: &[("cgroups_root", "mesos_gpu_elsewhere")],
                ..EXPLICIT_ROOT
            },
            "module parameter cgroups_root=\"mesos_gpu_elsewhere\" contradicts the agent's --cgroups_root",
        ),
        (
            ModuleSetup {
                explicit_root: false,
                extra: &[("container_cgroups", "own")],
                ..EXPLICIT_ROOT
            },
            "module parameter container_cgroups=\"own\" contradicts the agent's --isolation",
        ),
    ];
    for (setup, message) in cases {
        refused(
            AgentCgroups::V1,
            &format!("filesystem/linux,cgroups/devices,{MODULE}"),
            &setup,
            message,
        )?;
    }
    Ok(())
}

/// Starts an agent that must refuse to start, logging `message`.
fn refused(
    cgroups: AgentCgroups,
    isolation: &str,
    setup: &ModuleSetup<'_>,
    message: &str,
) -> TestResult {
    let ((install, _sim, _dev, _scratch, master), spec) =
        Cluster::prepare(cgroups, isolation, setup)?;
    let (status, log) = Agent::start_refused(&install, &master, spec)?;
    check(
        !status.success(),
        format!("the agent must refuse to start: {status}"),
    )?;
    check(
        log.contains(message),
        format!(
            "the agent log must say {message:?}:\n{}",
            mesos_gpu_testkit::mesos::tail(&log, 30)
        ),
    )
}

/// v2: the module attaches its program to the container cgroup Mesos made and never moves the
/// task, which runs in Mesos's `leaf`; `gpus:2` opens exactly its GPUs, `gpus:0` no GPU and no
/// control device (no Mesos device program here: the module's base list denies them).
fn v2_program_on_mesos_cgroup() -> TestResult {
    let c = Cluster::start(
        AgentCgroups::V2,
        &format!("filesystem/linux,{MODULE}"),
        &EXPLICIT_ROOT,
    )?;
    let mut two = c.launch("two", 2, false)?;
    let mut zero = c.launch("zero", 0, false)?;
    two.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    zero.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let root = &c.agent.spec().cgroups_root;
    for (name, count) in [("two", 2), ("zero", 0)] {
        let report = c.report(name)?;
        check(
            report.gpus(false).len() == count,
            format!("{name}: {report:?}"),
        )?;
        expect_exactly(&report, &report.gpus(false), false)?;
        let v2 = report
            .cgroups
            .iter()
            .find(|l| l.starts_with("0::"))
            .cloned()
            .unwrap_or_default();
        check(
            v2.starts_with(&format!("0::/{root}/")) && v2.ends_with("/leaf"),
            format!(
                "{name} must run in Mesos's leaf cgroup under {root}: {:?}",
                report.cgroups
            ),
        )?;
    }
    check(
        c.report("zero")?
            .env
            .get("NVIDIA_VISIBLE_DEVICES")
            .map(String::as_str)
            == Some("(unset)"),
        "gpus:0 gets no GPU variable",
    )?;
    c.wait_all_released()
}

/// v2 with Mesos's `cgroups/devices`: the agent refuses to start with the module. And the
/// module's `prepare` on a container cgroup where Mesos's own device program is attached (an
/// agent without the module, replayed through the C ABI) is refused with the same advice.
fn v2_cgroups_devices_refused() -> TestResult {
    refused(
        AgentCgroups::V2,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &EXPLICIT_ROOT,
        "drop `cgroups/devices` from --isolation",
    )?;

    let install = install()?;
    let master = Master::start(&install)?;
    let mut spec = AgentSpec::new("filesystem/linux,cgroups/devices", AgentCgroups::V2, 0);
    spec.resources = "cpus:4;mem:4096".into();
    let agent = Agent::start(&install, &master, spec)?;
    let mut task = Task::launch(
        &install,
        &master,
        "mesos-program",
        "cpus:0.1;mem:32",
        "sleep 600",
    )?;
    task.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let run = agent.sandbox("mesos-program")?.canonicalize()?;
    let container = run
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("no container id in the sandbox path")?
        .to_owned();
    let v2 = mesos_gpu_testkit::cgroup2_root().ok_or("no cgroup2 mount")?;
    let cgroup = v2.join(&agent.spec().cgroups_root).join(&container);
    check(
        cgroup.join("leaf").is_dir(),
        format!("Mesos's cgroup {}", cgroup.display()),
    )?;

    let sim = SimNode::shipped(NODE);
    let dev = DevNodes::nvidia(&MINORS)?;
    let work = tempfile::Builder::new()
        .prefix("mgpu-mesos-replay")
        .tempdir()?;
    let param = |key: &str, value: String| Parameter {
        key: key.into(),
        value,
    };
    let params = mesos_gpu::proto::mesos::Parameters {
        parameter: vec![
            param("work_dir", work.path().display().to_string()),
            param("pool_dir", work.path().join("pool").display().to_string()),
            param("nvml_lib", sim.lib_path().display().to_string()),
            param("dev_root", dev.path().display().to_string()),
            param("driver_volume", "off".into()),
            param("cgroup_version", "v2".into()),
            param("cgroup2_mount", v2.display().to_string()),
            param("cgroups_root", agent.spec().cgroups_root.clone()),
            param("container_cgroups", "mesos".into()),
        ],
    };
    let handle = Handle::new(&params)?;
    handle.recover(&[]).ok()?;
    let id = ContainerId {
        value: container,
        parent: None,
    };
    handle.prepare(&id, &config(1.0)).expect(
        MgpuStatus::MgpuInvalidState,
        "drop `cgroups/devices` (and `cgroups/all`) from --isolation on cgroup v2 hosts",
    )?;
    drop(task);
    drop(agent);
    Ok(())
}

/// Task groups through the default executor: the executor container holds its tasks' GPUs
/// (1 + 1), and both nested task containers open exactly those two, whether they share the
/// executor's cgroups (group `shared`) or have cgroups of their own (group `own`,
/// `share_cgroups=false`: on v1 Mesos makes each a devices cgroup at `<executor>/mesos/<task>`,
/// on v2 a cgroup below the executor's). The two groups run at once on disjoint GPUs.
fn nested_task_group(cgroups: AgentCgroups) -> TestResult {
    let isolation = match cgroups {
        AgentCgroups::V1 => format!("filesystem/linux,cgroups/devices,{MODULE}"),
        AgentCgroups::V2 => format!("filesystem/linux,{MODULE}"),
    };
    let c = Cluster::start(cgroups, &isolation, &EXPLICIT_ROOT)?;
    let command = format!("{} {}", probe()?.display(), c.dev.path().display());
    let task = |name: &str, share: bool| {
        serde_json::json!({
            "name": name,
            "task_id": { "value": name },
            "agent_id": { "value": "" },
            "resources": [
                { "name": "cpus", "type": "SCALAR", "scalar": { "value": 0.1 } },
                { "name": "mem", "type": "SCALAR", "scalar": { "value": 32 } },
                { "name": "gpus", "type": "SCALAR", "scalar": { "value": 1 } },
            ],
            "command": { "value": command },
            "container": { "type": "MESOS", "linux_info": { "share_cgroups": share } },
        })
    };
    let groups = [("shared", true), ("own", false)];
    let mut frameworks = Vec::new();
    for (group, share) in groups {
        let tasks = [
            task(&format!("{group}-a"), share),
            task(&format!("{group}-b"), share),
        ];
        let json = serde_json::json!({ "tasks": tasks });
        frameworks.push(Task::launch_group(&c.install, &c.master, group, &json)?);
    }
    let root = &c.agent.spec().cgroups_root;
    let mut held: BTreeSet<u32> = BTreeSet::new();
    for ((group, share), framework) in groups.iter().zip(frameworks.iter_mut()) {
        let mut seen: Option<Vec<u32>> = None;
        for name in [format!("{group}-a"), format!("{group}-b")] {
            framework.wait_task_state(&name, "TASK_FINISHED", TASK_TIMEOUT)?;
            let report = ProbeReport::parse(&c.agent.group_task_stdout(&name)?);
            let minors = report.gpus(false);
            check(
                minors.len() == 2,
                format!("{name}: the executor's two GPUs: {report:?}"),
            )?;
            expect_exactly(&report, &minors, false)?;
            if *seen.get_or_insert_with(|| minors.clone()) != minors {
                return Err(format!("{name} sees other GPUs than its sibling: {minors:?}").into());
            }
            let line = match cgroups {
                AgentCgroups::V1 => report.cgroups.iter().find(|l| l.contains(":devices:")),
                AgentCgroups::V2 => report.cgroups.iter().find(|l| l.starts_with("0::")),
            };
            let line = line.cloned().unwrap_or_default();
            // Sharing on v1: the executor's devices cgroup; on v2 every nested container has
            // its own cgroup below the executor's.
            let nested = !share || cgroups == AgentCgroups::V2;
            check(
                line.contains(&format!("/{root}/")) && line.contains("/mesos/") == nested,
                format!("{name} runs in {line:?}"),
            )?;
        }
        let mine: BTreeSet<u32> = seen.unwrap_or_default().into_iter().collect();
        check(
            mine.is_disjoint(&held),
            format!("{group} shares GPUs with another group: {mine:?}"),
        )?;
        held.extend(mine);
    }
    c.wait_all_released()
}

/// The agent's own HTTP port serves the module's metrics (`mgpu_metrics`, through the shim's
/// libprocess process `mesos-gpu`): the allocator's GPUs by state as tasks come and go, and
/// each GPU's health.
fn v1_agent_serves_the_module_metrics() -> TestResult {
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &EXPLICIT_ROOT,
    )?;
    let metrics = || http_get(c.agent.port(), "/mesos-gpu/metrics");
    let body = metrics()?;
    let uuid = c.uuids(&[0])?.remove(0);
    for want in [
        r#"mesos_gpu_allocator_gpus{state="free"} 8"#.to_owned(),
        r#"mesos_gpu_allocator_gpus{state="quarantined"} 0"#.to_owned(),
        r#"mesos_gpu_allocator_refusals_total{reason="not_enough"} 0"#.to_owned(),
        format!(
            r#"mesos_gpu_health{{gpu="0",uuid="{uuid}",state="healthy",reason="",recovery=""}} 1"#
        ),
        "mesos_gpu_health_events_total".to_owned(),
    ] {
        check(
            body.contains(&want),
            format!("{want} missing from:\n{body}"),
        )?;
    }
    check(
        body.ends_with("# EOF\n"),
        format!("not OpenMetrics:\n{body}"),
    )?;
    let mut held = c.launch("held", 3, true)?;
    c.report("held")?;
    // The module caches a collection for 1 s (`metrics::DEFAULT_CACHE`): the scrape above may
    // still be served; wait for a fresh one.
    std::thread::sleep(Duration::from_millis(1100));
    let body = metrics()?;
    for want in [
        r#"mesos_gpu_allocator_gpus{state="allocated"} 3"#,
        r#"mesos_gpu_allocator_gpus{state="free"} 5"#,
    ] {
        check(
            body.contains(want),
            format!("{want} missing while a task holds 3 GPUs:\n{body}"),
        )?;
    }
    c.release("held")?;
    held.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    c.wait_all_released()?;
    let body = metrics()?;
    check(
        body.contains(r#"mesos_gpu_allocator_gpus{state="free"} 8"#),
        format!("the GPUs did not come back:\n{body}"),
    )
}

/// The agent's own port serves each container's GPUs (`mgpu_containers`, through the shim's
/// `/mesos-gpu/containers`): a running `gpus:1` task's container lists its one GPU, with NVML's
/// figures and its health, and a `gpus:0` task's container lists none. Mesos's own
/// `/monitor/statistics` shows none of it (it drops the unknown `ResourceStatistics` field 1000),
/// which is why the endpoint exists. `mesos-gpu gpu top` beside the agent shows the task (its
/// id, its framework's name from the agent) holding that GPU with the endpoint's figures, and
/// the GPU free once it ends.
fn agent_serves_each_containers_gpu_usage(cgroups: AgentCgroups, isolation: &str) -> TestResult {
    let c = Cluster::start(cgroups, isolation, &EXPLICIT_ROOT)?;
    let mut one = c.launch("one", 1, true)?;
    let mut none = c.launch("none", 0, true)?;
    let minors = c.report("one")?.gpus(false);
    c.report("none")?;
    let container_of = |task: &str| -> TestResult<String> {
        let run = std::fs::read_link(c.agent.sandbox(task)?)?;
        Ok(run
            .file_name()
            .ok_or("runs/latest names no container")?
            .to_string_lossy()
            .into_owned())
    };
    let (one_id, none_id) = (container_of("one")?, container_of("none")?);
    let body = http_get(c.agent.port(), "/mesos-gpu/containers")?;
    let json: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("not JSON ({e}): {body}"))?;
    let find = |id: &str| -> TestResult<serde_json::Value> {
        json["containers"]
            .as_array()
            .and_then(|all| all.iter().find(|x| x["container"] == id))
            .cloned()
            .ok_or_else(|| format!("container {id} not in {json:#}").into())
    };
    let with = find(&one_id)?;
    let gpus = with["gpus"].as_array().cloned().unwrap_or_default();
    let node: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.sim.config_path())?)?;
    check(
        gpus.len() == 1 && minors.len() == 1,
        format!("the gpus:1 task's container must list one GPU (probe saw {minors:?}): {with:#}"),
    )?;
    let gpu = &gpus[0];
    let described = node["gpus"]
        .as_array()
        .and_then(|all| all.iter().find(|g| g["minor"] == minors[0]))
        .ok_or("no such minor in the node")?;
    check(
        gpu["uuid"] == described["uuid"]
            && gpu["minor"] == minors[0]
            && gpu["health"]["state"] == "healthy"
            && gpu["utilization_gpu"] == described["utilization"]["gpu"]
            && gpu["memory_total"] == described["memory"]["total"]
            && with["kind"] == "mesos",
        format!("the gpus:1 task's GPU {gpu:#} against the node's {described:#}"),
    )?;
    let without = find(&none_id)?;
    check(
        without["gpus"].as_array().is_some_and(Vec::is_empty),
        format!("the gpus:0 task's container lists GPUs: {without:#}"),
    )?;
    let uuid = described["uuid"].as_str().unwrap_or_default();
    // `gpu top` beside the agent: its usage from this endpoint, its holders from the pool.
    let top = || -> TestResult<serde_json::Value> {
        let out = std::process::Command::new(mesos_gpu_exe()?)
            .arg("--nvml-lib")
            .arg(c.sim.lib_path())
            .args(["gpu", "top", "--json", "--pool-dir"])
            .arg(c.scratch.path().join("pool"))
            .arg("--agent")
            .arg(format!("http://127.0.0.1:{}", c.agent.port()))
            .output()?;
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "gpu top --json ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into()
        })
    };
    let shown = top()?;
    let row_of = |shown: &serde_json::Value| -> TestResult<serde_json::Value> {
        shown["gpus"]
            .as_array()
            .and_then(|all| all.iter().find(|g| g["uuid"] == uuid))
            .cloned()
            .ok_or_else(|| format!("GPU {uuid} not in gpu top's {shown:#}").into())
    };
    let row = row_of(&shown)?;
    let holders = row["holders"].as_array().cloned().unwrap_or_default();
    check(
        shown["source"] == "agent"
            && row["utilization_gpu"] == described["utilization"]["gpu"]
            && holders.len() == 1
            && holders[0]["owner"] == one_id.as_str()
            && holders[0]["containerizer"] == "mesos"
            && holders[0]["state"] == "alive"
            && holders[0]["memory_used"] == gpu["memory_used"]
            && holders[0]["holder"]["task_id"] == "one"
            && holders[0]["holder"]["framework_name"]
                .as_str()
                .is_some_and(|name| !name.is_empty()),
        format!(
            "gpu top's row of the gpus:1 task's GPU: {row:#} (source {})",
            shown["source"]
        ),
    )?;
    // What `serve` and `gpu top` read of a container whose record names no holder: the real
    // agent's `/containers` gives the task's executor and framework.
    let agent = mesos_gpu_docker::agent::MesosAgent::at(([127, 0, 0, 1], c.agent.port()).into());
    let listed = agent.read_containers()?;
    check(
        listed.get(&one_id).is_some_and(|h| {
            h.executor_id.as_deref() == Some("one")
                && h.framework_id
                    == holders[0]["holder"]["framework_id"]
                        .as_str()
                        .map(str::to_owned)
        }),
        format!("the agent's /containers of {one_id}: {listed:?}"),
    )?;
    let statistics = http_get(c.agent.port(), "/monitor/statistics")?;
    check(
        statistics.contains(&one_id) || statistics.contains("\"executor_id\":\"one\""),
        format!("/monitor/statistics does not show the task: {statistics}"),
    )?;
    check(
        !statistics.contains(uuid) && !statistics.contains("gpu_statistics"),
        format!("/monitor/statistics shows GPU figures after all: {statistics}"),
    )?;
    c.release("one")?;
    c.release("none")?;
    one.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    none.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    c.wait_all_released()?;
    let after = http_get(c.agent.port(), "/mesos-gpu/containers")?;
    check(
        !after.contains(&one_id) && !after.contains(&none_id),
        format!("finished tasks' containers still listed: {after}"),
    )?;
    let row = row_of(&top()?)?;
    check(
        row["holders"] == serde_json::json!([]),
        format!("gpu top still shows a holder of the finished task's GPU: {row:#}"),
    )
}

/// `scripts/gpu-check.sh`, the real-GPU acceptance check, on a simulated node with this build's
/// programs and module (`--bin`) and the real Mesos (`--mesos`): every check passes, none is
/// skipped, and it leaves no cgroup of its agent behind.
fn gpu_check_script() -> TestResult {
    let target = mesos_gpu_exe()?
        .parent()
        .ok_or("no target directory")?
        .to_owned();
    let bin = tempfile::Builder::new()
        .prefix("mgpu-gpu-check-bin")
        .tempdir()?;
    let sim_lib = [
        target.join("libnvml_sim.so"),
        target.join("deps/libnvml_sim.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .ok_or("libnvml_sim.so is not built (cargo build -p nvml-sim)")?;
    let smi = target.join("nvidia-smi");
    check(
        smi.is_file(),
        "nvml-sim's nvidia-smi stand-in is not built (cargo build -p nvml-sim --bins)",
    )?;
    for (name, from) in [
        ("mesos-gpu", mesos_gpu_exe()?),
        ("libmesos_gpu.so", cdylib()?),
        ("libmesos_gpu_module.so", module()?),
        ("libnvml_sim.so", sim_lib),
        ("nvidia-smi", smi),
    ] {
        std::os::unix::fs::symlink(from, bin.path().join(name))?;
    }
    let log = bin.path().join("gpu-check.log");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check.sh");
    let out = std::process::Command::new(&script)
        .args(["--simulate", NODE, "--bin"])
        .arg(bin.path())
        .arg("--mesos")
        .arg(install()?.prefix())
        .arg("--log")
        .arg(&log)
        .env_remove("NVML_SIM_CONFIG")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let full = std::fs::read_to_string(&log).unwrap_or_default();
    check(
        out.status.success(),
        format!(
            "gpu-check.sh failed ({}):
{stdout}
{}
log tail:
{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            mesos_gpu_testkit::mesos::tail(&full, 60)
        ),
    )?;
    for name in [
        "doctor",
        "info",
        "ldcache",
        "volume",
        "exec-1",
        "exec-0",
        "mesos-gpu1",
        "mesos-view",
        "mesos-gpu0",
    ] {
        check(
            stdout
                .lines()
                .any(|l| l.starts_with("PASS") && l.split_whitespace().nth(1) == Some(name)),
            format!(
                "no PASS {name}:
{stdout}"
            ),
        )?;
    }
    check(
        stdout.contains("9 passed, 0 failed, 0 skipped"),
        format!(
            "summary:
{stdout}"
        ),
    )?;
    let left: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")?
        .filter_map(Result::ok)
        .flat_map(|h| {
            std::fs::read_dir(h.path())
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
        })
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("mesos_gpu_check_"))
        .collect();
    check(left.is_empty(), format!("cgroups left behind: {left:?}"))
}

/// What the operator guide says about sharing GPU agents, with a real master: a framework
/// without `GPU_RESOURCES` is offered nothing from a GPU agent (the master's
/// `--filter_gpu_resources`, on by default); one with it runs a GPU task; a role whose quota
/// limits `gpus` to 0 is offered the agent's other resources but never a GPU.
fn v1_gpu_agents_are_shared_as_the_guide_says() -> TestResult {
    let c = Cluster::start(
        AgentCgroups::V1,
        &format!("filesystem/linux,cgroups/devices,{MODULE}"),
        &EXPLICIT_ROOT,
    )?;
    // Long enough for several offer cycles (the harness's master offers every 200 ms).
    let unoffered = Duration::from_secs(10);
    let never_offered = |task: &Task| -> TestResult {
        std::thread::sleep(unoffered);
        check(
            task.states().is_empty(),
            format!("{} was offered this agent: {}", task.name(), task.output()),
        )
    };
    let blind = Task::launch_with(
        &c.install,
        &c.master,
        "blind",
        "cpus:0.1;mem:32",
        "true",
        &[],
    )?;
    never_offered(&blind)?;

    let mut gpu = c.launch("gpu", 1, false)?;
    gpu.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let report = c.report("gpu")?;
    check(report.gpus(false).len() == 1, format!("{report:?}"))?;

    let quota = r#"{"type":"UPDATE_QUOTA","update_quota":{"force":false,"quota_configs":[{"role":"batch","limits":{"gpus":{"value":0}}}]}}"#;
    http_post_json(c.master.port(), "/api/v1", quota)?;
    let batch = ["--framework_capabilities=GPU_RESOURCES", "--role=batch"];
    let starved = Task::launch_with(
        &c.install,
        &c.master,
        "starved",
        "cpus:0.1;mem:32;gpus:1",
        "true",
        &batch,
    )?;
    never_offered(&starved)?;
    let probe = probe()?;
    let mut cpu = Task::launch_with(
        &c.install,
        &c.master,
        "cpu",
        "cpus:0.1;mem:32",
        &format!("{} {}", probe.display(), c.dev.path().display()),
        &batch,
    )?;
    cpu.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let report = c.report("cpu")?;
    expect_exactly(&report, &[], false)?;
    check(
        report.env.get("CUDA_VISIBLE_DEVICES").map(String::as_str) == Some("(unset)"),
        format!("a CPU task of batch sees GPUs: {:?}", report.env),
    )
}

// Issue 12: Docker containerizer tasks with `gpus`, through the hook module
// `org_apache_mesos_gpu_MesosGpuDockerHook` (which reserves with `mesos-gpu docker-args`) and
// the agent's `--docker` program, `mesos-gpu docker-wrapper`.

/// A cluster whose agent runs `--containerizers=docker,mesos` with the isolator and the
/// Docker hook loaded and `--docker` naming a script that runs `mesos-gpu docker-wrapper`
/// ([`DockerTools`]); both containerizers draw from one pool. Images it builds are removed on
/// drop.
struct DockerCluster {
    c: Cluster,
    images: Images,
    /// Held for the cluster's life, after its agent is gone (the last field drops last).
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.c.scratch.path().join("stalled.pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid.trim()])
                .status();
        }
    }
}

impl DockerCluster {
    fn start() -> TestResult<DockerCluster> {
        DockerCluster::start_on(None, AgentCgroups::V1)
    }

    /// A Docker cluster on the daemon at `socket` (the machine's when `None`), its agent on
    /// `cgroups`.
    fn start_on(socket: Option<&Path>, cgroups: AgentCgroups) -> TestResult<DockerCluster> {
        DockerCluster::start_with(socket, cgroups, &EXPLICIT_ROOT, None)
    }

    /// [`DockerCluster::start_on`] with the isolator module set up as `setup` and the agent's
    /// `--resources` replaced by `resources`.
    fn start_with(
        socket: Option<&Path>,
        cgroups: AgentCgroups,
        setup: &ModuleSetup<'_>,
        resources: Option<&str>,
    ) -> TestResult<DockerCluster> {
        let isolation = match cgroups {
            AgentCgroups::V1 => format!("filesystem/linux,cgroups/devices,{MODULE}"),
            AgentCgroups::V2 => format!("filesystem/linux,{MODULE}"),
        };
        let serial = one_docker_agent();
        let ((install, sim, dev, scratch, master), mut spec) =
            Cluster::prepare(cgroups, &isolation, setup)?;
        if let Some(resources) = resources {
            spec.resources = resources.to_owned();
        }
        let exe = mesos_gpu_exe()?;
        let s = scratch.path();
        // A MIG node's capability nodes are found through the driver's `/proc` files, which
        // only a simulation of the node (not its library alone) gives `mesos-gpu`.
        let nvml = match setup.node {
            Some(node) => format!("--simulate {node}"),
            None => format!("--nvml-lib {}", sim.lib_path().display()),
        };
        DockerTools {
            exe: &exe,
            node: format!("{nvml} --dev-root {}", dev.path().display()),
            pool: &s.join("pool"),
            state_dir: &s.join("docker-work"),
            state_flag: "--docker-state-dir",
            docker_args: setup.docker_args,
            socket,
            wrapper: if setup.shipped_wrapper {
                Wrapper::Shipped
            } else {
                Wrapper::Stalling
            },
        }
        .add_to(&mut spec, s)?;
        let agent = Agent::start(&install, &master, spec)?;
        Ok(DockerCluster {
            c: Cluster {
                install,
                sim,
                dev,
                scratch,
                master,
                agent,
            },
            images: Images::on(socket),
            _serial: serial,
        })
    }

    /// `docker` talking to this cluster's daemon.
    fn docker(&self) -> std::process::Command {
        self.images.docker()
    }

    /// `mesos-gpu` on this cluster's simulated node and pool.
    fn mesos_gpu(&self, args: &[&str]) -> TestResult<String> {
        let out = std::process::Command::new(mesos_gpu_exe()?)
            .arg("--nvml-lib")
            .arg(self.c.sim.lib_path())
            .arg("--dev-root")
            .arg(self.c.dev.path())
            .args(args)
            .arg("--pool-dir")
            .arg(self.c.scratch.path().join("pool"))
            .output()?;
        check(
            out.status.success(),
            format!(
                "mesos-gpu {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The pool's Docker reservations with their owner records.
    fn docker_owners(&self) -> TestResult<Vec<(String, serde_json::Value)>> {
        let path = self.c.scratch.path().join("pool/gpu/pool.json");
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        Ok(json["reservations"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, r)| r["owner"]["kind"] == "docker")
            .map(|(k, r)| (k.clone(), r["owner"].clone()))
            .collect())
    }

    /// Builds a busybox image `FROM scratch` holding the probe at `/probe`, with the
    /// driver-volume label when `volume`.
    fn image(&mut self, volume: bool) -> TestResult<String> {
        let labels: &[&str] = if volume {
            &["com.nvidia.volumes.needed=nvidia_driver"]
        } else {
            &[]
        };
        self.image_with(labels)
    }

    /// [`DockerCluster::image`] with these labels (`KEY=VALUE`).
    fn image_with(&mut self, labels: &[&str]) -> TestResult<String> {
        self.images.build(self.c.scratch.path(), labels)
    }

    /// Launches Docker task `name` in `image` asking for `gpus` GPUs ([`launch_docker_task`]);
    /// its go file is `touch`ed by [`DockerCluster::release`].
    fn launch(&self, name: &str, image: &str, gpus: u32, wait: bool) -> TestResult<Task> {
        self.launch_asking(name, image, &format!("cpus:0.1;mem:32;gpus:{gpus}"), wait)
    }

    /// [`DockerCluster::launch`] asking for `resources`.
    fn launch_asking(
        &self,
        name: &str,
        image: &str,
        resources: &str,
        wait: bool,
    ) -> TestResult<Task> {
        launch_docker_task(
            &self.c.install,
            &self.c.master,
            name,
            image,
            resources,
            wait,
        )
    }

    /// Lets a waiting task finish.
    fn release(&self, name: &str) -> TestResult {
        Ok(std::fs::write(self.c.agent.sandbox(name)?.join("go"), b"")?)
    }

    /// Waits until the pool holds no Docker reservation; `what` names the GPUs in the error.
    fn wait_released(&self, what: &str) -> TestResult {
        wait_for(
            TASK_TIMEOUT,
            || {
                format!(
                    "{what} back in the pool: {:?}; agent log:\n{}",
                    self.docker_reservations(),
                    mesos_gpu_testkit::mesos::tail(&self.c.agent.log(), 30)
                )
            },
            || {
                self.docker_reservations()
                    .ok()
                    .filter(Vec::is_empty)
                    .map(|_| ())
            },
        )?;
        Ok(())
    }

    /// The Docker containers' reservations in the node's pool (owner ids).
    fn docker_reservations(&self) -> TestResult<Vec<String>> {
        docker_reservations(&self.c.scratch.path().join("pool"))
    }
}

/// A `gpus:2` Docker task in an image labelled `com.nvidia.volumes.needed` sees exactly two
/// GPU nodes and the control nodes (ENXIO: allowed, no driver), their UUIDs in
/// NVIDIA_VISIBLE_DEVICES and the driver volume read-only at /usr/local/nvidia; a `gpus:1` task
/// in an unlabelled image gets no volume and other GPUs; both tasks' GPUs go back to the pool
/// when they end.
fn v1_docker_task_gets_exactly_its_gpus() -> TestResult {
    let mut d = DockerCluster::start()?;
    let labelled = d.image(true)?;
    let plain = d.image(false)?;
    let mut two = d.launch("dtwo", &labelled, 2, true)?;
    let out = d.c.agent.wait_stdout("dtwo", "waiting", TASK_TIMEOUT)?;
    println!("dtwo printed:\n{out}");
    let report = ProbeReport::parse(&out);
    let held = docker_nodes(&report, 2, &out)?;
    let minors: Vec<u32> = held.iter().copied().collect();
    let want: BTreeSet<String> = d.c.uuids(&minors)?.into_iter().collect();
    let got: BTreeSet<String> = report
        .env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    check(
        got == want,
        format!("NVIDIA_VISIBLE_DEVICES {got:?}, expected {want:?}"),
    )?;
    let mount = out
        .lines()
        .find(|l| l.starts_with("mount "))
        .ok_or_else(|| format!("no driver volume at /usr/local/nvidia: {out}"))?;
    check(
        mount
            .split_whitespace()
            .nth(4)
            .is_some_and(|o| o.split(',').any(|f| f == "ro")),
        format!("the driver volume is not read-only: {mount}"),
    )?;
    check(
        out.contains("volume driver-volume-marker"),
        format!("the volume's files are not at /usr/local/nvidia: {out}"),
    )?;

    let mut one = d.launch("done", &plain, 1, false)?;
    let out1 = d.c.agent.wait_stdout("done", "done", TASK_TIMEOUT)?;
    println!("done printed:\n{out1}");
    let report1 = ProbeReport::parse(&out1);
    let held1 = opened(&report1, false);
    check(
        held1.len() == 1 && held1.is_disjoint(&held),
        format!("done opened {held1:?}, dtwo holds {held:?}: {out1}"),
    )?;
    check(
        !out1.contains("mount ") && !out1.contains("volume "),
        format!("an unlabelled image got the driver volume: {out1}"),
    )?;
    one.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.release("dtwo")?;
    two.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.wait_released("the Docker tasks' GPUs")?;
    Ok(())
}

/// Whose task `name` is, as the agent's `/state` tells: its container id and the holder labels
/// (`executor_id`, `framework_id`, `framework_name`, `task_id`, `task_name`).
fn holder_in_state(agent: &Agent, name: &str) -> TestResult<(String, serde_json::Value)> {
    let state: serde_json::Value = serde_json::from_str(&http_get(agent.port(), "/state")?)?;
    for framework in state["frameworks"].as_array().into_iter().flatten() {
        for executor in framework["executors"].as_array().into_iter().flatten() {
            for task in executor["tasks"].as_array().into_iter().flatten() {
                if task["name"] == name {
                    let container = executor["container"]
                        .as_str()
                        .ok_or_else(|| format!("no container for {name}: {executor:#}"))?;
                    let holder = serde_json::json!({
                        "executor_id": executor["id"],
                        "framework_id": framework["id"],
                        "framework_name": framework["name"],
                        "task_id": task["id"],
                        "task_name": task["name"],
                    });
                    return Ok((container.to_owned(), holder));
                }
            }
        }
    }
    Err(format!("no task {name} in the agent's /state: {state:#}").into())
}

/// The label text of a holder: `container_id="…",executor_id="…",…,task_name="…"`.
fn holder_labels(container: &str, holder: &serde_json::Value) -> String {
    let mut out = format!("container_id=\"{container}\"");
    for key in [
        "executor_id",
        "framework_id",
        "framework_name",
        "task_id",
        "task_name",
    ] {
        out.push_str(&format!(
            ",{key}=\"{}\"",
            holder[key].as_str().unwrap_or("")
        ));
    }
    out
}

/// Issue 37: the agent's `/mesos-gpu/metrics` labels each container's series with whose it is,
/// read from the agent: a running `gpus:2` Mesos task's container (`mesos_gpu_container_gpus`
/// 2, and one `mesos_gpu_holder_info` per GPU) and a `gpus:1` Docker-containerizer task's (its
/// reservation made by `docker-args` from the hook's flags) carry their container id, executor
/// id, framework id and name, task id and name exactly as the agent's `/state` says, and the
/// module's `/mesos-gpu/containers` gives the Mesos container the same `holder`; once both
/// tasks end no series names either container, and no GPU has a holder.
fn v1_metrics_label_each_gpu_with_its_task_and_drop_them_after() -> TestResult {
    let mut d = DockerCluster::start()?;
    let plain = d.image(false)?;
    let mut mesos = d.c.launch("mtwo", 2, true)?;
    d.c.report("mtwo")?;
    let mut docker = d.launch("dlabel", &plain, 1, true)?;
    d.c.agent.wait_stdout("dlabel", "waiting", TASK_TIMEOUT)?;
    let (mesos_id, mesos_holder) = holder_in_state(&d.c.agent, "mtwo")?;
    let (docker_id, docker_holder) = holder_in_state(&d.c.agent, "dlabel")?;
    check(
        mesos_holder["framework_name"]
            .as_str()
            .is_some_and(|n| !n.is_empty()),
        format!("the framework has no name in /state: {mesos_holder}"),
    )?;
    // The module caches a collection for 1 s (`metrics::DEFAULT_CACHE`).
    std::thread::sleep(Duration::from_millis(1100));
    let body = http_get(d.c.agent.port(), "/mesos-gpu/metrics")?;
    let labelled = body.lines().filter(|l| l.contains("container_id="));
    println!(
        "labelled series:\n{}",
        labelled.collect::<Vec<_>>().join("\n")
    );
    for (id, holder, gpus) in [
        (&mesos_id, &mesos_holder, 2),
        (&docker_id, &docker_holder, 1),
    ] {
        let labels = holder_labels(id, holder);
        let held = format!("mesos_gpu_container_gpus{{{labels}}} {gpus}");
        check(
            body.lines().any(|l| l == held),
            format!("{held} missing from:\n{body}"),
        )?;
        let info = body
            .lines()
            .filter(|l| {
                l.starts_with("mesos_gpu_holder_info{") && l.ends_with(&format!("{labels}}} 1"))
            })
            .count();
        check(
            info == gpus,
            format!("{info} mesos_gpu_holder_info series of {labels}, expected {gpus}:\n{body}"),
        )?;
    }
    let containers: serde_json::Value =
        serde_json::from_str(&http_get(d.c.agent.port(), "/mesos-gpu/containers")?)?;
    let listed = containers["containers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["container"] == mesos_id.as_str()))
        .ok_or_else(|| format!("{mesos_id} not in {containers:#}"))?;
    println!("holder in /mesos-gpu/containers: {}", listed["holder"]);
    check(
        listed["holder"] == mesos_holder,
        format!(
            "holder {} in /mesos-gpu/containers, /state says {mesos_holder}",
            listed["holder"]
        ),
    )?;
    d.c.release("mtwo")?;
    d.release("dlabel")?;
    mesos.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    docker.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.c.wait_all_released()?;
    d.wait_released("the Docker task's GPU")?;
    std::thread::sleep(Duration::from_millis(1100));
    let after = http_get(d.c.agent.port(), "/mesos-gpu/metrics")?;
    check(
        !after.contains(&mesos_id) && !after.contains(&docker_id),
        format!("series of ended containers remain:\n{after}"),
    )?;
    check(
        !after.contains("mesos_gpu_holder_info{"),
        format!("a GPU still has a holder:\n{after}"),
    )
}

/// Issue 16: an agent on `dgx-a100-mixed` offering the mixed strategy (`gpus:4` for GPUs 0-3,
/// `mig-<profile>` scalars for GPUs 4-7's MIG devices), with the Docker hook's `docker-args`
/// on `--mig-strategy mixed`: a Docker task asking for `mig-1g.5gb:1` gets one 1g.5gb MIG
/// device: its container has the parent GPU's node and the device's two capability nodes
/// (ENXIO: allowed, no driver), the control nodes and nothing else, and NVIDIA_VISIBLE_DEVICES
/// names the device; the pool records it for the container meanwhile; a `gpus:1` Docker task
/// beside it gets a whole GPU; `mig-1g.5gb:0.5` fails saying why; all go back to the pool.
fn v1_docker_task_gets_its_mig_device() -> TestResult {
    use mesos_gpu_isolator::{agent_flags::MigOffer, agent_flags::MigStrategy};
    let inventory = SimNode::shipped(MIG_NODE).inventory()?;
    let offer = MigOffer::of(&inventory, MigStrategy::Mixed);
    let resources = format!("cpus:4;mem:4096;{}", offer.resources().join(";"));
    let setup = ModuleSetup {
        extra: &[("mig_strategy", "mixed")],
        node: Some(MIG_NODE),
        docker_args: &["--mig-strategy", "mixed"],
        ..EXPLICIT_ROOT
    };
    let mut d = DockerCluster::start_with(None, AgentCgroups::V1, &setup, Some(&resources))?;
    // Labelled: the wrapper keeps NVIDIA_VISIBLE_DEVICES for images that ask for the driver.
    let image = d.image(true)?;
    let mut mig = d.launch_asking("dmig", &image, "cpus:0.1;mem:32;mig-1g.5gb:1", true)?;
    let out = d.c.agent.wait_stdout("dmig", "waiting", TASK_TIMEOUT)?;
    println!("dmig printed:\n{out}");
    let report = ProbeReport::parse(&out);
    let visible = report
        .env
        .get("NVIDIA_VISIBLE_DEVICES")
        .cloned()
        .unwrap_or_default();
    let device = inventory.mig.by_uuid(&visible).ok_or(format!(
        "NVIDIA_VISIBLE_DEVICES is not a MIG device: {visible:?}: {out}"
    ))?;
    let caps = device.caps.as_ref().ok_or("no caps")?;
    let mut want: BTreeSet<String> = CONTROL.iter().map(|c| (*c).to_owned()).collect();
    want.insert(format!("nvidia{}", device.parent_minor));
    want.insert(format!("nvidia-cap{}", caps.gpu_instance.minor));
    want.insert(format!("nvidia-cap{}", caps.compute_instance.minor));
    // The probe of `/dev` opens the `nvidia-caps` directory too.
    let nodes: BTreeMap<&String, &String> = report
        .before
        .iter()
        .filter(|(n, _)| *n != "nvidia-caps")
        .collect();
    let seen: BTreeSet<String> = nodes.keys().map(|n| (*n).clone()).collect();
    check(
        seen == want && nodes.values().all(|o| *o == "ENXIO") && device.profile == Some(19),
        format!(
            "dmig saw {:?} holding {visible}; expected {want:?} opening with ENXIO: {out}",
            report.before
        ),
    )?;
    let pool = std::fs::read_to_string(d.c.scratch.path().join("pool/gpu/pool.json"))?;
    check(
        pool.contains(&visible),
        format!("the pool does not record {visible}: {pool}"),
    )?;
    let mut whole = d.launch("dwhole", &image, 1, false)?;
    let out1 = d.c.agent.wait_stdout("dwhole", "done", TASK_TIMEOUT)?;
    println!("dwhole printed:\n{out1}");
    let held = docker_nodes(&ProbeReport::parse(&out1), 1, &out1)?;
    check(
        held.iter().all(|&m| !inventory.mig.is_enabled(m)),
        format!("dwhole got a GPU in MIG mode: {held:?}"),
    )?;
    whole.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let mut half = d.launch_asking("dhalf", &image, "cpus:0.1;mem:32;mig-1g.5gb:0.5", false)?;
    half.wait_state("TASK_FAILED", TASK_TIMEOUT)?;
    let failed = half.output();
    println!("dhalf: {}", mesos_gpu_testkit::mesos::tail(&failed, 4));
    check(
        failed.contains("mig-1g.5gb:0.5 is not a whole number of MIG devices"),
        format!("the fractional request does not fail saying why: {failed}"),
    )?;
    d.release("dmig")?;
    mig.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.wait_released("the Docker tasks' GPU and MIG device")?;
    Ok(())
}

/// The GPU minors a Docker task's probe found: exactly `count` GPU nodes plus the control
/// nodes, each opening with ENXIO (allowed, no driver), and nothing else.
fn docker_nodes(report: &ProbeReport, count: usize, out: &str) -> TestResult<BTreeSet<u32>> {
    let held = opened(report, false);
    check(held.len() == count, format!("opened {held:?}: {out}"))?;
    let mut wrong = Vec::new();
    for (node, outcome) in &report.before {
        let gpu = node
            .strip_prefix("nvidia")
            .and_then(|m| m.parse::<u32>().ok());
        let ok = match gpu {
            Some(m) => held.contains(&m) && outcome == "ENXIO",
            None => CONTROL.contains(&node.as_str()) && outcome == "ENXIO",
        };
        if !ok {
            wrong.push(format!("{node} {outcome}"));
        }
    }
    for node in CONTROL {
        if !report.before.contains_key(node) {
            wrong.push(format!("{node} missing"));
        }
    }
    check(wrong.is_empty(), format!("{}: {out}", wrong.join("; ")))?;
    Ok(held)
}

/// One pool for both containerizers: a Mesos-containerizer task with 5 GPUs and a Docker task
/// with 3 hold disjoint GPUs (all 8 between them); killing the Docker task (its framework goes
/// away) gives its GPUs back, and ending the Mesos task gives back the rest.
fn v1_docker_and_mesos_tasks_one_pool() -> TestResult {
    let mut d = DockerCluster::start()?;
    let image = d.image(false)?;
    let mut mesos_task = d.c.launch("mfive", 5, true)?;
    mesos_task.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let five = opened(&d.c.report("mfive")?, false);
    let docker_task = d.launch("dthree", &image, 3, true)?;
    let out = d.c.agent.wait_stdout("dthree", "waiting", TASK_TIMEOUT)?;
    println!("dthree printed:\n{out}");
    let three = opened(&ProbeReport::parse(&out), false);
    check(
        five.len() == 5 && three.len() == 3 && five.is_disjoint(&three),
        format!("the Mesos task holds {five:?}, the Docker task {three:?}"),
    )?;
    check(
        d.docker_reservations()?.len() == 1,
        format!("Docker reservations: {:?}", d.docker_reservations()),
    )?;
    drop(docker_task);
    d.wait_released("the killed Docker task's GPUs")?;
    d.c.release("mfive")?;
    mesos_task.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.c.wait_all_released()
}

/// A Docker task the pool cannot serve (7 of 8 GPUs reserved outside Mesos, 2 asked) fails
/// with a status message that says how many were asked and how many are free.
fn v1_docker_task_the_pool_cannot_serve_fails_saying_why() -> TestResult {
    let mut d = DockerCluster::start()?;
    let image = d.image(false)?;
    let s = d.c.scratch.path();
    let outside = "0d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f12";
    let docker_args = |args: &[&str]| -> TestResult<String> {
        let out = std::process::Command::new(mesos_gpu_exe()?)
            .arg("--nvml-lib")
            .arg(d.c.sim.lib_path())
            .arg("--dev-root")
            .arg(d.c.dev.path())
            .arg("docker-args")
            .arg("--pool-dir")
            .arg(s.join("pool"))
            .arg("--docker-state-dir")
            .arg(s.join("outside"))
            .args(args)
            .output()?;
        check(
            out.status.success(),
            format!(
                "docker-args {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    docker_args(&["--gpus", "7", "--container-id", outside])?;
    let mut task = d.launch("dtoo", &image, 2, false)?;
    task.wait_state("TASK_FAILED", TASK_TIMEOUT)?;
    let out = task.output();
    println!("mesos-execute printed:\n{out}");
    check(
        out.contains("2 asked") && out.contains("1 free"),
        format!("the status message does not say why: {out}"),
    )?;
    docker_args(&["--release", outside])?;
    Ok(())
}

/// Agent SIGKILL and restart: the running Docker task keeps its GPUs (its `docker run`, the
/// wrapper, runs on under the Docker executor), a new Docker task after the restart gets other
/// GPUs, and the GPUs come back when the task finishes.
fn v1_docker_agent_sigkill_keeps_gpus() -> TestResult {
    let mut d = DockerCluster::start()?;
    let image = d.image(false)?;
    let mut task = d.launch("dkeep", &image, 4, true)?;
    let out = d.c.agent.wait_stdout("dkeep", "waiting", TASK_TIMEOUT)?;
    let four = opened(&ProbeReport::parse(&out), false);
    check(four.len() == 4, format!("dkeep opened {four:?}"))?;
    let before = d.docker_reservations()?;
    d.c.agent.kill()?;
    d.c.agent.restart()?;
    check(
        d.docker_reservations()? == before,
        format!(
            "after the restart the pool holds {:?}, before {before:?}",
            d.docker_reservations()
        ),
    )?;
    let mut other = d.launch("dafter", &image, 4, false)?;
    let out2 = d.c.agent.wait_stdout("dafter", "done", TASK_TIMEOUT)?;
    println!("dafter printed:\n{out2}");
    let after = opened(&ProbeReport::parse(&out2), false);
    check(
        after.len() == 4 && after.is_disjoint(&four),
        format!("dafter opened {after:?}, dkeep holds {four:?}"),
    )?;
    other.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.release("dkeep")?;
    task.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.wait_released("dkeep's GPUs")?;
    Ok(())
}

/// A Docker task whose launch fails after its GPUs were reserved (its image cannot be pulled:
/// there is no registry) gives them back when the agent removes its executor.
fn v1_docker_launch_failure_gives_gpus_back() -> TestResult {
    let d = DockerCluster::start()?;
    let missing = format!("{}:1", mesos_gpu_testkit::unique_name("mgpu-no-such-image"));
    let mut task = d.launch("dmissing", &missing, 2, false)?;
    task.wait_state("TASK_FAILED", TASK_TIMEOUT)?;
    println!("mesos-execute printed:\n{}", task.output());
    d.wait_released("the failed Docker task's GPUs")?;
    Ok(())
}

/// A Docker task whose container dies (`docker kill` from outside Mesos) gives its GPUs back:
/// its `docker run` ends, and the wrapper releases them.
fn v1_docker_container_dies_gives_gpus_back() -> TestResult {
    let mut d = DockerCluster::start()?;
    let image = d.image(false)?;
    let mut task = d.launch("ddies", &image, 3, true)?;
    d.c.agent.wait_stdout("ddies", "waiting", TASK_TIMEOUT)?;
    let held = d.docker_reservations()?;
    check(held.len() == 1, format!("Docker reservations: {held:?}"))?;
    let name = format!("mesos-{}", held[0]);
    let out = std::process::Command::new("docker")
        .args(["kill", &name])
        .output()?;
    check(
        out.status.success(),
        format!(
            "docker kill {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    task.wait_state("TASK_FAILED", TASK_TIMEOUT)?;
    d.wait_released("the dead container's GPUs")?;
    Ok(())
}

/// An agent SIGKILLed between its hook's reservation and `docker run` (its image pull never
/// ends): while the agent runs the reservation is alive (`gpu release --dead` keeps it, the
/// container is being started); after the restart the pool frees it (the agent that would
/// start it is gone and the daemon has no such container), `docker-args` does not record it
/// again, and a `gpus:8` Docker task gets every GPU.
fn v1_docker_agent_sigkill_before_docker_run_frees_gpus() -> TestResult {
    let mut d = DockerCluster::start()?;
    let stalled = format!("{}:1", mesos_gpu_testkit::unique_name(STALL));
    let task = d.launch("dstall", &stalled, 3, false)?;
    let pid_file = d.c.scratch.path().join("stalled.pid");
    wait_for(
        TASK_TIMEOUT,
        || "the agent to reserve and stall in its image pull".to_owned(),
        || (pid_file.exists() && d.docker_reservations().is_ok_and(|r| r.len() == 1)).then_some(()),
    )?;
    let owners = d.docker_owners()?;
    println!("while the agent pulls: {owners:?}");
    let starter = owners[0].1["starter"]["pid"].as_u64().unwrap_or(0);
    check(
        owners[0].1["daemon"] == "unix:///var/run/docker.sock"
            && std::fs::read_to_string(format!("/proc/{starter}/cmdline"))
                .is_ok_and(|c| c.contains("mesos-agent")),
        format!("the reservation's starter is not the agent: {owners:?}"),
    )?;
    let kept = d.mesos_gpu(&["gpu", "release", "--dead"])?;
    println!("gpu release --dead while the agent pulls:\n{kept}");
    check(
        kept.contains("no dead owner") && d.docker_reservations()?.len() == 1,
        format!("a reservation being started was freed: {kept}"),
    )?;
    d.c.agent.kill()?;
    let list = d.mesos_gpu(&["gpu", "list"])?;
    println!("gpu list after the agent's SIGKILL:\n{list}");
    check(
        list.contains("dead") && list.contains("has no Docker container mesos-"),
        format!("the reservation is not dead once its agent is gone: {list}"),
    )?;
    d.c.agent.restart()?;
    d.wait_released("the GPUs reserved by the killed agent")?;
    drop(task);
    let image = d.image(false)?;
    let mut all = d.launch("deight", &image, 8, false)?;
    let out = d.c.agent.wait_stdout("deight", "done", TASK_TIMEOUT)?;
    let eight = opened(&ProbeReport::parse(&out), false);
    check(eight.len() == 8, format!("deight opened {eight:?}: {out}"))?;
    all.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.wait_released("deight's GPUs")
}

/// A Docker task whose image asks for the driver and needs a newer CUDA
/// (`com.nvidia.cuda.version=99.0`) than the driver's fails with a status message saying so,
/// and reserves nothing.
fn v1_docker_image_needing_newer_cuda_fails_saying_so() -> TestResult {
    let mut d = DockerCluster::start()?;
    let image = d.image_with(&[
        "com.nvidia.volumes.needed=nvidia_driver",
        "com.nvidia.cuda.version=99.0",
    ])?;
    let mut task = d.launch("dcuda", &image, 1, false)?;
    task.wait_state("TASK_FAILED", TASK_TIMEOUT)?;
    let out = task.output();
    println!("mesos-execute printed:\n{out}");
    check(
        out.contains("image needs CUDA 99.0") && out.contains("supports CUDA up to"),
        format!("the status message does not say why: {out}"),
    )?;
    d.wait_released("nothing reserved")
}

/// Issue 24: an agent whose module and Docker hook load NVML through `--nvml-lib` (the module's
/// `nvml_lib`), and whose `--docker` program is the shipped wrapper, which names no NVML library
/// (the Docker executor's environment has no `LD_LIBRARY_PATH` either, so it sees no GPU): two
/// `gpus:4` Docker tasks, the second launched once the first runs, get disjoint GPUs (what each container could
/// open, and `docker inspect`'s `.HostConfig.Devices`), and while both run the pool keeps both
/// reservations, four real UUIDs each.
fn v1_docker_tasks_get_disjoint_gpus_through_the_shipped_wrapper() -> TestResult {
    let setup = ModuleSetup {
        nvml_lib: true,
        shipped_wrapper: true,
        ..EXPLICIT_ROOT
    };
    let mut d = DockerCluster::start_with(None, AgentCgroups::V1, &setup, None)?;
    let image = d.image(false)?;
    let first = d.launch("dfirst", &image, 4, true)?;
    // The second is launched once the first runs, so the first's wrapper has opened the pool
    // (where a wrapper that sees no GPU used to drop or blank the first's reservation).
    d.c.agent.wait_stdout("dfirst", "waiting", TASK_TIMEOUT)?;
    let second = d.launch("dsecond", &image, 4, true)?;
    let mut held = Vec::new();
    for name in ["dfirst", "dsecond"] {
        let out = d.c.agent.wait_stdout(name, "waiting", TASK_TIMEOUT)?;
        println!("{name} printed:\n{out}");
        held.push(docker_nodes(&ProbeReport::parse(&out), 4, &out)?);
    }
    check(
        held[0].is_disjoint(&held[1]),
        format!(
            "both Docker tasks opened GPUs {:?} and {:?}",
            held[0], held[1]
        ),
    )?;
    let path = d.c.scratch.path().join("pool/gpu/pool.json");
    let pool: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut devices = Vec::new();
    let mut uuids = BTreeSet::new();
    for id in d.docker_reservations()? {
        let gpus: Vec<String> = pool["reservations"][id.as_str()]["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| g.as_str().unwrap_or_default().to_owned())
            .collect();
        check(
            gpus.len() == 4 && gpus.iter().all(|g| g.starts_with("GPU-")),
            format!("reservation {id} holds {gpus:?}: {pool}"),
        )?;
        uuids.extend(gpus);
        let out = d
            .docker()
            .args(["inspect", "--format", "{{json .HostConfig.Devices}}"])
            .arg(format!("mesos-{id}"))
            .output()?;
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let gpu_nodes: BTreeSet<String> = listed
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|dev| dev["PathOnHost"].as_str())
            .filter(|p| {
                p.rsplit('/')
                    .next()
                    .is_some_and(|n| n.trim_start_matches("nvidia").parse::<u32>().is_ok())
            })
            .map(str::to_owned)
            .collect();
        devices.push(gpu_nodes);
    }
    check(
        uuids.len() == 8
            && devices.len() == 2
            && devices[0].len() == 4
            && devices[0].is_disjoint(&devices[1]),
        format!("the pool holds {uuids:?}; the containers have GPU devices {devices:?}: {pool}"),
    )?;
    for (name, mut task) in [("dfirst", first), ("dsecond", second)] {
        d.release(name)?;
        task.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    }
    d.wait_released("the Docker tasks' GPUs")
}

/// dockerd restarts (a private daemon; the agent's `--docker_socket` and the hook's
/// `docker-args --docker-socket` name it). With `--live-restore` the running container keeps
/// running and keeps its GPUs, whatever Mesos then does with the task. Without it, while the
/// agent is down, the daemon's restart kills the container; the restarted agent's module frees
/// its GPUs (the wrapper that started it is gone and the daemon says `exited`), and a `gpus:8`
/// Docker task then gets every GPU.
fn v1_docker_daemon_restart() -> TestResult {
    let mut daemon = PrivateDockerd::start(true)?;
    let mut d = DockerCluster::start_on(Some(&daemon.socket()), AgentCgroups::V1)?;
    let image = d.image(false)?;

    let live = d.launch("dlive", &image, 2, true)?;
    d.c.agent.wait_stdout("dlive", "waiting", TASK_TIMEOUT)?;
    let held = d.docker_reservations()?;
    check(held.len() == 1, format!("Docker reservations: {held:?}"))?;
    let name = format!("mesos-{}", held[0]);
    daemon.restart(true)?;
    let status = daemon.status(&name);
    let kept = d.mesos_gpu(&["gpu", "release", "--dead"])?;
    println!(
        "after a live-restore restart of dockerd: {name} is {status}; gpu release --dead:\n{kept}\nmesos-execute:\n{}",
        live.output()
    );
    if status == "running" {
        check(
            d.docker_reservations()? == held,
            format!("a running container lost its GPUs: {:?}", d.docker_owners()),
        )?;
    }
    // Whatever Mesos makes of the task now, the container keeps its GPUs while it runs; then
    // let it end.
    let watch_until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < watch_until {
        let reserved = d.docker_reservations()? == held;
        let status = daemon.status(&name);
        check(
            reserved || status != "running",
            format!(
                "{name} is {status} without its GPUs: {:?}",
                d.docker_owners()
            ),
        )?;
        std::thread::sleep(Duration::from_millis(200));
    }
    d.release("dlive")?;
    wait_for(
        TASK_TIMEOUT,
        || format!("{name} to end"),
        || (daemon.status(&name) != "running").then_some(()),
    )?;
    // Its `docker run` (and so its wrapper) ended with the daemon, and the hook's release at
    // executor removal keeps the GPUs of a container still running: then the pool frees them
    // at its next reconciliation, here `gpu release --dead`.
    wait_for(
        TASK_TIMEOUT,
        || format!("{name}'s reservation to be dead or gone"),
        || {
            let gone = d.docker_reservations().ok()?.is_empty();
            let list = d.mesos_gpu(&["gpu", "list"]).ok()?;
            (gone || list.contains(" dead ")).then_some(())
        },
    )?;
    let freed = d.mesos_gpu(&["gpu", "release", "--dead"])?;
    println!("gpu release --dead once {name} ended:\n{freed}");
    d.wait_released("dlive's GPUs")?;
    println!(
        "dlive after the live-restore restart: {:?}; {name} {}",
        live.task_states("dlive"),
        daemon.status(&name)
    );
    drop(live);

    daemon.restart(false)?;
    let dies = d.launch("ddies", &image, 2, true)?;
    d.c.agent.wait_stdout("ddies", "waiting", TASK_TIMEOUT)?;
    let owners = d.docker_owners()?;
    check(
        owners.len() == 1,
        format!("Docker reservations: {owners:?}"),
    )?;
    let name = format!("mesos-{}", owners[0].0);
    let wrapper = owners[0].1["starter"]["pid"].as_u64().unwrap_or(0);
    d.c.agent.kill()?;
    daemon.restart(false)?;
    println!(
        "after a restart of dockerd: {name} is {}",
        daemon.status(&name)
    );
    wait_for(
        TASK_TIMEOUT,
        || format!("the wrapper {wrapper} of {name} to end"),
        || (!Path::new(&format!("/proc/{wrapper}")).exists()).then_some(()),
    )?;
    let list = d.mesos_gpu(&["gpu", "list"])?;
    println!("gpu list with the agent down:\n{list}");
    check(
        list.contains(&format!("Docker container {name} is exited")),
        format!("the dead container's reservation is not dead: {list}"),
    )?;
    d.c.agent.restart()?;
    d.wait_released("the dead container's GPUs")?;
    drop(dies);
    let mut all = d.launch("deight", &image, 8, false)?;
    let out = d.c.agent.wait_stdout("deight", "done", TASK_TIMEOUT)?;
    let eight = opened(&ProbeReport::parse(&out), false);
    check(eight.len() == 8, format!("deight opened {eight:?}: {out}"))?;
    all.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    d.wait_released("deight's GPUs")
}

/// Docker tasks on a cgroup v2 agent cannot run: Mesos 1.12 refuses to create its Docker
/// containerizer unless a cgroup v1 hierarchy with the `cpu` controller is mounted
/// (`src/docker/docker.cpp` 143-151, `Docker::create` with `validate`, which
/// `src/slave/containerizer/docker.cpp` 184-188 always passes), and on a cgroup v2 host the
/// `cpu` controller belongs to the v2 hierarchy. The agent (in its mount namespace with only
/// cgroup2 at /sys/fs/cgroup, as every v2 trial) exits saying so.
fn v2_docker_containerizer_refused_by_mesos() -> TestResult {
    let Err(e) = DockerCluster::start_on(None, AgentCgroups::V2) else {
        return Err("a cgroup v2 agent started its Docker containerizer".into());
    };
    let text = e.to_string();
    println!("{}", mesos_gpu_testkit::mesos::tail(&text, 2));
    check(
        text.contains("Could not create DockerContainerizer")
            && text.contains("Failed to find a mounted cgroups hierarchy for the 'cpu' subsystem"),
        format!("the agent did not fail as Mesos 1.12 does: {text}"),
    )
}

/// Issue 18: NUMA pinning in a real agent. nvml-sim's `numa-2cpu` (2 T4s local to CPU 0 and
/// CPU 1, this machine's two CPUs, memory node 0), the module with `numa_pinning=on`; tasks
/// print the `Cpus_allowed_list` and `Mems_allowed_list` the kernel gives them.
fn numa_trials(host: &Host) -> Vec<Trial> {
    let v1: &[Need] = &[
        Need::Root,
        Need::Cgroup1,
        Need::Cpuset1,
        Need::Cc,
        Need::Mesos,
    ];
    let v2: &[Need] = &[
        Need::Root,
        Need::Cgroup2,
        Need::Cpuset2,
        Need::Cc,
        Need::Mesos,
    ];
    let own = format!("filesystem/linux,cgroups/devices,{MODULE}");
    let mesos = format!("filesystem/linux,cgroups/devices,cgroups/cpuset,{MODULE}");
    let v2_isolation = format!("filesystem/linux,{MODULE}");
    vec![
        needs(
            host,
            v1,
            trial(
                "v1_tasks_pinned_in_the_module_cpuset_cgroup".to_owned(),
                move || numa_tasks_pinned(AgentCgroups::V1, &own),
            ),
        ),
        needs(
            host,
            v1,
            trial(
                "v1_tasks_pinned_in_mesos_cpuset_cgroup".to_owned(),
                move || numa_tasks_pinned(AgentCgroups::V1, &mesos),
            ),
        ),
        needs(
            host,
            v2,
            trial(
                "v2_tasks_pinned_on_mesos_container_cgroup".to_owned(),
                move || numa_tasks_pinned(AgentCgroups::V2, &v2_isolation),
            ),
        ),
    ]
}

/// The GPUs of `numa-2cpu` by UUID, with the CPU each is local to.
const NUMA_GPUS: [(&str, &str); 2] = [
    ("GPU-4b1d2c30-2f4e-4a6b-8c0d-0e1f2a3b4c50", "0"),
    ("GPU-4b1d2c31-2f4e-4a6b-8c0d-0e1f2a3b4c51", "1"),
];

/// Two tasks holding one GPU each at the same time see exactly their GPU's CPU and memory node
/// 0; a task asking for more CPUs than its GPU has is left on every CPU, and the agent's log
/// says why; the module leaves no cpuset cgroup behind.
fn numa_tasks_pinned(cgroups: AgentCgroups, isolation: &str) -> TestResult {
    let install = install()?;
    let module = module()?;
    let sim = SimNode::shipped("numa-2cpu");
    let dev = DevNodes::nvidia(&[0, 1])?;
    let scratch = tempfile::Builder::new()
        .prefix("mgpu-mesos-numa")
        .tempdir()?;
    let master = Master::start(&install)?;
    let mut spec = AgentSpec::new(isolation, cgroups, 2);
    let params: Vec<(String, String)> = vec![
        (
            "work_dir".into(),
            scratch.path().join("module-work").display().to_string(),
        ),
        ("dev_root".into(), dev.path().display().to_string()),
        ("driver_volume".into(), "off".into()),
        ("policy".into(), "first-fit".into()),
        ("numa_pinning".into(), "on".into()),
        (
            "pool_dir".into(),
            scratch.path().join("pool").display().to_string(),
        ),
    ];
    let modules = scratch.path().join("modules.json");
    std::fs::write(&modules, modules_json(&module, &params).to_string())?;
    spec.modules = Some(modules);
    spec.env
        .push(("LD_LIBRARY_PATH".into(), sim.dir().display().to_string()));
    let agent = Agent::start(&install, &master, spec)?;
    let root = agent.spec().cgroups_root.clone();

    let show =
        "echo gpu=$CUDA_VISIBLE_DEVICES; grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status";
    let go = |name: &str| scratch.path().join(format!("{name}.go"));
    let mut tasks = Vec::new();
    for name in ["near-a", "near-b"] {
        let command = format!(
            "{show}; while [ ! -e {} ]; do sleep 0.2; done",
            go(name).display()
        );
        // cpus:0.9 plus the command executor's 0.1 is one CPU: as many as one GPU has.
        tasks.push(Task::launch(
            &install,
            &master,
            name,
            "cpus:0.9;mem:32;gpus:1",
            &command,
        )?);
    }
    let mut seen = Vec::new();
    for name in ["near-a", "near-b"] {
        let out = agent.wait_stdout(name, "Mems_allowed_list", TASK_TIMEOUT)?;
        println!("task {name} printed:\n{}", out.trim_end());
        let field = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_owned())
                .ok_or(format!("no {key} in {out:?}"))
        };
        let gpu = field("gpu=")?;
        let (_, cpu) = NUMA_GPUS
            .iter()
            .find(|(uuid, _)| *uuid == gpu)
            .ok_or(format!("task {name} has GPU {gpu:?}"))?;
        let cpus = field("Cpus_allowed_list:")?;
        check(
            cpus == *cpu,
            format!("task {name} with {gpu} may run on CPUs {cpus:?}, expected {cpu:?}"),
        )?;
        check(
            field("Mems_allowed_list:")? == "0",
            format!("task {name}: {out}"),
        )?;
        seen.push(gpu);
    }
    seen.sort();
    check(
        seen.len() == 2 && seen[0] != seen[1],
        format!("GPUs {seen:?}"),
    )?;
    for (name, task) in ["near-a", "near-b"].iter().zip(tasks.iter_mut()) {
        std::fs::write(go(name), b"")?;
        task.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    }

    let mut greedy = Task::launch(&install, &master, "greedy", "cpus:1.5;mem:32;gpus:1", show)?;
    greedy.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
    let out = agent.wait_stdout("greedy", "Mems_allowed_list", TASK_TIMEOUT)?;
    println!("task greedy printed:\n{}", out.trim_end());
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    check(
        out.contains(&format!("Cpus_allowed_list:\t{}", online.trim())),
        format!("greedy task not on every CPU ({}): {out}", online.trim()),
    )?;
    agent.wait_log("fewer than the cpus=1.6", TASK_TIMEOUT)?;

    if cgroups == AgentCgroups::V1 && !isolation.contains("cgroups/cpuset") {
        let parent = Path::new("/sys/fs/cgroup/cpuset").join(&root);
        // The agent cleans a container up after its task's last status update: wait for it.
        let left = || -> Vec<std::ffi::OsString> {
            std::fs::read_dir(&parent)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name())
                .collect()
        };
        wait_for(
            TASK_TIMEOUT,
            || {
                format!(
                    "cpuset cgroups left under {}: {:?}",
                    parent.display(),
                    left()
                )
            },
            || left().is_empty().then_some(()),
        )?;
    }
    Ok(())
}

/// One trial per shipped node (`mesos-gpu info --simulate list`, nvml-sim's topologies) and
/// cgroup version: the agent started with exactly what `mesos-gpu agent-flags` printed.
fn agent_flags_trials(host: &Host) -> Vec<Trial> {
    let mut trials = Vec::new();
    for (node, _) in nvml_sim::TOPOLOGIES {
        for (cgroups, need) in [
            (AgentCgroups::V1, Need::Cgroup1),
            (AgentCgroups::V2, Need::Cgroup2),
        ] {
            let name = format!(
                "agent_flags_start_the_agent_{}_{node}",
                if cgroups == AgentCgroups::V1 {
                    "v1"
                } else {
                    "v2"
                }
            );
            trials.push(needs(
                host,
                &[Need::Root, need, Need::Cc, Need::Mesos],
                trial(name, move || agent_flags_start_the_agent(node, cgroups)),
            ));
        }
    }
    trials
}

/// `mesos-gpu agent-flags` run as an operator would on the node (its NVML, device nodes and
/// driver files given with `--nvml-lib`, `--dev-root` and `--proc-root`), then a real agent
/// started with exactly the flags it printed, unquoted by the shell as `agent.sh` does: it
/// loads the module with the printed `--modules`, registers, and offers the `gpus` the node
/// has (every healthy GPU not in MIG mode, and every MIG device the driver numbers). A node
/// without GPUs gets the same agent's flags without the module, which start it (before: its
/// `--resources` only, and on cgroup v1 the agent, on Mesos's default `posix/cpu,posix/mem`,
/// aborted at start on `Check failed: !subsystemSet.empty()`).
fn agent_flags_start_the_agent(node: &str, cgroups: AgentCgroups) -> TestResult {
    let install = install()?;
    let module = module()?;
    let (sim, inventory, dev) = sim_with_nodes(node)?;
    let scratch = tempfile::Builder::new()
        .prefix("mgpu-mesos-flags")
        .tempdir()?;
    let work = scratch.path().join("work");
    let version = if cgroups == AgentCgroups::V1 {
        "v1"
    } else {
        "v2"
    };
    let path = |p: &Path| p.display().to_string();
    let out = std::process::Command::new(mesos_gpu_exe()?)
        .args(["--nvml-lib", &path(&sim.lib_path())])
        .args(["--dev-root", &path(dev.path())])
        .args(["--proc-root", &path(&sim.proc_root())])
        .args(["agent-flags", "--cgroups", version])
        .args(["--resources", "cpus:4;mem:4096"])
        .args(["--agent-work-dir", &path(&work)])
        .args(["--pool-dir", &path(&scratch.path().join("pool"))])
        .args(["--volume-root", &path(&scratch.path().join("volumes"))])
        .args(["--module-library", &path(&module)])
        .env("MESOS_GPU_LOG", "warn")
        .output()?;
    let printed = String::from_utf8(out.stdout)?;
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    check(
        out.status.success(),
        format!("agent-flags on {node} failed: {said}"),
    )?;
    println!("{node} {version}: agent-flags printed\n{printed}{said}");
    let flags = shell_words(&printed)?;
    let whole = inventory.whole_gpus().filter(|g| g.healthy).count();
    let mig = inventory
        .mig
        .devices
        .iter()
        .filter(|d| d.healthy && d.caps.is_some())
        .count();
    let expected = whole + mig;
    if inventory.gpus.is_empty() {
        check(
            flags.iter().any(|f| f.starts_with("--isolation="))
                && !flags
                    .iter()
                    .any(|f| f.contains(MODULE) || f.starts_with("--modules"))
                && said.contains("no GPU flags to add"),
            format!(
                "{node}: a node without GPUs gets the agent's flags without the module: \
                 {printed:?} {said:?}"
            ),
        )?;
    } else {
        check(
            flags.iter().any(|f| f.starts_with("--modules={")),
            format!("{node}: no --modules: {flags:?}"),
        )?;
    }
    let master = Master::start(&install)?;
    let mut spec = AgentSpec::with_flags(cgroups, flags);
    spec.work_dir = Some(work);
    let agent = Agent::start(&install, &master, spec)?;
    let state: serde_json::Value = serde_json::from_str(&http_get(agent.port(), "/state")?)?;
    let gpus = state["resources"]["gpus"].as_f64().unwrap_or(0.0);
    check(
        gpus == expected as f64,
        format!(
            "{node} {version}: the agent offers gpus:{gpus}, the node has {expected}: {}",
            state["resources"]
        ),
    )?;
    if !inventory.gpus.is_empty() {
        agent.wait_log("GPU isolator ready", TASK_TIMEOUT)?;
    }
    Ok(())
}
