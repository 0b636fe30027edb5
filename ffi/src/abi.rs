//! The exported `mgpu_` functions: decode, call the handle, encode, all inside `guard`.
//!
//! Ownership and buffer rules are written once in `ffi/README.md` and `crate::raw`. Every
//! function returning [`MgpuStatus`] writes its out-parameters only on `MGPU_OK`, except `*len`,
//! which `MGPU_BUFFER_TOO_SMALL` sets to the size needed.
//!
//! `prepare` has side effects (GPUs allocated, a cgroup made), so its answer is not computed
//! twice: when it does not fit, it is kept, and the retry with the same
//! container and the same request bytes returns exactly those bytes (`MgpuIsolator::replay`).

use std::ffi::{c_char, c_void};
use std::time::Duration;

use crate::handle::{MgpuIsolator, Replayable};
use crate::log::{MgpuLogCallback, MgpuLogLevel};
use crate::proto::mesos::slave::{ContainerConfig, ContainerRecoverInfo};
use crate::proto::mesos::{ContainerId, Parameters};
use crate::raw::{
    OutBuf, OutHandle, decode, decode_carrier, guard, guard_handle, in_bytes, in_str,
};
use crate::status::MgpuStatus;

/// `mgpu_watch` timeout meaning "until a limitation arrives or the container is cleaned up".
pub const MGPU_WAIT_FOREVER: u64 = 0xFFFF_FFFF_FFFF_FFFF;

/// The library version, a static NUL-terminated string (e.g. `0.1.0`).
#[unsafe(no_mangle)]
pub extern "C" fn mgpu_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The name of status `code` (e.g. `MGPU_NOT_ENOUGH_GPUS`) as a static NUL-terminated string,
/// or NULL for a number that is no status.
#[unsafe(no_mangle)]
pub extern "C" fn mgpu_status_name(code: u32) -> *const c_char {
    MgpuStatus::try_from(code).map_or(std::ptr::null(), |s| s.name().as_ptr())
}

/// Sets the process-wide log callback (NULL: stop forwarding) and the most verbose level
/// forwarded (`MgpuLogLevel` as a number; an unknown number is `MGPU_BAD_ARGUMENT`).
///
/// # Safety
/// `callback`, when set, must be safe to call from any thread, also concurrently, with
/// `userdata`, until it is replaced. `err` is NULL or valid for `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_set_log_callback(
    callback: MgpuLogCallback,
    userdata: *mut c_void,
    max_level: u32,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard(err, err_cap, || {
        let level = MgpuLogLevel::from_raw(max_level)?;
        crate::log::set_callback(callback, userdata, level);
        Ok(())
    })
}

/// Creates the isolator from the module parameters (a serialized `mesos.Parameters`), and on
/// success stores the new handle in `*out_handle`. Free it with `mgpu_isolator_free`.
///
/// # Safety
/// `params` is NULL or valid for `params_len` bytes; `out_handle` is NULL or valid for one
/// pointer write; `err` is NULL or valid for `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_isolator_new(
    params: *const u8,
    params_len: usize,
    out_handle: *mut *mut MgpuIsolator,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    crate::log::install();
    guard(err, err_cap, || {
        // SAFETY: contract above.
        let out = unsafe { OutHandle::new(out_handle) }?;
        // SAFETY: contract above.
        let params: Parameters = unsafe { decode(params, params_len, "params") }?;
        out.set(Box::new(MgpuIsolator::new(&params)?));
        Ok(())
    })
}

/// Frees a handle; NULL is accepted. Call it exactly once per handle, after every other call on
/// it has returned.
///
/// # Safety
/// `handle` is NULL or a handle from `mgpu_isolator_new` not freed yet, with no call on it in
/// progress.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_isolator_free(handle: *mut MgpuIsolator) {
    if handle.is_null() {
        return;
    }
    guard(std::ptr::null_mut(), 0, || {
        // SAFETY: `handle` came from `Box::into_raw` in `mgpu_isolator_new` and, by the contract,
        // is freed once with no other use in progress.
        drop(unsafe { Box::from_raw(handle) });
        Ok(())
    });
}

