//! Shared by the FFI integration tests: a simulated node with mknod'ed device nodes, module
//! parameters under a unique cgroups root (removed on drop), and safe wrappers that call the
//! exported functions with caller-owned buffers.
#![allow(dead_code, clippy::unwrap_used)]

use std::ffi::{CStr, c_char};
use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Failed, Trial};
use mesos_gpu::proto::mesos::{ContainerId, Parameter, Parameters};
use mesos_gpu::{MgpuIsolator, MgpuStatus};
use mesos_gpu_testkit::nvml_sim::SimNode;
use prost::Message;

pub(crate) mod parts;

pub(crate) type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A trial running `f`.
pub(crate) fn trial(
    name: impl Into<String>,
    f: impl FnOnce() -> TestResult + Send + 'static,
) -> Trial {
    Trial::test(name, move || f().map_err(|e| Failed::from(e.to_string())))
}

/// Fails with `what` unless `cond`.
pub(crate) fn check(cond: bool, what: impl std::fmt::Display) -> TestResult {
    if cond {
        Ok(())
    } else {
        Err(what.to_string().into())
    }
}

/// The cgroup interface a fixture uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cg {
    V1,
    V2,
}

/// A simulated node and everything a handle needs, cleaned up on drop.
pub(crate) struct Fixture {
    pub(crate) sim: SimNode,
    pub(crate) dev: tempfile::TempDir,
    pub(crate) work: tempfile::TempDir,
    pub(crate) cgroups_root: String,
    pub(crate) parent: PathBuf,
    pub(crate) version: Cg,
}

/// The minors of the GPUs of `pcie-t4x4`, the topology the fixtures use.
pub(crate) const MINORS: [u32; 4] = [0, 1, 2, 3];

impl Fixture {
    /// `pcie-t4x4` (4 GPUs, minors 0–3) with its device nodes.
    pub(crate) fn new(version: Cg) -> TestResult<Fixture> {
        let sim = SimNode::shipped("pcie-t4x4");
        let dev = tempfile::Builder::new().prefix("mgpu-ffi-dev").tempdir()?;
        let mut specs: Vec<(String, u32, u32)> = MINORS
            .iter()
            .map(|m| (format!("nvidia{m}"), 195, *m))
            .collect();
        specs.push(("nvidiactl".into(), 195, 255));
        specs.push(("nvidia-uvm".into(), 240, 0));
        for (name, major, minor) in specs {
            mknod(&dev.path().join(&name), major, minor)?;
        }
        let work = tempfile::Builder::new().prefix("mgpu-ffi-work").tempdir()?;
        let cgroups_root = mesos_gpu_testkit::unique_name("ffi");
        let parent = match version {
            Cg::V1 => PathBuf::from("/sys/fs/cgroup/devices").join(&cgroups_root),
            Cg::V2 => v2_mount().join(&cgroups_root),
        };
        Ok(Fixture {
            sim,
            dev,
            work,
            cgroups_root,
            parent,
            version,
        })
    }

    /// The module parameters for this fixture, plus `extra`.
    pub(crate) fn params(&self, extra: &[(&str, &str)]) -> Parameters {
        let mut pairs: Vec<(String, String)> = vec![
            ("nvml_lib".into(), self.sim.lib_path().display().to_string()),
            ("dev_root".into(), self.dev.path().display().to_string()),
            ("work_dir".into(), self.work.path().display().to_string()),
            (
                "pool_dir".into(),
                self.work.path().join("pool").display().to_string(),
            ),
            ("cgroups_root".into(), self.cgroups_root.clone()),
            ("driver_volume".into(), "off".into()),
            ("policy".into(), "first-fit".into()),
        ];
        match self.version {
            Cg::V1 => {
                pairs.push(("cgroup_version".into(), "v1".into()));
                pairs.push(("cgroups_hierarchy".into(), "/sys/fs/cgroup".into()));
            }
            Cg::V2 => {
                pairs.push(("cgroup_version".into(), "v2".into()));
                pairs.push(("cgroup2_mount".into(), v2_mount().display().to_string()));
            }
        }
        pairs.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        Parameters {
            parameter: pairs
                .into_iter()
                .map(|(key, value)| Parameter { key, value })
                .collect(),
        }
    }

    /// The device node of GPU minor `m`.
    pub(crate) fn gpu_node(&self, m: u32) -> PathBuf {
        self.dev.path().join(format!("nvidia{m}"))
    }

