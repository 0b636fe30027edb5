//! The agent flags that advertise a node's split into shared and whole GPUs: `gpus` in
//! `--resources` becomes Σ R over shared GPUs + the whole GPUs, and `--attributes` says how
//! (so frameworks can constrain on it). `--nvidia_gpu_devices` still lists physical GPUs.
//! Only mesos-gpu's module shares GPUs: Mesos's `gpu/nvidia` gives each GPU to one task, and its
//! agent refuses more `gpus` than `--nvidia_gpu_devices` lists
//! (`isolators/gpu/allocator.cpp`, `resources`).

use crate::agent_flags::{
    AgentGpus, Attribute, AttributesError, DEVICES_FLAG, GPU_ISOLATOR, GPUS, GpuIsolator,
    MODULE_ISOLATOR, MigOffer, MigStrategy, Resources, ResourcesError, merge_attributes,
};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::sharing::{SharingError, SharingPlan, SharingSpec};

/// Attribute: the sharing modes of the shared GPUs (`time-slicing`, `mps`, or both joined
/// with `+`).
pub const ATTR_SHARING: &str = "gpu_sharing";
/// Attributes (only when modes differ): how many GPUs each mode shares (`gpu_shared_mps`,
/// `gpu_shared_time_slicing`).
pub(crate) const ATTR_SHARED_PREFIX: &str = "gpu_shared_";
/// Attribute: how many physical GPUs and MIG devices are shared (scalar).
pub const ATTR_SHARED: &str = "gpu_shared";
/// Attribute: the replica count R of the shared GPUs (scalar; `+`-joined text when they differ).
pub const ATTR_REPLICAS: &str = "gpu_replicas";
/// Attribute: how many physical GPUs stay whole (scalar).
pub const ATTR_WHOLE: &str = "gpu_whole";

