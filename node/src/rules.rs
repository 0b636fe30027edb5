//! Device rules in the kernel's `devices.list` syntax: `c 195:3 rwm`, `b 8:* r`, `a *:* rwm`.
//!
//! Facts relied on (Linux `security/device_cgroup.c`, `Documentation/admin-guide/cgroup-v1/devices.rst`):
//! - A rule is `<type> <major>:<minor> <access>`: type `a` (all), `c` (char) or `b` (block);
//!   major and minor are decimal numbers or `*` (any); access is a non-empty subset of `rwm`
//!   (read, write, mknod).
//! - The v1 kernel treats type `a` as "change the default behaviour" and ignores the numbers and
//!   access that follow, so `a` is only meaningful as `a *:*`: we reject `a` with a number.
//! - A request (type, major, minor, access) is allowed by a rule when the type and numbers match
//!   (`a` and `*` match anything) and the requested access is a subset of the rule's
//!   (`match_exception`); an allow list allows a request when any of its rules does. The v1
//!   kernel keeps one entry per (type, major, minor) and ORs the access of repeated entries, which
//!   is what [`normalize`] does.
//! - The access bits' values are the eBPF ones (`BPF_DEVCG_ACC_MKNOD` = 1, `_READ` = 2,
//!   `_WRITE` = 4, include/uapi/linux/bpf.h), so the v2 program builder uses them unchanged.
//!
//! The default whitelist is Mesos's (`docs/reference/mesos-gpu-isolator.md` §5.1).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::inventory::DevNum;

/// The shape of a rule, quoted in every parse error.
const SYNTAX: &str = "`<a|b|c> <major|*>:<minor|*> <one or more of r, w, m>`, e.g. `c 195:3 rwm`";

/// A device rule that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The text is not a rule; `problem` says which part is wrong.
    #[error("device rule {text:?}: {problem}; expected {SYNTAX}")]
    Invalid {
        /// The whole rule text as given.
        text: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A line of a rule list is not a rule.
    #[error("line {line} of the device list")]
    Line {
        /// 1-based line number.
        line: usize,
        /// Why that line is not a rule.
        #[source]
        source: Box<RuleError>,
    },
}

/// Which devices a rule covers: character devices, block devices, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// Both character and block devices (`a`).
    All,
    /// Character devices (`c`).
    Char,
    /// Block devices (`b`).
    Block,
}

impl DeviceKind {
    /// The kernel's letter for this kind: `a`, `c` or `b`.
    pub fn letter(self) -> char {
        match self {
            DeviceKind::All => 'a',
            DeviceKind::Char => 'c',
            DeviceKind::Block => 'b',
        }
    }
}

/// A set of device access bits: read, write and mknod.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Access(u8);

impl Access {
    /// No access at all.
    pub const NONE: Access = Access(0);
    /// `m`: create the device node with mknod(2) (`BPF_DEVCG_ACC_MKNOD`).
    pub const MKNOD: Access = Access(1);
    /// `r`: open for reading (`BPF_DEVCG_ACC_READ`).
    pub const READ: Access = Access(2);
    /// `w`: open for writing (`BPF_DEVCG_ACC_WRITE`).
    pub const WRITE: Access = Access(4);
    /// `rw`: what Mesos grants a GPU on cgroups v2.
    pub const RW: Access = Access(2 | 4);
    /// `rwm`: everything.
    pub const RWM: Access = Access(1 | 2 | 4);

    /// The bits in the kernel's eBPF encoding (`BPF_DEVCG_ACC_*`).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The access made of `bits`, ignoring any bit other than r, w and m.
    pub const fn from_bits_truncate(bits: u8) -> Access {
        Access(bits & Access::RWM.0)
    }

    /// Every bit in `self` or in `other`.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// The bits of `self` that are not in `other`.
    pub const fn difference(self, other: Access) -> Access {
        Access(self.0 & !other.0)
    }

    /// True when every bit of `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Access {
    /// Prints the bits in the kernel's order, `r`, `w`, `m`; nothing for `Access::NONE`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (bit, letter) in [
            (Access::READ, "r"),
            (Access::WRITE, "w"),
            (Access::MKNOD, "m"),
        ] {
            if self.contains(bit) {
                f.write_str(letter)?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Access({self})")
    }
}

impl FromStr for Access {
    type Err = String;

