//! Our protobuf handling against libprotobuf and Mesos's own generated classes (`libmesos.so`,
//! linked with libprotobuf by `tests/cpp/libprotobuf_probe.cpp`):
//!
//! - the proto2 required-field check (`mesos_gpu::testing::missing_required`): every message type that comes in
//!   through the C ABI, complete and with each field taken out in turn (at every depth), is given
//!   to both; they must refuse the same inputs and name the same missing fields;
//! - the GPU figures of `ResourceStatistics.gpu_statistics` (our field 1000) survive the agent's
//!   parse and `MergeFrom` of an isolator's answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::OnceLock;

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu::proto::docker::spec::v1::{ImageManifest, image_manifest};
use mesos_gpu::proto::mesos::slave::{
    ContainerConfig, ContainerRecoverInfo, ContainerState, container_config,
};
use mesos_gpu::proto::mesos::{
    CommandInfo, ContainerId, ContainerInfo, Environment, ExecutorId, ExecutorInfo, Image,
    Parameter, Parameters, Resource, ResourceStatistics, SlaveId, TaskId, TaskInfo, Volume,
    container_info, environment, image, value, volume,
};
use mesos_gpu::proto::mesos_gpu::GpuStatistics;
use mesos_gpu::testing::missing_required;
use mesos_gpu_testkit::mesos::MesosInstall;
use mesos_gpu_testkit::{Host, Need, needs};
use prost::Message;

