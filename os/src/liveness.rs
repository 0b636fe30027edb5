//! Whether a process of some boot still runs, told from `/proc` so that pid reuse and reboots
//! cannot fool it.
//!
//! Facts relied on (proc(5), Linux `random(4)`, cgroups(7)):
//! - field 22 of `/proc/<pid>/stat` is the process's start time in clock ticks since boot; a
//!   reused pid has another start time, so `{pid, start time}` names one process of one boot;
//! - `/proc/sys/kernel/random/boot_id` is a random UUID made at every boot, so a stamp of a
//!   previous boot is never taken for a live process (records live on persistent storage);
//! - field 3 is the state; a zombie (`Z`) or dead (`X`) process runs no code and holds no
//!   device open;
//! - a cgroup's `cgroup.procs` lists the processes in it; once empty, nothing in it can open a
//!   device, whoever made it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One process of one boot: pid reuse and reboots cannot fool it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStamp {
    /// The pid.
    pub pid: u32,
    /// Its start time, clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// The boot it ran in (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
}

impl fmt::Display for ProcessStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} (started at tick {})", self.pid, self.start_time)
    }
}

/// Whether something is still there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "why", rename_all = "snake_case")]
pub enum Liveness {
    /// It is there (why we know).
    Alive(String),
    /// It is gone: what it held can be freed (why we know).
    Dead(String),
    /// It cannot be told: what it holds stays held (why).
    Uncertain(String),
}

impl Liveness {
    /// True for [`Liveness::Dead`].
    pub fn is_dead(&self) -> bool {
        matches!(self, Liveness::Dead(_))
    }

    /// The word and the reason, for listings.
    pub fn describe(&self) -> (&'static str, &str) {
        match self {
            Liveness::Alive(why) => ("alive", why),
            Liveness::Dead(why) => ("dead", why),
            Liveness::Uncertain(why) => ("uncertain", why),
        }
    }
}

/// The processes of this machine, read under a proc root (`/proc`, or a test tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Processes {
    proc_root: PathBuf,
}

impl Default for Processes {
    fn default() -> Processes {
        Processes::at("/proc")
    }
}

impl Processes {
    /// Reads processes under `proc_root` (normally `/proc`).
    pub fn at(proc_root: impl Into<PathBuf>) -> Processes {
        Processes {
            proc_root: proc_root.into(),
        }
    }

    /// The stamp of this process.
    pub fn this_process(&self) -> io::Result<ProcessStamp> {
        self.stamp(std::process::id())
    }

    /// The stamp of process `pid`.
    pub fn stamp(&self, pid: u32) -> io::Result<ProcessStamp> {
        let stat = self.stat(pid)?;
        Ok(ProcessStamp {
            pid,
            start_time: stat.start_time,
            boot_id: self.boot_id()?,
        })
    }

    /// This boot's id.
    pub fn boot_id(&self) -> io::Result<String> {
        let path = self.proc_root.join("sys/kernel/random/boot_id");
        Ok(std::fs::read_to_string(path)?.trim().to_owned())
    }

    /// Whether the stamped process still runs.
    pub fn process(&self, stamp: &ProcessStamp) -> Liveness {
        match self.boot_id() {
            Ok(boot) if boot != stamp.boot_id => {
                return Liveness::Dead(format!("{stamp} ran in an earlier boot"));
            }
            Ok(_) => {}
            Err(e) => return Liveness::Uncertain(format!("cannot read the boot id: {e}")),
        }
        match self.stat(stamp.pid) {
            Ok(stat) if stat.start_time != stamp.start_time => Liveness::Dead(format!(
                "{stamp} has exited (its pid now names another process)"
            )),
            Ok(stat) if matches!(stat.state, 'Z' | 'X') => {
                Liveness::Dead(format!("{stamp} has exited (zombie)"))
            }
            Ok(_) => Liveness::Alive(format!("{stamp} runs")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Liveness::Dead(format!("{stamp} has exited"))
            }
            Err(e) => Liveness::Uncertain(format!("cannot read /proc/{}/stat: {e}", stamp.pid)),
        }
    }

