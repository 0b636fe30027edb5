//! Evidence-based recovery: when a GPU an event took out of the pool may come back by itself.
//!
//! A GPU whose failure recovers on evidence ([`Comeback::Evidence`], the XID policy table in
//! [`super::xid`]) comes back only when every check holds, each logged ([`Finding`]):
//! 1. the quiet time of its event class has passed since the last counted error, doubled for
//!    each recovery of it that failed again within [`RecoveryConfig::flap_window`] (capped at
//!    [`RecoveryConfig::retry_max`]);
//! 2. NVML says no recovery action is pending (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`; on
//!    drivers without it, no row remapping or page retirement pending);
//! 3. no uncorrectable error since the event: the volatile uncorrected ECC counter has not
//!    grown past its value at the event, and no row remapping failed or is pending;
//! 4. the probe passes ([`super::probe`]).
//!
//! A failed attempt is retried after `retry_min`, doubled per failure in a row up to
//! `retry_max`: a flapping or broken GPU is backed off, never probed in a loop. A GPU whose
//! failure needs a reset ([`Comeback::Reset`]) never comes back by itself; neither does one
//! while the driver asks for a reset or reboot. Facts on NVML's calls: `nvml.h` (NVML 13), and an
//! H200 with driver 580.159.04 (`docs/reference/real-gpu-host.md`): field 230 answers
//! `NONE`, remapped rows (0, 0, 0, 0), retired pages `NOT_SUPPORTED`.
//!
//! This module is the bookkeeping (pure, over times passed in); `monitor` reads NVML and runs
//! the probe.

use std::fmt;
use std::time::Duration;

use mesos_gpu_node::discovery::RemappedRows;
use serde::{Deserialize, Serialize};

use super::probe::ProbeConfig;
use super::xid::{Comeback, EventClass};

/// Why a recovery setting cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    /// A quiet-time specification that does not parse.
    #[error(
        "quiet time {spec:?}: bad entry {entry:?}: expected a duration for every class (`300`, `90s`, `5m`, `1h`) \
         or CLASS=DURATION entries with CLASS one of memory, nvlink, other (e.g. `memory=5m,nvlink=10m,other=2m`)"
    )]
    Quiet {
        /// The whole specification.
        spec: String,
        /// The entry that is wrong.
        entry: String,
    },
}

/// The quiet time of each event class: how long a GPU must go without a counted error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietTimes {
    /// Memory errors (XIDs 63, 92, 94).
    pub memory: Duration,
    /// NVLink errors (XID 74).
    pub nvlink: Duration,
    /// Every other event.
    pub other: Duration,
}

impl Default for QuietTimes {
    /// 5 minutes for memory errors, 10 for NVLink errors, 2 for the rest.
    fn default() -> QuietTimes {
        QuietTimes {
            memory: Duration::from_secs(300),
            nvlink: Duration::from_secs(600),
            other: Duration::from_secs(120),
        }
    }
}

/// Parses `300`, `300s`, `5m` or `1h` (whole numbers).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

impl QuietTimes {
    /// The same quiet time for every class.
    pub fn uniform(quiet: Duration) -> QuietTimes {
        QuietTimes {
            memory: quiet,
            nvlink: quiet,
            other: quiet,
        }
    }

    /// The quiet time of `class`.
    pub fn of(&self, class: EventClass) -> Duration {
        match class {
            EventClass::Memory => self.memory,
            EventClass::Nvlink => self.nvlink,
            EventClass::Other => self.other,
        }
    }

    /// Parses a duration for every class (`90s`) or `CLASS=DURATION` entries over the defaults
    /// (`memory=10m,other=1m`); both forms mix (`60,nvlink=10m`).
    pub fn parse(spec: &str) -> Result<QuietTimes, RecoveryError> {
        let mut out = QuietTimes::default();
        let bad = |entry: &str| RecoveryError::Quiet {
            spec: spec.to_owned(),
            entry: entry.to_owned(),
        };
        let entries: Vec<&str> = spec.split(',').map(str::trim).collect();
        for entry in &entries {
            if !entry.contains('=') {
                out = QuietTimes::uniform(parse_duration(entry).ok_or_else(|| bad(entry))?);
            }
        }
        for entry in entries.iter().filter(|e| e.contains('=')) {
            let (class, value) = entry.split_once('=').ok_or_else(|| bad(entry))?;
            let value = parse_duration(value).ok_or_else(|| bad(entry))?;
            match class.trim() {
                "memory" => out.memory = value,
                "nvlink" => out.nvlink = value,
                "other" => out.other = value,
                _ => return Err(bad(entry)),
            }
        }
        Ok(out)
    }
}

