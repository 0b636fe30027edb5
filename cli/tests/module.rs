//! Issue 37: the Debian package ships the module's C++ sources, and its `mesos-gpu module build`
//! builds `libmesos_gpu_module.so` from them against the operator's Mesos (the real Mesos 1.12
//! install in `shared/mesos`, found as the real-agent tests find it). The package is this
//! checkout's `scripts/package.sh --profile dev`, unpacked into a scratch root (`dpkg-deb -x`):
//! the installed binary finds the sources and `libmesos_gpu.so` relative to itself, as it does
//! under `/usr`. What a downgrade, `dpkg --remove` and `--purge` leave on disk is checked in a
//! scratch dpkg root (`dpkg --root`): what the operator guide's "Removing the package" says.
//!
//! The refusals (no third-party headers, a protobuf that is not Mesos's) need only this build's
//! binary and fake prefixes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};
use std::sync::OnceLock;

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::mesos::{
    Agent, AgentCgroups, AgentSpec, DOCKER_HOOK_MODULE, DevNodes, ISOLATOR_MODULE, Master,
    MesosInstall, modules_json,
};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};

type TestResult = Result<(), Failed>;

fn main() -> ExitCode {
    let host = Host::probe();
    let trials = vec![
        Trial::test(
            "module_build_refuses_a_mesos_without_its_module_headers",
            refuses_a_mesos_without_module_headers,
        ),
        Trial::test(
            "module_build_refuses_protobuf_headers_mesos_was_not_built_with",
            refuses_another_protobuf,
        ),
        Trial::test(
            "module_build_refuses_a_missing_compiler",
            refuses_a_missing_compiler,
        ),
        needs(
            &host,
            &[Need::Dpkg, Need::Cc, Need::Mesos],
            Trial::test(
                "the_installed_package_builds_the_module_against_the_real_mesos",
                installed_package_builds_the_module,
            ),
        ),
        needs(
            &host,
            &[Need::Root, Need::Cgroup1, Need::Dpkg, Need::Cc, Need::Mesos],
            Trial::test(
                "the_module_built_from_the_package_loads_in_a_real_agent",
                module_from_the_package_loads_in_a_real_agent,
            ),
        ),
        needs(
            &host,
            &[Need::Root, Need::Dpkg],
            Trial::test(
                "downgrade_and_remove_keep_the_conffile_and_purge_keeps_only_what_the_node_made",
                remove_and_purge_leave_what_the_guide_says,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what} failed ({}):\n{}", out.status, text(&out)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// This checkout's package (`scripts/package.sh --profile dev`), built once per process.
fn this_deb() -> Result<PathBuf, Failed> {
    static DEB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = DEB.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("module-deb");
        let mut build = Command::new(repo().join("scripts/package.sh"));
        build.args(["--profile", "dev", "--output"]).arg(&out);
        // Only what cargo needs: `cargo test`'s variables describe this crate.
        for (key, _) in std::env::vars() {
            if key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR" {
                build.env_remove(key);
            }
        }
        let printed = run(&mut build, "scripts/package.sh --profile dev")?;
        let deb = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
        if deb.is_file() {
            Ok(deb)
        } else {
            Err(format!("scripts/package.sh printed no package: {printed}"))
        }
    });
    Ok(built.clone()?)
}

/// A fake Mesos prefix with the headers `module build` looks at; `picojson` adds the
/// third-party headers, `protoc` is the version its `mesos.pb.h` names.
fn fake_prefix(dir: &Path, picojson: bool, protoc: u32) -> PathBuf {
    let prefix = dir.join("mesos");
    fs::create_dir_all(prefix.join("include/mesos/module")).unwrap();
    fs::write(
        prefix.join("include/mesos/mesos.pb.h"),
        format!("#if {protoc} < PROTOBUF_MIN_PROTOC_VERSION\n#error\n#endif\n"),
    )
    .unwrap();
    fs::write(prefix.join("include/mesos/module/isolator.hpp"), "").unwrap();
    fs::create_dir_all(prefix.join("lib/mesos/3rdparty/include")).unwrap();
    fs::write(prefix.join("lib/libmesos.so"), "").unwrap();
    if picojson {
        fs::write(prefix.join("lib/mesos/3rdparty/include/picojson.h"), "").unwrap();
    }
    prefix
}

