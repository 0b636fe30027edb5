//! `DeviceNodes::scan` over real character devices made with `mknod` in a temp directory
//! (root), including nvidia-uvm's dynamic major and a GPU whose minor differs from its index.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, ExitCode};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_node::{devices::DeviceNodes, devices::DevicesError};
use mesos_gpu_node::{
    inventory::DevNum, inventory::DriverInfo, inventory::Gpu, inventory::Inventory,
    inventory::Topology,
};
use mesos_gpu_testkit::{Host, Need, needs};

fn mknod(dir: &Path, name: &str, major: u32, minor: u32) -> Result<(), Failed> {
    let path = dir.join(name);
    let status = Command::new("mknod")
        .arg(&path)
        .arg("c")
        .arg(major.to_string())
        .arg(minor.to_string())
        .status()?;
    if !status.success() {
        return Err(format!("mknod {} c {major} {minor}: {status}", path.display()).into());
    }
    Ok(())
}

fn inventory(minors: &[u32]) -> Inventory {
    let gpus: Vec<Gpu> = (0u32..)
        .zip(minors)
        .map(|(index, &minor)| Gpu {
            index,
            minor,
            uuid: format!("GPU-{index}"),
            name: "Tesla K80".into(),
            memory_total: 12 << 30,
            pci_bus_id: format!("00000000:{:02x}:00.0", index + 5),
            numa_node: None,
            compute_capability: Some((3, 7)),
            healthy: true,
        })
        .collect();
    Inventory {
        driver: Some(DriverInfo {
            version: "470.256.02".into(),
            cuda_version: Some((11, 4)),
        }),
        topology: Topology::unknown(gpus.len()),
        gpus,
        absent_reason: None,
        mig: Default::default(),
    }
}

fn control(dir: &Path, tools: bool) -> Result<(), Failed> {
    mknod(dir, "nvidiactl", 195, 255)?;
    mknod(dir, "nvidia-uvm", 507, 0)?;
    if tools {
        mknod(dir, "nvidia-uvm-tools", 507, 1)?;
    }
    Ok(())
}

fn reads_every_node() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    control(dir.path(), true)?;
    for minor in [0, 1, 2, 3] {
        mknod(dir.path(), &format!("nvidia{minor}"), 195, minor)?;
    }
    let nodes = DeviceNodes::scan(dir.path(), &inventory(&[2, 3, 0, 1]))?;
    let control: Vec<_> = nodes
        .control
        .iter()
        .map(|n| (n.path.file_name().unwrap().to_owned(), n.dev))
        .collect();
    assert_eq!(
        control,
        [
            (
                "nvidiactl".into(),
                DevNum {
                    major: 195,
                    minor: 255
                }
            ),
            (
                "nvidia-uvm".into(),
                DevNum {
                    major: 507,
                    minor: 0
                }
            ),
            (
                "nvidia-uvm-tools".into(),
                DevNum {
                    major: 507,
                    minor: 1
                }
            ),
        ]
    );
    assert_eq!(nodes.gpu(0).unwrap().path, dir.path().join("nvidia2"));
    assert_eq!(
        nodes.gpu(0).unwrap().dev,
        DevNum {
            major: 195,
            minor: 2
        }
    );
    assert_eq!(
        nodes.gpu(3).unwrap().dev,
        DevNum {
            major: 195,
            minor: 1
        }
    );
    assert_eq!(nodes.gpus.len(), 4);
    Ok(())
}

fn uvm_tools_is_optional() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    control(dir.path(), false)?;
    mknod(dir.path(), "nvidia0", 195, 0)?;
    let nodes = DeviceNodes::scan(dir.path(), &inventory(&[0]))?;
    assert_eq!(nodes.control.len(), 2);
    Ok(())
}

fn missing_uvm_is_named() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    mknod(dir.path(), "nvidiactl", 195, 255)?;
    mknod(dir.path(), "nvidia0", 195, 0)?;
    let err = DeviceNodes::scan(dir.path(), &inventory(&[0])).expect_err("uvm missing");
    assert!(
        matches!(&err, DevicesError::Missing { path, .. } if *path == dir.path().join("nvidia-uvm")),
        "{err}"
    );
    assert!(err.to_string().contains("nvidia-modprobe -u -c 0"), "{err}");
    Ok(())
}

fn missing_gpu_node_is_named() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    control(dir.path(), true)?;
    mknod(dir.path(), "nvidia0", 195, 0)?;
    let err = DeviceNodes::scan(dir.path(), &inventory(&[0, 1])).expect_err("nvidia1 missing");
    assert!(
        matches!(&err, DevicesError::Missing { path, .. } if *path == dir.path().join("nvidia1")),
        "{err}"
    );
    Ok(())
}

fn wrong_number_is_an_error() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    control(dir.path(), true)?;
    mknod(dir.path(), "nvidia0", 195, 7)?;
    let err = DeviceNodes::scan(dir.path(), &inventory(&[0])).expect_err("wrong minor");
    assert!(
        matches!(err, DevicesError::WrongNumber { index: 0, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with("is device 195:7, expected 195:0 for GPU 0"),
        "{err}"
    );
    Ok(())
}

fn no_gpus_needs_no_control_nodes_but_reads_them() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    mknod(dir.path(), "nvidiactl", 195, 255)?;
    let nodes = DeviceNodes::scan(dir.path(), &inventory(&[]))?;
    assert_eq!(nodes.control.len(), 1);
    assert!(nodes.gpus.is_empty());
    Ok(())
}

fn main() -> ExitCode {
    let host = Host::probe();
    type Test = fn() -> Result<(), Failed>;
    let tests: [(&str, Test); 6] = [
        ("reads_every_node", reads_every_node),
        ("uvm_tools_is_optional", uvm_tools_is_optional),
        ("missing_uvm_is_named", missing_uvm_is_named),
        ("missing_gpu_node_is_named", missing_gpu_node_is_named),
        ("wrong_number_is_an_error", wrong_number_is_an_error),
        (
            "no_gpus_needs_no_control_nodes_but_reads_them",
            no_gpus_needs_no_control_nodes_but_reads_them,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| needs(&host, &[Need::Root], Trial::test(name, f)))
        .collect();
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