/// `Isolator::recover`: `info` is a serialized `mesos.slave.ContainerRecoverInfo` (the
/// checkpointed container states and the orphans).
///
/// # Safety
/// `handle` is NULL or live; `info` is NULL or valid for `info_len` bytes; `err` is NULL or
/// valid for `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_recover(
    handle: *const MgpuIsolator,
    info: *const u8,
    info_len: usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let info: ContainerRecoverInfo = unsafe { decode(info, info_len, "info") }?;
        h.recover(&info)
    })
}

/// `Isolator::prepare`: `id` is a serialized `mesos.ContainerID`, `config` a serialized
/// `mesos.slave.ContainerConfig`; the answer is a serialized `mesos.slave.ContainerLaunchInfo`
/// (no bytes: `None`, for a DEBUG container). After `MGPU_BUFFER_TOO_SMALL`, call again with
/// the same `id` and `config` bytes and a buffer of `*len` bytes: the answer kept from the first
/// call is returned and nothing is done twice.
///
/// # Safety
/// `handle` is NULL or live; `id`/`config` are NULL or valid for their lengths; `buf` is NULL or
/// valid for `cap` bytes of writes; `len` is NULL or valid for a write; `err` is NULL or valid
/// for `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_prepare(
    handle: *const MgpuIsolator,
    id: *const u8,
    id_len: usize,
    config: *const u8,
    config_len: usize,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above (all four).
        let (out, cid, request) = unsafe {
            (
                OutBuf::new(buf, cap, len)?,
                decode::<ContainerId>(id, id_len, "id")?,
                in_bytes(config, config_len, "config")?,
            )
        };
        let container = cid.to_string();
        let compute = || {
            // SAFETY: contract above.
            let config: ContainerConfig = unsafe { decode(config, config_len, "config") }?;
            h.prepare(&cid, &config)
        };
        h.replay(Replayable::Prepare, &container, request, compute, |bytes| {
            out.write(bytes)
        })
    })
}

/// `Isolator::isolate`: moves process `pid` into the container's cgroup.
///
/// # Safety
/// `handle` is NULL or live; `id` is NULL or valid for `id_len` bytes; `err` is NULL or valid for
/// `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_isolate(
    handle: *const MgpuIsolator,
    id: *const u8,
    id_len: usize,
    pid: i32,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let cid: ContainerId = unsafe { decode(id, id_len, "id") }?;
        h.isolate(&cid, pid)
    })
}

/// `Isolator::watch`, blocking: waits up to `timeout_ms` (0: just look; `MGPU_WAIT_FOREVER`: no
/// limit) for a limitation of the container, answered as a serialized
/// `mesos.slave.ContainerLimitation`. `MGPU_TIMED_OUT` when none arrived in time;
/// `MGPU_UNKNOWN_CONTAINER` when the container is unknown or was cleaned up while waiting. A
/// limitation stays available until the container's cleanup, so a retry after
/// `MGPU_BUFFER_TOO_SMALL` gets it again.
///
/// # Safety
/// As `mgpu_prepare`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_watch(
    handle: *const MgpuIsolator,
    id: *const u8,
    id_len: usize,
    timeout_ms: u64,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let (out, cid) = unsafe {
            (
                OutBuf::new(buf, cap, len)?,
                decode::<ContainerId>(id, id_len, "id")?,
            )
        };
        let timeout = (timeout_ms != MGPU_WAIT_FOREVER).then(|| Duration::from_millis(timeout_ms));
        out.write(&h.watch(&cid, timeout)?)
    })
}

