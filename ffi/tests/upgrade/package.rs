//! Issue 34 item 7: the Debian package's own upgrade, as the operator guide's "Upgrading the
//! Debian package" section does it, from the packages of earlier commits built from git history
//! (each with its own `scripts/package.sh`, dev profile, in the upgrade target directory) to this
//! build's package, and back.
//!
//! **Where the packages go.** Into a scratch root (`DPKG_ROOT`, dpkg ≥ 1.21: dpkg's root and
//! administrative directory `<root>/var/lib/dpkg`), not into this machine's `/`: the trials of the
//! two earlier commits run at the same time, other test binaries (and other checkouts' tests on
//! a shared machine) look at `/usr/bin` and `/usr/lib`, and a failed run must leave nothing
//! behind. The guide's commands are run exactly as written (only the package file name
//! substituted); the root comes from the environment, which is why it is `DPKG_ROOT` and not
//! `--root`. Maintainer scripts run outside a chroot (`force-script-chrootless` in the
//! `~/.dpkg.cfg` of a scratch `HOME`: the scratch root has no shell to chroot into); the package's
//! (cargo-deb's debhelper snippets) honour `DPKG_ROOT` through `deb-systemd-helper` and do nothing
//! else without a running systemd. The root's dpkg database holds this machine's `libc6` record,
//! the package's one dependency.
//!
//! **Emulated: systemd.** systemd is installed here but is not PID 1, so `systemctl` has no
//! manager to talk to. (systemd does run as PID 1 of private namespaces on this machine: tried
//! with `unshare --pid --mount --cgroup` and a chroot over an overlay of `/usr`, it reaches
//! `running`. Running this unit there needs the simulated NVML, the device nodes and the Docker
//! socket outside `/tmp` (the unit has `PrivateTmp=yes`) at the same paths inside and out
//! (Docker resolves `--device` paths in its own mount namespace); not done yet.) [`Service`]
//! starts the unit as systemd would from the installed unit file: the `EnvironmentFile=`
//! (optional with `-`, `KEY="value"` lines) and the `ExecStart=` command line read from the
//! installed `mesos-gpu.service`, `$VAR` split into words and `${VAR}` kept one word as systemd
//! expands them, a clean environment, SIGTERM to stop; the unit's sandboxing (`ProtectSystem=`
//! …) is not applied. `systemctl daemon-reload` has nothing to do here (the unit file is read at
//! each start) and `systemctl restart mesos-gpu.service` is the stop and start.
//!
//! **The state formats did not change** between the earlier commits and this build: the pool
//! (`pool.json`) and the Docker containers' record (`allocations.json`) are schema version 1 in
//! all of them, so no release here refuses another's files. What a downgrade does is therefore
//! tested as it is: the earlier package installed over this one with the same commands keeps
//! every reservation with exactly its GPUs and reserves only free ones. (A file of a newer
//! schema is refused, naming both versions: `os/src/store.rs`, `pool/src/lib.rs` unit tests.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use mesos_gpu_testkit::mesos::{http_get, tail, wait_for};
use mesos_gpu_testkit::nvml_sim::SimNode;

use crate::agents::ModuleNode;
use crate::agents::docker::{Images, PrivateDockerd};
use crate::agents::read_json;
use crate::support::{TestResult, check};
use crate::{Reserved, earlier_tree, one_build, repo, reservations, run, upgrade_dir};

/// The package file name the guide's commands name; the test substitutes the package's path.
const DOCUMENTED_DEB: &str = "mesos-gpu_0.1.0-1_amd64.deb";
/// The guide's section run by this test.
const SECTION: &str = "Upgrading the Debian package";
const TIMEOUT: Duration = Duration::from_secs(60);

/// Builds a package with `script` (a tree's `scripts/package.sh`) in `out`, the cargo target
/// directory `target` (this checkout's when `None`); returns the .deb's path.
fn package(script: &Path, out: &Path, target: Option<&Path>) -> TestResult<PathBuf> {
    let mut build = Command::new(script);
    build.args(["--profile", "dev", "--output"]).arg(out);
    // Only what cargo needs: this process runs under `cargo test`, whose variables describe
    // this crate.
    for (key, _) in std::env::vars() {
        if key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR" {
            build.env_remove(key);
        }
    }
    if let Some(target) = target {
        build.env("CARGO_TARGET_DIR", target);
    }
    let printed = run(&mut build, &format!("{}", script.display()))?;
    let deb = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
    check(
        deb.is_file(),
        format!("{} printed no package: {printed}", script.display()),
    )?;
    Ok(deb)
}

