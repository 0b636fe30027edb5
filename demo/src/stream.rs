//! The demo's input: Marathon app definitions and the stream saying when each arrives and how
//! long it runs, in simulated seconds.
//!
//! Only the Marathon fields the agent sees are read (`id`, `cmd`, `cpus`, `mem`, `gpus`,
//! `instances`, `container.type`, `container.docker.image`); other fields are accepted and
//! ignored, as in a real app definition. Facts relied on (Marathon app JSON schema):
//! - `id` is a path of segments of lowercase letters, digits, `-` and `.`, e.g. `/ml/train`;
//! - `instances` defaults to 1 and each instance is one task, i.e. one container on an agent;
//! - `gpus` is a scalar like `cpus`, so `1.5` is representable and it is the isolator that
//!   refuses it; `container.type` is `MESOS` (the unified containerizer; with `docker.image` the
//!   image is its root filesystem, without it the task runs in the host's filesystem) or
//!   `DOCKER` (the Docker containerizer).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mesos_gpu_os::container_id::{ContainerId, ContainerIdError};
use mesos_gpu_os::io::{IoContext as _, IoError};
use serde::{Deserialize, Serialize};

/// Why a stream or one of its app files is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The stream file cannot be read.
    #[error(transparent)]
    ReadStream(IoError),
    /// An app file next to the stream cannot be read.
    #[error(transparent)]
    ReadApp(IoError),
    /// A built-in stream names an app file that is not built in.
    #[error("{name} is not one of the built-in app files")]
    NotBuiltIn {
        /// The name asked for.
        name: String,
    },
    /// The stream is not `{"arrivals": [...]}`.
    #[error(
        "{stream}: expected {{\"arrivals\": [{{\"at\": SECONDS, \"app\": FILE, \"runs_for\": SECONDS}}, …]}}"
    )]
    Format {
        /// Where the stream came from.
        stream: String,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// The stream has no arrivals.
    #[error("{stream}: no arrivals")]
    NoArrivals {
        /// Where the stream came from.
        stream: String,
    },
    /// An arrival runs for no time.
    #[error("{stream}: {app} at {at}s: runs_for=0, expected at least 1 second")]
    NoRunTime {
        /// Where the stream came from.
        stream: String,
        /// The arrival's app file.
        app: String,
        /// The arrival's second.
        at: u64,
    },
    /// An arrival's app file is refused.
    #[error("{stream}: arrival at {at}s")]
    Arrival {
        /// Where the stream came from.
        stream: String,
        /// The arrival's second.
        at: u64,
        /// Why its app is refused.
        #[source]
        source: Box<StreamError>,
    },
    /// An app file is not a Marathon app definition.
    #[error("{name}: not a Marathon app definition")]
    NotAnApp {
        /// The app file.
        name: String,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// An app definition has a field Marathon would refuse.
    #[error("{name}: app {id:?}")]
    App {
        /// The app file.
        name: String,
        /// The app's id.
        id: String,
        /// The field and what is accepted.
        #[source]
        source: AppError,
    },
}

/// The field of an app definition that Marathon would refuse, and what it accepts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// `id` is not a path of valid segments.
    #[error("id: expected a path of lowercase letters, digits, '-' and '.', e.g. /ml/train")]
    Id,
    /// Neither `cmd` nor an image.
    #[error("neither cmd nor a container image: Marathon needs one of them")]
    NoCommand,
    /// `cpus` is not above 0.
    #[error("cpus={cpus}: expected more than 0")]
    Cpus {
        /// The value given.
        cpus: f64,
    },
    /// `mem` is not above 0.
    #[error("mem={mem}: expected more than 0 MiB")]
    Mem {
        /// The value given.
        mem: f64,
    },
    /// `instances` is 0.
    #[error("instances=0: expected at least 1 for the demo")]
    NoInstances,
    /// A DOCKER container without an image.
    #[error("container.type DOCKER needs container.docker.image")]
    DockerWithoutImage,
}

/// The shipped stream, built in so that `mesos-gpu demo` works from any directory.
const SHIPPED_STREAM: &str = include_str!("../../examples/marathon/stream.json");

/// The shipped stream of small work for a node that shares GPUs (`demo --gpu-replicas`).
const SHIPPED_SHARING_STREAM: &str = include_str!("../../examples/marathon/sharing-stream.json");

