//! What well-known XIDs mean, for limitation messages and logs.
//!
//! Texts from NVIDIA's XID catalogue ("XID Errors", docs.nvidia.com/deploy/xid-errors) and the
//! device plugin's comments (`shared/reference/gpu_sched.md` §1.1).

const MEANINGS: &[(u64, &str)] = &[
    (13, "graphics engine exception"),
    (31, "GPU memory page fault"),
    (32, "invalid or corrupted push buffer stream"),
    (38, "driver firmware error"),
    (43, "GPU stopped processing"),
    (45, "preemptive cleanup, due to previous errors"),
    (48, "double-bit ECC error"),
    (61, "internal micro-controller breakpoint/warning"),
    (62, "internal micro-controller halt"),
    (63, "ECC page retirement or row remapping event"),
    (64, "ECC page retirement or row remapping failure"),
    (68, "video processor exception"),
    (69, "graphics engine class error"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (95, "uncontained ECC error"),
    (109, "context switch timeout"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
];

/// The meaning of XID `xid`, when it is a well-known one.
pub(crate) fn xid_meaning(xid: u64) -> Option<&'static str> {
    MEANINGS
        .binary_search_by_key(&xid, |&(x, _)| x)
        .ok()
        .map(|i| MEANINGS[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_found() {
        assert!(MEANINGS.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(xid_meaning(79), Some("GPU has fallen off the bus"));
        assert_eq!(xid_meaning(13), Some("graphics engine exception"));
        assert_eq!(xid_meaning(1), None);
    }
}