/// `Isolator::update`: `requests` is a serialized `mesos.slave.ContainerConfig` of which only
/// `resources` (the resource requests) is read; serialize it with `SerializePartialToString`,
/// as its own required fields are not set (those of the resources inside it must be).
///
/// # Safety
/// `handle` is NULL or live; `id`/`requests` are NULL or valid for their lengths; `err` is NULL
/// or valid for `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_update(
    handle: *const MgpuIsolator,
    id: *const u8,
    id_len: usize,
    requests: *const u8,
    requests_len: usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let (cid, requests) = unsafe {
            (
                decode::<ContainerId>(id, id_len, "id")?,
                decode_carrier::<ContainerConfig>(requests, requests_len, "requests")?,
            )
        };
        h.update(&cid, &requests)
    })
}

/// `Isolator::usage`: the answer is a serialized `mesos.ResourceStatistics`.
///
/// # Safety
/// As `mgpu_prepare`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_usage(
    handle: *const MgpuIsolator,
    id: *const u8,
    id_len: usize,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let (out, cid) = unsafe {
            (
                OutBuf::new(buf, cap, len)?,
                decode::<ContainerId>(id, id_len, "id")?,
            )
        };
        out.write(&h.usage(&cid)?)
    })
}

/// `Isolator::status`: the answer is a serialized `mesos.ContainerStatus`.
///
/// # Safety
/// As `mgpu_prepare`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_status(
    handle: *const MgpuIsolator,
    id: *const u8,
    id_len: usize,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let (out, cid) = unsafe {
            (
                OutBuf::new(buf, cap, len)?,
                decode::<ContainerId>(id, id_len, "id")?,
            )
        };
        out.write(&h.status(&cid)?)
    })
}

/// `Isolator::cleanup`: removes the container's cgroup and releases its GPUs; an unknown
/// container is `MGPU_OK`, as in Mesos.
///
/// # Safety
/// As `mgpu_isolate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_cleanup(
    handle: *const MgpuIsolator,
    id: *const u8,
    id_len: usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let cid: ContainerId = unsafe { decode(id, id_len, "id") }?;
        h.cleanup(&cid)
    })
}

/// For the Docker containerizer: releases the container's GPUs; an unknown container is
/// `MGPU_OK`.
///
/// # Safety
/// As `mgpu_isolate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_docker_release(
    handle: *const MgpuIsolator,
    id: *const u8,
    id_len: usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let cid: ContainerId = unsafe { decode(id, id_len, "id") }?;
        h.docker_release(&cid)
    })
}

/// The node's GPU metrics in Prometheus's OpenMetrics text format (not NUL-terminated): NVML
/// figures, health with its reason, XIDs by code, GPUs allocated, free, quarantined and
/// unhealthy, and the allocator's allocations and refusals by reason. Collected at most once a
/// second; the module serves it on the agent's `/mesos-gpu/metrics`. Nothing is kept for a retry
/// after `MGPU_BUFFER_TOO_SMALL`: the answer is read anew and may be longer than `*len` said, so
/// grow the buffer beyond it (the shim doubles it, four times at most).
///
/// # Safety
/// `handle` is NULL or live; `(buf, cap, len)` as for `mgpu_prepare`; `err` is NULL or valid
/// for `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_metrics(
    handle: *const MgpuIsolator,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let out = unsafe { OutBuf::new(buf, cap, len) }?;
        out.write(&h.metrics()?)
    })
}

/// Every container the isolator knows, as JSON (not NUL-terminated): for each, its kind, its GPUs
/// (NVML index, minor, UUID, health, utilisation, memory used by its own processes, memory in
/// all, its processes), MIG devices and share of a shared GPU. The module serves it on the
/// agent's `/mesos-gpu/containers`: Mesos's JSON endpoints drop the GPU figures `mgpu_usage`
/// answers in field 1000. Read anew on each call (its timestamp, NVML's figures, the containers
/// change): retry after `MGPU_BUFFER_TOO_SMALL` as for `mgpu_metrics`.
///
/// # Safety
/// As `mgpu_metrics`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_containers(
    handle: *const MgpuIsolator,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let out = unsafe { OutBuf::new(buf, cap, len) }?;
        out.write(&h.containers()?)
    })
}

