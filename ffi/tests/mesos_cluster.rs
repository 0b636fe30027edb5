//! Several agents under one master, and a framework written with a client library nobody here
//! wrote: pymesos (PyPI), a pure-Python client of Mesos's HTTP scheduler API, driven by
//! `testkit/python/gpu_framework.py`.
//!
//! Three real agents (cgroup v1, `cgroups/devices` + the module) register with one real master,
//! each on its own simulated node with its own pool, work directory, cgroups root and port:
//! `dgx1-v100` (8 V100s), `pcie-t4x4` (4 T4s) and `dgx-a100-mixed` (GPUs 0-3 whole, 4-7 split
//! into MIG devices, `mig_strategy=mixed`). Their device nodes are made in one private directory
//! (the union of their minors and MIG capability nodes), every module's `dev_root`, so a task's
//! probe reads the same path on whichever agent it lands.
//!
//! What the trials show, with Mesos's own master doing the offering:
//! - the master's default `--filter_gpu_resources` offers a framework without `GPU_RESOURCES`
//!   nothing of these agents (their GPUs included), while one with it is offered every agent's
//!   GPUs;
//! - a quota limit on `gpus` for a role holds across agents: with `gpus:8` allowed, two
//!   `gpus:4` tasks on two agents run and a third, sent to the third agent whose four GPUs are
//!   free, waits until one of the two ends;
//! - tasks land on the agents whose GPUs fit (`gpus:8` only fits the DGX-1, a MIG device only
//!   the mixed node) and the module refuses none of what Mesos offered: every task runs and
//!   opens exactly what it asked for.
//!
//! Needs root, cgroup v1, `cc`, cmake, the Mesos in `../shared/mesos` and pymesos.

mod agents;
mod support;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use agents::{Hold, ModuleNode, TaskProbe, dev_nodes, module_isolation_v1, probe, probe_command};
use libtest_mimic::{Arguments, Trial};
use mesos_gpu_isolator::agent_flags::{MigOffer, MigStrategy};
use mesos_gpu_testkit::mesos::framework::{Framework, FrameworkSpec};
use mesos_gpu_testkit::mesos::{
    Agent, AgentCgroups, DevNodes, Master, MesosInstall, http_post_json, wait_for,
};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};
use support::{TestResult, check, trial};

const TIMEOUT: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    let host = Host::probe();
    let need: &[Need] = &[
        Need::Root,
        Need::Cgroup1,
        Need::Cc,
        Need::Mesos,
        Need::Pymesos,
    ];
    type Test = fn() -> TestResult;
    let tests: [(&str, Test); 3] = [
        (
            "framework_without_gpu_capability_is_offered_no_gpu_agent",
            framework_without_gpu_capability_is_offered_no_gpu_agent,
        ),
        (
            "quota_on_gpus_holds_across_agents",
            quota_on_gpus_holds_across_agents,
        ),
        (
            "tasks_land_where_their_gpus_fit_and_none_is_refused",
            tasks_land_where_their_gpus_fit_and_none_is_refused,
        ),
    ];
    let trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, f)| needs(&host, need, trial(name, f)))
        .collect();
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// One agent of the cluster and its node.
struct Member {
    name: &'static str,
    node: ModuleNode,
    agent: Agent,
    /// What it offers, as `--resources`.
    resources: String,
}

/// A master and three module-loaded agents on different simulated nodes.
struct Cluster {
    members: Vec<Member>,
    master: Master,
    dev: DevNodes,
}

