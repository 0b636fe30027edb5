//! A real Apache Mesos for end-to-end tests: a master and agents on 127.0.0.1 with free ports
//! and private work and runtime directories, the C++ module built with its CMakeLists.txt,
//! mknod'ed device nodes, a static device probe, and `mesos-execute` frameworks.
//!
//! The Mesos is the install prefix `shared/mesos/install` beside the workspace (`../shared`, or
//! further up for a worktree; its README: Mesos 1.12.0 built on Debian 12), or
//! `$MESOS_GPU_MESOS_PREFIX`.
//!
//! Facts this relies on (Mesos 1.12 source, `src/`):
//! - the agent logs "Registered with master" / "Re-registered with master" once registered
//!   (`slave/slave.cpp` 1700, 1795-ish); a command task's executor id is the task id and its
//!   sandbox is `<work_dir>/slaves/<agent>/frameworks/<framework>/executors/<task>/runs/latest`;
//! - `mesos-execute` prints `Received status update TASK_<STATE> for task '<name>'` per update
//!   (`cli/execute.cpp`) and only launches on an offer holding all the resources asked for, so a
//!   request no agent can satisfy stays pending;
//! - the agent with `filesystem/linux` bind-mounts its work directory onto itself, and cgroups
//!   under `--cgroups_root` outlive it (and its checkpointed executors survive a SIGKILL): the
//!   [`Agent`] guard kills what is left in them, unmounts and removes them;
//! - cgroup v2: Mesos wants cgroup2 at `/sys/fs/cgroup` (`src/linux/cgroups2.cpp` 276-294); on
//!   a hybrid host an agent gets that in a private mount namespace (`unshare --mount`, v1 mounts
//!   unmounted, cgroup2 mounted there: the same hierarchy the host has at
//!   `/sys/fs/cgroup/unified`). Its cgroups isolator needs `<cgroups_root>` to exist before the
//!   first container (`isolators/cgroups2/cgroups2.cpp` 192 `CHECK`s it), which only the agent's
//!   start with `--agent_subsystems` makes (`slave/main.cpp` 211-290): v2 agents get
//!   `--agent_subsystems=` (no controller).
#![allow(clippy::missing_errors_doc)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Where a Mesos install is looked for: this variable, else `<workspace>/../shared/mesos/install`.
pub const PREFIX_ENV: &str = "MESOS_GPU_MESOS_PREFIX";

/// A test result with a message.
pub type MesosResult<T = ()> = Result<T, String>;

/// A Mesos install prefix: `sbin/`, `bin/`, `libexec/mesos/`, `include/`, `lib/`.
#[derive(Debug, Clone)]
pub struct MesosInstall {
    prefix: PathBuf,
}

impl MesosInstall {
    /// Finds the install (see [`PREFIX_ENV`]); an error says where it looked.
    pub fn locate() -> MesosResult<MesosInstall> {
        let prefix = match std::env::var_os(PREFIX_ENV) {
            Some(p) => PathBuf::from(p),
            None => default_prefix(),
        };
        let agent = prefix.join("sbin/mesos-agent");
        if !agent.is_file() {
            return Err(format!(
                "no Mesos install at {} (no {}); set {PREFIX_ENV} to a Mesos install prefix",
                prefix.display(),
                agent.display()
            ));
        }
        let prefix = prefix
            .canonicalize()
            .map_err(|e| format!("{}: {e}", prefix.display()))?;
        Ok(MesosInstall { prefix })
    }

    /// The install prefix.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// `<prefix>/sbin/<name>`.
    pub fn sbin(&self, name: &str) -> PathBuf {
        self.prefix.join("sbin").join(name)
    }