/// The shipped app files, by the name the shipped streams use.
const SHIPPED_APPS: &[(&str, &str)] = &[
    (
        "resnet50-train.json",
        include_str!("../../examples/marathon/resnet50-train.json"),
    ),
    (
        "bert-finetune.json",
        include_str!("../../examples/marathon/bert-finetune.json"),
    ),
    (
        "render-preview.json",
        include_str!("../../examples/marathon/render-preview.json"),
    ),
    (
        "half-gpu.json",
        include_str!("../../examples/marathon/half-gpu.json"),
    ),
    (
        "jupyter-notebook.json",
        include_str!("../../examples/marathon/jupyter-notebook.json"),
    ),
    (
        "llm-pretrain.json",
        include_str!("../../examples/marathon/llm-pretrain.json"),
    ),
    (
        "hpo-sweep.json",
        include_str!("../../examples/marathon/hpo-sweep.json"),
    ),
    (
        "triton-inference.json",
        include_str!("../../examples/marathon/triton-inference.json"),
    ),
    (
        "inference-small.json",
        include_str!("../../examples/marathon/inference-small.json"),
    ),
    (
        "notebook-small.json",
        include_str!("../../examples/marathon/notebook-small.json"),
    ),
];

/// The containerizer a Marathon app asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub(crate) enum ContainerType {
    /// Mesos's unified containerizer: our isolator, device cgroup and mounts.
    #[serde(rename = "MESOS")]
    Mesos,
    /// The Docker containerizer: our Docker bridge's `docker run` arguments.
    #[serde(rename = "DOCKER")]
    Docker,
}

/// `container.docker` of an app.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct DockerSpec {
    /// The image, e.g. `nvidia/cuda:12.4.1-base-ubuntu22.04`.
    pub(crate) image: String,
}

/// `container` of an app.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ContainerSpec {
    /// `MESOS` or `DOCKER`.
    #[serde(rename = "type")]
    pub(crate) kind: ContainerType,
    /// The image, when there is one.
    pub(crate) docker: Option<DockerSpec>,
}

/// A Marathon app definition, the fields the agent sees.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct MarathonApp {
    /// App id, e.g. `/ml/resnet50-train`.
    pub(crate) id: String,
    /// Shell command.
    pub(crate) cmd: Option<String>,
    /// CPUs per instance.
    pub(crate) cpus: f64,
    /// Memory per instance, MiB.
    pub(crate) mem: f64,
    /// GPUs per instance (validated by the isolator, not here).
    #[serde(default)]
    pub(crate) gpus: f64,
    /// Number of tasks.
    #[serde(default = "one")]
    pub(crate) instances: u32,
    /// Container; none means a MESOS container in the host filesystem.
    pub(crate) container: Option<ContainerSpec>,
}

fn one() -> u32 {
    1
}

impl MarathonApp {
    /// Parses and checks what Marathon itself would refuse; `gpus` is left to the isolator.
    pub(crate) fn parse(name: &str, text: &str) -> Result<MarathonApp, StreamError> {
        let app: MarathonApp =
            serde_json::from_str(text).map_err(|source| StreamError::NotAnApp {
                name: name.to_owned(),
                source,
            })?;
        app.check().map_err(|source| StreamError::App {
            name: name.to_owned(),
            id: app.id.clone(),
            source,
        })?;
        Ok(app)
    }

    fn check(&self) -> Result<(), AppError> {
        let segments: Vec<&str> = self.id.trim_start_matches('/').split('/').collect();
        let valid_segment = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        if !segments.iter().all(|s| valid_segment(s)) {
            return Err(AppError::Id);
        }
        if !(self.cmd.as_deref().is_some_and(|c| !c.trim().is_empty()) || self.image().is_some()) {
            return Err(AppError::NoCommand);
        }
        if !(self.cpus.is_finite() && self.cpus > 0.0) {
            return Err(AppError::Cpus { cpus: self.cpus });
        }
        if !(self.mem.is_finite() && self.mem > 0.0) {
            return Err(AppError::Mem { mem: self.mem });
        }
        if self.instances < 1 {
            return Err(AppError::NoInstances);
        }
        if let Some(ContainerSpec {
            kind: ContainerType::Docker,
            docker: None,
        }) = &self.container
        {
            return Err(AppError::DockerWithoutImage);
        }
        Ok(())
    }

