//! What each well-known XID means, whether it is counted by default, and how a GPU it took out
//! of the pool comes back: the XID policy table.
//!
//! Source: NVIDIA's XID catalogue for Ampere and newer GPUs, "Analyzing Xid Errors with the Xid
//! Catalog" (<https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>), the
//! edition listing XIDs 1-172, as read on 2026-11-26; its "Resolution Bucket (Immediate
//! Action)" column is quoted in [`XidRule::catalogue`]. The default ignore list is NVIDIA's k8s
//! device plugin's (`docs/reference/gpu-health.md` §2). `docs/operator-guide.md` ("XID
//! policy") holds the same table; a test below checks the two agree.
//!
//! How the catalogue's actions map to ours:
//! - `RESTART_APP` / `IGNORE` on an XID applications cause (13, 31, 43, 45, 68): the GPU is
//!   fine; not counted by default.
//! - `RESET_GPU` and `RESTART_BM` (restart the machine): the GPU stays out until the operator
//!   has reset it (or rebooted the node) and marks it healthy ([`Comeback::Reset`]). XID 109 is
//!   `RESET_GPU` in the catalogue but ignored by default, as by NVIDIA's device plugin (many
//!   context-switch timeouts are caused by one application); counted with `+109` it needs a
//!   reset.
//! - Everything else counted (`RESTART_APP` on engine XIDs, `IGNORE` on memory events such as
//!   63 and 92, workflows such as 74, unknown XIDs): the GPU comes back by itself on evidence
//!   ([`Comeback::Evidence`]): the driver asks for nothing, no uncorrectable error since, the
//!   probe passes, after a quiet time of its event class. A pending row remapping (63, 94) or
//!   a recovery action the driver reports keeps it out until a reset.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which quiet time applies to an event before its GPU may come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventClass {
    /// Memory errors (row remapping, ECC rates, contained ECC errors).
    Memory,
    /// NVLink errors.
    Nvlink,
    /// Every other event.
    Other,
}

impl EventClass {
    /// The name used in `health_quiet` and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            EventClass::Memory => "memory",
            EventClass::Nvlink => "nvlink",
            EventClass::Other => "other",
        }
    }
}

impl fmt::Display for EventClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the operator must do before a GPU can be used again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remedy {
    /// Reset the GPU (`nvidia-smi -r -i <index>`) once no process uses it.
    GpuReset,
    /// Reboot the node.
    NodeReboot,
    /// Look at the GPU: nothing automatic can tell it works (its events cannot be watched).
    Operator,
}

impl Remedy {
    /// Words for logs, task statuses and `gpu health`.
    pub fn describe(self, index: u32) -> String {
        match self {
            Remedy::GpuReset => format!(
                "it needs a GPU reset: stop its tasks, run `nvidia-smi -r -i {index}`, then `mesos-gpu gpu mark-healthy {index}`"
            ),
            Remedy::NodeReboot => format!(
                "it needs a node reboot (or at least a GPU reset): drain the node and reboot it, then `mesos-gpu gpu mark-healthy {index}` if it is still out"
            ),
            Remedy::Operator => format!(
                "check it (`nvidia-smi -q -i {index}`, the agent log), then `mesos-gpu gpu mark-healthy {index}`"
            ),
        }
    }

    /// What it is, in a few words (`a GPU reset`).
    pub fn short(self) -> &'static str {
        match self {
            Remedy::GpuReset => "a GPU reset",
            Remedy::NodeReboot => "a node reboot",
            Remedy::Operator => "the operator's check",
        }
    }

    /// The short label in metrics (`gpu_reset`, `node_reboot`).
    pub fn label(self) -> &'static str {
        match self {
            Remedy::GpuReset => "gpu_reset",
            Remedy::NodeReboot => "node_reboot",
            Remedy::Operator => "operator",
        }
    }
}

/// How a GPU taken out by an event comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum Comeback {
    /// By itself, once the evidence holds, after the quiet time of `class`.
    Evidence {
        /// Whose quiet time applies.
        class: EventClass,
    },
    /// Only after the operator's remedy and `gpu mark-healthy`.
    Reset {
        /// What the operator must do.
        remedy: Remedy,
    },
}

/// One row of the XID policy table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidRule {
    /// The XID.
    pub xid: u64,
    /// What it means (the catalogue's description, shortened).
    pub meaning: &'static str,
    /// The catalogue's immediate action.
    pub catalogue: &'static str,
    /// False for the XIDs ignored by default (application errors).
    pub counted: bool,
    /// How the GPU comes back once the XID took it out.
    pub comeback: Comeback,
}

const fn evidence(class: EventClass) -> Comeback {
    Comeback::Evidence { class }
}

const RESET: Comeback = Comeback::Reset {
    remedy: Remedy::GpuReset,
};
const MEMORY: Comeback = evidence(EventClass::Memory);
const OTHER: Comeback = evidence(EventClass::Other);

const fn rule(
    xid: u64,
    meaning: &'static str,
    catalogue: &'static str,
    counted: bool,
    comeback: Comeback,
) -> XidRule {
    XidRule {
        xid,
        meaning,
        catalogue,
        counted,
        comeback,
    }
}