    /// Container cgroups left under the parent.
    pub(crate) fn leftover_cgroups(&self) -> Vec<PathBuf> {
        mesos_gpu_testkit::subdirs(&self.parent)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for dir in self
            .leftover_cgroups()
            .into_iter()
            .chain([self.parent.clone()])
        {
            for _ in 0..50 {
                if !dir.exists() || std::fs::remove_dir(&dir).is_ok() {
                    break;
                }
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// The cgroup2 mount of this host.
pub(crate) fn v2_mount() -> PathBuf {
    mesos_gpu_testkit::cgroup2_root().unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup/unified"))
}

/// A top-level container id.
pub(crate) fn cid(value: &str) -> ContainerId {
    ContainerId {
        value: value.into(),
        parent: None,
    }
}

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: MgpuStatus,
    pub(crate) bytes: Vec<u8>,
    pub(crate) err: String,
}

impl Answer {
    /// Fails unless the status is `MGPU_OK`.
    pub(crate) fn ok(self) -> TestResult<Vec<u8>> {
        check(
            self.status == MgpuStatus::MgpuOk,
            format!("{:?}: {}", self.status, self.err),
        )?;
        Ok(self.bytes)
    }

    /// The size `*len` asked for after `MGPU_BUFFER_TOO_SMALL` (0 for any other status).
    pub(crate) fn needed(&self) -> usize {
        match self.status {
            MgpuStatus::MgpuBufferTooSmall => {
                usize::from_le_bytes(self.bytes.clone().try_into().unwrap_or_default())
            }
            _ => 0,
        }
    }

    /// Fails unless the status is `status` and the error text contains `text`.
    pub(crate) fn expect(&self, status: MgpuStatus, text: &str) -> TestResult {
        check(
            self.status == status && self.err.contains(text),
            format!(
                "expected {status:?} with {text:?}, got {:?}: {:?}",
                self.status, self.err
            ),
        )
    }
}

/// The error text in a NUL-terminated buffer.
pub(crate) fn text(buf: &[u8]) -> String {
    CStr::from_bytes_until_nul(buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "<no NUL>".into())
}

/// Signature of a call with an output buffer, as a closure over everything else.
pub(crate) type OutCall<'a> =
    dyn FnMut(*mut u8, usize, *mut usize, *mut c_char, usize) -> MgpuStatus + 'a;

/// Calls `f` with a buffer of `cap` bytes (no growing).
pub(crate) fn call_cap(cap: usize, f: &mut OutCall<'_>) -> Answer {
    let mut buf = vec![0u8; cap];
    let mut len = usize::MAX;
    let mut err = [0u8; 1024];
    let ptr = if cap == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr()
    };
    let status = f(ptr, cap, &mut len, err.as_mut_ptr().cast(), err.len());
    let bytes = match status {
        MgpuStatus::MgpuOk => buf[..len].to_vec(),
        MgpuStatus::MgpuBufferTooSmall => len.to_le_bytes().to_vec(),
        _ => Vec::new(),
    };
    Answer {
        status,
        bytes,
        err: text(&err),
    }
}

/// Calls `f`, growing the buffer once to exactly `*len` on `MGPU_BUFFER_TOO_SMALL`, as the C++
/// shim's `callWithBuffer` does: for the calls whose answer the library keeps for that retry.
pub(crate) fn call(f: &mut OutCall<'_>) -> Answer {
    let first = call_cap(64, f);
    if first.status != MgpuStatus::MgpuBufferTooSmall {
        return first;
    }
    call_cap(first.needed(), f)
}

/// Calls `f`, doubling what `*len` asked for until the answer fits (four tries), as the C++
/// shim's `MetricsProcess::fetch` does: for answers read anew on each call (`mgpu_metrics`,
/// `mgpu_containers`), which can be longer on the retry than `*len` said (a later timestamp
/// has more digits, a new container appeared).
pub(crate) fn call_growing(f: &mut OutCall<'_>) -> Answer {
    let mut answer = call_cap(64, f);
    for _ in 0..4 {
        if answer.status != MgpuStatus::MgpuBufferTooSmall {
            break;
        }
        answer = call_cap(answer.needed() * 2, f);
    }
    answer
}

/// Calls `f`, which has no output buffer.
pub(crate) fn call_plain(f: impl FnOnce(*mut c_char, usize) -> MgpuStatus) -> Answer {
    let mut err = [0u8; 1024];
    let status = f(err.as_mut_ptr().cast(), err.len());
    Answer {
        status,
        bytes: Vec::new(),
        err: text(&err),
    }
}

/// A handle from `params`.
pub(crate) fn new_handle(params: &Parameters) -> Result<*mut MgpuIsolator, Answer> {
    let bytes = params.encode_to_vec();
    let mut handle: *mut MgpuIsolator = std::ptr::null_mut();
    // SAFETY: every pointer is to a live local with the length given.
    let answer = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_isolator_new(bytes.as_ptr(), bytes.len(), &mut handle, e, c)
    });
    if answer.status == MgpuStatus::MgpuOk {
        Ok(handle)
    } else {
        Err(answer)
    }
}

/// A handle that is freed on drop.
pub(crate) struct Handle(pub(crate) *mut MgpuIsolator);