    /// The container id of this app's `seq`-th task in a run: `<app id with / as _>.<seq>`.
    pub(crate) fn task_id(&self, seq: u32) -> Result<ContainerId, ContainerIdError> {
        let name = format!(
            "{}.{seq}",
            self.id.trim_start_matches('/').replace('/', "_")
        );
        ContainerId::new(name)
    }

    /// The containerizer.
    pub(crate) fn container_type(&self) -> ContainerType {
        self.container
            .as_ref()
            .map_or(ContainerType::Mesos, |c| c.kind)
    }

    /// The image, if any.
    pub(crate) fn image(&self) -> Option<&str> {
        self.container
            .as_ref()?
            .docker
            .as_ref()
            .map(|d| d.image.as_str())
    }
}

/// One line of `stream.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Arrival {
    /// Simulated second the app is launched.
    pub(crate) at: u64,
    /// App file, relative to the stream file.
    pub(crate) app: String,
    /// How long each of its tasks runs, in simulated seconds.
    pub(crate) runs_for: u64,
}

/// `stream.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamFile {
    /// What the stream shows.
    #[serde(default)]
    pub(crate) description: String,
    /// The arrivals, in any order.
    pub(crate) arrivals: Vec<Arrival>,
}

/// A stream of Marathon apps with its apps loaded: what the demo replays.
#[derive(Debug, Clone)]
pub struct Stream {
    /// Where it came from (`built-in` or the file).
    pub(crate) source: String,
    /// What it shows.
    pub(crate) description: String,
    /// Arrivals, sorted by time (stable), each with its app.
    pub(crate) arrivals: Vec<(Arrival, MarathonApp)>,
}

impl Stream {
    /// The stream shipped in `examples/marathon/`.
    pub fn shipped() -> Result<Stream, StreamError> {
        Stream::built_in("stream.json", SHIPPED_STREAM)
    }

    /// The sharing stream shipped in `examples/marathon/`.
    pub fn shipped_sharing() -> Result<Stream, StreamError> {
        Stream::built_in("sharing-stream.json", SHIPPED_SHARING_STREAM)
    }

    fn built_in(name: &str, text: &str) -> Result<Stream, StreamError> {
        let apps: BTreeMap<&str, &str> = SHIPPED_APPS.iter().copied().collect();
        Stream::build(
            &format!("built-in examples/marathon/{name}"),
            text,
            |name| {
                apps.get(name)
                    .map(|text| (*text).to_owned())
                    .ok_or_else(|| StreamError::NotBuiltIn {
                        name: name.to_owned(),
                    })
            },
        )
    }

    /// How many arrivals it has.
    pub fn arrival_count(&self) -> usize {
        self.arrivals.len()
    }

    /// A stream file; its app files are read relative to its directory.
    pub fn load(path: &Path) -> Result<Stream, StreamError> {
        let text = std::fs::read_to_string(path)
            .at("read the stream", path)
            .map_err(StreamError::ReadStream)?;
        let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
        Stream::build(&path.display().to_string(), &text, |name| {
            let file = dir.join(name);
            std::fs::read_to_string(&file)
                .at("read", &file)
                .map_err(StreamError::ReadApp)
        })
    }

