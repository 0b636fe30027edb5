//! Mesos agent `--attributes` that describe a node's GPUs, so that frameworks with the
//! `GPU_RESOURCES` capability can choose GPU types by attribute constraints.
//!
//! Mesos syntax (`Attributes::parse`, `src/common/attributes.cpp` and `values::parse`):
//! `name:value;name:value`, tokens split on `;`, each split on `:` into exactly two parts. Mesos
//! removes every space from a value, then reads `[..]` as ranges, `{..}` as a set, a number as a
//! scalar, and anything else without `[]{},` as text. Values here are therefore made of
//! `[A-Za-z0-9._-]` only, spaces becoming `-` as NVIDIA's GPU feature discovery does for
//! `nvidia.com/gpu.product` (`Tesla V100-SXM2-16GB` → `Tesla-V100-SXM2-16GB`).

use std::collections::BTreeSet;

use mesos_gpu_node::inventory::Inventory;

/// Attribute: the GPU product name(s), `+`-joined when the advertised GPUs differ.
pub(crate) const ATTR_MODEL: &str = "gpu_model";
/// Attribute: the smallest framebuffer among the advertised GPUs, in MiB (scalar).
pub(crate) const ATTR_MEMORY_MIB: &str = "gpu_memory_mib";
/// Attribute: the lowest CUDA compute capability among the advertised GPUs, `major.minor` (scalar).
pub(crate) const ATTR_COMPUTE_CAPABILITY: &str = "gpu_compute_capability";
/// Attribute: the NVIDIA driver version (text).
pub(crate) const ATTR_DRIVER: &str = "nvidia_driver";
/// Attribute: the highest CUDA version the driver supports, `major.minor` (scalar).
pub(crate) const ATTR_CUDA: &str = "cuda_version";

/// Why a user-supplied `--attributes` value cannot be merged.
#[derive(Debug, thiserror::Error)]
pub enum AttributesError {
    /// A token is not `name:value`.
    #[error("--attributes entry {token:?}: expected name:value")]
    NotNameValue {
        /// The offending token.
        token: String,
    },
    /// The user already sets one of the GPU attributes this tool writes.
    #[error("--attributes already sets {name:?}, which mesos-gpu derives from the GPUs; remove it")]
    Conflict {
        /// The attribute name.
        name: String,
    },
}

/// One `name:value` agent attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    /// Attribute name.
    pub name: String,
    /// Value, already safe for Mesos's attribute syntax.
    pub value: String,
}

/// The GPU attributes for the GPUs with these NVML indices (unknown indices are skipped); the
/// driver's (`nvidia_driver`, `cuda_version`) only with `driver`: they change with every driver
/// upgrade, and Mesos refuses to recover an agent whose attributes changed.
pub(crate) fn gpu_attributes(
    inventory: &Inventory,
    indices: &[u32],
    driver: bool,
) -> Vec<Attribute> {
    let gpus: Vec<_> = indices
        .iter()
        .filter_map(|&i| inventory.by_index(i))
        .collect();
    let mut out = Vec::new();
    let mut push = |name: &str, value: Option<String>| {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            out.push(Attribute {
                name: name.to_owned(),
                value,
            });
        }
    };
    let mut seen = BTreeSet::new();
    let models: Vec<String> = gpus
        .iter()
        .map(|g| safe_text(&g.name))
        .filter(|m| !m.is_empty() && seen.insert(m.clone()))
        .collect();
    push(ATTR_MODEL, Some(models.join("+")));
    let memory = gpus.iter().map(|g| g.memory_total).filter(|&m| m > 0).min();
    push(
        ATTR_MEMORY_MIB,
        memory.map(|m| (m / (1024 * 1024)).to_string()),
    );
    if gpus.iter().all(|g| g.compute_capability.is_some()) {
        let cc = gpus.iter().filter_map(|g| g.compute_capability).min();
        push(
            ATTR_COMPUTE_CAPABILITY,
            cc.map(|(major, minor)| format!("{major}.{minor}")),
        );
    }
    if driver
        && !gpus.is_empty()
        && let Some(driver) = &inventory.driver
    {
        push(ATTR_DRIVER, Some(safe_text(&driver.version)));
        push(
            ATTR_CUDA,
            driver
                .cuda_version
                .map(|(major, minor)| format!("{major}.{minor}")),
        );
    }
    out
}

/// Makes `raw` a Mesos text attribute value: spaces become `-`, other characters outside
/// `[A-Za-z0-9._-]` become `_`, runs of `-` collapse, and leading/trailing `-` go.
pub(crate) fn safe_text(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.trim().chars() {
        let c = match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            c if c.is_whitespace() => '-',
            _ => '_',
        };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out.trim_matches('-').to_owned()
}

