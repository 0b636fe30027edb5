//! Issue 34 item 7: upgrading mesos-gpu under running tasks, from earlier commits built from git
//! history, in a real Mesos 1.12 agent.
//!
//! Each earlier commit's tree is taken out of git (`git archive`), its module library and
//! `mesos-gpu` built with cargo (one target directory for all of them, under
//! `CARGO_TARGET_TMPDIR`, each build copied out of it) and its C++ shim with its own
//! CMakeLists.txt against the Mesos in `../shared/mesos`. The agent loads the module from
//! a prefix it was installed into as the guide installs it (`cmake --install … --prefix`); the
//! upgrade installs this build's module over it into the same prefix and restarts the agent, as
//! the guide's "Upgrading mesos-gpu" section says. Tasks started by the earlier module keep
//! exactly their GPUs (the pool's reservations and, on cgroup v1, their devices cgroups), a task
//! started after the upgrade gets only free GPUs, nothing is reserved twice, and no file is
//! edited by hand. The same holds for a GPU shared under MPS (the task keeps its share, and the
//! new module packs a new share beside it), for a MIG device, and for a task of Mesos's Docker
//! containerizer (the hook and the `--docker` wrapper running the earlier `mesos-gpu`, which this
//! build's replaces) beside a unified-containerizer task.
//!
//! The Debian package's own upgrade (`dpkg -i` of this build's package over an earlier one's,
//! the unit restarted) is in `upgrade/package.rs`.

mod agents;
// In a directory of its own: a file in tests/ would be a test target of its own.
#[path = "upgrade/package.rs"]
mod package;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use agents::docker::{DockerTools, Images, Wrapper, launch_docker_task, one_docker_agent};
use agents::{ModuleNode, allowed_minors, mesos_gpu_exe, module, task_containers, until};
use libtest_mimic::{Arguments, Trial};
use mesos_gpu_testkit::mesos::{
    Agent, AgentCgroups, ISOLATOR_MODULE, Master, MesosInstall, Task, build_module, wait_for,
};
use mesos_gpu_testkit::mps::MpsControl;
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};
use support::{TestResult, check, trial};

/// The earlier commits upgraded from: the module and CLI an operator ran when issue 34 was
/// filed, and the previous landing.
const EARLIER: [&str; 2] = ["f192993", "e1d0892"];
const TASK_TIMEOUT: Duration = Duration::from_secs(60);
/// The node with GPUs in MIG mode.
const MIG_NODE: &str = "dgx-a100-mixed";

fn main() -> ExitCode {
    let host = Host::probe();
    let mut trials = Vec::new();
    for commit in EARLIER {
        for (cgroups, need) in [
            (AgentCgroups::V1, Need::Cgroup1),
            (AgentCgroups::V2, Need::Cgroup2),
        ] {
            let name = format!(
                "upgrading_from_{commit}_{}_keeps_every_tasks_gpus",
                if cgroups == AgentCgroups::V1 {
                    "v1"
                } else {
                    "v2"
                }
            );
            trials.push(needs(
                &host,
                &[Need::Root, need, Need::Cc, Need::Mesos],
                trial(name, move || {
                    upgrade_keeps_every_tasks_gpus(commit, cgroups)
                }),
            ));
        }
        trials.push(needs(
            &host,
            &[Need::Root, Need::Cgroup1, Need::Cc, Need::Mesos],
            trial(
                format!("upgrading_from_{commit}_v1_keeps_every_share_under_mps"),
                move || upgrade_keeps_every_share_under_mps(commit),
            ),
        ));
        trials.push(needs(
            &host,
            &[
                Need::Root,
                Need::Cgroup1,
                Need::Cc,
                Need::Mesos,
                Need::Dockerd,
            ],
            trial(
                format!("upgrading_from_{commit}_keeps_every_docker_tasks_gpus"),
                move || upgrade_keeps_every_docker_tasks_gpus(commit),
            ),
        ));
        trials.push(needs(
            &host,
            &[Need::Root, Need::Cgroup1, Need::Cc, Need::Mesos],
            trial(
                format!("upgrading_from_{commit}_v1_keeps_every_mig_device"),
                move || upgrade_keeps_every_mig_device(commit),
            ),
        ));
    }
    for commit in EARLIER {
        trials.push(needs(
            &host,
            &[
                Need::Root,
                Need::Dockerd,
                Need::Dpkg,
                Need::Systemd,
                Need::Cc,
            ],
            trial(
                format!("debian_package_upgrade_from_{commit}_keeps_every_reservation"),
                move || package::package_upgrade_keeps_every_reservation(commit),
            ),
        ));
    }
    let trials: Vec<Trial> = trials;
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: &mut Command, what: &str) -> TestResult<String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    check(
        out.status.success(),
        format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Where the earlier commits are built: their trees, one cargo target directory, and what each
/// commit's build is copied to.
fn upgrade_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("upgrade")
}

