//! Which NVML health events make a GPU unhealthy.
//!
//! Facts relied on (`docs/reference/gpu-health.md` §2, NVIDIA k8s-device-plugin v0.20
//! `internal/rm/health.go`):
//! - XIDs 13, 31, 43, 45, 68 and 109 are caused by applications (graphics engine exception,
//!   memory page fault, GPU stopped processing, preemptive cleanup, video processor exception,
//!   context switch timeout); the GPU itself is fine, so they are ignored by default (the
//!   `counted` column of the XID policy table, `super::xid`).
//! - Operators need to add to that list (XID 94 false positives, gpu-operator #1065), take XIDs
//!   off it, and switch checks off altogether (`DP_DISABLE_HEALTHCHECKS=all`).
//! - The device plugin's precedence is explicit enable > explicit disable (including `all`) >
//!   built-in ignore list > counted. Its `all` plus an explicit enable still disables every check
//!   (a bug, `docs/reference/gpu-health.md` §2); here `all,+94` counts XID 94 and nothing else.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::xid::{default_ignored, xid_rule};

/// A health-check specification that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A token that is none of the accepted forms.
    #[error(
        "health checks {spec:?}: bad token {token:?}: expected `all` (no checks), an XID to ignore (`94` or `-94`), \
         `+<xid>` to count an XID ignored by default, or `+all` to count every XID"
    )]
    BadToken {
        /// The whole specification.
        spec: String,
        /// The token that is wrong.
        token: String,
    },
    /// The same XID both ignored and counted.
    #[error("health checks {spec:?}: XID {xid} is both ignored (`{xid}`) and counted (`+{xid}`)")]
    Conflict {
        /// The whole specification.
        spec: String,
        /// The XID named both ways.
        xid: u64,
    },
}

/// Which XID, ECC and lost-GPU events count as a GPU failure.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthPolicy {
    /// `all`: nothing counts unless explicitly enabled.
    all_disabled: bool,
    /// `+all`: every XID counts, the built-in ignore list included.
    all_enabled: bool,
    /// XIDs the operator ignores.
    ignored: BTreeSet<u64>,
    /// XIDs the operator counts, overriding every ignore.
    enabled: BTreeSet<u64>,
}

impl HealthPolicy {
    /// The default: every XID but those the XID policy table ignores, double-bit ECC errors and
    /// lost GPUs.
    pub fn new() -> HealthPolicy {
        HealthPolicy::default()
    }

    /// What the policy checks, for logs: the specification, or for the default (an empty
    /// specification) the words that say so.
    pub fn describe(&self) -> String {
        let spec = self.to_string();
        if spec.is_empty() {
            let ignored: Vec<String> = default_ignored().map(|x| x.to_string()).collect();
            format!(
                "default (every XID but {}, double-bit ECC errors, lost GPUs)",
                ignored.join(", ")
            )
        } else {
            spec
        }
    }

    /// Parses a comma-separated list, case-insensitive, blanks ignored (`""` is the default):
    /// `all` (or `xids`) switches every check off; `94` or `-94` ignores XID 94; `+31` counts
    /// XID 31 although it is ignored by default; `+all` counts every XID. Explicit `+N` wins
    /// over `all`, so `all,+79` watches only for GPUs falling off the bus.
    pub fn parse(spec: &str) -> Result<HealthPolicy, PolicyError> {
        let mut policy = HealthPolicy::default();
        let bad = |token: &str| PolicyError::BadToken {
            spec: spec.to_owned(),
            token: token.to_owned(),
        };
        for raw in spec.split(',') {
            let token = raw.trim().to_ascii_lowercase();
            match token.as_str() {
                "" => {}
                "all" | "xids" | "-all" => policy.all_disabled = true,
                "+all" => policy.all_enabled = true,
                _ => {
                    let (counted, digits) = match token.as_bytes()[0] {
                        b'+' => (true, &token[1..]),
                        b'-' => (false, &token[1..]),
                        _ => (false, token.as_str()),
                    };
                    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                        return Err(bad(raw.trim()));
                    }
                    let xid: u64 = digits.parse().map_err(|_| bad(raw.trim()))?;
                    if counted {
                        policy.enabled.insert(xid);
                    } else {
                        policy.ignored.insert(xid);
                    }
                }
            }
        }
        if let Some(&xid) = policy.enabled.intersection(&policy.ignored).next() {
            return Err(PolicyError::Conflict {
                spec: spec.to_owned(),
                xid,
            });
        }
        Ok(policy)
    }

    /// Whether XID `xid` marks its GPU unhealthy.
    pub(crate) fn counts_xid(&self, xid: u64) -> bool {
        if self.enabled.contains(&xid) {
            return true;
        }
        if self.all_disabled || self.ignored.contains(&xid) {
            return false;
        }
        self.all_enabled || xid_rule(xid).is_none_or(|r| r.counted)
    }

    /// Whether double-bit (uncorrectable) ECC errors mark their GPU unhealthy.
    pub(crate) fn counts_ecc(&self) -> bool {
        !self.all_disabled
    }

    /// Whether a GPU found lost (`NVML_ERROR_GPU_IS_LOST`, XID 79) is marked unhealthy.
    pub(crate) fn counts_lost(&self) -> bool {
        self.counts_xid(79)
    }

    /// True when nothing counts, so no NVML event loop needs to run at all.
    pub(crate) fn is_off(&self) -> bool {
        self.all_disabled && self.enabled.is_empty()
    }
}

