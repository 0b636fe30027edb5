//! Issue 34 item 7: the Debian package's own upgrade, as the operator guide's "Upgrading the
//! Debian package" section does it, from the packages of earlier commits built from git history
//! (each with its own `scripts/package.sh`, dev profile, in the upgrade target directory) to this
//! build's package, and back.
//!
//! **The node.** Each trial's packages go onto a node of its own on this machine: systemd as
//! PID 1 of private namespaces (pid, mount, cgroup, uts, ipc; [`SystemdNode`]) in a root under
//! `/run` whose `/usr` is an overlay of this machine's (mounted here for the node's life), `/etc` a copy (none of its units enabled), `/var` its
//! own (with a copy of this machine's dpkg database) and `/run` a tmpfs. There the guide's
//! commands run exactly as written, with the package file of that name in `/root`: `dpkg -i`,
//! `systemctl enable --now`, `systemctl daemon-reload`, `systemctl restart` are the real ones,
//! and the unit runs with all its sandboxing. Nothing is installed on this machine, the two
//! earlier commits' trials run at the same time, and everything goes with the namespaces. The
//! node's GPUs are simulated (`--simulate dgx1-v100`, the package's own nvml-sim) with device
//! nodes in a directory bound at the same path inside and out (Docker resolves `--device` paths
//! in its own mount namespace), and its Docker daemon is a private one
//! ([`PrivateDockerd`]): `serve` reconciles its reservations with every `mesos-…` container of
//! its daemon, which on the machine's would include other tests'.
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

use crate::agents::dev_nodes;
use crate::agents::docker::{Images, PrivateDockerd};
use crate::agents::read_json;
use crate::support::{TestResult, check};
use crate::{Reserved, earlier_tree, one_build, repo, reservations, run, upgrade_dir};

/// The package file name the guide's commands name: the package is put in the node's `/root`
/// under this name.
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

/// A node run by systemd as PID 1 of private namespaces (see the module's notes). Its files
/// are under `base` (a directory of `/run`, bound at the same path inside): `root` is its root.
struct SystemdNode {
    base: PathBuf,
    /// `unshare`, whose child is the node's systemd.
    init: Child,
    /// systemd's pid on this machine.
    systemd: u32,
}

