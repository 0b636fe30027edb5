//! Which driver files go into the volume, grouped by NVIDIA driver capability.
//!
//! The lists are libnvidia-container's current ones (`src/nvc_info.c`@00b4b47; see
//! `docs/reference/nvidia-docker.md` §3), which add to Mesos's 2018 list (`volume.cpp`,
//! `mesos-gpu-isolator.md` §6.3) `libcudadebugger`, `libnvidia-nvvm`, `libnvidia-allocator`,
//! `libnvidia-pkcs11*`, `libnvidia-opticalflow`, `libnvidia-rtcore`, `libnvoptix`,
//! `libnvidia-glvkspirv`, `libnvidia-cbl`, `libnvidia-ngx`, `libnvidia-nscq` and
//! `libnvidia-tileiras`. Library names are matched as prefixes of ld.so.cache entry names; the
//! `.so` in each prefix keeps `libcuda.so` from matching `libcudadebugger.so.1`.
//!
//! The GLVND loaders and the compat GL libraries have their own version numbers
//! (`libGL.so.1.7.0`), so they are taken without the driver-version suffix, but only when they are
//! NVIDIA's or vendor-neutral GLVND: Mesa's non-GLVND `libGL` would take GL away from the driver.

/// A driver capability, as in `NVIDIA_DRIVER_CAPABILITIES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    /// `nvidia-smi` and NVML.
    Utility,
    /// CUDA and OpenCL.
    Compute,
    /// Video encode and decode.
    Video,
    /// OpenGL, EGL, Vulkan and OptiX.
    Graphics,
    /// NVIDIA NGX (DLSS).
    Ngx,
}

/// How a library is selected beyond its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Its file name must end in `.so.<driver version>`.
    Versioned,
    /// Versioned, and a GNU ABI tag, if present, must say Linux 2.3.99 (the TLS ABI).
    Tls,
    /// A compat GL library (`libGL`, `libEGL`, `libGLES*`): kept only if it needs
    /// `libnvidia-glcore`/`libnvidia-eglcore`/`libnvidia-gl*` (then versioned) or is a GLVND
    /// loader needing `libGLdispatch` (then any version).
    CompatGl,
    /// A vendor-neutral GLVND library (`libGLX`, `libOpenGL`, `libGLdispatch`): any version.
    Glvnd,
}

/// One library family.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LibrarySpec {
    pub(crate) prefix: &'static str,
    pub(crate) capability: Capability,
    pub(crate) rule: Rule,
}

const fn lib(prefix: &'static str, capability: Capability, rule: Rule) -> LibrarySpec {
    LibrarySpec {
        prefix,
        capability,
        rule,
    }
}

use Capability::{Compute, Graphics, Ngx, Utility, Video};
use Rule::{CompatGl, Glvnd, Tls, Versioned};

/// Every library family the volume may hold.
pub(crate) const LIBRARIES: &[LibrarySpec] = &[
    lib("libnvidia-ml.so", Utility, Versioned),
    lib("libnvidia-cfg.so", Utility, Versioned),
    lib("libnvidia-nscq.so", Utility, Versioned),
    lib("libcuda.so", Compute, Versioned),
    lib("libcudadebugger.so", Compute, Versioned),
    lib("libnvidia-opencl.so", Compute, Versioned),
    lib("libnvidia-gpucomp.so", Compute, Versioned),
    lib("libnvidia-ptxjitcompiler.so", Compute, Versioned),
    lib("libnvidia-fatbinaryloader.so", Compute, Versioned),
    lib("libnvidia-allocator.so", Compute, Versioned),
    lib("libnvidia-compiler.so", Compute, Versioned),
    lib("libnvidia-pkcs11.so", Compute, Versioned),
    lib("libnvidia-pkcs11-openssl3.so", Compute, Versioned),
    lib("libnvidia-nvvm.so", Compute, Versioned),
    lib("libnvidia-tileiras.so", Compute, Versioned),
    lib("libvdpau_nvidia.so", Video, Versioned),
    lib("libnvidia-encode.so", Video, Versioned),
    lib("libnvidia-opticalflow.so", Video, Versioned),
    lib("libnvcuvid.so", Video, Versioned),
    lib("libnvidia-eglcore.so", Graphics, Versioned),
    lib("libnvidia-glcore.so", Graphics, Versioned),
    lib("libnvidia-tls.so", Graphics, Tls),
    lib("libnvidia-glsi.so", Graphics, Versioned),
    lib("libnvidia-fbc.so", Graphics, Versioned),
    lib("libnvidia-ifr.so", Graphics, Versioned),
    lib("libnvidia-rtcore.so", Graphics, Versioned),
    lib("libnvoptix.so", Graphics, Versioned),
    lib("libGLX_nvidia.so", Graphics, Versioned),
    lib("libEGL_nvidia.so", Graphics, Versioned),
    lib("libGLESv2_nvidia.so", Graphics, Versioned),
    lib("libGLESv1_CM_nvidia.so", Graphics, Versioned),
    lib("libnvidia-glvkspirv.so", Graphics, Versioned),
    lib("libnvidia-cbl.so", Graphics, Versioned),
    lib("libGL.so", Graphics, CompatGl),
    lib("libEGL.so", Graphics, CompatGl),
    lib("libGLESv1_CM.so", Graphics, CompatGl),
    lib("libGLESv2.so", Graphics, CompatGl),
    lib("libGLX.so", Graphics, Glvnd),
    lib("libOpenGL.so", Graphics, Glvnd),
    lib("libGLdispatch.so", Graphics, Glvnd),
    lib("libnvidia-ngx.so", Ngx, Versioned),
];

