//! The host checks: each reads the host (or the simulated node) and turns what it found into a
//! [`Check`]; the facts and comparisons live in the libraries (`devices::expected_nodes`,
//! `VolumePlan::missing_essentials`, `cdi::store::scan_dirs`).

use std::path::{Path, PathBuf};

use mesos_gpu_docker::cdi::store::scan_dirs;
use mesos_gpu_enforce::cgroup::{CgroupLayout, CgroupVersion, DeviceCgroup, Hierarchy};
use mesos_gpu_isolator::lifecycle::{CgroupChoice, ContainerId, IsolatorConfig};
use mesos_gpu_node::devices::{NodeFinding, NodeState, check_nodes, expected_nodes};
use mesos_gpu_node::inventory::{DriverInfo, Inventory};
use mesos_gpu_os::{ErrorChain, MountTable};
use mesos_gpu_volume::plan::{DriverSource, ESSENTIALS, VolumePlan};
use mesos_gpu_volume::{Check as VolumeCheck, DriverVersion, LdCache, VolumeManager, mountinfo};

use super::config::{ISOLATOR_MODULE, Sources};
use super::report::{Check, Status};

fn check(name: &'static str, status: Status, summary: impl Into<String>) -> Check {
    Check {
        name,
        status,
        summary: summary.into(),
        details: Vec::new(),
        fix: None,
    }
}

/// The NVML library this process loaded, as `/proc/self/maps` names it.
pub(crate) fn loaded_nvml(proc_self_maps: &str) -> Option<&str> {
    proc_self_maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libnvidia-ml.so"))
        })
}

/// `driver`: NVML loads, which library (`loaded`, as this process's maps name it, else `lib` as
/// given), the driver and CUDA versions, the GPUs.
pub(crate) fn driver(inventory: &Inventory, loaded: Option<&str>, lib: Option<&Path>) -> Check {
    let Some(info) = &inventory.driver else {
        let mut c = check(
            "driver",
            Status::Fail,
            format!(
                "no NVIDIA driver: {}",
                inventory
                    .absent_reason
                    .as_deref()
                    .unwrap_or("NVML reports none")
            ),
        );
        c.fix = Some("install the NVIDIA driver and load its kernel module (nvidia-smi must work), or name the library with --nvml-lib".into());
        return c;
    };
    let library = loaded
        .map(str::to_owned)
        .or_else(|| lib.map(|l| l.display().to_string()))
        .unwrap_or_else(|| "libnvidia-ml.so.1".to_owned());
    let cuda = info.cuda_version.map_or_else(
        || "CUDA unknown".to_owned(),
        |(a, b)| format!("CUDA {a}.{b}"),
    );
    let mig = inventory.mig.enabled.len();
    let mut c = check(
        "driver",
        if inventory.gpus.is_empty() {
            Status::Fail
        } else {
            Status::Ok
        },
        format!(
            "NVIDIA driver {} ({cuda}), NVML from {library}: {} GPU(s){}",
            info.version,
            inventory.gpus.len(),
            if mig > 0 {
                format!(
                    ", {mig} in MIG mode with {} MIG device(s)",
                    inventory.mig.devices.len()
                )
            } else {
                String::new()
            }
        ),
    );
    c.details = inventory
        .gpus
        .iter()
        .map(|g| format!("GPU {}: {} ({}) minor {}", g.index, g.name, g.uuid, g.minor))
        .collect();
    if inventory.gpus.is_empty() {
        c.fix = Some(format!(
            "the driver sees no GPU ({}): check lspci and dmesg",
            inventory
                .absent_reason
                .as_deref()
                .unwrap_or("none reported")
        ));
    }
    c
}

