//! Every command that creates state, run as a real child process under `umask 000` (as under a
//! supervisor's `UMask=0000`): `docker-args` (with an MPS daemon of nvml-sim's
//! `nvidia-cuda-mps-control` stand-in), `exec` (its record and the simulated node's directory,
//! listed by the command itself while it runs; its launcher socket, 0600 in a 0700 directory, is
//! gone by then), `run`, `serve` (plugin socket, CDI spec and simulated node while it idles; the
//! pool and Docker checkpoint it makes on a request are `docker-args`'s), `volume create` and
//! `acquire`, `cdi generate` and `gpu mark-healthy` (with and without a running monitor). Each
//! lists the modes of what it created; nothing may be writable by group or others except the
//! plugin socket (0660, for dockerd's group). (The module's prepare through the C ABI:
//! `ffi/tests/c_lifecycle.rs`.)
//!
//! And a pool directory, or a Docker work directory, that others can write or that another user
//! owns is refused, naming it, its mode and owner and the mode expected, with nothing written.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::modes::{self, Entry, check_created, created, under_umask_000};
use mesos_gpu_testkit::{Host, Need, needs, run_checked, unique_name};

type TestResult = Result<(), Failed>;

/// The node the commands simulate.
const NODE: &str = "dgx1-v100";
/// How long `serve` may take to start on a loaded 2-core machine; not a bound.
const PATIENCE: Duration = Duration::from_secs(60);
/// The documented exception: the plugin socket, which dockerd's group may use.
const PLUGIN_SOCKET: (&str, u32) = ("nvidia-docker.sock", 0o660);

