//! Shared by the real-kernel device cgroup tests (`cgroup_v1.rs`, `cgroup_v2.rs`).
//!
//! - [`Probe`]: the test binary re-executed as a child that waits on stdin, so the parent can
//!   move it into a cgroup before it opens anything, then opens what it is told and reports the
//!   errno. A device node with no driver behind it (this host has no NVIDIA driver) fails to
//!   open with `ENXIO` when the cgroup allows it and `EPERM` when the cgroup denies it.
//! - [`Nodes`]: device nodes made with `mknod` in a temporary directory.
//! - [`Cleanup`]: removes test cgroups on drop, even after a failed assertion.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};

use libtest_mimic::{Failed, Trial};

/// What test code returns: any error, printed with its whole cause chain by [`trial`].
pub(crate) type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A trial running `f`, failing with `f`'s error and every cause under it.
pub(crate) fn trial(name: &'static str, f: fn() -> TestResult) -> Trial {
    Trial::test(name, move || {
        f().map_err(|e| Failed::from(mesos_gpu_os::error_chain(e.as_ref())))
    })
}

/// Set in the environment of a probe child.
const PROBE_ENV: &str = "MGPU_CGROUP_PROBE";

/// Runs the probe loop when this process is a probe child; call first thing in `main`.
pub(crate) fn probe_main() -> Option<ExitCode> {
    std::env::var_os(PROBE_ENV)?;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = serve(&line);
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    Some(ExitCode::SUCCESS)
}

/// One request: `r <path>` / `w <path>` opens for reading / writing; `m <path> <c|b> <maj> <min>`
/// runs mknod(1) (a child of the probe, so in its cgroup). Replies `0` or the errno.
fn serve(line: &str) -> String {
    let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
    let errno = |r: std::io::Result<std::fs::File>| match r {
        Ok(_) => "0".to_owned(),
        Err(e) => e
            .raw_os_error()
            .map_or_else(|| format!("other {e}"), |n| n.to_string()),
    };
    match op {
        "r" => errno(std::fs::OpenOptions::new().read(true).open(rest)),
        "w" => errno(std::fs::OpenOptions::new().write(true).open(rest)),
        "m" => match Command::new("mknod").args(rest.split(' ')).output() {
            Ok(o) if o.status.success() => "0".to_owned(),
            Ok(o) if String::from_utf8_lossy(&o.stderr).contains("Operation not permitted") => {
                libc::EPERM.to_string()
            }
            Ok(o) => format!("other {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => format!("other {e}"),
        },
        _ => format!("other unknown request {line:?}"),
    }
}

/// What an attempt reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It worked.
    Ok,
    /// It failed with this errno.
    Errno(i32),
    /// Something unexpected.
    Other(String),
}

/// Allowed by the cgroup, then no driver: what an allowed GPU node gives here.
pub(crate) const ALLOWED: Outcome = Outcome::Errno(libc::ENXIO);
/// Denied by the cgroup.
pub(crate) const DENIED: Outcome = Outcome::Errno(libc::EPERM);

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ok => f.write_str("ok"),
            Outcome::Errno(libc::ENXIO) => f.write_str("ENXIO"),
            Outcome::Errno(libc::EPERM) => f.write_str("EPERM"),
            Outcome::Errno(n) => write!(f, "errno {n}"),
            Outcome::Other(s) => f.write_str(s),
        }
    }
}

/// How to open a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `O_RDONLY`.
    Read,
    /// `O_WRONLY`.
    Write,
}

/// A child process that opens device nodes on request.
pub(crate) struct Probe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Probe {
    /// Starts a probe; it opens nothing until asked.
    pub(crate) fn spawn() -> TestResult<Probe> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe)
            .env(PROBE_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn probe: {e}"))?;
        let stdin = child.stdin.take().ok_or("no probe stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no probe stdout")?);
        Ok(Probe {
            child,
            stdin,
            stdout,
        })
    }

    /// The probe's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn ask(&mut self, request: &str) -> TestResult<Outcome> {
        writeln!(self.stdin, "{request}").map_err(|e| format!("probe write: {e}"))?;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("probe read: {e}"))?;
        let line = line.trim();
        Ok(match line.parse::<i32>() {
            Ok(0) => Outcome::Ok,
            Ok(n) => Outcome::Errno(n),
            Err(_) => Outcome::Other(line.to_owned()),
        })
    }

    /// Opens `path` in the probe.
    pub(crate) fn open(&mut self, path: &Path, mode: Mode) -> TestResult<Outcome> {
        let op = if mode == Mode::Read { "r" } else { "w" };
        self.ask(&format!("{op} {}", path.display()))
    }

    /// Runs `mknod path c|b major minor` in the probe's cgroup.
    pub(crate) fn mknod(
        &mut self,
        path: &Path,
        kind: char,
        major: u32,
        minor: u32,
    ) -> TestResult<Outcome> {
        self.ask(&format!("m {} {kind} {major} {minor}", path.display()))
    }

    /// Asserts how each `(node, mode)` opens in the probe.
    pub(crate) fn expect(&mut self, nodes: &Nodes, cases: &[(&str, Mode, Outcome)]) -> TestResult {
        let mut wrong = Vec::new();
        for (name, mode, want) in cases {
            let got = self.open(&nodes.path(name), *mode)?;
            if &got != want {
                wrong.push(format!("{name} {mode:?}: got {got}, expected {want}"));
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; ").into())
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Device nodes in a temporary directory (on a filesystem without `nodev`).
pub(crate) struct Nodes {
    dir: tempfile::TempDir,
}

impl Nodes {
    /// The NVIDIA-like set: `nvidia0`..`nvidia3` (c 195:0-3), `nvidiactl` (c 195:255), `null`
    /// (c 1:3) and `loop0` (b 7:0).
    pub(crate) fn nvidia() -> TestResult<Nodes> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-test-nodes")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let nodes = Nodes { dir };
        for (name, kind, major, minor) in [
            ("nvidia0", "c", 195, 0),
            ("nvidia1", "c", 195, 1),
            ("nvidia2", "c", 195, 2),
            ("nvidia3", "c", 195, 3),
            ("nvidiactl", "c", 195, 255),
            ("null", "c", 1, 3),
            ("loop0", "b", 7, 0),
        ] {
            let path = nodes.path(name);
            let out = Command::new("mknod")
                .arg(&path)
                .args([kind, &major.to_string(), &minor.to_string()])
                .output()
                .map_err(|e| format!("mknod: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "mknod {}: {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr)
                )
                .into());
            }
        }
        Ok(nodes)
    }

    /// The node called `name`.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Removes cgroup directories on drop, deepest first, killing any process left in them.
pub(crate) struct Cleanup {
    dirs: Vec<PathBuf>,
}

impl Cleanup {
    /// Will remove `dirs` (listed parent first).
    pub(crate) fn new(dirs: Vec<PathBuf>) -> Cleanup {
        Cleanup { dirs }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for dir in self.dirs.iter().rev() {
            for _ in 0..50 {
                if !dir.exists() || std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if dir.exists() {
                eprintln!("cleanup: could not remove {}", dir.display());
            }
        }
    }
}

/// Fails with `what` unless `cond`.
pub(crate) fn check(cond: bool, what: impl fmt::Display) -> TestResult {
    if cond {
        Ok(())
    } else {
        Err(what.to_string().into())
    }
}