// SAFETY: the handle is documented as safe to use from many threads at once.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Handle {
    pub(crate) fn new(params: &Parameters) -> TestResult<Handle> {
        new_handle(params)
            .map(Handle)
            .map_err(|a| format!("mgpu_isolator_new: {:?}: {}", a.status, a.err).into())
    }

    pub(crate) fn prepare(&self, id: &ContainerId, config: &[u8]) -> Answer {
        let id = id.encode_to_vec();
        // SAFETY: live handle, buffers of the lengths given.
        call(&mut |b, c, l, e, ec| unsafe {
            mesos_gpu::mgpu_prepare(
                self.0,
                id.as_ptr(),
                id.len(),
                config.as_ptr(),
                config.len(),
                b,
                c,
                l,
                e,
                ec,
            )
        })
    }

    pub(crate) fn cleanup(&self, id: &ContainerId) -> Answer {
        let id = id.encode_to_vec();
        // SAFETY: as above.
        call_plain(|e, c| unsafe { mesos_gpu::mgpu_cleanup(self.0, id.as_ptr(), id.len(), e, c) })
    }

    pub(crate) fn status(&self, id: &ContainerId) -> Answer {
        let id = id.encode_to_vec();
        // SAFETY: as above.
        call(&mut |b, c, l, e, ec| unsafe {
            mesos_gpu::mgpu_status(self.0, id.as_ptr(), id.len(), b, c, l, e, ec)
        })
    }

    pub(crate) fn recover(&self, info: &[u8]) -> Answer {
        // SAFETY: as above.
        call_plain(|e, c| unsafe {
            mesos_gpu::mgpu_recover(self.0, info.as_ptr(), info.len(), e, c)
        })
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `mgpu_isolator_new`, freed once here, no call in progress.
        unsafe { mesos_gpu::mgpu_isolator_free(self.0) };
    }
}

/// The built `libmesos_gpu.so` beside the test binary (`target/<profile>/deps`).
pub(crate) fn cdylib() -> TestResult<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    [dir.join("libmesos_gpu.so"), dir.join("../libmesos_gpu.so")]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| format!("libmesos_gpu.so not found beside {}", exe.display()).into())
}

/// `ffi/include`, holding the generated header.
pub(crate) fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// A serialized `ContainerConfig` asking for `gpus` GPUs (host filesystem).
pub(crate) fn config(gpus: f64) -> Vec<u8> {
    use mesos_gpu::proto::mesos::slave::ContainerConfig;
    ContainerConfig {
        resources: vec![mesos_gpu::testing::gpus_resource(gpus)],
        directory: "/tmp/sandbox".into(),
        ..ContainerConfig::default()
    }
    .encode_to_vec()
}

/// The value of variable `name` in a launch info's environment or task environment.
pub(crate) fn env_var(
    info: &mesos_gpu::proto::mesos::slave::ContainerLaunchInfo,
    name: &str,
) -> Option<String> {
    info.environment
        .iter()
        .chain(info.task_environment.iter())
        .flat_map(|e| e.variables.iter())
        .find(|v| v.name == name)
        .and_then(|v| v.value.clone())
}

/// The command the agent's Docker hook runs for the container named `name` with `config` (a
/// serialized `ContainerConfig`) under the operator's command `line`, through the hook's C ABI
/// (`mgpu_docker_hook_launch_argv`); its error text when it refuses.
pub(crate) fn hook_launch_argv(
    line: &str,
    config: &[u8],
    name: &str,
) -> Result<Vec<String>, String> {
    let command = std::ffi::CString::new(line).map_err(|e| e.to_string())?;
    let name = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 8192];
    let mut len = 0usize;
    let mut err = vec![0u8; 1024];
    // SAFETY: both strings are NUL-terminated and live across the call; `config` is valid for
    // its length; `buf`, `len` and `err` are live, writable and as large as said.
    let status = unsafe {
        mesos_gpu::mgpu_docker_hook_launch_argv(
            command.as_ptr(),
            config.as_ptr(),
            config.len(),
            name.as_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
            &raw mut len,
            err.as_mut_ptr().cast(),
            err.len(),
        )
    };
    if status != MgpuStatus::MgpuOk {
        let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
        return Err(String::from_utf8_lossy(&err[..end]).into_owned());
    }
    Ok(buf[..len]
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
}

/// The built `mesos-gpu` program: `$MESOS_GPU_BIN`, else in the target directory beside this
/// test.
pub(crate) fn mesos_gpu_bin() -> TestResult<PathBuf> {
    if let Some(path) = std::env::var_os("MESOS_GPU_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or("the test has no directory")?;
    [dir.join("mesos-gpu"), dir.join("../mesos-gpu")]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "mesos-gpu is not built beside this test: run `cargo build -p mesos-gpu` or set MESOS_GPU_BIN"
                .into()
        })
}

/// `mknod PATH c MAJOR MINOR`.
pub(crate) fn mknod(path: &Path, major: u32, minor: u32) -> TestResult {
    let out = Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .output()?;
    check(
        out.status.success(),
        format!(
            "mknod {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