fn module_build(prefix: &Path, extra: &[&Path]) -> Output {
    let out = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
    cmd.args(["module", "build", "--mesos-prefix"])
        .arg(prefix)
        .arg("--output")
        .arg(out.path());
    for (flag, value) in ["--protobuf-include"].iter().zip(extra) {
        cmd.arg(flag).arg(value);
    }
    cmd.output().unwrap()
}

fn refuses_a_mesos_without_module_headers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let prefix = fake_prefix(dir.path(), false, 3_021_012);
    let out = module_build(&prefix, &[]);
    let said = text(&out);
    if out.status.success()
        || !said.contains("picojson.h")
        || !said.contains("--enable-install-module-dependencies")
    {
        return Err(
            format!("expected a refusal naming picojson.h and the configure flag: {said}").into(),
        );
    }
    let out = module_build(&dir.path().join("nowhere"), &[]);
    let said = text(&out);
    if out.status.success() || !said.contains("nowhere: no such directory") {
        return Err(format!("expected a refusal naming the missing prefix: {said}").into());
    }
    Ok(())
}

/// Protobuf headers of `version` (as `GOOGLE_PROTOBUF_VERSION` spells it) under `dir/protobuf`.
fn fake_protobuf(dir: &Path, version: &str) -> std::io::Result<PathBuf> {
    let protobuf = dir.join("protobuf");
    fs::create_dir_all(protobuf.join("google/protobuf/stubs"))?;
    fs::write(
        protobuf.join("google/protobuf/stubs/common.h"),
        format!("#define GOOGLE_PROTOBUF_VERSION {version}\n"),
    )?;
    Ok(protobuf)
}

fn refuses_another_protobuf() -> TestResult {
    let dir = tempfile::tempdir()?;
    let prefix = fake_prefix(dir.path(), true, 3_021_012);
    let protobuf = fake_protobuf(dir.path(), "3012004")?;
    let out = module_build(&prefix, &[&protobuf]);
    let said = text(&out);
    if out.status.success()
        || !said.contains("protobuf 3.12.4 headers, but Mesos was built with protobuf 3.21.12")
    {
        return Err(format!("expected a refusal naming both protobuf versions: {said}").into());
    }
    Ok(())
}

/// The package unpacked into a scratch root and the module its `mesos-gpu module build` built.
struct Installed {
    /// The scratch root the package is unpacked in.
    root: PathBuf,
    /// The module built.
    module: PathBuf,
}

/// This checkout's package unpacked (`dpkg-deb -x`) under the target's scratch directory, and
/// the module built by its `mesos-gpu module build` against the real Mesos; once per process.
fn installed() -> Result<&'static Installed, Failed> {
    static BUILT: OnceLock<Result<Installed, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let mesos = MesosInstall::locate()?;
        let deb = this_deb().map_err(|e| format!("{e:?}"))?;
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("module-installed");
        if scratch.exists() {
            fs::remove_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        }
        fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        let root = scratch.join("root");
        run(
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
            "dpkg-deb -x",
        )?;
        for f in ["CMakeLists.txt", "gpu_isolator.cpp", "gpu_docker_hook.cpp"] {
            let shipped = fs::read(root.join("usr/share/mesos-gpu/module").join(f));
            let source = fs::read(repo().join("ffi/mesos-module").join(f));
            if shipped.ok() != source.ok() {
                return Err(format!(
                    "/usr/share/mesos-gpu/module/{f} is not ffi/mesos-module/{f}"
                ));
            }
        }
        let output = scratch.join("modules");
        let printed = run(
            Command::new(root.join("usr/bin/mesos-gpu"))
                .args(["module", "build", "--mesos-prefix"])
                .arg(mesos.prefix())
                .arg("--output")
                .arg(&output),
            "the installed mesos-gpu module build",
        )?;
        let module = output.join("libmesos_gpu_module.so");
        let module = module
            .canonicalize()
            .map_err(|e| format!("no {} ({e}) after: {printed}", module.display()))?;
        let lib_dir = root
            .join("usr/lib/mesos-gpu")
            .canonicalize()
            .map_err(|e| format!("usr/lib/mesos-gpu: {e}"))?;
        if !printed.contains(&module.display().to_string())
            || !printed.contains(ISOLATOR_MODULE)
            || !printed.contains(&lib_dir.display().to_string())
        {
            return Err(format!(
                "the output names the module, its modules.json entry and where \
                 libmesos_gpu.so is: {printed}"
            ));
        }
        Ok(Installed { root, module })
    });
    built.as_ref().map_err(|e| Failed::from(e.as_str()))
}