/// The operator's word that GPU `gpu` (a NUL-terminated NVML index such as `3` or UUID such as
/// `GPU-8a2d…`) is healthy again after a failure: it returns to the pool, and the health
/// checkpoint under `work_dir` records it. `MGPU_OK` also when it was healthy already;
/// `MGPU_BAD_ARGUMENT` for text that names no GPU of this node.
///
/// # Safety
/// `handle` is NULL or live; `gpu` is NULL or a NUL-terminated string; `err` is NULL or valid
/// for `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_gpu_mark_healthy(
    handle: *const MgpuIsolator,
    gpu: *const c_char,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let gpu = unsafe { in_str(gpu, "gpu") }?;
        h.mark_healthy(gpu)
    })
}

/// The agent flags that advertise this node's GPUs. `flags` is a serialized `mesos.Parameters`
/// holding the agent's own `resources`, `nvidia_gpu_devices` and `attributes` (each optional);
/// the answer is a serialized `mesos.Parameters` with `resources`, `attributes` and
/// `nvidia_gpu_devices`, each present when it has a value.
///
/// # Safety
/// As `mgpu_prepare`, with `flags` NULL or valid for `flags_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_agent_resources(
    handle: *const MgpuIsolator,
    flags: *const u8,
    flags_len: usize,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard_handle(handle, err, err_cap, |h| {
        // SAFETY: contract above.
        let (out, flags) = unsafe {
            (
                OutBuf::new(buf, cap, len)?,
                decode::<Parameters>(flags, flags_len, "flags")?,
            )
        };
        out.write(&h.agent_resources(&flags)?)
    })
}

/// For the agent's Docker hook: the command it runs for a Docker task, each argument
/// NUL-terminated, back to back, or no bytes (`*len` 0) when the task asks for no GPU and no MIG
/// device. `command` is the hook's `docker_args` module parameter (NUL-terminated, split on
/// spaces); `config` a serialized `mesos.slave.ContainerConfig` holding the task's `resources`
/// and its `container_info` (for the image); `container_name` the NUL-terminated Docker name
/// `mesos-<container id>`. Computes only, so a retry after `MGPU_BUFFER_TOO_SMALL` may pass any
/// larger buffer.
///
/// # Safety
/// `command` and `container_name` are NULL or NUL-terminated strings; `config` is NULL or valid
/// for `config_len` bytes; `(buf, cap, len)` as for `mgpu_prepare`; `err` is NULL or valid for
/// `err_cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_docker_hook_launch_argv(
    command: *const c_char,
    config: *const u8,
    config_len: usize,
    container_name: *const c_char,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard(err, err_cap, || {
        // SAFETY: contract above (all four).
        let (out, command, config, name) = unsafe {
            (
                OutBuf::new(buf, cap, len)?,
                in_str(command, "command")?,
                decode::<ContainerConfig>(config, config_len, "config")?,
                in_str(container_name, "container_name")?,
            )
        };
        let argv = crate::handle::timed("docker_hook_launch", &name, || {
            crate::hook::launch_argv(command, &config, name)
        })?;
        out.write(&argv.map_or_else(Vec::new, |a| crate::hook::nul_separated(&a)))
    })
}

/// For the agent's Docker hook: the command that gives back the GPUs of Docker container
/// `container_id` (NUL-terminated), each argument NUL-terminated, back to back.
///
/// # Safety
/// As `mgpu_docker_hook_launch_argv`, with `container_id` NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mgpu_docker_hook_release_argv(
    command: *const c_char,
    container_id: *const c_char,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut c_char,
    err_cap: usize,
) -> MgpuStatus {
    guard(err, err_cap, || {
        // SAFETY: contract above (all three).
        let (out, command, id) = unsafe {
            (
                OutBuf::new(buf, cap, len)?,
                in_str(command, "command")?,
                in_str(container_id, "container_id")?,
            )
        };
        out.write(&crate::hook::nul_separated(&crate::hook::release_argv(
            command, id,
        )?))
    })
}