impl fmt::Display for QuietTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory={}s,nvlink={}s,other={}s",
            self.memory.as_secs(),
            self.nvlink.as_secs(),
            self.other.as_secs()
        )
    }
}

/// How GPUs come back by themselves.
#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// Quiet time per event class.
    pub quiet: QuietTimes,
    /// Wait after a failed attempt; doubled per failed attempt in a row.
    pub retry_min: Duration,
    /// Longest wait between attempts, and longest quiet time a flapping GPU is given.
    pub retry_max: Duration,
    /// A GPU failing again within this time after coming back by itself is flapping: its next
    /// quiet time doubles.
    pub flap_window: Duration,
    /// The active probe.
    pub probe: ProbeConfig,
}

impl RecoveryConfig {
    /// The defaults (quiet times [`QuietTimes::default`], retries from 30 s to 1 h, flap window
    /// 1 h) around `probe`.
    pub fn new(probe: ProbeConfig) -> RecoveryConfig {
        RecoveryConfig {
            quiet: QuietTimes::default(),
            retry_min: Duration::from_secs(30),
            retry_max: Duration::from_secs(3600),
            flap_window: Duration::from_secs(3600),
            probe,
        }
    }

    /// The quiet time a GPU of `class` that flapped `flaps` times needs.
    pub fn quiet_for(&self, class: EventClass, flaps: u32) -> Duration {
        let base = self.quiet.of(class);
        let factor = 1u32.checked_shl(flaps.min(20)).unwrap_or(u32::MAX);
        base.saturating_mul(factor).min(self.retry_max.max(base))
    }

    /// The wait after the `attempts`-th failed attempt in a row (1 for the first).
    pub fn retry_after(&self, attempts: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempts.saturating_sub(1).min(20))
            .unwrap_or(u32::MAX);
        self.retry_min.saturating_mul(factor).min(self.retry_max)
    }
}

/// What a recovery check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The quiet time of the event class.
    QuietTime,
    /// NVML's recovery action (or, on older drivers, pending remappings and retirements).
    RecoveryAction,
    /// Uncorrectable errors and row remapping since the event.
    UncorrectableErrors,
    /// The active probe.
    Probe,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Check::QuietTime => "quiet time",
            Check::RecoveryAction => "recovery action",
            Check::UncorrectableErrors => "uncorrectable errors",
            Check::Probe => "probe",
        })
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// What was checked.
    pub check: Check,
    /// True when it holds.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = match (self.ok, self.check) {
            (true, _) => "ok",
            (false, Check::Probe) => "FAILED",
            (false, _) => "MISSING",
        };
        write!(f, "{}: {mark} ({})", self.check, self.detail)
    }
}

/// Error counters at the event, to tell new errors from old ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// Volatile uncorrected ECC errors, when NVML reports them.
    pub volatile_uncorrected: Option<u64>,
}

/// One stay out of the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Episode {
    /// How it may end.
    pub comeback: Comeback,
    /// The counters at the event.
    #[serde(default)]
    pub baseline: Baseline,
    /// Failed attempts in a row.
    #[serde(default)]
    pub attempts: u32,
    /// Earliest next attempt, ms since the Unix epoch (0: as soon as the quiet time allows).
    #[serde(default)]
    pub next_try_ms: u64,
    /// The last attempt's findings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// What the driver asks for, when it asks for a reset or reboot (`a GPU reset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_asks: Option<String>,
}

/// A GPU's recovery history, kept in the health checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    /// Times it came back by itself.
    #[serde(default)]
    pub recoveries: u64,
    /// Probes that failed.
    #[serde(default)]
    pub probe_failures: u64,
    /// When it last came back by itself, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_ms: Option<u64>,
    /// Recoveries in a row that failed again within the flap window.
    #[serde(default)]
    pub flaps: u32,
    /// The current stay out of the pool, while unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode: Option<Episode>,
}

