//! Hostile calls through the exported `extern "C"` functions, from Rust: NULL for every pointer,
//! garbage and truncated protobuf, unknown containers, buffers one byte short, short error
//! buffers, free-then-new, a forced panic, unknown codes and many threads at once. Every call's
//! status and message is asserted, and each trial ends by checking that no GPU is leaked and no
//! cgroup is left behind.

mod support;

use std::collections::HashSet;
use std::ffi::{CStr, c_char, c_void};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Trial};
use mesos_gpu::proto::mesos::slave::{ContainerConfig, ContainerLaunchInfo, ContainerRecoverInfo};
use mesos_gpu::proto::mesos::{Parameter, Parameters, ResourceStatistics};
use mesos_gpu::{MGPU_WAIT_FOREVER, MgpuLogLevel, MgpuStatus as S};
use mesos_gpu_testkit::{Host, Need, needs};
use prost::Message;
use support::{
    Answer, Cg, Fixture, Handle, TestResult, call, call_cap, call_growing, call_plain, check, cid,
    config, env_var, text, trial,
};

fn main() -> ExitCode {
    let host = Host::probe();
    let privileged = [Need::Root, Need::Cgroup1];
    let mut trials = vec![
        Trial::test("unknown_codes_are_refused", || {
            Ok(unknown_codes_are_refused()?)
        }),
        Trial::test("error_buffers_of_every_size", || {
            Ok(error_buffers_of_every_size()?)
        }),
        Trial::test("bad_module_parameters_are_named", || {
            Ok(bad_module_parameters_are_named()?)
        }),
    ];
    let mut add = |name: &str, f: fn(&Fixture) -> TestResult| {
        trials.push(needs(
            &host,
            &privileged,
            trial(name, move || with_fixture(f)),
        ));
    };
    add("null_pointers_everywhere", null_pointers_everywhere);
    add(
        "issue_34_values_refused_at_creation_are_bad_arguments",
        issue_34_values_refused_at_creation_are_bad_arguments,
    );
    add("garbage_and_truncated_bytes", garbage_and_truncated_bytes);
    add("usage_carries_nvml_figures", usage_carries_nvml_figures);
    add(
        "messages_missing_required_fields_are_refused",
        messages_missing_required_fields_are_refused,
    );
    add("unknown_containers", unknown_containers);
    add(
        "buffer_one_byte_short_then_retry",
        buffer_one_byte_short_then_retry,
    );
    add("bad_requests_change_nothing", bad_requests_change_nothing);
    add("free_then_new_recovers", free_then_new_recovers);
    add(
        "forced_panic_poisons_the_handle",
        forced_panic_poisons_the_handle,
    );
    add(
        "many_threads_never_share_a_gpu",
        many_threads_never_share_a_gpu,
    );
    add(
        "watch_times_out_and_ends_at_cleanup",
        watch_times_out_and_ends_at_cleanup,
    );
    add("logs_reach_the_callback", logs_reach_the_callback);
    add(
        "containers_answer_each_containers_gpus_as_json",
        containers_answer_each_containers_gpus_as_json,
    );
    add(
        "tables_return_to_idle_after_many_containers",
        tables_return_to_idle_after_many_containers,
    );
    add("the_module_heap_is_counted", the_module_heap_is_counted);
    add(
        "agent_resources_describe_the_node",
        agent_resources_describe_the_node,
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

/// Checks that all 4 GPUs are free: a container can take them all.
fn all_free(h: &Handle) -> TestResult {
    let probe = cid("all-free-probe");
    h.prepare(&probe, &config(4.0)).ok()?;
    h.cleanup(&probe).ok()?;
    Ok(())
}

fn unknown_codes_are_refused() -> TestResult {
    check(
        mesos_gpu::mgpu_status_name(14).is_null(),
        "status 14 has a name",
    )?;
    check(
        mesos_gpu::mgpu_status_name(u32::MAX).is_null(),
        "status u32::MAX has a name",
    )?;
    // SAFETY: a non-NULL answer is a static NUL-terminated string.
    let name = unsafe { CStr::from_ptr(mesos_gpu::mgpu_status_name(3)) };
    check(name == c"MGPU_BUFFER_TOO_SMALL", format!("{name:?}"))?;
    // SAFETY: no callback; the error buffer is a live local.
    let a = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_set_log_callback(None, std::ptr::null_mut(), 7, e, c)
    });
    a.expect(
        S::MgpuBadArgument,
        "log level 7: expected 0 (error) to 4 (trace)",
    )?;
    // SAFETY: `mgpu_version` answers a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr(mesos_gpu::mgpu_version()) };
    check(
        version.to_str()? == env!("CARGO_PKG_VERSION"),
        format!("{version:?}"),
    )
}

fn new_with_err(params: &[u8], err: *mut c_char, cap: usize) -> S {
    let mut handle = std::ptr::null_mut();
    // SAFETY: `params` is live; `err` is NULL or valid for `cap` bytes (callers).
    unsafe { mesos_gpu::mgpu_isolator_new(params.as_ptr(), params.len(), &mut handle, err, cap) }
}

fn error_buffers_of_every_size() -> TestResult {
    let params = Parameters {
        parameter: vec![Parameter {
            key: "pölicy".into(),
            value: "x".into(),
        }],
    }
    .encode_to_vec();
    let full = "unknown module parameter \"pölicy\": expected one of";
    // NULL error buffer, any capacity: nothing written, status still returned.
    check(
        new_with_err(&params, std::ptr::null_mut(), 100) == S::MgpuBadArgument,
        "NULL err",
    )?;
    for cap in [0usize, 1, 27, 28, 29, 30, 200] {
        let mut buf = vec![0xAAu8; 210];
        check(
            new_with_err(&params, buf.as_mut_ptr().cast(), cap) == S::MgpuBadArgument,
            format!("cap {cap}"),
        )?;
        check(
            buf[cap..].iter().all(|&b| b == 0xAA),
            format!("cap {cap}: wrote past the capacity"),
        )?;
        if cap == 0 {
            continue;
        }
        let got = text(&buf);
        // `unknown module parameter "p` is 27 bytes; `ö` takes bytes 27 and 28, so with room
        // for 28 bytes of text (cap 29) it would be cut in half and is left out.
        let want_len = match cap {
            1 => 0,
            27 => 26,
            28 | 29 => 27,
            30 => 29,
            _ => got.len(),
        };
        check(
            got.len() == want_len && full.starts_with(&got[..got.len().min(full.len())]),
            format!("cap {cap}: {got:?}"),
        )?;
        check(std::str::from_utf8(got.as_bytes()).is_ok(), "not UTF-8")?;
    }
    Ok(())
}