/// One build of earlier commits at a time in this process: they share a cargo target directory,
/// whose uplifted `libmesos_gpu.so` and `mesos-gpu` are the last build's until copied out.
fn one_build() -> std::sync::MutexGuard<'static, ()> {
    static BUILDS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    BUILDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `cargo` with none of the variables `cargo test` gave this process, which describe this crate.
fn cargo() -> Command {
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (key, _) in std::env::vars() {
        if key.starts_with("CARGO_") && key != "CARGO_HOME" {
            cargo.env_remove(key);
        }
    }
    cargo
}

/// The tree of `commit`, taken out of git history (`git archive`) once; the caller holds
/// [`one_build`].
fn earlier_tree(commit: &str) -> TestResult<PathBuf> {
    let base = upgrade_dir();
    let tree = base.join(commit);
    if !tree.join("Cargo.toml").is_file() {
        run(
            Command::new("git").arg("-C").arg(repo()).args([
                "cat-file",
                "-e",
                &format!("{commit}^{{commit}}"),
            ]),
            &format!(
                "commit {commit} in this clone's history (the upgrade test builds it; a shallow \
                 clone lacks it: fetch the full history)"
            ),
        )?;
        std::fs::create_dir_all(&tree)?;
        let archive = base.join(format!("{commit}.tar"));
        run(
            Command::new("git")
                .arg("-C")
                .arg(repo())
                .args(["archive", "--format=tar", "-o"])
                .arg(&archive)
                .arg(commit),
            "git archive",
        )?;
        run(
            Command::new("tar")
                .arg("-xf")
                .arg(&archive)
                .arg("-C")
                .arg(&tree),
            "tar",
        )?;
    }
    Ok(tree)
}

/// What an earlier commit's build gives: its `mesos-gpu` and its mesos-agent module (the shim,
/// beside which `cmake --install` finds its `libmesos_gpu.so`).
struct Earlier {
    cli: PathBuf,
    module: PathBuf,
}

/// The module and CLI of `commit`, built from git history: its tree, its `libmesos_gpu.so` and
/// `mesos-gpu` (cargo, dev profile, the packages its `scripts/package.sh` builds, so that its
/// package reuses them), copied out of the shared target directory, and its shim (its own
/// CMakeLists.txt). Built once per commit; later runs reuse it.
fn earlier(commit: &str) -> TestResult<Earlier> {
    let _build = one_build();
    let tree = earlier_tree(commit)?;
    let base = upgrade_dir();
    let target = base.join("target");
    run(
        cargo()
            .args(["build", "--quiet", "-p", "mesos-gpu", "-p", "mesos-gpu-ffi"])
            .args(["-p", "nvml-sim", "--manifest-path"])
            .arg(tree.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target),
        &format!("cargo build of {commit}'s mesos-gpu and module library"),
    )?;
    let built = base.join(format!("{commit}-built"));
    std::fs::create_dir_all(&built)?;
    for file in ["libmesos_gpu.so", "mesos-gpu"] {
        let copy = built.join(file);
        let _ = std::fs::remove_file(&copy);
        std::fs::copy(target.join("debug").join(file), &copy)?;
    }
    let install = MesosInstall::locate()?;
    Ok(Earlier {
        cli: built.join("mesos-gpu"),
        module: build_module(
            &install,
            &tree.join("ffi/mesos-module"),
            &built,
            &base.join(format!("shim-{commit}")),
            &[],
        )?,
    })
}