impl RecoveryRecord {
    /// Starts a stay out of the pool at `now_ms`: a GPU that came back by itself less than
    /// `flap_window` ago flaps once more.
    pub(crate) fn begin(&mut self, comeback: Comeback, now_ms: u64, flap_window: Duration) {
        let window = u64::try_from(flap_window.as_millis()).unwrap_or(u64::MAX);
        self.flaps = match self.recovered_ms {
            Some(at) if now_ms.saturating_sub(at) < window => self.flaps.saturating_add(1),
            _ => 0,
        };
        self.episode = Some(Episode {
            comeback,
            baseline: Baseline::default(),
            attempts: 0,
            next_try_ms: 0,
            findings: Vec::new(),
            driver_asks: None,
        });
    }

    /// A further failure while out: a reset-needing one makes the whole stay need it.
    pub(crate) fn escalate(&mut self, comeback: Comeback) {
        if let Some(episode) = &mut self.episode
            && matches!(comeback, Comeback::Reset { .. })
        {
            episode.comeback = comeback;
        }
    }

    /// What keeps the GPU out, one line each, for `gpu mark-healthy` and `gpu health`; empty
    /// while it is in the pool.
    pub fn missing(&self) -> Vec<String> {
        let Some(e) = &self.episode else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Comeback::Reset { remedy } = e.comeback {
            out.push(format!(
                "the failure needs {}: it never comes back by itself",
                remedy.short()
            ));
        }
        if let Some(asks) = &e.driver_asks {
            out.push(format!("the driver asks for {asks}"));
        }
        out.extend(e.findings.iter().filter(|f| !f.ok).map(Finding::to_string));
        if matches!(e.comeback, Comeback::Evidence { .. }) && e.findings.is_empty() {
            out.push("no recovery check has run yet (its quiet time is not over)".to_owned());
        }
        out
    }

    /// Ends the stay: back in the pool by itself at `now_ms`.
    pub(crate) fn recovered(&mut self, now_ms: u64) {
        self.recoveries += 1;
        self.recovered_ms = Some(now_ms);
        self.episode = None;
    }

    /// Records a failed attempt with its findings; the next one waits per `config`.
    pub(crate) fn failed_attempt(
        &mut self,
        findings: Vec<Finding>,
        now_ms: u64,
        config: &RecoveryConfig,
    ) -> Duration {
        let Some(episode) = &mut self.episode else {
            return Duration::ZERO;
        };
        episode.attempts = episode.attempts.saturating_add(1);
        let wait = config.retry_after(episode.attempts);
        episode.next_try_ms =
            now_ms.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        episode.findings = findings;
        wait
    }
}

/// What NVML answered for one reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading<T> {
    /// The value.
    Value(T),
    /// `NVML_ERROR_NOT_SUPPORTED`: this GPU or driver has no such value.
    Unsupported,
    /// Any other error.
    Failed(String),
}

/// What the driver says about a GPU, read for a recovery check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverEvidence {
    /// NVML answers `GPU_IS_LOST`.
    pub lost: bool,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
    pub recovery_action: Reading<u32>,
    /// `nvmlDeviceGetRemappedRows`.
    pub remapped_rows: Reading<RemappedRows>,
    /// `nvmlDeviceGetRetiredPagesPendingStatus`.
    pub retired_pages_pending: Reading<bool>,
    /// Volatile uncorrected ECC errors (`nvmlDeviceGetTotalEccErrors`).
    pub volatile_uncorrected: Reading<u64>,
}

/// What `nvmlDeviceGpuRecoveryAction_t` value `action` asks for (`nvml.h`: 0 none, 1 GPU reset,
/// 2 node reboot, 3 drain P2P, 4 drain P2P and reset, 5 recover the IMEX domain).
pub fn recovery_action_words(action: u32) -> String {
    match action {
        0 => "nothing".to_owned(),
        1 => "a GPU reset".to_owned(),
        2 => "a node reboot".to_owned(),
        3 => "peer-to-peer traffic to be drained".to_owned(),
        4 => "peer-to-peer traffic to be drained and a GPU reset".to_owned(),
        5 => "the IMEX domain to be recovered".to_owned(),
        n => format!("recovery action {n}"),
    }
}

/// True when recovery action `action` asks for a reset or reboot.
pub(crate) fn asks_for_reset(action: u32) -> bool {
    matches!(action, 1 | 2 | 4)
}

