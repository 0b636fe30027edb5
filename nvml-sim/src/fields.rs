//! The text forms node descriptions and NVML calls share: PCI bus ids, GPU UUIDs, CPU lists,
//! hex ids, versions.
//!
//! PCI bus ids follow `nvmlDeviceGetHandleByPciBusId_v2`'s documented input forms (all numbers
//! hexadecimal): `domain:bus:device.function`, `domain:bus:device` and `bus:device.function`.
//! NVML prints them back as `%08X:%02X:%02X.0` (`busId`) and `%04X:%02X:%02X.0`
//! (`busIdLegacy`). CPU lists use the kernel's cpulist syntax (`0-19,40-59`, as in
//! `/sys/devices/system/node/node0/cpulist`).

/// A GPU's PCI address; NVML's bus ids always name function 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PciAddr {
    pub(crate) domain: u32,
    pub(crate) bus: u32,
    pub(crate) device: u32,
    pub(crate) function: u32,
}

impl PciAddr {
    /// `%08X:%02X:%02X.0`, the `busId` form.
    pub(crate) fn bus_id(self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// `%04X:%02X:%02X.0`, the `busIdLegacy` form.
    pub(crate) fn bus_id_legacy(self) -> String {
        format!("{:04X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }
}

/// What a PCI bus id must look like, for error messages.
pub(crate) const BUS_ID_FORMS: &str = "hex domain:bus:device.function such as 00000000:06:00.0 (or domain:bus:device, bus:device.function)";

/// Parses a PCI bus id in any of the forms NVML accepts; `None` when it is not one.
pub(crate) fn parse_bus_id(text: &str) -> Option<PciAddr> {
    let text = text.trim();
    let (rest, function) = match text.rsplit_once('.') {
        Some((rest, f)) => (rest, Some(hex(f, 0x7)?)),
        None => (text, None),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, device) = match (parts.as_slice(), function) {
        ([d, b, dev], _) => (hex(d, 0xFFFF_FFFF)?, hex(b, 0xFF)?, hex(dev, 0x1F)?),
        ([b, dev], Some(_)) => (0, hex(b, 0xFF)?, hex(dev, 0x1F)?),
        _ => return None,
    };
    Some(PciAddr {
        domain,
        bus,
        device,
        function: function.unwrap_or(0),
    })
}

fn hex(text: &str, max: u32) -> Option<u32> {
    if text.is_empty() || text.len() > 8 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok().filter(|v| *v <= max)
}

/// Parses `0x1DB110DE` (or `1DB110DE`) into a 32-bit PCI id.
pub(crate) fn parse_hex_id(text: &str) -> Option<u32> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    hex(digits, u32::MAX)
}

/// The largest CPU number a CPU list may name.
pub(crate) const MAX_CPU: u32 = 8191;

/// Parses a kernel cpulist (`0-3,8,10-11`) into sorted, distinct CPU numbers.
pub(crate) fn parse_cpulist(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (
                lo.trim().parse::<u32>().ok()?,
                hi.trim().parse::<u32>().ok()?,
            ),
            None => {
                let cpu = part.parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        if lo > hi || hi > MAX_CPU {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Parses `"7.0"` into (7, 0).
pub(crate) fn parse_major_minor(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// True for `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex digits), the form NVML prints.
pub(crate) fn is_gpu_uuid(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn bus_id_forms() {
        let a = PciAddr {
            domain: 0,
            bus: 6,
            device: 0,
            function: 0,
        };
        assert_eq!(parse_bus_id("00000000:06:00.0"), Some(a));
        assert_eq!(parse_bus_id("0000:06:00.0"), Some(a));
        assert_eq!(parse_bus_id("06:00.0"), Some(a));
        assert_eq!(parse_bus_id("0:6:0"), Some(a));
        assert_eq!(parse_bus_id("0000:8a:00.0").map(|p| p.bus), Some(0x8A));
        assert_eq!(a.bus_id(), "00000000:06:00.0");
        assert_eq!(a.bus_id_legacy(), "0000:06:00.0");
        for bad in [
            "",
            "06:00",
            "xx:00.0",
            "0000:100:00.0",
            "0000:06:20.0",
            "0000:06:00.8",
            "a:b:c:d.0",
        ] {
            assert_eq!(parse_bus_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-3,8"), Some(vec![0, 1, 2, 3, 8]));
        assert_eq!(parse_cpulist("5, 1-2,2"), Some(vec![1, 2, 5]));
        for bad in ["", "3-1", "a", "1-", "9000"] {
            assert_eq!(parse_cpulist(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn small_fields() {
        assert_eq!(parse_hex_id("0x1DB110DE"), Some(0x1DB1_10DE));
        assert_eq!(parse_hex_id("10de"), Some(0x10DE));
        assert_eq!(parse_hex_id("0x"), None);
        assert_eq!(parse_major_minor("12.4"), Some((12, 4)));
        assert_eq!(parse_major_minor("12"), None);
        assert!(is_gpu_uuid("GPU-5a1f0e2c-8d3b-4c7a-9e61-0b2d4f6a8c10"));
        assert!(!is_gpu_uuid("GPU-5a1f0e2c-8d3b-4c7a-9e61"));
        assert!(!is_gpu_uuid("MIG-5a1f0e2c-8d3b-4c7a-9e61-0b2d4f6a8c10"));
    }

    proptest! {
        #[test]
        fn bus_id_round_trips(domain in 0u32..=0xFFFF, bus in 0u32..=0xFF, device in 0u32..=0x1F) {
            let addr = PciAddr { domain, bus, device, function: 0 };
            prop_assert_eq!(parse_bus_id(&addr.bus_id()), Some(addr));
            prop_assert_eq!(parse_bus_id(&addr.bus_id_legacy()), Some(addr));
            prop_assert_eq!(parse_bus_id(&addr.bus_id().to_lowercase()), Some(addr));
        }

        #[test]
        fn bus_id_never_panics(text in ".{0,24}") {
            let _ = parse_bus_id(&text);
        }

        #[test]
        fn cpulist_matches_its_ranges(ranges in proptest::collection::vec((0u32..200, 0u32..8), 1..6)) {
            let text: Vec<String> = ranges.iter().map(|(lo, len)| format!("{lo}-{}", lo + len)).collect();
            let cpus = parse_cpulist(&text.join(",")).expect("valid list");
            for (lo, len) in &ranges {
                for cpu in *lo..=lo + len {
                    prop_assert!(cpus.contains(&cpu));
                }
            }
            prop_assert!(cpus.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
