//! The control daemon: its files in the pipe and log directories, the command loop, servers,
//! and the configured failures.
//!
//! `-d` starts `-f` as a child in its own process group with standard streams detached, waits
//! until it says it accepts commands (or why it could not start) and exits 0 (or 1), so a caller
//! that runs `nvidia-cuda-mps-control -d` to completion, as NVIDIA's device plugin does, can send
//! commands right after. A second daemon on the same pipe directory finds `control_lock` held and
//! refuses to start. A signal kills the daemon as it would kill a crashed one: the socket and pid
//! file stay behind, and clients then find no daemon.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mesos_gpu_os::fsmode;
use serde_json::json;

use crate::commands::{Control, Effect};
use crate::record::{self, Record, Settings};
use crate::{CONTROL, log_dir, pipe_dir};

/// The hidden argument that runs a simulated MPS server (a child that waits to be stopped).
pub(crate) const SERVER_ARG: &str = "--nvml-sim-mps-server";
/// Set by `-d` for its `-f` child: report readiness on standard output.
const NOTIFY_ENV: &str = "NVML_SIM_MPS_NOTIFY";
/// The lock file a running daemon holds.
const LOCK: &str = "control_lock";
/// The daemon's pid file.
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The mode of the simulated control socket: the tests' clients run as the daemon's user.
const SOCKET_MODE: u32 = fsmode::PRIVATE_FILE;
/// How long `-d` waits for its daemon.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the idle loop looks at its deadlines.
const TICK: Duration = Duration::from_millis(20);

/// `-d`: start `-f` in the background and wait until it accepts commands.
pub(crate) fn start_background() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-control: cannot find this program's path: {e}");
            return ExitCode::FAILURE;
        }
    };
    let child = Command::new(&exe)
        .arg("-f")
        .env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "nvidia-cuda-mps-control: cannot start the daemon {}: {e}",
                exe.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let Some(out) = child.stdout.take() else {
        eprintln!("nvidia-cuda-mps-control: the daemon has no status pipe");
        return ExitCode::FAILURE;
    };
    // The daemon writes one line: `ready`, or `error: <why>` before exiting.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(line) if line.trim() == "ready" => ExitCode::SUCCESS,
        Ok(line) if !line.is_empty() => {
            eprintln!("{}", line.trim().trim_start_matches("error: "));
            let _ = child.wait();
            ExitCode::FAILURE
        }
        Ok(_) => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            eprintln!(
                "nvidia-cuda-mps-control: the daemon exited before accepting commands ({status})"
            );
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!(
                "nvidia-cuda-mps-control: the daemon did not accept commands within {}s",
                START_TIMEOUT.as_secs()
            );
            ExitCode::FAILURE
        }
    }
}

/// `-f`: run the daemon until `quit` (or a configured failure).
pub(crate) fn run_foreground() -> ExitCode {
    let notify = std::env::var_os(NOTIFY_ENV).is_some();
    let say = |line: &str| {
        if notify {
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        } else {
            eprintln!("{line}");
        }
    };
    let (pipe, logs) = (pipe_dir(), log_dir());
    let settings = match record::settings() {
        Ok(s) => s,
        Err(why) => {
            say(&format!("error: nvidia-cuda-mps-control: {why}"));
            return ExitCode::FAILURE;
        }
    };
    match Daemon::start(&pipe, &logs, settings) {
        Ok(mut d) => {
            say("ready");
            d.serve()
        }
        Err(why) => {
            say(&format!("error: nvidia-cuda-mps-control: {why}"));
            ExitCode::FAILURE
        }
    }
}

/// A simulated MPS server: waits until the daemon stops it.
pub(crate) fn run_server(uid: &str) -> ExitCode {
    if uid.parse::<u32>().is_err() {
        eprintln!("nvidia-cuda-mps-control: server uid {uid:?} is not a number");
        return ExitCode::from(2);
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The effective uid, from `/proc/self/status` (`Uid:` real, effective, …).
fn euid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// `YYYY-MM-DD HH:MM:SS.mmm` in UTC, as control.log stamps its lines.
fn timestamp() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_millis()
    )
}

/// A running daemon.
struct Daemon {
    pipe: PathBuf,
    listener: UnixListener,
    /// Held for the daemon's life: a second daemon on this pipe directory cannot take it.
    _lock: File,
    log: File,
    record: Record,
    settings: Settings,
    control: Control,
    servers: BTreeMap<u32, Child>,
    started: Instant,
    commands: u64,
}

