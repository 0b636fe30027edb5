//! [`GpuUuid`]: how every record names a GPU or MIG device.
//!
//! A record's GPUs are their UUIDs, written once by the process that granted them, which saw
//! them through NVML (`nvmlDeviceGetUUID`: `GPU-…` for a GPU, `MIG-…` for a MIG device). A
//! process that cannot map a recorded GPU onto the GPUs it sees keeps the UUID as it was
//! written; it never makes one up. The empty string is refused here, so no record written now
//! can name "some GPU" without saying which (an empty UUID in the node's pool matched no GPU, and
//! so reserved none). The pool's records written so by an earlier release are read as GPUs held
//! without a name ([`crate::Reservation::unnamed`]) and repaired on evidence
//! ([`crate::repair_unnamed`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A GPU's or MIG device's UUID as NVML reports it: never empty.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GpuUuid(String);

/// An empty string where a GPU UUID belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an empty GPU UUID: records name GPUs by the UUID NVML reports (GPU-… or MIG-…)")]
pub struct EmptyUuid;

impl GpuUuid {
    /// `uuid`, refused when empty.
    pub fn new(uuid: impl Into<String>) -> Result<GpuUuid, EmptyUuid> {
        let uuid = uuid.into();
        if uuid.is_empty() {
            Err(EmptyUuid)
        } else {
            Ok(GpuUuid(uuid))
        }
    }

    /// The UUID's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for GpuUuid {
    type Error = EmptyUuid;
    fn try_from(uuid: String) -> Result<GpuUuid, EmptyUuid> {
        GpuUuid::new(uuid)
    }
}

impl From<GpuUuid> for String {
    fn from(uuid: GpuUuid) -> String {
        uuid.0
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for GpuUuid {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for GpuUuid {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for GpuUuid {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_uuids_are_unrepresentable_in_records() {
        assert_eq!(GpuUuid::new(""), Err(EmptyUuid));
        let err = serde_json::from_str::<Vec<GpuUuid>>(r#"["GPU-1", ""]"#)
            .expect_err("an empty UUID is refused");
        assert!(err.to_string().contains("an empty GPU UUID"), "{err}");
        let read: Vec<GpuUuid> =
            serde_json::from_str(r#"["GPU-1","MIG-2"]"#).expect("UUIDs read as written");
        assert_eq!(read[1], "MIG-2");
        assert_eq!(
            serde_json::to_string(&read).expect("written"),
            r#"["GPU-1","MIG-2"]"#
        );
    }
}
