//! A process that cannot see the node's GPUs never changes another's reservation (issue 24).
//!
//! The matrix: every command that opens the node's GPU pool (`exec`, `run`, `docker-args`,
//! `docker-args --release`, `docker-wrapper`, `serve`, `gpu list`, `gpu release --dead`, and the
//! agent module's `recover`, run as the Rust isolator with the module's role) times every way of
//! not seeing the GPUs that were recorded:
//!
//! - `nvml_missing`: no `libnvidia-ml.so.1` to load (this host has none);
//! - `driver_not_loaded`: NVML answers `NVML_ERROR_DRIVER_NOT_LOADED` at init (nvml-sim `fail`);
//! - `nvml_unknown`: NVML answers `NVML_ERROR_UNKNOWN` at init;
//! - `fewer_gpus`: the node shows GPUs 0-3 of the 8 recorded (the others fell off the bus).
//!
//! Each trial seeds a pool on a simulated DGX-1 (8 GPUs) with reservations of live owners made
//! with a full view: two `docker-args` reservations of one work directory (their starter a live
//! process), an `exec` running `sleep`, and a container of the module (the Rust isolator with
//! the agent's role, in this process); GPUs 4-7 hold all but one of them. Then it runs the
//! command with the view, and checks that every seeded reservation is byte for byte as it was,
//! in `pool.json` and in every checkpoint (the wrapper's own reservation aside, which it claims
//! and then releases), that no GPU is listed twice and no UUID empty, that requests for GPUs the
//! process cannot see are refused saying why, and that `gpu list` shows every record, naming the
//! GPUs it cannot map. Docker is a small daemon of this test on a unix socket (version, an empty
//! container list, image labels), so that no other test's container takes part.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_isolator::lifecycle::{
    CgroupChoice, ContainerId, Isolator, IsolatorConfig, PoolConfig, PoolRole, PrepareConfig,
    RecoverState,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::discovery::{Discovery, GpuDriver};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_testkit::dockerd::FakeDockerd;
use mesos_gpu_testkit::mesos::DevNodes;
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs, unique_name};
use serde_json::Value;

type TestResult<T = ()> = Result<T, Failed>;

/// How the command under test sees the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    NvmlMissing,
    DriverNotLoaded,
    NvmlUnknown,
    FewerGpus,
}

const VIEWS: [View; 4] = [
    View::NvmlMissing,
    View::DriverNotLoaded,
    View::NvmlUnknown,
    View::FewerGpus,
];

/// The commands that open the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    Exec,
    Run,
    DockerArgs,
    DockerArgsRelease,
    DockerWrapper,
    Serve,
    GpuList,
    GpuReleaseDead,
    ModuleRecover,
}

const COMMANDS: [Cmd; 9] = [
    Cmd::Exec,
    Cmd::Run,
    Cmd::DockerArgs,
    Cmd::DockerArgsRelease,
    Cmd::DockerWrapper,
    Cmd::Serve,
    Cmd::GpuList,
    Cmd::GpuReleaseDead,
    Cmd::ModuleRecover,
];

impl View {
    fn name(self) -> &'static str {
        match self {
            View::NvmlMissing => "nvml_missing",
            View::DriverNotLoaded => "driver_not_loaded",
            View::NvmlUnknown => "nvml_unknown",
            View::FewerGpus => "fewer_gpus",
        }
    }

    /// The simulated NVML of this view (`None`: none is loadable).
    fn sim(self) -> Option<SimNode> {
        let mut json: Value = serde_json::from_str(&shipped_json()).unwrap();
        match self {
            View::NvmlMissing => return None,
            View::DriverNotLoaded | View::NvmlUnknown => {
                let error = if self == View::DriverNotLoaded {
                    "NVML_ERROR_DRIVER_NOT_LOADED"
                } else {
                    "NVML_ERROR_UNKNOWN"
                };
                json["fail"] =
                    serde_json::json!({ "nvmlInit_v2": error, "nvmlInitWithFlags": error });
            }
            View::FewerGpus => {
                let gpus = json["gpus"].as_array_mut().unwrap();
                gpus.truncate(4);
                for gpu in gpus {
                    if let Some(links) = gpu["nvlinks"].as_array_mut() {
                        links.retain(|l| l["peer"].as_u64().is_some_and(|p| p < 4));
                    }
                }
            }
        }
        Some(SimNode::from_json(&json.to_string()))
    }
}