impl Daemon {
    fn start(pipe: &Path, logs: &Path, settings: Settings) -> Result<Daemon, String> {
        for dir in [pipe, logs] {
            fsmode::create_dir_all(dir, fsmode::STATE_DIR)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let record = Record::new(&settings, logs);
        if let Some(reason) = &settings.refuse_start {
            record.write("refused_start", json!({ "reason": reason }));
            return Err(reason.clone());
        }
        let lock_path = pipe.join(LOCK);
        let lock = fsmode::open(
            OpenOptions::new().create(true).truncate(false).write(true),
            &lock_path,
            fsmode::LOCK_FILE,
        )
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
        if lock.try_lock().is_err() {
            return Err(format!(
                "An instance of this daemon is already running (pipe directory {})",
                pipe.display()
            ));
        }
        if let Some(ms) = settings.start_delay_ms {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let socket = pipe.join(CONTROL);
        match fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove the stale {}: {e}", socket.display())),
        }
        let listener = fsmode::bind_socket(&socket, SOCKET_MODE, UnixListener::bind)
            .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
        let pid_path = pipe.join(PID_FILE);
        fsmode::write_file(
            &pid_path,
            format!("{}\n", std::process::id()).as_bytes(),
            fsmode::STATE_FILE,
        )
        .map_err(|e| format!("cannot write {}: {e}", pid_path.display()))?;
        let log_path = logs.join("control.log");
        let log = fsmode::open(
            OpenOptions::new().create(true).append(true),
            &log_path,
            fsmode::STATE_FILE,
        )
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let env: BTreeMap<String, String> = std::env::vars()
            .filter(|(k, _)| k.starts_with("CUDA_"))
            .collect();
        record.write(
            "start",
            json!({
                "pipe_dir": pipe.display().to_string(),
                "log_dir": logs.display().to_string(),
                "uid": euid(),
                "env": env,
            }),
        );
        let mut d = Daemon {
            pipe: pipe.to_owned(),
            listener,
            _lock: lock,
            log,
            record,
            settings,
            control: Control::default(),
            servers: BTreeMap::new(),
            started: Instant::now(),
            commands: 0,
        };
        d.log(&format!(
            "Starting control daemon using socket {}",
            socket.display()
        ));
        d.log(&format!(
            "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={}",
            pipe.display()
        ));
        Ok(d)
    }

    /// One control.log line, in the real daemon's `[time Control pid] message` form.
    fn log(&mut self, message: &str) {
        let line = format!(
            "[{} Control {}] {message}\n",
            timestamp(),
            std::process::id()
        );
        let _ = self.log.write_all(line.as_bytes());
    }

    /// Exits as a crash would: status 1, socket and pid file left behind.
    fn crash(&mut self, reason: &str) -> ! {
        self.record.write("exit", json!({ "reason": reason }));
        self.log(&format!("Simulated failure: {reason}"));
        std::process::exit(1)
    }

    fn serve(&mut self) -> ExitCode {
        loop {
            if let Some(s) = self.settings.die_after_seconds
                && self.started.elapsed().as_secs_f64() >= s
            {
                self.crash("die_after_seconds");
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.handle(stream) {
                        return self.quit();
                    }
                    if let Some(n) = self.settings.die_after_commands
                        && self.commands >= n
                    {
                        self.crash("die_after_commands");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(TICK),
                Err(e) => {
                    self.log(&format!("accept failed: {e}"));
                    std::thread::sleep(TICK);
                }
            }
        }
    }

    /// Serves one client connection (one command); true when it was `quit`.
    fn handle(&mut self, mut stream: UnixStream) -> bool {
        if stream.set_nonblocking(false).is_err()
            || stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .is_err()
        {
            return false;
        }
        let mut buf = String::new();
        if (&mut stream)
            .take(64 * 1024)
            .read_to_string(&mut buf)
            .is_err()
        {
            return false;
        }
        let command = buf.lines().next().unwrap_or("").trim().to_owned();
        self.log("Accepting connection...");
        self.log("NEW UI");
        self.log(&format!("Cmd:{command}"));
        let mut reply = self.control.execute(&command);
        match reply.effect.clone() {
            Effect::None | Effect::Quit => {}
            Effect::StartServer { uid } => match self.start_server(uid) {
                Ok(pid) => reply.text = pid.to_string(),
                Err(why) => {
                    reply.ok = false;
                    reply.text = why;
                }
            },
            Effect::ShutdownServer { pid } => self.stop_server(pid),
        }
        self.commands += 1;
        self.record.write(
            "command",
            json!({ "command": command, "ok": reply.ok, "reply": reply.text }),
        );
        self.log(&reply.text);
        let status = if reply.ok { "ok" } else { "error" };
        let _ = stream.write_all(format!("{status}\n{}", reply.text).as_bytes());
        self.log("UI closed");
        reply.effect == Effect::Quit
    }

    fn start_server(&mut self, uid: u32) -> Result<u32, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let child = Command::new(exe)
            .args([SERVER_ARG, &uid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start an MPS server: {e}"))?;
        let pid = child.id();
        self.servers.insert(pid, child);
        let s = self.control.add_server(pid, uid).clone();
        self.log(&format!("Starting new server {pid} for user {uid}"));
        self.record.write(
            "server_start",
            json!({
                "pid": pid,
                "uid": uid,
                "active_thread_percentage": s.active_thread_percentage,
                "pinned_mem_limits": s.pinned_mem_limits,
            }),
        );
        Ok(pid)
    }

    fn stop_server(&mut self, pid: u32) {
        if let Some(mut child) = self.servers.remove(&pid) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.control.remove_server(pid);
        self.log(&format!("Server {pid} exited"));
        self.record.write("server_exit", json!({ "pid": pid }));
    }

    fn quit(&mut self) -> ExitCode {
        let pids: Vec<u32> = self.servers.keys().copied().collect();
        for pid in pids {
            self.stop_server(pid);
        }
        for name in [CONTROL, PID_FILE] {
            let _ = fs::remove_file(self.pipe.join(name));
        }
        self.log("Exit");
        self.record.write("exit", json!({ "reason": "quit" }));
        ExitCode::SUCCESS
    }
}