/// `device-nodes`: every node the driver should have made, with the right numbers.
pub(crate) fn device_nodes(inventory: &Inventory, dev_root: &Path, proc_root: &Path) -> Check {
    let proc_devices_path = proc_root.join("devices");
    let proc_devices = std::fs::read_to_string(&proc_devices_path).unwrap_or_default();
    let findings = check_nodes(dev_root, &expected_nodes(inventory, &proc_devices));
    let bad: Vec<&NodeFinding> = findings.iter().filter(|f| !f.is_ok()).collect();
    let mut c = check(
        "device-nodes",
        if bad.is_empty() {
            Status::Ok
        } else {
            Status::Fail
        },
        if bad.is_empty() {
            format!(
                "{} nodes under {} as the driver numbers them",
                findings.len(),
                dev_root.display()
            )
        } else {
            format!(
                "{} of {} nodes under {} are not as the driver numbers them",
                bad.len(),
                findings.len(),
                dev_root.display()
            )
        },
    );
    c.details = findings
        .iter()
        .map(|f| {
            let path = f.path.display();
            let want = f.node.dev.map_or_else(|| "?".to_owned(), |d| d.to_string());
            let what = &f.node.what;
            match &f.state {
                NodeState::Present => format!("{path} {want} ({what})"),
                NodeState::Missing if !f.node.required => {
                    format!("{path} absent (optional: {what})")
                }
                NodeState::Missing => format!("{path} is missing; expected {want} ({what})"),
                NodeState::WrongNumber { found } => {
                    format!("{path} is {found}, expected {want} ({what})")
                }
                NodeState::NotCharDevice => format!("{path} is not a character device ({what})"),
                NodeState::NotRegistered => format!(
                    "{} lists no major for {} ({what}): its kernel module is not loaded",
                    proc_devices_path.display(),
                    f.node.name.display()
                ),
                NodeState::Unreadable { error } => format!("{path}: {error}"),
            }
        })
        .collect();
    if !bad.is_empty() {
        c.fix = Some(
            "let the driver make its nodes: `nvidia-modprobe -u -c 0` (nvidia-uvm and its nodes), \
             `nvidia-modprobe -c <minor>` per GPU, or enable nvidia-persistenced; remove a node \
             with a wrong number first (and whatever made it); MIG capability nodes: \
             `nvidia-modprobe -f /proc/driver/nvidia/capabilities/...`"
                .into(),
        );
    }
    c
}

/// `cgroups`: the hierarchy Mesos uses (or `choice`), what it means for `--isolation`, and a
/// scratch container cgroup made with the module's device control and removed again.
pub(crate) fn cgroups(choice: CgroupChoice) -> Check {
    let mut config = IsolatorConfig::new("/");
    config.cgroup_version = choice;
    let hierarchy = match config.hierarchy() {
        Ok(h) => h,
        Err(e) => {
            let mut c = check(
                "cgroups",
                Status::Fail,
                format!("no device-control cgroup hierarchy: {}", ErrorChain(&e)),
            );
            c.fix =
                Some("mount the cgroup v1 devices hierarchy or cgroup2 at /sys/fs/cgroup".into());
            return c;
        }
    };
    let tried = try_device_cgroup(&hierarchy, &config);
    cgroup_verdict(&hierarchy, tried)
}

/// Makes and removes a scratch cgroup `mesos-gpu-doctor-<pid>` directly under the hierarchy's
/// mount, with the module's device control: the v1 `devices` files, or the v2 eBPF program.
fn try_device_cgroup(hierarchy: &Hierarchy, config: &IsolatorConfig) -> Result<(), String> {
    let chain = |e: &dyn std::error::Error| ErrorChain(e).to_string();
    let layout = CgroupLayout::new(hierarchy.clone(), "").map_err(|e| chain(&e))?;
    let id = ContainerId::new(format!("mesos-gpu-doctor-{}", std::process::id()))
        .map_err(|e| chain(&e))?;
    let cgroup =
        DeviceCgroup::create(&layout, &id, &config.allowed_devices).map_err(|e| chain(&e))?;
    cgroup.destroy().map_err(|e| chain(&e))
}