/// Installs the module built in `module`'s directory into `prefix`, as the guide installs it
/// (`cmake --install build/module --prefix …`); returns the installed module library.
fn install_module(module: &Path, prefix: &Path) -> TestResult<PathBuf> {
    let build = module.parent().ok_or("the module has no build directory")?;
    run(
        Command::new("cmake")
            .arg("--install")
            .arg(build)
            .arg("--prefix")
            .arg(prefix),
        "cmake --install",
    )?;
    Ok(prefix.join("lib/mesos/modules/libmesos_gpu_module.so"))
}

/// Installs the program `from` as `to` with `install`, which replaces the file (a new inode):
/// a process still running the old program, such as a Docker task's `docker-wrapper`, keeps it.
fn install_program(from: &Path, to: &Path) -> TestResult {
    run(
        Command::new("install")
            .args(["-D", "-m", "755"])
            .arg(from)
            .arg(to),
        "install",
    )?;
    Ok(())
}

/// The GPUs (UUIDs) of each reservation of the node's pool, by owner id.
type Reserved = BTreeMap<String, BTreeSet<String>>;

/// The GPUs (UUIDs) the node's pool reserves for each container, refusing a GPU reserved twice.
fn reserved(node: &ModuleNode) -> TestResult<Reserved> {
    reservations(&node.pool())
}

/// The GPUs (UUIDs) `pool` (a `pool.json`) reserves for each owner, refusing a GPU reserved
/// twice.
fn reservations(pool: &serde_json::Value) -> TestResult<Reserved> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (id, record) in pool["reservations"].as_object().into_iter().flatten() {
        for uuid in record["gpus"].as_array().into_iter().flatten() {
            let uuid = uuid.as_str().unwrap_or_default().to_owned();
            check(
                seen.insert(uuid.clone()),
                format!("{uuid} is reserved twice: {pool}"),
            )?;
            out.entry(id.clone()).or_default().insert(uuid);
        }
    }
    Ok(out)
}

/// An agent on a DGX-1 running the module of an earlier commit, installed into a prefix as the
/// guide installs it.
struct Upgrade {
    node: ModuleNode,
    prefix: PathBuf,
    install: MesosInstall,
    master: Master,
    agent: Agent,
    /// With the Docker containerizer: the `mesos-gpu` the hook and the wrapper run
    /// (`<prefix>/bin/mesos-gpu`), replaced by this build's at the upgrade.
    cli: Option<PathBuf>,
}

impl Upgrade {
    /// Starts the agent with the module of `commit` on a DGX-1 on `cgroups`, advertising
    /// `resources`, with the module parameters `extra`.
    fn start(
        commit: &str,
        cgroups: AgentCgroups,
        resources: &str,
        extra: &[(&str, &str)],
    ) -> TestResult<Upgrade> {
        let isolation = match cgroups {
            AgentCgroups::V1 => format!("filesystem/linux,cgroups/devices,{ISOLATOR_MODULE}"),
            AgentCgroups::V2 => format!("filesystem/linux,{ISOLATOR_MODULE}"),
        };
        Upgrade::start_on(commit, "dgx1-v100", &isolation, cgroups, resources, extra)
    }

    /// [`Self::start`] on the shipped node `node` with `isolation`.
    fn start_on(
        commit: &str,
        node: &str,
        isolation: &str,
        cgroups: AgentCgroups,
        resources: &str,
        extra: &[(&str, &str)],
    ) -> TestResult<Upgrade> {
        Upgrade::start_agent(commit, node, isolation, cgroups, resources, extra, false)
    }

    /// An agent on a DGX-1 (cgroup v1) running the module and `mesos-gpu` of `commit` with
    /// Mesos's Docker containerizer beside its own (`--containerizers=docker,mesos`): the hook
    /// module and the `--docker` wrapper run the `mesos-gpu` installed in the prefix, with the
    /// Docker state directory option that commit's examples name.
    fn start_docker(commit: &str) -> TestResult<Upgrade> {
        let isolation = format!("filesystem/linux,cgroups/devices,{ISOLATOR_MODULE}");
        let resources = "cpus:4;mem:4096;gpus:8";
        Upgrade::start_agent(
            commit,
            "dgx1-v100",
            &isolation,
            AgentCgroups::V1,
            resources,
            &[],
            true,
        )
    }