impl DriverEvidence {
    /// The error counters to remember at the event.
    pub fn baseline(&self) -> Baseline {
        Baseline {
            volatile_uncorrected: match self.volatile_uncorrected {
                Reading::Value(n) => Some(n),
                _ => None,
            },
        }
    }

    /// What the driver asks for, when it asks for a reset or reboot.
    pub fn asks(&self) -> Option<String> {
        match self.recovery_action {
            Reading::Value(a) if asks_for_reset(a) => Some(recovery_action_words(a)),
            _ => None,
        }
    }

    /// Checks 2 and 3 against the counters at the event.
    pub fn judge(&self, baseline: &Baseline) -> Vec<Finding> {
        let finding = |check, ok, detail: String| Finding { check, ok, detail };
        if self.lost {
            return vec![finding(
                Check::RecoveryAction,
                false,
                "NVML answers GPU_IS_LOST".to_owned(),
            )];
        }
        let action = match &self.recovery_action {
            Reading::Value(0) => finding(
                Check::RecoveryAction,
                true,
                "NVML recovery action NONE".to_owned(),
            ),
            Reading::Value(a) => finding(
                Check::RecoveryAction,
                false,
                format!("the driver asks for {}", recovery_action_words(*a)),
            ),
            Reading::Unsupported => match (&self.remapped_rows, &self.retired_pages_pending) {
                (_, Reading::Value(true)) => finding(
                    Check::RecoveryAction,
                    false,
                    "pages are pending retirement (they are retired at the next reboot)".to_owned(),
                ),
                _ => finding(
                    Check::RecoveryAction,
                    true,
                    "no recovery action field on this driver; no page retirement pending"
                        .to_owned(),
                ),
            },
            Reading::Failed(e) => finding(
                Check::RecoveryAction,
                false,
                format!("cannot read the recovery action: {e}"),
            ),
        };
        let mut problems = Vec::new();
        match (&self.volatile_uncorrected, baseline.volatile_uncorrected) {
            (Reading::Value(now), Some(then)) if now > &then => problems.push(format!(
                "{} uncorrectable ECC error(s) since the event",
                now - then
            )),
            (Reading::Failed(e), _) => {
                problems.push(format!("cannot read the ECC counters: {e}"));
            }
            _ => {}
        }
        match &self.remapped_rows {
            Reading::Value(rows) if rows.failure => {
                problems.push("a row remapping failed".to_owned());
            }
            Reading::Value(rows) if rows.pending => problems.push(
                "a row remapping is pending (it takes effect at the next GPU reset)".to_owned(),
            ),
            Reading::Failed(e) => problems.push(format!("cannot read the remapped rows: {e}")),
            _ => {}
        }
        let errors = if problems.is_empty() {
            let ecc = match &self.volatile_uncorrected {
                Reading::Value(n) => format!("{n} volatile uncorrected ECC error(s), none new"),
                _ => "no ECC counters".to_owned(),
            };
            let rows = match &self.remapped_rows {
                Reading::Value(_) => "no row remapping pending or failed",
                _ => "no row remapper",
            };
            finding(Check::UncorrectableErrors, true, format!("{ecc}; {rows}"))
        } else {
            finding(Check::UncorrectableErrors, false, problems.join("; "))
        };
        vec![action, errors]
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    fn config() -> RecoveryConfig {
        RecoveryConfig::new(ProbeConfig::command(vec!["true".into()]))
    }

    #[test]
    fn quiet_times_parse_and_name_bad_entries() {
        assert_eq!(
            QuietTimes::parse("90").unwrap(),
            QuietTimes::uniform(Duration::from_secs(90))
        );
        let q = QuietTimes::parse("memory=10m, other=1h").unwrap();
        assert_eq!(q.memory, Duration::from_secs(600));
        assert_eq!(q.nvlink, QuietTimes::default().nvlink);
        assert_eq!(q.other, Duration::from_secs(3600));
        let q = QuietTimes::parse("2s,nvlink=5").unwrap();
        assert_eq!(
            (q.memory, q.nvlink),
            (Duration::from_secs(2), Duration::from_secs(5))
        );
        assert_eq!(QuietTimes::parse(&q.to_string()).unwrap(), q);
        for bad in ["", "5x", "gpu=5m", "memory=", "memory=-1", "1.5m"] {
            let err = QuietTimes::parse(bad).unwrap_err();
            assert!(err.to_string().contains("memory, nvlink, other"), "{err}");
        }
    }

    #[test]
    fn retries_back_off_exponentially_up_to_the_cap() {
        let mut c = config();
        c.retry_min = Duration::from_secs(10);
        c.retry_max = Duration::from_secs(60);
        let waits: Vec<u64> = (1..=5).map(|a| c.retry_after(a).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 60, 60]);
        c.quiet = QuietTimes::uniform(Duration::from_secs(5));
        let quiet: Vec<u64> = (0..6)
            .map(|f| c.quiet_for(EventClass::Other, f).as_secs())
            .collect();
        assert_eq!(quiet, [5, 10, 20, 40, 60, 60]);
        assert_eq!(c.quiet_for(EventClass::Other, u32::MAX).as_secs(), 60);
    }