impl Cluster {
    fn start() -> TestResult<Cluster> {
        let install = MesosInstall::locate()?;
        let sims = [
            ("dgx1", SimNode::shipped("dgx1-v100")),
            ("t4x4", SimNode::shipped("pcie-t4x4")),
            ("mixed", SimNode::shipped("dgx-a100-mixed")),
        ];
        let dev = dev_nodes(&sims.iter().map(|(_, s)| s).collect::<Vec<_>>())?;
        let master = Master::start(&install)?;
        let mut members = Vec::new();
        for (name, sim) in sims {
            let inventory = sim.inventory()?;
            let node = ModuleNode::with_dev_root(sim, dev.path())?;
            let (gpus, extra): (String, Vec<(&str, &str)>) = if inventory.mig.devices.is_empty() {
                (format!("gpus:{}", inventory.gpus.len()), Vec::new())
            } else {
                let offer = MigOffer::of(&inventory, MigStrategy::Mixed);
                (offer.resources().join(";"), vec![("mig_strategy", "mixed")])
            };
            let resources = format!("cpus:4;mem:4096;{gpus}");
            let spec = node.spec(&module_isolation_v1(), AgentCgroups::V1, &resources, &extra)?;
            let agent = Agent::start(&install, &master, spec)?;
            members.push(Member {
                name,
                node,
                agent,
                resources,
            });
        }
        Ok(Cluster {
            members,
            master,
            dev,
        })
    }

    /// The member whose agent has HTTP port `port`.
    fn by_port(&self, port: u64) -> Option<&Member> {
        self.members
            .iter()
            .find(|m| u64::from(m.agent.port()) == port)
    }

    /// The probe of task `id` once its first probe printed, from whichever agent ran it.
    fn probe_of(&self, id: &str) -> TestResult<(String, TaskProbe)> {
        for m in &self.members {
            if m.agent.sandbox(id).is_ok() {
                let text = m
                    .agent
                    .wait_stdout(id, "env CUDA_VISIBLE_DEVICES", TIMEOUT)?;
                return Ok((m.name.to_owned(), TaskProbe::parse(&text)));
            }
        }
        Err(format!("no agent has a sandbox for {id}").into())
    }
}

/// `gpus` in an `offer` event's resources.
fn offered_gpus(e: &serde_json::Value) -> f64 {
    e["resources"]["gpus"].as_f64().unwrap_or(0.0)
}

/// With `--filter_gpu_resources` (the master's default), a framework that does not declare
/// `GPU_RESOURCES` gets no offer from any of the three GPU agents (so none of their GPUs), and
/// its CPU-only task stays pending; a framework that declares it is offered every agent's
/// GPUs meanwhile, and its CPU-only task runs.
fn framework_without_gpu_capability_is_offered_no_gpu_agent() -> TestResult {
    let c = Cluster::start()?;
    let mut plain = Framework::start(
        &c.master,
        &FrameworkSpec {
            gpu_capability: false,
            ..FrameworkSpec::gpu("no-gpu-capability")
        },
    )?;
    let mut gpu = Framework::start(&c.master, &FrameworkSpec::gpu("gpu-capability"))?;
    plain.launch(
        "cpu-only-plain",
        &[("cpus", 0.1), ("mem", 32.0)],
        "true",
        None,
    )?;
    gpu.launch(
        "cpu-only-gpu",
        &[("cpus", 0.1), ("mem", 32.0)],
        "true",
        None,
    )?;
    gpu.wait_state("cpu-only-gpu", "TASK_FINISHED", TIMEOUT)?;
    // Offers go out every 200 ms; give the filtered framework a few seconds of them.
    std::thread::sleep(Duration::from_secs(5));
    let offers = |fw: &Framework| -> Vec<serde_json::Value> {
        fw.events()
            .into_iter()
            .filter(|e| e.kind == "offer")
            .map(|e| e.json)
            .collect()
    };
    let plain_offers = offers(&plain);
    check(
        plain_offers.is_empty() && plain.updates("cpu-only-plain").is_empty(),
        format!(
            "the framework without GPU_RESOURCES was offered {plain_offers:?} and its task got {:?}",
            plain.updates("cpu-only-plain")
        ),
    )?;
    let mut gpus_by_agent: BTreeMap<&str, f64> = BTreeMap::new();
    for o in offers(&gpu) {
        if let Some(m) = o["port"].as_u64().and_then(|p| c.by_port(p)) {
            let g = gpus_by_agent.entry(m.name).or_default();
            *g = g.max(offered_gpus(&o));
        }
    }
    println!("largest gpus offered to the GPU_RESOURCES framework per agent: {gpus_by_agent:?}");
    check(
        gpus_by_agent.get("dgx1") == Some(&8.0)
            && gpus_by_agent.get("t4x4") == Some(&4.0)
            && gpus_by_agent.get("mixed") == Some(&4.0),
        format!("every agent's GPUs are offered to the GPU framework: {gpus_by_agent:?}"),
    )?;
    Ok(())
}