/// Appends `ours` to the user's `--attributes` (if any), refusing to override a user's value.
pub(crate) fn merge(user: Option<&str>, ours: &[Attribute]) -> Result<String, AttributesError> {
    let mut tokens = Vec::new();
    for token in user
        .unwrap_or("")
        .split(';')
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let parts: Vec<&str> = token.split(':').collect();
        let [name, value] = parts.as_slice() else {
            return Err(AttributesError::NotNameValue {
                token: token.to_owned(),
            });
        };
        let name = name.trim();
        if name.is_empty() || value.trim().is_empty() {
            return Err(AttributesError::NotNameValue {
                token: token.to_owned(),
            });
        }
        if ours.iter().any(|a| a.name == name) {
            return Err(AttributesError::Conflict {
                name: name.to_owned(),
            });
        }
        tokens.push(format!("{name}:{}", value.trim()));
    }
    tokens.extend(ours.iter().map(|a| format!("{}:{}", a.name, a.value)));
    Ok(tokens.join(";"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_node::{inventory::DriverInfo, inventory::Gpu, inventory::Topology};
    use proptest::prelude::*;

    fn gpu(index: u32, name: &str, mib: u64, cc: Option<(u32, u32)>) -> Gpu {
        Gpu {
            index,
            minor: index,
            uuid: format!("GPU-{index}"),
            name: name.to_owned(),
            memory_total: mib * 1024 * 1024,
            pci_bus_id: format!("00000000:{index:02x}:00.0"),
            numa_node: None,
            compute_capability: cc,
            healthy: true,
        }
    }

    fn node(gpus: Vec<Gpu>) -> Inventory {
        let n = gpus.len();
        Inventory {
            driver: Some(DriverInfo {
                version: "550.54.14".into(),
                cuda_version: Some((12, 4)),
            }),
            gpus,
            topology: Topology::unknown(n),
            absent_reason: None,
            mig: Default::default(),
        }
    }

    #[test]
    fn homogeneous_node() {
        let inv = node(vec![
            gpu(0, "Tesla V100-SXM2-16GB", 16160, Some((7, 0))),
            gpu(1, "Tesla V100-SXM2-16GB", 16160, Some((7, 0))),
        ]);
        let attrs = merge(None, &gpu_attributes(&inv, &[0, 1], true)).expect("merge");
        assert_eq!(
            attrs,
            "gpu_model:Tesla-V100-SXM2-16GB;gpu_memory_mib:16160;gpu_compute_capability:7.0;\
             nvidia_driver:550.54.14;cuda_version:12.4"
        );
    }

    #[test]
    fn mixed_node_and_subset() {
        let inv = node(vec![
            gpu(0, "NVIDIA A100-SXM4-80GB", 81920, Some((8, 0))),
            gpu(1, "Tesla T4", 15360, Some((7, 5))),
            gpu(2, "Tesla T4", 15360, None),
        ]);
        let all = gpu_attributes(&inv, &[0, 1, 2], true);
        assert_eq!(all[0].value, "NVIDIA-A100-SXM4-80GB+Tesla-T4");
        assert_eq!(all[1].value, "15360");
        assert!(
            all.iter().all(|a| a.name != ATTR_COMPUTE_CAPABILITY),
            "unknown cc on GPU 2: {all:?}"
        );
        let first = gpu_attributes(&inv, &[0], true);
        assert_eq!(
            first[2],
            Attribute {
                name: ATTR_COMPUTE_CAPABILITY.into(),
                value: "8.0".into()
            }
        );
        assert!(gpu_attributes(&inv, &[], true).is_empty());
    }

    #[test]
    fn merge_keeps_user_attributes_and_refuses_overrides() {
        let ours = [Attribute {
            name: ATTR_MODEL.into(),
            value: "T4".into(),
        }];
        assert_eq!(
            merge(Some("rack:r1; zone : a ;"), &ours).expect("merge"),
            "rack:r1;zone:a;gpu_model:T4"
        );
        assert!(matches!(
            merge(Some("gpu_model:x"), &ours),
            Err(AttributesError::Conflict { .. })
        ));
        assert!(matches!(
            merge(Some("rack"), &ours),
            Err(AttributesError::NotNameValue { .. })
        ));
        assert!(matches!(
            merge(Some("a:b:c"), &ours),
            Err(AttributesError::NotNameValue { .. })
        ));
    }

    #[test]
    fn safe_text_examples() {
        assert_eq!(safe_text("  Tesla  K80 "), "Tesla-K80");
        assert_eq!(
            safe_text("GeForce RTX 3090 (rev a1)"),
            "GeForce-RTX-3090-_rev-a1_"
        );
        assert_eq!(safe_text("a:b;c,d{e}[f]"), "a_b_c_d_e__f_");
    }

    proptest! {
        #[test]
        fn safe_text_is_mesos_safe(raw in "\\PC{0,30}") {
            let s = safe_text(&raw);
            prop_assert!(s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')), "{:?}", s);
            prop_assert!(!s.starts_with('-') && !s.ends_with('-'));
        }
    }
}
