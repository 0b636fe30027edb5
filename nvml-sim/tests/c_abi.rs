//! The C ABI as a non-Rust client sees it: a C program, compiled with `cc` at test time,
//! `dlopen`s the sim and calls it through its own copy of `nvml.h`'s prototypes and structs.
//! Also checks the one stderr line a broken node description produces.
//!
//! Needs a C compiler: the trials are ignored without one (and fail when `MESOS_GPU_REQUIRE`
//! lists `cc`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};

/// The client: prototypes and layouts written from NVIDIA's nvml.h, not from the sim.
const CLIENT: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct nvmlPciInfo_st {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
typedef struct {
    unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    nvmlDevice_t device; unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define SYM(ret, name, args) \
    ret (*name) args = (ret (*) args)dlsym(lib, #name); \
    if (!name) { printf("missing %s\n", #name); return 2; }

int main(int argc, char **argv) {
    if (argc != 3) { printf("usage: client LIB EVENTS\n"); return 2; }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("dlopen: %s\n", dlerror()); return 2; }
    SYM(nvmlReturn_t, nvmlInit_v2, (void));
    SYM(nvmlReturn_t, nvmlShutdown, (void));
    SYM(const char *, nvmlErrorString, (nvmlReturn_t));
    SYM(nvmlReturn_t, nvmlSystemGetDriverVersion, (char *, unsigned int));
    SYM(nvmlReturn_t, nvmlSystemGetCudaDriverVersion_v2, (int *));
    SYM(nvmlReturn_t, nvmlDeviceGetCount_v2, (unsigned int *));
    /* NVML's first versions, which Mesos's own NVML code loads (isolators/gpu/nvml.cpp 111-116). */
    SYM(nvmlReturn_t, nvmlDeviceGetCount, (unsigned int *));
    SYM(nvmlReturn_t, nvmlDeviceGetHandleByIndex, (unsigned int, nvmlDevice_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, (unsigned int, nvmlDevice_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetHandleByPciBusId_v2, (const char *, nvmlDevice_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetMinorNumber, (nvmlDevice_t, unsigned int *));
    SYM(nvmlReturn_t, nvmlDeviceGetPciInfo_v3, (nvmlDevice_t, nvmlPciInfo_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, nvmlMemory_v2_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetCpuAffinity, (nvmlDevice_t, unsigned int, unsigned long *));
    SYM(nvmlReturn_t, nvmlDeviceGetTopologyCommonAncestor, (nvmlDevice_t, nvmlDevice_t, int *));
    SYM(nvmlReturn_t, nvmlEventSetCreate, (nvmlEventSet_t *));
    SYM(nvmlReturn_t, nvmlDeviceRegisterEvents, (nvmlDevice_t, unsigned long long, nvmlEventSet_t));
    SYM(nvmlReturn_t, nvmlEventSetWait_v2, (nvmlEventSet_t, nvmlEventData_t *, unsigned int));
    SYM(nvmlReturn_t, nvmlEventSetFree, (nvmlEventSet_t));

    nvmlReturn_t rc = nvmlInit_v2();
    printf("init %d %s\n", rc, nvmlErrorString(rc));
    if (rc != 0) return 0;

    char text[80];
    int cuda = 0;
    unsigned int count = 0;
    rc = nvmlSystemGetDriverVersion(text, sizeof text);
    printf("driver %d %s\n", rc, text);
    rc = nvmlSystemGetCudaDriverVersion_v2(&cuda);
    printf("cuda %d %d\n", rc, cuda);
    rc = nvmlDeviceGetCount_v2(&count);
    printf("count %d %u\n", rc, count);
    unsigned int count_v1 = 0;
    rc = nvmlDeviceGetCount(&count_v1);
    printf("count v1 %d %u\n", rc, count_v1);
    nvmlDevice_t devs[16];
    for (unsigned int i = 0; i < count && i < 16; i++) {
        unsigned int minor = 0;
        nvmlPciInfo_t pci;
        nvmlMemory_v2_t mem = { .version = nvmlMemory_v2 };
        unsigned long cpus[2] = { 0, 0 };
        nvmlDevice_t v1;
        nvmlDeviceGetHandleByIndex_v2(i, &devs[i]);
        if (nvmlDeviceGetHandleByIndex(i, &v1) != 0 || v1 != devs[i]) printf("v1 handle %u differs\n", i);
        nvmlDeviceGetMinorNumber(devs[i], &minor);
        nvmlDeviceGetPciInfo_v3(devs[i], &pci);
        int mrc = nvmlDeviceGetMemoryInfo_v2(devs[i], &mem);
        nvmlDeviceGetCpuAffinity(devs[i], 2, cpus);
        printf("gpu %u minor %u bus %s legacy %s dom %u bus %u dev %u id %08X sub %08X mem %d %llu %llu cpus %lx\n",
               i, minor, pci.busId, pci.busIdLegacy, pci.domain, pci.bus, pci.device, pci.pciDeviceId,
               pci.pciSubSystemId, mrc, mem.total, mem.free, cpus[0]);
    }
    nvmlDevice_t by_bus;
    rc = nvmlDeviceGetHandleByPciBusId_v2("0000:09:00.0", &by_bus);
    printf("by-bus %d same %d\n", rc, by_bus == devs[2]);
    int level = -1;
    nvmlDeviceGetTopologyCommonAncestor(devs[0], devs[1], &level);
    printf("ancestor 0-1 %d\n", level);
    nvmlDeviceGetTopologyCommonAncestor(devs[1], devs[2], &level);
    printf("ancestor 1-2 %d\n", level);
    unsigned int nprocs = 0;
    rc = nvmlDeviceGetComputeRunningProcesses_v3(devs[0], &nprocs, NULL);
    printf("procs %d %u\n", rc, nprocs);

    nvmlEventSet_t set;
    nvmlEventSetCreate(&set);
    printf("register %d\n", nvmlDeviceRegisterEvents(devs[1], 8ULL, set));
    FILE *events = fopen(argv[2], "a");
    fputs("xid 1 31\n", events);
    fclose(events);
    nvmlEventData_t ev;
    memset(&ev, 0, sizeof ev);
    rc = nvmlEventSetWait_v2(set, &ev, 5000);
    printf("event %d dev1 %d type %llu data %llu gi %x ci %x\n", rc, ev.device == devs[1], ev.eventType,
           ev.eventData, ev.gpuInstanceId, ev.computeInstanceId);
    rc = nvmlEventSetWait_v2(set, &ev, 10);
    printf("timeout %d %s\n", rc, nvmlErrorString(rc));
    printf("free %d\n", nvmlEventSetFree(set));
    printf("shutdown %d\n", nvmlShutdown());
    rc = nvmlShutdown();
    printf("shutdown %d %s\n", rc, nvmlErrorString(rc));
    return 0;
}
"#;

fn compile(dir: &Path) -> Result<PathBuf, Failed> {
    let src = dir.join("client.c");
    let bin = dir.join("client");
    std::fs::write(&src, CLIENT).map_err(|e| format!("write {}: {e}", src.display()))?;
    let out = Command::new("cc")
        .arg("-std=gnu11")
        .args(["-Wall", "-Wextra", "-Werror"])
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .arg("-ldl")
        .output()
        .map_err(|e| format!("run cc: {e}"))?;
    if !out.status.success() {
        return Err(format!("cc failed:\n{}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(bin)
}

fn run(bin: &Path, node: &SimNode) -> Result<Output, Failed> {
    let out = Command::new(bin)
        .arg(node.lib_path())
        .arg(node.events_path())
        .env_remove("NVML_SIM_CONFIG")
        .output()
        .map_err(|e| format!("run {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "client exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        )
        .into());
    }
    Ok(out)
}

fn expect_lines(stdout: &str, wanted: &[&str]) -> Result<(), Failed> {
    let lines: Vec<&str> = stdout.lines().collect();
    for want in wanted {
        if !lines.contains(want) {
            return Err(format!("missing line {want:?} in:\n{stdout}").into());
        }
    }
    Ok(())
}

fn c_client_sees_the_k80_node() -> Result<(), Failed> {
    let node = SimNode::shipped("k80");
    let bin = compile(node.dir())?;
    let out = run(&bin, &node)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.contains("v1 handle") {
        return Err(format!("nvmlDeviceGetHandleByIndex differs from _v2:\n{stdout}").into());
    }
    let mem = 11441u64 * 1024 * 1024;
    let gpu2 = format!(
        "gpu 2 minor 0 bus 00000000:09:00.0 legacy 0000:09:00.0 dom 0 bus 9 dev 0 id 102D10DE sub 106C10DE mem 0 {mem} {mem} cpus fff000fff"
    );
    expect_lines(
        &stdout,
        &[
            "init 0 Success",
            "driver 0 470.256.02",
            "cuda 0 11040",
            "count 0 4",
            "count v1 0 4",
            &gpu2,
            "by-bus 0 same 1",
            "ancestor 0-1 0",
            "ancestor 1-2 30",
            "procs 0 0",
            "register 0",
            "event 0 dev1 1 type 8 data 31 gi ffffffff ci ffffffff",
            "timeout 10 Timeout",
            "free 0",
            "shutdown 0",
            "shutdown 1 Uninitialized",
        ],
    )
}

fn broken_description_prints_one_line_and_no_driver() -> Result<(), Failed> {
    let node = SimNode::shipped("k80");
    let json = std::fs::read_to_string(node.config_path()).map_err(|e| e.to_string())?;
    let broken = json.replacen(r#""index":1"#, r#""index":0"#, 1);
    if broken == json {
        return Err("could not break the description".into());
    }
    std::fs::write(node.config_path(), broken).map_err(|e| e.to_string())?;
    let bin = compile(node.dir())?;
    let out = run(&bin, &node)?;
    expect_lines(
        &String::from_utf8_lossy(&out.stdout),
        &["init 9 Driver Not Loaded"],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    let path = node.config_path().display().to_string();
    if lines.len() != 1
        || !lines[0].starts_with("nvml-sim: ")
        || !lines[0].contains(&path)
        || !lines[0].contains("GPU index 0 appears twice")
    {
        return Err(format!(
            "expected one line naming {path} and the duplicate index, got:\n{stderr}"
        )
        .into());
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let host = Host::probe();
    let trials = vec![
        needs(
            &host,
            &[Need::Cc],
            Trial::test("c_client_sees_the_k80_node", c_client_sees_the_k80_node),
        ),
        needs(
            &host,
            &[Need::Cc],
            Trial::test(
                "broken_description_prints_one_line_and_no_driver",
                broken_description_prints_one_line_and_no_driver,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