    /// Parses a non-empty set of `r`, `w`, `m` in any order, each at most once.
    fn from_str(s: &str) -> Result<Access, String> {
        if s.is_empty() {
            return Err("no access given".to_owned());
        }
        let mut access = Access::NONE;
        for c in s.chars() {
            let bit = match c {
                'r' => Access::READ,
                'w' => Access::WRITE,
                'm' => Access::MKNOD,
                other => {
                    return Err(format!(
                        "access {s:?} has {other:?}, which is not r, w or m"
                    ));
                }
            };
            if access.contains(bit) {
                return Err(format!("access {s:?} names {c:?} twice"));
            }
            access = access.union(bit);
        }
        Ok(access)
    }
}

/// One entry of a device allow list, as the kernel's `devices.allow` and `devices.list` spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceRule {
    /// Character, block, or both.
    pub kind: DeviceKind,
    /// Major number; `None` is `*`.
    pub major: Option<u32>,
    /// Minor number; `None` is `*`.
    pub minor: Option<u32>,
    /// What the rule grants.
    pub access: Access,
}

impl DeviceRule {
    /// A rule for the one character device `dev`, e.g. `c 195:3 rwm` for `/dev/nvidia3`.
    pub fn char_device(dev: DevNum, access: Access) -> DeviceRule {
        DeviceRule {
            kind: DeviceKind::Char,
            major: Some(dev.major),
            minor: Some(dev.minor),
            access,
        }
    }

    /// `a *:* <access>`: every device.
    pub fn all(access: Access) -> DeviceRule {
        DeviceRule {
            kind: DeviceKind::All,
            major: None,
            minor: None,
            access,
        }
    }

    /// True when this rule's type and numbers cover device `dev` of type `kind` (`Char` or
    /// `Block`; a request of kind `All` is only covered by a rule of kind `All`).
    pub fn covers(&self, kind: DeviceKind, dev: DevNum) -> bool {
        (self.kind == DeviceKind::All || self.kind == kind)
            && self.major.is_none_or(|m| m == dev.major)
            && self.minor.is_none_or(|m| m == dev.minor)
    }

    /// True when this rule allows `access` to device `dev` of type `kind`.
    fn permits(&self, kind: DeviceKind, dev: DevNum, access: Access) -> bool {
        self.covers(kind, dev) && self.access.contains(access)
    }

    /// True for `a *:* rwm`, the rule that allows everything.
    pub fn is_allow_all(&self) -> bool {
        *self == DeviceRule::all(Access::RWM)
    }
}

impl fmt::Display for DeviceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let num = |n: Option<u32>| n.map_or_else(|| "*".to_owned(), |n| n.to_string());
        write!(
            f,
            "{} {}:{} {}",
            self.kind.letter(),
            num(self.major),
            num(self.minor),
            self.access
        )
    }
}

impl FromStr for DeviceRule {
    type Err = RuleError;

    /// Parses `c 195:3 rwm`; fields may be separated by any run of blanks.
    fn from_str(text: &str) -> Result<DeviceRule, RuleError> {
        let invalid = |problem: String| RuleError::Invalid {
            text: text.to_owned(),
            problem,
        };
        let fields: Vec<&str> = text.split_ascii_whitespace().collect();
        let [kind, numbers, access] = fields[..] else {
            return Err(invalid(format!("has {} fields, not 3", fields.len())));
        };
        let kind = match kind {
            "a" => DeviceKind::All,
            "c" => DeviceKind::Char,
            "b" => DeviceKind::Block,
            other => return Err(invalid(format!("type {other:?} is not a, b or c"))),
        };
        let Some((major, minor)) = numbers.split_once(':') else {
            return Err(invalid(format!("{numbers:?} is not <major>:<minor>")));
        };
        let major = parse_number(major).map_err(|p| invalid(format!("major {p}")))?;
        let minor = parse_number(minor).map_err(|p| invalid(format!("minor {p}")))?;
        if kind == DeviceKind::All && (major.is_some() || minor.is_some()) {
            return Err(invalid("type a (all devices) takes only *:*".to_owned()));
        }
        let access = access.parse().map_err(invalid)?;
        Ok(DeviceRule {
            kind,
            major,
            minor,
            access,
        })
    }
}

/// Parses `*` or a decimal `u32` (digits only, no sign).
fn parse_number(s: &str) -> Result<Option<u32>, String> {
    if s == "*" {
        return Ok(None);
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not `*` or a decimal number"));
    }
    s.parse()
        .map(Some)
        .map_err(|_| format!("{s} is larger than {}", u32::MAX))
}

/// Parses a rule list such as the contents of `devices.list`: one rule per line, blank lines
/// ignored.
pub fn parse_list(text: &str) -> Result<Vec<DeviceRule>, RuleError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            l.parse().map_err(|e| RuleError::Line {
                line: i + 1,
                source: Box::new(e),
            })
        })
        .collect()
}