fn bad_module_parameters_are_named() -> TestResult {
    let mut err = [0u8; 512];
    let status = new_with_err(&[0xff, 0xff, 0xff], err.as_mut_ptr().cast(), err.len());
    check(status == S::MgpuDecodeError, format!("{status:?}"))?;
    check(
        text(&err).starts_with("cannot decode `params` (3 bytes) as mesos.Parameters: "),
        text(&err),
    )?;
    let missing = Parameters::default().encode_to_vec();
    let status = new_with_err(&missing, err.as_mut_ptr().cast(), err.len());
    check(
        status == S::MgpuBadArgument && text(&err) == "module parameter \"work_dir\" is required",
        text(&err),
    )?;
    let no_nvml = Parameters {
        parameter: vec![
            Parameter {
                key: "work_dir".into(),
                value: "/nonexistent".into(),
            },
            Parameter {
                key: "nvml_lib".into(),
                value: "/nonexistent/libnvidia-ml.so.1".into(),
            },
        ],
    }
    .encode_to_vec();
    let status = new_with_err(&no_nvml, err.as_mut_ptr().cast(), err.len());
    check(
        status == S::MgpuInternal
            && text(&err).starts_with(
                "cannot discover GPUs: cannot load the NVML library /nonexistent/libnvidia-ml.so.1: ",
            ),
        text(&err),
    )
}

/// Issue 34: a parameter value the isolator refuses while it is created from the parameters (a
/// device list or a share naming a GPU the 4-GPU node lacks, a GPU listed twice) is
/// `MGPU_BAD_ARGUMENT`, as every refused parameter (before: `MGPU_INTERNAL`, kept for the host).
fn issue_34_values_refused_at_creation_are_bad_arguments(f: &Fixture) -> TestResult {
    let cases: [(&[(&str, &str)], &str); 3] = [
        (
            &[("nvidia_gpu_devices", "9")],
            "cannot create the GPU isolator: cannot set up the isolator's allocator: GPU 9 is not \
             managed by this allocator",
        ),
        (
            &[("nvidia_gpu_devices", "0,0")],
            "GPU 0 is listed more than once",
        ),
        (
            &[("gpu_replicas", "7=2")],
            "GPU sharing spec names GPU \"7\", which is not advertised",
        ),
    ];
    for (extra, says) in cases {
        match support::new_handle(&f.params(extra)) {
            Ok(handle) => {
                drop(Handle(handle));
                return Err(format!("{extra:?}: the isolator was created").into());
            }
            Err(a) => check(
                a.status == S::MgpuBadArgument && a.err.contains(says),
                format!("{extra:?}: {:?}: {}", a.status, a.err),
            )?,
        }
    }
    Ok(())
}

