//! The CDI spec document as plain serde structs, holding only the fields mesos-gpu writes, and the
//! minimum `cdiVersion` that its content needs.
//!
//! Facts relied on (CDI `SPEC.md` "Released versions" and `specs-go/version.go`,
//! `docs/reference/cdi.md` §2):
//! - consumers refuse a spec whose `cdiVersion` they do not know, and one whose content needs a
//!   newer version than it declares; writers should therefore declare the **minimum** version.
//!   Debian 12's podman 4.3.1 knows versions up to 0.5.0, so declaring more would lose it;
//! - `0.3.0` is the earliest version a consumer computes; `0.4.0` added `mounts[].type`; `0.5.0`
//!   added `deviceNodes[].hostPath` and device names starting with a digit (`"0"`); later
//!   versions add fields these structs do not have (annotations 0.6.0, `intelRdt` and
//!   `additionalGids` 0.7.0, `netDevices` 1.1.0). A field added here must extend
//!   [`Spec::minimum_version`];
//! - device names: an ASCII letter or digit at both ends, letters, digits, `-`, `_`, `.` and `:`
//!   inside (`pkg/parser/parser.go` `ValidateDeviceName`; `:` is what MIG names `0:1` use);
//! - a spec must declare at least one device, and each name once (`pkg/cdi/spec.go` `validate`).

use std::fmt;

use serde::Serialize;

/// A CDI spec version this crate can declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CdiVersion {
    /// The earliest version consumers compute: env, device nodes, mounts without `type`, hooks.
    V0_3_0,
    /// Adds `mounts[].type`.
    V0_4_0,
    /// Adds `deviceNodes[].hostPath` and device names starting with a digit.
    V0_5_0,
}

impl CdiVersion {
    /// The version as written in `cdiVersion`.
    pub fn as_str(self) -> &'static str {
        match self {
            CdiVersion::V0_3_0 => "0.3.0",
            CdiVersion::V0_4_0 => "0.4.0",
            CdiVersion::V0_5_0 => "0.5.0",
        }
    }
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for CdiVersion {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Why a spec could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A device name breaks CDI's naming rule.
    #[error(
        "CDI device name {name:?}: expected an ASCII letter or digit at both ends and only letters, \
         digits, '-', '_', '.' or ':' inside"
    )]
    BadName {
        /// The name as built.
        name: String,
    },
    /// Two devices would have the same name.
    #[error("CDI device name {name:?} appears twice")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// A spec needs at least one device.
    #[error("a CDI spec needs at least one device")]
    NoDevices,
}

/// A CDI spec: one vendor/class (`kind`), its devices, and the edits common to all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The minimum version the content needs, computed by [`Spec::new`].
    cdi_version: CdiVersion,
    /// `vendor/class`, e.g. `nvidia.com/gpu`.
    kind: String,
    /// The devices, in the order given.
    devices: Vec<Device>,
    /// Edits applied when any device of the spec is requested.
    #[serde(skip_serializing_if = "ContainerEdits::is_empty")]
    container_edits: ContainerEdits,
}

/// One device a runtime can be asked for as `<kind>=<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The device's name within the kind.
    pub name: String,
    /// Edits applied only when this device is requested.
    pub container_edits: ContainerEdits,
}

/// Changes to a container's OCI spec.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries; a runtime replaces an earlier entry with the same key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes created in the container and allowed in its device cgroup.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts added to the container.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    /// True when the edits change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty()
    }
}

/// A device node in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container, e.g. `/dev/nvidia0`.
    pub path: String,
    /// Path on the host when it differs from `path` (CDI 0.5.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` for a character device; with `major` and `minor` it spares the runtime a `stat`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    /// Major device number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor device number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Device-cgroup access: a subset of `rwm`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

/// A mount in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// OCI mount options, e.g. `ro`, `bind`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Mount type (CDI 0.4.0); bind mounts need none.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

impl Spec {
    /// A spec of `kind` with `devices` and the `common` edits, declaring the minimum version its
    /// content needs. Refuses bad or repeated names and an empty device list.
    pub fn new(
        kind: &str,
        devices: Vec<Device>,
        common: ContainerEdits,
    ) -> Result<Spec, SpecError> {
        if devices.is_empty() {
            return Err(SpecError::NoDevices);
        }
        let mut seen = std::collections::BTreeSet::new();
        for device in &devices {
            if !valid_name(&device.name) {
                return Err(SpecError::BadName {
                    name: device.name.clone(),
                });
            }
            if !seen.insert(device.name.as_str()) {
                return Err(SpecError::DuplicateName {
                    name: device.name.clone(),
                });
            }
        }
        let mut spec = Spec {
            cdi_version: CdiVersion::V0_3_0,
            kind: kind.to_owned(),
            devices,
            container_edits: common,
        };
        spec.cdi_version = spec.minimum_version();
        Ok(spec)
    }