/// A quota limit of `gpus:8` on role `team` (`UPDATE_QUOTA` on the master's `/api/v1`): a
/// `team` framework's `gpus:4` tasks sent to the DGX-1 and the T4 node run; a third sent to the
/// mixed node, whose four whole GPUs are free, is not launched while the two hold 8 GPUs
/// between them, and runs once one of them ends. A framework of another role meanwhile gets
/// GPUs on that same node: the limit is the role's, not the agents'.
fn quota_on_gpus_holds_across_agents() -> TestResult {
    let c = Cluster::start()?;
    http_post_json(
        c.master.port(),
        "/api/v1",
        &serde_json::json!({
            "type": "UPDATE_QUOTA",
            "update_quota": {
                "force": true,
                "quota_configs": [{ "role": "team", "limits": { "gpus": { "value": 8 } } }]
            }
        })
        .to_string(),
    )?;
    let mut team = Framework::start(
        &c.master,
        &FrameworkSpec {
            role: "team".into(),
            ..FrameworkSpec::gpu("team")
        },
    )?;
    let p = probe()?;
    let hold = |secs: f64| probe_command(&p, c.dev.path(), Hold::Secs(secs), 0);
    let port = |name: &str| {
        c.members
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.agent.port())
    };
    team.launch(
        "team-dgx1",
        &[("cpus", 0.1), ("mem", 32.0), ("gpus", 4.0)],
        &hold(600.0),
        port("dgx1"),
    )?;
    team.launch(
        "team-t4",
        &[("cpus", 0.1), ("mem", 32.0), ("gpus", 4.0)],
        &hold(600.0),
        port("t4x4"),
    )?;
    team.wait_state("team-dgx1", "TASK_RUNNING", TIMEOUT)?;
    team.wait_state("team-t4", "TASK_RUNNING", TIMEOUT)?;
    team.launch(
        "team-mixed",
        &[("cpus", 0.1), ("mem", 32.0), ("gpus", 4.0)],
        &hold(600.0),
        port("mixed"),
    )?;
    let mut other = Framework::start(&c.master, &FrameworkSpec::gpu("other-role"))?;
    other.launch(
        "other-mixed",
        &[("cpus", 0.1), ("mem", 32.0), ("gpus", 2.0)],
        &hold(0.5),
        port("mixed"),
    )?;
    other.wait_state("other-mixed", "TASK_FINISHED", TIMEOUT)?;
    std::thread::sleep(Duration::from_secs(4));
    let waiting = team.updates("team-mixed");
    let accepted = team.first("accept", "team-mixed");
    check(
        waiting.is_empty() && accepted.is_none(),
        format!("the third gpus:4 task of role team launched beyond its quota: {waiting:?}"),
    )?;
    // Offers made once both tasks run (and the master knows it) hold no GPU for role team.
    let both_running = ["team-dgx1", "team-t4"]
        .iter()
        .filter_map(|id| {
            team.updates(id)
                .into_iter()
                .find(|e| e.state == "TASK_RUNNING")
        })
        .map(|e| e.t)
        .fold(0.0, f64::max);
    let offered_beyond: Vec<String> = team
        .events()
        .into_iter()
        .filter(|e| e.kind == "offer" && e.t > both_running && offered_gpus(&e.json) > 0.0)
        .map(|e| {
            format!(
                "{} gpus from port {} at +{:.2} s",
                offered_gpus(&e.json),
                e.json["port"],
                e.t - both_running
            )
        })
        .collect();
    check(
        offered_beyond.is_empty(),
        format!("role team was offered GPUs while at its limit: {offered_beyond:?}"),
    )?;
    team.kill("team-t4")?;
    team.wait_state("team-t4", "TASK_KILLED", TIMEOUT)?;
    team.wait_state("team-mixed", "TASK_RUNNING", TIMEOUT)?;
    let (on, p3) = c.probe_of("team-mixed")?;
    check(
        on == "mixed" && p3.gpus().len() == 4,
        format!("team-mixed ran on {on} with GPUs {:?}", p3.gpus()),
    )?;
    Ok(())
}