    /// `<prefix>/bin/<name>`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.prefix.join("bin").join(name)
    }

    /// The agent's `--launcher_dir`.
    pub fn launcher_dir(&self) -> PathBuf {
        self.prefix.join("libexec/mesos")
    }

    /// Checks that the agent binary runs (its libraries load).
    pub fn check_runs(&self) -> MesosResult {
        let out = Command::new(self.sbin("mesos-agent"))
            .arg("--version")
            .output()
            .map_err(|e| format!("mesos-agent --version: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "mesos-agent --version failed ({}): {} (install the packages in runtime-packages.txt)",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// `shared/mesos/install` in the nearest directory above the workspace that has one: the
/// workspace's `../shared/mesos` (a checkout beside it), or further up (a worktree).
fn default_prefix() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let workspace = workspace.canonicalize().unwrap_or(workspace);
    workspace
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/mesos/install"))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| workspace.join("../shared/mesos/install"))
}

/// Builds the C++ module from `source` (the directory with its `CMakeLists.txt`) in `build`
/// against `install` and the `libmesos_gpu.so` in `gpu_lib_dir`, warnings as errors; returns
/// the module's path. `extra` are more `-D` arguments for cmake.
pub fn build_module(
    install: &MesosInstall,
    source: &Path,
    gpu_lib_dir: &Path,
    build: &Path,
    extra: &[&str],
) -> MesosResult<PathBuf> {
    let mut configure = Command::new("cmake");
    configure
        .arg("-S")
        .arg(source)
        .arg("-B")
        .arg(build)
        .arg(format!("-DMESOS_PREFIX={}", install.prefix().display()))
        .arg(format!("-DMESOS_GPU_LIB_DIR={}", gpu_lib_dir.display()))
        .arg("-DMESOS_GPU_WERROR=ON")
        .args(extra);
    run(&mut configure, "cmake (configure)")?;
    let mut compile = Command::new("cmake");
    compile.arg("--build").arg(build).args(["--", "-j2"]);
    run(&mut compile, "cmake --build")?;
    let module = build.join("libmesos_gpu_module.so");
    if module.is_file() {
        Ok(module)
    } else {
        Err(format!("cmake built no {}", module.display()))
    }
}

fn run(cmd: &mut Command, what: &str) -> MesosResult<String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        Err(format!(
            "{what} failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ))
    }
}

/// Device nodes in a private directory: `nvidia<minor>` (c 195:minor), `nvidiactl`
/// (c 195:255), `nvidia-uvm` (c 240:0) and `nvidia-uvm-tools` (c 240:1). Opening one gives
/// `ENXIO` when the device cgroup allows it (no driver behind it) and `EPERM` when it denies it.
#[derive(Debug)]
pub struct DevNodes {
    dir: TempDir,
}

impl DevNodes {
    /// Makes the nodes of GPUs with `minors` and the control nodes.
    pub fn nvidia(minors: &[u32]) -> MesosResult<DevNodes> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-mesos-dev")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let mut specs: Vec<(String, u32, u32)> = minors
            .iter()
            .map(|m| (format!("nvidia{m}"), 195, *m))
            .collect();
        specs.push(("nvidiactl".into(), 195, 255));
        specs.push(("nvidia-uvm".into(), 240, 0));
        specs.push(("nvidia-uvm-tools".into(), 240, 1));
        for (name, major, minor) in specs {
            let path = dir.path().join(&name);
            run(
                Command::new("mknod").arg(&path).args([
                    "c",
                    &major.to_string(),
                    &minor.to_string(),
                ]),
                "mknod",
            )?;
        }
        Ok(DevNodes { dir })
    }

    /// The directory holding the nodes.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The probe's C source: opens every `nvidia*` node in a directory and prints one line per
/// node (`<phase> <node> ENXIO|EPERM|OPEN|<error>`), then `env` lines and the process's cgroups.
/// With a second argument it waits for that file to exist and probes again (phase `after`).
const PROBE_C: &str = r#"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int cmp(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }
static void probe(const char* dir, const char* phase) {
  DIR* d = opendir(dir);
  if (!d) { printf("%s opendir %s\n", phase, strerror(errno)); return; }
  char* names[256]; int n = 0; struct dirent* e;
  while ((e = readdir(d)) && n < 256)
    if (strncmp(e->d_name, "nvidia", 6) == 0) names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, n, sizeof(char*), cmp);
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    int fd = open(path, O_RDONLY);
    int err = errno;
    if (fd >= 0) { close(fd); printf("%s %s OPEN\n", phase, names[i]); }
    else printf("%s %s %s\n", phase, names[i],
                err == ENXIO ? "ENXIO" : err == EPERM ? "EPERM" : strerror(err));
  }
  fflush(stdout);
}
static void env(const char* name) {
  const char* v = getenv(name);
  printf("env %s=%s\n", name, v ? v : "(unset)");
}
int main(int argc, char** argv) {
  if (argc < 2) { fprintf(stderr, "usage: probe DEV_DIR [GO_FILE]\n"); return 2; }
  probe(argv[1], "before");
  env("NVIDIA_VISIBLE_DEVICES");
  env("CUDA_VISIBLE_DEVICES");
  FILE* f = fopen("/proc/self/cgroup", "r");
  char line[4096];
  while (f && fgets(line, sizeof line, f)) printf("cgroup %s", line);
  if (f) fclose(f);
  fflush(stdout);
  if (argc > 2) {
    printf("waiting for %s\n", argv[2]);
    fflush(stdout);
    while (access(argv[2], F_OK) != 0) usleep(50000);
    probe(argv[1], "after");
  }
  return 0;
}
"#;