/// The package of `commit`, built once by its own `scripts/package.sh` from its tree (dev
/// profile, the upgrade target directory shared with its module's build), in
/// `upgrade/deb-<commit>`; a `built` file there names it once the build succeeded.
fn earlier_deb(commit: &str) -> TestResult<PathBuf> {
    let _build = one_build();
    let out = upgrade_dir().join(format!("deb-{commit}"));
    let done = out.join("built");
    if let Ok(path) = std::fs::read_to_string(&done) {
        let deb = PathBuf::from(path);
        if deb.is_file() {
            return Ok(deb);
        }
    }
    let tree = earlier_tree(commit)?;
    let deb = package(
        &tree.join("scripts/package.sh"),
        &out,
        Some(&upgrade_dir().join("target")),
    )?;
    std::fs::write(&done, deb.display().to_string())?;
    Ok(deb)
}

/// This build's package (`scripts/package.sh --profile dev`, this checkout's target directory),
/// built once per process into `upgrade/deb-this` (cargo rebuilds only what changed).
fn this_deb() -> TestResult<PathBuf> {
    static DEB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = DEB.get_or_init(|| {
        package(
            &repo().join("scripts/package.sh"),
            &upgrade_dir().join("deb-this"),
            None,
        )
        .map_err(|e| e.to_string())
    });
    Ok(built.clone()?)
}

/// The commands of the guide's [`SECTION`] (its `sh` blocks, comments left out, continued lines
/// joined).
fn documented_commands() -> TestResult<Vec<String>> {
    let text = std::fs::read_to_string(repo().join("docs/operator-guide.md"))?;
    let mut out = Vec::new();
    let (mut in_section, mut in_shell) = (false, false);
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if !in_shell && line.starts_with('#') {
            in_section = line.trim_start_matches('#').trim() == SECTION;
            continue;
        }
        if trimmed.starts_with("```") {
            in_shell = !in_shell && trimmed.trim_start_matches('`') == "sh";
            continue;
        }
        if !in_section || !in_shell || trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        pending.push_str(trimmed.trim_end_matches('\\'));
        pending.push(' ');
        if !trimmed.ends_with('\\') {
            out.push(std::mem::take(&mut pending).trim().to_owned());
        }
    }
    check(
        out.iter().any(|c| c.contains(DOCUMENTED_DEB)),
        format!("the guide's {SECTION:?} section installs {DOCUMENTED_DEB}: {out:?}"),
    )?;
    Ok(out)
}

/// A scratch root for dpkg (see the module's notes): `<root>/var/lib/dpkg` with this machine's
/// `libc6` record, and a `HOME` whose `.dpkg.cfg` runs maintainer scripts without a chroot.
struct DebRoot {
    root: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl DebRoot {
    fn new() -> TestResult<DebRoot> {
        let root = tempfile::Builder::new().prefix("mgpu-deb-root").tempdir()?;
        let admin = root.path().join("var/lib/dpkg");
        for dir in ["info", "updates", "triggers"] {
            std::fs::create_dir_all(admin.join(dir))?;
        }
        let libc = run(
            Command::new("dpkg-query").args(["-s", "libc6"]),
            "dpkg-query -s libc6",
        )?;
        std::fs::write(admin.join("status"), format!("{libc}\n"))?;
        std::fs::write(admin.join("available"), "")?;
        let home = tempfile::Builder::new().prefix("mgpu-deb-home").tempdir()?;
        std::fs::write(home.path().join(".dpkg.cfg"), "force-script-chrootless\n")?;
        Ok(DebRoot { root, home })
    }

    /// `path` (absolute, as installed) in the scratch root.
    fn path(&self, path: &str) -> PathBuf {
        self.root.path().join(path.trim_start_matches('/'))
    }

    /// Runs `command` (a documented shell command) with `sh` on this root, stdin closed (no
    /// conffile question can be answered).
    fn sh(&self, command: &str) -> TestResult<String> {
        run(
            Command::new("sh")
                .args(["-c", command])
                .env("DPKG_ROOT", self.root.path())
                .env("HOME", self.home.path())
                .stdin(Stdio::null()),
            command,
        )
    }
}

/// The installed unit's service, run as systemd runs it (emulated, see the module's notes),
/// its output in `log`.
struct Service {
    child: Option<Child>,
    log: PathBuf,
    /// The paths its command line may name: the scratch root, the node's device nodes, the
    /// driver root `/` (read only) and the Docker daemon's socket.
    allowed: Vec<PathBuf>,
}

impl Service {
    fn new(log: PathBuf, allowed: Vec<PathBuf>) -> Service {
        Service {
            child: None,
            log,
            allowed,
        }
    }