/// Tasks with no placement constraint: `gpus:8` fits only the DGX-1, two `gpus:4` the T4 node
/// and the mixed node's whole GPUs, `mig-1g.5gb:1` and `mig-3g.20gb:1` only the mixed node.
/// Launched together they fill the cluster; every one runs (the module refuses nothing Mesos
/// offered) on an agent that has what it asked for, and opens exactly that.
fn tasks_land_where_their_gpus_fit_and_none_is_refused() -> TestResult {
    let c = Cluster::start()?;
    for m in &c.members {
        println!("agent {} --resources={}", m.name, m.resources);
    }
    let mut fw = Framework::start(&c.master, &FrameworkSpec::gpu("placement"))?;
    let p = probe()?;
    let no_sys_admin = serde_json::json!({
        "type": "MESOS",
        "linux_info": { "effective_capabilities": { "capabilities": ["CHOWN", "DAC_OVERRIDE"] } }
    });
    let asks: [(&str, &str, f64); 5] = [
        ("eight", "gpus", 8.0),
        ("four-a", "gpus", 4.0),
        ("four-b", "gpus", 4.0),
        ("mig-small", "mig-1g.5gb", 1.0),
        ("mig-large", "mig-3g.20gb", 1.0),
    ];
    // Every task holds its GPUs until all of them run (and so fill the cluster together); the
    // go file is in the device directory (the probe looks at `nvidia*` only), removed with it.
    let go = c.dev.path().join("placement-go");
    for (id, resource, n) in asks {
        let container = resource.starts_with("mig-").then(|| no_sys_admin.clone());
        fw.launch_in(
            id,
            &[("cpus", 0.1), ("mem", 32.0), (resource, n)],
            &probe_command(&p, c.dev.path(), Hold::Until(&go), 0),
            None,
            container,
        )?;
    }
    let mut placed = BTreeMap::new();
    for (id, resource, n) in asks {
        fw.wait_state(id, "TASK_RUNNING", TIMEOUT)?;
        let (on, probe) = c.probe_of(id)?;
        let gpus = probe.gpus();
        let caps = probe
            .opened()
            .iter()
            .filter(|n| n.starts_with("nvidia-cap"))
            .count();
        println!(
            "{id} ({resource}:{n}) ran on {on}: opened {:?}",
            probe.opened()
        );
        let right = match resource {
            "gpus" => gpus.len() as f64 == n && caps == 0,
            _ => gpus.len() == 1 && caps == 2,
        };
        check(right, format!("{id} opened {:?}", probe.opened()))?;
        placed.insert(id, on);
    }
    check(
        placed["eight"] == "dgx1"
            && placed["mig-small"] == "mixed"
            && placed["mig-large"] == "mixed"
            && placed["four-a"] != placed["four-b"]
            && placed["four-a"] != "dgx1"
            && placed["four-b"] != "dgx1",
        format!("placement: {placed:?}"),
    )?;
    std::fs::write(&go, b"")?;
    for (id, ..) in asks {
        fw.wait_state(id, "TASK_FINISHED", TIMEOUT)?;
    }
    for m in &c.members {
        wait_for(
            TIMEOUT,
            || format!("{}'s pool to be empty: {}", m.name, m.node.pool()),
            || {
                let pool = m.node.pool();
                let held = pool["reservations"]
                    .as_object()
                    .map_or(0, serde_json::Map::len);
                (held == 0).then_some(())
            },
        )?;
    }
    Ok(())
}