    /// The version declared in `cdiVersion`.
    pub fn version(&self) -> CdiVersion {
        self.cdi_version
    }

    /// `vendor/class`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The devices, in order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The edits common to every device.
    pub fn common_edits(&self) -> &ContainerEdits {
        &self.container_edits
    }

    /// The spec as pretty JSON with a final newline: the bytes written to the spec file.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing these structs cannot fail: every key is a string and every value a string,
        // integer, list or struct of those.
        let mut bytes = serde_json::to_vec_pretty(self).expect("CDI spec structs always serialize");
        bytes.push(b'\n');
        bytes
    }

    /// The lowest version whose features cover this content (see the module docs).
    pub fn minimum_version(&self) -> CdiVersion {
        let edits = || {
            self.devices
                .iter()
                .map(|d| &d.container_edits)
                .chain(std::iter::once(&self.container_edits))
        };
        let digit_name = self
            .devices
            .iter()
            .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()));
        let host_path = edits()
            .flat_map(|e| &e.device_nodes)
            .any(|n| n.host_path.is_some());
        if digit_name || host_path {
            return CdiVersion::V0_5_0;
        }
        if edits()
            .flat_map(|e| &e.mounts)
            .any(|m| m.mount_type.is_some())
        {
            return CdiVersion::V0_4_0;
        }
        CdiVersion::V0_3_0
    }
}

/// CDI's device-name rule (see the module docs).
pub fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str) -> Device {
        Device {
            name: name.to_owned(),
            container_edits: ContainerEdits {
                env: vec!["A=1".to_owned()],
                ..ContainerEdits::default()
            },
        }
    }

    fn node(host_path: Option<&str>) -> DeviceNode {
        DeviceNode {
            path: "/dev/nvidia0".to_owned(),
            host_path: host_path.map(str::to_owned),
            node_type: Some("c".to_owned()),
            major: Some(195),
            minor: Some(0),
            permissions: None,
        }
    }

    fn spec(devices: Vec<Device>, common: ContainerEdits) -> Spec {
        Spec::new("nvidia.com/gpu", devices, common).expect("valid spec")
    }

    #[test]
    fn version_follows_the_feature_table() {
        // Nothing past 0.3.0: a letter-first name, nodes without hostPath, a typeless mount.
        let mut common = ContainerEdits {
            device_nodes: vec![node(None)],
            mounts: vec![Mount {
                host_path: "/v".to_owned(),
                container_path: "/usr/local/nvidia".to_owned(),
                options: vec!["ro".to_owned(), "bind".to_owned()],
                mount_type: None,
            }],
            ..ContainerEdits::default()
        };
        assert_eq!(
            spec(vec![device("gpu0")], common.clone()).version(),
            CdiVersion::V0_3_0
        );
        common.mounts[0].mount_type = Some("none".to_owned());
        assert_eq!(
            spec(vec![device("gpu0")], common.clone()).version(),
            CdiVersion::V0_4_0
        );
        common.mounts[0].mount_type = None;
        assert_eq!(
            spec(vec![device("gpu0"), device("0")], common.clone()).version(),
            CdiVersion::V0_5_0
        );
        let mut with_host_path = device("GPU-1");
        with_host_path.container_edits.device_nodes = vec![node(Some("/tmp/dev/nvidia0"))];
        assert_eq!(
            spec(vec![with_host_path], ContainerEdits::default()).version(),
            CdiVersion::V0_5_0
        );
    }

    #[test]
    fn names_follow_the_cdi_rule() {
        for good in [
            "0",
            "12",
            "all",
            "GPU-6e2b0c1a-0000-0000-0000-000000000000",
            "0:1",
            "a.b_c",
        ] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "-0", "0-", ":1", "GPU 1", "0/1", "é"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        let err = Spec::new(
            "nvidia.com/gpu",
            vec![device("GPU 1")],
            ContainerEdits::default(),
        )
        .expect_err("bad name");
        assert!(err.to_string().contains("\"GPU 1\""), "{err}");
    }

    #[test]
    fn refuses_duplicates_and_empty_specs() {
        assert!(matches!(
            Spec::new(
                "nvidia.com/gpu",
                vec![device("0"), device("0")],
                ContainerEdits::default()
            ),
            Err(SpecError::DuplicateName { name }) if name == "0"
        ));
        assert!(matches!(
            Spec::new("nvidia.com/gpu", Vec::new(), ContainerEdits::default()),
            Err(SpecError::NoDevices)
        ));
    }

    #[test]
    fn json_uses_the_spec_field_names_and_omits_empty_parts() {
        let spec = spec(vec![device("0")], ContainerEdits::default());
        let text = String::from_utf8(spec.to_json()).expect("utf-8");
        let value: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            value,
            serde_json::json!({
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}]
            })
        );
        assert!(text.ends_with("}\n"));
    }
}
