//! Any bytes: `LdCache::parse` returns a cache or an error, never panics or reads out of
//! bounds, and a parsed cache lists without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesos_gpu_volume::LdCache;

fuzz_target!(|data: &[u8]| {
    if let Ok(cache) = LdCache::parse(data) {
        let mut out = Vec::new();
        let _ = cache.write_listing(&mut out, std::path::Path::new("fuzz"));
        for entry in cache.entries() {
            let _ = entry.hwcap.raw();
        }
    }
});