fn null_pointers_everywhere(f: &Fixture) -> TestResult {
    let params = f.params(&[]).encode_to_vec();
    let mut err = [0u8; 256];
    let (e, ec) = (err.as_mut_ptr().cast::<c_char>(), err.len());
    let null_out = std::ptr::null_mut();
    // SAFETY: NULL where tested, live locals elsewhere.
    let status =
        // SAFETY: live handle and locals of the lengths given.
        unsafe { mesos_gpu::mgpu_isolator_new(params.as_ptr(), params.len(), null_out, e, ec) };
    check(
        status == S::MgpuNullArgument && text(&err) == "argument `out_handle` is NULL",
        text(&err),
    )?;
    let mut handle = std::ptr::null_mut();
    // SAFETY: as above.
    let status =
        // SAFETY: live handle and locals of the lengths given.
        unsafe { mesos_gpu::mgpu_isolator_new(std::ptr::null(), params.len(), &mut handle, e, ec) };
    check(
        status == S::MgpuNullArgument
            && text(&err) == "argument `params` is NULL"
            && handle.is_null(),
        text(&err),
    )?;
    // SAFETY: NULL is accepted.
    unsafe { mesos_gpu::mgpu_isolator_free(std::ptr::null_mut()) };

    let h = Handle::new(&f.params(&[]))?;
    let id = cid("c1").encode_to_vec();
    let cfg = config(1.0);
    let mut buf = [0u8; 4096];
    let mut len = 0usize;
    let (b, c, l) = (buf.as_mut_ptr(), buf.len(), &mut len as *mut usize);
    let nul = std::ptr::null_mut();
    let noh: *const mesos_gpu::MgpuIsolator = std::ptr::null();
    type Case<'a> = Box<dyn Fn(*mut c_char, usize) -> S + 'a>;
    // SAFETY: in every closure below, NULL in the argument under test, live locals of the given
    // lengths elsewhere.
    let cases: Vec<(&str, Case<'_>)> = unsafe {
        vec![
            (
                "handle",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_prepare(
                        noh,
                        id.as_ptr(),
                        id.len(),
                        cfg.as_ptr(),
                        cfg.len(),
                        b,
                        c,
                        l,
                        e,
                        ec,
                    )
                }),
            ),
            (
                "id",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_prepare(
                        h.0,
                        std::ptr::null(),
                        id.len(),
                        cfg.as_ptr(),
                        cfg.len(),
                        b,
                        c,
                        l,
                        e,
                        ec,
                    )
                }),
            ),
            (
                "config",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_prepare(
                        h.0,
                        id.as_ptr(),
                        id.len(),
                        std::ptr::null(),
                        cfg.len(),
                        b,
                        c,
                        l,
                        e,
                        ec,
                    )
                }),
            ),
            (
                "buf",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_prepare(
                        h.0,
                        id.as_ptr(),
                        id.len(),
                        cfg.as_ptr(),
                        cfg.len(),
                        nul,
                        c,
                        l,
                        e,
                        ec,
                    )
                }),
            ),
            (
                "len",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_prepare(
                        h.0,
                        id.as_ptr(),
                        id.len(),
                        cfg.as_ptr(),
                        cfg.len(),
                        b,
                        c,
                        nul.cast(),
                        e,
                        ec,
                    )
                }),
            ),
            (
                "handle",
                Box::new(|e, ec| mesos_gpu::mgpu_recover(noh, cfg.as_ptr(), 1, e, ec)),
            ),
            (
                "info",
                Box::new(|e, ec| mesos_gpu::mgpu_recover(h.0, std::ptr::null(), 1, e, ec)),
            ),
            (
                "id",
                Box::new(|e, ec| mesos_gpu::mgpu_isolate(h.0, std::ptr::null(), 3, 1, e, ec)),
            ),
            (
                "handle",
                Box::new(|e, ec| mesos_gpu::mgpu_isolate(noh, id.as_ptr(), id.len(), 1, e, ec)),
            ),
            (
                "len",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_watch(h.0, id.as_ptr(), id.len(), 0, b, c, nul.cast(), e, ec)
                }),
            ),
            (
                "id",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_watch(h.0, std::ptr::null(), 2, 0, b, c, l, e, ec)
                }),
            ),
            (
                "handle",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_watch(noh, id.as_ptr(), id.len(), 0, b, c, l, e, ec)
                }),
            ),
            (
                "requests",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_update(h.0, id.as_ptr(), id.len(), std::ptr::null(), 4, e, ec)
                }),
            ),
            (
                "id",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_update(h.0, std::ptr::null(), 4, cfg.as_ptr(), cfg.len(), e, ec)
                }),
            ),
            (
                "handle",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_update(
                        noh,
                        id.as_ptr(),
                        id.len(),
                        cfg.as_ptr(),
                        cfg.len(),
                        e,
                        ec,
                    )
                }),
            ),
            (
                "buf",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_usage(h.0, id.as_ptr(), id.len(), nul, 8, l, e, ec)
                }),
            ),
            (
                "id",
                Box::new(|e, ec| mesos_gpu::mgpu_usage(h.0, std::ptr::null(), 1, b, c, l, e, ec)),
            ),
            (
                "handle",
                Box::new(|e, ec| mesos_gpu::mgpu_usage(noh, id.as_ptr(), id.len(), b, c, l, e, ec)),
            ),
            (
                "len",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_status(h.0, id.as_ptr(), id.len(), b, c, nul.cast(), e, ec)
                }),
            ),
            (
                "handle",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_status(noh, id.as_ptr(), id.len(), b, c, l, e, ec)
                }),
            ),
            (
                "id",
                Box::new(|e, ec| mesos_gpu::mgpu_cleanup(h.0, std::ptr::null(), 5, e, ec)),
            ),
            (
                "handle",
                Box::new(|e, ec| mesos_gpu::mgpu_cleanup(noh, id.as_ptr(), id.len(), e, ec)),
            ),
            (
                "id",
                Box::new(|e, ec| mesos_gpu::mgpu_docker_release(h.0, std::ptr::null(), 1, e, ec)),
            ),
            (
                "handle",
                Box::new(|e, ec| mesos_gpu::mgpu_docker_release(noh, id.as_ptr(), id.len(), e, ec)),
            ),
            (
                "flags",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_agent_resources(h.0, std::ptr::null(), 1, b, c, l, e, ec)
                }),
            ),
            (
                "len",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_agent_resources(
                        h.0,
                        std::ptr::null(),
                        0,
                        b,
                        c,
                        nul.cast(),
                        e,
                        ec,
                    )
                }),
            ),
            (
                "handle",
                Box::new(|e, ec| {
                    mesos_gpu::mgpu_agent_resources(noh, std::ptr::null(), 0, b, c, l, e, ec)
                }),
            ),
        ]
    };
    for (i, (what, case)) in cases.iter().enumerate() {
        let a = call_plain(case);
        a.expect(S::MgpuNullArgument, &format!("argument `{what}` is NULL"))
            .map_err(|e| format!("case {i}: {e}"))?;
    }
    // A NULL buffer with capacity 0 is a size query, not an error.
    let c1 = cid("c1");
    h.prepare(&c1, &cfg).ok()?;
    // SAFETY: NULL buffer with cap 0 is allowed.
    let status = unsafe { mesos_gpu::mgpu_status(h.0, id.as_ptr(), id.len(), nul, 0, l, e, ec) };
    check(
        status == S::MgpuBufferTooSmall && len > 0,
        format!("size query: {status:?} len {len}"),
    )?;
    // Nothing above allocated anything but c1.
    h.cleanup(&c1).ok()?;
    all_free(&h)
}

/// Bytes prost decodes but libprotobuf refuses (`tests/required_libprotobuf.rs` compares the
/// two): refused at the ABI with the missing fields, and nothing changes.
fn messages_missing_required_fields_are_refused(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    h.prepare(&cid("c1"), &[]).expect(
        S::MgpuDecodeError,
        "cannot decode `config` (0 bytes) as mesos.slave.ContainerConfig: missing required \
         fields: command_info, directory",
    )?;
    // Truncated to its first field (directory): command_info is missing.
    let good = config(2.0);
    let first = usize::from(good[1]) + 2;
    h.prepare(&cid("c1"), &good[..first])
        .expect(S::MgpuDecodeError, "missing required fields: command_info")?;
    // A checkpointed container with only its pid.
    h.recover(&[0x0a, 0x02, 0x18, 0x01]).expect(
        S::MgpuDecodeError,
        "missing required fields: checkpointed_container_states[0].container_id, \
         checkpointed_container_states[0].directory",
    )?;
    all_free(&h)
}