/// Driver binaries, looked up by name in the search path, with their capability.
pub(crate) const BINARIES: &[(&str, Capability)] = &[
    ("nvidia-smi", Utility),
    ("nvidia-debugdump", Utility),
    ("nvidia-persistenced", Utility),
    ("nvidia-cuda-mps-control", Compute),
    ("nvidia-cuda-mps-server", Compute),
];

/// `DT_NEEDED` prefixes that make a compat GL library NVIDIA's own build.
pub(crate) const NVIDIA_GL_NEEDED: &[&str] = &[
    "libnvidia-glcore.so",
    "libnvidia-eglcore.so",
    "libnvidia-gl",
    "libnvidia-egl",
];

/// `DT_NEEDED` prefix of a GLVND loader (real entries are `libGLdispatch.so.0`, which Mesos's
/// exact comparison with `libGLdispatch.so` misses).
pub(crate) const GLVND_NEEDED: &[&str] = &["libGLdispatch.so"];

/// The GNU ABI tag `libnvidia-tls` must carry when it has one: Linux 2.3.99.
pub(crate) const TLS_ABI: (u32, u32, u32, u32) = (0, 2, 3, 99);

/// The library family an ld.so.cache entry name belongs to.
pub(crate) fn library_spec(entry_name: &str) -> Option<&'static LibrarySpec> {
    LIBRARIES
        .iter()
        .find(|spec| entry_name.starts_with(spec.prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_do_not_capture_neighbours() {
        assert_eq!(
            library_spec("libcuda.so.1").map(|s| s.prefix),
            Some("libcuda.so")
        );
        assert_eq!(
            library_spec("libcudadebugger.so.1").map(|s| s.prefix),
            Some("libcudadebugger.so")
        );
        assert_eq!(
            library_spec("libGLX.so.0").map(|s| s.prefix),
            Some("libGLX.so")
        );
        assert_eq!(
            library_spec("libGLX_nvidia.so.0").map(|s| s.prefix),
            Some("libGLX_nvidia.so")
        );
        assert_eq!(
            library_spec("libEGL.so.1").map(|s| s.prefix),
            Some("libEGL.so")
        );
        assert_eq!(
            library_spec("libnvidia-pkcs11-openssl3.so.550.54.14").map(|s| s.prefix),
            Some("libnvidia-pkcs11-openssl3.so")
        );
        assert!(library_spec("libGLU.so.1").is_none());
        assert!(library_spec("libz.so.1").is_none());
    }

    #[test]
    fn every_prefix_is_unique_and_ends_in_so() {
        for (i, a) in LIBRARIES.iter().enumerate() {
            assert!(a.prefix.ends_with(".so"), "{}", a.prefix);
            for b in &LIBRARIES[i + 1..] {
                assert!(
                    !b.prefix.starts_with(a.prefix),
                    "{} shadows {}",
                    a.prefix,
                    b.prefix
                );
            }
        }
    }

    #[test]
    fn covers_what_mesos_lacks() {
        for name in [
            "libcudadebugger.so",
            "libnvidia-nvvm.so",
            "libnvidia-opticalflow.so",
            "libnvoptix.so",
            "libnvidia-ngx.so",
            "libnvidia-nscq.so",
        ] {
            assert!(library_spec(&format!("{name}.1")).is_some(), "{name}");
        }
    }
}