/// Builds the static probe into `dir`.
pub fn build_probe(dir: &Path) -> MesosResult<PathBuf> {
    let src = dir.join("probe.c");
    fs::write(&src, PROBE_C).map_err(|e| format!("{}: {e}", src.display()))?;
    let exe = dir.join("probe");
    run(
        Command::new("cc")
            .args(["-std=c11", "-D_DEFAULT_SOURCE", "-O1", "-static", "-o"])
            .arg(&exe)
            .arg(&src),
        "cc (probe)",
    )?;
    Ok(exe)
}

/// What a probe printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeReport {
    /// Node name → outcome, first probe.
    pub before: BTreeMap<String, String>,
    /// Node name → outcome, second probe (after the go file appeared).
    pub after: BTreeMap<String, String>,
    /// Environment variables printed.
    pub env: BTreeMap<String, String>,
    /// `/proc/self/cgroup` lines.
    pub cgroups: Vec<String>,
}

impl ProbeReport {
    /// Parses a probe's stdout.
    pub fn parse(text: &str) -> ProbeReport {
        let mut report = ProbeReport::default();
        for line in text.lines() {
            let mut words = line.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("before"), Some(node), Some(outcome)) => {
                    report.before.insert(node.into(), outcome.into());
                }
                (Some("after"), Some(node), Some(outcome)) => {
                    report.after.insert(node.into(), outcome.into());
                }
                (Some("env"), Some(kv), None) => {
                    if let Some((k, v)) = kv.split_once('=') {
                        report.env.insert(k.into(), v.into());
                    }
                }
                (Some("cgroup"), Some(a), b) => report
                    .cgroups
                    .push(b.map_or_else(|| a.to_owned(), |b| format!("{a} {b}"))),
                _ => {}
            }
        }
        report
    }

    /// The GPU minors the first (or, with `after`, the second) probe could open (`ENXIO`).
    pub fn gpus(&self, after: bool) -> Vec<u32> {
        let map = if after { &self.after } else { &self.before };
        map.iter()
            .filter(|(_, outcome)| *outcome == "ENXIO")
            .filter_map(|(node, _)| node.strip_prefix("nvidia")?.parse().ok())
            .collect()
    }

    /// The outcome for `node` in the first probe.
    pub fn outcome(&self, node: &str) -> Option<&str> {
        self.before.get(node).map(String::as_str)
    }
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> MesosResult<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

/// Polls `f` every 50 ms until it answers `Some`, or fails with `what` after `timeout`.
pub fn wait_for<T>(
    timeout: Duration,
    what: impl Fn() -> String,
    mut f: impl FnMut() -> Option<T>,
) -> MesosResult<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            return Err(format!(
                "timed out after {timeout:?} waiting for {}",
                what()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spawn_logged(cmd: &mut Command, log: &Path) -> MesosResult<Child> {
    let out = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))
}

fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A `mesos-master` on 127.0.0.1 with an in-memory registry; killed on drop.
#[derive(Debug)]
pub struct Master {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Master {
    /// Starts a master and waits until it answers HTTP.
    pub fn start(install: &MesosInstall) -> MesosResult<Master> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-mesos-master")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let port = free_port()?;
        let child = spawn_logged(
            Command::new(install.sbin("mesos-master"))
                .arg("--ip=127.0.0.1")
                .arg(format!("--port={port}"))
                .arg(format!("--work_dir={}", dir.path().join("work").display()))
                .arg("--registry=in_memory")
                .arg("--allocation_interval=200ms"),
            &dir.path().join("master.log"),
        )?;
        let mut master = Master { child, port, dir };
        wait_for(
            Duration::from_secs(20),
            || format!("the master to answer; log:\n{}", tail(&master.log(), 20)),
            || http_get(port, "/health").ok(),
        )?;
        if let Ok(Some(status)) = master.child.try_wait() {
            return Err(format!(
                "mesos-master exited: {status}\n{}",
                tail(&master.log(), 20)
            ));
        }
        Ok(master)
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The master's log.
    pub fn log(&self) -> String {
        read_lossy(&self.dir.path().join("master.log"))
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.0 GET on 127.0.0.1; the body on a 2xx answer.
pub fn http_get(port: u16, path: &str) -> MesosResult<String> {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    if head.starts_with("HTTP/1.1 2") || head.starts_with("HTTP/1.0 2") {
        Ok(body.to_owned())
    } else {
        Err(head.lines().next().unwrap_or("").to_owned())
    }
}

/// Which cgroup version the agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentCgroups {
    /// The host's cgroup v1 hierarchies.
    V1,
    /// cgroup v2, with cgroup2 mounted at `/sys/fs/cgroup` in a private mount namespace.
    V2,
}

/// How to start an agent.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// `--isolation`.
    pub isolation: String,
    /// `--cgroups_root` (unique per test: the guard removes it).
    pub cgroups_root: String,
    /// `--resources`.
    pub resources: String,
    /// `--modules=file://<path>`, when set.
    pub modules: Option<PathBuf>,
    /// The cgroup version.
    pub cgroups: AgentCgroups,
    /// Extra environment (e.g. `LD_LIBRARY_PATH` to the simulated NVML).
    pub env: Vec<(String, String)>,
    /// Extra flags, `--name=value`.
    pub flags: Vec<String>,
}

impl AgentSpec {
    /// An agent with `isolation` on `cgroups`, 4 CPUs, 4 GiB and `gpus` GPUs, under a unique
    /// cgroups root.
    pub fn new(isolation: &str, cgroups: AgentCgroups, gpus: u32) -> AgentSpec {
        AgentSpec {
            isolation: isolation.to_owned(),
            cgroups_root: crate::unique_name("agent").replace('-', "_"),
            resources: format!("cpus:4;mem:4096;gpus:{gpus}"),
            modules: None,
            cgroups,
            env: Vec::new(),
            flags: Vec::new(),
        }
    }
}

/// A `mesos-agent` with private work and runtime directories. Dropping it kills the agent and
/// everything left in its cgroups, unmounts what it mounted and removes its cgroups.
#[derive(Debug)]
pub struct Agent {
    install: MesosInstall,
    master: String,
    spec: AgentSpec,
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    starts: usize,
}

impl Agent {
    /// Starts an agent registered with `master` and waits for its registration.
    pub fn start(install: &MesosInstall, master: &Master, spec: AgentSpec) -> MesosResult<Agent> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-mesos-agent")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let mut agent = Agent {
            install: install.clone(),
            master: master.address(),
            spec,
            port: free_port()?,
            dir,
            child: None,
            starts: 0,
        };
        agent.launch()?;
        agent.wait_registered()?;
        Ok(agent)
    }

    /// Starts an agent that is expected to refuse to start; returns its exit status and log.
    pub fn start_refused(
        install: &MesosInstall,
        master: &Master,
        spec: AgentSpec,
    ) -> MesosResult<(ExitStatus, String)> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-mesos-agent")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let mut agent = Agent {
            install: install.clone(),
            master: master.address(),
            spec,
            port: free_port()?,
            dir,
            child: None,
            starts: 0,
        };
        agent.launch()?;
        let log = agent.dir.path().join("agent-1.log");
        let mut child = agent.child.take().ok_or("the agent did not start")?;
        let waited = wait_for(
            Duration::from_secs(30),
            || format!("the agent to exit; log:\n{}", tail(&read_lossy(&log), 30)),
            || child.try_wait().ok().flatten(),
        );
        if waited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok((waited?, agent.log()))
    }

    /// The agent's work directory.
    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// The agent's runtime directory.
    pub fn runtime_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// The spec it runs with.
    pub fn spec(&self) -> &AgentSpec {
        &self.spec
    }

    /// Everything the agent logged, over all its starts.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| read_lossy(&self.dir.path().join(format!("agent-{n}.log"))))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGKILLs the agent (its checkpointed executors live on).
    pub fn kill(&mut self) -> MesosResult {
        if let Some(mut child) = self.child.take() {
            child.kill().map_err(|e| format!("kill agent: {e}"))?;
            child.wait().map_err(|e| format!("wait agent: {e}"))?;
        }
        Ok(())
    }

    /// Starts the agent again with the same flags and directories and waits until it
    /// re-registered.
    pub fn restart(&mut self) -> MesosResult {
        self.kill()?;
        self.launch()?;
        self.wait_registered()
    }

    /// The first existing `stdout` of task `task`'s sandbox.
    pub fn sandbox_stdout(&self, task: &str) -> MesosResult<String> {
        let path = self.sandbox(task)?.join("stdout");
        Ok(read_lossy(&path))
    }

    /// The sandbox (`runs/latest`) of task `task`'s executor.
    pub fn sandbox(&self, task: &str) -> MesosResult<PathBuf> {
        let slaves = self.work_dir().join("slaves");
        for agent in dirs(&slaves) {
            for framework in dirs(&agent.join("frameworks")) {
                let run = framework.join("executors").join(task).join("runs/latest");
                if run.exists() {
                    return Ok(run);
                }
            }
        }
        Err(format!(
            "no sandbox for task {task} under {}",
            slaves.display()
        ))
    }

    /// Waits until task `task`'s sandbox stdout contains `needle`.
    pub fn wait_stdout(&self, task: &str, needle: &str, timeout: Duration) -> MesosResult<String> {
        wait_for(
            timeout,
            || {
                format!(
                    "{needle:?} in the stdout of {task}: {:?}; agent log:\n{}",
                    self.sandbox_stdout(task),
                    tail(&self.log(), 30)
                )
            },
            || {
                self.sandbox_stdout(task)
                    .ok()
                    .filter(|out| out.contains(needle))
            },
        )
    }

    /// The cgroup directories of the agent's `--cgroups_root` on the host: one per v1
    /// hierarchy that has it, and the cgroup2 one.
    pub fn cgroup_roots(&self) -> Vec<PathBuf> {
        let mut roots: Vec<PathBuf> = dirs(Path::new("/sys/fs/cgroup"))
            .into_iter()
            .map(|h| h.join(&self.spec.cgroups_root))
            .filter(|p| p.is_dir())
            .collect();
        if let Some(v2) = crate::cgroup2_root() {
            let p = v2.join(&self.spec.cgroups_root);
            if p.is_dir() && !roots.contains(&p) {
                roots.push(p);
            }
        }
        roots
    }

    fn launch(&mut self) -> MesosResult {
        self.starts += 1;
        let log = self.dir.path().join(format!("agent-{}.log", self.starts));
        let agent = self.install.sbin("mesos-agent");
        let mut flags = vec![
            format!("--master={}", self.master),
            "--ip=127.0.0.1".to_owned(),
            format!("--port={}", self.port),
            format!("--work_dir={}", self.work_dir().display()),
            format!("--runtime_dir={}", self.runtime_dir().display()),
            format!("--launcher_dir={}", self.install.launcher_dir().display()),
            format!("--isolation={}", self.spec.isolation),
            format!("--cgroups_root={}", self.spec.cgroups_root),
            format!("--resources={}", self.spec.resources),
            "--no-systemd_enable_support".to_owned(),
            "--executor_registration_timeout=30secs".to_owned(),
        ];
        if let Some(modules) = &self.spec.modules {
            flags.push(format!("--modules=file://{}", modules.display()));
        }
        if self.spec.cgroups == AgentCgroups::V2 {
            flags.push("--agent_subsystems=".to_owned());
        }
        flags.extend(self.spec.flags.iter().cloned());
        let mut cmd = match self.spec.cgroups {
            AgentCgroups::V1 => {
                let mut cmd = Command::new(&agent);
                cmd.args(&flags);
                cmd
            }
            AgentCgroups::V2 => {
                let mut cmd = Command::new("unshare");
                cmd.args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
                    .arg(
                        "umount -R /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup \
                         && exec \"$0\" \"$@\"",
                    )
                    .arg(&agent)
                    .args(&flags);
                cmd
            }
        };
        cmd.envs(self.spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.child = Some(spawn_logged(&mut cmd, &log)?);
        Ok(())
    }

    fn wait_registered(&mut self) -> MesosResult {
        let log = self.dir.path().join(format!("agent-{}.log", self.starts));
        let child = &mut self.child;
        wait_for(
            Duration::from_secs(30),
            || {
                format!(
                    "the agent to register; log:\n{}",
                    tail(&read_lossy(&log), 40)
                )
            },
            || {
                if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
                    return Some(Err(format!(
                        "mesos-agent exited ({status}):\n{}",
                        tail(&read_lossy(&log), 40)
                    )));
                }
                let text = read_lossy(&log);
                (text.contains("Registered with master")
                    || text.contains("Re-registered with master"))
                .then_some(Ok(()))
            },
        )?
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.kill();
        // Executors and tasks outlive a killed agent: kill whatever is in its cgroups.
        for _ in 0..100 {
            let mut pids = Vec::new();
            for root in self.cgroup_roots() {
                collect_pids(&root, &mut pids);
            }
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        unmount_below(self.dir.path());
        // A killed process leaves its cgroup only once it is reaped: retry for a while.
        for _ in 0..250 {
            let roots = self.cgroup_roots();
            if roots.is_empty() {
                break;
            }
            roots.iter().for_each(|root| remove_tree(root));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn dirs(path: &Path) -> Vec<PathBuf> {
    fs::read_dir(path)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

fn collect_pids(dir: &Path, pids: &mut Vec<String>) {
    pids.extend(
        read_lossy(&dir.join("cgroup.procs"))
            .split_whitespace()
            .map(str::to_owned),
    );
    for child in dirs(dir) {
        collect_pids(&child, pids);
    }
}

/// Removes a cgroup tree, deepest first.
fn remove_tree(dir: &Path) {
    for child in dirs(dir) {
        remove_tree(&child);
    }
    let _ = fs::remove_dir(dir);
}

/// Lazily unmounts every mount at or below `dir` in this mount namespace, deepest first.
fn unmount_below(dir: &Path) {
    let mut points: Vec<PathBuf> = read_lossy(Path::new("/proc/self/mountinfo"))
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = Command::new("umount").arg("-l").arg(&point).status();
    }
}

/// A `mesos-execute` framework running one task; killed on drop.
#[derive(Debug)]
pub struct Task {
    name: String,
    child: Child,
    out: PathBuf,
    _dir: TempDir,
}

impl Task {
    /// Launches task `name` with `resources` running `command`, through a framework with the
    /// `GPU_RESOURCES` capability that checkpoints (so the task survives an agent restart).
    pub fn launch(
        install: &MesosInstall,
        master: &Master,
        name: &str,
        resources: &str,
        command: &str,
    ) -> MesosResult<Task> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-mesos-task")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let out = dir.path().join("execute.log");
        let child = spawn_logged(
            Command::new(install.bin("mesos-execute"))
                .arg(format!("--master={}", master.address()))
                .arg(format!("--name={name}"))
                .arg("--framework_capabilities=GPU_RESOURCES")
                .arg("--checkpoint")
                .arg(format!("--resources={resources}"))
                .arg(format!("--command={command}")),
            &out,
        )?;
        Ok(Task {
            name: name.to_owned(),
            child,
            out,
            _dir: dir,
        })
    }

    /// The task's name (its id and its executor's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What `mesos-execute` printed.
    pub fn output(&self) -> String {
        read_lossy(&self.out)
    }

    /// The states received so far, in order (`TASK_RUNNING`, …).
    pub fn states(&self) -> Vec<String> {
        self.output()
            .lines()
            .filter_map(|l| l.strip_prefix("Received status update "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    }

    /// Waits until the task reached `state`; a terminal state that is not `state` fails at once.
    pub fn wait_state(&mut self, state: &str, timeout: Duration) -> MesosResult {
        const TERMINAL: [&str; 6] = [
            "TASK_FINISHED",
            "TASK_FAILED",
            "TASK_KILLED",
            "TASK_LOST",
            "TASK_ERROR",
            "TASK_DROPPED",
        ];
        wait_for(
            timeout,
            || {
                format!(
                    "{} to reach {state}; mesos-execute:\n{}",
                    self.name,
                    tail(&self.output(), 20)
                )
            },
            || {
                let states = self.states();
                if states.iter().any(|s| s == state) {
                    return Some(Ok(()));
                }
                states
                    .iter()
                    .find(|s| TERMINAL.contains(&s.as_str()))
                    .map(|s| {
                        Err(format!(
                            "{} ended {s}, not {state}; mesos-execute:\n{}",
                            self.name,
                            tail(&self.output(), 20)
                        ))
                    })
            },
        )?
    }

    /// True while `mesos-execute` runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_output_parses() {
        let r = ProbeReport::parse(
            "before nvidia0 ENXIO\nbefore nvidia1 EPERM\nbefore nvidiactl ENXIO\n\
             env NVIDIA_VISIBLE_DEVICES=GPU-a\nenv CUDA_VISIBLE_DEVICES=(unset)\n\
             cgroup 0::/m/c/leaf\nwaiting for /x\nafter nvidia0 ENXIO\n",
        );
        assert_eq!(r.gpus(false), [0]);
        assert_eq!(r.gpus(true), [0]);
        assert_eq!(r.outcome("nvidiactl"), Some("ENXIO"));
        assert_eq!(r.env["CUDA_VISIBLE_DEVICES"], "(unset)");
        assert_eq!(r.cgroups, ["0::/m/c/leaf"]);
    }
}