    fn start_agent(
        commit: &str,
        node: &str,
        isolation: &str,
        cgroups: AgentCgroups,
        resources: &str,
        extra: &[(&str, &str)],
        docker: bool,
    ) -> TestResult<Upgrade> {
        let earlier = earlier(commit)?;
        let node = ModuleNode::new(SimNode::shipped(node))?;
        let prefix = node.scratch.path().join("usr");
        let installed = install_module(&earlier.module, &prefix)?;
        let install = MesosInstall::locate()?;
        let master = Master::start(&install)?;
        let mut spec = node.spec_loading(&installed, isolation, cgroups, resources, extra)?;
        let cli = if docker {
            let cli = prefix.join("bin/mesos-gpu");
            install_program(&earlier.cli, &cli)?;
            // As that commit's shipped wrapper names it.
            let shipped = std::fs::read_to_string(
                upgrade_dir()
                    .join(commit)
                    .join("examples/mesos-agent/mesos-gpu-docker"),
            )?;
            let state_flag = if shipped.contains("--docker-state-dir") {
                "--docker-state-dir"
            } else {
                "--work-dir"
            };
            let scratch = node.scratch.path();
            DockerTools {
                exe: &cli,
                node: format!(
                    "--nvml-lib {} --dev-root {}",
                    node.sim.lib_path().display(),
                    node.dev_root.display()
                ),
                pool: &node.pool_dir(),
                state_dir: &scratch.join("docker-state"),
                state_flag,
                docker_args: &[],
                socket: None,
                wrapper: Wrapper::Stalling,
            }
            .add_to(&mut spec, scratch)?;
            Some(cli)
        } else {
            None
        };
        let agent = Agent::start(&install, &master, spec)?;
        agent.wait_log("GPU isolator ready", TASK_TIMEOUT)?;
        Ok(Upgrade {
            node,
            prefix,
            install,
            master,
            agent,
            cli,
        })
    }

    /// Launches task `name` with `resources`, running until the file `go` exists.
    fn launch(&self, name: &str, resources: &str, go: &Path) -> TestResult<Task> {
        Ok(Task::launch(
            &self.install,
            &self.master,
            name,
            resources,
            &until(go),
        )?)
    }

    /// [`Self::launch`] through a framework set up by `framework` (`mesos-execute` flags).
    fn launch_with(
        &self,
        name: &str,
        resources: &str,
        go: &Path,
        framework: &[&str],
    ) -> TestResult<Task> {
        Ok(Task::launch_with(
            &self.install,
            &self.master,
            name,
            resources,
            &until(go),
            framework,
        )?)
    }

    /// The GPUs (UUIDs) the pool reserves for task `name`, and every reservation.
    fn reserved_for(&self, name: &str) -> TestResult<(BTreeSet<String>, Reserved)> {
        let ids = task_containers(&self.agent)?;
        let all = reserved(&self.node)?;
        let id = ids
            .get(name)
            .ok_or_else(|| format!("no task {name}: {ids:?}"))?;
        Ok((all.get(id).cloned().unwrap_or_default(), all))
    }

    /// After the upgrade: task `kept` still holds exactly `held`, and task `new` holds `count`
    /// GPUs (or MIG devices) none of which is `kept`'s.
    fn check_kept_and_new(
        &self,
        commit: &str,
        kept: &str,
        held: &BTreeSet<String>,
        new: &str,
        count: usize,
    ) -> TestResult {
        let (now, all) = self.reserved_for(kept)?;
        check(
            now == *held,
            format!("{commit}: {kept} keeps exactly {held:?} after the upgrade: {all:?}"),
        )?;
        let (got, all) = self.reserved_for(new)?;
        check(
            got.len() == count && got.is_disjoint(held),
            format!("{commit}: {new} gets {count} others: {all:?}"),
        )
    }

