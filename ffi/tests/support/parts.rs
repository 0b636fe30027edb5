//! What a container gets, as an entry point or renderer gave it, in the parts the parity tests
//! compare (`parity.rs`, `entry_parity.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use mesos_gpu::proto::mesos::slave::ContainerLaunchInfo;

/// The variables every entry point and renderer must agree on.
pub(crate) const COMPARED_ENV: [&str; 7] = [
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "MESOS_GPU_SHARE",
    "MESOS_GPU_SHARING",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
];

/// What a container gets, as an entry point or renderer gave it: host device nodes, variables, bind mounts
/// (besides the driver volume and MIG `access` files) and cpuset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Parts {
    pub(crate) devices: BTreeSet<String>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) mounts: BTreeSet<(String, String)>,
    pub(crate) cpuset: Option<(String, Option<String>)>,
}

impl Parts {
    pub(crate) fn keep_env<'a>(&mut self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (k, v) in pairs {
            if COMPARED_ENV.contains(&k) {
                self.env.insert(k.to_owned(), v.to_owned());
            }
        }
    }

    /// The same, the MPS root `root` of its entry point written `<mps>`.
    pub(crate) fn with_mps_root(mut self, root: &Path) -> Parts {
        let root = root.display().to_string();
        let cut = |s: &str| s.replace(&root, "<mps>");
        self.env = self.env.iter().map(|(k, v)| (k.clone(), cut(v))).collect();
        self.mounts = self.mounts.iter().map(|(a, b)| (cut(a), cut(b))).collect();
        self
    }

    /// The `GPU-…`/`MIG-…` UUIDs it names.
    pub(crate) fn uuids(&self) -> Vec<String> {
        self.env
            .get("CUDA_VISIBLE_DEVICES")
            .map(|v| {
                v.split(',')
                    .filter(|u| !u.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The parts of `docker run` arguments.
pub(crate) fn docker_parts(args: &[String]) -> Parts {
    let mut parts = Parts::default();
    let mut mems = None;
    let mut cpus = None;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        // `-e KEY=VALUE` as Mesos writes its own variables, `--env=` as ours.
        let (option, value) = match arg.split_once('=') {
            Some((o, v)) if o.starts_with("--") => (o, v.to_owned()),
            _ if arg == "-e" || arg == "--env" || arg == "--device" || arg == "--volume" => {
                i += 1;
                (arg.as_str(), args.get(i).cloned().unwrap_or_default())
            }
            _ => (arg.as_str(), String::new()),
        };
        match option {
            "--device" => {
                parts
                    .devices
                    .insert(value.split(':').next().unwrap_or(&value).to_owned());
            }
            "-e" | "--env" => {
                let (k, v) = value.split_once('=').unwrap_or((&value, ""));
                parts.keep_env([(k, v)]);
            }
            "--volume" => {
                let mut fields = value.split(':');
                let (source, target) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
                if target != "/usr/local/nvidia" {
                    parts.mounts.insert((source.to_owned(), target.to_owned()));
                }
            }
            "--cpuset-cpus" => cpus = Some(value),
            "--cpuset-mems" => mems = Some(value),
            _ => {}
        }
        i += 1;
    }
    parts.cpuset = cpus.map(|c| (c, mems));
    parts
}

/// The differences between `got` (entry point or renderer `who`) and `want` (what `reference`
/// gives: the module, the grant); the cpuset only when `cpuset`.
pub(crate) fn differences(
    case: &str,
    who: &str,
    (reference, want): (&str, &Parts),
    got: &Parts,
    cpuset: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut say = |part: &str, want: &dyn std::fmt::Debug, got: &dyn std::fmt::Debug| {
        out.push(format!(
            "{case}: {who} gives {part} {got:?}, {reference} {want:?}"
        ));
    };
    if got.devices != want.devices {
        say("device nodes", &want.devices, &got.devices);
    }
    if got.env != want.env {
        say("variables", &want.env, &got.env);
    }
    if got.mounts != want.mounts {
        say("mounts", &want.mounts, &got.mounts);
    }
    if cpuset && got.cpuset != want.cpuset {
        say("cpuset", &want.cpuset, &got.cpuset);
    }
    out
}

/// The parts of a Mesos launch info: device nodes (bind mounts of `nvidia*` nodes under `dev`),
/// other mounts (targets relative to `rootfs`; a MIG device's `access` files left out: Mesos
/// only), variables.
pub(crate) fn launch_parts(info: &ContainerLaunchInfo, rootfs: &Path, dev: &Path) -> Parts {
    let mut parts = Parts::default();
    for m in &info.mounts {
        let source = m.source.clone().unwrap_or_default();
        let target = Path::new(&m.target)
            .strip_prefix(rootfs)
            .map(|t| Path::new("/").join(t).display().to_string())
            .unwrap_or_else(|_| m.target.clone());
        if source.contains("/driver/nvidia/capabilities/") {
            continue; // MIG access files: Mesos only (runc refuses mounts inside /proc).
        }
        let nvidia = Path::new(&source)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("nvidia"));
        if nvidia && Path::new(&source).starts_with(dev) {
            parts.devices.insert(source);
        } else {
            parts.mounts.insert((source, target));
        }
    }
    for env in info.environment.iter().chain(&info.task_environment) {
        parts.keep_env(
            env.variables
                .iter()
                .map(|v| (v.name.as_str(), v.value.as_deref().unwrap_or(""))),
        );
    }
    parts
}