/// What a hierarchy and the scratch cgroup's outcome mean for the agent.
pub(crate) fn cgroup_verdict(hierarchy: &Hierarchy, tried: Result<(), String>) -> Check {
    let mount = hierarchy.mount.display();
    match (hierarchy.version, tried) {
        (CgroupVersion::V1, Ok(())) => {
            let mut c = check(
                "cgroups",
                Status::Ok,
                format!(
                    "cgroup v1, devices hierarchy at {mount} (a scratch cgroup was made and removed)"
                ),
            );
            c.details.push(format!("agent: --isolation=filesystem/linux,cgroups/devices,{ISOLATOR_MODULE} (the module adds the GPUs to the devices cgroup Mesos makes)"));
            c
        }
        (CgroupVersion::V2, Ok(())) => {
            let mut c = check(
                "cgroups",
                Status::Ok,
                format!(
                    "cgroup v2 at {mount}, device programs attach (tried on a scratch cgroup, removed)"
                ),
            );
            c.details.push(format!("agent: --isolation=filesystem/linux,{ISOLATOR_MODULE}, without cgroups/devices (its program would deny the GPUs); Mesos's libraries via LD_LIBRARY_PATH for Mesos's processes only"));
            c
        }
        (version, Err(e)) => {
            let what = match version {
                CgroupVersion::V1 => format!(
                    "cgroup v1 devices hierarchy at {mount}, but a device cgroup cannot be made there"
                ),
                CgroupVersion::V2 => format!(
                    "cgroup v2 at {mount}, but a device program cannot be attached (BPF refused)"
                ),
            };
            let mut c = check("cgroups", Status::Fail, what);
            c.details.push(e);
            c.fix = Some(match version {
                CgroupVersion::V1 => "run the agent as root with the devices hierarchy writable (not inside a container that mounts it read-only)".into(),
                CgroupVersion::V2 => "the agent needs CAP_SYS_ADMIN or CAP_BPF (run it as root, not in a container without them) and a kernel with CONFIG_CGROUP_BPF; without that the GPUs cannot be isolated on cgroup v2".into(),
            });
            c
        }
    }
}

/// `driver-volume`: the plan of the driver's volume holds `libcuda`, `libnvidia-ml` and
/// `nvidia-smi` of this driver (ELF, version checked by the planner), the volume root is not on a
/// `noexec` mount, and an existing volume is intact. `me` is how to run this program as doctor
/// was run (`mesos-gpu --simulate dgx1-v100` on a simulated node), for the fixes it prints.
pub(crate) fn driver_volume(
    inventory: &Inventory,
    source: &DriverSource,
    volume_root: &Path,
    me: &str,
) -> (Check, Option<VolumePlan>) {
    let Some(info) = &inventory.driver else {
        return (
            check("driver-volume", Status::Fail, "no driver, so no volume"),
            None,
        );
    };
    let plan = match plan_volume(info, source) {
        Ok(plan) => plan,
        Err(c) => return (c, None),
    };
    let mut c = check(
        "driver-volume",
        Status::Ok,
        format!(
            "driver {}: {} files ({} programs) planned from {}",
            plan.driver_version,
            plan.files.len(),
            plan.files.iter().filter(|f| f.origin.is_some()).count(),
            source.root.display()
        ),
    );
    for f in &plan.files {
        if let Some(origin) = f.origin {
            c.details.push(format!(
                "bin/{} from {} ({origin})",
                f.name,
                f.found_as.display()
            ));
        }
    }
    if lacks_essentials(&mut c, &plan, me) || on_noexec_mount(&mut c, volume_root) {
        return (c, Some(plan));
    }
    check_built_volume(&mut c, volume_root, &plan, me);
    (c, Some(plan))
}

/// The plan of the volume of driver `info` from `source`, or the failed check saying why not.
fn plan_volume(info: &DriverInfo, source: &DriverSource) -> Result<VolumePlan, Check> {
    let planned = (|| -> anyhow::Result<VolumePlan> {
        let version: DriverVersion = info.version.parse()?;
        let cache = LdCache::load(&source.root)?;
        Ok(mesos_gpu_volume::plan::plan_from(source, &cache, &version)?)
    })();
    planned.map_err(|e| {
        let mut c = check(
            "driver-volume",
            Status::Fail,
            format!(
                "cannot plan the volume of driver {} from {}: {e:#}",
                info.version,
                source.root.display()
            ),
        );
        c.fix = Some(
            "run ldconfig after installing the driver (the volume is found through ld.so.cache)"
                .into(),
        );
        c
    })
}

