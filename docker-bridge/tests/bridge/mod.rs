//! The shared GPU pool through the bridge, against the real daemon: concurrent launches, a
//! Mesos (cgroups v1) and a Docker container on one isolator, and recovery after a restart.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use mesos_gpu_docker::bridge::{BridgedContainer, DockerBridge};
use mesos_gpu_docker::client::docker_name;
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::Isolator,
    lifecycle::IsolatorConfig, lifecycle::PrepareConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_os::error_chain;

use super::*;

/// Held by every trial that runs `mesos-<id>` containers or scans the daemon for them.
pub(crate) static DAEMON_SCAN: Mutex<()> = Mutex::new(());

fn fail(e: impl std::error::Error) -> Failed {
    error_chain(&e).into()
}

/// A fresh UUID-shaped Mesos ContainerID, unique per process and call.
fn uuid() -> ContainerId {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let id = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        std::process::id(),
        n & 0xffff,
        nanos & 0xfff,
        (nanos >> 12) & 0xfff,
        u64::from(n) << 8 | 0x5a
    );
    ContainerId::new(id).expect("uuid is a valid id")
}

/// Removes `<v1 root>/devices/<cgroups root>` (and what is under it) when dropped.
struct CgroupParent(PathBuf);

impl Drop for CgroupParent {
    fn drop(&mut self) {
        if let Ok(dir) = std::fs::read_dir(&self.0) {
            for entry in dir.flatten() {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// An isolator over the fixture's GPUs with its checkpoint in `work`, recovered.
fn pool(fx: &Fixture, work: &Path, cgroups_root: &str) -> Result<Arc<Isolator>, Failed> {
    let mut config = IsolatorConfig::new(work);
    config.cgroup_version = CgroupChoice::V1;
    config.cgroups_root = cgroups_root.to_owned();
    let nodes = DeviceNodes::scan(&fx.host.dev_root, &fx.inventory).map_err(fail)?;
    let isolator = Isolator::new(config, fx.inventory.clone(), nodes).map_err(fail)?;
    isolator.recover(&[], &[]).map_err(fail)?;
    Ok(Arc::new(isolator))
}

async fn bridge(fx: &Fixture, isolator: &Arc<Isolator>) -> Result<DockerBridge, Failed> {
    let client = DockerClient::connect(Path::new(SOCKET))
        .await
        .map_err(fail)?;
    Ok(DockerBridge::new(
        Arc::clone(isolator),
        client,
        Some(fx.driver((12, 4))),
        fx.inventory.gpus.clone(),
    ))
}

fn minors(c: &BridgedContainer) -> BTreeSet<u32> {
    c.gpus.iter().map(|g| g.minor).collect()
}

/// The `nvidia<minor>` GPU nodes listed by `ls /dev` in a container's output.
fn listed_minors(out: &str) -> BTreeSet<u32> {
    out.split_whitespace()
        .filter_map(|w| w.strip_prefix("nvidia")?.parse().ok())
        .collect()
}

fn every_gpu_free(isolator: &Isolator) -> TestResult {
    let a = isolator.allocations().map_err(fail)?;
    if a.free.len() != 4 || !a.owners.is_empty() {
        return Err(format!("GPUs not all given back: {a:?}").into());
    }
    Ok(())
}

pub(crate) fn concurrent_launches_never_share_a_gpu(fx: &Fixture) -> TestResult {
    let work = tempfile::tempdir().map_err(fail)?;
    let isolator = pool(fx, work.path(), &unique_name("bridge"))?;
    let start = Arc::new(Barrier::new(2));
    let launches: Vec<_> = (0..2)
        .map(|_| {
            let (isolator, start) = (Arc::clone(&isolator), Arc::clone(&start));
            let id = uuid();
            fx.cleanup.container(&docker_name(&id));
            let image = fx.plain.clone();
            let driver = fx.driver((12, 4));
            let gpus = fx.inventory.gpus.clone();
            std::thread::spawn(move || -> Result<BridgedContainer, String> {
                let rt = rt().map_err(|e| format!("{e:?}"))?;
                rt.block_on(async {
                    let client = DockerClient::connect(Path::new(SOCKET))
                        .await
                        .map_err(|e| error_chain(&e))?;
                    let bridge = DockerBridge::new(isolator, client, Some(driver), gpus);
                    let cmd = ["sh", "-c", "sleep 3; ls /dev"].map(str::to_owned);
                    start.wait();
                    bridge
                        .launch(&id, 2.0, &image, &cmd)
                        .await
                        .map_err(|e| error_chain(&e))
                })
            })
        })
        .collect();
    let mut started = Vec::new();
    for handle in launches {
        started.push(handle.join().map_err(|_| "launch thread panicked")??);
    }
    let (a, b) = (minors(&started[0]), minors(&started[1]));
    if a.len() != 2 || b.len() != 2 || !a.is_disjoint(&b) {
        return Err(format!("concurrent launches share or miss GPUs: {a:?} and {b:?}").into());
    }
    rt()?.block_on(async {
        let bridge = bridge(fx, &isolator).await?;
        // Every GPU is taken: a third request is refused, and leaves no container behind.
        let third = uuid();
        fx.cleanup.container(&docker_name(&third));
        let err = bridge
            .launch(&third, 1.0, &fx.plain, &[])
            .await
            .expect_err("no GPU is free");
        let text = error_chain(&err);
        if !err.is_not_enough()
            || !text.contains("cannot allocate 1 GPUs")
            || !text.contains("0 free")
        {
            return Err(format!("unclear refusal: {text}").into());
        }
        let leftover = Command::new("docker")
            .args(["inspect", &docker_name(&third)])
            .output()
            .map_err(fail)?;
        if leftover.status.success() {
            return Err("a refused launch left a container".into());
        }
        for c in &started {
            // Docker read back what the pool reserved.
            let held: BTreeSet<u32> = bridge
                .client()
                .gpu_minors(&c.docker_id, &fx.inventory.gpus)
                .await
                .map_err(fail)?
                .into_iter()
                .collect();
            let code = bridge.wait_and_release(c).await.map_err(fail)?;
            let out = logs(&c.name);
            if code != 0 || held != minors(c) || listed_minors(&out) != minors(c) {
                return Err(format!(
                    "{}: exit {code}, reserved {:?}, docker has {held:?}, container sees {:?}",
                    c.name,
                    minors(c),
                    listed_minors(&out)
                )
                .into());
            }
        }
        every_gpu_free(&isolator)
    })
}

pub(crate) fn mesos_and_docker_containers_share_one_pool(fx: &Fixture) -> TestResult {
    let work = tempfile::tempdir().map_err(fail)?;
    let root = unique_name("bridge");
    let parent = CgroupParent(Path::new("/sys/fs/cgroup/devices").join(&root));
    let isolator = pool(fx, work.path(), &root)?;
    let mesos = ContainerId::new(unique_name("mesos")).map_err(fail)?;
    let info = isolator
        .prepare(
            &mesos,
            PrepareConfig {
                gpus: 2.0,
                ..PrepareConfig::default()
            },
        )
        .map_err(fail)?;
    let mesos_minors: BTreeSet<u32> = info.gpus.iter().map(|g| g.minor).collect();
    let rest: Vec<u32> = fx
        .inventory
        .gpus
        .iter()
        .map(|g| g.minor)
        .filter(|m| !mesos_minors.contains(m))
        .collect();
    let result: TestResult = rt()?.block_on(async {
        let bridge = bridge(fx, &isolator).await?;
        let id = uuid();
        fx.cleanup.container(&docker_name(&id));
        // The Docker container must get exactly the GPUs Mesos did not, and be denied Mesos's.
        let absent: Vec<u32> = mesos_minors.iter().copied().collect();
        let cmd = [
            "sh".to_owned(),
            "-c".to_owned(),
            check_script(&rest, &absent, false),
        ];
        let c = bridge
            .launch(&id, 2.0, &fx.plain, &cmd)
            .await
            .map_err(fail)?;
        let docker_minors = minors(&c);
        // The pool is empty for both containerizers now.
        let more = uuid();
        let refused = bridge.launch(&more, 1.0, &fx.plain, &[]).await;
        let refused_mesos = isolator.prepare(
            &ContainerId::new(unique_name("mesos")).map_err(fail)?,
            PrepareConfig {
                gpus: 1.0,
                ..PrepareConfig::default()
            },
        );
        let code = bridge.wait_and_release(&c).await.map_err(fail)?;
        if code != 0 {
            return Err(format!(
                "checks failed in the Docker container (exit {code}):\n{}",
                logs(&c.name)
            )
            .into());
        }
        if !docker_minors.is_disjoint(&mesos_minors) || docker_minors.len() != 2 {
            return Err(format!("Mesos has {mesos_minors:?}, Docker got {docker_minors:?}").into());
        }
        if !refused.as_ref().is_err_and(|e| e.is_not_enough()) {
            return Err(format!("a third Docker request was not refused: {refused:?}").into());
        }
        if !refused_mesos.as_ref().is_err_and(|e| e.is_not_enough()) {
            return Err(
                format!("a second Mesos request was not refused: {refused_mesos:?}").into(),
            );
        }
        // The Mesos cgroup allows its GPUs and none of Docker's.
        let list = std::fs::read_to_string(parent.0.join(mesos.as_str()).join("devices.list"))
            .map_err(fail)?;
        for m in &mesos_minors {
            if !list.lines().any(|l| l.starts_with(&format!("c 195:{m} "))) {
                return Err(format!("Mesos cgroup lacks GPU {m}:\n{list}").into());
            }
        }
        for m in &docker_minors {
            if list.lines().any(|l| l.starts_with(&format!("c 195:{m} "))) {
                return Err(format!("Mesos cgroup allows Docker's GPU {m}:\n{list}").into());
            }
        }
        Ok(())
    });
    isolator.cleanup(&mesos).map_err(fail)?;
    result?;
    every_gpu_free(&isolator)
}

pub(crate) fn restart_keeps_running_gpus_and_frees_dead_ones(fx: &Fixture) -> TestResult {
    let work = tempfile::tempdir().map_err(fail)?;
    let root = unique_name("bridge");
    let rt = rt()?;
    let sleep = ["sleep", "300"].map(str::to_owned);
    let (kept, died) = {
        let isolator = pool(fx, work.path(), &root)?;
        let result = rt.block_on(async {
            let bridge = bridge(fx, &isolator).await?;
            let (a, b) = (uuid(), uuid());
            for id in [&a, &b] {
                fx.cleanup.container(&docker_name(id));
            }
            let kept = bridge
                .launch(&a, 1.0, &fx.plain, &sleep)
                .await
                .map_err(fail)?;
            let died = bridge
                .launch(&b, 2.0, &fx.plain, &sleep)
                .await
                .map_err(fail)?;
            Ok::<_, Failed>((kept, died))
        });
        result?
        // The agent stops here: the bridge and the isolator (and its lock) are dropped.
    };
    // Meanwhile one container dies, and one holding the last GPU is started by hand.
    run(Command::new("docker").args(["kill", &died.docker_id]))?;
    let taken: BTreeSet<u32> = minors(&kept).union(&minors(&died)).copied().collect();
    let last: Vec<u32> = fx
        .inventory
        .gpus
        .iter()
        .map(|g| g.minor)
        .filter(|m| !taken.contains(m))
        .collect();
    let stranger = uuid();
    let stranger_name = docker_name(&stranger);
    fx.cleanup.container(&stranger_name);
    rt.block_on(async {
        let client = DockerClient::connect(Path::new(SOCKET))
            .await
            .map_err(fail)?;
        let plan = fx.plan(&last, &ImageInfo::default(), None).map_err(fail)?;
        let spec = ContainerSpec {
            name: stranger_name.clone(),
            image: fx.plain.clone(),
            cmd: sleep.to_vec(),
            env: vec![],
        };
        let id = client.create(&spec, &plan).await.map_err(fail)?;
        client.start(&id).await.map_err(fail)
    })?;

    // The agent starts again over the same work directory.
    let isolator = pool(fx, work.path(), &root)?;
    rt.block_on(async {
        let bridge = bridge(fx, &isolator).await?;
        let recovery = bridge.recover().await.map_err(fail)?;
        if recovery.released != [died.id.clone()] || recovery.adopted != [stranger.clone()] {
            return Err(format!(
                "released {:?}, adopted {:?}",
                recovery.released, recovery.adopted
            )
            .into());
        }
        // The daemon may also run other agents' `mesos-` containers: only this test's are judged.
        let ours = [&kept.id, &died.id, &stranger];
        let unknown = recovery
            .unknown_gpus
            .iter()
            .any(|c| ours.iter().any(|id| id.as_str() == c.mesos_container_id));
        if !recovery.report.is_clean() || unknown {
            return Err(format!("unexpected issues: {recovery:?}").into());
        }
        let allocations = isolator.allocations().map_err(fail)?;
        let held = |id: &ContainerId| {
            allocations
                .owners
                .iter()
                .find(|(o, _)| o == id.as_str())
                .map(|(_, g)| g.clone())
        };
        let indices = |c: &BridgedContainer| c.gpus.iter().map(|g| g.index).collect::<Vec<_>>();
        let stranger_indices: Vec<u32> = fx.gpus(&last).iter().map(|g| g.index).collect();
        if held(&kept.id) != Some(indices(&kept))
            || held(&stranger) != Some(stranger_indices)
            || held(&died.id).is_some()
            || allocations.free.len() != 2
        {
            return Err(format!("after recovery: {allocations:?}").into());
        }
        // Not double-booked: three GPUs are more than are free; two are exactly the dead one's.
        let (big, next) = (uuid(), uuid());
        for id in [&big, &next] {
            fx.cleanup.container(&docker_name(id));
        }
        let err = bridge
            .launch(&big, 3.0, &fx.plain, &[])
            .await
            .expect_err("only 2 free");
        if !err.is_not_enough() {
            return Err(format!("unexpected refusal: {}", error_chain(&err)).into());
        }
        let next = bridge
            .launch(&next, 2.0, &fx.plain, &["true".to_owned()])
            .await
            .map_err(fail)?;
        if minors(&next) != minors(&died) {
            return Err(format!(
                "new container got {:?}, the dead one had {:?}",
                minors(&next),
                minors(&died)
            )
            .into());
        }
        bridge.wait_and_release(&next).await.map_err(fail)?;
        // Ending the recovered containers gives their GPUs back too.
        for (docker_id, id) in [(&kept.docker_id, &kept.id), (&stranger_name, &stranger)] {
            bridge.client().stop(docker_id, 0).await.map_err(fail)?;
            bridge.release(id).await.map_err(fail)?;
        }
        every_gpu_free(&isolator)
    })
}

/// Issue 34 item 7: a pool record an earlier mesos-gpu wrote without UUIDs (`"gpus": ["", ""]`,
/// the double-booking bug's) for a running Docker container is named from the devices the real
/// daemon gave the container, by the next isolator that sees the GPUs and asks the daemon: those
/// GPUs are never granted while it runs, the others are, and they come back once the daemon no
/// longer has the container.
pub(crate) fn a_docker_owners_unnamed_gpus_are_named_from_its_containers_devices(
    fx: &Fixture,
) -> TestResult {
    use mesos_gpu_isolator::lifecycle::{PoolConfig, PoolRole};
    use mesos_gpu_pool::{GpuUuid, Owner, Pool, Reservation};
    let work = tempfile::tempdir().map_err(fail)?;
    let pool_dir = work.path().join("pool");
    let rt = rt()?;
    let owner = uuid();
    let name = docker_name(&owner);
    fx.cleanup.container(&name);
    let held = [1u32, 3];
    rt.block_on(async {
        let client = DockerClient::connect(Path::new(SOCKET))
            .await
            .map_err(fail)?;
        let plan = fx.plan(&held, &ImageInfo::default(), None).map_err(fail)?;
        let spec = ContainerSpec {
            name: name.clone(),
            image: fx.plain.clone(),
            cmd: vec!["sleep".into(), "300".into()],
            env: vec![],
        };
        let id = client.create(&spec, &plan).await.map_err(fail)?;
        client.start(&id).await.map_err(fail)
    })?;
    {
        let mut tx = Pool::at(&pool_dir).begin().map_err(fail)?;
        tx.state.reservations.insert(
            owner.to_string(),
            Reservation {
                publisher: "/var/run/mesos-gpu/gpu/allocations.json".into(),
                owner: Owner::Docker {
                    name: name.clone(),
                    daemon: Some(format!("unix://{SOCKET}")),
                    starter: None,
                    holder: None,
                },
                gpus: Vec::new(),
                unnamed: 2,
                since: 1,
            },
        );
        tx.commit().map_err(fail)?;
    }
    let mut config = IsolatorConfig::new(work.path().join("docker"));
    config.cgroup_version = CgroupChoice::V1;
    config.cgroups_root = unique_name("unnamed");
    config.pool = Some(PoolConfig {
        dir: pool_dir.clone(),
        role: PoolRole::Docker,
    });
    let nodes = DeviceNodes::scan(&fx.host.dev_root, &fx.inventory).map_err(fail)?;
    let mut isolator = Isolator::new(config, fx.inventory.clone(), nodes).map_err(fail)?;
    isolator.set_docker_daemons(Arc::new(mesos_gpu_docker::daemons::EngineDaemons::new()));
    isolator.recover(&[], &[]).map_err(fail)?;

    let mine = uuid();
    let got: BTreeSet<u32> = reserve(&isolator, &mine, 2.0)
        .map_err(fail)?
        .iter()
        .map(|g| g.minor)
        .collect();
    if got != BTreeSet::from([0, 2]) {
        return Err(format!("granted minors {got:?} beside a container holding {held:?}").into());
    }
    let err = reserve(&isolator, &uuid(), 1.0).expect_err("every GPU is held");
    if !err.is_not_enough() {
        return Err(format!("unexpected refusal: {}", error_chain(&err)).into());
    }
    let record = Pool::at(&pool_dir).read().map_err(fail)?.reservations[owner.as_str()].clone();
    let named: BTreeSet<GpuUuid> = fx
        .gpus(&held)
        .iter()
        .map(|g| GpuUuid::new(g.uuid.clone()))
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    if record.gpus.iter().cloned().collect::<BTreeSet<_>>() != named
        || record.unnamed != 0
        || record.publisher != mesos_gpu_pool::EVIDENCE_PUBLISHER
    {
        return Err(
            format!("the record is not named from the container's devices: {record:?}").into(),
        );
    }
    isolator.release_docker(&mine).map_err(fail)?;
    run(Command::new("docker").args(["rm", "-f", &name]))?;
    let all = reserve(&isolator, &mine, 4.0).map_err(fail)?;
    isolator.release_docker(&mine).map_err(fail)?;
    if all.len() != 4 {
        return Err(format!("the container's GPUs did not come back: {all:?}").into());
    }
    Ok(())
}

/// Reserves `gpus` GPUs for Docker container `id` through [`DockerGuard`], as every entry point
/// does, and keeps them.
fn reserve(
    iso: &mesos_gpu_isolator::lifecycle::Isolator,
    id: &mesos_gpu_isolator::lifecycle::ContainerId,
    gpus: f64,
) -> std::result::Result<
    Vec<mesos_gpu_node::inventory::Gpu>,
    mesos_gpu_isolator::lifecycle::LifecycleError,
> {
    mesos_gpu_isolator::lifecycle::DockerGuard::reserve(
        iso,
        id,
        gpus,
        mesos_gpu_isolator::lifecycle::DockerStart::default(),
    )
    .map(mesos_gpu_isolator::lifecycle::DockerGuard::keep)
}
