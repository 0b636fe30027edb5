//! GPU health through the exported `extern "C"` functions, on nvml-sim with real cgroups: an
//! XID on a GPU a container holds resolves its `mgpu_watch` with a `ContainerLimitation` naming
//! the GPU and the XID, the GPU stays out of the pool until `mgpu_gpu_mark_healthy`, the
//! `health_checks` module parameter decides which XIDs count, and bad GPU strings are refused
//! with a status and a message.

mod support;

use std::ffi::{CStr, CString, c_char, c_void};
use std::process::ExitCode;
use std::sync::Mutex;

use libtest_mimic::{Arguments, Trial};
use mesos_gpu::proto::mesos::slave::{ContainerLaunchInfo, ContainerLimitation};
use mesos_gpu::proto::mesos::{ContainerId, Parameter, Parameters};
use mesos_gpu::{MgpuLogLevel, MgpuStatus as S};
use mesos_gpu_testkit::{Host, Need, needs};
use prost::Message;
use support::{
    Answer, Cg, Fixture, Handle, TestResult, call, call_plain, check, cid, config, env_var,
    new_handle, trial,
};

/// How long a test waits for the monitor to see an event appended to nvml-sim's events file.
const EVENT_WAIT_MS: u64 = 10_000;

fn main() -> ExitCode {
    let host = Host::probe();
    let privileged = [Need::Root, Need::Cgroup1];
    let mut trials = vec![Trial::test("bad_health_checks_are_named", || {
        Ok(bad_health_checks_are_named()?)
    })];
    let mut add = |name: &str, f: fn(&Fixture) -> TestResult| {
        trials.push(needs(
            &host,
            &privileged,
            trial(name, move || with_fixture(f)),
        ));
    };
    add(
        "xid_limits_the_owner_until_marked_healthy",
        xid_limits_the_owner_until_marked_healthy,
    );
    add(
        "health_checks_parameter_ignores_xids",
        health_checks_parameter_ignores_xids,
    );
    add("bad_gpu_strings_are_refused", bad_gpu_strings_are_refused);
    add(
        "a_gpu_failure_is_logged_once_at_warn",
        a_gpu_failure_is_logged_once_at_warn,
    );
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// Runs `f` on a fresh V1 fixture, then checks that nothing is left behind.
fn with_fixture(f: fn(&Fixture) -> TestResult) -> TestResult {
    let fixture = Fixture::new(Cg::V1)?;
    f(&fixture)?;
    let left = fixture.leftover_cgroups();
    check(left.is_empty(), format!("cgroups left behind: {left:?}"))
}

/// `mgpu_watch` of `id` with a timeout in ms.
fn watch(h: &Handle, id: &ContainerId, timeout_ms: u64) -> Answer {
    let id = id.encode_to_vec();
    // SAFETY: live handle, locals of the lengths given.
    call(&mut |b, c, l, e, ec| unsafe {
        mesos_gpu::mgpu_watch(h.0, id.as_ptr(), id.len(), timeout_ms, b, c, l, e, ec)
    })
}

/// `mgpu_gpu_mark_healthy` with `gpu` as given (NULL allowed).
fn mark_healthy(h: &Handle, gpu: *const std::ffi::c_char) -> Answer {
    // SAFETY: live handle; `gpu` is NULL or a live NUL-terminated string.
    call_plain(|e, c| unsafe { mesos_gpu::mgpu_gpu_mark_healthy(h.0, gpu, e, c) })
}

/// The NVML indices (positions in the sim's description) of the GPUs a prepare answered.
fn prepared_indices(f: &Fixture, launch: &[u8]) -> TestResult<Vec<u32>> {
    let info = ContainerLaunchInfo::decode(launch)?;
    let visible = env_var(&info, "CUDA_VISIBLE_DEVICES").unwrap_or_default();
    let node: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.sim.config_path())?)?;
    let gpus = node["gpus"]
        .as_array()
        .ok_or("no gpus in the description")?;
    visible
        .split(',')
        .map(|uuid| {
            let i = gpus
                .iter()
                .position(|g| g["uuid"] == uuid)
                .ok_or_else(|| format!("unknown UUID {uuid:?} (CUDA_VISIBLE_DEVICES={visible})"))?;
            Ok(u32::try_from(i)?)
        })
        .collect()
}

