//! `mesos-gpu demo --live`: device cgroups really created and removed (root, cgroups), and
//! DOCKER apps run as real containers that are gone afterwards (dockerd).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, ExitCode};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::{Host, Need, needs, unique_name};

/// Removes what a failed run may leave: the containers named and the image.
struct Leftovers {
    image: String,
    names: Vec<String>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("docker").args(["rm", "-f", name]).output();
        }
        let _ = Command::new("docker")
            .args(["image", "rm", "-f", "--no-prune", &self.image])
            .output();
    }
}

fn live_run_starts_and_removes_docker_containers() -> Result<(), Failed> {
    let mut leftovers = Leftovers {
        image: format!("{}:1", unique_name("demo-live")),
        names: Vec::new(),
    };
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["demo", "--live", "--json", "--live-image", &leftovers.image])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("demo --live failed: {stderr}").into());
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let started = report["docker_containers"]
        .as_array()
        .ok_or("no docker_containers in the report")?;
    let docker_tasks = report["run"]["tasks"]
        .as_array()
        .ok_or("no tasks")?
        .iter()
        .filter(|t| t["launch"]["docker_args"].is_array())
        .count();
    if started.is_empty() || started.len() != docker_tasks {
        return Err(format!(
            "{} containers started for {docker_tasks} launched DOCKER tasks: {report:#}",
            started.len()
        )
        .into());
    }
    for c in started {
        let name = c["name"].as_str().ok_or("no name")?;
        leftovers.names.push(name.to_owned());
        let id = c["container_id"].as_str().ok_or("no container_id")?;
        if name != format!("mesos-{id}") || c["exit"].as_i64().is_none() || c["removed"] != true {
            return Err(format!("container not stopped and removed: {c}").into());
        }
        if c["docker_id"].as_str().is_none_or(str::is_empty) {
            return Err(format!("no docker id: {c}").into());
        }
    }
    let ps = Command::new("docker")
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .output()?;
    let names = String::from_utf8_lossy(&ps.stdout);
    if let Some(left) = names
        .lines()
        .find(|n| leftovers.names.iter().any(|m| m == n))
    {
        return Err(format!("{left} left behind").into());
    }
    let image = Command::new("docker")
        .args(["image", "inspect", &leftovers.image])
        .output()?;
    if image.status.success() {
        return Err(format!(
            "the image {} the demo built is left behind",
            leftovers.image
        )
        .into());
    }
    Ok(())
}

fn live_run_creates_and_removes_the_cgroups() -> Result<(), Failed> {
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["demo", "--live", "--json"])
        .env("MESOS_GPU_LOG", "mesos_gpu_isolator=info,warn")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("demo --live failed: {stderr}").into());
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    if report["mode"] != "live" {
        return Err(format!("mode {}", report["mode"]).into());
    }
    let prepared = stderr.matches("prepared container").count();
    let cleaned = stderr.matches("cleaned up container").count();
    if prepared < 5 || prepared != cleaned {
        return Err(format!("{prepared} prepared, {cleaned} cleaned up:\n{stderr}").into());
    }
    let cgroup = report["run"]["tasks"][0]["launch"]["cgroup"]
        .as_str()
        .ok_or("no cgroup")?;
    let parent = std::path::Path::new(cgroup).parent().ok_or("no parent")?;
    if parent.exists() {
        return Err(format!("{} left behind", parent.display()).into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let host = Host::probe();
    let trials = vec![
        needs(
            &host,
            &[Need::Root],
            Trial::test(
                "live_run_creates_and_removes_the_cgroups",
                live_run_creates_and_removes_the_cgroups,
            ),
        ),
        needs(
            &host,
            &[Need::Root, Need::Cgroup1, Need::Dockerd],
            Trial::test(
                "live_run_starts_and_removes_docker_containers",
                live_run_starts_and_removes_docker_containers,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