impl fmt::Display for HealthPolicy {
    /// The canonical specification, which [`HealthPolicy::parse`] reads back to the same policy.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tokens: Vec<String> = Vec::new();
        if self.all_disabled {
            tokens.push("all".to_owned());
        }
        if self.all_enabled {
            tokens.push("+all".to_owned());
        }
        tokens.extend(self.ignored.iter().map(|x| format!("-{x}")));
        tokens.extend(self.enabled.iter().map(|x| format!("+{x}")));
        f.write_str(&tokens.join(","))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_default_policy_is_described_not_blank() {
        assert_eq!(
            HealthPolicy::new().describe(),
            "default (every XID but 13, 31, 43, 45, 68, 109, double-bit ECC errors, lost GPUs)"
        );
        assert_eq!(HealthPolicy::parse("-94").unwrap().describe(), "-94");
    }

    #[test]
    fn default_ignores_application_xids_only() {
        let p = HealthPolicy::new();
        for xid in default_ignored() {
            assert!(!p.counts_xid(xid), "XID {xid}");
        }
        for xid in [48, 62, 63, 64, 74, 79, 92, 94, 95] {
            assert!(p.counts_xid(xid), "XID {xid}");
        }
        assert!(p.counts_ecc() && p.counts_lost() && !p.is_off());
        assert_eq!(HealthPolicy::parse("").unwrap(), p);
        assert_eq!(HealthPolicy::parse(" , ").unwrap(), p);
    }

    #[test]
    fn ignore_and_count_overrides() {
        let p = HealthPolicy::parse("94, -95,+31").unwrap();
        assert!(!p.counts_xid(94) && !p.counts_xid(95));
        assert!(p.counts_xid(31), "+31 counts a default-ignored XID");
        assert!(!p.counts_xid(13) && p.counts_xid(79));

        let every = HealthPolicy::parse("+ALL").unwrap();
        assert!(default_ignored().all(|x| every.counts_xid(x)));
        let every_but = HealthPolicy::parse("+all,13").unwrap();
        assert!(!every_but.counts_xid(13) && every_but.counts_xid(31));
    }

    #[test]
    fn all_switches_everything_off_except_explicit_counts() {
        let off = HealthPolicy::parse("all").unwrap();
        assert!(off.is_off() && !off.counts_ecc() && !off.counts_lost() && !off.counts_xid(79));
        assert_eq!(HealthPolicy::parse("XIDS").unwrap(), off);

        let only_79 = HealthPolicy::parse("all,+79").unwrap();
        assert!(
            !only_79.is_off(),
            "the device plugin's bug: here +79 still runs the loop"
        );
        assert!(only_79.counts_xid(79) && only_79.counts_lost());
        assert!(!only_79.counts_xid(48) && !only_79.counts_ecc());
    }

    #[test]
    fn bad_tokens_are_named() {
        let err = HealthPolicy::parse("13,x94,31").unwrap_err();
        assert!(
            matches!(&err, PolicyError::BadToken { token, .. } if token == "x94"),
            "{err}"
        );
        assert!(err.to_string().contains("\"x94\""), "{err}");
        for bad in [
            "+",
            "-",
            "++1",
            "1.5",
            "99999999999999999999999",
            "all94",
            "+-3",
        ] {
            let err = HealthPolicy::parse(bad).unwrap_err();
            assert!(matches!(err, PolicyError::BadToken { .. }), "{bad}: {err}");
        }
        let err = HealthPolicy::parse("94,+94").unwrap_err();
        assert_eq!(
            err,
            PolicyError::Conflict {
                spec: "94,+94".to_owned(),
                xid: 94
            }
        );
    }

    proptest! {
        #[test]
        fn display_parses_back(
            all in any::<bool>(),
            every in any::<bool>(),
            ignored in proptest::collection::btree_set(0u64..200, 0..5),
            enabled in proptest::collection::btree_set(200u64..400, 0..5),
        ) {
            let p = HealthPolicy { all_disabled: all, all_enabled: every, ignored, enabled };
            prop_assert_eq!(HealthPolicy::parse(&p.to_string()).unwrap(), p);
        }

        #[test]
        fn any_text_parses_or_errs_without_panic(spec in "[-+a-z0-9, ]{0,24}") {
            if let Ok(p) = HealthPolicy::parse(&spec) {
                prop_assert_eq!(HealthPolicy::parse(&p.to_string()).unwrap(), p);
            }
        }
    }
}