/// The limitation `mgpu_watch` answered, or why there is none.
fn limitation(a: Answer) -> TestResult<ContainerLimitation> {
    Ok(ContainerLimitation::decode(a.ok()?.as_slice())?)
}

/// Prepares and cleans up a container asking for `gpus`, answering the prepare's status.
fn try_prepare(h: &Handle, name: &str, gpus: f64) -> TestResult<Answer> {
    let id = cid(name);
    let a = h.prepare(&id, &config(gpus));
    h.cleanup(&id).ok()?;
    Ok(a)
}

fn xid_limits_the_owner_until_marked_healthy(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    let c1 = cid("c1");
    let held = prepared_indices(f, &h.prepare(&c1, &config(2.0)).ok()?)?;
    check(held.len() == 2, format!("c1 holds {held:?}"))?;
    watch(&h, &c1, 0).expect(S::MgpuTimedOut, "no limitation for container c1")?;

    let failed = held[1];
    f.sim.append_event(&format!("xid {failed} 79"));
    let lim = limitation(watch(&h, &c1, EVENT_WAIT_MS))?;
    let message = lim.message.clone().unwrap_or_default();
    check(
        message.contains(&format!("GPU {failed} ")) && message.contains("XID 79"),
        format!("limitation message {message:?}"),
    )?;
    // It stays until cleanup: a second watch answers it at once.
    check(
        limitation(watch(&h, &c1, 0))? == lim,
        "second watch differs",
    )?;
    h.cleanup(&c1).ok()?;

    // All 4 are free again but one is unhealthy: 4 are refused, 3 are given.
    try_prepare(&h, "c2", 4.0)?.expect(S::MgpuNotEnoughGpus, "")?;
    let c3 = cid("c3");
    let three = prepared_indices(f, &h.prepare(&c3, &config(3.0)).ok()?)?;
    check(
        !three.contains(&failed),
        format!("GPU {failed} failed but was given: {three:?}"),
    )?;
    h.cleanup(&c3).ok()?;

    let index = CString::new(failed.to_string())?;
    mark_healthy(&h, index.as_ptr()).ok()?;
    try_prepare(&h, "c4", 4.0)?.ok()?;
    // Healthy already: still OK.
    mark_healthy(&h, index.as_ptr()).ok()?;
    Ok(())
}

fn health_checks_parameter_ignores_xids(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[("health_checks", "79")]))?;
    let c1 = cid("c1");
    let held = prepared_indices(f, &h.prepare(&c1, &config(1.0)).ok()?)?;
    let gpu = *held.first().ok_or("c1 holds no GPU")?;
    // Events are seen in order: the limitation names the counted XID 48, not the ignored 79.
    f.sim.append_event(&format!("xid {gpu} 79"));
    f.sim.append_event(&format!("xid {gpu} 48"));
    let message = limitation(watch(&h, &c1, EVENT_WAIT_MS))?
        .message
        .unwrap_or_default();
    check(
        message.contains("XID 48") && !message.contains("XID 79"),
        format!("limitation message {message:?}"),
    )?;
    h.cleanup(&c1).ok()?;
    let index = CString::new(gpu.to_string())?;
    mark_healthy(&h, index.as_ptr()).ok()?;
    Ok(())
}

