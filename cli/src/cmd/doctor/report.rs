//! One check's outcome and the report: `ok`/`warn`/`fail` lines with what to do, or JSON.

use std::fmt::Write as _;

use serde::Serialize;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// As it must be.
    Ok,
    /// Works, but something an operator should look at.
    Warn,
    /// The host is not ready.
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    /// Its name, e.g. `device-nodes`.
    pub(crate) name: &'static str,
    /// How it came out.
    pub(crate) status: Status,
    /// One line.
    pub(crate) summary: String,
    /// What was looked at, one finding a line.
    pub(crate) details: Vec<String>,
    /// What to do, when not ok.
    pub(crate) fix: Option<String>,
}

/// Every check, in order.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// True when no check failed: the host can run its first task.
    pub(crate) ready: bool,
    /// The checks.
    pub(crate) checks: Vec<Check>,
}

impl Report {
    pub(crate) fn new(checks: Vec<Check>) -> Report {
        Report {
            ready: checks.iter().all(|c| c.status != Status::Fail),
            checks,
        }
    }

    /// The text report: one `status name summary` line per check, its details and fix
    /// indented below (details of an ok check only with `verbose`), then the verdict.
    pub(crate) fn text(&self, verbose: bool) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for check in &self.checks {
            let _ = writeln!(
                out,
                "{:<4}  {:<width$}  {}",
                check.status.word(),
                check.name,
                check.summary
            );
            if verbose || check.status != Status::Ok {
                for detail in &check.details {
                    let _ = writeln!(out, "      {:<width$}  {detail}", "");
                }
            }
            if let Some(fix) = &check.fix {
                let _ = writeln!(out, "      {:<width$}  fix: {fix}", "");
            }
        }
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        let warnings = count(Status::Warn);
        let _ = writeln!(
            out,
            "{}: {} checks, {} failed, {warnings} warning{}",
            if self.ready { "READY" } else { "NOT READY" },
            self.checks.len(),
            count(Status::Fail),
            if warnings == 1 { "" } else { "s" }
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(status: Status) -> Check {
        Check {
            name: "a",
            status,
            summary: String::new(),
            details: Vec::new(),
            fix: None,
        }
    }

    #[test]
    fn the_last_line_counts_in_words_that_agree() {
        let last = |statuses: &[Status]| {
            let report = Report::new(statuses.iter().map(|&s| check(s)).collect());
            report
                .text(false)
                .lines()
                .last()
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(
            last(&[Status::Ok, Status::Warn]),
            "READY: 2 checks, 0 failed, 1 warning"
        );
        assert_eq!(
            last(&[Status::Fail, Status::Warn, Status::Warn]),
            "NOT READY: 3 checks, 1 failed, 2 warnings"
        );
    }
}