    #[test]
    fn a_gpu_failing_again_soon_after_coming_back_flaps() {
        let window = Duration::from_secs(100);
        let other = Comeback::Evidence {
            class: EventClass::Other,
        };
        let mut r = RecoveryRecord::default();
        r.begin(other, 1_000, window);
        assert_eq!(r.flaps, 0);
        r.recovered(2_000);
        r.begin(other, 50_000, window);
        assert_eq!(r.flaps, 1, "failed again 48 s after coming back");
        r.recovered(60_000);
        r.begin(other, 70_000, window);
        assert_eq!(r.flaps, 2);
        r.recovered(80_000);
        r.begin(other, 500_000, window);
        assert_eq!(r.flaps, 0, "stayed healthy past the window");
        assert_eq!(r.recoveries, 3);
        r.escalate(other);
        r.escalate(Comeback::Reset {
            remedy: super::super::xid::Remedy::GpuReset,
        });
        assert!(matches!(
            r.episode.as_ref().unwrap().comeback,
            Comeback::Reset { .. }
        ));
        let wait = r.failed_attempt(Vec::new(), 600_000, &config());
        assert_eq!(wait, Duration::from_secs(30));
        assert_eq!(r.episode.as_ref().unwrap().next_try_ms, 630_000);
    }

    fn evidence() -> DriverEvidence {
        DriverEvidence {
            lost: false,
            recovery_action: Reading::Value(0),
            remapped_rows: Reading::Value(RemappedRows {
                correctable: 0,
                uncorrectable: 0,
                pending: false,
                failure: false,
            }),
            retired_pages_pending: Reading::Unsupported,
            volatile_uncorrected: Reading::Value(3),
        }
    }

    #[test]
    fn the_driver_s_evidence_is_judged_against_the_event() {
        let at_event = Baseline {
            volatile_uncorrected: Some(3),
        };
        let good = evidence().judge(&at_event);
        assert!(good.iter().all(|f| f.ok), "{good:?}");

        let mut e = evidence();
        e.volatile_uncorrected = Reading::Value(5);
        let f = e.judge(&at_event);
        assert!(!f[1].ok && f[1].detail.contains("2 uncorrectable"), "{f:?}");

        let mut e = evidence();
        e.recovery_action = Reading::Value(1);
        assert_eq!(e.asks().as_deref(), Some("a GPU reset"));
        let f = e.judge(&at_event);
        assert!(!f[0].ok && f[0].detail.contains("a GPU reset"), "{f:?}");

        let mut e = evidence();
        e.remapped_rows = Reading::Value(RemappedRows {
            correctable: 0,
            uncorrectable: 1,
            pending: true,
            failure: false,
        });
        assert!(!e.judge(&at_event)[1].ok);

        // An older driver: no recovery action field; pending retirement is then the signal.
        let mut e = evidence();
        e.recovery_action = Reading::Unsupported;
        assert!(e.judge(&at_event)[0].ok);
        e.retired_pages_pending = Reading::Value(true);
        assert!(!e.judge(&at_event)[0].ok);

        // A reset zeroes the volatile counters: fewer than at the event is no new error.
        let mut e = evidence();
        e.volatile_uncorrected = Reading::Value(0);
        assert!(e.judge(&at_event)[1].ok);

        let mut e = evidence();
        e.lost = true;
        assert!(!e.judge(&at_event)[0].ok);
    }
}
