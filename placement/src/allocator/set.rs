//! [`GpuSet`]: a set of GPUs named by NVML index, kept as a 64-bit mask.
//!
//! NVML numbers GPUs `0..nvmlDeviceGetCount()`, and no node carries more than 64 GPUs (an HGX
//! board has 8 or 16; NVL72 racks are split into nodes of 4), so one `u64` holds any set and set
//! operations are single instructions.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::AllocError;

/// A set of GPUs by NVML index (0 to `GpuSet::MAX_INDEX`), iterated in ascending index order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(into = "Vec<u32>", try_from = "Vec<u32>")]
pub struct GpuSet(u64);

impl GpuSet {
    /// The empty set.
    pub const EMPTY: GpuSet = GpuSet(0);

    /// The highest NVML index a set can hold.
    pub(crate) const MAX_INDEX: u32 = mesos_gpu_node::discovery::MAX_GPUS - 1;

    /// The set of these indices; an index above `GpuSet::MAX_INDEX` is refused.
    pub fn from_indices(indices: impl IntoIterator<Item = u32>) -> Result<GpuSet, AllocError> {
        indices.into_iter().try_fold(GpuSet::EMPTY, |set, index| {
            if index > Self::MAX_INDEX {
                Err(AllocError::IndexOutOfRange { index })
            } else {
                Ok(GpuSet(set.0 | 1 << index))
            }
        })
    }

    pub(crate) const fn from_mask(mask: u64) -> GpuSet {
        GpuSet(mask)
    }

    pub(crate) const fn mask(self) -> u64 {
        self.0
    }

    /// Whether the set holds the GPU with NVML index `index`.
    pub fn contains(self, index: u32) -> bool {
        index <= Self::MAX_INDEX && self.0 & (1 << index) != 0
    }

    /// Number of GPUs in the set.
    pub fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    #[cfg(test)]
    /// Whether every GPU of `self` is also in `other`.
    pub(crate) fn is_subset(self, other: GpuSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// GPUs in either set.
    #[must_use]
    pub fn union(self, other: GpuSet) -> GpuSet {
        GpuSet(self.0 | other.0)
    }

    /// GPUs in both sets.
    #[must_use]
    pub fn intersection(self, other: GpuSet) -> GpuSet {
        GpuSet(self.0 & other.0)
    }

    /// GPUs of `self` that are not in `other`.
    #[must_use]
    pub fn difference(self, other: GpuSet) -> GpuSet {
        GpuSet(self.0 & !other.0)
    }

    /// The NVML indices, ascending.
    pub fn iter(self) -> impl Iterator<Item = u32> {
        Bits(self.0)
    }

    /// The NVML indices, ascending, as a vector.
    pub fn to_vec(self) -> Vec<u32> {
        self.iter().collect()
    }
}

/// Iterator over the set bits of a mask, lowest first.
pub(crate) struct Bits(pub(crate) u64);

impl Iterator for Bits {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let bit = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(bit)
    }
}

impl From<GpuSet> for Vec<u32> {
    fn from(set: GpuSet) -> Vec<u32> {
        set.to_vec()
    }
}

impl TryFrom<Vec<u32>> for GpuSet {
    type Error = AllocError;

    fn try_from(indices: Vec<u32>) -> Result<GpuSet, AllocError> {
        GpuSet::from_indices(indices)
    }
}

/// Prints the indices comma-separated (`0,3`), or `none` for the empty set.
impl fmt::Display for GpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        for (n, index) in self.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{index}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuSet{{{self}}}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn builds_iterates_and_prints_in_index_order() {
        let set = GpuSet::from_indices([5, 0, 3, 63]).unwrap();
        assert_eq!(set.to_vec(), vec![0, 3, 5, 63]);
        assert_eq!(set.len(), 4);
        assert_eq!(set.to_string(), "0,3,5,63");
        assert_eq!(format!("{set:?}"), "GpuSet{0,3,5,63}");
        assert_eq!(GpuSet::EMPTY.to_string(), "none");
        assert!(
            set.contains(63) && !set.contains(1) && !set.contains(64) && !set.contains(u32::MAX)
        );
    }

    #[test]
    fn refuses_an_index_above_63() {
        let err = GpuSet::from_indices([1, 64]).unwrap_err();
        assert_eq!(err, AllocError::IndexOutOfRange { index: 64 });
        assert_eq!(
            err.to_string(),
            "GPU index 64 is out of range: expected 0 to 63"
        );
    }

    #[test]
    fn set_operations() {
        let a = GpuSet::from_indices([0, 1, 2]).unwrap();
        let b = GpuSet::from_indices([2, 3]).unwrap();
        assert_eq!(a.union(b).to_vec(), vec![0, 1, 2, 3]);
        assert_eq!(a.intersection(b).to_vec(), vec![2]);
        assert_eq!(a.difference(b).to_vec(), vec![0, 1]);
        assert!(a.intersection(b).is_subset(a) && !a.is_subset(b));
        assert!(GpuSet::EMPTY.is_empty() && GpuSet::EMPTY.is_subset(b));
    }

    #[test]
    fn serializes_as_an_index_list() {
        let set = GpuSet::from_indices([1, 4]).unwrap();
        assert_eq!(serde_json::to_string(&set).unwrap(), "[1,4]");
        assert_eq!(serde_json::from_str::<GpuSet>("[4,1,4]").unwrap(), set);
        let err = serde_json::from_str::<GpuSet>("[70]")
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPU index 70 is out of range"), "{err}");
    }
}