impl Cmd {
    fn name(self) -> &'static str {
        match self {
            Cmd::Exec => "exec",
            Cmd::Run => "run",
            Cmd::DockerArgs => "docker_args",
            Cmd::DockerArgsRelease => "docker_args_release",
            Cmd::DockerWrapper => "docker_wrapper",
            Cmd::Serve => "serve",
            Cmd::GpuList => "gpu_list",
            Cmd::GpuReleaseDead => "gpu_release_dead",
            Cmd::ModuleRecover => "module_recover",
        }
    }
}

fn main() -> ExitCode {
    let host = Host::probe();
    let mut trials = Vec::new();
    for cmd in COMMANDS {
        for view in VIEWS {
            trials.push(needs(
                &host,
                &[Need::Root, Need::Cgroup1],
                Trial::test(
                    format!("keeps_live_reservations::{}::{}", cmd.name(), view.name()),
                    move || cell(cmd, view),
                ),
            ));
        }
    }
    trials.push(needs(
        &host,
        &[Need::Root],
        Trial::test(
            "records_written_without_uuids_are_listed_and_repaired_by_the_next_command",
            records_without_uuids_repaired_by_commands,
        ),
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// Issue 34 item 7: a pool holding records an earlier release wrote with empty UUIDs
/// (`"gpus": [""]`) no longer stops every command. `gpu list` lists them; `docker-args` (which
/// sees the GPUs) drops the one whose owner is gone and, while a live owner's GPUs cannot be read
/// off its devices, refuses saying why; once that owner ends, it grants, and no record is left
/// holding a GPU it does not name.
fn records_without_uuids_repaired_by_commands() -> TestResult {
    use mesos_gpu_pool::Pool;
    let sim = SimNode::from_json(&shipped_json());
    let dev = DevNodes::nvidia(&(0..8).collect::<Vec<u32>>())?;
    let scratch = tempfile::Builder::new()
        .prefix("mgpu-test-unnamed")
        .tempdir()?;
    let pool_dir = scratch.path().join("pool");
    let host = mesos_gpu_pool::Host::default();
    let mut live = Command::new("sleep").arg("600").spawn()?;
    let mut gone = Command::new("sleep").arg("600").spawn()?;
    let gone_stamp = host.stamp(gone.id())?;
    gone.kill()?;
    gone.wait()?;
    let record = |process, unnamed| mesos_gpu_testkit::pool::without_uuids(process, None, unnamed);
    {
        let mut tx = Pool::at(&pool_dir).begin()?;
        let r = &mut tx.state.reservations;
        r.insert("live".into(), record(host.stamp(live.id())?, 2));
        r.insert("gone".into(), record(gone_stamp, 1));
        tx.commit()?;
    }
    let mesos_gpu = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
        cmd.env("MESOS_GPU_LOG", "warn")
            .env_remove("MESOS_GPU_NVML_LIB")
            .env_remove("LD_LIBRARY_PATH")
            .arg("--nvml-lib")
            .arg(sim.lib_path())
            .arg("--dev-root")
            .arg(dev.path());
        cmd
    };
    let listed = mesos_gpu()
        .args(["gpu", "list", "--pool-dir"])
        .arg(&pool_dir)
        .output()?;
    check(
        listed.status.success() && text(&listed).contains("2 GPU(s) recorded without a UUID"),
        || format!("gpu list: {}", text(&listed)),
    )?;
    let docker_args = || {
        let mut cmd = mesos_gpu();
        cmd.args([
            "docker-args",
            "--gpus",
            "1",
            "--plugin",
            "--docker-state-dir",
        ])
        .arg(scratch.path().join("docker-work"))
        .arg("--pool-dir")
        .arg(&pool_dir);
        cmd
    };
    let refused = docker_args().output()?;
    check(
        !refused.status.success()
            && text(&refused)
                .contains("2 GPU(s) are held by live owners whose records do not say which"),
        || {
            format!(
                "docker-args beside a live unnamed record: {}",
                text(&refused)
            )
        },
    )?;
    let pool: Value =
        serde_json::from_str(&std::fs::read_to_string(pool_dir.join("gpu/pool.json"))?)?;
    check(
        pool["reservations"]["gone"].is_null()
            && pool["reservations"]["live"]["gpus"] == serde_json::json!(["", ""]),
        || format!("the gone owner's record dropped, the live one's kept: {pool}"),
    )?;
    live.kill()?;
    live.wait()?;
    let granted = docker_args().output()?;
    check(granted.status.success(), || {
        format!("docker-args once the owner ended: {}", text(&granted))
    })?;
    let pool = Pool::at(&pool_dir).read()?;
    check(pool.unnamed().is_empty(), || {
        format!("records still hold GPUs without naming them: {pool:?}")
    })?;
    Ok(())
}

fn shipped_json() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/topologies/dgx1-v100.json"),
    )
    .unwrap()
}

