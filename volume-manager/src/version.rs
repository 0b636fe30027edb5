//! The NVIDIA driver version, e.g. `550.54.14` (NVML `nvmlSystemGetDriverVersion`).
//!
//! It names the volume directory (`nvidia_<version>`) and is the suffix every versioned driver
//! library carries (`libnvidia-ml.so.550.54.14`), so it is accepted only as dot-separated decimal
//! numbers: nothing that could be a path (`/`, `..`) or a glob reaches the file system.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Longest version accepted; real ones are at most 10 characters.
const MAX_LEN: usize = 32;

/// Why a string is not a driver version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "driver version {got:?}: expected dot-separated decimal numbers of at most {MAX_LEN} \
     characters, such as 550.54.14"
)]
pub struct VersionError {
    /// The rejected input.
    pub got: String,
}

/// A validated driver version. Ordered numerically, component by component.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DriverVersion(String);

impl DriverVersion {
    /// The version text, e.g. `550.54.14`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The volume directory name, `nvidia_<version>`.
    pub fn volume_name(&self) -> String {
        format!("nvidia_{}", self.0)
    }

    /// The version in a volume directory name, if `name` is `nvidia_<valid version>`.
    pub fn from_volume_name(name: &str) -> Option<DriverVersion> {
        name.strip_prefix("nvidia_")?.parse().ok()
    }

    /// The version a library file name ends with, e.g. `550.54.14` for
    /// `libnvidia-ml.so.550.54.14`; `None` for `libcuda.so` or `libcuda.so.1`.
    pub fn from_library_name(file_name: &str) -> Option<DriverVersion> {
        let (_, version) = file_name.split_once(".so.")?;
        // A driver version has at least two components; `.so.1` is a SONAME, not a version.
        version.contains('.').then(|| version.parse().ok())?
    }

    fn components(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.split('.').map(|c| c.parse().unwrap_or(u64::MAX))
    }
}

impl FromStr for DriverVersion {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let valid = !s.is_empty()
            && s.len() <= MAX_LEN
            && s.split('.')
                .all(|c| !c.is_empty() && c.len() <= 9 && c.bytes().all(|b| b.is_ascii_digit()));
        if valid {
            Ok(DriverVersion(s.to_owned()))
        } else {
            Err(VersionError { got: s.to_owned() })
        }
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Ord for DriverVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.components()
            .cmp(other.components())
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for DriverVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl serde::Serialize for DriverVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for DriverVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(s: &str) -> DriverVersion {
        s.parse().expect("valid")
    }

    #[test]
    fn accepts_real_versions() {
        for s in ["550.54.14", "470.82.01", "535.104.05", "361.93.02", "1"] {
            assert_eq!(v(s).as_str(), s);
        }
        assert_eq!(v("550.54.14").volume_name(), "nvidia_550.54.14");
    }

    #[test]
    fn refuses_paths_and_junk() {
        for s in [
            "",
            "..",
            "../etc",
            "550/54",
            "550..54",
            ".550",
            "550.",
            "550.54.14 ",
            "5a0",
            "550.54.14/",
        ] {
            let err = s.parse::<DriverVersion>().expect_err(s);
            assert!(err.to_string().contains("550.54.14"), "{err}");
        }
    }

    #[test]
    fn orders_numerically() {
        assert!(v("550.54.14") > v("470.82.01"));
        assert!(v("535.104.05") > v("535.54.03"));
        assert!(v("550.54.14") > v("550.54"));
    }

    #[test]
    fn finds_the_version_in_library_names() {
        assert_eq!(
            DriverVersion::from_library_name("libnvidia-ml.so.550.54.14"),
            Some(v("550.54.14"))
        );
        assert_eq!(DriverVersion::from_library_name("libcuda.so"), None);
        assert_eq!(DriverVersion::from_library_name("libcuda.so.1"), None);
        assert_eq!(
            DriverVersion::from_library_name("libGL.so.1.7.0"),
            Some(v("1.7.0"))
        );
        assert_eq!(
            DriverVersion::from_volume_name("nvidia_550.54.14"),
            Some(v("550.54.14"))
        );
        assert_eq!(DriverVersion::from_volume_name("nvidia_.."), None);
    }

    proptest! {
        #[test]
        fn valid_versions_never_contain_path_syntax(s in "\\PC{0,40}") {
            if let Ok(version) = s.parse::<DriverVersion>() {
                prop_assert!(!version.as_str().contains('/'));
                prop_assert!(!version.as_str().contains(".."));
                prop_assert!(!version.as_str().starts_with('.'));
            }
        }

        #[test]
        fn dotted_numbers_round_trip(parts in proptest::collection::vec(0u32..100_000, 1..4)) {
            let s = parts.iter().map(u32::to_string).collect::<Vec<_>>().join(".");
            let version: DriverVersion = s.parse().expect("valid");
            prop_assert_eq!(version.as_str(), s.as_str());
        }
    }
}