    /// Starts the unit from the files installed in `root`, as `systemctl start` would.
    fn start(&mut self, root: &DebRoot) -> TestResult {
        let unit_path = ["/usr/lib/systemd/system", "/lib/systemd/system"]
            .iter()
            .map(|d| root.path(&format!("{d}/mesos-gpu.service")))
            .find(|p| p.is_file())
            .ok_or("no mesos-gpu.service installed")?;
        let unit = std::fs::read_to_string(&unit_path)?;
        let mut env: Vec<(String, String)> = vec![(
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        )];
        let mut exec = None;
        for line in unit.lines().map(str::trim) {
            if let Some(file) = line.strip_prefix("EnvironmentFile=") {
                let (optional, file) = match file.strip_prefix('-') {
                    Some(f) => (true, f),
                    None => (false, file),
                };
                match std::fs::read_to_string(root.path(file)) {
                    Ok(text) => env.extend(environment_file(&text)),
                    Err(_) if optional => {}
                    Err(e) => return Err(format!("EnvironmentFile {file}: {e}").into()),
                }
            } else if let Some(command) = line.strip_prefix("ExecStart=") {
                exec = Some(command.to_owned());
            }
        }
        let exec = exec.ok_or("the unit has no ExecStart=")?;
        let words = exec_words(&exec, &env)?;
        let (program, args) = words.split_first().ok_or("ExecStart= is empty")?;
        // Never a service on this machine's own paths (its plugin socket, pool, volumes).
        for arg in args.iter().filter(|a| a.starts_with('/')) {
            check(
                arg == "/" || self.allowed.iter().any(|p| Path::new(arg).starts_with(p)),
                format!(
                    "the service would run on {arg}, outside the test's root: not started \
                     ({exec} with {env:?})"
                ),
            )?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(root.path(program))
            .args(args)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("ExecStart {program}: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Stops the service as systemd does (SIGTERM, SIGKILL after `TimeoutStopSec=`).
    fn stop(&mut self) -> TestResult {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let stopped = wait_for(
                Duration::from_secs(15),
                || "the service to stop on SIGTERM".to_owned(),
                || child.try_wait().ok().flatten(),
            );
            if stopped.is_err() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        Ok(())
    }

    /// The service's output so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The variables of an `EnvironmentFile=` as systemd reads them: `KEY=value` lines, `#` and `;`
/// comments, one pair of surrounding quotes removed.
fn environment_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let unquoted = ['"', '\'']
                .iter()
                .find_map(|q| v.strip_prefix(*q)?.strip_suffix(*q))
                .unwrap_or(v);
            (k.trim().to_owned(), unquoted.to_owned())
        })
        .collect()
}

/// The words of an `ExecStart=` line as systemd expands them: `$VAR` alone as a word becomes the
/// variable's whitespace-separated words, `${VAR}` one word; no shell.
fn exec_words(line: &str, env: &[(String, String)]) -> TestResult<Vec<String>> {
    let value = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for word in line.split_whitespace() {
        if let Some(name) = word.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
            out.push(value(name));
        } else if let Some(name) = word.strip_prefix('$') {
            out.extend(value(name).split_whitespace().map(str::to_owned));
        } else if word.contains(['"', '\'', '$', '\\']) {
            return Err(
                format!("ExecStart word {word:?}: this emulation does not expand it").into(),
            );
        } else {
            out.push(word.to_owned());
        }
    }
    Ok(out)
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One node with the package installed in a scratch root, the unit's service and Docker
/// containers holding GPUs reserved through the package's `mesos-gpu docker-args`.
struct PackagedNode {
    node: ModuleNode,
    root: DebRoot,
    service: Service,
    port: u16,
    images: Images,
    image: String,
    /// The containers started, by the container id their GPUs are reserved for.
    containers: Vec<String>,
    /// `/etc/default/mesos-gpu` as the operator edited it.
    edited: String,
    /// The node's Docker daemon, of its own: the service reconciles its reservations with every
    /// `mesos-…` container of its daemon, which on the machine's daemon would include other
    /// tests' (whose GPU nodes have the same minors). Dropped last.
    _daemon: PrivateDockerd,
}

impl PackagedNode {
    /// A DGX-1 (simulated) with `deb` installed (`dpkg -i`, as the earlier release's guide
    /// installs it) and `/etc/default/mesos-gpu` edited as an operator would for this node:
    /// the installed `MESOS_GPU_SERVE_OPTS` with every path moved into the scratch root, its
    /// own port, the simulated NVML and device nodes, no CDI spec; then the unit started.
    fn install(deb: &Path) -> TestResult<PackagedNode> {
        let daemon = PrivateDockerd::start(false)?;
        let node = ModuleNode::new(SimNode::shipped("dgx1-v100"))?;
        let root = DebRoot::new()?;
        root.sh(&format!("dpkg -i {}", deb.display()))?;
        let port = free_port()?;
        let conffile = root.path("/etc/default/mesos-gpu");
        let shipped = std::fs::read_to_string(&conffile)?;
        let mut edited = String::new();
        for line in shipped.lines() {
            if let Some(opts) = line.strip_prefix("MESOS_GPU_SERVE_OPTS=") {
                edited.push_str(&format!(
                    "MESOS_GPU_SERVE_OPTS={}\n",
                    serve_opts_for(opts.trim_matches('"'), &root, &node, port, &daemon.socket())
                ));
            } else {
                edited.push_str(line);
                edited.push('\n');
            }
        }
        edited.push_str(&format!(
            "MESOS_GPU_NVML_LIB={}\n",
            node.sim.lib_path().display()
        ));
        std::fs::write(&conffile, &edited)?;
        let mut images = Images::on(Some(&daemon.socket()));
        let image = images.build(node.scratch.path(), &[])?;
        let log = node.scratch.path().join("service.log");
        let allowed = vec![root.path("/"), node.dev_root.clone(), daemon.socket()];
        let mut n = PackagedNode {
            node,
            root,
            service: Service::new(log, allowed),
            port,
            images,
            image,
            containers: Vec::new(),
            edited,
            _daemon: daemon,
        };
        n.service.start(&n.root)?;
        n.wait_serving()?;
        Ok(n)
    }

