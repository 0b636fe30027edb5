//! Wire-compatibility tests for the Mesos protobuf subset in `ffi/proto/`.
//!
//! - Golden bytes: hand-encoded protobuf, laid out field by field as libprotobuf writes it
//!   (field-number order, proto2 repeated scalars unpacked), decoded and re-encoded to the
//!   same bytes.
//! - A fixture from Mesos's own tests (`DockerSpecTest.ParseV1ImageManifest`), written as
//!   protobuf text, encoded by prost-reflect from our descriptors and decoded by prost.
//! - Schema checks on the descriptors protox builds from our `.proto` files.
//! - proptest round trips, cross-checked against prost-reflect's descriptor-driven codec.

use mesos_gpu::proto::docker::spec::v1::{ImageManifest, image_manifest};
use mesos_gpu::proto::mesos::slave::{
    ContainerClass, ContainerConfig, ContainerLaunchInfo, ContainerLimitation, ContainerMountInfo,
    ContainerState, container_config,
};
use mesos_gpu::proto::mesos::{
    CommandInfo, ContainerId, ContainerInfo, ContainerStatus, Environment, ExecutorId,
    ExecutorInfo, Image, Label, Labels, LinuxInfo, Parameter, Resource, ResourceStatistics,
    SlaveId, TaskId, TaskInfo, Volume, container_info, environment, image, resource, task_status,
    value, volume,
};
use proptest::prelude::*;
use prost::Message;
use protox::prost_reflect::{
    Cardinality, DescriptorPool, DynamicMessage, Kind, MessageDescriptor, Syntax,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

/// The `.proto` files build.rs compiles, relative to `ffi/proto`.
const PROTOS: [&str; 4] = [
    "mesos_gpu/statistics.proto",
    "mesos/mesos.proto",
    "mesos/slave/containerizer.proto",
    "mesos/docker/v1.proto",
];

/// Parses annotated hex: whitespace-separated byte values, `#` starts a comment.
fn hex(annotated: &str) -> Vec<u8> {
    annotated
        .lines()
        .flat_map(|line| line.split('#').next().unwrap_or("").split_whitespace())
        .map(|byte| u8::from_str_radix(byte, 16).expect("golden bytes are two-digit hex"))
        .collect()
}

/// Decodes `bytes` as `M`, checks it re-encodes to exactly `bytes`, and returns it.
fn decode_exact<M: Message + Default>(bytes: &[u8]) -> M {
    let msg = M::decode(bytes).expect("golden bytes decode");
    assert_eq!(msg.encode_to_vec(), bytes, "re-encoding changed the bytes");
    msg
}

fn gpus(count: f64) -> Resource {
    Resource {
        name: "gpus".into(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: count }),
        ..Default::default()
    }
}