impl SystemdNode {
    /// Prepares the root, starts systemd and waits until it is running; `docker` (a private
    /// daemon's directory) is bound at `<base>/docker`.
    fn start(docker: &Path) -> TestResult<SystemdNode> {
        let base = Path::new("/run").join(mesos_gpu_testkit::unique_name("deb-node"));
        for dir in ["root/usr", "upper", "work", "dev", "docker"] {
            std::fs::create_dir_all(base.join(dir))?;
        }
        let setup = r#"set -e
B="$1"; R="$B/root"
mount -t overlay overlay -o "lowerdir=/usr,upperdir=$B/upper,workdir=$B/work" "$R/usr"
for l in bin lib lib64 sbin; do ln -s "usr/$l" "$R/$l"; done
mkdir -p "$R/etc" "$R/proc" "$R/sys" "$R/dev" "$R/run" "$R/tmp" "$R/var/lib" "$R/root"
cp -a /etc/. "$R/etc/"
rm -rf "$R"/etc/systemd/system/*.wants
printf '[Unit]
Description=mesos-gpu test node
Wants=systemd-journald.service
'     > "$R/etc/systemd/system/mgpu-node.target"
cp -a /var/lib/dpkg "$R/var/lib/""#;
        let node = SystemdNode {
            base: base.clone(),
            // Replaced below; a node is dropped (unmounted and removed) from here on.
            init: Command::new("true").spawn()?,
            systemd: 0,
        };
        run(
            Command::new("sh").args(["-c", setup, "sh"]).arg(&base),
            "the node's root",
        )?;
        // Inside: the root a mount point of its own (systemd's namespacing needs one), /proc,
        // /sys, /dev, a tmpfs /run and /tmp, `base` and the Docker daemon bound, then pivot_root.
        let init = r#"set -e
B="$1"; R="$B/root"
mount --rbind "$R" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run"
mount -t tmpfs tmpfs "$R/tmp"
mkdir -p "$R$B"
mount --bind "$B" "$R$B"
mount --bind "$2" "$R$B/docker"
cd "$R"; mkdir -p oldroot; pivot_root . oldroot
exec chroot . /lib/systemd/systemd --system --unit=mgpu-node.target"#;
        let log = std::fs::File::create(base.join("init.log"))?;
        let mut node = node;
        node.init = Command::new("unshare")
            .args(["--pid", "--fork", "--mount", "--cgroup", "--uts", "--ipc"])
            .args(["--propagation", "private", "sh", "-c", init, "sh"])
            .arg(&base)
            .arg(docker)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let unshare = node.init.id();
        node.systemd = wait_for(
            TIMEOUT,
            || {
                format!(
                    "systemd to start in the node: {}",
                    std::fs::read_to_string(base.join("init.log")).unwrap_or_default()
                )
            },
            || {
                std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
                    .ok()?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            },
        )?;
        wait_for(
            TIMEOUT,
            || "the node's systemd to be running".to_owned(),
            || {
                let state = node.sh("systemctl is-system-running").unwrap_or_default();
                matches!(state.trim(), "running" | "degraded").then_some(())
            },
        )?;
        Ok(node)
    }

    /// This machine's path of the node's file `path`.
    fn path(&self, path: &str) -> PathBuf {
        self.base.join("root").join(path.trim_start_matches('/'))
    }

    /// Runs `command` with `sh` in the node, in `/root`, stdin closed (no question of dpkg's
    /// can be answered); its stdout.
    fn sh(&self, command: &str) -> TestResult<String> {
        run(
            Command::new("nsenter")
                .args(["-t", &self.systemd.to_string(), "-a", "-r", "-w"])
                .args(["sh", "-c", &format!("cd /root && {command}")])
                .stdin(Stdio::null()),
            command,
        )
    }

    /// Puts `deb` into the node's `/root` under the name the guide gives it.
    fn put_deb(&self, deb: &Path) -> TestResult {
        std::fs::copy(deb, self.path(&format!("/root/{DOCUMENTED_DEB}")))?;
        Ok(())
    }

    /// The service's journal.
    fn journal(&self) -> String {
        self.sh("journalctl -u mesos-gpu.service --no-pager")
            .unwrap_or_else(|e| e.to_string())
    }
}

impl Drop for SystemdNode {
    fn drop(&mut self) {
        if self.systemd != 0 {
            let _ = Command::new("kill")
                .args(["-KILL", &self.systemd.to_string()])
                .status();
        }
        let _ = self.init.kill();
        let _ = self.init.wait();
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.path("/usr"))
            .status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One node ([`SystemdNode`]) with the package installed and its service running, and Docker
/// containers holding GPUs reserved through the package's `mesos-gpu docker-args`.
struct PackagedNode {
    /// The test's scratch directory (the image's build context).
    _scratch: tempfile::TempDir,
    images: Images,
    image: String,
    /// The containers started, by the container id their GPUs are reserved for.
    containers: Vec<String>,
    port: u16,
    /// `/etc/default/mesos-gpu` as the operator edited it.
    edited: String,
    node: SystemdNode,
    /// The node's Docker daemon, of its own (see the module's notes). Dropped last.
    _daemon: PrivateDockerd,
}

impl PackagedNode {
    /// A node with `deb` installed as the guide's "From the Debian package" installs it
    /// (`dpkg -i` of the file, as the earlier release's `apt install` of a local file does),
    /// `/etc/default/mesos-gpu` edited as an operator would for this node (its own REST port,
    /// the node's Docker daemon, the simulated GPUs and their device nodes), and the service
    /// enabled and started (`systemctl enable --now mesos-gpu.service`).
    fn install(deb: &Path) -> TestResult<PackagedNode> {
        let daemon = PrivateDockerd::start(false)?;
        let docker_dir = daemon
            .socket()
            .parent()
            .ok_or("the Docker socket has no directory")?
            .to_path_buf();
        let node = SystemdNode::start(&docker_dir)?;
        let dev = node.base.join("dev");
        let sim = SimNode::shipped("dgx1-v100");
        let devices = dev_nodes(&[&sim])?;
        run(
            Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", devices.path().display()))
                .arg(&dev),
            "cp -a of the device nodes",
        )?;
        node.put_deb(deb)?;
        node.sh(&format!("dpkg -i {DOCUMENTED_DEB}"))?;
        let port = free_port()?;
        let conffile = node.path("/etc/default/mesos-gpu");
        let shipped = std::fs::read_to_string(&conffile)?;
        let socket = node.base.join("docker/docker.sock");
        let mut edited = String::new();
        for line in shipped.lines() {
            if let Some(opts) = line.strip_prefix("MESOS_GPU_SERVE_OPTS=") {
                edited.push_str(&format!(
                    "MESOS_GPU_SERVE_OPTS=\"{}\"\n",
                    serve_opts_for(opts.trim_matches('"'), port, &socket, &dev)
                ));
            } else {
                edited.push_str(line);
                edited.push('\n');
            }
        }
        std::fs::write(&conffile, &edited)?;
        node.sh("systemctl enable --now mesos-gpu.service")?;
        let scratch = tempfile::Builder::new().prefix("mgpu-deb-node").tempdir()?;
        let mut images = Images::on(Some(&daemon.socket()));
        let image = images.build(scratch.path(), &[])?;
        let n = PackagedNode {
            _scratch: scratch,
            images,
            image,
            containers: Vec::new(),
            port,
            edited,
            node,
            _daemon: daemon,
        };
        n.wait_serving()?;
        Ok(n)
    }

    /// Waits until the service answers on its REST API and logged its start-up reconciliation.
    fn wait_serving(&self) -> TestResult {
        wait_for(
            TIMEOUT,
            || format!("the service to serve:\n{}", self.node.journal()),
            || http_get(self.port, "/v1.0/gpu/info/json").ok().map(|_| ()),
        )?;
        Ok(())
    }

    /// The conffile as it is now.
    fn conffile(&self) -> String {
        std::fs::read_to_string(self.node.path("/etc/default/mesos-gpu")).unwrap_or_default()
    }

    /// The installed `mesos-gpu` run in the node with `args` and the service's options that
    /// select the node and its pool (as the conffile names them); `docker` adds those of the
    /// Docker state directory and daemon.
    fn mesos_gpu(&self, args: &[&str], docker: bool) -> TestResult<String> {
        let mut words: Vec<String> = vec!["mesos-gpu".into()];
        words.extend(args.iter().map(|a| (*a).to_owned()));
        let mut options = vec!["--simulate", "--pool-dir", "--dev-root"];
        if docker {
            options.extend(["--work-dir", "--docker-state-dir", "--docker-socket"]);
        }
        for name in options {
            if let Some(value) = self.option(name) {
                words.extend([name.to_owned(), value]);
            }
        }
        check(
            words.iter().all(|w| {
                !w.is_empty()
                    && w.chars()
                        .all(|c| c.is_ascii_graphic() && c != '\'' && c != '"')
            }),
            format!("words the shell would split: {words:?}"),
        )?;
        // Not the shell's last command: `docker-args` records its parent as the container's
        // starter, alive while it may still start the container (as the agent is), so a
        // reservation's life is then its container's.
        self.node
            .sh(&format!("{}; status=$?; exit $status", words.join(" ")))
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
            ],
            true,
        )?;
        // One line of arguments (no path holds a space), as every release prints it: `--json`
        // was an array of them before issue 35 and is the launch object since.
        let args: Vec<&str> = printed.split_whitespace().collect();
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
            .unwrap_or_else(|| "/var/lib/mesos-gpu".to_owned());
        reservations(&read_json(&self.node.path(&pool).join("gpu/pool.json")))
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
        Ok(std::fs::read(self.node.path(path))? == out.stdout)
    }

    /// Runs the guide's section in the node, as written, with `deb` as the package file it
    /// names; after each `dpkg` command the edited conffile must be there still.
    fn upgrade_as_documented(&mut self, deb: &Path) -> TestResult {
        self.node.put_deb(deb)?;
        for command in documented_commands()? {
            self.node.sh(&command)?;
            if command.starts_with("dpkg ") {
                check(
                    self.conffile() == self.edited,
                    format!(
                        "{command}: the edited /etc/default/mesos-gpu is kept:\n{}\nexpected:\n{}",
                        self.conffile(),
                        self.edited
                    ),
                )?;
            }
        }
        self.wait_serving()
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
        self.node.sh("systemctl disable --now mesos-gpu.service")?;
        self.node.sh("dpkg --purge mesos-gpu")?;
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

/// The service's options for this test's node: `opts` (the shipped ones) with the REST API on
/// `port`, the node's Docker daemon `socket`, its simulated GPUs (`--simulate dgx1-v100`, the
/// package's nvml-sim), their device nodes in `dev`, and the pool directory named.
fn serve_opts_for(opts: &str, port: u16, socket: &Path, dev: &Path) -> String {
    let mut out = Vec::new();
    let mut words = opts.split_whitespace();
    while let Some(word) = words.next() {
        out.push(word.to_owned());
        match word {
            "--listen" => {
                words.next();
                out.push(format!("127.0.0.1:{port}"));
            }
            "--docker-socket" => {
                words.next();
                out.push(socket.display().to_string());
            }
            _ => {}
        }
    }
    if !out.iter().any(|w| w == "--docker-socket") {
        out.extend(["--docker-socket".to_owned(), socket.display().to_string()]);
    }
    // The pool named, as on a real node's default: under --simulate a release with issue 37's
    // scratch state keeps an unnamed pool in `$TMPDIR/mesos-gpu-sim/<node>/`, and f192993's
    // shipped options do not name it.
    if !out.iter().any(|w| w == "--pool-dir") {
        out.extend(["--pool-dir".to_owned(), "/var/lib/mesos-gpu".to_owned()]);
    }
    out.extend([
        "--simulate".to_owned(),
        "dgx1-v100".to_owned(),
        "--dev-root".to_owned(),
        dev.display().to_string(),
    ]);
    out.join(" ")
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
             {before:?}; the service's journal:\n{}",
            tail(&n.node.journal(), 40)
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
