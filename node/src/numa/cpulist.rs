//! The kernel's list format for CPU and memory-node sets (`0-3,8,10-11`), as in
//! `cpuset.cpus`, `cpuset.mems`, `Cpus_allowed_list` and `/sys/devices/system/cpu/online`
//! (Documentation/admin-guide/cgroup-v2.rst, "cpuset.cpus"; `bitmap_parselist`). An empty
//! string (or a lone newline) is the empty set.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// The largest id accepted: above the kernel's largest `NR_CPUS` (8192) and `MAX_NUMNODES`
/// (1024), and small enough that no list can make us hold a huge set.
pub(crate) const MAX_ID: u32 = 65_535;

/// A bad list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    /// Text that is not a list.
    #[error(
        "{text:?}: expected a list such as `0-3,8` (ids from 0 to {MAX_ID}, ranges low-high, joined by commas)"
    )]
    Syntax {
        /// The text given.
        text: String,
    },
}

/// A set of CPU (or memory node) ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuList(BTreeSet<u32>);

impl CpuList {
    /// The set holding `ids`.
    pub fn from_ids(ids: impl IntoIterator<Item = u32>) -> CpuList {
        CpuList(ids.into_iter().collect())
    }

    /// True when the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many ids it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The ids, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// The ids in both sets.
    pub fn intersection(&self, other: &CpuList) -> CpuList {
        CpuList(self.0.intersection(&other.0).copied().collect())
    }

    /// The ids in either set.
    pub fn union(&self, other: &CpuList) -> CpuList {
        CpuList(self.0.union(&other.0).copied().collect())
    }

    #[cfg(test)]
    /// True when every id of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuList) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromStr for CpuList {
    type Err = CpuListError;

    fn from_str(text: &str) -> Result<CpuList, CpuListError> {
        let bad = || CpuListError::Syntax {
            text: text.to_owned(),
        };
        let id = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse::<u32>()
                .ok()
                .filter(|&n| n <= MAX_ID)
                .ok_or_else(bad)
        };
        let trimmed = text.trim_end_matches('\n');
        let mut set = BTreeSet::new();
        if trimmed.is_empty() {
            return Ok(CpuList(set));
        }
        for part in trimmed.split(',') {
            let (low, high) = match part.split_once('-') {
                Some((low, high)) => (id(low)?, id(high)?),
                None => {
                    let n = id(part)?;
                    (n, n)
                }
            };
            if low > high {
                return Err(bad());
            }
            set.extend(low..=high);
        }
        Ok(CpuList(set))
    }
}

/// The kernel's form: ascending ranges, `0-3,8`; empty for the empty set.
impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.0.iter().copied().peekable();
        let mut first = true;
        while let Some(low) = ids.next() {
            let mut high = low;
            while ids.peek() == Some(&(high + 1)) {
                high += 1;
                ids.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if low == high {
                write!(f, "{low}")?;
            } else {
                write!(f, "{low}-{high}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn kernel_lists() {
        let list: CpuList = "0-3,8,10-11\n".parse().unwrap();
        assert_eq!(list.iter().collect::<Vec<_>>(), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(list.to_string(), "0-3,8,10-11");
        assert!("".parse::<CpuList>().unwrap().is_empty());
        assert!("\n".parse::<CpuList>().unwrap().is_empty());
        assert_eq!("5".parse::<CpuList>().unwrap().to_string(), "5");
        assert_eq!(
            CpuList::from_ids([1, 0, 2, 7]).to_string(),
            "0-2,7",
            "ranges are merged"
        );
    }

    #[test]
    fn bad_lists_name_the_text() {
        for bad in [
            "a", "1-", "-1", "3-1", "1,,2", " 1", "1 ", "65536", "+1", "1-2-3",
        ] {
            let err = bad.parse::<CpuList>().unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn set_operations() {
        let a: CpuList = "0-3".parse().unwrap();
        let b: CpuList = "2-5".parse().unwrap();
        assert_eq!(a.intersection(&b).to_string(), "2-3");
        assert_eq!(a.union(&b).to_string(), "0-5");
        assert!(a.intersection(&b).is_subset(&a));
        assert!(!a.is_subset(&b));
    }

    proptest! {
        #[test]
        fn display_parses_back(ids in proptest::collection::btree_set(0u32..200, 0..40)) {
            let list = CpuList::from_ids(ids.iter().copied());
            let back: CpuList = list.to_string().parse().unwrap();
            prop_assert_eq!(back, list);
        }
    }
}
