//! [`MigStrategy`]: how MIG devices are offered and requested, `single` or `mixed`
//! (`docs/reference/mig.md` §3). The agent flags offer by it ([`crate::agent_flags`]) and the
//! lifecycle maps requests to MIG devices by it ([`crate::lifecycle`]).

use std::fmt;
use std::str::FromStr;

/// How MIG devices are offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigStrategy {
    /// Every MIG device is one `gpus` unit.
    #[default]
    Single,
    /// Each MIG profile is its own scalar resource.
    Mixed,
}

impl fmt::Display for MigStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        })
    }
}

/// A MIG strategy that is neither `single` nor `mixed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MIG strategy {got:?}: expected single or mixed")]
pub struct MigStrategyError {
    /// The value as given.
    pub got: String,
}

impl FromStr for MigStrategy {
    type Err = MigStrategyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "single" => Ok(MigStrategy::Single),
            "mixed" => Ok(MigStrategy::Mixed),
            other => Err(MigStrategyError {
                got: other.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_and_name_the_accepted_values() {
        assert_eq!("single".parse::<MigStrategy>(), Ok(MigStrategy::Single));
        assert_eq!(" mixed".parse::<MigStrategy>(), Ok(MigStrategy::Mixed));
        assert_eq!(
            "none".parse::<MigStrategy>().unwrap_err().to_string(),
            "MIG strategy \"none\": expected single or mixed"
        );
    }
}
