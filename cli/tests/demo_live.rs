//! `mesos-gpu demo --live`: device cgroups really created and removed (root, cgroups).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, ExitCode};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::{Host, Need, needs};

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
    let trials = vec![needs(
        &host,
        &[Need::Root],
        Trial::test(
            "live_run_creates_and_removes_the_cgroups",
            live_run_creates_and_removes_the_cgroups,
        ),
    )];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