fn id(value: &str) -> ContainerId {
    ContainerId {
        value: value.into(),
        parent: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Golden bytes

const NESTED_CONTAINER_ID: &str = "
0a 05 63 68 69 6c 64             # 1 value: \"child\"
12 05                            # 2 parent: ContainerID (5 bytes)
   0a 03 61 62 63                #   1 value: \"abc\"
";

#[test]
fn golden_container_id() {
    let top: ContainerId = decode_exact(&hex("0a 03 61 62 63"));
    assert_eq!(top, id("abc"));

    let nested: ContainerId = decode_exact(&hex(NESTED_CONTAINER_ID));
    assert_eq!(nested.value, "child");
    assert_eq!(nested.parent.as_deref(), Some(&id("abc")));
    assert_eq!(nested.to_string(), "abc.child");
}

/// What the agent passes to `prepare` for a command task whose Docker image asks for the
/// NVIDIA volume, with `gpus:2` requested and limited.
const GPU_CONTAINER_CONFIG: &str = "
1a 08 2f 73 61 6e 64 62 6f 78    # 3 directory: \"/sandbox\"
22 06 6e 6f 62 6f 64 79          # 4 user: \"nobody\"
2a 07 2f 72 6f 6f 74 66 73       # 5 rootfs: \"/rootfs\"
3a 5b                            # 7 docker: ContainerConfig.Docker (91 bytes)
   0a 59                         #   1 manifest: ImageManifest (89 bytes)
      4a 57                      #     9 config: Config (87 bytes)
         1a 1a                   #       3 Env (26 bytes): \"NVIDIA_VISIBLE_DEVICES=all\"
            4e 56 49 44 49 41 5f 56 49 53 49 42 4c 45 5f
            44 45 56 49 43 45 53 3d 61 6c 6c
         1a 0d                   #       3 Env (13 bytes): \"PATH=/usr/bin\"
            50 41 54 48 3d 2f 75 73 72 2f 62 69 6e
         4a 2a                   #       9 Labels: map entry (42 bytes)
            0a 19                #         1 key (25 bytes): \"com.nvidia.volumes.needed\"
               63 6f 6d 2e 6e 76 69 64 69 61 2e 76 6f 6c 75 6d
               65 73 2e 6e 65 65 64 65 64
            12 0d                #         2 value (13 bytes): \"nvidia_driver\"
               6e 76 69 64 69 61 5f 64 72 69 76 65 72
4a 0f                            # 9 task_info: TaskInfo (15 bytes)
   0a 01 74                      #   1 name: \"t\"
   12 04 0a 02 74 31             #   2 task_id: TaskID { 1 value: \"t1\" }
   1a 04 0a 02 73 31             #   3 slave_id: SlaveID { 1 value: \"s1\" }
5a 0c                            # 11 command_info: CommandInfo (12 bytes)
   1a 0a 6e 76 69 64 69 61 2d 73 6d 69   # 3 value: \"nvidia-smi\"
6a 18                            # 13 resources: Resource (24 bytes)
   0a 04 67 70 75 73             #   1 name: \"gpus\"
   10 00                         #   2 type: SCALAR (0)
   1a 09                         #   3 scalar: Value.Scalar (9 bytes)
      09 00 00 00 00 00 00 00 40 #     1 value: 2.0 (fixed64, little-endian double)
   5a 03 0a 01 2a                #   11 allocation_info: AllocationInfo { 1 role: \"*\" }
70 01                            # 14 container_class: DEFAULT (1)
82 01 11                         # 16 limits: map entry (17 bytes)
   0a 04 67 70 75 73             #   1 key: \"gpus\"
   12 09                         #   2 value: Value.Scalar (9 bytes)
      09 00 00 00 00 00 00 00 40 #     1 value: 2.0
";

#[test]
fn golden_container_config_with_gpus_and_manifest() {
    let config: ContainerConfig = decode_exact(&hex(GPU_CONTAINER_CONFIG));

    assert_eq!(config.directory, "/sandbox");
    assert_eq!(config.user.as_deref(), Some("nobody"));
    assert_eq!(config.rootfs.as_deref(), Some("/rootfs"));
    assert_eq!(config.container_class(), ContainerClass::Default);
    assert_eq!(config.command_info.value.as_deref(), Some("nvidia-smi"));
    // `shell` is absent on the wire, so the proto2 default applies.
    assert!(config.command_info.shell());

    let mut expected_gpus = gpus(2.0);
    expected_gpus.allocation_info = Some(resource::AllocationInfo {
        role: Some("*".into()),
    });
    assert_eq!(config.resources, [expected_gpus]);
    assert_eq!(
        config.limits,
        BTreeMap::from([("gpus".into(), value::Scalar { value: 2.0 })])
    );

    let task = config.task_info.as_ref().expect("task_info");
    assert_eq!(task.name, "t");
    assert_eq!(task.task_id.value, "t1");
    assert_eq!(task.slave_id.value, "s1");

    let manifest_config = config
        .docker
        .as_ref()
        .and_then(|d| d.manifest.as_ref())
        .and_then(|m| m.config.as_ref())
        .expect("docker manifest config");
    assert_eq!(
        manifest_config.env,
        ["NVIDIA_VISIBLE_DEVICES=all", "PATH=/usr/bin"]
    );
    assert_eq!(
        manifest_config.labels,
        BTreeMap::from([("com.nvidia.volumes.needed".into(), "nvidia_driver".into())])
    );
}

/// What the GPU isolator answers `prepare` with for that command task: the NVIDIA volume and a
/// device node bind-mounted into the rootfs, and the volume's PATH and LD_LIBRARY_PATH.
const NVIDIA_LAUNCH_INFO: &str = "
7a 4b                            # 15 task_environment: Environment (75 bytes)
   0a 1d                         #   1 variables: Variable (29 bytes)
      0a 04 50 41 54 48          #     1 name: \"PATH\"
      12 15                      #     2 value (21 bytes): \"/usr/local/nvidia/bin\"
         2f 75 73 72 2f 6c 6f 63 61 6c 2f 6e 76 69 64 69 61 2f 62 69 6e
   0a 2a                         #   1 variables: Variable (42 bytes)
      0a 0f                      #     1 name (15 bytes): \"LD_LIBRARY_PATH\"
         4c 44 5f 4c 49 42 52 41 52 59 5f 50 41 54 48
      12 17                      #     2 value (23 bytes): \"/usr/local/nvidia/lib64\"
         2f 75 73 72 2f 6c 6f 63 61 6c 2f 6e 76 69 64 69 61 2f 6c 69 62 36 34
8a 01 4d                         # 17 mounts: ContainerMountInfo (77 bytes)
   0a 18                         #   1 target (24 bytes): \"/rootfs/usr/local/nvidia\"
      2f 72 6f 6f 74 66 73 2f 75 73 72 2f 6c 6f 63 61 6c 2f 6e 76 69 64 69 61
   12 2d                         #   2 source (45 bytes): \"/var/run/mesos/isolators/gpu/nvidia_450.80.02\"
      2f 76 61 72 2f 72 75 6e 2f 6d 65 73 6f 73 2f 69 73 6f 6c 61 74 6f 72 73
      2f 67 70 75 2f 6e 76 69 64 69 61 5f 34 35 30 2e 38 30 2e 30 32
   20 81 a0 01                   #   4 flags: 20481 = MS_RDONLY | MS_BIND | MS_REC
8a 01 26                         # 17 mounts: ContainerMountInfo (38 bytes)
   0a 13                         #   1 target (19 bytes): \"/rootfs/dev/nvidia0\"
      2f 72 6f 6f 74 66 73 2f 64 65 76 2f 6e 76 69 64 69 61 30
   12 0c                         #   2 source (12 bytes): \"/dev/nvidia0\"
      2f 64 65 76 2f 6e 76 69 64 69 61 30
   20 80 20                      #   4 flags: 4096 = MS_BIND
";

#[test]
fn golden_launch_info_with_mounts_and_environment() {
    const MS_RDONLY: u32 = 1;
    const MS_BIND: u32 = 4096;
    const MS_REC: u32 = 16384;
    let var = |name: &str, value: &str| environment::Variable {
        name: name.into(),
        value: Some(value.into()),
        r#type: None,
    };
    let built = ContainerLaunchInfo {
        task_environment: Some(Environment {
            variables: vec![
                var("PATH", "/usr/local/nvidia/bin"),
                var("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64"),
            ],
        }),
        mounts: vec![
            ContainerMountInfo {
                target: "/rootfs/usr/local/nvidia".into(),
                source: Some("/var/run/mesos/isolators/gpu/nvidia_450.80.02".into()),
                flags: Some(MS_RDONLY | MS_BIND | MS_REC),
                ..Default::default()
            },
            ContainerMountInfo {
                target: "/rootfs/dev/nvidia0".into(),
                source: Some("/dev/nvidia0".into()),
                flags: Some(MS_BIND),
                ..Default::default()
            },
        ],
        ..Default::default()
    };

    let golden = hex(NVIDIA_LAUNCH_INFO);
    assert_eq!(
        built.encode_to_vec(),
        golden,
        "encoding what the isolator builds"
    );
    let decoded: ContainerLaunchInfo = decode_exact(&golden);
    assert_eq!(decoded, built);
    // An unset variable type reads as the proto2 default, VALUE.
    let first = &decoded
        .task_environment
        .expect("task_environment")
        .variables[0];
    assert_eq!(first.r#type(), environment::variable::Type::Value);
}

const XID_LIMITATION: &str = "
0a 13                            # 1 resources: Resource (19 bytes)
   0a 04 67 70 75 73             #   1 name: \"gpus\"
   10 00                         #   2 type: SCALAR (0)
   1a 09                         #   3 scalar: Value.Scalar (9 bytes)
      09 00 00 00 00 00 00 f0 3f #     1 value: 1.0
12 1f                            # 2 message (31 bytes): \"GPU 0 fell off the bus (Xid 79)\"
   47 50 55 20 30 20 66 65 6c 6c 20 6f 66 66 20 74
   68 65 20 62 75 73 20 28 58 69 64 20 37 39 29
18 13                            # 3 reason: REASON_CONTAINER_LIMITATION (19)
";

#[test]
fn golden_container_limitation() {
    let mut built = ContainerLimitation {
        resources: vec![gpus(1.0)],
        message: Some("GPU 0 fell off the bus (Xid 79)".into()),
        reason: None,
    };
    built.set_reason(task_status::Reason::ContainerLimitation);
    let golden = hex(XID_LIMITATION);
    assert_eq!(built.encode_to_vec(), golden);
    assert_eq!(decode_exact::<ContainerLimitation>(&golden), built);
}

const USAGE: &str = "
09 00 00 10 40 fc 54 d9 41       # 1 timestamp: 1700000000.25
f0 01 03                         # 30 processes: 3
f8 01 07                         # 31 threads: 7
";

#[test]
fn golden_resource_statistics() {
    let built = ResourceStatistics {
        timestamp: 1_700_000_000.25,
        processes: Some(3),
        threads: Some(7),
        gpu_statistics: Vec::new(),
    };
    let golden = hex(USAGE);
    assert_eq!(built.encode_to_vec(), golden);
    assert_eq!(decode_exact::<ResourceStatistics>(&golden), built);
}

const STATUS: &str = "
18 e1 21                         # 3 executor_pid: 4321
22 05                            # 4 container_id: ContainerID (5 bytes)
   0a 03 61 62 63                #   1 value: \"abc\"
";

#[test]
fn golden_container_status() {
    let built = ContainerStatus {
        container_id: Some(id("abc")),
        cgroup_info: None,
        executor_pid: Some(4321),
    };
    let golden = hex(STATUS);
    assert_eq!(built.encode_to_vec(), golden);
    assert_eq!(decode_exact::<ContainerStatus>(&golden), built);
}

const RECOVERED_STATE: &str = "
0a 06                            # 1 executor_info: ExecutorInfo (6 bytes)
   0a 04 0a 02 65 31             #   1 executor_id: ExecutorID { 1 value: \"e1\" }
12 05 0a 03 61 62 63             # 2 container_id: ContainerID { 1 value: \"abc\" }
18 e1 21                         # 3 pid: 4321
22 08 2f 73 61 6e 64 62 6f 78    # 4 directory: \"/sandbox\"
2a 04 2f 74 6d 70                # 5 ephemeral_volumes: \"/tmp\"
";

#[test]
fn golden_container_state() {
    let state: ContainerState = decode_exact(&hex(RECOVERED_STATE));
    assert_eq!(state.container_id, id("abc"));
    assert_eq!(state.pid, 4321);
    assert_eq!(state.directory, "/sandbox");
    assert_eq!(state.ephemeral_volumes, ["/tmp"]);
    let executor = state.executor_info.expect("executor_info");
    assert_eq!(executor.executor_id.value, "e1");
}

/// Fields left out of our subset are skipped on decode (and so not re-encoded).
#[test]
#[allow(deprecated)] // pre_exec_commands is deprecated upstream; it carries a skipped field here.
fn fields_outside_the_subset_are_skipped() {
    let with_extras = hex("
        0a 07                    # 1 pre_exec_commands: CommandInfo (7 bytes)
           0a 05 0a 03 2f 62 69  #   1 uris (left out): URI { 1 value: \"/bi\" }
        42 02 0a 00              # 8 rlimits (left out): RLimitInfo
        92 01 00                 # 18 seccomp_profile (left out): empty message
        b2 01 02 08 01           # 22 file_operations (left out): { 1 operation: 1 }
        b8 01 01                 # 23 no_new_privileges: true
    ");
    let info = ContainerLaunchInfo::decode(with_extras.as_slice()).expect("decodes");
    assert_eq!(
        info,
        ContainerLaunchInfo {
            pre_exec_commands: vec![CommandInfo::default()],
            no_new_privileges: Some(true),
            ..Default::default()
        }
    );
    assert_eq!(info.encode_to_vec(), hex("0a 00  b8 01 01"));
}

#[test]
fn truncated_bytes_are_an_error() {
    let golden = hex(GPU_CONTAINER_CONFIG);
    for cut in [1, golden.len() / 2, golden.len() - 1] {
        assert!(
            ContainerConfig::decode(&golden[..cut]).is_err(),
            "decoding the first {cut} bytes must fail"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Descriptors

/// Descriptors of our `.proto` files, compiled by protox as build.rs does.
static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    let mut compiler = protox::Compiler::new([concat!(env!("CARGO_MANIFEST_DIR"), "/proto")])
        .expect("include path");
    compiler
        .open_files(PROTOS)
        .expect("our .proto files compile");
    compiler.descriptor_pool()
});

fn message(pool: &DescriptorPool, name: &str) -> MessageDescriptor {
    pool.get_message_by_name(name)
        .unwrap_or_else(|| panic!("{name} is in the descriptor pool"))
}

/// The Docker v1 manifest of Mesos's `DockerSpecTest.ParseV1ImageManifest`
/// (src/tests/containerizer/docker_spec_tests.cpp), which Mesos parses from JSON by field
/// name, written here as protobuf text (JSON nulls and keys Mesos has no field for left out).
const MESOS_V1_MANIFEST_FIXTURE: &str = r##"
container: "7f652467f9e6d1b3bf51172868b9b0c2fa1c711b112f4e987029b1624dd6295f"
parent: "cfa753dfea5e68a24366dfba16e6edf573daa447abf65bc11619c1a98a3aff54"
created: "2015-09-21T20:15:47.866196515Z"
config {
  Hostname: "5f8e0e129ff1"
  User: ""
  Cmd: "sh"
  WorkingDir: ""
  Image: "cfa753dfea5e68a24366dfba16e6edf573daa447abf65bc11619c1a98a3aff54"
  Labels { key: "com.nvidia.cuda.version" value: "7.5" }
  Labels { key: "com.nvidia.volumes.needed" value: "nvidia_driver" }
}
container_config {
  Hostname: "5f8e0e129ff1"
  Entrypoint: "./bin/start"
  Env: "LANG=C.UTF-8"
  Env: "JAVA_VERSION=8u66"
  Env: "JAVA_DEBIAN_VERSION=8u66-b01-1~bpo8+1"
  Env: "CA_CERTIFICATES_JAVA_VERSION=20140324"
  User: ""
  Cmd: "/bin/sh"
  Cmd: "-c"
  Cmd: "#(nop) CMD [\"sh\"]"
  WorkingDir: "/marathon"
  Image: "cfa753dfea5e68a24366dfba16e6edf573daa447abf65bc11619c1a98a3aff54"
  Labels { key: "com.nvidia.caffe.version" value: "0.14" }
  Labels { key: "com.nvidia.digits.version" value: "3.0" }
}
architecture: "amd64"
docker_version: "1.8.2"
os: "linux"
id: "d7057cb020844f245031d27b76cb18af05db1cc3a96a29fa7777af75f5ac91a3"
Size: 0
"##;

/// Mesos's own expectations for that manifest hold after a trip through the wire.
#[test]
fn mesos_v1_manifest_fixture_decodes_with_mesos_expectations() {
    let dynamic = DynamicMessage::parse_text_format(
        message(&POOL, "docker.spec.v1.ImageManifest"),
        MESOS_V1_MANIFEST_FIXTURE,
    )
    .expect("fixture parses as protobuf text");
    // prost-reflect writes map entries in hash order, so compare messages, not bytes.
    let manifest = ImageManifest::decode(dynamic.encode_to_vec().as_slice()).expect("decodes");

    let cc = manifest
        .container_config
        .as_ref()
        .expect("container_config");
    let config = manifest.config.as_ref().expect("config");
    assert_eq!(
        manifest.container(),
        "7f652467f9e6d1b3bf51172868b9b0c2fa1c711b112f4e987029b1624dd6295f"
    );
    assert_eq!(
        manifest.parent(),
        "cfa753dfea5e68a24366dfba16e6edf573daa447abf65bc11619c1a98a3aff54"
    );
    assert_eq!(cc.entrypoint, ["./bin/start"]);
    assert_eq!(
        cc.env,
        [
            "LANG=C.UTF-8",
            "JAVA_VERSION=8u66",
            "JAVA_DEBIAN_VERSION=8u66-b01-1~bpo8+1",
            "CA_CERTIFICATES_JAVA_VERSION=20140324",
        ]
    );
    assert_eq!(cc.cmd, ["/bin/sh", "-c", "#(nop) CMD [\"sh\"]"]);
    assert_eq!(cc.labels["com.nvidia.caffe.version"], "0.14");
    assert_eq!(cc.labels["com.nvidia.digits.version"], "3.0");
    assert_eq!(config.cmd, ["sh"]);
    assert_eq!(config.labels["com.nvidia.cuda.version"], "7.5");
    assert_eq!(config.labels["com.nvidia.volumes.needed"], "nvidia_driver");
    assert_eq!(manifest.docker_version(), "1.8.2");
    assert_eq!(manifest.architecture(), "amd64");
    assert_eq!(manifest.os(), "linux");
    assert_eq!(manifest.size, Some(0));
}

/// Fields reachable from `root` that prost can encode so that libprotobuf finds a required
/// field unset:
/// - a required enum without a 0 value: prost defaults it to 0, which a proto2 parser keeps
///   as an unknown value, and `ParseFromString` then rejects the whole message;
/// - a map whose values are messages with required fields: prost omits a map entry's value
///   when it equals the default (e.g. `Value.Scalar { value: 0.0 }`), so the value reaches
///   libprotobuf without its required field.
fn unsafe_required_fields(root: &MessageDescriptor) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![root.clone()];
    let mut found = BTreeSet::new();
    while let Some(msg) = stack.pop() {
        if !seen.insert(msg.full_name().to_owned()) {
            continue;
        }
        for field in msg.fields() {
            match field.kind() {
                Kind::Message(child) => {
                    if child.is_map_entry()
                        && let Kind::Message(value) = child.map_entry_value_field().kind()
                        && value
                            .fields()
                            .any(|f| f.cardinality() == Cardinality::Required)
                    {
                        found.insert(field.full_name().to_owned());
                    }
                    stack.push(child);
                }
                Kind::Enum(e)
                    if field.cardinality() == Cardinality::Required && e.get_value(0).is_none() =>
                {
                    found.insert(field.full_name().to_owned());
                }
                _ => {}
            }
        }
    }
    found
}

#[test]
fn messages_the_isolator_sends_always_satisfy_required_fields() {
    for root in [
        "mesos.slave.ContainerLaunchInfo",
        "mesos.slave.ContainerLimitation",
        "mesos.slave.ContainerTermination",
        "mesos.ResourceStatistics",
        "mesos.ContainerStatus",
    ] {
        let unsafe_fields = unsafe_required_fields(&message(&POOL, root));
        assert!(unsafe_fields.is_empty(), "{root} reaches {unsafe_fields:?}");
    }
    // The walk does find such fields where they exist (in messages the agent sends us).
    let in_config = unsafe_required_fields(&message(&POOL, "mesos.slave.ContainerConfig"));
    assert_eq!(
        in_config,
        BTreeSet::from([
            "mesos.ContainerInfo.type".into(),
            "mesos.Image.type".into(),
            "mesos.TaskInfo.limits".into(),
            "mesos.Volume.mode".into(),
            "mesos.slave.ContainerConfig.limits".into(),
        ])
    );
}

/// Map entries as libprotobuf writes them (key and value always present) decode to the same
/// message as prost's shorter form, which leaves out a default key or value.
#[test]
fn map_entries_with_defaults_decode_either_way() {
    let libprotobuf = hex("
        5a 00                        # 11 command_info: CommandInfo (empty)
        82 01 0d                     # 16 limits: map entry (13 bytes)
           0a 00                     #   1 key: \"\"
           12 09                     #   2 value: Value.Scalar (9 bytes)
              09 00 00 00 00 00 00 00 00  # 1 value: 0.0
        1a 00                        # 3 directory: \"\" (out of order, as a parser must accept)
    ");
    let config = ContainerConfig::decode(libprotobuf.as_slice()).expect("decodes");
    assert_eq!(
        config.limits,
        BTreeMap::from([(String::new(), value::Scalar { value: 0.0 })])
    );
    // prost writes the entry empty: libprotobuf would read a Scalar without its required value.
    assert_eq!(config.encode_to_vec(), hex("1a 00  5a 00  82 01 00"));
    assert_eq!(
        ContainerConfig::decode(config.encode_to_vec().as_slice()).expect("decodes"),
        config
    );
}

/// prost writes required fields even when they hold defaults, as libprotobuf requires; the
/// required-field check above relies on it for required message fields.
#[test]
fn required_fields_are_always_written() {
    let task = TaskInfo::default();
    // 1 name: "", 2 task_id: {value: ""}, 3 slave_id: {value: ""}
    assert_eq!(task.encode_to_vec(), hex("0a 00  12 02 0a 00  1a 02 0a 00"));
    // 1 timestamp: 0.0
    assert_eq!(
        ResourceStatistics::default().encode_to_vec(),
        hex("09 00 00 00 00 00 00 00 00")
    );
}

#[test]
fn packages_are_the_mesos_ones() {
    let packages: BTreeSet<_> = POOL.files().map(|f| f.package_name().to_owned()).collect();
    assert_eq!(
        packages,
        BTreeSet::from([
            "docker.spec.v1".into(),
            "mesos".into(),
            "mesos.slave".into(),
            "mesos_gpu".into()
        ])
    );
    for file in POOL.files() {
        assert_eq!(file.syntax(), Syntax::Proto2, "{}", file.name());
    }
}

// ---------------------------------------------------------------------------------------------
// Property tests

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_./=*-]{0,12}"
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(text())
}

fn finite() -> impl Strategy<Value = f64> {
    -1.0e12..1.0e12f64
}

fn container_id() -> impl Strategy<Value = ContainerId> {
    let leaf = text().prop_map(|value| ContainerId {
        value,
        parent: None,
    });
    leaf.prop_recursive(2, 3, 1, |parent| {
        (text(), parent).prop_map(|(value, parent)| ContainerId {
            value,
            parent: Some(Box::new(parent)),
        })
    })
}

fn labels() -> impl Strategy<Value = Option<Labels>> {
    proptest::option::of(
        proptest::collection::vec((text(), opt_text()), 0..3).prop_map(|pairs| Labels {
            labels: pairs
                .into_iter()
                .map(|(key, value)| Label { key, value })
                .collect(),
        }),
    )
}

fn resource() -> impl Strategy<Value = Resource> {
    let reservation =
        (0..3i32, opt_text(), opt_text(), labels()).prop_map(|(kind, role, principal, labels)| {
            resource::ReservationInfo {
                r#type: Some(kind),
                role,
                principal,
                labels,
            }
        });
    (
        text(),
        prop_oneof![
            finite().prop_map(|v| (
                value::Type::Scalar,
                Some(value::Scalar { value: v }),
                None,
                None
            )),
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..3).prop_map(|r| (
                value::Type::Ranges,
                None,
                Some(value::Ranges {
                    range: r
                        .into_iter()
                        .map(|(begin, end)| value::Range { begin, end })
                        .collect()
                }),
                None
            )),
            proptest::collection::vec(text(), 0..3).prop_map(|item| (
                value::Type::Set,
                None,
                None,
                Some(value::Set { item })
            )),
        ],
        proptest::option::of(opt_text().prop_map(|role| resource::AllocationInfo { role })),
        proptest::collection::vec(reservation, 0..2),
        any::<bool>(),
    )
        .prop_map(
            |(name, (kind, scalar, ranges, set), allocation_info, reservations, revocable)| {
                Resource {
                    name,
                    r#type: kind as i32,
                    scalar,
                    ranges,
                    set,
                    allocation_info,
                    reservations,
                    revocable: revocable.then_some(resource::RevocableInfo {}),
                    ..Default::default()
                }
            },
        )
}

fn environment() -> impl Strategy<Value = Option<Environment>> {
    let variable =
        (text(), proptest::option::of(0..3i32), opt_text()).prop_map(|(name, r#type, value)| {
            environment::Variable {
                name,
                r#type,
                value,
            }
        });
    proptest::option::of(
        proptest::collection::vec(variable, 0..3).prop_map(|variables| Environment { variables }),
    )
}

fn command() -> impl Strategy<Value = CommandInfo> {
    (
        environment(),
        proptest::option::of(any::<bool>()),
        opt_text(),
        proptest::collection::vec(text(), 0..3),
        opt_text(),
    )
        .prop_map(|(environment, shell, value, arguments, user)| CommandInfo {
            environment,
            shell,
            value,
            arguments,
            user,
        })
}

fn image() -> impl Strategy<Value = Image> {
    (
        text(),
        any::<bool>(),
        proptest::option::of(any::<bool>()),
        labels(),
    )
        .prop_map(|(name, docker, cached, labels)| {
            let mut image = Image {
                cached,
                ..Default::default()
            };
            if docker {
                image.set_type(image::Type::Docker);
                image.docker = Some(image::Docker { name });
            } else {
                image.set_type(image::Type::Appc);
                image.appc = Some(image::Appc {
                    name,
                    id: None,
                    labels,
                });
            }
            image
        })
}

fn container_info() -> impl Strategy<Value = ContainerInfo> {
    let volume = (
        text(),
        opt_text(),
        proptest::option::of(image()),
        any::<bool>(),
    )
        .prop_map(|(container_path, host_path, image, ro)| Volume {
            mode: if ro {
                volume::Mode::Ro
            } else {
                volume::Mode::Rw
            } as i32,
            container_path,
            host_path: host_path.clone(),
            image,
            source: host_path.map(|path| volume::Source {
                r#type: Some(volume::source::Type::HostPath as i32),
                host_path: Some(volume::source::HostPath {
                    path,
                    mount_propagation: None,
                }),
                ..Default::default()
            }),
        });
    let docker = (
        text(),
        1..5i32,
        any::<bool>(),
        proptest::collection::vec((text(), text()), 0..2),
    )
        .prop_map(
            |(image, network, privileged, params)| container_info::DockerInfo {
                image,
                network: Some(network),
                privileged: Some(privileged),
                parameters: params
                    .into_iter()
                    .map(|(key, value)| Parameter { key, value })
                    .collect(),
                force_pull_image: None,
            },
        );
    (
        proptest::collection::vec(volume, 0..2),
        opt_text(),
        proptest::option::of(docker),
        proptest::option::of(image()),
        proptest::option::of((any::<bool>(), 0..3i32, any::<u32>())),
    )
        .prop_map(
            |(volumes, hostname, docker, mesos_image, linux)| ContainerInfo {
                r#type: if docker.is_some() {
                    container_info::Type::Docker
                } else {
                    container_info::Type::Mesos
                } as i32,
                volumes,
                hostname,
                docker,
                mesos: mesos_image.map(|image| container_info::MesosInfo { image: Some(image) }),
                linux_info: linux.map(|(share_pid, ipc, shm)| LinuxInfo {
                    share_pid_namespace: Some(share_pid),
                    ipc_mode: Some(ipc),
                    shm_size: Some(shm),
                    share_cgroups: None,
                    capability_info: None,
                    effective_capabilities: None,
                }),
            },
        )
}

fn manifest() -> impl Strategy<Value = ImageManifest> {
    let config = (
        proptest::collection::vec(text(), 0..3),
        proptest::collection::vec(text(), 0..3),
        proptest::collection::btree_map(text(), text(), 0..3),
        opt_text(),
    )
        .prop_map(
            |(entrypoint, env, labels, working_dir)| image_manifest::Config {
                entrypoint,
                env,
                labels,
                working_dir,
                ..Default::default()
            },
        );
    (
        opt_text(),
        proptest::option::of(config),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(|(id, config, size)| ImageManifest {
            id,
            config,
            size,
            ..Default::default()
        })
}

fn container_config() -> impl Strategy<Value = ContainerConfig> {
    let executor = (
        text(),
        proptest::option::of(command()),
        proptest::collection::vec(resource(), 0..2),
    )
        .prop_map(|(id, command, resources)| ExecutorInfo {
            executor_id: ExecutorId { value: id },
            command,
            resources,
            ..Default::default()
        });
    let task = (
        text(),
        text(),
        proptest::collection::vec(resource(), 0..2),
        proptest::option::of(container_info()),
        proptest::collection::btree_map(text(), finite(), 0..2),
    )
        .prop_map(|(name, task_id, resources, container, limits)| TaskInfo {
            name,
            task_id: TaskId { value: task_id },
            slave_id: SlaveId { value: "S0".into() },
            resources,
            container,
            limits: limits
                .into_iter()
                .map(|(k, value)| (k, value::Scalar { value }))
                .collect(),
            ..Default::default()
        });
    (
        proptest::option::of(executor),
        proptest::option::of(task),
        command(),
        proptest::option::of(container_info()),
        proptest::collection::vec(resource(), 0..3),
        proptest::collection::btree_map(text(), finite(), 0..3),
        proptest::option::of(1..3i32),
        (text(), opt_text(), opt_text()),
        proptest::option::of(proptest::option::of(manifest())),
    )
        .prop_map(
            |(
                executor_info,
                task_info,
                command,
                container_info,
                resources,
                limits,
                class,
                paths,
                docker,
            )| {
                let (directory, user, rootfs) = paths;
                ContainerConfig {
                    executor_info,
                    task_info,
                    command_info: command,
                    container_info,
                    resources,
                    limits: limits
                        .into_iter()
                        .map(|(k, value)| (k, value::Scalar { value }))
                        .collect(),
                    container_class: class,
                    directory,
                    ephemeral_volumes: Vec::new(),
                    user,
                    rootfs,
                    docker: docker.map(|manifest| container_config::Docker { manifest }),
                }
            },
        )
}

fn launch_info() -> impl Strategy<Value = ContainerLaunchInfo> {
    let mount = (
        text(),
        opt_text(),
        opt_text(),
        proptest::option::of(any::<u32>()),
        opt_text(),
    )
        .prop_map(
            |(target, source, r#type, flags, options)| ContainerMountInfo {
                target,
                source,
                r#type,
                flags,
                options,
            },
        );
    (
        (environment(), environment(), opt_text(), opt_text()),
        proptest::collection::vec(any::<i32>(), 0..3),
        proptest::collection::vec(any::<i32>(), 0..3),
        proptest::collection::vec(any::<u32>(), 0..3),
        proptest::option::of(command()),
        proptest::collection::vec(mount, 0..3),
        proptest::collection::vec(text(), 0..2),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(
            |(
                (environment, task_environment, rootfs, working_directory),
                enter,
                clone,
                groups,
                command,
                mounts,
                masked,
                nnp,
            )| {
                ContainerLaunchInfo {
                    environment,
                    task_environment,
                    rootfs,
                    working_directory,
                    enter_namespaces: enter,
                    clone_namespaces: clone,
                    supplementary_groups: groups,
                    command,
                    mounts,
                    masked_paths: masked,
                    no_new_privileges: nnp,
                    ..Default::default()
                }
            },
        )
}

/// Round-trips `msg` through prost, and through prost-reflect, which decodes and encodes from
/// our descriptors alone: both must agree on the message. (Their bytes may differ: prost-reflect
/// writes map entries in hash order and keeps default map keys and values that prost omits.)
fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(
    name: &str,
    msg: &M,
) -> Result<(), TestCaseError> {
    let fail = |e: prost::DecodeError| TestCaseError::fail(e.to_string());
    let bytes = msg.encode_to_vec();
    prop_assert_eq!(&M::decode(bytes.as_slice()).map_err(fail)?, msg);
    prop_assert_eq!(
        M::decode(bytes.as_slice()).map_err(fail)?.encode_to_vec(),
        bytes.clone()
    );

    let dynamic = DynamicMessage::decode(message(&POOL, name), bytes.as_slice()).map_err(fail)?;
    let via_reflect = dynamic.encode_to_vec();
    prop_assert_eq!(&M::decode(via_reflect.as_slice()).map_err(fail)?, msg);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn container_config_round_trips(config in container_config()) {
        round_trip("mesos.slave.ContainerConfig", &config)?;
    }

    #[test]
    fn launch_info_round_trips(info in launch_info()) {
        round_trip("mesos.slave.ContainerLaunchInfo", &info)?;
    }

    #[test]
    fn container_id_round_trips(id in container_id()) {
        round_trip("mesos.ContainerID", &id)?;
    }
}
