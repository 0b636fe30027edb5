//! Mesos container ids, checked once so that every later use may name a directory with one.
//!
//! Mesos container ids become cgroup directory names (`<root>/mesos/<id>`) and file names in
//! the work directory, so an id must be exactly one path component: no `/`, not `.` or `..`,
//! and at most 255 bytes (`NAME_MAX`). Mesos's own ids are UUIDs; the isolator accepts the
//! portable file-name characters (POSIX 3.282) so that operators' ids work too.

use std::fmt;
use std::str::FromStr;

/// Why a container id was refused.
#[derive(Debug, thiserror::Error)]
pub enum ContainerIdError {
    /// An id that cannot name a cgroup directory.
    #[error(
        "container id {id:?}: expected 1 to 255 characters from A-Z, a-z, 0-9, `_`, `.`, `-`, other than `.` and `..`"
    )]
    Invalid {
        /// The id as given.
        id: String,
    },
}

/// A Mesos container id, checked to be safe as one path component.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId(String);

impl ContainerId {
    /// Checks `id`: 1 to 255 bytes of `[A-Za-z0-9_.-]`, and not `.` or `..`.
    pub fn new(id: impl Into<String>) -> Result<ContainerId, ContainerIdError> {
        let id = id.into();
        let valid_chars = id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if id.is_empty() || id.len() > 255 || !valid_chars || id == "." || id == ".." {
            return Err(ContainerIdError::Invalid { id });
        }
        Ok(ContainerId(id))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ContainerId {
    type Err = ContainerIdError;

    fn from_str(s: &str) -> Result<ContainerId, ContainerIdError> {
        ContainerId::new(s)
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::{Component, Path};

    #[test]
    fn container_ids() {
        for ok in [
            "a",
            "0f1e-2d3c_4b.5a",
            "mesos-container-1",
            "...",
            &"x".repeat(255),
        ] {
            assert_eq!(ContainerId::new(ok).expect(ok).as_str(), ok);
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a b",
            "é",
            "a\0b",
            &"x".repeat(256),
        ] {
            let err = ContainerId::new(bad).expect_err(bad);
            assert!(matches!(&err, ContainerIdError::Invalid { id } if id == bad));
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    proptest! {
        #[test]
        fn valid_ids_are_one_component(id in "[A-Za-z0-9_.-]{1,40}") {
            match ContainerId::new(id.clone()) {
                Ok(cid) => {
                    let mut parts = Path::new(cid.as_str()).components();
                    prop_assert!(matches!(parts.next(), Some(Component::Normal(_))));
                    prop_assert!(parts.next().is_none());
                }
                Err(_) => prop_assert!(id == "." || id == ".."),
            }
        }
    }
}