    /// Waits until the service answers on its REST API and logged its start-up reconciliation.
    fn wait_serving(&self) -> TestResult {
        wait_for(
            TIMEOUT,
            || format!("the service to serve:\n{}", self.service.log()),
            || http_get(self.port, "/v1.0/gpu/info/json").ok().map(|_| ()),
        )?;
        Ok(())
    }

    /// The conffile as it is now.
    fn conffile(&self) -> String {
        std::fs::read_to_string(self.root.path("/etc/default/mesos-gpu")).unwrap_or_default()
    }

    /// `mesos-gpu` as installed, with the conffile's NVML and the service's pool and device root
    /// (as the service's options name them), running `args`; `docker` adds the service's Docker
    /// state directory option.
    fn mesos_gpu(&self, args: &[&str], docker: bool) -> TestResult<String> {
        // Under a shell that outlives it only briefly: `docker-args` records its parent as the
        // container's starter, alive while it may still start the container (as the agent
        // is), so a reservation's life is then its container's, not this test's.
        let mut command = Command::new("sh");
        command
            .args(["-c", r#""$@"; status=$?; exit $status"#, "sh"])
            .arg(self.root.path("/usr/bin/mesos-gpu"))
            .env("MESOS_GPU_NVML_LIB", self.node.sim.lib_path())
            .args(args);
        let mut options = vec!["--pool-dir", "--dev-root"];
        if docker {
            options.extend(["--work-dir", "--docker-state-dir", "--docker-socket"]);
        }
        for name in options {
            if let Some(value) = self.option(name) {
                command.arg(name).arg(value);
            }
        }
        run(&mut command, &format!("mesos-gpu {args:?}"))
    }

    /// The reservations the installed release judges alive (their containers running): every
    /// owner it finds gone released (`gpu release --dead`), then the pool read.
    fn alive(&self) -> TestResult<Reserved> {
        self.mesos_gpu(&["gpu", "release", "--dead"], false)?;
        self.reserved()
    }

    /// Reserves `gpus` GPUs for a new container through the installed `docker-args` and starts
    /// it (`docker run -d` with the arguments printed, running until removed); returns its
    /// container id.
    fn reserve(&mut self, gpus: u32) -> TestResult<String> {
        let id = uuid_like();
        let printed = self.mesos_gpu(
            &[
                "docker-args",
                "--gpus",
                &gpus.to_string(),
                "--container-id",
                &id,
                "--image",
                &self.image,
                "--json",
            ],
            true,
        )?;
        let args: Vec<String> = serde_json::from_str(&printed)?;
        self.containers.push(id.clone());
        run(
            self.images.docker().args(["run", "-d"]).args(&args).args([
                &self.image,
                "sleep",
                "600",
            ]),
            "docker run",
        )?;
        Ok(id)
    }

    /// The pool's reservations (refusing a GPU reserved twice), read from the pool directory
    /// the service's options name.
    fn reserved(&self) -> TestResult<Reserved> {
        let pool = self
            .option("--pool-dir")
            .ok_or("the service's options name no --pool-dir")?;
        reservations(&read_json(&Path::new(&pool).join("gpu/pool.json")))
    }

    /// The value of option `name` in the conffile's `MESOS_GPU_SERVE_OPTS`.
    fn option(&self, name: &str) -> Option<String> {
        let opts = environment_file(&self.conffile())
            .into_iter()
            .find(|(k, _)| k == "MESOS_GPU_SERVE_OPTS")?
            .1;
        let words: Vec<&str> = opts.split_whitespace().collect();
        words
            .windows(2)
            .find(|pair| pair[0] == name)
            .map(|pair| pair[1].to_owned())
    }

    /// The installed file `path` is the one package `deb` holds.
    fn installed_from(&self, path: &str, deb: &Path) -> TestResult<bool> {
        let out = Command::new("sh")
            .args([
                "-c",
                r#"dpkg-deb --fsys-tarfile "$1" | tar -xO ".$2""#,
                "sh",
            ])
            .arg(deb)
            .arg(path)
            .output()?;
        check(
            out.status.success(),
            format!(
                "{path} in {}: {}",
                deb.display(),
                String::from_utf8_lossy(&out.stderr)
            ),
        )?;
        Ok(std::fs::read(self.root.path(path))? == out.stdout)
    }

    /// Runs the guide's section with `deb` in place of the documented package file: `dpkg`
    /// commands as written, `systemctl` ones emulated.
    fn upgrade_as_documented(&mut self, deb: &Path) -> TestResult {
        for command in documented_commands()? {
            match command.as_str() {
                "systemctl daemon-reload" => {}
                "systemctl restart mesos-gpu.service" => {
                    self.service.stop()?;
                    self.service.start(&self.root)?;
                    self.wait_serving()?;
                }
                c if c.starts_with("dpkg ") => {
                    self.root
                        .sh(&c.replace(DOCUMENTED_DEB, &deb.display().to_string()))?;
                    check(
                        self.conffile() == self.edited,
                        format!(
                            "{c}: the edited /etc/default/mesos-gpu is kept:\n{}\nexpected:\n{}",
                            self.conffile(),
                            self.edited
                        ),
                    )?;
                }
                other => {
                    return Err(format!(
                        "the guide's {SECTION:?} section runs {other:?}, which this test does \
                         not know how to run"
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Removes the containers, releases their reservations with the installed `docker-args`
    /// and checks the pool is empty; stops the service and purges the package.
    fn finish(&mut self) -> TestResult {
        for id in std::mem::take(&mut self.containers) {
            run(
                self.images
                    .docker()
                    .args(["rm", "-f", &format!("mesos-{id}")]),
                "docker rm",
            )?;
            self.mesos_gpu(&["docker-args", "--release", &id], true)?;
        }
        let left = self.reserved()?;
        check(
            left.is_empty(),
            format!("every GPU back in the pool: {left:?}"),
        )?;
        self.service.stop()?;
        self.root.sh("dpkg --purge mesos-gpu")?;
        Ok(())
    }
}

impl Drop for PackagedNode {
    fn drop(&mut self) {
        for id in &self.containers {
            let _ = self
                .images
                .docker()
                .args(["rm", "-f", &format!("mesos-{id}")])
                .output();
        }
    }
}

/// The service's options for this test's node: `opts` (the shipped ones) with every path under
/// `/var` or `/run` moved into the scratch root but the Docker daemon's socket, which is
/// `docker`, the REST API on `port`, the node's device root, the CDI spec off, and the pool
/// named when the shipped options leave it to the default.
fn serve_opts_for(
    opts: &str,
    root: &DebRoot,
    node: &ModuleNode,
    port: u16,
    docker: &Path,
) -> String {
    let mut out = Vec::new();
    let mut words = opts.split_whitespace().peekable();
    while let Some(word) = words.next() {
        out.push(word.to_owned());
        if word == "--listen" {
            words.next();
            out.push(format!("127.0.0.1:{port}"));
        }
    }
    let moved: Vec<String> = out
        .into_iter()
        .map(|w| {
            if w == "/var/run/docker.sock" {
                docker.display().to_string()
            } else if w.starts_with("/var/") || w.starts_with("/run/") {
                root.path(&w).display().to_string()
            } else {
                w
            }
        })
        .collect();
    let mut opts = moved.join(" ");
    if !opts.contains("--pool-dir") {
        opts.push_str(&format!(
            " --pool-dir {}",
            root.path("/var/lib/mesos-gpu").display()
        ));
    }
    opts.push_str(&format!(" --dev-root {} --no-cdi", node.dev_root.display()));
    format!("\"{opts}\"")
}

/// A fresh container id (a UUID, as Mesos's).
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{:08x}-{:04x}-4000-8000-{:04x}{:08x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed) & 0xffff,
        now.as_secs() & 0xffff,
        now.subsec_nanos()
    )
}

/// The package of `commit` installed (as its guide installs it) on a node whose service runs
/// with the operator's edited `/etc/default/mesos-gpu`, Docker containers holding 2 and 1 GPUs
/// reserved through its `docker-args`; the guide's "Upgrading the Debian package" commands run
/// with this build's package: this build's files are installed, the edited conffile is kept, the
/// restarted service serves, both containers keep exactly their GPUs (the new release finds
/// both alive: `gpu release --dead` frees nothing) and a 3-GPU reservation of
/// the new `docker-args` gets only free ones. The same commands with the earlier package (a
/// downgrade, the state formats being the same) keep every reservation, and the earlier
/// `docker-args` reserves the two GPUs left. Everything comes back when the containers go.
pub(crate) fn package_upgrade_keeps_every_reservation(commit: &str) -> TestResult {
    let old = earlier_deb(commit)?;
    let new = this_deb()?;
    let mut n = PackagedNode::install(&old)?;
    let a = n.reserve(2)?;
    let b = n.reserve(1)?;
    let before = n.reserved()?;
    check(
        before.get(&a).map(BTreeSet::len) == Some(2)
            && before.get(&b).map(BTreeSet::len) == Some(1),
        format!("{commit}: the earlier docker-args reserved 2 and 1 GPUs: {before:?}"),
    )?;
    n.upgrade_as_documented(&new)?;
    check(
        n.installed_from("/usr/bin/mesos-gpu", &new)?
            && n.installed_from("/usr/lib/mesos-gpu/libmesos_gpu.so", &new)?,
        format!("{commit}: the upgrade installed this build's mesos-gpu and module library"),
    )?;
    let after = n.alive()?;
    check(
        after == before,
        format!(
            "{commit}: every reservation is alive and keeps exactly its GPUs: {after:?}, before \
             {before:?}; the service's log:\n{}",
            tail(&n.service.log(), 40)
        ),
    )?;
    let c = n.reserve(3)?;
    let now = n.reserved()?;
    let held: BTreeSet<&String> = before.values().flatten().collect();
    check(
        now.get(&c)
            .is_some_and(|g| g.len() == 3 && g.iter().all(|u| !held.contains(u))),
        format!("{commit}: the new docker-args reserves 3 free GPUs: {now:?}"),
    )?;

    n.upgrade_as_documented(&old)?;
    check(
        n.installed_from("/usr/bin/mesos-gpu", &old)?,
        format!("{commit}: the downgrade installed the earlier mesos-gpu"),
    )?;
    let back = n.alive()?;
    check(
        back == now,
        format!(
            "{commit}: after the downgrade every reservation is kept: {back:?}, before {now:?}"
        ),
    )?;
    let d = n.reserve(2)?;
    let last = n.reserved()?;
    let held: BTreeSet<&String> = now.values().flatten().collect();
    check(
        last.get(&d)
            .is_some_and(|g| g.len() == 2 && g.iter().all(|u| !held.contains(u))),
        format!("{commit}: the earlier docker-args reserves the 2 GPUs left: {last:?}"),
    )?;
    n.finish()
}
