//! The stand-in's settings file and its record of everything the daemon was told.
//!
//! Settings (`mps-sim.json` beside the executable, or `$NVML_SIM_MPS_CONFIG`; all optional):
//! `record` (path of the record file; default `<log dir>/mps-sim-record.jsonl`),
//! `refuse_start` (the daemon refuses to start with this message), `die_after_seconds` and
//! `die_after_commands` (the daemon then exits with status 1 without cleaning up, as a crash
//! leaves a stale socket and pid file), `start_delay_ms` (delay before the socket exists).
//!
//! The record is JSON lines, appended one whole line per write: every object has `time`
//! (seconds since the epoch), `daemon_pid` and `event`, one of `start` (with `pipe_dir`,
//! `log_dir`, `uid`, `env` = the `CUDA_*` variables it was started with), `refused_start`
//! (`reason`), `command` (`command`, `ok`, `reply`), `server_start` (`pid`, `uid`,
//! `active_thread_percentage`, `pinned_mem_limits`), `server_exit` (`pid`) and `exit`
//! (`reason`: `quit`, `signal <name>`, `die_after_seconds`, `die_after_commands`).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use mesos_gpu_os::fsmode;
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The settings file looked for beside the executable.
const CONFIG_FILE: &str = "mps-sim.json";
/// The environment variable naming the settings file.
const CONFIG_ENV: &str = "NVML_SIM_MPS_CONFIG";
/// The record's name in the log directory when the settings name none.
const RECORD_FILE: &str = "mps-sim-record.jsonl";

/// The stand-in's settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Settings {
    #[serde(default)]
    pub(crate) record: Option<PathBuf>,
    #[serde(default)]
    pub(crate) refuse_start: Option<String>,
    #[serde(default)]
    pub(crate) die_after_seconds: Option<f64>,
    #[serde(default)]
    pub(crate) die_after_commands: Option<u64>,
    #[serde(default)]
    pub(crate) start_delay_ms: Option<u64>,
}

/// Reads the settings: `$NVML_SIM_MPS_CONFIG` (which must exist), else `mps-sim.json` beside
/// the executable (optional). A relative `record` is relative to the settings file.
pub(crate) fn settings() -> Result<Settings, String> {
    let (path, required) = match std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty()) {
        Some(p) => (PathBuf::from(p), true),
        None => {
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot find this program's path: {e}"))?;
            (exe.with_file_name(CONFIG_FILE), false)
        }
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Settings::default());
        }
        Err(e) => return Err(format!("cannot read settings {}: {e}", path.display())),
    };
    let mut s: Settings = serde_json::from_str(&text).map_err(|e| {
        format!(
            "settings {}: {e}; accepted fields: record, refuse_start, die_after_seconds, die_after_commands, start_delay_ms",
            path.display()
        )
    })?;
    if let Some(r) = &s.record
        && r.is_relative()
    {
        s.record = Some(path.parent().unwrap_or(Path::new(".")).join(r));
    }
    Ok(s)
}

/// An open record: where lines go and whose they are.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    path: PathBuf,
    pid: u32,
}

impl Record {
    /// The record at the settings' path, else in `log_dir`.
    pub(crate) fn new(settings: &Settings, log_dir: &Path) -> Record {
        Record {
            path: settings
                .record
                .clone()
                .unwrap_or_else(|| log_dir.join(RECORD_FILE)),
            pid: std::process::id(),
        }
    }

    /// Appends one event; a record that cannot be written is reported on standard error (the
    /// daemon keeps serving: the record is for tests, not for clients).
    pub(crate) fn write(&self, event: &str, fields: Value) {
        let mut obj = Map::new();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        obj.insert("time".to_owned(), json!(now));
        obj.insert("daemon_pid".to_owned(), json!(self.pid));
        obj.insert("event".to_owned(), json!(event));
        if let Value::Object(more) = fields {
            obj.extend(more);
        }
        let line = format!("{}\n", Value::Object(obj));
        let written = fsmode::open(
            OpenOptions::new().create(true).append(true),
            &self.path,
            fsmode::STATE_FILE,
        )
        .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!(
                "nvidia-cuda-mps-control: cannot append to record {}: {e}",
                self.path.display()
            );
        }
    }
}
