//! Whether a container image wants the driver volume, and the environment that makes it usable.
//!
//! Mesos `NvidiaVolume::shouldInject` and `ENV` (`docs/reference/mesos-gpu-isolator.md` §6.4,
//! §6.5):
//!
//! - The image's `NVIDIA_VISIBLE_DEVICES`, when set, decides: inject unless it is `""` or `void`
//!   (the first occurrence wins; `void` is also what NVIDIA's CDI specs set to stop a second
//!   injection). Otherwise the label `com.nvidia.volumes.needed` (its key alone) asks for it.
//! - `PATH` gets `/usr/local/nvidia/bin`, and `LD_LIBRARY_PATH` gets `/usr/local/cuda/compat`,
//!   `/usr/local/nvidia/lib`, `/usr/local/nvidia/lib64`, each appended only if absent. The CUDA
//!   forward-compat directory comes first so that its newer `libcuda` wins over the host's.
//! - Where Mesos would set `PATH` to the volume's `bin` alone when the image has no `PATH`, we
//!   start from Docker's default `PATH` so the image's own commands still resolve.

/// Where the volume is mounted in containers.
pub const CONTAINER_PATH: &str = "/usr/local/nvidia";
/// The image label that asks for the volume (nvidia-docker 1.0).
pub const VOLUMES_NEEDED_LABEL: &str = "com.nvidia.volumes.needed";
/// The environment variable NVIDIA's container images set.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// Docker's `PATH` for images that set none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const PATH_ADDITIONS: &[&str] = &["/usr/local/nvidia/bin"];
const LD_LIBRARY_PATH_ADDITIONS: &[&str] = &[
    "/usr/local/cuda/compat",
    "/usr/local/nvidia/lib",
    "/usr/local/nvidia/lib64",
];

/// True when an image with environment `env` (`KEY=VALUE` strings, as in an image config) and
/// labels `label_keys` should get the driver volume.
pub fn should_inject<E, L>(env: &[E], label_keys: impl IntoIterator<Item = L>) -> bool
where
    E: AsRef<str>,
    L: AsRef<str>,
{
    match lookup(env, VISIBLE_DEVICES_ENV) {
        Some(value) => !value.is_empty() && value != "void",
        None => label_keys
            .into_iter()
            .any(|k| k.as_ref() == VOLUMES_NEEDED_LABEL),
    }
}

/// The `PATH` and `LD_LIBRARY_PATH` values to set in a container whose image has `env`.
pub fn container_env<E: AsRef<str>>(env: &[E]) -> Vec<(String, String)> {
    let path = append_absent(lookup(env, "PATH").or(Some(DEFAULT_PATH)), PATH_ADDITIONS);
    let ld = append_absent(lookup(env, "LD_LIBRARY_PATH"), LD_LIBRARY_PATH_ADDITIONS);
    vec![
        ("PATH".to_owned(), path),
        ("LD_LIBRARY_PATH".to_owned(), ld),
    ]
}

/// The value of the first `key=` entry of `env`.
fn lookup<'a, E: AsRef<str>>(env: &'a [E], key: &str) -> Option<&'a str> {
    env.iter().find_map(|entry| {
        let (k, v) = entry.as_ref().split_once('=')?;
        (k == key).then_some(v)
    })
}

fn append_absent(current: Option<&str>, additions: &[&str]) -> String {
    let mut parts: Vec<&str> = match current {
        Some("") | None => Vec::new(),
        Some(value) => value.split(':').collect(),
    };
    for add in additions {
        if !parts.contains(add) {
            parts.push(add);
        }
    }
    parts.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NO_LABELS: [&str; 0] = [];

    #[test]
    fn visible_devices_decides_when_present() {
        assert!(should_inject(&["NVIDIA_VISIBLE_DEVICES=all"], NO_LABELS));
        assert!(should_inject(&["NVIDIA_VISIBLE_DEVICES=none"], NO_LABELS));
        assert!(!should_inject(&["NVIDIA_VISIBLE_DEVICES="], NO_LABELS));
        assert!(!should_inject(
            &["NVIDIA_VISIBLE_DEVICES=void"],
            [VOLUMES_NEEDED_LABEL]
        ));
        assert!(should_inject(
            &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=void"],
            NO_LABELS
        ));
        assert!(!should_inject(
            &["NVIDIA_VISIBLE_DEVICESX=all", "PATH=/bin"],
            NO_LABELS
        ));
    }

    #[test]
    fn label_key_alone_asks_for_the_volume() {
        let empty: [&str; 0] = [];
        assert!(should_inject(&empty, ["a", VOLUMES_NEEDED_LABEL]));
        assert!(!should_inject(&["PATH=/bin"], ["com.nvidia.cuda.version"]));
    }

    #[test]
    fn env_appends_only_what_is_absent() {
        let env = container_env(&[
            "PATH=/usr/bin:/usr/local/nvidia/bin",
            "LD_LIBRARY_PATH=/opt/lib",
        ]);
        assert_eq!(
            env,
            [
                (
                    "PATH".to_owned(),
                    "/usr/bin:/usr/local/nvidia/bin".to_owned()
                ),
                (
                    "LD_LIBRARY_PATH".to_owned(),
                    "/opt/lib:/usr/local/cuda/compat:/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
                        .to_owned()
                ),
            ]
        );
        let empty: [&str; 0] = [];
        let env = container_env(&empty);
        assert_eq!(env[0].1, format!("{DEFAULT_PATH}:/usr/local/nvidia/bin"));
        assert_eq!(
            env[1].1,
            "/usr/local/cuda/compat:/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
        );
    }

    proptest! {
        #[test]
        fn env_keeps_the_image_value_as_a_prefix_and_adds_each_dir_once(
            parts in proptest::collection::vec("[a-z/]{1,12}", 0..5)
        ) {
            let value = parts.join(":");
            let env = [format!("LD_LIBRARY_PATH={value}")];
            let out = &container_env(&env)[1].1;
            prop_assert!(out.starts_with(&value));
            for dir in LD_LIBRARY_PATH_ADDITIONS {
                prop_assert!(out.split(':').any(|p| p == *dir));
            }
            let again = container_env(&[format!("LD_LIBRARY_PATH={out}")]);
            prop_assert_eq!(&again[1].1, out);
        }
    }
}