fn bad_gpu_strings_are_refused(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    mark_healthy(&h, std::ptr::null()).expect(S::MgpuNullArgument, "argument `gpu` is NULL")?;
    mark_healthy(&h, c"bogus".as_ptr()).expect(
        S::MgpuBadArgument,
        "argument `gpu`: \"bogus\" is not a GPU: expected an NVML index such as 3 or a UUID",
    )?;
    mark_healthy(&h, c"a\xffb".as_ptr()).expect(
        S::MgpuBadArgument,
        "argument `gpu` is not UTF-8: \"a\u{fffd}b\"",
    )?;
    mark_healthy(&h, c"9".as_ptr()).expect(S::MgpuBadArgument, "GPU 9 is not on this node")?;
    mark_healthy(&h, c"GPU-00000000-dead-beef-0000-000000000000".as_ptr()).expect(
        S::MgpuBadArgument,
        "GPU GPU-00000000-dead-beef-0000-000000000000 is not on this node",
    )?;
    // SAFETY: NULL handle is refused before `gpu` is read.
    let a = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_gpu_mark_healthy(std::ptr::null(), c"0".as_ptr(), e, c)
    });
    a.expect(S::MgpuNullArgument, "argument `handle` is NULL")?;
    // Nothing was changed: all 4 GPUs can be prepared.
    try_prepare(&h, "all", 4.0)?.ok()?;
    Ok(())
}

fn bad_health_checks_are_named() -> TestResult {
    let params = Parameters {
        parameter: [("work_dir", "/nonexistent"), ("health_checks", "79,+79")]
            .iter()
            .map(|(k, v)| Parameter {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
    };
    match new_handle(&params) {
        Ok(handle) => {
            drop(Handle(handle));
            Err("a conflicting health_checks was accepted".into())
        }
        Err(a) => a.expect(
            S::MgpuBadArgument,
            "module parameter health_checks: health checks \"79,+79\": XID 79 is both ignored",
        ),
    }
}

static LOGS: Mutex<Vec<(MgpuLogLevel, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn record(
    level: MgpuLogLevel,
    _target: *const c_char,
    message: *const c_char,
    _userdata: *mut c_void,
) {
    // SAFETY: the library passes a NUL-terminated string valid during the call.
    let message = unsafe { CStr::from_ptr(message) };
    if let Ok(mut logs) = LOGS.lock() {
        logs.push((level, message.to_string_lossy().into_owned()));
    }
}

/// One XID on a GPU a container holds: one WARN line (the monitor's, naming GPU and XID), and
/// the owner named at INFO, not three warnings for one failure.
fn a_gpu_failure_is_logged_once_at_warn(f: &Fixture) -> TestResult {
    // SAFETY: `record` is thread-safe; no userdata.
    call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_set_log_callback(Some(record), std::ptr::null_mut(), 2, e, c)
    })
    .ok()?;
    let h = Handle::new(&f.params(&[]))?;
    let owner = cid("logged-once");
    let held = prepared_indices(f, &h.prepare(&owner, &config(1.0)).ok()?)?;
    let gpu = *held.first().ok_or("no GPU held")?;
    // XID 119 (GSP RPC timeout): counted, and used by no other test of this binary.
    f.sim.append_event(&format!("xid {gpu} 119"));
    limitation(watch(&h, &owner, EVENT_WAIT_MS))?;
    h.cleanup(&owner).ok()?;
    // SAFETY: clearing the callback.
    call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_set_log_callback(None, std::ptr::null_mut(), 2, e, c)
    })
    .ok()?;
    let logs = LOGS.lock().map_err(|_| "poisoned")?;
    let about: Vec<&(MgpuLogLevel, String)> = logs
        .iter()
        .filter(|(_, m)| m.contains("XID 119") || m.contains("logged-once"))
        .collect();
    let warnings: Vec<&String> = about
        .iter()
        .filter(|(l, _)| *l <= MgpuLogLevel::MgpuLogWarn)
        .map(|(_, m)| m)
        .collect();
    check(
        warnings.len() == 1 && warnings[0].contains(&format!("GPU {gpu} (")),
        format!("warnings: {warnings:#?}"),
    )?;
    check(
        about
            .iter()
            .any(|(l, m)| *l == MgpuLogLevel::MgpuLogInfo && m.contains("container=logged-once")),
        format!("the owner is named: {about:#?}"),
    )
}