fn check(ok: bool, what: impl FnOnce() -> String) -> TestResult {
    if ok { Ok(()) } else { Err(what().into()) }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Two seeded Docker reservations' container ids.
const D1: &str = "1d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11";
const D2: &str = "2d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f12";
/// A placeholder holding GPUs 0-3 while the others are seeded.
const PLACEHOLDER: &str = "0d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f10";
/// A container that holds nothing.
const NOBODY: &str = "9d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f19";
/// The module's seeded container.
const MODULE_CONTAINER: &str = "mod-1";

/// A pool seeded with live owners' reservations, torn down on drop.
struct Seed {
    full: SimNode,
    dev: DevNodes,
    scratch: tempfile::TempDir,
    root: String,
    daemon: FakeDockerd,
    /// The live starter of the Docker reservations.
    owner: Child,
    /// The running `exec`.
    exec: Option<Child>,
    /// D1's `docker-args --json` output (the wrapper's MESOS_GPU_DOCKER_ARGS).
    d1_args: String,
}

impl Seed {
    fn pool(&self) -> PathBuf {
        self.scratch.path().join("pool")
    }
    fn docker_work(&self) -> PathBuf {
        self.scratch.path().join("docker-work")
    }
    fn module_work(&self) -> PathBuf {
        self.scratch.path().join("module-work")
    }

    fn mesos_gpu(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
        cmd.env("MESOS_GPU_LOG", "warn")
            .env_remove("MESOS_GPU_NVML_LIB")
            .env_remove("LD_LIBRARY_PATH")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// `cmd` as `mesos-gpu exec` of `command` (words) with one GPU, in the seed's cgroups and pool.
    fn exec_one_gpu<'c>(&self, cmd: &'c mut Command, command: &str) -> &'c mut Command {
        cmd.args([
            "exec",
            "--gpus",
            "1",
            "--cgroup-version",
            "v1",
            "--cgroups-root",
        ])
        .arg(format!("{}-exec", self.root))
        .arg("--pool-dir")
        .arg(self.pool())
        .arg("--")
        .args(command.split_whitespace())
    }

    /// `mesos-gpu` with the full view.
    fn full_view(&self) -> Command {
        let mut cmd = self.mesos_gpu();
        cmd.arg("--nvml-lib")
            .arg(self.full.lib_path())
            .arg("--dev-root")
            .arg(self.dev.path());
        cmd
    }

    /// The module's isolator (the agent's role, its own v1 cgroups) over `inventory`.
    fn module(&self, inventory: Inventory) -> TestResult<Isolator> {
        let nodes = if inventory.gpus.is_empty() {
            DeviceNodes::default()
        } else {
            DeviceNodes::scan(self.dev.path(), &inventory)?
        };
        let mut config = IsolatorConfig::new(self.module_work());
        config.cgroup_version = CgroupChoice::V1;
        config.cgroups_root = format!("{}-module", self.root);
        config.pool = Some(PoolConfig {
            dir: self.pool(),
            role: PoolRole::Agent,
        });
        Ok(Isolator::new(config, inventory, nodes)?)
    }

    fn start() -> TestResult<Seed> {
        let full = SimNode::from_json(&shipped_json());
        let dev = DevNodes::nvidia(&(0..8).collect::<Vec<u32>>())?;
        let scratch = tempfile::Builder::new()
            .prefix("mgpu-test-unseen")
            .tempdir()?;
        let daemon = FakeDockerd::start(&scratch.path().join("docker.sock"), &[])?;
        let owner = Command::new("sleep").arg("600").spawn()?;
        let mut seed = Seed {
            full,
            dev,
            scratch,
            root: unique_name("unseen"),
            daemon,
            owner,
            exec: None,
            d1_args: String::new(),
        };
        // GPUs 0-3 are held while the others are seeded, so that these land on GPUs 4-7.
        seed.docker_args(PLACEHOLDER, 4)?;
        seed.d1_args = seed.docker_args(D1, 1)?;
        let inventory = seed.full.inventory()?;
        let module = seed.module(inventory)?;
        module.recover(&[], &[])?;
        module.prepare(
            &ContainerId::new(MODULE_CONTAINER)?,
            PrepareConfig {
                gpus: 1.0,
                ..PrepareConfig::default()
            },
        )?;
        drop(module);
        let mut exec = seed.full_view();
        seed.exec_one_gpu(&mut exec, "sleep 600")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        seed.exec = Some(exec.spawn()?);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !seed
            .reservations()?
            .values()
            .any(|r| r["owner"]["kind"] == "process")
        {
            check(Instant::now() < deadline, || {
                "the exec never reserved".into()
            })?;
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = seed
            .full_view()
            .args([
                "docker-args",
                "--release",
                PLACEHOLDER,
                "--force",
                "--work-dir",
            ])
            .arg(seed.docker_work())
            .arg("--pool-dir")
            .arg(seed.pool())
            .output()?;
        check(out.status.success(), || text(&out))?;
        seed.docker_args(D2, 2)?;
        // Every seeded owner but D2 holds GPUs 4-7 only; D2 holds two of 0-3.
        let index = seed.index_of()?;
        for (id, r) in seed.reservations()? {
            let indices: Vec<u64> = gpus(&r).iter().map(|u| index[u.as_str()]).collect();
            let want_low = id == D2;
            check(indices.iter().all(|&i| (i < 4) == want_low), || {
                format!("{id} holds GPUs {indices:?}: the seed expects GPUs 4-7 (0-3 for D2)")
            })?;
        }
        Ok(seed)
    }

    /// A `docker-args` reservation of `gpus` GPUs for container `id`; its `--json` output.
    fn docker_args(&self, id: &str, gpus: u32) -> TestResult<String> {
        let out = self
            .full_view()
            .args(["docker-args", "--plugin", "--json", "--gpus"])
            .arg(gpus.to_string())
            .args(["--container-id", id, "--starter-pid"])
            .arg(self.owner.id().to_string())
            .arg("--docker-socket")
            .arg(self.daemon.socket())
            .arg("--work-dir")
            .arg(self.docker_work())
            .arg("--pool-dir")
            .arg(self.pool())
            .output()?;
        check(out.status.success(), || text(&out))?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// NVML index of each GPU UUID of the full node.
    fn index_of(&self) -> TestResult<BTreeMap<String, u64>> {
        Ok(self
            .full
            .inventory()?
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), u64::from(g.index)))
            .collect())
    }

    fn reservations(&self) -> TestResult<BTreeMap<String, Value>> {
        let pool: Value =
            serde_json::from_str(&std::fs::read_to_string(self.pool().join("gpu/pool.json"))?)?;
        Ok(pool["reservations"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default())
    }

    /// Every checkpoint's records by (file, section, id), as JSON text.
    fn records(&self) -> TestResult<BTreeMap<(String, String, String), String>> {
        let mut files = vec![
            self.docker_work().join("gpu/allocations.json"),
            self.module_work().join("gpu/allocations.json"),
        ];
        for e in std::fs::read_dir(self.pool().join("exec"))?.flatten() {
            files.push(e.path().join("gpu/allocations.json"));
        }
        let mut out = BTreeMap::new();
        for file in files {
            let ckpt: Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
            for section in ["containers", "docker", "docker_starts", "quarantine"] {
                for (id, record) in ckpt[section].as_object().into_iter().flatten() {
                    out.insert(
                        (file.display().to_string(), section.to_owned(), id.clone()),
                        record.to_string(),
                    );
                }
            }
        }
        Ok(out)
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if let Some(exec) = &mut self.exec {
            let _ = Command::new("kill")
                .args(["-TERM", &exec.id().to_string()])
                .status();
            let _ = exec.wait();
        }
        let _ = self.owner.kill();
        let _ = self.owner.wait();
        // The module's container goes with a full view, as the agent would clean it up.
        if let Ok(inventory) = self.full.inventory()
            && let Ok(module) = self.module(inventory)
        {
            let id = ContainerId::new(MODULE_CONTAINER).unwrap();
            let state = RecoverState {
                id: id.clone(),
                parent: None,
                nested_cgroup: None,
            };
            if module.recover(&[state], &[]).is_ok() {
                let _ = module.cleanup(&id);
            }
        }
        for root in [
            format!("{}-module", self.root),
            format!("{}-exec", self.root),
        ] {
            let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/devices").join(root));
        }
    }
}

