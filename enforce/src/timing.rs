//! Where the time of one lifecycle call goes: cheap per-thread spans over the steps that touch
//! the host (the pool's lock, file and `fsync`, the checkpoint, cgroup files, the eBPF program).
//!
//! Each [`span`] costs two `Instant::now()` (a vDSO read) and one thread-local add; nothing is
//! allocated and nothing is logged. The steps of one call add up in the calling thread's
//! [`Breakdown`] until [`take`] returns and resets it: the C ABI's per-call log line and the
//! figures examples read it (issue 36). Mesos serializes an isolator's calls, and the isolator
//! holds its lock for a whole call, so one thread's breakdown is one call's.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// A step of a lifecycle call that touches the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Opening the node pool's lock file and waiting for its `flock`.
    PoolLock,
    /// Reading and parsing `pool.json`.
    PoolRead,
    /// Writing `pool.json` crash-safely (serialize, write, `fsync`, `rename`, `fsync` of the dir).
    PoolWrite,
    /// Writing the isolator's checkpoint crash-safely (the same steps).
    CheckpointWrite,
    /// `mkdir` of a container cgroup (and the check of its parent).
    CgroupMkdir,
    /// Reading a cgroup's files (`devices.list`, `cgroup.procs`).
    CgroupRead,
    /// Writing a cgroup's files (`devices.allow`/`deny`, `cgroup.procs`).
    CgroupWrite,
    /// `rmdir` of a container cgroup.
    CgroupRmdir,
    /// Building the eBPF device program from the rules.
    BpfBuild,
    /// `BPF_PROG_LOAD` (the verifier).
    BpfLoad,
    /// Finding our attached program and `BPF_PROG_ATTACH`/`DETACH`.
    BpfAttach,
}

impl Step {
    /// Every step, in the order tables print them.
    pub const ALL: [Step; 11] = [
        Step::PoolLock,
        Step::PoolRead,
        Step::PoolWrite,
        Step::CheckpointWrite,
        Step::CgroupMkdir,
        Step::CgroupRead,
        Step::CgroupWrite,
        Step::CgroupRmdir,
        Step::BpfBuild,
        Step::BpfLoad,
        Step::BpfAttach,
    ];

    /// The step's short name, for tables and log fields.
    pub fn name(self) -> &'static str {
        match self {
            Step::PoolLock => "pool_lock",
            Step::PoolRead => "pool_read",
            Step::PoolWrite => "pool_write",
            Step::CheckpointWrite => "ckpt_write",
            Step::CgroupMkdir => "cg_mkdir",
            Step::CgroupRead => "cg_read",
            Step::CgroupWrite => "cg_write",
            Step::CgroupRmdir => "cg_rmdir",
            Step::BpfBuild => "bpf_build",
            Step::BpfLoad => "bpf_load",
            Step::BpfAttach => "bpf_attach",
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// The time one thread spent in each [`Step`] since the last [`take`], and how often.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakdown {
    nanos: [u64; Step::ALL.len()],
    counts: [u32; Step::ALL.len()],
}

impl Breakdown {
    /// The time spent in `step`.
    pub fn time(&self, step: Step) -> Duration {
        Duration::from_nanos(self.nanos[step.slot()])
    }

    /// How many spans of `step` ran.
    pub fn count(&self, step: Step) -> u32 {
        self.counts[step.slot()]
    }

    /// The time spent in all steps together.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.nanos.iter().fold(0, |a, &n| a.saturating_add(n)))
    }

    /// Adds `other`'s times and counts to this breakdown (a transaction of several calls).
    pub fn merge(&mut self, other: &Breakdown) {
        for slot in 0..self.nanos.len() {
            self.nanos[slot] = self.nanos[slot].saturating_add(other.nanos[slot]);
            self.counts[slot] = self.counts[slot].saturating_add(other.counts[slot]);
        }
    }

    fn add(&mut self, step: Step, spent: Duration) {
        let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        let slot = step.slot();
        self.nanos[slot] = self.nanos[slot].saturating_add(nanos);
        self.counts[slot] = self.counts[slot].saturating_add(1);
    }
}

impl std::fmt::Display for Breakdown {
    /// `step=µs[xN]` for each step that ran, space-separated (`-` when none did).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for step in Step::ALL.into_iter().filter(|&s| self.count(s) > 0) {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{}={}", step.name(), self.time(step).as_micros())?;
            if self.count(step) > 1 {
                write!(f, "x{}", self.count(step))?;
            }
        }
        if first {
            f.write_str("-")?;
        }
        Ok(())
    }
}

thread_local! {
    static CURRENT: Cell<Breakdown> = const {
        Cell::new(Breakdown { nanos: [0; Step::ALL.len()], counts: [0; Step::ALL.len()] })
    };
}

/// A running step; its time is added to this thread's breakdown when it is dropped.
#[must_use = "a span measures until it is dropped"]
#[derive(Debug)]
pub struct Span {
    step: Step,
    start: Instant,
}

/// Starts timing `step` until the returned span is dropped.
pub fn span(step: Step) -> Span {
    Span {
        step,
        start: Instant::now(),
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let spent = self.start.elapsed();
        CURRENT.with(|c| {
            let mut b = c.get();
            b.add(self.step, spent);
            c.set(b);
        });
    }
}

/// This thread's breakdown since the last call, which starts a new one.
pub fn take() -> Breakdown {
    CURRENT.with(Cell::take)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_add_up_per_step_and_take_resets() {
        let _ = take();
        {
            let _a = span(Step::PoolWrite);
        }
        {
            let _b = span(Step::PoolWrite);
            let _c = span(Step::BpfLoad);
        }
        let b = take();
        assert_eq!(b.count(Step::PoolWrite), 2);
        assert_eq!(b.count(Step::BpfLoad), 1);
        assert_eq!(b.count(Step::PoolLock), 0);
        assert!(b.total() >= b.time(Step::PoolWrite));
        assert!(b.to_string().starts_with("pool_write="), "{b}");
        assert_eq!(take(), Breakdown::default());
        assert_eq!(Breakdown::default().to_string(), "-");
    }

    #[test]
    fn steps_are_listed_once_in_slot_order() {
        for (i, step) in Step::ALL.into_iter().enumerate() {
            assert_eq!(step.slot(), i);
        }
    }
}