/// The allow list in the kernel's canonical form: one rule per (type, major, minor) with the
/// access of all rules for it ORed, rules without access dropped, sorted.
pub fn normalize(rules: &[DeviceRule]) -> Vec<DeviceRule> {
    let mut merged: BTreeMap<(DeviceKind, Option<u32>, Option<u32>), Access> = BTreeMap::new();
    for r in rules {
        let acc = merged.entry((r.kind, r.major, r.minor)).or_default();
        *acc = acc.union(r.access);
    }
    merged
        .into_iter()
        .filter(|(_, access)| !access.is_empty())
        .map(|((kind, major, minor), access)| DeviceRule {
            kind,
            major,
            minor,
            access,
        })
        .collect()
}

/// True when the allow list `rules` allows `access` to device `dev` of type `kind`: the
/// reference semantics that both the v1 kernel and the v2 program implement (their tests check
/// them against it).
pub fn is_allowed(rules: &[DeviceRule], kind: DeviceKind, dev: DevNum, access: Access) -> bool {
    rules.iter().any(|r| r.permits(kind, dev, access))
}

/// Mesos's default device whitelist, applied to every container before its GPUs
/// (`docs/reference/mesos-gpu-isolator.md` §5.1): mknod of any device, the consoles and terminals,
/// `/dev/net/tun`, and null, zero, full, tty, urandom and random.
pub fn default_whitelist() -> Vec<DeviceRule> {
    let c = |major, minor: Option<u32>| DeviceRule {
        kind: DeviceKind::Char,
        major: Some(major),
        minor,
        access: Access::RWM,
    };
    vec![
        DeviceRule {
            kind: DeviceKind::Char,
            major: None,
            minor: None,
            access: Access::MKNOD,
        },
        DeviceRule {
            kind: DeviceKind::Block,
            major: None,
            minor: None,
            access: Access::MKNOD,
        },
        c(5, Some(1)),    // /dev/console
        c(4, Some(0)),    // /dev/tty0
        c(4, Some(1)),    // /dev/tty1
        c(136, None),     // /dev/pts/*
        c(5, Some(2)),    // /dev/ptmx
        c(10, Some(200)), // /dev/net/tun
        c(1, Some(3)),    // /dev/null
        c(1, Some(5)),    // /dev/zero
        c(1, Some(7)),    // /dev/full
        c(5, Some(0)),    // /dev/tty
        c(1, Some(9)),    // /dev/urandom
        c(1, Some(8)),    // /dev/random
    ]
}

/// Proptest strategies for rules, for this crate's tests and those of the v1 and v2 enforcers.
#[cfg(any(test, feature = "fixtures"))]
pub mod arb {
    use super::{Access, DeviceKind, DeviceRule};
    use proptest::prelude::*;

    /// Any non-empty access.
    pub fn arb_access() -> impl Strategy<Value = Access> {
        (1u8..=7).prop_map(Access::from_bits_truncate)
    }

