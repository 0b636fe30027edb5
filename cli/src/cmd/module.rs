//! `mesos-gpu module build`: builds the mesos-agent module `libmesos_gpu_module.so` (the C++ shim
//! over `libmesos_gpu.so`) against the operator's Mesos install.
//!
//! A Mesos module must be compiled against the very Mesos, protobuf and compiler the agent runs,
//! so it cannot be shipped built: the package ships its sources instead. This command finds them
//! and the module library relative to its own executable, as the package lays them out
//! (`<exe dir>/../share/mesos-gpu/module/`, `<exe dir>/../include/mesos_gpu.h`,
//! `<exe dir>/../lib/mesos-gpu/libmesos_gpu.so`) or as a source checkout does
//! (`ffi/mesos-module/`, `ffi/include/`, `target/<profile>/`). It checks what the build needs
//! before starting it, then runs the shipped `CMakeLists.txt` (strict ISO C++17,
//! `-DPICOJSON_USE_INT64 -D__STDC_FORMAT_MACROS`, libmesos/protobuf/glog linked,
//! `--no-undefined`) in a scratch directory and copies the module to `--output`.
//!
//! Facts relied on (Mesos 1.12): a module is compiled against `<prefix>/include` (the generated
//! `mesos/mesos.pb.h` and `mesos/module/isolator.hpp`) and the third-party headers installed by
//! `--enable-install-module-dependencies` (`<prefix>/lib/mesos/3rdparty/include`, `picojson.h`
//! among them); `mesos.pb.h` names the protoc that generated it in its first version check
//! (`#if 3021012 < PROTOBUF_MIN_PROTOC_VERSION`), and the protobuf headers must be that version
//! (`GOOGLE_PROTOBUF_VERSION` in `google/protobuf/stubs/common.h`), or the module's messages are
//! not libmesos's classes.

use std::ffi::OsString;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context as _, bail};

use crate::ctx::Ctx;

/// The module library the build produces.
const MODULE_LIB: &str = "libmesos_gpu_module.so";
/// The Rust library the module links.
const GPU_LIB: &str = "libmesos_gpu.so";
/// The isolator's name in `modules.json` and `--isolation`.
const ISOLATOR_MODULE: &str = "org_apache_mesos_gpu_MesosGpuIsolator";
/// The sources' files: the shim and its build.
const SOURCES: [&str; 3] = ["CMakeLists.txt", "gpu_isolator.cpp", "gpu_docker_hook.cpp"];

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu module build --mesos-prefix /usr\n  \
    mesos-gpu module build --help")]
pub(crate) struct Args {
    #[command(subcommand)]
    command: ModuleCommand,
}

#[derive(clap::Subcommand)]
enum ModuleCommand {
    /// Build libmesos_gpu_module.so against a Mesos install, from the installed sources.
    Build(BuildArgs),
}

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu module build --mesos-prefix /usr\n  \
    mesos-gpu module build --mesos-prefix /opt/mesos --output /opt/mesos/modules\n  \
    mesos-gpu module build --mesos-prefix /opt/mesos --protobuf-include /opt/pb\n\n\
Needs: Mesos installed with --enable-install-module-dependencies, the protobuf headers of the \
protobuf Mesos was built with, a C++17 compiler ($CXX or c++), cmake, and the glog headers \
(Debian: apt-get install g++ cmake libprotobuf-dev libgoogle-glog-dev libgflags-dev).")]
struct BuildArgs {
    /// Install prefix of the Mesos the agent runs (holds include/mesos/ and lib/libmesos.so).
    #[arg(long, value_name = "DIR")]
    mesos_prefix: PathBuf,

    /// Directory to put libmesos_gpu_module.so in (made if missing); the default is where the
    /// shipped examples/mesos-agent/modules.json and `agent-flags` look for it.
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/mesos/modules")]
    output: PathBuf,

    /// Directory holding google/protobuf/: the headers of the protobuf Mesos was built with.
    #[arg(long, value_name = "DIR", default_value = "/usr/include")]
    protobuf_include: PathBuf,
}