fn refuses_a_missing_compiler() -> TestResult {
    let dir = tempfile::tempdir()?;
    let prefix = fake_prefix(dir.path(), true, 3_021_012);
    let protobuf = fake_protobuf(dir.path(), "3021012")?;
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["module", "build", "--mesos-prefix"])
        .arg(&prefix)
        .arg("--protobuf-include")
        .arg(&protobuf)
        .arg("--output")
        .arg(dir.path().join("out"))
        .env("CXX", "/nonexistent/c++")
        .output()?;
    let said = text(&out);
    if out.status.success() || !said.contains("cannot run the C++ compiler /nonexistent/c++") {
        return Err(format!("expected a refusal naming the compiler: {said}").into());
    }
    if dir.path().join("out").exists() {
        return Err("a refused build made its output directory".into());
    }
    Ok(())
}

fn installed_package_builds_the_module() -> TestResult {
    let mesos = MesosInstall::locate()?;
    let Installed { root, module } = installed()?;
    let lib_dir = root.join("usr/lib/mesos-gpu").canonicalize()?;
    // Mesos looks each module's name up as a dynamic symbol of the library.
    let symbols = run(
        Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(module),
        "nm -D",
    )?;
    for name in [ISOLATOR_MODULE, DOCKER_HOOK_MODULE] {
        if !symbols
            .lines()
            .any(|l| l.split_whitespace().last() == Some(name))
        {
            return Err(format!("{} does not export {name}", module.display()).into());
        }
    }
    // Its RUNPATH names the package's and Mesos's library directories and no empty entry (the
    // working directory: CMake's padding for an install rewrite left one, a library anyone
    // could drop beside the agent's cwd loaded into a root process).
    let dynamic = run(Command::new("readelf").arg("-d").arg(module), "readelf -d")?;
    let runpath = dynamic
        .lines()
        .find(|l| l.contains("(RUNPATH)") || l.contains("(RPATH)"))
        .and_then(|l| l.split_once('[')?.1.strip_suffix(']'))
        .ok_or_else(|| format!("no RUNPATH in {}:\n{dynamic}", module.display()))?
        .to_owned();
    if runpath.split(':').any(str::is_empty) {
        return Err(
            format!("RUNPATH {runpath:?} has an empty entry (the working directory)").into(),
        );
    }
    // Every library resolves with Mesos's on the path, libmesos_gpu.so from the package's.
    let mesos_lib = mesos.prefix().join("lib");
    let ldd = run(
        Command::new("ldd")
            .arg(module)
            .env("LD_LIBRARY_PATH", &mesos_lib),
        "ldd",
    )?;
    let gpu_lib = lib_dir.join("libmesos_gpu.so");
    if ldd.contains("not found") || !ldd.contains(&gpu_lib.display().to_string()) {
        return Err(format!(
            "ldd of the module, libmesos_gpu.so from {}:\n{ldd}",
            gpu_lib.display()
        )
        .into());
    }
    // And it loads, every symbol bound now, as the agent's dlopen does.
    let loaded = run(
        Command::new("python3")
            .args([
                "-c",
                "import ctypes, os, sys\n\
                 lib = ctypes.CDLL(sys.argv[1], os.RTLD_NOW | os.RTLD_GLOBAL)\n\
                 getattr(lib, sys.argv[2])\n\
                 print('loaded')",
            ])
            .arg(module)
            .arg(ISOLATOR_MODULE)
            .env("LD_LIBRARY_PATH", &mesos_lib),
        "dlopen of the module",
    )?;
    if loaded.trim() != "loaded" {
        return Err(format!("dlopen of the module printed: {loaded}").into());
    }
    Ok(())
}