    /// Any rule, with small and large device numbers and wildcards.
    pub fn arb_rule() -> impl Strategy<Value = DeviceRule> {
        let num = prop_oneof![
            Just(None),
            (0u32..8).prop_map(Some),
            any::<u32>().prop_map(Some)
        ];
        prop_oneof![
            arb_access().prop_map(DeviceRule::all),
            (
                prop_oneof![Just(DeviceKind::Char), Just(DeviceKind::Block)],
                num.clone(),
                num,
                arb_access()
            )
                .prop_map(|(kind, major, minor, access)| DeviceRule {
                    kind,
                    major,
                    minor,
                    access
                }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::arb::{arb_access, arb_rule};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_kernel_forms() {
        for text in [
            "c 195:3 rwm",
            "a *:* rwm",
            "b 8:* r",
            "c *:* m",
            "c 136:* rwm",
            "c 1:3 rw",
        ] {
            let rule: DeviceRule = text.parse().expect(text);
            assert_eq!(rule.to_string(), text);
        }
        let r: DeviceRule = "c 195:3 rwm".parse().expect("valid");
        assert_eq!(
            r,
            DeviceRule::char_device(
                DevNum {
                    major: 195,
                    minor: 3
                },
                Access::RWM
            )
        );
        let r: DeviceRule = "  c\t195:255   mwr ".parse().expect("blanks and order");
        assert_eq!(r.to_string(), "c 195:255 rwm");
    }

    #[test]
    fn errors_name_the_bad_text() {
        let cases = [
            ("x 1:3 rw", "type \"x\""),
            ("c 1-3 rw", "\"1-3\" is not <major>:<minor>"),
            ("c 1:3", "has 2 fields"),
            ("c +1:3 rw", "major \"+1\""),
            ("c 1:99999999999 rw", "minor 99999999999 is larger than"),
            ("c 1:3 rx", "'x'"),
            ("c 1:3 rr", "'r' twice"),
            ("a 1:* rwm", "type a (all devices) takes only *:*"),
            ("", "has 0 fields"),
        ];
        for (text, needle) in cases {
            let err = text.parse::<DeviceRule>().expect_err(text).to_string();
            assert!(
                err.contains(&format!("{text:?}")),
                "{err} should quote {text:?}"
            );
            assert!(err.contains(needle), "{err} should contain {needle}");
            assert!(
                err.contains("e.g. `c 195:3 rwm`"),
                "{err} should show the syntax"
            );
        }
    }

    #[test]
    fn list_errors_name_the_line() {
        let err = parse_list("c 1:3 rwm\n\nc 1:5 q\n").expect_err("bad line 3");
        assert!(matches!(err, RuleError::Line { line: 3, .. }), "{err:?}");
        assert_eq!(
            parse_list("a *:* rwm\n").expect("valid"),
            vec![DeviceRule::all(Access::RWM)]
        );
    }

    #[test]
    fn normalize_merges_like_the_kernel() {
        let rules =
            parse_list("c 195:3 r\nc 195:3 w\nb 8:0 rwm\nc 1:3 m\nc 1:3 rwm\n").expect("valid");
        let got: Vec<String> = normalize(&rules).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["c 1:3 rwm", "c 195:3 rw", "b 8:0 rwm"]);
        let empty = DeviceRule {
            access: Access::NONE,
            ..DeviceRule::all(Access::RWM)
        };
        assert!(normalize(&[empty]).is_empty());
    }

    #[test]
    fn allow_semantics() {
        let rules = parse_list("c 195:* rw\nc 1:3 r\na *:* m\n").expect("valid");
        let gpu = DevNum {
            major: 195,
            minor: 7,
        };
        assert!(is_allowed(&rules, DeviceKind::Char, gpu, Access::RW));
        assert!(!is_allowed(&rules, DeviceKind::Char, gpu, Access::RWM));
        assert!(!is_allowed(&rules, DeviceKind::Block, gpu, Access::READ));
        assert!(is_allowed(&rules, DeviceKind::Block, gpu, Access::MKNOD));
        assert!(!is_allowed(
            &rules,
            DeviceKind::Char,
            DevNum { major: 1, minor: 3 },
            Access::WRITE
        ));
    }

    #[test]
    fn default_whitelist_matches_mesos() {
        let got: Vec<String> = default_whitelist()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "c *:* m",
                "b *:* m",
                "c 5:1 rwm",
                "c 4:0 rwm",
                "c 4:1 rwm",
                "c 136:* rwm",
                "c 5:2 rwm",
                "c 10:200 rwm",
                "c 1:3 rwm",
                "c 1:5 rwm",
                "c 1:7 rwm",
                "c 5:0 rwm",
                "c 1:9 rwm",
                "c 1:8 rwm",
            ]
        );
    }

    proptest! {
        #[test]
        fn rule_round_trips(rule in arb_rule()) {
            let text = rule.to_string();
            prop_assert_eq!(text.parse::<DeviceRule>(), Ok(rule));
        }

        #[test]
        fn list_round_trips(rules in proptest::collection::vec(arb_rule(), 0..12)) {
            let text: String = rules.iter().map(|r| format!("{r}\n")).collect();
            prop_assert_eq!(parse_list(&text), Ok(rules));
        }

        #[test]
        fn parse_never_panics(text in "\\PC{0,24}") {
            let _ = text.parse::<DeviceRule>();
        }

        #[test]
        fn normalize_keeps_semantics(
            rules in proptest::collection::vec(arb_rule(), 0..8),
            block in any::<bool>(),
            major in 0u32..9,
            minor in 0u32..9,
            access in arb_access(),
        ) {
            let kind = if block { DeviceKind::Block } else { DeviceKind::Char };
            let dev = DevNum { major, minor };
            let norm = normalize(&rules);
            // Merging can only widen a single entry's access, never narrow it.
            if is_allowed(&rules, kind, dev, access) {
                prop_assert!(is_allowed(&norm, kind, dev, access));
            }
            prop_assert_eq!(normalize(&norm), norm);
        }
    }
}