pub(crate) fn run(args: &Args, _ctx: &Ctx) -> anyhow::Result<ExitCode> {
    match &args.command {
        ModuleCommand::Build(build) => {
            let plan = Plan::check(build)?;
            let module = plan.build()?;
            print_next_steps(&plan, &module)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Where the module's inputs are: the shipped sources, header and library.
#[derive(Debug)]
struct Shipped {
    /// The directory with `CMakeLists.txt` and the shim's `.cpp` files.
    sources: PathBuf,
    /// The directory with `mesos_gpu.h`.
    include: PathBuf,
    /// The directory with `libmesos_gpu.so`.
    lib: PathBuf,
}

impl Shipped {
    /// The package's layout around `exe_dir` (`/usr/bin`), else a source checkout's
    /// (`target/<profile>`); the error lists where it looked.
    fn find(exe_dir: &Path) -> anyhow::Result<Shipped> {
        let layouts = [
            Shipped {
                sources: exe_dir.join("../share/mesos-gpu/module"),
                include: exe_dir.join("../include"),
                lib: exe_dir.join("../lib/mesos-gpu"),
            },
            Shipped {
                sources: exe_dir.join("../../ffi/mesos-module"),
                include: exe_dir.join("../../ffi/include"),
                lib: exe_dir.to_path_buf(),
            },
        ];
        let complete = |s: &Shipped| {
            SOURCES.iter().all(|f| s.sources.join(f).is_file())
                && s.include.join("mesos_gpu.h").is_file()
                && s.lib.join(GPU_LIB).is_file()
        };
        if let Some(found) = layouts.into_iter().find(complete) {
            return Ok(Shipped {
                sources: canonical(&found.sources)?,
                include: canonical(&found.include)?,
                lib: canonical(&found.lib)?,
            });
        }
        bail!(
            "cannot find the module's sources beside {}: expected {} and {GPU_LIB} in {} (the \
             package's layout), or {} with {GPU_LIB} in {} (a source checkout's); reinstall the \
             mesos-gpu package",
            exe_dir.display(),
            SOURCES.join(", "),
            exe_dir.join("../share/mesos-gpu/module").display(),
            exe_dir.join("../../ffi/mesos-module").display(),
            exe_dir.display(),
        )
    }
}

fn canonical(path: &Path) -> anyhow::Result<PathBuf> {
    path.canonicalize()
        .with_context(|| format!("cannot resolve {}", path.display()))
}

/// Everything checked before the build starts.
struct Plan {
    shipped: Shipped,
    mesos_prefix: PathBuf,
    protobuf_include: PathBuf,
    protobuf_version: u32,
    output: PathBuf,
}

impl Plan {
    /// Checks the Mesos install, the protobuf headers, the compiler, cmake, then finds the
    /// shipped sources and library.
    fn check(args: &BuildArgs) -> anyhow::Result<Plan> {
        let prefix = &args.mesos_prefix;
        check_mesos(prefix)?;
        let protobuf_version = check_protobuf(prefix, &args.protobuf_include)?;
        check_compiler(&compiler())?;
        check_tool(Command::new("cmake").arg("--version"), "cmake", "cmake")?;
        let exe = std::env::current_exe().context("cannot find this executable's path")?;
        let exe_dir = exe.parent().unwrap_or(Path::new("/"));
        let shipped = Shipped::find(exe_dir)?;
        Ok(Plan {
            shipped,
            mesos_prefix: canonical(prefix)?,
            protobuf_include: canonical(&args.protobuf_include)?,
            protobuf_version,
            output: args.output.clone(),
        })
    }

    /// Configures and builds in a scratch directory; copies the module to the output directory
    /// and returns its path there.
    fn build(&self) -> anyhow::Result<PathBuf> {
        let scratch = tempfile::Builder::new()
            .prefix("mesos-gpu-module-build")
            .tempdir()
            .context("cannot make a scratch build directory")?;
        let build = scratch.path();
        eprintln!(
            "mesos-gpu: building {MODULE_LIB} against Mesos at {} (this takes a few minutes)",
            self.mesos_prefix.display()
        );
        let mut configure = Command::new("cmake");
        configure
            .arg("-S")
            .arg(&self.shipped.sources)
            .arg("-B")
            .arg(build)
            .arg("-DCMAKE_BUILD_TYPE=Release")
            // The module is used where it is built: no install rules, whose RPATH padding
            // leaves an empty entry (the agent's working directory) in it.
            .arg("-DMESOS_GPU_INSTALL_RULES=OFF")
            .arg(define("MESOS_PREFIX", &self.mesos_prefix))
            .arg(define("PROTOBUF_INCLUDE_DIR", &self.protobuf_include))
            .arg(define("MESOS_GPU_INCLUDE_DIR", &self.shipped.include))
            .arg(define("MESOS_GPU_LIB_DIR", &self.shipped.lib));
        run_step(&mut configure, "cmake (configure)")?;
        let jobs = std::thread::available_parallelism().map_or(1, usize::from);
        let mut compile = Command::new("cmake");
        compile
            .arg("--build")
            .arg(build)
            .args(["--parallel", &jobs.to_string()]);
        run_step(&mut compile, "cmake --build")?;
        let built = build.join(MODULE_LIB);
        if !built.is_file() {
            bail!("cmake --build succeeded but made no {}", built.display());
        }
        fs::create_dir_all(&self.output).with_context(|| {
            format!("cannot make the output directory {}", self.output.display())
        })?;
        let module = canonical(&self.output)?.join(MODULE_LIB);
        // Copied to a new file then renamed: a running agent keeps its mapping of the old one.
        let partial = module.with_extension("so.partial");
        fs::copy(&built, &partial)
            .with_context(|| format!("cannot copy {} to {}", built.display(), partial.display()))?;
        fs::rename(&partial, &module).with_context(|| {
            format!(
                "cannot rename {} to {}",
                partial.display(),
                module.display()
            )
        })?;
        Ok(module)
    }
}

fn define(name: &str, value: &Path) -> OsString {
    let mut arg = OsString::from(format!("-D{name}="));
    arg.push(value);
    arg
}

/// Runs a build step, its output kept and shown (its last lines) only when it fails.
fn run_step(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    if out.status.success() {
        return Ok(());
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    bail!(
        "{what} failed ({}):\n{}",
        out.status,
        lines[lines.len().saturating_sub(40)..].join("\n")
    )
}

/// The Mesos headers and library a module is built against.
fn check_mesos(prefix: &Path) -> anyhow::Result<()> {
    if !prefix.is_dir() {
        bail!(
            "--mesos-prefix {}: no such directory; expected the install prefix of the Mesos the \
             agent runs (holding include/mesos/ and lib/libmesos.so, e.g. /usr or /opt/mesos)",
            prefix.display()
        );
    }
    for header in ["mesos/mesos.pb.h", "mesos/module/isolator.hpp"] {
        let path = prefix.join("include").join(header);
        if !path.is_file() {
            bail!(
                "--mesos-prefix {}: no {}; expected a Mesos install prefix with its headers \
                 (make install of Mesos installs them; a Debian/RPM install needs its -dev package)",
                prefix.display(),
                path.display()
            );
        }
    }
    let picojson = prefix.join("lib/mesos/3rdparty/include/picojson.h");
    if !picojson.is_file() {
        bail!(
            "--mesos-prefix {}: no {}: Mesos must be installed with \
             --enable-install-module-dependencies (configure flag), which installs the \
             third-party headers modules are built against",
            prefix.display(),
            picojson.display()
        );
    }
    let libmesos = prefix.join("lib/libmesos.so");
    if !libmesos.exists() {
        bail!(
            "--mesos-prefix {}: no {}; expected the Mesos library the agent loads there",
            prefix.display(),
            libmesos.display()
        );
    }
    Ok(())
}

/// The protobuf version Mesos's generated headers were made for, equal to the headers' own.
fn check_protobuf(prefix: &Path, include: &Path) -> anyhow::Result<u32> {
    let pb_h = prefix.join("include/mesos/mesos.pb.h");
    let text =
        fs::read_to_string(&pb_h).with_context(|| format!("cannot read {}", pb_h.display()))?;
    let Some(mesos) = protoc_version(&text) else {
        bail!(
            "{} names no protoc version (no `#if N < PROTOBUF_MIN_PROTOC_VERSION` line): is it a \
             header generated by protoc?",
            pb_h.display()
        );
    };
    let common = include.join("google/protobuf/stubs/common.h");
    let text = fs::read_to_string(&common).with_context(|| {
        format!(
            "--protobuf-include {}: cannot read {}; expected the headers of protobuf {} (the \
             version Mesos was built with; Debian: apt-get install libprotobuf-dev)",
            include.display(),
            common.display(),
            dotted(mesos)
        )
    })?;
    let Some(headers) = protobuf_headers_version(&text) else {
        bail!(
            "{} defines no GOOGLE_PROTOBUF_VERSION: is --protobuf-include {} a protobuf include \
             directory?",
            common.display(),
            include.display()
        );
    };
    if headers != mesos {
        bail!(
            "--protobuf-include {}: protobuf {} headers, but Mesos was built with protobuf {} \
             ({}); point --protobuf-include at the headers of protobuf {}",
            include.display(),
            dotted(headers),
            dotted(mesos),
            pb_h.display(),
            dotted(mesos)
        );
    }
    Ok(mesos)
}

/// The version in `#if 3021012 < PROTOBUF_MIN_PROTOC_VERSION`, protoc's check in a `.pb.h`.
fn protoc_version(pb_h: &str) -> Option<u32> {
    pb_h.lines().find_map(|line| {
        let rest = line.strip_prefix("#if ")?;
        let (number, check) = rest.split_once(" < ")?;
        (check.trim() == "PROTOBUF_MIN_PROTOC_VERSION")
            .then(|| number.trim().parse().ok())
            .flatten()
    })
}

/// The version in `#define GOOGLE_PROTOBUF_VERSION 3021012`.
fn protobuf_headers_version(common_h: &str) -> Option<u32> {
    common_h.lines().find_map(|line| {
        let rest = line.strip_prefix("#define GOOGLE_PROTOBUF_VERSION")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// `3021012` as `3.21.12`.
fn dotted(version: u32) -> String {
    format!(
        "{}.{}.{}",
        version / 1_000_000,
        version / 1000 % 1000,
        version % 1000
    )
}

/// The C++ compiler cmake uses: `$CXX`, else `c++`.
fn compiler() -> OsString {
    std::env::var_os("CXX")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "c++".into())
}

/// `compiler` compiles strict ISO C++17 (the standard Mesos's headers are compiled in).
fn check_compiler(compiler: &OsString) -> anyhow::Result<()> {
    let name = compiler.to_string_lossy();
    let mut child = Command::new(compiler)
        .args(["-std=c++17", "-fsyntax-only", "-x", "c++", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "cannot run the C++ compiler {name}: install a C++17 compiler (Debian: apt-get \
                 install g++) or set CXX"
            )
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(b"#include <optional>\nstd::optional<int> probe;\n")
            .with_context(|| format!("cannot write to {name}"))?;
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("cannot run the C++ compiler {name}"))?;
    if !out.status.success() {
        bail!(
            "the C++ compiler {name} does not compile C++17 (-std=c++17): {}; install a newer \
             compiler (GCC >= 7) or set CXX",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `cmd` runs and succeeds.
fn check_tool(cmd: &mut Command, name: &str, package: &str) -> anyhow::Result<()> {
    let ok = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!("{name} is missing or does not run: install it (Debian: apt-get install {package})");
    }
    Ok(())
}

/// Prints where the module is and how the agent loads it (stdout).
fn print_next_steps(plan: &Plan, module: &Path) -> anyhow::Result<()> {
    let modules = serde_json::json!({
        "libraries": [{
            "file": module.display().to_string(),
            "modules": [{
                "name": ISOLATOR_MODULE,
                "parameters": [
                    { "key": "work_dir", "value": "/var/lib/mesos" },
                    { "key": "pool_dir", "value": "/var/lib/mesos-gpu" },
                ],
            }],
        }],
    });
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "built {} (Mesos at {}, protobuf {}); it loads {GPU_LIB} from {}",
        module.display(),
        plan.mesos_prefix.display(),
        dotted(plan.protobuf_version),
        plan.shipped.lib.display()
    )?;
    writeln!(
        out,
        "\nNext: give the agent --modules=file://<this JSON> (work_dir is the agent's --work_dir)"
    )?;
    serde_json::to_writer_pretty(&mut out, &modules)?;
    writeln!(
        out,
        "\nand add {ISOLATOR_MODULE} to its --isolation; `mesos-gpu agent-flags --module-library \
         {}` prints every flag.",
        module.display()
    )?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests: a failed fixture write is a failed test.
mod tests {
    use super::*;

    #[test]
    fn reads_the_protoc_version_of_a_generated_header() {
        let pb_h = "#include <limits>\n#include <google/protobuf/port_def.inc>\n\
                    #if PROTOBUF_VERSION < 3021000\n#error old\n#endif\n\
                    #if 3021012 < PROTOBUF_MIN_PROTOC_VERSION\n#error new\n#endif\n";
        assert_eq!(protoc_version(pb_h), Some(3_021_012));
        assert_eq!(protoc_version("#if X < Y\n"), None);
    }

    #[test]
    fn reads_the_protobuf_headers_version() {
        let common = "#define GOOGLE_PROTOBUF_VERSION 3021012\n#define GOOGLE_PROTOBUF_VERSION_SUFFIX \"\"\n";
        assert_eq!(protobuf_headers_version(common), Some(3_021_012));
        assert_eq!(dotted(3_021_012), "3.21.12");
    }

    #[test]
    fn finds_the_packaged_layout_then_the_source_checkout() {
        let root = tempfile::tempdir().unwrap();
        let usr = root.path().join("usr");
        let bin = usr.join("bin");
        fs::create_dir_all(&bin).unwrap();
        assert!(Shipped::find(&bin).is_err());
        fs::create_dir_all(usr.join("share/mesos-gpu/module")).unwrap();
        for f in SOURCES {
            fs::write(usr.join("share/mesos-gpu/module").join(f), "").unwrap();
        }
        fs::create_dir_all(usr.join("lib/mesos-gpu")).unwrap();
        fs::write(usr.join("lib/mesos-gpu").join(GPU_LIB), "").unwrap();
        fs::create_dir_all(usr.join("include")).unwrap();
        let err = Shipped::find(&bin).unwrap_err().to_string();
        assert!(err.contains("share/mesos-gpu/module"), "{err}");
        fs::write(usr.join("include/mesos_gpu.h"), "").unwrap();
        let found = Shipped::find(&bin).unwrap();
        let usr = usr.canonicalize().unwrap();
        assert_eq!(found.sources, usr.join("share/mesos-gpu/module"));
        assert_eq!(found.lib, usr.join("lib/mesos-gpu"));
    }
}