/// The GPU UUIDs of a pool reservation.
fn gpus(r: &Value) -> Vec<String> {
    r["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| g.as_str().unwrap_or_default().to_owned())
        .collect()
}

/// One cell of the matrix.
fn cell(cmd: Cmd, view: View) -> TestResult {
    let seed = Seed::start()?;
    let before = seed.reservations()?;
    let records = seed.records()?;
    let sim = view.sim();
    let mut nvml = seed.mesos_gpu();
    if let Some(sim) = &sim {
        nvml.arg("--nvml-lib").arg(sim.lib_path());
    }
    nvml.arg("--dev-root").arg(seed.dev.path());
    // What the command itself may change: the wrapper claims and releases its own reservation.
    let mut own: Option<&str> = None;
    match cmd {
        Cmd::Exec => {
            let out = seed.exec_one_gpu(&mut nvml, "true").output()?;
            expect_refusal_unless_partial(view, &out)?;
        }
        Cmd::Run => {
            // No GPU asked: the pool is opened all the same; the test daemon creates nothing.
            let out = nvml
                .args(["run", "--gpus", "0", "--docker-socket"])
                .arg(seed.daemon.socket())
                .arg("--work-dir")
                .arg(seed.docker_work())
                .arg("--pool-dir")
                .arg(seed.pool())
                .args(["img", "true"])
                .output()?;
            check(!out.status.success(), || text(&out))?;
        }
        Cmd::DockerArgs => {
            let out = nvml
                .args(["docker-args", "--gpus", "1", "--plugin", "--starter-pid"])
                .arg(seed.owner.id().to_string())
                .arg("--work-dir")
                .arg(seed.docker_work())
                .arg("--pool-dir")
                .arg(seed.pool())
                .output()?;
            expect_refusal_unless_partial(view, &out)?;
            if view == View::FewerGpus {
                // A GPU it sees and no record holds is granted.
                let args: Vec<String> = String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect();
                let index = seed.index_of()?;
                let held: BTreeSet<u64> = before
                    .values()
                    .flat_map(gpus)
                    .map(|u| index[u.as_str()])
                    .collect();
                let prefix = format!("--device={}/nvidia", seed.dev.path().display());
                let granted: Vec<u64> = args
                    .iter()
                    .filter_map(|a| a.strip_prefix(&prefix)?.split(':').next()?.parse().ok())
                    .collect();
                check(
                    granted.len() == 1 && granted[0] < 4 && !held.contains(&granted[0]),
                    || format!("granted {granted:?}; held {held:?}: {args:?}"),
                )?;
            }
        }
        Cmd::DockerArgsRelease => {
            let out = nvml
                .args(["docker-args", "--release", NOBODY, "--work-dir"])
                .arg(seed.docker_work())
                .arg("--pool-dir")
                .arg(seed.pool())
                .output()?;
            check(out.status.success(), || text(&out))?;
        }
        Cmd::DockerWrapper => {
            own = Some(D1);
            let fake = seed.scratch.path().join("docker");
            let during = seed.scratch.path().join("during.json");
            std::fs::write(
                &fake,
                format!(
                    "#!/bin/sh\ncase \" $* \" in\n  *\" run \"*) cp {} {}; echo $PPID > {}.pid;;\n  *\" inspect \"*) echo false;;\nesac\nexit 0\n",
                    seed.pool().join("gpu/pool.json").display(),
                    during.display(),
                    during.display()
                ),
            )?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
            let out = nvml
                .args(["docker-wrapper", "--docker"])
                .arg(&fake)
                .arg("--pool-dir")
                .arg(seed.pool())
                .arg("--work-dir")
                .arg(seed.docker_work())
                .arg("--")
                .arg("-H")
                .arg(format!("unix://{}", seed.daemon.socket().display()))
                .args(["run", "-e"])
                .arg(format!("MESOS_GPU_DOCKER_ARGS={}", seed.d1_args))
                .args(["--name", &format!("mesos-{D1}"), "img", "true"])
                .output()?;
            check(out.status.success(), || text(&out))?;
            // While `docker run` ran, its reservation held the same GPUs, started by the wrapper.
            let pool: Value = serde_json::from_str(&std::fs::read_to_string(&during)?)?;
            let claimed = &pool["reservations"][D1];
            let wrapper: u64 = std::fs::read_to_string(during.with_extension("json.pid"))?
                .trim()
                .parse()?;
            check(
                gpus(claimed) == gpus(&before[D1])
                    && claimed["owner"]["starter"]["pid"].as_u64() == Some(wrapper),
                || format!("during docker run: {claimed}; before: {}", before[D1]),
            )?;
        }
        Cmd::Serve => {
            let agent = seed.scratch.path().join("agent");
            let mut child = nvml
                .env("MESOS_GPU_LOG", "info")
                .args([
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--no-cdi",
                    "--driver-poll",
                    "0",
                ])
                .arg("--plugin-socket")
                .arg(seed.scratch.path().join("plugin.sock"))
                .arg("--volume-root")
                .arg(seed.scratch.path().join("volumes"))
                .arg("--agent-work-dir")
                .arg(&agent)
                .arg("--docker-socket")
                .arg(seed.daemon.socket())
                .arg("--work-dir")
                .arg(seed.docker_work())
                .arg("--pool-dir")
                .arg(seed.pool())
                .spawn()?;
            let stderr = BufReader::new(child.stderr.take().unwrap());
            let (lines, read) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in stderr.lines().map_while(Result::ok) {
                    if lines.send(line).is_err() {
                        return;
                    }
                }
            });
            let mut log = String::new();
            let mut serving = false;
            while let Ok(line) = read.recv_timeout(Duration::from_secs(60)) {
                log.push_str(&line);
                log.push('\n');
                if line.contains("serving") {
                    serving = true;
                    break;
                }
            }
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let status = child.wait()?;
            match view {
                View::NvmlUnknown => check(!serving && !status.success(), || log.clone())?,
                _ => check(serving && status.success(), || log.clone())?,
            }
        }
        Cmd::GpuList => {
            let out = nvml
                .args(["gpu", "list", "--json", "--pool-dir"])
                .arg(seed.pool())
                .output()?;
            check(out.status.success(), || text(&out))?;
            let listed: Value = serde_json::from_slice(&out.stdout)?;
            let ids: BTreeSet<&str> = listed["reservations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["id"].as_str())
                .collect();
            check(before.keys().all(|id| ids.contains(id.as_str())), || {
                format!("gpu list shows {ids:?}, the pool holds {:?}", before.keys())
            })?;
            // It names exactly the recorded GPUs it cannot map: all, or those of GPUs 4-7.
            let index = seed.index_of()?;
            let want: BTreeMap<String, Vec<String>> = before
                .iter()
                .filter_map(|(id, r)| {
                    let unseen: Vec<String> = gpus(r)
                        .into_iter()
                        .filter(|u| view != View::FewerGpus || index[u.as_str()] >= 4)
                        .collect();
                    (!unseen.is_empty()).then(|| (id.clone(), unseen))
                })
                .collect();
            let got: BTreeMap<String, Vec<String>> =
                serde_json::from_value(listed["unseen"].clone()).unwrap_or_default();
            check(got == want, || {
                format!("unseen {got:?}, expected {want:?}: {}", text(&out))
            })?;
            check(listed["unseen_why"].is_string(), || text(&out))?;
        }
        Cmd::GpuReleaseDead => {
            let out = nvml
                .args(["gpu", "release", "--dead", "--pool-dir"])
                .arg(seed.pool())
                .output()?;
            check(
                out.status.success()
                    && String::from_utf8_lossy(&out.stdout).contains("no dead owner"),
                || text(&out),
            )?;
        }
        Cmd::ModuleRecover => module_recover(&seed, view, sim.as_ref())?,
    }
    // Every reservation of a live owner is as it was, byte for byte, in the pool and in every
    // checkpoint; the command's own may be gone.
    let after = seed.reservations()?;
    for (id, r) in &before {
        if Some(id.as_str()) == own {
            check(!after.contains_key(id), || {
                format!("{id} was not released by its wrapper: {:?}", after.get(id))
            })?;
            continue;
        }
        check(
            after.get(id).map(Value::to_string) == Some(r.to_string()),
            || {
                format!(
                    "{id} changed in pool.json\nbefore: {r}\nafter:  {}",
                    after.get(id).map_or("(gone)".to_owned(), Value::to_string)
                )
            },
        )?;
    }
    let records_after = seed.records()?;
    for (key, record) in &records {
        if own.is_some_and(|own| key.2 == own) {
            continue;
        }
        check(records_after.get(key) == Some(record), || {
            format!(
                "{key:?} changed in its checkpoint\nbefore: {record}\nafter:  {}",
                records_after.get(key).map_or("(gone)", String::as_str)
            )
        })?;
    }
    let mut holders: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (id, r) in &after {
        for g in gpus(r) {
            holders.entry(g).or_default().push(id);
        }
    }
    check(
        holders.iter().all(|(g, ids)| {
            !g.is_empty() && (ids.len() == 1 || ids.iter().any(|i| i.starts_with("quarantine@")))
        }),
        || format!("a GPU listed twice, or an empty UUID: {holders:?}"),
    )
}