/// `mgpu_usage` answers NVML's figures for each GPU in `gpu_statistics` (field 1000, ours:
/// Mesos's `ResourceStatistics` has no GPU field).
fn usage_carries_nvml_figures(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    let c = cid("u1");
    h.prepare(&c, &config(2.0)).ok()?;
    let id = c.encode_to_vec();
    // SAFETY: live handle and locals of the lengths given.
    let a = call(&mut |b, cap, l, e, ec| unsafe {
        mesos_gpu::mgpu_usage(h.0, id.as_ptr(), id.len(), b, cap, l, e, ec)
    });
    let stats = ResourceStatistics::decode(a.ok()?.as_slice())?;
    let node: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.sim.config_path())?)?;
    // (index, UUID, utilization, memory in all) of each GPU.
    type Figures = (Option<u32>, Option<String>, Option<u32>, Option<u64>);
    let got: Vec<Figures> = stats
        .gpu_statistics
        .iter()
        .map(|g| {
            (
                g.index,
                g.uuid.clone(),
                g.utilization_gpu_percent,
                g.memory_total_bytes,
            )
        })
        .collect();
    let want: Vec<Figures> = (0..2)
        .map(|i| {
            let gpu = &node["gpus"][i];
            (
                Some(u32::try_from(i).unwrap_or_default()),
                gpu["uuid"].as_str().map(str::to_owned),
                gpu["utilization"]["gpu"]
                    .as_u64()
                    .and_then(|u| u32::try_from(u).ok()),
                gpu["memory"]["total"].as_u64(),
            )
        })
        .collect();
    check(got == want, format!("{got:?} != {want:?}"))?;
    h.cleanup(&c).ok()?;
    all_free(&h)
}

/// `mgpu_containers` answers every container's GPUs with NVML's figures and health as JSON (what
/// the shim serves on `/mesos-gpu/containers`): a container with two GPUs lists them, one with
/// none lists none, a cleaned-up one is gone; NULLs and a small buffer are answered as for every
/// call.
fn containers_answer_each_containers_gpus_as_json(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    let (two, none) = (cid("two-gpus"), cid("no-gpu"));
    h.prepare(&two, &config(2.0)).ok()?;
    h.prepare(&none, &config(0.0)).ok()?;
    // SAFETY: live handle; the buffers are the helper's.
    let mut containers =
        |b, c, l, e, ec| unsafe { mesos_gpu::mgpu_containers(h.0, b, c, l, e, ec) };
    let small = call_cap(16, &mut containers);
    small.expect(S::MgpuBufferTooSmall, "")?;
    let json: serde_json::Value = serde_json::from_slice(&call_growing(&mut containers).ok()?)?;
    let node: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.sim.config_path())?)?;
    let listed = json["containers"].as_array().ok_or("no containers array")?;
    let find = |id: &str| listed.iter().find(|c| c["container"] == id);
    let with = find("two-gpus").ok_or_else(|| format!("two-gpus missing: {json:#}"))?;
    check(with["kind"] == "mesos", format!("kind: {with:#}"))?;
    let gpus = with["gpus"].as_array().ok_or("no gpus")?;
    check(gpus.len() == 2, format!("two GPUs expected: {with:#}"))?;
    for gpu in gpus {
        let i = usize::try_from(gpu["index"].as_u64().ok_or("no index")?)?;
        let described = &node["gpus"][i];
        check(
            gpu["uuid"] == described["uuid"]
                && gpu["minor"] == described["minor"]
                && gpu["utilization_gpu"] == described["utilization"]["gpu"]
                && gpu["memory_total"] == described["memory"]["total"]
                && gpu["health"]["state"] == "healthy",
            format!("GPU {i}: {gpu:#} against the node's {described:#}"),
        )?;
    }
    let without = find("no-gpu").ok_or_else(|| format!("no-gpu missing: {json:#}"))?;
    check(
        without["gpus"].as_array().is_some_and(Vec::is_empty),
        format!("a container without GPUs lists some: {without:#}"),
    )?;
    check(
        json["timestamp"].as_f64().is_some_and(|t| t > 0.0),
        "no timestamp",
    )?;
    h.cleanup(&two).ok()?;
    h.cleanup(&none).ok()?;
    let after: serde_json::Value = serde_json::from_slice(&call_growing(&mut containers).ok()?)?;
    check(
        after["containers"].as_array().is_some_and(Vec::is_empty),
        format!("cleaned-up containers still listed: {after:#}"),
    )?;
    let mut len = 0usize;
    let l: *mut usize = &mut len;
    let nul: *mut u8 = std::ptr::null_mut();
    let nulh: *const mesos_gpu::MgpuIsolator = std::ptr::null();
    call_plain(|e, ec| {
        // SAFETY: the NULL handle is what is refused; `l` points at a live local.
        unsafe { mesos_gpu::mgpu_containers(nulh, nul, 0, l, e, ec) }
    })
    .expect(S::MgpuNullArgument, "handle")?;
    call_plain(|e, ec| {
        // SAFETY: live handle; the NULL buffer with a capacity is what is refused.
        unsafe { mesos_gpu::mgpu_containers(h.0, nul, 8, l, e, ec) }
    })
    .expect(S::MgpuNullArgument, "buf")?;
    call_plain(|e, ec| {
        // SAFETY: live handle; the NULL `len` is what is refused.
        unsafe { mesos_gpu::mgpu_containers(h.0, nul, 0, std::ptr::null_mut(), e, ec) }
    })
    .expect(S::MgpuNullArgument, "len")?;
    all_free(&h)
}