    /// Whether the stamped process, or failing that a process of its cgroup `cgroup`, still
    /// runs: dead only when the process is gone **and** the cgroup has no process left.
    pub fn process_or_cgroup(&self, stamp: &ProcessStamp, cgroup: Option<&Path>) -> Liveness {
        let state = self.process(stamp);
        let Liveness::Dead(gone) = state else {
            return state;
        };
        let Some(cgroup) = cgroup else {
            return Liveness::Dead(gone);
        };
        match cgroup_pids(cgroup) {
            Ok(0) => Liveness::Dead(format!("{gone}; its cgroup {} is empty", cgroup.display())),
            Ok(n) => Liveness::Alive(format!(
                "{gone}, but its cgroup {} still runs {n} process(es)",
                cgroup.display()
            )),
            Err(e) => Liveness::Uncertain(format!(
                "{gone}; cannot read {}/cgroup.procs: {e}",
                cgroup.display()
            )),
        }
    }

    fn stat(&self, pid: u32) -> io::Result<Stat> {
        let path = self.proc_root.join(pid.to_string()).join("stat");
        let text = std::fs::read_to_string(&path)?;
        parse_stat(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: unexpected format", path.display()),
            )
        })
    }
}

/// The number of processes in the cgroup at `dir`; 0 when it does not exist.
pub fn cgroup_pids(dir: &Path) -> io::Result<usize> {
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(text) => Ok(text.split_whitespace().count()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

struct Stat {
    state: char,
    start_time: u64,
}

/// Fields 3 and 22 of `/proc/<pid>/stat`; the command (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3 (state); field 22 is 19 further on.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start_time })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(pid: u32, state: char, start: u64) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("sys/kernel/random")).expect("mkdir");
        std::fs::write(dir.path().join("sys/kernel/random/boot_id"), "boot-a\n").expect("write");
        let p = dir.path().join(pid.to_string());
        std::fs::create_dir_all(&p).expect("mkdir");
        let mut fields: Vec<String> = (4..=52).map(|n| n.to_string()).collect();
        fields[18] = start.to_string();
        std::fs::write(
            p.join("stat"),
            format!("{pid} (a (b) c) {state} {}\n", fields.join(" ")),
        )
        .expect("write");
        dir
    }

    fn stamp(pid: u32, start: u64, boot: &str) -> ProcessStamp {
        ProcessStamp {
            pid,
            start_time: start,
            boot_id: boot.into(),
        }
    }

    #[test]
    fn stat_parsing_counts_fields_after_the_command() {
        let s =
            parse_stat("42 (we ird) name) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 999 20")
                .expect("parsed");
        assert_eq!((s.state, s.start_time), ('S', 999));
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn a_reused_pid_an_earlier_boot_and_a_zombie_are_dead() {
        let proc = fake_proc(7, 'S', 500);
        let procs = Processes::at(proc.path());
        assert!(matches!(
            procs.process(&stamp(7, 500, "boot-a")),
            Liveness::Alive(_)
        ));
        let reused = procs.process(&stamp(7, 400, "boot-a"));
        assert!(reused.is_dead(), "{reused:?}");
        let earlier = procs.process(&stamp(7, 500, "boot-b"));
        assert!(earlier.is_dead() && earlier.describe().1.contains("earlier boot"));
        assert!(procs.process(&stamp(8, 500, "boot-a")).is_dead());
        let zombie = fake_proc(7, 'Z', 500);
        assert!(
            Processes::at(zombie.path())
                .process(&stamp(7, 500, "boot-a"))
                .is_dead()
        );
    }

    #[test]
    fn a_dead_process_whose_cgroup_still_runs_processes_is_alive() {
        let proc = fake_proc(7, 'S', 500);
        let procs = Processes::at(proc.path());
        let cgroup = tempfile::tempdir().expect("tempdir");
        let gone = stamp(9, 1, "boot-a");
        std::fs::write(cgroup.path().join("cgroup.procs"), "7\n").expect("write");
        assert!(matches!(
            procs.process_or_cgroup(&gone, Some(cgroup.path())),
            Liveness::Alive(_)
        ));
        std::fs::write(cgroup.path().join("cgroup.procs"), "").expect("write");
        assert!(
            procs
                .process_or_cgroup(&gone, Some(cgroup.path()))
                .is_dead()
        );
        assert!(procs.process_or_cgroup(&gone, None).is_dead());
    }

    #[test]
    fn this_process_is_alive() {
        let procs = Processes::default();
        let me = procs.this_process().expect("stamp");
        assert!(matches!(procs.process(&me), Liveness::Alive(_)));
    }
}