    fn build(
        source: &str,
        text: &str,
        read: impl Fn(&str) -> Result<String, StreamError>,
    ) -> Result<Stream, StreamError> {
        let file: StreamFile = serde_json::from_str(text).map_err(|e| StreamError::Format {
            stream: source.to_owned(),
            source: e,
        })?;
        if file.arrivals.is_empty() {
            return Err(StreamError::NoArrivals {
                stream: source.to_owned(),
            });
        }
        let mut arrivals = Vec::with_capacity(file.arrivals.len());
        for arrival in file.arrivals {
            if arrival.runs_for == 0 {
                return Err(StreamError::NoRunTime {
                    stream: source.to_owned(),
                    app: arrival.app,
                    at: arrival.at,
                });
            }
            let app = MarathonApp::parse(&arrival.app, &read(&arrival.app)?).map_err(|e| {
                StreamError::Arrival {
                    stream: source.to_owned(),
                    at: arrival.at,
                    source: Box::new(e),
                }
            })?;
            arrivals.push((arrival, app));
        }
        arrivals.sort_by_key(|(a, _)| a.at);
        Ok(Stream {
            source: source.to_owned(),
            description: file.description,
            arrivals,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    fn marathon_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/marathon")
    }

    #[test]
    fn every_shipped_app_parses_and_has_what_marathon_requires() {
        let mut seen = 0;
        for entry in std::fs::read_dir(marathon_dir()).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            if name.ends_with("stream.json") || path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let app = MarathonApp::parse(&name, &text).unwrap();
            let raw: serde_json::Value = serde_json::from_str(&text).unwrap();
            for field in ["id", "cmd", "cpus", "mem", "gpus", "instances"] {
                assert!(raw.get(field).is_some(), "{name} lacks {field}");
            }
            assert!(app.id.starts_with('/'), "{name}: {}", app.id);
            assert!(
                SHIPPED_APPS.iter().any(|(n, t)| *n == name && *t == text),
                "{name} is not built in (or differs from the built-in copy)"
            );
            seen += 1;
        }
        assert_eq!(seen, SHIPPED_APPS.len());
    }

    #[test]
    fn shipped_stream_references_existing_files_and_covers_both_containerizers() {
        let from_disk = Stream::load(&marathon_dir().join("stream.json")).unwrap();
        let built_in = Stream::shipped().unwrap();
        assert_eq!(from_disk.arrivals.len(), built_in.arrivals.len());
        let kinds: Vec<ContainerType> = built_in
            .arrivals
            .iter()
            .map(|(_, a)| a.container_type())
            .collect();
        assert!(kinds.contains(&ContainerType::Mesos) && kinds.contains(&ContainerType::Docker));
        assert!(
            built_in.arrivals.iter().any(|(_, a)| a.gpus.fract() != 0.0),
            "a bad gpus value"
        );
        assert!(
            built_in.arrivals.iter().any(|(_, a)| a.image().is_none()),
            "a host-filesystem app"
        );
        assert!(built_in.arrivals.iter().any(|(_, a)| a.instances > 1));
        assert!(built_in.arrivals.windows(2).all(|w| w[0].0.at <= w[1].0.at));
    }

    #[test]
    fn bad_apps_are_refused_naming_the_field() {
        let cases = [
            (
                r#"{"id": "/Bad_Id", "cmd": "x", "cpus": 1, "mem": 1}"#,
                "id: expected",
            ),
            (r#"{"id": "/a", "cpus": 1, "mem": 1}"#, "neither cmd nor"),
            (r#"{"id": "/a", "cmd": "x", "cpus": 0, "mem": 1}"#, "cpus=0"),
            (
                r#"{"id": "/a", "cmd": "x", "cpus": 1, "mem": 1, "container": {"type": "DOCKER"}}"#,
                "docker.image",
            ),
            (
                r#"{"id": "/a", "cmd": "x", "cpus": 1, "mem": 1, "container": {"type": "LXC"}}"#,
                "not a Marathon app",
            ),
            (
                r#"{"id": "/a", "cmd": "x", "cpus": 1, "mem": 1, "instances": 0}"#,
                "instances=0",
            ),
        ];
        for (text, want) in cases {
            let err =
                mesos_gpu_os::chain::error_chain(&MarathonApp::parse("t.json", text).unwrap_err());
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn stream_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let stream = dir.path().join("s.json");
        std::fs::write(
            &stream,
            r#"{"arrivals": [{"at": 0, "app": "missing.json", "runs_for": 5}]}"#,
        )
        .unwrap();
        let err = mesos_gpu_os::chain::error_chain(&Stream::load(&stream).unwrap_err());
        assert!(err.contains("missing.json"), "{err}");
        std::fs::write(
            &stream,
            r#"{"arrivals": [{"at": 0, "app": "a.json", "runs_for": 5, "extra": 1}]}"#,
        )
        .unwrap();
        let err = mesos_gpu_os::chain::error_chain(&Stream::load(&stream).unwrap_err());
        assert!(err.contains("expected {\"arrivals\""), "{err}");
    }
}