fn garbage_and_truncated_bytes(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    let garbage = [0xffu8, 0xff, 0xff, 0x0f];
    let id = cid("c1").encode_to_vec();
    let good = config(2.0);
    let truncated = &good[..good.len() - 1];
    // SAFETY: live handle and locals of the lengths given.
    let a = call(&mut |b, c, l, e, ec| unsafe {
        // SAFETY: live locals of the given lengths.
        mesos_gpu::mgpu_prepare(
            h.0,
            garbage.as_ptr(),
            garbage.len(),
            good.as_ptr(),
            good.len(),
            b,
            c,
            l,
            e,
            ec,
        )
    });
    a.expect(
        S::MgpuDecodeError,
        "cannot decode `id` (4 bytes) as mesos.ContainerID: ",
    )?;
    // SAFETY: live handle and locals of the lengths given.
    let a = call(&mut |b, c, l, e, ec| unsafe {
        // SAFETY: as above.
        mesos_gpu::mgpu_prepare(
            h.0,
            id.as_ptr(),
            id.len(),
            truncated.as_ptr(),
            truncated.len(),
            b,
            c,
            l,
            e,
            ec,
        )
    });
    a.expect(
        S::MgpuDecodeError,
        &format!(
            "cannot decode `config` ({} bytes) as mesos.slave.ContainerConfig",
            truncated.len()
        ),
    )?;
    h.recover(&garbage)
        .expect(S::MgpuDecodeError, "as mesos.slave.ContainerRecoverInfo")?;
    // A valid id that is no cgroup name.
    let bad_id = cid("../etc");
    h.prepare(&bad_id, &good)
        .expect(S::MgpuBadArgument, "container id \"../etc\"")?;
    // A non-scalar gpus resource.
    let mut set = mesos_gpu::testing::gpus_resource(1.0);
    set.r#type = mesos_gpu::proto::mesos::value::Type::Set as i32;
    let cfg = ContainerConfig {
        resources: vec![set],
        ..ContainerConfig::default()
    }
    .encode_to_vec();
    h.prepare(&cid("c2"), &cfg).expect(
        S::MgpuBadArgument,
        "resource `gpus` of container c2 has type SET: expected SCALAR",
    )?;
    h.status(&cid("c1"))
        .expect(S::MgpuUnknownContainer, "unknown container")?;
    all_free(&h)
}

fn unknown_containers(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    h.recover(&ContainerRecoverInfo::default().encode_to_vec())
        .ok()?;
    let id = cid("nobody").encode_to_vec();
    let req = config(1.0);
    // SAFETY: live locals of the given lengths.
    let a = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_isolate(
            h.0,
            id.as_ptr(),
            id.len(),
            std::process::id().cast_signed(),
            e,
            c,
        )
    });
    a.expect(
        S::MgpuUnknownContainer,
        "cannot isolate container nobody: unknown container",
    )?;
    // SAFETY: live handle and locals of the lengths given.
    let a = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_update(h.0, id.as_ptr(), id.len(), req.as_ptr(), req.len(), e, c)
    });
    a.expect(
        S::MgpuUnknownContainer,
        "cannot update container nobody: unknown container",
    )?;
    // SAFETY: live handle and locals of the lengths given.
    let a = call(&mut |b, c, l, e, ec| unsafe {
        mesos_gpu::mgpu_usage(h.0, id.as_ptr(), id.len(), b, c, l, e, ec)
    });
    a.expect(S::MgpuUnknownContainer, "unknown container")?;
    h.status(&cid("nobody"))
        .expect(S::MgpuUnknownContainer, "unknown container")?;
    // SAFETY: live handle and locals of the lengths given.
    let a = call(&mut |b, c, l, e, ec| unsafe {
        mesos_gpu::mgpu_watch(h.0, id.as_ptr(), id.len(), 0, b, c, l, e, ec)
    });
    a.expect(S::MgpuUnknownContainer, "unknown container")?;
    h.cleanup(&cid("nobody")).ok()?;
    // SAFETY: as above.
    let a = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_docker_release(h.0, id.as_ptr(), id.len(), e, c)
    });
    a.ok()?;
    // A bad pid on a known container.
    let known = cid("known");
    h.prepare(&known, &config(0.0)).ok()?;
    let kid = known.encode_to_vec();
    // SAFETY: as above.
    let a = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_isolate(h.0, kid.as_ptr(), kid.len(), -1, e, c)
    });
    a.expect(S::MgpuBadArgument, "pid -1: expected a positive process id")?;
    // recover after use is refused.
    h.recover(&[])
        .expect(S::MgpuInvalidState, "recover must be the first call")?;
    h.cleanup(&known).ok()?;
    all_free(&h)
}

