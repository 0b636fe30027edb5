//! The `nvidia-cuda-mps-control` stand-in for tests: a temp directory holding a copy of the
//! program (built by `cargo build -p nvml-sim --bins`) and its `mps-sim.json` settings, whose
//! record goes to `record.jsonl` there. Put [`MpsControl::bin_dir`] first on `PATH`, or run
//! [`MpsControl::program`], exactly as a node runs NVIDIA's program.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tempfile::TempDir;

/// The environment variable naming the built stand-in to use.
pub const BIN_ENV: &str = "NVML_SIM_MPS_CONTROL";

/// The program's name, as NVIDIA ships it.
pub const PROGRAM: &str = "nvidia-cuda-mps-control";

/// An installed stand-in, removed on drop (daemons it started are not stopped: send `quit`).
#[derive(Debug)]
pub struct MpsControl {
    dir: TempDir,
}

impl MpsControl {
    /// Installs the stand-in with these settings (`mps-sim.json`; `{}` for none). A `record`
    /// is added (`<dir>/record.jsonl`) unless the settings name one.
    ///
    /// Panics with the reason when the program is not built or the files cannot be made.
    pub fn install(settings: &str) -> MpsControl {
        let dir = tempfile::Builder::new()
            .prefix("mps-sim-")
            .tempdir()
            .unwrap_or_else(|e| panic!("MpsControl: cannot create a temp dir: {e}"));
        let bin = program();
        let copy = dir.path().join(PROGRAM);
        fs::copy(&bin, &copy).unwrap_or_else(|e| {
            panic!(
                "MpsControl: cannot copy {} to {}: {e}",
                bin.display(),
                copy.display()
            )
        });
        let m = MpsControl { dir };
        m.set_settings(settings);
        m
    }

    /// Replaces the settings; daemons started from now on use them.
    pub fn set_settings(&self, settings: &str) {
        let mut value: serde_json::Value = serde_json::from_str(settings)
            .unwrap_or_else(|e| panic!("MpsControl: settings are not JSON: {e}"));
        let object = value
            .as_object_mut()
            .unwrap_or_else(|| panic!("MpsControl: settings are not a JSON object"));
        object.entry("record").or_insert_with(|| {
            serde_json::Value::String(self.dir.path().join("record.jsonl").display().to_string())
        });
        let path = self.dir.path().join("mps-sim.json");
        fs::write(&path, value.to_string())
            .unwrap_or_else(|e| panic!("MpsControl: cannot write {}: {e}", path.display()));
    }

    /// The directory holding `nvidia-cuda-mps-control`.
    pub fn bin_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The installed program.
    pub fn program(&self) -> PathBuf {
        self.dir.path().join(PROGRAM)
    }

    /// The record file (JSON lines; format in `nvml-sim/README.md`).
    pub fn record_path(&self) -> PathBuf {
        self.dir.path().join("record.jsonl")
    }

    /// The record so far, one JSON object per event (empty before the first event).
    pub fn records(&self) -> Vec<serde_json::Value> {
        let text = fs::read_to_string(self.record_path()).unwrap_or_default();
        text.lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("MpsControl: bad record line {l:?}: {e}"))
            })
            .collect()
    }

    /// Kills every daemon the stand-in started (daemons outlive whoever started them): a test's
    /// cleanup, whatever happened before.
    pub fn kill_daemons(&self) {
        for record in self.records().iter().filter(|r| r["event"] == "start") {
            if let Some(pid) = record["daemon_pid"].as_u64() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
    }

    /// Runs the program with these arguments and pipe/log directories, feeding `stdin`.
    pub fn run(&self, args: &[&str], pipe_dir: &Path, log_dir: &Path, stdin: &str) -> Output {
        use std::io::Write as _;
        let spawn = || {
            Command::new(self.program())
                .args(args)
                .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir)
                .env("CUDA_MPS_LOG_DIRECTORY", log_dir)
                .env_remove("NVML_SIM_MPS_CONFIG")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        };
        // A just-copied program can be briefly "busy": another test thread's fork may still
        // hold the copy's write descriptor until its exec closes it (ETXTBSY).
        let mut attempt = 0;
        let mut child = loop {
            match spawn() {
                Err(e) if e.raw_os_error() == Some(26) && attempt < 50 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => {
                    break other.unwrap_or_else(|e| {
                        panic!("MpsControl: cannot run {}: {e}", self.program().display())
                    });
                }
            }
        };
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(stdin.as_bytes());
        }
        child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("MpsControl: cannot wait for the program: {e}"))
    }
}