    /// Gives back the GPUs of every owner this build's `mesos-gpu` finds gone (`gpu release
    /// --dead`, as an operator checks a node).
    fn release_dead(&self) -> TestResult {
        run(
            Command::new(mesos_gpu_exe()?)
                .arg("--nvml-lib")
                .arg(self.node.sim.lib_path())
                .arg("--dev-root")
                .arg(&self.node.dev_root)
                .args(["gpu", "release", "--dead", "--pool-dir"])
                .arg(self.node.pool_dir()),
            "mesos-gpu gpu release --dead",
        )?;
        Ok(())
    }

    /// Ends the tasks (the files `goes` made), waits for them to finish and for the pool to be
    /// empty.
    fn finish(&self, commit: &str, goes: &[&Path], tasks: &mut [&mut Task]) -> TestResult {
        for go in goes {
            std::fs::write(go, "")?;
        }
        for task in tasks {
            task.wait_state("TASK_FINISHED", TASK_TIMEOUT)?;
        }
        wait_for(
            TASK_TIMEOUT,
            || {
                format!(
                    "{commit}: everything back in the pool: {}",
                    self.node.pool()
                )
            },
            || {
                let pool = self.node.pool();
                let empty = |key: &str| pool[key].as_object().is_none_or(|m| m.is_empty());
                (empty("reservations") && empty("shares")).then_some(())
            },
        )?;
        Ok(())
    }

    /// The upgrade: the agent stops, this build's module is installed over the earlier one and
    /// the agent starts again; every task of `running` still runs.
    fn upgrade(&mut self, commit: &str, running: &mut [&mut Task]) -> TestResult {
        self.agent.kill()?;
        install_module(&module()?, &self.prefix)?;
        if let Some(cli) = &self.cli {
            install_program(&mesos_gpu_exe()?, cli)?;
        }
        self.agent.restart()?;
        self.agent.wait_log("GPU isolator ready", TASK_TIMEOUT)?;
        for task in running {
            check(
                task.is_running(),
                format!(
                    "{commit}: {} runs on after the upgrade: {:?}",
                    task.name(),
                    task.states()
                ),
            )?;
        }
        Ok(())
    }
}

/// An agent on a DGX-1 running the module of `commit` (installed into a prefix) with a `gpus:2`
/// task and a task without GPUs; this build's module installed over it and the agent restarted:
/// both tasks keep running with exactly their GPUs, a `gpus:6` task gets the six others, and
/// every GPU comes back when the tasks end.
fn upgrade_keeps_every_tasks_gpus(commit: &str, cgroups: AgentCgroups) -> TestResult {
    let mut u = Upgrade::start(commit, cgroups, "cpus:4;mem:4096;gpus:8", &[])?;
    let go = u.node.scratch.path().join("go");
    let mut a = u.launch("a", "cpus:0.1;mem:32;gpus:2", &go)?;
    let mut p = u.launch("p", "cpus:0.1;mem:32", &go)?;
    a.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    p.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let (held, before) = u.reserved_for("a")?;
    check(
        held.len() == 2,
        format!("{commit}: the earlier module reserved a's two GPUs: {before:?}"),
    )?;
    let ids = task_containers(&u.agent)?;
    let minors = if cgroups == AgentCgroups::V1 {
        Some(allowed_minors(&u.agent, &ids["a"])?)
    } else {
        None
    };

    u.upgrade(commit, &mut [&mut a, &mut p])?;
    let go_b = go.with_extension("b");
    let mut b = u.launch("b", "cpus:0.1;mem:32;gpus:6", &go_b)?;
    b.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    u.check_kept_and_new(commit, "a", &held, "b", 6)?;
    if let Some(minors) = minors {
        let ids = task_containers(&u.agent)?;
        check(
            allowed_minors(&u.agent, &ids["a"])? == minors,
            format!("{commit}: a's devices cgroup still allows exactly {minors:?}"),
        )?;
        check(
            allowed_minors(&u.agent, &ids["b"])?.is_disjoint(&minors),
            format!("{commit}: b's devices cgroup allows none of a's GPUs"),
        )?;
    }
    u.finish(commit, &[&go, &go_b], &mut [&mut a, &mut p, &mut b])
}