fn buffer_one_byte_short_then_retry(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    let c1 = cid("c1");
    let id = c1.encode_to_vec();
    let cfg = config(2.0);
    // SAFETY: live handle and locals of the lengths given.
    let mut prep = |b: *mut u8, c, l, e, ec| unsafe {
        // SAFETY: live locals of the given lengths.
        mesos_gpu::mgpu_prepare(
            h.0,
            id.as_ptr(),
            id.len(),
            cfg.as_ptr(),
            cfg.len(),
            b,
            c,
            l,
            e,
            ec,
        )
    };
    let query = call_cap(0, &mut prep);
    query.expect(S::MgpuBufferTooSmall, "the output buffer holds 0 bytes")?;
    let needed = query.needed();
    let short = call_cap(needed - 1, &mut prep);
    short.expect(
        S::MgpuBufferTooSmall,
        &format!(
            "the output buffer holds {} bytes; {needed} are needed",
            needed - 1
        ),
    )?;
    check(
        short.bytes == query.bytes,
        "the size needed changed between retries",
    )?;
    // A retry with another request is refused, and the kept answer survives it.
    let other = config(1.0);
    // SAFETY: live handle and locals of the lengths given.
    let a = call_cap(needed, &mut |b, c, l, e, ec| unsafe {
        // SAFETY: as above.
        mesos_gpu::mgpu_prepare(
            h.0,
            id.as_ptr(),
            id.len(),
            other.as_ptr(),
            other.len(),
            b,
            c,
            l,
            e,
            ec,
        )
    });
    a.expect(
        S::MgpuBadArgument,
        "prepare of container c1 was retried with a different request",
    )?;
    let bytes = call_cap(needed, &mut prep).ok()?;
    check(
        bytes.len() == needed,
        format!("{} bytes, {needed} announced", bytes.len()),
    )?;
    let info = ContainerLaunchInfo::decode(bytes.as_slice())?;
    let visible = env_var(&info, "CUDA_VISIBLE_DEVICES").unwrap_or_default();
    check(
        visible.split(',').count() == 2,
        format!("CUDA_VISIBLE_DEVICES={visible}"),
    )?;
    // The retries allocated nothing more: 2 GPUs remain, and c1 is prepared once.
    call_cap(needed, &mut prep).expect(
        S::MgpuAlreadyPrepared,
        "cannot prepare container c1: it has already been prepared",
    )?;
    h.prepare(&cid("c2"), &config(3.0))
        .expect(S::MgpuNotEnoughGpus, "")?;
    h.prepare(&cid("c2"), &config(2.0)).ok()?;
    // Pure answers are simply recomputed: usage one byte short, then right.
    let mut usage = |b: *mut u8, c, l, e, ec| unsafe {
        // SAFETY: as above.
        mesos_gpu::mgpu_usage(h.0, id.as_ptr(), id.len(), b, c, l, e, ec)
    };
    let q = call_cap(0, &mut usage);
    let n = q.needed();
    call_cap(n - 1, &mut usage).expect(S::MgpuBufferTooSmall, "are needed")?;
    let stats = ResourceStatistics::decode(call_cap(n, &mut usage).ok()?.as_slice())?;
    check(
        stats.timestamp > 1.6e9,
        format!("timestamp {}", stats.timestamp),
    )?;
    h.cleanup(&c1).ok()?;
    h.cleanup(&cid("c2")).ok()?;
    all_free(&h)
}

fn bad_requests_change_nothing(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    let c = cid("bad");
    h.prepare(&c, &config(1.5)).expect(
        S::MgpuBadRequest,
        "gpus=1.5: expected a whole number from 0 to 4",
    )?;
    h.prepare(&c, &config(-1.0))
        .expect(S::MgpuBadRequest, "gpus=-1")?;
    h.prepare(&c, &config(5.0))
        .expect(S::MgpuBadRequest, "gpus=5")?;
    h.prepare(&cid("a"), &config(3.0)).ok()?;
    h.prepare(&c, &config(2.0))
        .expect(S::MgpuNotEnoughGpus, "")?;
    check(
        f.leftover_cgroups().len() == 1,
        format!("{:?}", f.leftover_cgroups()),
    )?;
    h.status(&c)
        .expect(S::MgpuUnknownContainer, "unknown container")?;
    let id = cid("a").encode_to_vec();
    let grow = config(2.0);
    // a holds 3: shrink it to 2; growing beyond the node is refused and changes nothing.
    // SAFETY: live locals of the given lengths.
    call_plain(|e, ec| unsafe {
        mesos_gpu::mgpu_update(h.0, id.as_ptr(), id.len(), grow.as_ptr(), grow.len(), e, ec)
    })
    .ok()?;
    let huge = config(5.0);
    // SAFETY: as above.
    let a = call_plain(|e, ec| unsafe {
        mesos_gpu::mgpu_update(h.0, id.as_ptr(), id.len(), huge.as_ptr(), huge.len(), e, ec)
    });
    a.expect(S::MgpuBadRequest, "gpus=5")?;
    h.prepare(&c, &config(2.0)).ok()?;
    h.cleanup(&c).ok()?;
    h.cleanup(&cid("a")).ok()?;
    all_free(&h)
}

fn free_then_new_recovers(f: &Fixture) -> TestResult {
    let c1 = cid("c1");
    {
        let h = Handle::new(&f.params(&[]))?;
        h.recover(&[]).ok()?;
        h.prepare(&c1, &config(2.0)).ok()?;
    } // freed without cleanup, as an agent restart
    let h = Handle::new(&f.params(&[]))?;
    let info = ContainerRecoverInfo {
        checkpointed_container_states: vec![mesos_gpu::proto::mesos::slave::ContainerState {
            container_id: c1.clone(),
            pid: 1,
            directory: "/tmp".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    h.recover(&info.encode_to_vec()).ok()?;
    h.status(&c1).ok()?;
    h.prepare(&cid("c2"), &config(3.0))
        .expect(S::MgpuNotEnoughGpus, "")?;
    h.cleanup(&c1).ok()?;
    all_free(&h)
}

fn forced_panic_poisons_the_handle(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[("debug_panic_on", "prepare")]))?;
    h.prepare(&cid("c1"), &config(1.0)).expect(
        S::MgpuPanic,
        "panic in the GPU isolator: forced panic in prepare",
    )?;
    h.status(&cid("c1"))
        .expect(S::MgpuPoisoned, "the isolator handle is poisoned")?;
    h.cleanup(&cid("c1")).expect(S::MgpuPoisoned, "poisoned")?;
    drop(h);
    // A new handle on the same work directory works: nothing was left half applied.
    let h = Handle::new(&f.params(&[]))?;
    h.recover(&[]).ok()?;
    all_free(&h)
}

fn many_threads_never_share_a_gpu(f: &Fixture) -> TestResult {
    let h = Arc::new(Handle::new(&f.params(&[]))?);
    let held: Arc<Mutex<HashSet<String>>> = Arc::default();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (h, held) = (Arc::clone(&h), Arc::clone(&held));
            std::thread::spawn(move || -> TestResult<(u32, u32)> {
                let (mut got, mut refused) = (0, 0);
                for round in 0..10 {
                    let id = cid(&format!("t{t}-{round}"));
                    let a = h.prepare(&id, &config(1.0));
                    if a.status == S::MgpuNotEnoughGpus {
                        refused += 1;
                        continue;
                    }
                    let info = ContainerLaunchInfo::decode(a.ok()?.as_slice())?;
                    let uuid = env_var(&info, "CUDA_VISIBLE_DEVICES").unwrap_or_default();
                    check(
                        held.lock().map_err(|_| "poisoned")?.insert(uuid.clone()),
                        format!("{uuid} handed out twice"),
                    )?;
                    h.status(&id).ok()?;
                    held.lock().map_err(|_| "poisoned")?.remove(&uuid);
                    h.cleanup(&id).ok()?;
                    got += 1;
                }
                Ok((got, refused))
            })
        })
        .collect();
    let mut total = 0;
    for t in threads {
        let (got, _) = t.join().map_err(|_| "a thread panicked")??;
        total += got;
    }
    check(total > 0, "no thread got a GPU")?;
    all_free(&h)
}