/// Fails `c` when the plan lacks an essential file, naming the candidates skipped and why;
/// true when it did.
fn lacks_essentials(c: &mut Check, plan: &VolumePlan, me: &str) -> bool {
    let missing = plan.missing_essentials();
    if missing.is_empty() {
        return false;
    }
    c.status = Status::Fail;
    c.summary = format!(
        "the volume of driver {} would lack {}",
        plan.driver_version,
        missing.join(", ")
    );
    let families: Vec<&str> = ESSENTIALS
        .iter()
        .map(|(_, name)| *name)
        .filter(|name| missing.iter().any(|m| m.contains(name)))
        .collect();
    for s in plan
        .skipped
        .iter()
        .filter(|s| families.iter().any(|f| s.name.starts_with(f)))
    {
        let path = s
            .path
            .as_deref()
            .map_or_else(|| "-".to_owned(), |p| p.display().to_string());
        c.details.push(format!("{} {path}: {}", s.name, s.reason));
    }
    c.fix = Some(format!(
        "install the driver's files for version {} (`{me} volume plan` lists every candidate and why it was skipped); programs are searched along PATH, then in the driver's bin next to libnvidia-ml",
        plan.driver_version
    ));
    true
}

/// Fails `c` when `volume_root` is on a `noexec` mount (true then); a mount table that cannot
/// be read is a detail.
fn on_noexec_mount(c: &mut Check, volume_root: &Path) -> bool {
    match MountTable::read(Path::new("/proc/self/mountinfo")) {
        Ok(table) if mountinfo::exec_blocked(&table, volume_root) => {
            c.status = Status::Fail;
            c.summary = format!(
                "the volume root {} is on a noexec mount: containers could not run its nvidia-smi",
                volume_root.display()
            );
            c.fix = Some(format!(
                "mount a tmpfs (mode=755,nosuid,nodev) on {} first, as Mesos does, or choose another volume root",
                volume_root.display()
            ));
            true
        }
        Ok(_) => false,
        Err(e) => {
            c.details.push(format!(
                "cannot tell whether {} is on a noexec mount: {}",
                volume_root.display(),
                ErrorChain(&e)
            ));
            false
        }
    }
}

/// Warns in `c` when the planned volume is not built under `volume_root` yet, or is damaged.
fn check_built_volume(c: &mut Check, volume_root: &Path, plan: &VolumePlan, me: &str) {
    let create = format!("{me} volume create --volume-root {}", volume_root.display());
    let manager = VolumeManager::at(volume_root);
    let path = manager.volume_path(&plan.driver_version);
    if !path.is_dir() {
        c.status = Status::Warn;
        c.details
            .push(format!("{} is not built yet", path.display()));
        c.fix = Some(format!(
            "run `{create}` (or give the module driver_volume=build); until then images asking for /usr/local/nvidia get no volume"
        ));
        return;
    }
    match manager.verify(&plan.driver_version, Some(plan), VolumeCheck::Metadata) {
        Ok(report) if report.is_intact() => c.details.push(format!("{} is intact", path.display())),
        Ok(report) => {
            c.status = Status::Warn;
            c.details.extend(
                report
                    .problems
                    .iter()
                    .map(|p| format!("{}: {p}", path.display())),
            );
            c.fix = Some(format!("run `{create}` to rebuild it"));
        }
        Err(e) => {
            c.status = Status::Warn;
            c.details.push(format!(
                "cannot verify {}: {}",
                path.display(),
                ErrorChain(&e)
            ));
        }
    }
}

/// `sharing`: GPU sharing and MIG settings that can work together: the module's and the hook's
/// the same (see `directories`), no sharing on a node with MIG devices, and the MPS control
/// program present when `mps` is asked for.
pub(crate) fn sharing(inventory: &Inventory, sources: &Sources, driver: &DriverSource) -> Check {
    let replicas = sources.agent_setting("gpu_replicas");
    let mode = sources
        .agent_setting("gpu_sharing")
        .unwrap_or("time-slicing");
    let strategy = sources.agent_setting("mig_strategy");
    let mut c = check("sharing", Status::Ok, "whole GPUs (no gpu_replicas)");
    let mig_devices = inventory.mig.devices.len();
    if let Some(strategy) = strategy {
        c.details.push(format!("MIG strategy {strategy}"));
    } else if mig_devices > 0 {
        c.details.push(format!(
            "{mig_devices} MIG devices offered with the single strategy (the default)"
        ));
    }
    let Some(replicas) = replicas else {
        return c;
    };
    c.summary = format!("gpu_replicas={replicas}, {mode}");
    if mig_devices > 0 {
        c.status = Status::Fail;
        c.summary = format!(
            "gpu_replicas={replicas} on a node with {mig_devices} MIG devices: the module refuses it"
        );
        c.fix = Some("give MIG devices whole (drop gpu_replicas) or turn MIG mode off".into());
        return c;
    }
    if mode == "mps" {
        let program = sources
            .agent_setting("mps_control")
            .unwrap_or(mesos_gpu_enforce::mps::PROGRAM);
        match find_program(program, driver) {
            Some(found) => c
                .details
                .push(format!("MPS control program: {}", found.display())),
            None => {
                c.status = Status::Fail;
                c.summary =
                    format!("gpu_sharing=mps but the MPS control program {program} is not found");
                c.details.push(format!(
                    "looked along PATH and in the driver's bin under {}",
                    driver.root.display()
                ));
                c.fix = Some("install the driver's nvidia-cuda-mps-control, or name it with the module's mps_control parameter".into());
            }
        }
    }
    c
}