/// The policy table, by XID.
pub const XID_RULES: &[XidRule] = &[
    rule(13, "graphics engine exception", "RESTART_APP", false, OTHER),
    rule(31, "GPU memory page fault", "RESTART_APP", false, OTHER),
    rule(
        32,
        "invalid or corrupted push buffer stream",
        "RESTART_APP",
        true,
        OTHER,
    ),
    rule(38, "driver firmware error", "IGNORE", true, OTHER),
    rule(43, "GPU stopped processing", "IGNORE", false, OTHER),
    rule(
        45,
        "preemptive cleanup, due to previous errors",
        "WORKFLOW_XID_45",
        false,
        OTHER,
    ),
    rule(46, "GPU timeout", "RESET_GPU", true, RESET),
    rule(48, "double-bit ECC error", "WORKFLOW_XID_48", true, RESET),
    rule(
        61,
        "internal micro-controller breakpoint/warning",
        "CONTACT_SUPPORT",
        true,
        OTHER,
    ),
    rule(
        62,
        "internal micro-controller halt",
        "RESET_GPU",
        true,
        RESET,
    ),
    rule(
        63,
        "ECC page retirement or row remapping event",
        "IGNORE",
        true,
        MEMORY,
    ),
    rule(
        64,
        "ECC page retirement or row remapping failure",
        "RESET_GPU",
        true,
        RESET,
    ),
    rule(68, "video processor exception", "RESTART_APP", false, OTHER),
    rule(
        69,
        "graphics engine class error",
        "RESTART_APP",
        true,
        OTHER,
    ),
    rule(
        74,
        "NVLink error",
        "WORKFLOW_NVLINK_ERR",
        true,
        evidence(EventClass::Nvlink),
    ),
    rule(
        79,
        "GPU has fallen off the bus",
        "RESTART_BM",
        true,
        Comeback::Reset {
            remedy: Remedy::NodeReboot,
        },
    ),
    rule(92, "high single-bit ECC error rate", "IGNORE", true, MEMORY),
    rule(94, "contained ECC error", "RESTART_APP", true, MEMORY),
    rule(95, "uncontained ECC error", "RESET_GPU", true, RESET),
    rule(109, "context switch timeout", "RESET_GPU", false, RESET),
    rule(119, "GSP RPC timeout", "RESET_GPU", true, RESET),
    rule(120, "GSP error", "RESET_GPU", true, RESET),
    rule(
        140,
        "unrecoverable ECC error escape",
        "RESET_GPU",
        true,
        RESET,
    ),
    rule(154, "GPU recovery action changed", "XID_154", true, OTHER),
];

/// The rule of XID `xid`, when it is a well-known one.
pub fn xid_rule(xid: u64) -> Option<&'static XidRule> {
    XID_RULES
        .binary_search_by_key(&xid, |r| r.xid)
        .ok()
        .map(|i| &XID_RULES[i])
}

/// The meaning of XID `xid`, when it is a well-known one.
pub(crate) fn xid_meaning(xid: u64) -> Option<&'static str> {
    xid_rule(xid).map(|r| r.meaning)
}

/// How a GPU comes back from XID `xid`: its rule's, else on evidence with the `other` quiet time.
pub(crate) fn xid_comeback(xid: u64) -> Comeback {
    xid_rule(xid).map_or(OTHER, |r| r.comeback)
}

/// The XIDs not counted unless the operator counts them.
pub(crate) fn default_ignored() -> impl Iterator<Item = u64> {
    XID_RULES.iter().filter(|r| !r.counted).map(|r| r.xid)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_found() {
        assert!(XID_RULES.windows(2).all(|w| w[0].xid < w[1].xid));
        assert_eq!(xid_meaning(79), Some("GPU has fallen off the bus"));
        assert_eq!(xid_meaning(13), Some("graphics engine exception"));
        assert_eq!(xid_meaning(1), None);
        assert_eq!(
            xid_comeback(1),
            OTHER,
            "an unknown XID recovers on evidence"
        );
        assert_eq!(
            default_ignored().collect::<Vec<_>>(),
            [13, 31, 43, 45, 68, 109]
        );
    }

    /// The rows of the table in `docs/operator-guide.md` between its markers: XID, meaning,
    /// catalogue action, default, comeback.
    fn guide_rows() -> Vec<Vec<String>> {
        let guide = include_str!("../../docs/operator-guide.md");
        let start = guide
            .find("<!-- xid-policy-table -->")
            .expect("the guide marks its XID table");
        let end = guide[start..]
            .find("<!-- /xid-policy-table -->")
            .expect("the table's end marker")
            + start;
        guide[start..end]
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| XID") && !l.starts_with("|--"))
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().trim_matches('`').to_owned())
                    .collect()
            })
            .collect()
    }

    /// The guide's words for a rule's default and comeback.
    fn words(rule: &XidRule) -> Vec<String> {
        let comeback = match rule.comeback {
            Comeback::Evidence { class } => format!("on evidence, {class} quiet time"),
            Comeback::Reset { remedy } => match remedy {
                Remedy::GpuReset => "GPU reset, then mark-healthy".to_owned(),
                Remedy::NodeReboot => "node reboot, then mark-healthy".to_owned(),
                Remedy::Operator => "operator".to_owned(),
            },
        };
        vec![
            rule.xid.to_string(),
            rule.meaning.to_owned(),
            rule.catalogue.to_owned(),
            if rule.counted { "counted" } else { "ignored" }.to_owned(),
            comeback,
        ]
    }

    #[test]
    fn the_operator_guide_table_is_the_code_table() {
        let guide = guide_rows();
        let code: Vec<Vec<String>> = XID_RULES.iter().map(words).collect();
        assert_eq!(
            guide, code,
            "docs/operator-guide.md's XID policy table differs from XID_RULES"
        );
    }
}