/// The share each container holds in the node's pool: (GPU UUID, units).
fn shares(node: &ModuleNode) -> BTreeMap<String, (String, u64)> {
    node.pool()["shares"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(id, share)| {
            let grant = &share["grant"];
            (
                id.clone(),
                (
                    grant["uuid"].as_str().unwrap_or_default().to_owned(),
                    grant["units"].as_u64().unwrap_or_default(),
                ),
            )
        })
        .collect()
}

/// An agent on a DGX-1 whose GPUs are shared two ways under MPS by the module of `commit`, with
/// a task holding a 1/2 share; this build's module installed over it and the agent restarted:
/// the task keeps its share of the same GPU (and its MPS daemon keeps serving it), a new 1/2
/// task is packed onto the other half of that GPU, and every share comes back at the end.
fn upgrade_keeps_every_share_under_mps(commit: &str) -> TestResult {
    let control = MpsControl::install("{}");
    let program = control.program().display().to_string();
    let mps = tempfile::Builder::new()
        .prefix("mgpu-upgrade-mps")
        .tempdir()?;
    let mps_root = mps.path().display().to_string();
    let extra = [
        ("gpu_replicas", "2"),
        ("gpu_sharing", "mps"),
        ("mps_control", program.as_str()),
        ("mps_root", mps_root.as_str()),
    ];
    let mut u = Upgrade::start(commit, AgentCgroups::V1, "cpus:4;mem:4096;gpus:16", &extra)?;
    let go = u.node.scratch.path().join("go");
    let mut a = u.launch("a", "cpus:0.1;mem:32;gpus:1", &go)?;
    a.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let ids = task_containers(&u.agent)?;
    let before = shares(&u.node);
    let held = before.get(&ids["a"]).cloned();
    check(
        held.as_ref().is_some_and(|(_, units)| *units == 1),
        format!("{commit}: the earlier module recorded a's 1/2 share: {before:?}"),
    )?;

    u.upgrade(commit, &mut [&mut a])?;
    let go_c = go.with_extension("c");
    let mut c = u.launch("c", "cpus:0.1;mem:32;gpus:1", &go_c)?;
    c.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let ids = task_containers(&u.agent)?;
    let after = shares(&u.node);
    check(
        after.get(&ids["a"]) == held.as_ref(),
        format!("{commit}: a keeps its share {held:?} after the upgrade: {after:?}"),
    )?;
    check(
        after.get(&ids["c"]).map(|(uuid, _)| uuid) == held.as_ref().map(|(uuid, _)| uuid),
        format!("{commit}: c is packed onto the other half of a's GPU: {after:?}"),
    )?;
    reserved(&u.node)?;
    u.finish(commit, &[&go, &go_c], &mut [&mut a, &mut c])
}

/// An agent on a node of A100s in MIG mode (mixed strategy) running the module of `commit`,
/// with a task holding a `mig-1g.5gb` device; this build's module installed over it and the
/// agent restarted: the task keeps exactly its MIG device, a new `mig-1g.5gb` task gets another.
fn upgrade_keeps_every_mig_device(commit: &str) -> TestResult {
    use mesos_gpu_isolator::agent_flags::{MigOffer, MigStrategy};
    let inventory = SimNode::shipped(MIG_NODE).inventory()?;
    let offer = MigOffer::of(&inventory, MigStrategy::Mixed);
    let resources = format!("cpus:4;mem:4096;{}", offer.resources().join(";"));
    let isolation =
        format!("filesystem/linux,linux/capabilities,cgroups/devices,{ISOLATOR_MODULE}");
    let mut u = Upgrade::start_on(
        commit,
        MIG_NODE,
        &isolation,
        AgentCgroups::V1,
        &resources,
        &[("mig_strategy", "mixed")],
    )?;
    // Without CAP_SYS_ADMIN, which the module refuses to a MIG task.
    let no_admin: &[&str] = &[
        "--framework_capabilities=GPU_RESOURCES",
        "--checkpoint",
        r#"--effective_capabilities={"capabilities":["CHOWN","DAC_OVERRIDE"]}"#,
    ];
    let go = u.node.scratch.path().join("go");
    let mut a = u.launch_with("a", "cpus:0.1;mem:32;mig-1g.5gb:1", &go, no_admin)?;
    a.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let (held, before) = u.reserved_for("a")?;
    check(
        held.len() == 1 && held.iter().all(|u| u.starts_with("MIG-")),
        format!("{commit}: the earlier module reserved a's MIG device: {before:?}"),
    )?;

    u.upgrade(commit, &mut [&mut a])?;
    let go_b = go.with_extension("b");
    let mut b = u.launch_with("b", "cpus:0.1;mem:32;mig-1g.5gb:1", &go_b, no_admin)?;
    b.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    u.check_kept_and_new(commit, "a", &held, "b", 1)?;
    u.finish(commit, &[&go, &go_b], &mut [&mut a, &mut b])
}

