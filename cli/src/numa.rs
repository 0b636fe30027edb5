//! NUMA pinning for the commands that start containers (`exec`, `run`, `docker-args`): the
//! GPUs' local CPUs and memory nodes from the driver (or the simulated node), and the machine's
//! online CPUs and memory nodes a Docker container (in no cgroup of ours) is pinned within. The
//! decision is the isolator's (`Isolator::prepare`, `DockerGuard::pin`).

use std::path::Path;

use anyhow::Context as _;
use mesos_gpu_isolator::lifecycle::PinOutcome;
use mesos_gpu_node::numa::Affinities;
use mesos_gpu_placement::numa::Allowed;

use crate::ctx::Ctx;

/// Where sysfs is.
const SYS: &str = "/sys";

/// The `--cpus` value: a positive number of CPUs.
pub(crate) fn parse_cpus(value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|c| c.is_finite() && *c > 0.0)
        .ok_or_else(|| {
            format!(
                "{value:?} is not a number of CPUs: expected a number above 0 such as 0.5, 1 or 4"
            )
        })
}

/// Every GPU's local CPUs and memory nodes, as NVML reports them; empty without a driver.
pub(crate) fn affinities(ctx: &Ctx) -> anyhow::Result<Affinities> {
    Ok(ctx.driver()?.map(|d| d.affinities()).unwrap_or_default())
}

/// The machine's online CPUs and memory nodes: what a Docker container may be pinned within
/// (it is in no cgroup of ours; `DockerGuard::pin` decides).
pub(crate) fn online() -> anyhow::Result<Allowed> {
    mesos_gpu_node::numa::online(Path::new(SYS)).context("cannot read the online CPUs")
}

/// What NUMA pinning would give a task on this node, GPUs with the same local sets grouped:
/// `NUMA pinning (numa_pinning=on): GPU 0-3 → CPUs 0-19,40-59, memory nodes 0; …`; `None`
/// when NVML reports no affinity.
pub(crate) fn summary(affinities: &Affinities, gpus: &[u32]) -> Option<String> {
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    for &index in gpus {
        let Some(a) = affinities.get(index) else {
            continue;
        };
        let local = format!(
            "CPUs {}, memory nodes {}",
            a.cpus,
            a.mems
                .as_ref()
                .map_or_else(|| "unknown".to_owned(), ToString::to_string)
        );
        match groups.iter_mut().find(|(l, _)| *l == local) {
            Some((_, members)) => members.push(index),
            None => groups.push((local, vec![index])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let parts: Vec<String> = groups
        .into_iter()
        .map(|(local, members)| {
            format!(
                "GPU {} → {local}",
                mesos_gpu_node::numa::CpuList::from_ids(members)
            )
        })
        .collect();
    Some(format!(
        "NUMA pinning (module parameter numa_pinning=on, --numa-pinning) narrows a task to its GPUs' local CPUs and memory nodes, the union for several GPUs, never fewer CPUs than it asks for: {}",
        parts.join("; ")
    ))
}

/// One line describing `outcome` for the user.
pub(crate) fn describe(outcome: &PinOutcome) -> String {
    match outcome {
        PinOutcome::Off => "off".to_owned(),
        PinOutcome::Pinned(p) => format!(
            "CPUs {}, memory nodes {}",
            p.cpus,
            p.mems
                .as_ref()
                .map_or_else(|| "unchanged".to_owned(), ToString::to_string)
        ),
        PinOutcome::Skipped(reason) => format!("not pinned: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_groups_gpus_with_the_same_local_sets() {
        let mut a = Affinities::new();
        for (index, cpus, mems) in [(0, "0-3", "0"), (1, "0-3", "0"), (2, "4-7", "1")] {
            a.insert(
                index,
                mesos_gpu_node::numa::GpuAffinity {
                    cpus: cpus.parse().expect("list"),
                    mems: Some(mems.parse().expect("list")),
                },
            );
        }
        let text = summary(&a, &[0, 1, 2, 3]).expect("summary");
        assert!(
            text.ends_with("GPU 0-1 → CPUs 0-3, memory nodes 0; GPU 2 → CPUs 4-7, memory nodes 1"),
            "{text}"
        );
        assert_eq!(summary(&Affinities::new(), &[0]), None);
    }

    #[test]
    fn cpus_must_be_positive_numbers() {
        assert_eq!(parse_cpus("1.5"), Ok(1.5));
        for bad in ["0", "-1", "x", "NaN", "inf"] {
            let err = parse_cpus(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }
}