fn main() -> ExitCode {
    let host = Host::probe();
    let trials = vec![
        needs(
            &host,
            &[Need::Cc, Need::Mesos],
            Trial::test(
                "required_fields_are_refused_as_libprotobuf_refuses_them",
                same_as_libprotobuf,
            ),
        ),
        needs(
            &host,
            &[Need::Cc, Need::Mesos],
            Trial::test(
                "gpu_statistics_survive_the_agents_merge",
                gpu_statistics_survive_the_agents_merge,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn id(value: &str, parent: Option<ContainerId>) -> ContainerId {
    ContainerId {
        value: value.into(),
        parent: parent.map(Box::new),
    }
}

fn gpus(n: f64) -> Resource {
    Resource {
        name: "gpus".into(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: n }),
        ..Default::default()
    }
}

fn command() -> CommandInfo {
    CommandInfo {
        environment: Some(Environment {
            variables: vec![environment::Variable {
                name: "A".into(),
                r#type: None,
                value: Some("1".into()),
            }],
        }),
        value: Some("sleep 1".into()),
        ..Default::default()
    }
}

fn container() -> ContainerInfo {
    let mut image = Image::default();
    image.set_type(image::Type::Docker);
    image.docker = Some(image::Docker {
        name: "cuda".into(),
    });
    ContainerInfo {
        r#type: container_info::Type::Mesos as i32,
        volumes: vec![Volume {
            mode: volume::Mode::Ro as i32,
            container_path: "/data".into(),
            host_path: None,
            image: None,
            source: Some(volume::Source {
                r#type: Some(volume::source::Type::HostPath as i32),
                host_path: Some(volume::source::HostPath {
                    path: "/srv".into(),
                    mount_propagation: None,
                }),
                ..Default::default()
            }),
        }],
        mesos: Some(container_info::MesosInfo { image: Some(image) }),
        ..Default::default()
    }
}

/// One complete message of each type that crosses the ABI inbound, with every nested message
/// that holds required fields.
fn complete_messages() -> Vec<(&'static str, Vec<u8>)> {
    let config = ContainerConfig {
        executor_info: Some(ExecutorInfo {
            executor_id: ExecutorId { value: "e".into() },
            command: Some(command()),
            resources: vec![gpus(1.0)],
            ..Default::default()
        }),
        task_info: Some(TaskInfo {
            name: "t".into(),
            task_id: TaskId { value: "t1".into() },
            slave_id: SlaveId { value: "S0".into() },
            resources: vec![gpus(2.0)],
            container: Some(container()),
            ..Default::default()
        }),
        command_info: command(),
        container_info: Some(container()),
        resources: vec![gpus(2.0), gpus(1.0)],
        limits: BTreeMap::from([("gpus".into(), value::Scalar { value: 2.0 })]),
        directory: "/sandbox".into(),
        docker: Some(container_config::Docker {
            manifest: Some(ImageManifest {
                id: Some("abc".into()),
                config: Some(image_manifest::Config {
                    labels: BTreeMap::from([("k".into(), "v".into())]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    let recover = ContainerRecoverInfo {
        checkpointed_container_states: vec![ContainerState {
            executor_info: Some(ExecutorInfo {
                executor_id: ExecutorId { value: "e".into() },
                ..Default::default()
            }),
            container_info: Some(container()),
            container_id: id("c", Some(id("p", None))),
            pid: 42,
            directory: "/d".into(),
            ..Default::default()
        }],
        orphan_container_ids: vec![id("o", None)],
        known_container_ids: vec![id("c", Some(id("p", None))), id("k", None)],
    };
    let params = Parameters {
        parameter: vec![
            Parameter {
                key: "work_dir".into(),
                value: "/w".into(),
            },
            Parameter {
                key: "policy".into(),
                value: "topology".into(),
            },
        ],
    };
    vec![
        ("mesos.slave.ContainerConfig", config.encode_to_vec()),
        ("mesos.slave.ContainerRecoverInfo", recover.encode_to_vec()),
        ("mesos.Parameters", params.encode_to_vec()),
        (
            "mesos.ContainerID",
            id("c", Some(id("p", None))).encode_to_vec(),
        ),
        (
            "docker.spec.v1.ImageManifest",
            ImageManifest {
                id: Some("abc".into()),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    ]
}

/// Hand-made inputs for the rules a deletion does not reach.
fn special_cases() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("mesos.slave.ContainerConfig", vec![]),
        ("mesos.ContainerID", vec![]),
        // command_info given twice (merged), directory once.
        (
            "mesos.slave.ContainerConfig",
            vec![0x5a, 0x00, 0x1a, 0x00, 0x5a, 0x00],
        ),
        // A limits entry with a key and no value: the value is a Scalar without `value`.
        (
            "mesos.slave.ContainerConfig",
            vec![0x5a, 0x00, 0x1a, 0x00, 0x82, 0x01, 0x03, 0x0a, 0x01, b'g'],
        ),
        // A resource whose required enum `type` holds a number Value.Type does not define.
        (
            "mesos.slave.ContainerConfig",
            vec![
                0x5a, 0x00, 0x1a, 0x00, 0x6a, 0x05, 0x0a, 0x01, b'g', 0x10, 0x63,
            ],
        ),
        // The same with a defined number (SCALAR = 0).
        (
            "mesos.slave.ContainerConfig",
            vec![
                0x5a, 0x00, 0x1a, 0x00, 0x6a, 0x05, 0x0a, 0x01, b'g', 0x10, 0x00,
            ],
        ),
    ]
}

/// A field's byte range in its message, and its payload's when length-delimited.
type FieldSpan = (usize, usize, Option<(usize, usize)>);

/// The fields of `bytes`; `None` when the bytes are not a sequence of fields.
fn fields(bytes: &[u8]) -> Option<Vec<FieldSpan>> {
    fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = *bytes.get(*at)?;
            *at += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let start = at;
        let key = varint(bytes, &mut at)?;
        let payload = match key & 7 {
            0 => {
                varint(bytes, &mut at)?;
                None
            }
            1 => {
                at += 8;
                None
            }
            2 => {
                let len = usize::try_from(varint(bytes, &mut at)?).ok()?;
                let p = (at, at + len);
                at += len;
                Some(p)
            }
            5 => {
                at += 4;
                None
            }
            _ => return None,
        };
        if at > bytes.len() || key >> 3 == 0 {
            return None;
        }
        out.push((start, at, payload));
    }
    Some(out)
}

fn encode_len(len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut v = len;
    loop {
        let b = u8::try_from(v & 0x7f).unwrap();
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// `bytes` with one field taken out, for every field at every depth.
fn deletions(bytes: &[u8]) -> Vec<Vec<u8>> {
    let Some(list) = fields(bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for &(start, end, payload) in &list {
        out.push([&bytes[..start], &bytes[end..]].concat());
        if let Some((p_start, p_end)) = payload {
            // The key ends where the length starts: re-encode the length after the key.
            let key_len = {
                let mut at = start;
                while bytes[at] & 0x80 != 0 {
                    at += 1;
                }
                at + 1 - start
            };
            for inner in deletions(&bytes[p_start..p_end]) {
                let mut v = bytes[..start + key_len].to_vec();
                v.extend(encode_len(inner.len()));
                v.extend(&inner);
                v.extend(&bytes[end..]);
                out.push(v);
            }
        }
    }
    out
}

/// What prost decodes, by type name.
fn prost_decodes(message: &str, bytes: &[u8]) -> bool {
    match message {
        "mesos.slave.ContainerConfig" => ContainerConfig::decode(bytes).is_ok(),
        "mesos.slave.ContainerRecoverInfo" => ContainerRecoverInfo::decode(bytes).is_ok(),
        "mesos.Parameters" => Parameters::decode(bytes).is_ok(),
        "mesos.ContainerID" => ContainerId::decode(bytes).is_ok(),
        "docker.spec.v1.ImageManifest" => ImageManifest::decode(bytes).is_ok(),
        other => panic!("no prost type for {other}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The probe, compiled once per test binary.
fn probe() -> Result<&'static Path, Failed> {
    static PROBE: OnceLock<Result<(tempfile::TempDir, PathBuf), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let exe = build_probe(dir.path())?;
            Ok((dir, exe))
        })
        .as_ref()
        .map(|(_, exe)| exe.as_path())
        .map_err(|e| Failed::from(e.clone()))
}

fn build_probe(dir: &Path) -> Result<PathBuf, String> {
    let install = MesosInstall::locate()?;
    let prefix = install.prefix();
    let exe = dir.join("libprotobuf_probe");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpp/libprotobuf_probe.cpp");
    let out = Command::new("g++")
        .args(["-std=c++17", "-O0", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-I{}", prefix.join("include").display()))
        .arg(format!("-L{}", prefix.join("lib").display()))
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .args(["-lmesos", "-lprotobuf"])
        .output()
        .map_err(|e| format!("g++: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "g++ failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

/// Runs the probe on `lines` (`<verb> <type> <hex>` each) and returns its answer lines.
fn ask(exe: &Path, lines: &[String]) -> Result<Vec<String>, Failed> {
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    for line in lines {
        writeln!(stdin, "{line}").map_err(|e| e.to_string())?;
    }
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let answers: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    if answers.len() != lines.len() {
        return Err(format!("{} answers for {} questions", answers.len(), lines.len()).into());
    }
    Ok(answers)
}

fn same_as_libprotobuf() -> Result<(), Failed> {
    let exe = probe()?;
    let mut inputs = special_cases();
    for (message, bytes) in complete_messages() {
        inputs.extend(deletions(&bytes).into_iter().map(|v| (message, v)));
        inputs.push((message, bytes));
    }
    // Only inputs prost decodes reach the check; both decoders must agree on the rest too.
    let mut refused_by_prost = 0;
    inputs.retain(|(message, bytes)| {
        let ok = prost_decodes(message, bytes);
        refused_by_prost += usize::from(!ok);
        ok
    });
    let questions: Vec<String> = inputs
        .iter()
        .map(|(message, bytes)| format!("parse {message} {}", hex(bytes)))
        .collect();
    let answers = ask(exe, &questions)?;
    let mut mismatches = Vec::new();
    let mut refused = 0;
    for ((message, bytes), theirs) in inputs.iter().zip(&answers) {
        let missing = missing_required(message, bytes);
        let ours = if missing.is_empty() {
            "ok".to_owned()
        } else {
            refused += 1;
            format!("missing {}", missing.join(", "))
        };
        if &ours != theirs {
            mismatches.push(format!(
                "{message} {}: libprotobuf {theirs:?}, ours {ours:?}",
                hex(bytes)
            ));
        }
    }
    eprintln!(
        "{} inputs compared ({refused} refused for missing fields); {refused_by_prost} left out \
         because prost refuses them",
        inputs.len()
    );
    if refused < 20 {
        return Err(format!("only {refused} inputs lack required fields").into());
    }
    if mismatches.is_empty() {
        Ok(())
    } else {
        Err(mismatches.join("\n").into())
    }
}

fn gpu_statistics_survive_the_agents_merge() -> Result<(), Failed> {
    let exe = probe()?;
    let ours = ResourceStatistics {
        timestamp: 1_700_000_000.5,
        gpu_statistics: vec![
            GpuStatistics {
                index: Some(2),
                uuid: Some("GPU-23571cd8-dbba-59d9-811c-c5cbf5339a03".into()),
                utilization_gpu_percent: Some(87),
                utilization_memory_percent: Some(40),
                memory_used_bytes: Some(3 << 30),
                memory_total_bytes: Some(16 << 30),
                processes: Some(2),
            },
            GpuStatistics {
                index: Some(3),
                uuid: Some("GPU-4e7a6385-4530-5cc3-84f3-2b67804164d0".into()),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let answer = ask(
        exe,
        &[format!(
            "merge mesos.ResourceStatistics {}",
            hex(&ours.encode_to_vec())
        )],
    )?;
    let bytes: Vec<u8> = (0..answer[0].len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&answer[0][i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| format!("not hex: {}", answer[0]))?;
    let merged = ResourceStatistics::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    if merged == ours {
        Ok(())
    } else {
        Err(format!("{merged:?} != {ours:?}").into())
    }
}