fn watch_times_out_and_ends_at_cleanup(f: &Fixture) -> TestResult {
    let h = Arc::new(Handle::new(&f.params(&[]))?);
    let c1 = cid("c1");
    h.prepare(&c1, &config(1.0)).ok()?;
    let id = c1.encode_to_vec();
    // SAFETY: live locals of the given lengths.
    let a = call(&mut |b, c, l, e, ec| unsafe {
        mesos_gpu::mgpu_watch(h.0, id.as_ptr(), id.len(), 20, b, c, l, e, ec)
    });
    a.expect(
        S::MgpuTimedOut,
        "no limitation for container c1 within 20 ms",
    )?;
    let waiter = {
        let (h, id) = (Arc::clone(&h), id.clone());
        std::thread::spawn(move || {
            // SAFETY: live handle and locals of the lengths given.
            call(&mut |b, c, l, e, ec| unsafe {
                mesos_gpu::mgpu_watch(
                    h.0,
                    id.as_ptr(),
                    id.len(),
                    MGPU_WAIT_FOREVER,
                    b,
                    c,
                    l,
                    e,
                    ec,
                )
            })
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    h.cleanup(&c1).ok()?;
    let a: Answer = waiter.join().map_err(|_| "watch thread panicked")?;
    a.expect(S::MgpuUnknownContainer, "unknown container")?;
    all_free(&h)
}

/// The handle's metrics, as text.
fn metrics(h: &Handle) -> TestResult<String> {
    // SAFETY: live handle and the buffers `call` passes.
    let bytes =
        call(&mut |b, c, l, e, ec| unsafe { mesos_gpu::mgpu_metrics(h.0, b, c, l, e, ec) }).ok()?;
    Ok(String::from_utf8(bytes)?)
}

/// The handle's `mesos_gpu_module_heap_bytes` and `mesos_gpu_module_heap_blocks`, fresh (the
/// metrics are collected at most once a second).
fn module_heap(h: &Handle) -> TestResult<(usize, usize)> {
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let text = metrics(h)?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .parse::<usize>()
                    .ok()
            })
            .ok_or_else(|| format!("no {name} in the metrics:\n{text}"))
    };
    Ok((
        value("mesos_gpu_module_heap_bytes")?,
        value("mesos_gpu_module_heap_blocks")?,
    ))
}

/// The library's global allocator counts what the module's code holds: a block of 8 MiB taken
/// by Rust code linked with the library shows in the heap figures and leaves them when freed
/// (the figures would stay put if the library stopped counting or lost its global allocator).
fn the_module_heap_is_counted(f: &Fixture) -> TestResult {
    const BLOCK: usize = 8 << 20;
    let h = Handle::new(&f.params(&[]))?;
    let (bytes, blocks) = module_heap(&h)?;
    check(
        bytes > 0 && blocks > 0,
        format!("a live handle holds no heap: {bytes} bytes in {blocks} blocks"),
    )?;
    let block = std::hint::black_box(vec![1u8; BLOCK]);
    let (held, _) = module_heap(&h)?;
    // Other trials run beside this one: margins of half the block.
    check(
        held >= bytes + BLOCK / 2,
        format!("8 MiB taken, heap {bytes} → {held} bytes"),
    )?;
    drop(block);
    let (freed, _) = module_heap(&h)?;
    check(
        freed + BLOCK / 2 <= held,
        format!("8 MiB freed, heap {held} → {freed} bytes"),
    )?;
    all_free(&h)
}

/// The handle's `mesos_gpu_module_entries` series, by table.
fn module_entries(h: &Handle) -> TestResult<Vec<(String, u64)>> {
    let text = metrics(h)?;
    let entries: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("mesos_gpu_module_entries{table=\""))
        .filter_map(|l| {
            let (table, value) = l.split_once("\"} ")?;
            Some((table.to_owned(), value.parse().ok()?))
        })
        .collect();
    check(
        entries.len() >= 10 && text.contains("\nmesos_gpu_module_heap_bytes "),
        format!("the module's tables and heap are not in the metrics:\n{text}"),
    )?;
    Ok(entries)
}

/// `mgpu_prepare` of the encoded container `id` with `cfg`, as a call for [`call`] and
/// [`call_cap`].
fn prepare_of<'a>(
    h: &'a Handle,
    id: &'a [u8],
    cfg: &'a [u8],
) -> impl FnMut(*mut u8, usize, *mut usize, *mut c_char, usize) -> S + 'a {
    // SAFETY: live handle, and `id` and `cfg` borrowed for as long as the call lives; `call`
    // passes buffers of the lengths it gives.
    move |b, cap, l, e, ec| unsafe {
        mesos_gpu::mgpu_prepare(
            h.0,
            id.as_ptr(),
            id.len(),
            cfg.as_ptr(),
            cfg.len(),
            b,
            cap,
            l,
            e,
            ec,
        )
    }
}