/// The built stand-in: [`BIN_ENV`], else beside the test executable or one directory up (where
/// cargo puts a package's binaries: `target/<profile>/`).
///
/// Panics, saying how to build it, when none exists.
pub fn program() -> PathBuf {
    find_program().unwrap_or_else(|why| panic!("{why}"))
}

/// [`program`], or why there is none (with how to build it).
pub fn find_program() -> Result<PathBuf, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the test executable: {e}"))?;
    find_program_for(std::env::var_os(BIN_ENV), &exe)
}

/// [`find_program`] for the executable `exe` and the value of [`BIN_ENV`].
fn find_program_for(env: Option<std::ffi::OsString>, exe: &Path) -> Result<PathBuf, String> {
    if let Some(path) = env {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{BIN_ENV}={} does not name a file", path.display()))
        };
    }
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join(PROGRAM), dir.join("..").join(PROGRAM)];
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "{PROGRAM} not found (looked at {}); build it with `cargo build -p nvml-sim --bins` (the profile of the test: `--release` for `cargo bench`) or set {BIN_ENV}",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// The cargo profile that built `exe`, a test or bench executable at
/// `target/<profile dir>/deps/<name>-<hash>` (`debug` is the `dev` profile's directory): the
/// `--profile` that builds nvml-sim's programs beside it.
pub fn profile_of(exe: &Path) -> Option<String> {
    let dir = exe.parent()?;
    if dir.file_name()? != "deps" {
        return None;
    }
    let profile = dir.parent()?.file_name()?.to_str()?;
    Some(if profile == "debug" { "dev" } else { profile }.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37: a checkout where nvml-sim's programs are not built says which command builds
    /// them (the soak panicked with "not found"), and finds them once built where cargo puts
    /// them (`target/<profile>/`, one directory above a test's `deps/`).
    #[test]
    fn a_missing_program_says_how_to_build_it_and_is_found_once_built() {
        let target = tempfile::tempdir().expect("tempdir");
        let deps = target.path().join("release/deps");
        fs::create_dir_all(&deps).expect("deps");
        let exe = deps.join("agent_soak-0123");
        let why = find_program_for(None, &exe).expect_err("nothing is built");
        assert!(
            why.contains("cargo build -p nvml-sim --bins")
                && why.contains(&*deps.to_string_lossy()),
            "{why}"
        );
        let built = target.path().join("release").join(PROGRAM);
        fs::write(&built, "").expect("stand-in");
        assert_eq!(
            find_program_for(None, &exe).map(|p| p.canonicalize().expect("canonical")),
            Ok(built.canonicalize().expect("canonical"))
        );
        let named = target.path().join("elsewhere");
        let why = find_program_for(Some(named.clone().into_os_string()), &exe)
            .expect_err("names no file");
        assert_eq!(
            why,
            format!("{BIN_ENV}={} does not name a file", named.display())
        );
    }

    #[test]
    fn profile_of_a_bench_or_test_executable() {
        for (dir, profile) in [
            ("debug", Some("dev")),
            ("release", Some("release")),
            ("bench", Some("bench")),
        ] {
            let exe = Path::new("/x/target")
                .join(dir)
                .join("deps/agent_soak-0123");
            assert_eq!(profile_of(&exe).as_deref(), profile, "{dir}");
        }
        assert_eq!(profile_of(Path::new("/usr/bin/agent_soak")), None);
    }
}