/// An agent running the module and `mesos-gpu` of `commit` with the Docker containerizer
/// (the hook's `docker-args` and the `--docker` wrapper run the installed `mesos-gpu`), a
/// `gpus:2` Docker task and a `gpus:1` task of the unified containerizer running; this build's
/// module and `mesos-gpu` installed over them and the agent restarted: both tasks keep running
/// with exactly their GPUs (the Docker task's `docker run` still under the earlier
/// `docker-wrapper`), a `gpus:3` Docker task and a `gpus:2` unified task get only the five free
/// GPUs, no GPU is reserved twice, and every GPU comes back when the tasks end (the earlier
/// wrapper gives its task's back).
fn upgrade_keeps_every_docker_tasks_gpus(commit: &str) -> TestResult {
    let _one = one_docker_agent();
    let mut u = Upgrade::start_docker(commit)?;
    let mut images = Images::on(None);
    let image = images.build(u.node.scratch.path(), &[])?;
    let docker = |u: &Upgrade, name: &str, gpus: u32| {
        launch_docker_task(
            &u.install,
            &u.master,
            name,
            &image,
            &format!("cpus:0.1;mem:32;gpus:{gpus}"),
            true,
        )
    };
    let go = u.node.scratch.path().join("go");
    let mut d = docker(&u, "d", 2)?;
    let mut m = u.launch("m", "cpus:0.1;mem:32;gpus:1", &go)?;
    d.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    m.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    let (held_d, before) = u.reserved_for("d")?;
    let (held_m, _) = u.reserved_for("m")?;
    check(
        held_d.len() == 2 && held_m.len() == 1,
        format!("{commit}: the earlier module and hook reserved d's 2 GPUs and m's 1: {before:?}"),
    )?;

    u.upgrade(commit, &mut [&mut d, &mut m])?;
    let mut e = docker(&u, "e", 3)?;
    let go_n = go.with_extension("n");
    let mut n = u.launch("n", "cpus:0.1;mem:32;gpus:2", &go_n)?;
    e.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    n.wait_state("TASK_RUNNING", TASK_TIMEOUT)?;
    // Every owner the earlier release recorded is judged alive by this one: nothing to free.
    u.release_dead()?;
    let earlier: BTreeSet<String> = held_d.union(&held_m).cloned().collect();
    for (new, count) in [("e", 3), ("n", 2)] {
        let (got, all) = u.reserved_for(new)?;
        check(
            got.len() == count && got.is_disjoint(&earlier),
            format!("{commit}: {new} gets {count} GPUs none of the earlier tasks holds: {all:?}"),
        )?;
    }
    u.check_kept_and_new(commit, "d", &held_d, "e", 3)?;
    u.check_kept_and_new(commit, "m", &held_m, "n", 2)?;
    let all = reserved(&u.node)?;
    check(
        all.values().map(BTreeSet::len).sum::<usize>() == 8,
        format!("{commit}: the four tasks hold the 8 GPUs, each once: {all:?}"),
    )?;
    let d_go = u.agent.sandbox("d")?.join("go");
    let e_go = u.agent.sandbox("e")?.join("go");
    u.finish(
        commit,
        &[&go, &go_n, &d_go, &e_go],
        &mut [&mut d, &mut m, &mut e, &mut n],
    )
}
