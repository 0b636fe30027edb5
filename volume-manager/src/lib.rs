//! The NVIDIA driver volume for Mesos containers: an `ld.so.cache` reader, the search for the
//! running driver's files, and the `nvidia_<driver version>` volume (`bin/`, `lib/`, `lib64/`)
//! that the isolator and the Docker bridge bind-mount at `/usr/local/nvidia`.
//!
//! ```no_run
//! use std::path::Path;
//! use mesos_gpu_volume::{LdCache, VolumeManager, plan};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cache = LdCache::load(Path::new("/"))?;
//! let (version, _) = plan::detect_driver_version(Path::new("/"), &cache)?;
//! let manager = VolumeManager::at(mesos_gpu_volume::volume::DEFAULT_ROOT);
//! // Programs are searched along the caller's PATH, then next to the driver's libraries.
//! let path = std::env::var_os("PATH").unwrap_or_default();
//! let source = plan::DriverSource::with_path("/", &path);
//! let plan = manager.plan(&source, &cache, &version)?;
//! let volume = manager.create(&plan)?;
//! manager.acquire(&version, "container-1")?;
//! println!("mount {} at {}", volume.path.display(), VolumeManager::container_path().display());
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod catalog;
pub mod elf_info;
pub mod injection;
pub mod ldcache;
pub mod lock;
pub mod manifest;
pub mod mountinfo;
pub mod plan;
mod rooted;
pub mod version;
pub mod volume;

pub use injection::{container_env, should_inject};
pub use ldcache::LdCache;
pub use plan::{VolumePlan, plan};
pub use version::DriverVersion;
pub use volume::{Check, CreateOptions, Materialize, Volume, VolumeError, VolumeManager};
