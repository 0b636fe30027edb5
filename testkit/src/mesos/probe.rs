//! Device nodes made with `mknod` and a static probe that reports, from inside a task, which
//! of them it can open.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use super::{MesosResult, run};

/// Device nodes in a private directory: `nvidia<minor>` (c 195:minor), `nvidiactl`
/// (c 195:255), `nvidia-uvm` (c 240:0) and `nvidia-uvm-tools` (c 240:1). Opening one gives
/// `ENXIO` when the device cgroup allows it (no driver behind it) and `EPERM` when it denies it.
#[derive(Debug)]
pub struct DevNodes {
    dir: TempDir,
}

impl DevNodes {
    /// Makes the nodes of GPUs with `minors` and the control nodes.
    pub fn nvidia(minors: &[u32]) -> MesosResult<DevNodes> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-mesos-dev")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let mut specs: Vec<(String, u32, u32)> = minors
            .iter()
            .map(|m| (format!("nvidia{m}"), 195, *m))
            .collect();
        specs.push(("nvidiactl".into(), 195, 255));
        specs.push(("nvidia-uvm".into(), 240, 0));
        specs.push(("nvidia-uvm-tools".into(), 240, 1));
        for (name, major, minor) in specs {
            let path = dir.path().join(&name);
            run(
                Command::new("mknod").arg(&path).args([
                    "c",
                    &major.to_string(),
                    &minor.to_string(),
                ]),
                "mknod",
            )?;
        }
        Ok(DevNodes { dir })
    }

    /// The directory holding the nodes.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The probe's C source: opens every `nvidia*` node in a directory and prints one line per
/// node (`<phase> <node> ENXIO|EPERM|OPEN|<error>`), then `env` lines and the process's cgroups.
/// With a second argument it waits for that file to exist and probes again (phase `after`).
const PROBE_C: &str = r#"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int cmp(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }
static void probe(const char* dir, const char* phase) {
  DIR* d = opendir(dir);
  if (!d) { printf("%s opendir %s\n", phase, strerror(errno)); return; }
  char* names[256]; int n = 0; struct dirent* e;
  while ((e = readdir(d)) && n < 256)
    if (strncmp(e->d_name, "nvidia", 6) == 0) names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, n, sizeof(char*), cmp);
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    int fd = open(path, O_RDONLY);
    int err = errno;
    if (fd >= 0) { close(fd); printf("%s %s OPEN\n", phase, names[i]); }
    else printf("%s %s %s\n", phase, names[i],
                err == ENXIO ? "ENXIO" : err == EPERM ? "EPERM" : strerror(err));
  }
  fflush(stdout);
}
static void env(const char* name) {
  const char* v = getenv(name);
  printf("env %s=%s\n", name, v ? v : "(unset)");
}
int main(int argc, char** argv) {
  if (argc < 2) { fprintf(stderr, "usage: probe DEV_DIR [GO_FILE]\n"); return 2; }
  probe(argv[1], "before");
  env("NVIDIA_VISIBLE_DEVICES");
  env("MESOS_GPU_SHARE");
  env("MESOS_GPU_SHARING");
  env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
  env("CUDA_VISIBLE_DEVICES");
  FILE* f = fopen("/proc/self/cgroup", "r");
  char line[4096];
  while (f && fgets(line, sizeof line, f)) printf("cgroup %s", line);
  if (f) fclose(f);
  fflush(stdout);
  if (argc > 2) {
    printf("waiting for %s\n", argv[2]);
    fflush(stdout);
    while (access(argv[2], F_OK) != 0) usleep(50000);
    probe(argv[1], "after");
  }
  return 0;
}
"#;

/// Builds the static probe into `dir`. The binary is compiled under a name of this process's and
/// renamed into place: tasks of other test processes may be running `dir/probe` meanwhile, and
/// writing over it in place would make their `exec` fail (`ETXTBSY`) or run a half-written file.
pub fn build_probe(dir: &Path) -> MesosResult<PathBuf> {
    let id = std::process::id();
    let src = dir.join(format!("probe-{id}.c"));
    fs::write(&src, PROBE_C).map_err(|e| format!("{}: {e}", src.display()))?;
    let built = dir.join(format!("probe-{id}"));
    let compiled = run(
        Command::new("cc")
            .args(["-std=c11", "-D_DEFAULT_SOURCE", "-O1", "-static", "-o"])
            .arg(&built)
            .arg(&src),
        "cc (probe)",
    );
    let _ = fs::remove_file(&src);
    compiled?;
    let exe = dir.join("probe");
    fs::rename(&built, &exe)
        .map_err(|e| format!("rename {} to {}: {e}", built.display(), exe.display()))?;
    Ok(exe)
}

/// What a probe printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeReport {
    /// Node name → outcome, first probe.
    pub before: BTreeMap<String, String>,
    /// Node name → outcome, second probe (after the go file appeared).
    pub after: BTreeMap<String, String>,
    /// Environment variables printed.
    pub env: BTreeMap<String, String>,
    /// `/proc/self/cgroup` lines.
    pub cgroups: Vec<String>,
}

impl ProbeReport {
    /// Parses a probe's stdout.
    pub fn parse(text: &str) -> ProbeReport {
        let mut report = ProbeReport::default();
        for line in text.lines() {
            let mut words = line.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("before"), Some(node), Some(outcome)) => {
                    report.before.insert(node.into(), outcome.into());
                }
                (Some("after"), Some(node), Some(outcome)) => {
                    report.after.insert(node.into(), outcome.into());
                }
                (Some("env"), Some(kv), None) => {
                    if let Some((k, v)) = kv.split_once('=') {
                        report.env.insert(k.into(), v.into());
                    }
                }
                (Some("cgroup"), Some(a), b) => report
                    .cgroups
                    .push(b.map_or_else(|| a.to_owned(), |b| format!("{a} {b}"))),
                _ => {}
            }
        }
        report
    }

    /// The GPU minors the first (or, with `after`, the second) probe could open (`ENXIO`).
    pub fn gpus(&self, after: bool) -> Vec<u32> {
        let map = if after { &self.after } else { &self.before };
        map.iter()
            .filter(|(_, outcome)| *outcome == "ENXIO")
            .filter_map(|(node, _)| node.strip_prefix("nvidia")?.parse().ok())
            .collect()
    }

    /// The outcome for `node` in the first probe.
    pub fn outcome(&self, node: &str) -> Option<&str> {
        self.before.get(node).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_output_parses() {
        let r = ProbeReport::parse(
            "before nvidia0 ENXIO\nbefore nvidia1 EPERM\nbefore nvidiactl ENXIO\n\
             env NVIDIA_VISIBLE_DEVICES=GPU-a\nenv CUDA_VISIBLE_DEVICES=(unset)\n\
             cgroup 0::/m/c/leaf\nwaiting for /x\nafter nvidia0 ENXIO\n",
        );
        assert_eq!(r.gpus(false), [0]);
        assert_eq!(r.gpus(true), [0]);
        assert_eq!(r.outcome("nvidiactl"), Some("ENXIO"));
        assert_eq!(r.env["CUDA_VISIBLE_DEVICES"], "(unset)");
        assert_eq!(r.cgroups, ["0::/m/c/leaf"]);
    }
}