/// Why the sharing flags cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum OfferError {
    /// The spec does not fit the node.
    #[error(transparent)]
    Sharing(#[from] SharingError),
    /// The flags have no GPU list to share: GPUs are not isolated by the module with NVML.
    #[error(
        "GPU sharing needs mesos-gpu's module isolator ({MODULE_ISOLATOR}) and NVML (the agent \
         advertises {gpus} gpus unchecked, so no GPU can be shared)"
    )]
    NotIsolated {
        /// The `gpus` passed through.
        gpus: f64,
    },
    /// The flags are Mesos's `gpu/nvidia`'s, which shares no GPU.
    #[error(
        "Mesos's {GPU_ISOLATOR} cannot share a GPU between tasks: its agent refuses more `gpus` \
         than {DEVICES_FLAG} lists GPUs; use mesos-gpu's module ({MODULE_ISOLATOR}) in place of \
         {GPU_ISOLATOR} to share GPUs"
    )]
    BuiltinIsolator,
    /// `--attributes` already sets a sharing attribute.
    #[error(transparent)]
    Attributes(#[from] AttributesError),
    /// The resolved `--resources` does not parse again (a bug).
    #[error(transparent)]
    Resources(#[from] ResourcesError),
}

/// Rewrites `resolved` (the node's flags by Mesos's rules) so that it advertises the split
/// `spec` asks for; returns the flags and the plan.
pub fn advertise(
    resolved: &AgentGpus,
    inventory: &Inventory,
    spec: &SharingSpec,
) -> Result<(AgentGpus, SharingPlan), OfferError> {
    refuse_builtin(resolved)?;
    let Some(devices) = &resolved.devices else {
        return Err(OfferError::NotIsolated {
            gpus: resolved.gpus,
        });
    };
    let plan = spec.resolve(inventory, devices)?;
    let units = plan.units();
    let mut out = resolved.clone();
    out.gpus = f64::from(units);
    out.resources = Resources::parse(&resolved.resources)?.render_with_gpus(Some(units));
    out.attributes = merge_attributes(Some(&resolved.attributes), &attributes(&plan))?;
    tracing::info!(
        modes = ?plan.modes(),
        shared = plan.shared.len(),
        whole = plan.whole.len(),
        units,
        "advertising shared GPUs as replicas"
    );
    Ok((out, plan))
}

/// [`advertise`] on a node with GPUs in MIG mode (`resolved` by
/// [`crate::agent_flags::AgentGpuFlags::resolve_mig`]): the offer of `strategy` with every
/// shared GPU and MIG device counted R times, in the resource it is offered in (single: `gpus`;
/// mixed: `gpus`, or its `mig-<profile>` scalar).
pub fn advertise_mig(
    resolved: &AgentGpus,
    inventory: &Inventory,
    spec: &SharingSpec,
    strategy: MigStrategy,
) -> Result<(AgentGpus, SharingPlan), OfferError> {
    refuse_builtin(resolved)?;
    let whole: Vec<u32> = inventory
        .whole_gpus()
        .filter(|g| g.healthy)
        .map(|g| g.index)
        .collect();
    let plan = spec.resolve(inventory, &whole)?;
    let offer = MigOffer::of_units(inventory, strategy, |uuid| {
        plan.shared_gpu(uuid).map_or(1, |g| g.replicas)
    });
    let mut scalars = Vec::new();
    if offer.gpus > 0 {
        scalars.push((GPUS.to_owned(), offer.gpus));
    }
    scalars.extend(offer.profiles.iter().map(|p| (p.resource.clone(), p.count)));
    let mut out = resolved.clone();
    out.gpus = f64::from(offer.gpus);
    out.resources = Resources::parse(&resolved.resources)?.render_with_scalars(&scalars);
    out.attributes = merge_attributes(Some(&resolved.attributes), &attributes(&plan))?;
    tracing::info!(
        modes = ?plan.modes(),
        shared = plan.shared.len(),
        whole = plan.whole.len(),
        resources = %out.resources,
        "advertising shared GPUs and MIG devices as replicas"
    );
    Ok((out, plan))
}

/// Refuses the flags of Mesos's `gpu/nvidia`, which cannot share a GPU.
fn refuse_builtin(resolved: &AgentGpus) -> Result<(), OfferError> {
    match resolved.isolator {
        GpuIsolator::Builtin => Err(OfferError::BuiltinIsolator),
        GpuIsolator::Module | GpuIsolator::None => Ok(()),
    }
}

fn attributes(plan: &SharingPlan) -> Vec<Attribute> {
    let mut replicas: Vec<u32> = plan.shared.iter().map(|g| g.replicas).collect();
    replicas.sort_unstable_by(|a, b| b.cmp(a));
    replicas.dedup();
    let attr = |name: &str, value: String| Attribute {
        name: name.to_owned(),
        value,
    };
    let modes = plan.modes();
    let names: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
    let mut out = vec![
        attr(
            ATTR_SHARING,
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join("+")
            },
        ),
        attr(ATTR_SHARED, plan.shared.len().to_string()),
    ];
    if modes.len() > 1 {
        for mode in &modes {
            let n = plan.shared.iter().filter(|g| g.mode == *mode).count();
            out.push(attr(
                &format!("{ATTR_SHARED_PREFIX}{}", mode.as_str().replace('-', "_")),
                n.to_string(),
            ));
        }
    }
    out.push(attr(ATTR_WHOLE, plan.whole.len().to_string()));
    if !replicas.is_empty() {
        let text: Vec<String> = replicas.iter().map(u32::to_string).collect();
        out.push(attr(ATTR_REPLICAS, text.join("+")));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::agent_flags::{AgentGpuFlags, DEVICES_FLAG};
    use mesos_gpu_node::inventory::DriverInfo;
    use mesos_gpu_node::nodes::dgx1_v100;
    use mesos_gpu_placement::sharing::plan::{ModeSpec, SharingMode};

    const MODULE: &str = "cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator";

    /// Issue 34: Mesos's `gpu/nvidia` would be given `gpus:26` beside 8 devices, which its agent
    /// refuses; the refusal names the module as the way to share.
    #[test]
    fn issue_34_mesos_gpu_nvidia_cannot_share() {
        let inv = node();
        let spec = SharingSpec::parse("4", ModeSpec::default()).unwrap();
        let builtin = flags("cgroups/devices,gpu/nvidia", "cpus:8", None);
        let err = advertise(&builtin, &inv, &spec).unwrap_err();
        assert!(matches!(err, OfferError::BuiltinIsolator), "{err}");
        assert_eq!(
            err.to_string(),
            "Mesos's gpu/nvidia cannot share a GPU between tasks: its agent refuses more `gpus` \
             than --nvidia_gpu_devices lists GPUs; use mesos-gpu's module \
             (org_apache_mesos_gpu_MesosGpuIsolator) in place of gpu/nvidia to share GPUs"
        );
        let err = advertise_mig(&builtin, &inv, &spec, MigStrategy::Single).unwrap_err();
        assert!(matches!(err, OfferError::BuiltinIsolator), "{err}");
    }

    fn node() -> Inventory {
        let mut inv = dgx1_v100().inventory();
        inv.driver = Some(DriverInfo {
            version: "550.54.14".into(),
            cuda_version: Some((12, 4)),
        });
        inv
    }

    fn flags(isolation: &str, resources: &str, attributes: Option<&str>) -> AgentGpus {
        AgentGpuFlags::parse(isolation, Some(resources), None, attributes, DEVICES_FLAG)
            .unwrap()
            .resolve(&node())
            .unwrap()
    }

    #[test]
    fn r4_node_advertises_shared_times_r_plus_whole() {
        let inv = node();
        let resolved = flags(MODULE, "cpus:8", Some("rack:r1"));
        let spec = SharingSpec::parse("4,6=1,7=1", ModeSpec::uniform(SharingMode::Mps)).unwrap();
        let (out, plan) = advertise(&resolved, &inv, &spec).unwrap();
        assert_eq!(out.gpus, 26.0);
        assert_eq!(out.resources, "cpus:8;gpus:26");
        assert_eq!(out.devices, resolved.devices, "physical GPUs stay listed");
        assert!(
            out.attributes
                .starts_with("rack:r1;gpu_model:Tesla-V100-SXM2-16GB;"),
            "{}",
            out.attributes
        );
        assert!(
            out.attributes
                .ends_with(";gpu_sharing:mps;gpu_shared:6;gpu_whole:2;gpu_replicas:4"),
            "{}",
            out.attributes
        );
        assert_eq!(plan.whole, vec![6, 7]);
        let flags = out.flags();
        assert_eq!(flags[0], "--resources=cpus:8;gpus:26");
    }

    #[test]
    fn modes_per_gpu_are_advertised_with_their_counts() {
        let inv = node();
        let resolved = flags(MODULE, "cpus:8", None);
        let modes: ModeSpec = "mps,4-5=time-slicing,6-7=none".parse().unwrap();
        let (out, _) =
            advertise(&resolved, &inv, &SharingSpec::parse("4", modes).unwrap()).unwrap();
        assert_eq!(out.gpus, 6.0 * 4.0 + 2.0);
        assert!(
            out.attributes.ends_with(
                ";gpu_sharing:time-slicing+mps;gpu_shared:6;gpu_shared_time_slicing:2;gpu_shared_mps:4;gpu_whole:2;gpu_replicas:4"
            ),
            "{}",
            out.attributes
        );
    }

    #[test]
    fn sharing_needs_the_module_and_owns_its_attributes() {
        let inv = node();
        let spec = SharingSpec::parse("4", ModeSpec::uniform(SharingMode::TimeSlicing)).unwrap();
        let passthrough = flags("cgroups/devices", "gpus:2", None);
        let err = advertise(&passthrough, &inv, &spec).unwrap_err();
        assert!(matches!(err, OfferError::NotIsolated { .. }), "{err}");
        let taken = flags(MODULE, "cpus:1", Some("gpu_sharing:yes"));
        let err = advertise(&taken, &inv, &spec).unwrap_err();
        assert!(err.to_string().contains("gpu_sharing"), "{err}");
    }

    #[test]
    fn shared_mig_devices_are_offered_r_times_in_the_strategys_resource() {
        let mut inv = mesos_gpu_node::nodes::dgx1_with_mig_gpus();
        inv.driver = node().driver;
        let modes = "mps,0-3=none,6-7=none".parse().unwrap();
        let spec = SharingSpec::parse("4,5=2", modes).unwrap();
        let isolation = format!("cgroups/devices,{}", crate::agent_flags::MODULE_ISOLATOR);
        let flags =
            AgentGpuFlags::parse(&isolation, Some("cpus:8"), None, None, DEVICES_FLAG).unwrap();
        let single = flags.resolve_mig(&inv, MigStrategy::Single).unwrap();
        let (out, plan) = advertise_mig(&single, &inv, &spec, MigStrategy::Single).unwrap();
        // 6 whole GPUs (0-3, 6-7), GPU 4's 3 MIG devices 4 ways, GPU 5's 2 ways.
        assert_eq!(out.gpus, f64::from(6 + 3 * 4 + 3 * 2));
        assert_eq!(out.resources, "cpus:8;gpus:24");
        assert_eq!(plan.shared.len(), 6);
        assert!(
            out.attributes
                .ends_with(";gpu_sharing:mps;gpu_shared:6;gpu_whole:6;gpu_replicas:4+2"),
            "{}",
            out.attributes
        );
        let mixed = flags.resolve_mig(&inv, MigStrategy::Mixed).unwrap();
        let (out, _) = advertise_mig(&mixed, &inv, &spec, MigStrategy::Mixed).unwrap();
        assert_eq!(
            out.resources, "cpus:8;gpus:6;mig-1g.5gb:12;mig-3g.20gb:6",
            "1g: 2 devices x 4 + 2 x 2; 3g: 4 + 2"
        );
        assert!(
            out.attributes
                .contains("mig_strategy:mixed;mig-1g.5gb:19;mig-3g.20gb:9;"),
            "{}",
            out.attributes
        );
    }
}