/// Many containers through every call that records something per container (prepare, with a
/// retry after a short buffer and without one; watch; usage; status; cleanup) leave every
/// table of the module empty again.
fn tables_return_to_idle_after_many_containers(f: &Fixture) -> TestResult {
    const ROUNDS: usize = 60;
    let h = Handle::new(&f.params(&[]))?;
    for round in 0..ROUNDS {
        let c = cid(&format!("round-{round}"));
        let id = c.encode_to_vec();
        let cfg = config((round % 3) as f64);
        let mut prep = prepare_of(&h, &id, &cfg);
        // Every other round a short buffer first: the answer (if any) is kept for the retry.
        let first = if round % 2 == 0 {
            call_cap(0, &mut prep)
        } else {
            call(&mut prep)
        };
        if first.status == S::MgpuBufferTooSmall {
            call(&mut prep).ok()?;
        } else {
            first.ok()?;
        }
        // SAFETY: live handle and locals of the lengths given.
        let _ = call(&mut |b, cap, l, e, ec| unsafe {
            mesos_gpu::mgpu_watch(h.0, id.as_ptr(), id.len(), 0, b, cap, l, e, ec)
        });
        // SAFETY: as above.
        call(&mut |b, cap, l, e, ec| unsafe {
            mesos_gpu::mgpu_usage(h.0, id.as_ptr(), id.len(), b, cap, l, e, ec)
        })
        .ok()?;
        h.status(&c).ok()?;
        if round == ROUNDS / 2 {
            let live = module_entries(&h)?;
            let containers = live
                .iter()
                .find(|(t, _)| t == "containers")
                .map(|(_, n)| *n);
            check(
                containers == Some(1),
                format!("one container live: {live:?}"),
            )?;
        }
        h.cleanup(&c).ok()?;
    }
    // A prepare whose answer was never fetched: cleanup forgets it.
    let c = cid("abandoned");
    let id = c.encode_to_vec();
    let cfg = config(1.0);
    call_cap(0, &mut prepare_of(&h, &id, &cfg)).expect(S::MgpuBufferTooSmall, "")?;
    h.cleanup(&c).ok()?;
    // The metrics are collected at most once a second.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let idle = module_entries(&h)?;
    let left: Vec<&(String, u64)> = idle.iter().filter(|(_, n)| *n != 0).collect();
    check(
        left.is_empty(),
        format!("entries left after {ROUNDS} containers: {left:?}"),
    )?;
    all_free(&h)
}

static LOGS: Mutex<Vec<(MgpuLogLevel, String, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn record(
    level: MgpuLogLevel,
    target: *const c_char,
    message: *const c_char,
    userdata: *mut c_void,
) {
    // SAFETY: the library passes NUL-terminated strings valid during the call.
    let (target, message) = unsafe { (CStr::from_ptr(target), CStr::from_ptr(message)) };
    let tag = userdata as usize;
    if let Ok(mut logs) = LOGS.lock() {
        logs.push((
            level,
            target.to_string_lossy().into_owned(),
            format!("{tag}:{}", message.to_string_lossy()),
        ));
    }
}

fn logs_reach_the_callback(f: &Fixture) -> TestResult {
    // SAFETY: `record` is thread-safe; the userdata is a tag, never dereferenced.
    let a = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_set_log_callback(Some(record), 42 as *mut c_void, 2, e, c)
    });
    a.ok()?;
    let h = Handle::new(&f.params(&[]))?;
    h.prepare(&cid("logged"), &config(1.0)).ok()?;
    h.cleanup(&cid("logged")).ok()?;
    // SAFETY: clearing the callback.
    call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_set_log_callback(None, std::ptr::null_mut(), 2, e, c)
    })
    .ok()?;
    let logs = LOGS.lock().map_err(|_| "poisoned")?;
    let line = logs
        .iter()
        .find(|(_, _, m)| m.contains("prepared container") && m.contains("container=logged"));
    let Some((level, target, message)) = line else {
        return Err(format!("no 'prepared container' line in {logs:?}").into());
    };
    check(*level == MgpuLogLevel::MgpuLogInfo, format!("{level:?}"))?;
    check(target.starts_with("mesos_gpu_isolator"), target.clone())?;
    check(
        message.starts_with("42:prepare{container=logged") && message.contains("gpus="),
        message.clone(),
    )?;
    check(
        !logs.iter().any(|(l, _, _)| *l > MgpuLogLevel::MgpuLogInfo),
        "a line above the threshold was forwarded",
    )
}

fn agent_resources_describe_the_node(f: &Fixture) -> TestResult {
    let h = Handle::new(&f.params(&[]))?;
    let flags = Parameters {
        parameter: vec![Parameter {
            key: "resources".into(),
            value: "cpus:8".into(),
        }],
    }
    .encode_to_vec();
    // SAFETY: live handle and locals of the lengths given.
    let a = call(&mut |b, c, l, e, ec| unsafe {
        // SAFETY: live locals of the given lengths.
        mesos_gpu::mgpu_agent_resources(h.0, flags.as_ptr(), flags.len(), b, c, l, e, ec)
    });
    let out = Parameters::decode(a.ok()?.as_slice())?;
    let get = |k: &str| {
        out.parameter
            .iter()
            .find(|p| p.key == k)
            .map(|p| p.value.clone())
    };
    let resources = get("resources").unwrap_or_default();
    check(
        resources.contains("cpus:8") && resources.contains("gpus:4"),
        resources.clone(),
    )?;
    check(
        get("nvidia_gpu_devices").as_deref() == Some("0,1,2,3"),
        format!("{out:?}"),
    )?;
    let bad = Parameters {
        parameter: vec![Parameter {
            key: "isolation".into(),
            value: "x".into(),
        }],
    }
    .encode_to_vec();
    // SAFETY: live handle and locals of the lengths given.
    let a = call(&mut |b, c, l, e, ec| unsafe {
        // SAFETY: as above.
        mesos_gpu::mgpu_agent_resources(h.0, bad.as_ptr(), bad.len(), b, c, l, e, ec)
    });
    a.expect(S::MgpuBadArgument, "unknown agent flag \"isolation\": expected one of resources, nvidia_gpu_devices, attributes")
}