fn main() -> ExitCode {
    let host = Host::probe();
    let trial =
        |name: &str, need: &[Need], f: fn() -> TestResult| needs(&host, need, Trial::test(name, f));
    let trials = vec![
        trial(
            "docker_args_and_its_mps_daemon_under_umask_000",
            &[Need::Root],
            docker_args,
        ),
        trial(
            "exec_and_its_simulated_node_under_umask_000",
            &[Need::Root, Need::Cgroup2],
            exec,
        ),
        trial("run_under_umask_000", &[Need::Root, Need::Dockerd], run),
        trial("serve_under_umask_000", &[Need::Root], serve),
        trial(
            "volume_create_and_acquire_under_umask_000",
            &[Need::Cc],
            volume,
        ),
        trial("cdi_generate_under_umask_000", &[], cdi_generate),
        trial("gpu_mark_healthy_under_umask_000", &[], mark_healthy),
        trial(
            "a_world_writable_or_foreign_pool_directory_is_refused",
            &[Need::Root],
            unsafe_pool_dir_is_refused,
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// A test's own directory `T` (0700, made by the test), with a device root of mknod'ed nodes
/// when asked, and `T/tmp` as the commands' `TMPDIR`.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-test-umask")
            .tempdir()
            .unwrap();
        fs::create_dir(dir.path().join("tmp")).unwrap();
        Scratch { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `T/dev`: the DGX-1's eight GPU nodes and the control nodes.
    fn with_dev(self) -> Result<Scratch, Failed> {
        let dev = self.path("dev");
        fs::create_dir(&dev)?;
        let mut nodes: Vec<(String, u32, u32)> =
            (0..8).map(|m| (format!("nvidia{m}"), 195, m)).collect();
        nodes.push(("nvidiactl".into(), 195, 255));
        nodes.push(("nvidia-uvm".into(), 240, 0));
        for (name, major, minor) in nodes {
            run_checked(Command::new("mknod").arg(dev.join(name)).args([
                "c",
                &major.to_string(),
                &minor.to_string(),
            ]))?;
        }
        Ok(self)
    }

    /// `mesos-gpu --simulate NODE [--dev-root T/dev] ARGS` with `TMPDIR=T/tmp`.
    fn mesos_gpu(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
        cmd.args(["--simulate", NODE]);
        if self.path("dev").exists() {
            cmd.arg("--dev-root").arg(self.path("dev"));
        }
        cmd.args(args)
            .env("TMPDIR", self.path("tmp"))
            .env("MESOS_GPU_LOG", "warn");
        cmd
    }

    fn before(&self) -> BTreeSet<PathBuf> {
        modes::paths(self.dir.path())
    }

    fn created(&self, before: &BTreeSet<PathBuf>) -> Vec<Entry> {
        created(modes::listing(self.dir.path()), before)
    }
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(out: Output) -> Result<Output, Failed> {
    if out.status.success() {
        Ok(out)
    } else {
        Err(text(&out).into())
    }
}

fn run_000(cmd: &Command) -> Result<Output, Failed> {
    Ok(under_umask_000(cmd).output()?)
}

fn docker_args() -> TestResult {
    let t = Scratch::new().with_dev()?;
    let control = mesos_gpu_testkit::mps::MpsControl::install("{}");
    let before = t.before();
    let (work, pool, mps) = (t.path("work"), t.path("pool"), t.path("mps"));
    let mut cmd = t.mesos_gpu(&["docker-args", "--gpus", "1", "--plugin", "--json"]);
    cmd.args(["--gpu-replicas", "4", "--gpu-sharing", "mps"])
        .arg("--mps-control")
        .arg(control.program())
        .args([
            "--mps-root",
            s(&mps),
            "--work-dir",
            s(&work),
            "--pool-dir",
            s(&pool),
        ]);
    let out = run_000(&cmd);
    let listing = t.created(&before);
    // Stop the daemon whatever happened.
    if let Ok(text) = fs::read_to_string(pool.join("gpu/pool.json"))
        && let Ok(json) = serde_json::from_str::<serde_json::Value>(&text)
    {
        for d in json["mps"].as_object().into_iter().flat_map(|m| m.values()) {
            if let Some(pid) = d["daemon"]["process"]["pid"].as_u64() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
    }
    let out = ok(out?)?;
    // `--json` prints the launch: {"version":1,"name":"mesos-<id>",…}.
    let launch: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let id = launch["name"]
        .as_str()
        .and_then(|n| n.strip_prefix("mesos-"))
        .ok_or(format!("no name in {launch}"))?
        .to_owned();
    check_created("docker-args", &listing, &[])?;
    for want in [
        "pool/gpu/pool.json",
        "pool/gpu/pool.lock",
        "work/gpu/allocations.json",
        "mps",
    ] {
        expect_listed(&listing, &t.path(want))?;
    }
    // NVIDIA's layout, `<root>/<GPU UUID>/pipe` and `…/log`, both 0755 as NVIDIA's plugin
    // makes them: other users' clients connect to the sockets in the pipe directory.
    for dir in ["pipe", "log"] {
        let entry = listing
            .iter()
            .find(|e| e.path.starts_with(&mps) && e.path.ends_with(dir))
            .ok_or(format!("no MPS {dir} directory"))?;
        check(entry.kind == 'd' && entry.mode == 0o755, || {
            format!("MPS {dir} directory {entry}")
        })?;
    }
    // No container was started: `--force` releases without asking dockerd about it.
    let mut release = t.mesos_gpu(&["docker-args", "--release", &id, "--force"]);
    release.args(["--work-dir", s(&work), "--pool-dir", s(&pool)]);
    ok(release.output()?)?;
    Ok(())
}

fn expect_listed(listing: &[Entry], path: &Path) -> TestResult {
    check(listing.iter().any(|e| e.path == path), || {
        format!("{} was not created", path.display())
    })
}

fn check(cond: bool, what: impl FnOnce() -> String) -> TestResult {
    if cond { Ok(()) } else { Err(what().into()) }
}

/// `exec`'s record and the simulated node's directory exist only while it runs: its command
/// lists the scratch directory itself.
fn exec() -> TestResult {
    let t = Scratch::new().with_dev()?;
    let root = unique_name("umask");
    let before = t.before();
    let pool = t.path("pool");
    let find = format!("find {} -printf '%y %m %p\\n'", s(t.dir.path()));
    let mut cmd = t.mesos_gpu(&["exec", "--gpus", "1", "--cgroup-version", "v2"]);
    cmd.args(["--cgroups-root", &root, "--pool-dir", s(&pool)])
        .args(["--", "sh", "-c", &find]);
    let out = run_000(&cmd);
    let parent = mesos_gpu_testkit::cgroup2_root().unwrap().join(&root);
    let parent_mode = fs::metadata(&parent).map(|m| m.permissions().mode() & 0o7777);
    let _ = fs::remove_dir(&parent);
    let out = ok(out?)?;
    check(parent_mode.as_ref().is_ok_and(|m| *m == 0o755), || {
        format!(
            "the cgroups root {} made by exec: {parent_mode:?}",
            parent.display()
        )
    })?;
    let seen = created(
        modes::parse_find(&String::from_utf8_lossy(&out.stdout)),
        &before,
    );
    let seen: Vec<Entry> = seen
        .into_iter()
        .filter(|e| e.path != t.dir.path())
        .collect();
    check_created("exec (while its command runs)", &seen, &[])?;
    let has = |what: &str, f: &dyn Fn(&Entry) -> bool| {
        check(seen.iter().any(f), || format!("no {what} listed"))
    };
    has("exec record", &|e| {
        e.path.starts_with(pool.join("exec")) && e.path.ends_with("gpu/allocations.json")
    })?;
    has("private simulated node (0700)", &|e| {
        e.kind == 'd'
            && e.mode == 0o700
            && e.path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("mesos-gpu-sim-")
    })?;
    has("driver /proc file of the simulated node", &|e| {
        e.path.ends_with("proc/devices") && e.mode == 0o644
    })?;
    let after = t.created(&before);
    Ok(check_created("exec (after it ended)", &after, &[])?)
}

fn run() -> TestResult {
    let t = Scratch::new().with_dev()?;
    let image = format!("{}:1", unique_name("umask"));
    let ctx = t.path("image");
    fs::create_dir(&ctx)?;
    fs::copy("/bin/busybox", ctx.join("busybox")).map_err(|e| format!("/bin/busybox: {e}"))?;
    fs::write(
        ctx.join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\n",
    )?;
    run_checked(
        Command::new("docker")
            .args(["build", "--no-cache", "-q", "-t", &image])
            .arg(&ctx),
    )?;
    let before = t.before();
    let (work, pool) = (t.path("work"), t.path("pool"));
    let mut cmd = t.mesos_gpu(&["run", "--work-dir", s(&work), "--pool-dir", s(&pool)]);
    cmd.args(["--gpus", "1", &image, "/bin/busybox", "true"]);
    let out = run_000(&cmd);
    let _ = Command::new("docker")
        .args(["rmi", "-f", "--no-prune", &image])
        .output();
    ok(out?)?;
    let listing = t.created(&before);
    check_created("run", &listing, &[])?;
    expect_listed(&listing, &work.join("gpu/allocations.lock"))?;
    expect_listed(&listing, &pool.join("gpu/pool.json"))
}

fn serve() -> TestResult {
    let t = Scratch::new().with_dev()?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let before = t.before();
    let socket = t.path("plugins/nvidia-docker.sock");
    let spec = t.path("cdi/nvidia.com-gpu.json");
    let mut cmd = t.mesos_gpu(&["serve", "--driver-poll", "0"]);
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--plugin-socket", s(&socket)])
        .args(["--volume-root", s(&t.path("volumes"))])
        .args(["--work-dir", s(&t.path("work"))])
        .args(["--pool-dir", s(&t.path("pool"))])
        .args(["--docker-socket", s(&t.path("no-docker.sock"))])
        .args(["--cdi-spec", s(&spec)])
        .args(["--cdi-spec-dirs", s(&t.path("cdi"))]);
    let mut child = under_umask_000(&cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + PATIENCE;
    let ready = loop {
        if socket.exists() && spec.exists() {
            break Ok(());
        }
        if let Some(status) = child.try_wait()? {
            break Err(format!("serve exited early: {status}"));
        }
        if Instant::now() > deadline {
            break Err("serve made no socket and spec".to_owned());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let listing = t.created(&before);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = child.wait_with_output()?;
    ready.map_err(|e| format!("{e}\n{}", text(&out)))?;
    check_created("serve (while it runs)", &listing, &[PLUGIN_SOCKET])?;
    for want in [&socket, &spec] {
        expect_listed(&listing, want)?;
    }
    check(
        listing
            .iter()
            .any(|e| e.path == socket && e.kind == 's' && e.mode == 0o660),
        || "the plugin socket is not 0660".to_owned(),
    )
}

/// A driver root of two stub libraries (built with `cc`) and its ld.so.cache.
fn driver_root(dir: &Path, version: &str) -> TestResult {
    let lib = dir.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(&lib)?;
    fs::create_dir_all(dir.join("etc"))?;
    let stub = dir.join("stub.c");
    fs::write(&stub, "int mgpu_stub;\n")?;
    for name in ["libcuda", "libnvidia-ml"] {
        run_checked(
            Command::new("cc")
                .args(["-shared", &format!("-Wl,-soname,{name}.so.1"), "-o"])
                .arg(lib.join(format!("{name}.so.{version}")))
                .arg(&stub),
        )?;
    }
    fs::write(dir.join("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n")?;
    run_checked(Command::new("ldconfig").arg("-r").arg(dir))?;
    Ok(())
}

fn volume() -> TestResult {
    let t = Scratch::new();
    let driver = t.path("driver");
    driver_root(&driver, "550.54.14")?;
    let before = t.before();
    let root = t.path("volumes");
    let volume = |args: &[&str]| -> Result<Output, Failed> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
        cmd.arg("volume")
            .args(args)
            .args(["--driver-root", s(&driver), "--root", s(&root)])
            .env("MESOS_GPU_LOG", "warn");
        ok(run_000(&cmd)?)
    };
    volume(&["create", "--copy"])?;
    let copied = t.created(&before);
    volume(&["create", "--copy", "--driver-version", "550.54.14"])?;
    volume(&["acquire", "task-1", "--driver-version", "550.54.14"])?;
    let listing = t.created(&before);
    check_created("volume create --copy, acquire", &listing, &[])?;
    check(
        copied
            .iter()
            .any(|e| e.path.ends_with("manifest.json") && e.mode == 0o644),
        || "no manifest.json 0644".to_owned(),
    )?;
    expect_listed(&listing, &root.join("refs/nvidia_550.54.14/task-1"))?;
    expect_listed(&listing, &root.join(".lock"))
}

fn cdi_generate() -> TestResult {
    let t = Scratch::new();
    let before = t.before();
    let spec = t.path("cdi/nvidia.com-gpu.json");
    let mut cmd = t.mesos_gpu(&["cdi", "generate", "--output", s(&spec)]);
    cmd.args(["--spec-dirs", s(&t.path("cdi"))])
        .args(["--volume-root", s(&t.path("volumes"))]);
    ok(run_000(&cmd)?)?;
    let listing = t.created(&before);
    check_created("cdi generate", &listing, &[])?;
    expect_listed(&listing, &spec)
}

/// A health checkpoint of the DGX-1, GPU 3 failed, mode 0666 so that its replacement shows.
fn write_health(work: &Path) -> TestResult {
    fs::create_dir_all(work.join("gpu"))?;
    let path = work.join("gpu/health.json");
    fs::write(
        &path,
        mesos_gpu_testkit::nvml_sim::health_checkpoint(NODE, 3).to_string(),
    )?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666))?;
    Ok(())
}

fn mark_healthy() -> TestResult {
    let t = Scratch::new();
    let work = t.path("work");
    write_health(&work)?;
    let before = t.before();
    let mark = |extra: &[&str]| {
        let mut cmd = t.mesos_gpu(&["gpu", "mark-healthy", "3", "--work-dir", s(&work)]);
        cmd.args(extra);
        run_000(&cmd)
    };
    // No monitor: the command edits the checkpoint itself, holding the lock.
    ok(mark(&[])?)?;
    // A monitor holds the lock: the command leaves a request and gives up waiting.
    let lock = fs::File::open(work.join("gpu/health.lock"))?;
    lock.try_lock()?;
    let queued = mark(&["--wait", "1"])?;
    drop(lock);
    check(!queued.status.success(), || text(&queued))?;
    let mut listing = t.created(&before);
    // The checkpoint was there (0666); the command replaced it.
    listing.extend(
        modes::listing(&work)
            .into_iter()
            .filter(|e| e.path.ends_with("gpu/health.json")),
    );
    check_created("gpu mark-healthy", &listing, &[])?;
    for want in ["gpu/health.lock", "gpu/health.json", "gpu/health-requests"] {
        expect_listed(&listing, &work.join(want))?;
    }
    check(
        listing.iter().any(|e| {
            e.path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("mark-healthy-"))
        }),
        || "no request file".to_owned(),
    )
}

/// A pool directory others can write, or another user owns, is refused before anything is
/// written, with a message naming it, its mode and owner and what is expected; so is a Docker
/// work directory whose `gpu/` others can write.
fn unsafe_pool_dir_is_refused() -> TestResult {
    let t = Scratch::new().with_dev()?;
    let (work, pool) = (t.path("work"), t.path("pool"));
    let docker_args = || {
        let mut cmd = t.mesos_gpu(&["docker-args", "--gpus", "1", "--plugin"]);
        cmd.args(["--work-dir", s(&work), "--pool-dir", s(&pool)]);
        cmd.output()
    };
    fs::create_dir(&pool)?;
    fs::set_permissions(&pool, fs::Permissions::from_mode(0o777))?;
    let out = docker_args()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    check(
        out.status.code() == Some(1)
            && stderr.contains(&format!(
                "state directory {} has mode 0777 and owner uid 0: writable by group or others, \
                 who could replace or remove the state in it; refusing to keep GPU state there. \
                 Expected mode 0755 (no group or world write), owned by root; check what it \
                 holds, then fix it (e.g. `chmod 0755 {}`)",
                pool.display(),
                pool.display()
            )),
        || text(&out),
    )?;
    check(!pool.join("gpu").exists(), || {
        "pool/gpu was created".to_owned()
    })?;
    eprintln!("refused:\n{stderr}");

    fs::set_permissions(&pool, fs::Permissions::from_mode(0o755))?;
    run_checked(Command::new("chown").arg("65534").arg(&pool))?;
    let out = docker_args()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    check(
        out.status.code() == Some(1)
            && stderr.contains(&format!(
                "state directory {} has mode 0755 and owner uid 65534: another user owns it",
                pool.display()
            )),
        || text(&out),
    )?;
    run_checked(Command::new("chown").arg("0").arg(&pool))?;

    fs::create_dir_all(work.join("gpu"))?;
    fs::set_permissions(work.join("gpu"), fs::Permissions::from_mode(0o775))?;
    let out = docker_args()?;
    check(
        out.status.code() == Some(1)
            && String::from_utf8_lossy(&out.stderr).contains(&format!(
                "state directory {} has mode 0775",
                work.join("gpu").display()
            )),
        || text(&out),
    )?;
    check(!work.join("gpu/allocations.json").exists(), || {
        "the checkpoint was written".to_owned()
    })?;
    let reserved = fs::read_to_string(pool.join("gpu/pool.json")).unwrap_or_default();
    check(!reserved.contains("\"docker\""), || {
        format!("a reservation was left in the pool: {reserved}")
    })?;
    fs::set_permissions(work.join("gpu"), fs::Permissions::from_mode(0o755))?;
    ok(docker_args()?)?;
    Ok(())
}