/// `dpkg` on the scratch root `root`, its maintainer scripts run outside it (the root holds no
/// shell) with `stubs` first on `PATH`: the scripts' `deb-systemd-helper`, `deb-systemd-invoke`
/// and `systemctl` only record their arguments there, so nothing reaches the host's systemd.
fn dpkg(root: &Path, stubs: &Path, args: &[&str]) -> Result<String, Failed> {
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", stubs.display());
    Ok(run(
        Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["--force-script-chrootless", "--force-depends"])
            .args(args)
            .env("PATH", path),
        &format!("dpkg {}", args.join(" ")),
    )?)
}

/// `deb` repacked as version 0.0.1-1 (fast gzip), in `dir`.
fn older_copy(deb: &Path, dir: &Path) -> Result<PathBuf, String> {
    let tree = dir.join("older");
    run(
        Command::new("dpkg-deb").arg("-R").arg(deb).arg(&tree),
        "dpkg-deb -R",
    )?;
    let control = tree.join("DEBIAN/control");
    let text = fs::read_to_string(&control).map_err(|e| format!("{}: {e}", control.display()))?;
    let older: String = text
        .lines()
        .map(|l| {
            if l.starts_with("Version:") {
                "Version: 0.0.1-1\n".to_owned()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    fs::write(&control, older).map_err(|e| format!("{}: {e}", control.display()))?;
    let out = dir.join("mesos-gpu_0.0.1-1_amd64.deb");
    run(
        Command::new("dpkg-deb")
            .args(["-Zgzip", "-z1", "--build"])
            .arg(&tree)
            .arg(&out),
        "dpkg-deb --build",
    )?;
    fs::remove_dir_all(&tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    Ok(out)
}

/// Every file and symlink under `root` but dpkg's own database and log, relative to `root`.
fn files_under(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            if rel == "var/lib/dpkg" || rel == "var/log" {
                continue;
            }
            if path.is_dir() && !path.is_symlink() {
                walk(root, &path, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// The package installed into a scratch dpkg root, with what a node accumulates beside it (the
/// conffile edited, the GPU pool, the agent's checkpoint, the module the operator built); an
/// older version installed over it (`--force-confold`) keeps all of them; `dpkg --remove` leaves the edited conffile and those files, `dpkg --purge` all but the
/// conffile, and the unit's systemd state is masked at removal and purged at purge: what the
/// operator guide's "Removing the package" says.
/// The module built from the package loads in a real `mesos-agent` (cgroup v1, Mesos's
/// `cgroups/devices` and the module in `--isolation`) on a simulated 8-GPU node, which
/// registers advertising the node's GPUs.
fn module_from_the_package_loads_in_a_real_agent() -> TestResult {
    let mesos = MesosInstall::locate()?;
    mesos.check_runs()?;
    let Installed { module, .. } = installed()?;
    let sim = SimNode::shipped("dgx1-v100");
    let minors: Vec<u32> = sim.inventory()?.gpus.iter().map(|g| g.minor).collect();
    let dev = DevNodes::nvidia(&minors)?;
    let scratch = tempfile::Builder::new()
        .prefix("mgpu-module-agent")
        .tempdir()?;
    let master = Master::start(&mesos)?;
    let isolation = format!("filesystem/linux,cgroups/devices,{ISOLATOR_MODULE}");
    let mut spec = AgentSpec::new(&isolation, AgentCgroups::V1, u32::try_from(minors.len())?);
    let params: Vec<(String, String)> = vec![
        (
            "work_dir".into(),
            scratch.path().join("work").display().to_string(),
        ),
        (
            "pool_dir".into(),
            scratch.path().join("pool").display().to_string(),
        ),
        ("dev_root".into(), dev.path().display().to_string()),
        ("proc_root".into(), sim.proc_root().display().to_string()),
        ("driver_volume".into(), "off".into()),
        ("cgroups_root".into(), spec.cgroups_root.clone()),
    ];
    let modules = scratch.path().join("modules.json");
    fs::write(&modules, modules_json(module, &params).to_string())?;
    spec.modules = Some(modules);
    spec.env
        .push(("LD_LIBRARY_PATH".into(), sim.dir().display().to_string()));
    let agent = Agent::start(&mesos, &master, spec)?;
    let log = agent.log();
    if !log.contains("Registered with master") {
        return Err(format!("the agent did not register:\n{log}").into());
    }
    Ok(())
}

fn remove_and_purge_leave_what_the_guide_says() -> TestResult {
    let deb = this_deb()?;
    let scratch = tempfile::Builder::new()
        .prefix("mgpu-module-dpkg")
        .tempdir()?;
    let root = scratch.path().join("root");
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log"] {
        fs::create_dir_all(root.join(dir))?;
    }
    fs::write(root.join("var/lib/dpkg/status"), "")?;
    let stubs = scratch.path().join("stubs");
    fs::create_dir_all(&stubs)?;
    let calls = scratch.path().join("calls");
    for tool in ["deb-systemd-helper", "deb-systemd-invoke", "systemctl"] {
        let stub = stubs.join(tool);
        fs::write(
            &stub,
            format!("#!/bin/sh\necho \"{tool} $*\" >> '{}'\n", calls.display()),
        )?;
        run(Command::new("chmod").arg("755").arg(&stub), "chmod")?;
    }
    dpkg(&root, &stubs, &["--install", &deb.display().to_string()])?;
    for shipped in [
        "usr/bin/mesos-gpu",
        "usr/lib/mesos-gpu/libmesos_gpu.so",
        "usr/share/mesos-gpu/module/CMakeLists.txt",
        "etc/default/mesos-gpu",
    ] {
        if !root.join(shipped).is_file() {
            return Err(format!("dpkg --install installed no /{shipped}").into());
        }
    }
    let conffile = root.join("etc/default/mesos-gpu");
    let edited = format!("{}# edited on this node\n", fs::read_to_string(&conffile)?);
    fs::write(&conffile, &edited)?;
    let operators = [
        "var/lib/mesos-gpu/gpu/pool.json",
        "var/lib/mesos/gpu/allocations.json",
        "usr/lib/mesos/modules/libmesos_gpu_module.so",
    ];
    for file in operators {
        let path = root.join(file);
        fs::create_dir_all(path.parent().unwrap())?;
        fs::write(&path, "made on the node")?;
    }

    // An older version installed over this one, as the guide installs any package (this package
    // repacked as 0.0.1-1: what dpkg does on a downgrade, not what an older release's code does).
    let older = older_copy(&deb, scratch.path())?;
    dpkg(
        &root,
        &stubs,
        &["--force-confold", "--install", &older.display().to_string()],
    )?;
    let version = run(
        Command::new("dpkg-query")
            .arg(format!(
                "--admindir={}",
                root.join("var/lib/dpkg").display()
            ))
            .args(["-W", "-f", "${Version}", "mesos-gpu"]),
        "dpkg-query",
    )?;
    if version != "0.0.1-1" {
        return Err(format!("after the downgrade dpkg-query says version {version:?}").into());
    }
    if fs::read_to_string(&conffile)? != edited {
        return Err("the downgrade changed the edited /etc/default/mesos-gpu".into());
    }
    let now = files_under(&root);
    for file in operators {
        if !now.iter().any(|f| f == file) {
            return Err(format!("the downgrade removed /{file}").into());
        }
    }
    if let Some(stray) = now.iter().find(|f| f.contains(".dpkg-")) {
        return Err(format!("the downgrade left /{stray}").into());
    }

    dpkg(&root, &stubs, &["--remove", "mesos-gpu"])?;
    let mut expected: Vec<String> = operators.iter().map(|f| (*f).to_owned()).collect();
    expected.push("etc/default/mesos-gpu".to_owned());
    expected.sort();
    let left = files_under(&root);
    if left != expected {
        return Err(format!("after dpkg --remove: {left:?}, expected {expected:?}").into());
    }
    if fs::read_to_string(&conffile)? != edited {
        return Err("dpkg --remove changed the edited /etc/default/mesos-gpu".into());
    }
    dpkg(&root, &stubs, &["--purge", "mesos-gpu"])?;
    let left = files_under(&root);
    expected.retain(|f| f != "etc/default/mesos-gpu");
    if left != expected {
        return Err(format!("after dpkg --purge: {left:?}, expected {expected:?}").into());
    }
    let called = fs::read_to_string(&calls).unwrap_or_default();
    for call in [
        "deb-systemd-helper mask mesos-gpu.service",
        "deb-systemd-helper purge mesos-gpu.service",
    ] {
        if !called.lines().any(|l| l == call) {
            return Err(format!(
                "the maintainer scripts did not run `{call}`; they ran:\n{called}"
            )
            .into());
        }
    }
    Ok(())
}
