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

/// A MIG-aware client: structs and version macros written from nvml.h, not from the sim.
const MIG_CLIENT: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
#define nvmlGpuInstanceProfileInfo_v2 ((unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2 << 24)))
typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef struct {
    nvmlDevice_t device; unsigned int id, profileId; nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct {
    nvmlDevice_t device; unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define SYM(ret, name, args) \
    ret (*name) args = (ret (*) args)dlsym(lib, #name); \
    if (!name) { printf("missing %s\n", #name); return 2; }

int main(int argc, char **argv) {
    if (argc != 3) { printf("usage: mig-client LIB EVENTS\n"); return 2; }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("dlopen: %s\n", dlerror()); return 2; }
    SYM(nvmlReturn_t, nvmlInit_v2, (void));
    SYM(nvmlReturn_t, nvmlShutdown, (void));
    SYM(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, (unsigned int, nvmlDevice_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetMigMode, (nvmlDevice_t, unsigned int *, unsigned int *));
    SYM(nvmlReturn_t, nvmlDeviceGetMaxMigDeviceCount, (nvmlDevice_t, unsigned int *));
    SYM(nvmlReturn_t, nvmlDeviceGetMigDeviceHandleByIndex, (nvmlDevice_t, unsigned int, nvmlDevice_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetGpuInstanceId, (nvmlDevice_t, unsigned int *));
    SYM(nvmlReturn_t, nvmlDeviceGetComputeInstanceId, (nvmlDevice_t, unsigned int *));
    SYM(nvmlReturn_t, nvmlDeviceGetAttributes_v2, (nvmlDevice_t, nvmlDeviceAttributes_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetGpuInstanceProfileInfoV, (nvmlDevice_t, unsigned int, nvmlGpuInstanceProfileInfo_v2_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetGpuInstanceById, (nvmlDevice_t, unsigned int, nvmlGpuInstance_t *));
    SYM(nvmlReturn_t, nvmlGpuInstanceGetInfo, (nvmlGpuInstance_t, nvmlGpuInstanceInfo_t *));
    SYM(nvmlReturn_t, nvmlDeviceGetUUID, (nvmlDevice_t, char *, unsigned int));
    SYM(nvmlReturn_t, nvmlDeviceGetComputeMode, (nvmlDevice_t, unsigned int *));
    SYM(nvmlReturn_t, nvmlDeviceSetComputeMode, (nvmlDevice_t, unsigned int));
    SYM(nvmlReturn_t, nvmlDeviceGetCpuAffinityWithinScope, (nvmlDevice_t, unsigned int, unsigned long *, unsigned int));
    SYM(nvmlReturn_t, nvmlDeviceGetMemoryAffinity, (nvmlDevice_t, unsigned int, unsigned long *, unsigned int));
    SYM(nvmlReturn_t, nvmlEventSetCreate, (nvmlEventSet_t *));
    SYM(nvmlReturn_t, nvmlDeviceRegisterEvents, (nvmlDevice_t, unsigned long long, nvmlEventSet_t));
    SYM(nvmlReturn_t, nvmlEventSetWait_v2, (nvmlEventSet_t, nvmlEventData_t *, unsigned int));

    printf("init %d\n", nvmlInit_v2());
    nvmlDevice_t dev;
    nvmlDeviceGetHandleByIndex_v2(4, &dev);
    unsigned int cur = 9, pend = 9, max = 0;
    int rc = nvmlDeviceGetMigMode(dev, &cur, &pend);
    printf("mig %d %u %u\n", rc, cur, pend);
    rc = nvmlDeviceGetMaxMigDeviceCount(dev, &max);
    printf("max %d %u\n", rc, max);
    for (unsigned int i = 0; i <= max; i++) {
        nvmlDevice_t m;
        rc = nvmlDeviceGetMigDeviceHandleByIndex(dev, i, &m);
        if (rc != 0) { printf("mig %u rc %d\n", i, rc); continue; }
        unsigned int gi = 0, ci = 0, mode = 9;
        nvmlDeviceAttributes_t a;
        char uuid[96];
        nvmlDeviceGetGpuInstanceId(m, &gi);
        nvmlDeviceGetComputeInstanceId(m, &ci);
        nvmlDeviceGetAttributes_v2(m, &a);
        nvmlDeviceGetUUID(m, uuid, sizeof uuid);
        nvmlDeviceGetComputeMode(m, &mode);
        printf("mig %u gi %u ci %u sms %u gislices %u cislices %u mem %llu uuid %.4s mode %u\n", i, gi, ci,
               a.multiprocessorCount, a.gpuInstanceSliceCount, a.computeInstanceSliceCount, a.memorySizeMB, uuid, mode);
        if (i == 0) printf("set-mode %d\n", nvmlDeviceSetComputeMode(m, 3));
    }
    nvmlGpuInstanceProfileInfo_v2_t info;
    memset(&info, 0, sizeof info);
    info.version = nvmlGpuInstanceProfileInfo_v2;
    rc = nvmlDeviceGetGpuInstanceProfileInfoV(dev, 2, &info);
    printf("profile %d %u %u %u %llu %s\n", rc, info.id, info.sliceCount, info.instanceCount, info.memorySizeMB, info.name);
    nvmlGpuInstance_t gih;
    nvmlGpuInstanceInfo_t gii;
    rc = nvmlDeviceGetGpuInstanceById(dev, 2, &gih);
    printf("gi-by-id %d\n", rc);
    if (rc == 0) {
        nvmlGpuInstanceGetInfo(gih, &gii);
        printf("gi-info %u %u %u %u\n", gii.id, gii.profileId, gii.placement.start, gii.placement.size);
    }
    unsigned long cpus = 0, mems = 0;
    nvmlDevice_t numa;
    nvmlDeviceGetHandleByIndex_v2(1, &numa);
    int crc = nvmlDeviceGetCpuAffinityWithinScope(numa, 1, &cpus, 1);
    int mrc = nvmlDeviceGetMemoryAffinity(numa, 1, &mems, 0);
    printf("affinity %d %lx %d %lx\n", crc, cpus, mrc, mems);
    nvmlEventSet_t set;
    nvmlEventSetCreate(&set);
    nvmlDeviceRegisterEvents(dev, 8ULL, set);
    FILE *events = fopen(argv[2], "a");
    fputs("xid 4 31 gi 9 ci 0\n", events);
    fclose(events);
    nvmlEventData_t ev;
    memset(&ev, 0, sizeof ev);
    rc = nvmlEventSetWait_v2(set, &ev, 5000);
    printf("event %d dev %d data %llu gi %u ci %u\n", rc, ev.device == dev, ev.eventData, ev.gpuInstanceId, ev.computeInstanceId);
    printf("shutdown %d\n", nvmlShutdown());
    return 0;
}
"#;

fn compile(dir: &Path) -> Result<PathBuf, Failed> {
    compile_source(dir, "client", CLIENT)
}

fn compile_source(dir: &Path, name: &str, source: &str) -> Result<PathBuf, Failed> {
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src, source).map_err(|e| format!("write {}: {e}", src.display()))?;
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
    run_as(&mut Command::new(bin), node)
}

fn run_as(cmd: &mut Command, node: &SimNode) -> Result<Output, Failed> {
    let bin = format!("{cmd:?}");
    let out = cmd
        .arg(node.lib_path())
        .arg(node.events_path())
        .env_remove("NVML_SIM_CONFIG")
        .output()
        .map_err(|e| format!("run {bin}: {e}"))?;
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

/// The MIG layout, MIG-attributed XIDs, compute mode and affinity, as a C client sees them on
/// the mixed node (GPU 4: 3g.20gb GI 2, 2g.10gb GI 3, 1g.5gb GIs 9 and 10).
fn c_client_sees_the_mixed_mig_node() -> Result<(), Failed> {
    let mut json: serde_json::Value = serde_json::from_str(
        nvml_sim::TOPOLOGIES
            .iter()
            .find(|t| t.0 == "dgx-a100-mixed")
            .map(|t| t.1)
            .unwrap_or("{}"),
    )
    .map_err(|e| e.to_string())?;
    // GPU 1 gets the 2-CPU affinities of the numa-2cpu node, to check the scoped calls.
    json["gpus"][1]["cpu_affinity"] = "1".into();
    json["gpus"][1]["memory_affinity"] = "0".into();
    json["gpus"][1]["socket_affinity"] = serde_json::json!({"cpus": "0-1", "memory": "0"});
    let node = SimNode::from_json(&json.to_string());
    let bin = compile_source(node.dir(), "mig-client", MIG_CLIENT)?;
    let out = run(&bin, &node)?;
    expect_lines(
        &String::from_utf8_lossy(&out.stdout),
        &[
            "init 0",
            "mig 0 1 1",
            "max 0 7",
            "mig 0 gi 2 ci 0 sms 42 gislices 3 cislices 3 mem 19968 uuid MIG- mode 0",
            "set-mode 0",
            "mig 1 gi 3 ci 0 sms 28 gislices 2 cislices 2 mem 9856 uuid MIG- mode 0",
            "mig 2 gi 9 ci 0 sms 14 gislices 1 cislices 1 mem 4864 uuid MIG- mode 0",
            "mig 3 gi 10 ci 0 sms 14 gislices 1 cislices 1 mem 4864 uuid MIG- mode 0",
            "mig 4 rc 6",
            "mig 7 rc 2",
            "profile 0 9 3 2 19968 MIG 3g.20gb",
            "gi-by-id 0",
            "gi-info 2 9 4 4",
            "affinity 0 3 0 1",
            "event 0 dev 1 data 31 gi 9 ci 0",
            "shutdown 0",
        ],
    )
}

/// The same client as `nobody`: NVML's privileged calls answer `NO_PERMISSION` (4), the rest
/// work.
fn unprivileged_c_client_gets_no_permission() -> Result<(), Failed> {
    use std::os::unix::fs::PermissionsExt as _;
    let node = SimNode::shipped("dgx-a100-mixed");
    let bin = compile_source(node.dir(), "mig-client", MIG_CLIENT)?;
    std::fs::set_permissions(node.dir(), std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", node.dir().display()))?;
    std::fs::set_permissions(node.events_path(), std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("chmod events: {e}"))?;
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin);
    let out = run_as(&mut cmd, &node)?;
    expect_lines(
        &String::from_utf8_lossy(&out.stdout),
        &[
            "init 0",
            "max 0 7",
            "set-mode 4",
            "gi-by-id 4",
            "profile 0 9 3 2 19968 MIG 3g.20gb",
            "shutdown 0",
        ],
    )
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
        needs(
            &host,
            &[Need::Cc],
            Trial::test(
                "c_client_sees_the_mixed_mig_node",
                c_client_sees_the_mixed_mig_node,
            ),
        ),
        needs(
            &host,
            &[Need::Cc, Need::Root],
            Trial::test(
                "unprivileged_c_client_gets_no_permission",
                unprivileged_c_client_gets_no_permission,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