/// `exec` and `docker-args` asking for a GPU: refused saying why without a view of the GPUs, and
/// served from a GPU it sees that no record holds with the fewer GPUs.
fn expect_refusal_unless_partial(view: View, out: &Output) -> TestResult {
    let stderr = String::from_utf8_lossy(&out.stderr);
    match view {
        View::NvmlMissing | View::DriverNotLoaded => check(
            !out.status.success()
                && stderr.contains("this process sees no GPU (")
                && stderr.contains("): granting no GPU"),
            || text(out),
        ),
        View::NvmlUnknown => check(
            !out.status.success() && stderr.contains("GPU discovery failed"),
            || text(out),
        ),
        View::FewerGpus => check(out.status.success(), || text(out)),
    }
}

/// The module's recovery with the view: the agent restarted with it (a module whose discovery
/// fails refuses to start; the Rust isolator is given what discovery gave).
fn module_recover(seed: &Seed, view: View, sim: Option<&SimNode>) -> TestResult {
    let found = match sim {
        Some(sim) => GpuDriver::open(Some(&sim.lib_path())),
        None => GpuDriver::open(None),
    };
    let inventory = match (view, found) {
        // The module refuses to start (`mgpu_isolator_new` fails): nothing is opened.
        (View::NvmlUnknown, Err(_)) => return Ok(()),
        (_, Ok(Discovery::NoDriver(inventory))) => inventory,
        (_, Ok(Discovery::Driver(driver))) => driver.inventory().clone(),
        (_, Err(e)) => return Err(format!("{view:?}: discovery failed: {e:#}").into()),
    };
    let module = seed.module(inventory)?;
    let id = ContainerId::new(MODULE_CONTAINER)?;
    let report = module.recover(
        &[RecoverState {
            id: id.clone(),
            parent: None,
            nested_cgroup: None,
        }],
        &[],
    )?;
    let unchecked = report
        .unchecked
        .as_ref()
        .ok_or("recovery does not report the records it cannot check")?;
    check(unchecked.records.iter().any(|(c, _)| *c == id), || {
        format!("{unchecked}")
    })?;
    if view != View::FewerGpus {
        let err = module
            .prepare(
                &ContainerId::new("mod-2")?,
                PrepareConfig {
                    gpus: 1.0,
                    ..PrepareConfig::default()
                },
            )
            .expect_err("a module that sees no GPU grants none");
        check(
            err.to_string().contains("this process sees no GPU (")
                && err.to_string().ends_with("): granting no GPU"),
            || err.to_string(),
        )?;
    }
    Ok(())
}