/// `program` as the module runs it: a path as given, a bare name along PATH; on a simulated
/// node also in the driver tree's bins.
fn find_program(program: &str, driver: &DriverSource) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return runnable(Path::new(program)).then(|| PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            driver
                .search_path
                .iter()
                .map(|d| driver.root.join(d.strip_prefix("/").unwrap_or(d))),
        )
        .chain([driver.root.join("usr/local/nvidia/bin")])
        .map(|d| d.join(program))
        .find(|p| runnable(p))
}

/// `cdi`: no device declared twice in one CDI directory (runtimes drop it from both).
pub(crate) fn cdi(spec_dirs: &[PathBuf]) -> Check {
    let report = match scan_dirs(spec_dirs) {
        Ok(r) => r,
        Err(e) => {
            return check(
                "cdi",
                Status::Warn,
                format!("cannot read the CDI directories: {}", ErrorChain(&e)),
            );
        }
    };
    let dirs = spec_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut c = check(
        "cdi",
        Status::Ok,
        format!(
            "{} spec file(s) in {dirs}, no conflicting device",
            report.files.len()
        ),
    );
    for s in &report.shadowed {
        c.details.push(format!(
            "{} is declared by {} and by {}; runtimes use {}",
            s.device,
            s.ignored.display(),
            s.used.display(),
            s.used.display()
        ));
    }
    for (path, why) in &report.unreadable {
        c.status = Status::Warn;
        c.details.push(format!(
            "{}: unreadable, runtimes skip it: {why}",
            path.display()
        ));
    }
    if !report.conflicts.is_empty() {
        c.status = Status::Fail;
        c.summary = format!(
            "{} device(s) declared twice in one CDI directory: runtimes drop them",
            report.conflicts.len()
        );
        for conflict in &report.conflicts {
            let files: Vec<String> = conflict
                .files
                .iter()
                .map(|f| f.display().to_string())
                .collect();
            c.details
                .push(format!("{} in {}", conflict.device, files.join(" and ")));
        }
        c.fix = Some("keep one generator per directory: remove the other spec (often NVIDIA's nvidia.yaml from nvidia-ctk) or run `mesos-gpu serve --no-cdi`".into());
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loaded_nvml_is_read_from_the_maps() {
        let maps = "7f00-7f01 r-xp 00000000 fd:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f02-7f03 r-xp 00000000 fd:01 43 /usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04\n";
        assert_eq!(
            loaded_nvml(maps),
            Some("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04")
        );
        assert_eq!(loaded_nvml("7f00-7f01 rw-p 00000000 00:00 0\n"), None);
    }

    #[test]
    fn a_refused_attach_on_v2_fails_saying_what_the_agent_needs() {
        let v2 = Hierarchy {
            version: CgroupVersion::V2,
            mount: PathBuf::from("/sys/fs/cgroup"),
        };
        let refused = "BPF_PROG_LOAD for cgroup /sys/fs/cgroup/mesos-gpu-doctor-1 failed: \
                       Operation not permitted (os error 1)";
        let c = cgroup_verdict(&v2, Err(refused.to_owned()));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.fix.as_deref().is_some_and(|f| f.contains("CAP_BPF")),
            "{c:#?}"
        );
        let ok = cgroup_verdict(&v2, Ok(()));
        assert_eq!(ok.status, Status::Ok);
        assert!(ok.details[0].contains("without cgroups/devices"), "{ok:#?}");
    }
}
