//! The manifest a volume carries (`<volume>/manifest.json`): every file with its source, size,
//! mode, mtime and content digest, and every symlink with its target. It is written last, before the
//! volume is renamed into place, and is what `verify` checks the volume and the host against.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use mesos_gpu_os::fsmode;
use sha2::{Digest as _, Sha256};

use crate::plan::{FileStamp, VolumeDir};
use crate::version::DriverVersion;

/// The manifest's file name inside a volume.
pub const MANIFEST_NAME: &str = "manifest.json";
/// The manifest format this crate writes: format 2 records BLAKE3 digests.
pub const MANIFEST_FORMAT: u32 = 2;
/// The oldest format it still reads: format 1 (SHA-256 digests), written by earlier releases, so
/// the volumes they built are reused and verified after an upgrade.
pub const OLDEST_MANIFEST_FORMAT: u32 = 1;
/// Largest manifest read; a real one is a few tens of KiB.
const MAX_MANIFEST: u64 = 16 << 20;
/// Read size when hashing or copying.
pub(crate) const CHUNK: usize = 256 << 10;

/// Why a manifest could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Opening, reading or writing failed.
    #[error(transparent)]
    Io(#[from] mesos_gpu_os::IoError),
    /// It is not a regular file, or is too large.
    #[error("{path} is not a regular file of at most {MAX_MANIFEST} bytes")]
    NotAFile {
        /// The manifest path.
        path: PathBuf,
    },
    /// It is not valid manifest JSON.
    #[error("{path} is not a valid manifest")]
    Parse {
        /// The manifest path.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// It was written by an incompatible version of this crate.
    #[error(
        "{path} has format {found}; this program reads formats {OLDEST_MANIFEST_FORMAT} to {MANIFEST_FORMAT}"
    )]
    Format {
        /// The manifest path.
        path: PathBuf,
        /// The format found.
        found: u32,
    },
}

/// How a file got into the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// A hard link to the source (same inode).
    Hardlink,
    /// A copy with the source's mode and mtime.
    Copy,
}

/// One file of the volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestFile {
    /// Its directory.
    pub dir: VolumeDir,
    /// Its name.
    pub name: String,
    /// The host file it came from.
    pub source: PathBuf,
    /// Size and mtime (the source's, which the volume file shares).
    #[serde(flatten)]
    pub stamp: FileStamp,
    /// Permission bits.
    pub mode: u32,
    /// The digest of the contents.
    #[serde(flatten)]
    pub digest: FileDigest,
    /// Link or copy.
    pub method: Method,
}

/// The digest of a file's contents, as lower-case hex, keyed in the manifest by its algorithm
/// (`"blake3": "…"`).
///
/// BLAKE3 is what this crate writes: hashing is the one cost a copied volume has beyond `cp -a`,
/// and BLAKE3 (SIMD, one pass) costs a fraction of SHA-256. SHA-256 digests of format 1
/// manifests are still checked as they are.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileDigest {
    /// BLAKE3 (256-bit output).
    Blake3(String),
    /// SHA-256 (format 1 manifests).
    Sha256(String),
}

impl FileDigest {
    /// The digest of the file at `path` (not following a final symlink) with the same
    /// algorithm as `self`.
    pub fn same_kind_of_file(&self, path: &Path) -> io::Result<FileDigest> {
        self.kind().of_file(path)
    }

    /// Which algorithm.
    pub fn kind(&self) -> DigestKind {
        match self {
            FileDigest::Blake3(_) => DigestKind::Blake3,
            FileDigest::Sha256(_) => DigestKind::Sha256,
        }
    }
}

/// A digest algorithm of [`FileDigest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestKind {
    /// BLAKE3, written by this crate.
    Blake3,
    /// SHA-256, read from format 1 manifests.
    Sha256,
}

impl DigestKind {
    /// The digest of the file at `path` (not following a final symlink).
    pub fn of_file(self, path: &Path) -> io::Result<FileDigest> {
        let mut file = open_nofollow(path)?;
        let mut hasher = self.hasher();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            hasher.update(&buf[..n]);
        }
        Ok(hasher.finish())
    }

    /// An incremental hasher of this kind.
    pub(crate) fn hasher(self) -> Hasher {
        match self {
            DigestKind::Blake3 => Hasher::Blake3(Box::new(blake3::Hasher::new())),
            DigestKind::Sha256 => Hasher::Sha256(Sha256::new()),
        }
    }
}

/// An incremental hasher for a [`FileDigest`].
pub(crate) enum Hasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(Sha256),
}

impl Hasher {
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Blake3(h) => {
                h.update(bytes);
            }
            Hasher::Sha256(h) => h.update(bytes),
        }
    }

    pub(crate) fn finish(self) -> FileDigest {
        match self {
            Hasher::Blake3(h) => FileDigest::Blake3(h.finalize().to_hex().to_string()),
            Hasher::Sha256(h) => FileDigest::Sha256(hex(&h.finalize())),
        }
    }
}

/// One symlink of the volume.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ManifestLink {
    /// Its directory.
    pub dir: VolumeDir,
    /// Its name.
    pub name: String,
    /// Its target, a name in the same directory.
    pub target: String,
}

/// The record of a volume's contents.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// The driver version.
    pub driver_version: DriverVersion,
    /// The driver root the files came from.
    pub driver_root: PathBuf,
    /// `mesos-gpu-volume <version>`.
    pub created_by: String,
    /// Creation time, seconds since the epoch.
    pub created_at: u64,
    /// Files, sorted by directory and name.
    pub files: Vec<ManifestFile>,
    /// Links, sorted by directory and name.
    pub links: Vec<ManifestLink>,
}

impl Manifest {
    /// Reads the manifest of the volume at `volume`, refusing a symlink or an oversized file.
    pub fn read(volume: &Path) -> Result<Manifest, ManifestError> {
        let path = volume.join(MANIFEST_NAME);
        let io_err = |op| {
            let path = path.clone();
            move |source| ManifestError::Io(mesos_gpu_os::IoError::new(op, path, source))
        };
        let file = open_nofollow(&path).map_err(io_err("open"))?;
        let meta = file.metadata().map_err(io_err("stat"))?;
        if !meta.is_file() || meta.len() > MAX_MANIFEST {
            return Err(ManifestError::NotAFile { path });
        }
        let mut bytes = Vec::new();
        file.take(MAX_MANIFEST)
            .read_to_end(&mut bytes)
            .map_err(io_err("read"))?;
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|source| ManifestError::Parse {
                path: path.clone(),
                source,
            })?;
        if !(OLDEST_MANIFEST_FORMAT..=MANIFEST_FORMAT).contains(&manifest.format) {
            return Err(ManifestError::Format {
                path,
                found: manifest.format,
            });
        }
        Ok(manifest)
    }

    /// Writes the manifest into the (new, unpublished) volume at `volume`, durably.
    pub(crate) fn write_new(&self, volume: &Path) -> Result<(), ManifestError> {
        let path = volume.join(MANIFEST_NAME);
        let io_err = |op| {
            let path = path.clone();
            move |source| ManifestError::Io(mesos_gpu_os::IoError::new(op, path, source))
        };
        let mut bytes = serde_json::to_vec_pretty(self).map_err(|source| ManifestError::Parse {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        let mut file = fsmode::open(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW),
            &path,
            fsmode::STATE_FILE,
        )
        .map_err(io_err("create"))?;
        file.write_all(&bytes).map_err(io_err("write"))?;
        file.sync_all().map_err(io_err("sync"))
    }

    /// Total size of the files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.stamp.size).sum()
    }
}

/// Opens a file for reading without following a final symlink.
pub(crate) fn open_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// The BLAKE3 digest of a file's contents (not following a final symlink), as this crate writes
/// it into manifests.
pub fn blake3_file(path: &Path) -> io::Result<FileDigest> {
    DigestKind::Blake3.of_file(path)
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]])
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_of_known_input() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").expect("write");
        // The BLAKE3 and SHA-256 test vectors for "abc".
        assert_eq!(
            blake3_file(&path).expect("hash"),
            FileDigest::Blake3(
                "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85".into()
            )
        );
        assert_eq!(
            DigestKind::Sha256.of_file(&path).expect("hash"),
            FileDigest::Sha256(
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into()
            )
        );
    }

    #[test]
    fn round_trip_and_refusals() {
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            driver_version: "550.54.14".parse().expect("version"),
            driver_root: "/".into(),
            created_by: "test".into(),
            created_at: 1,
            files: vec![ManifestFile {
                dir: VolumeDir::Lib64,
                name: "libnvidia-ml.so.550.54.14".into(),
                source: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14".into(),
                stamp: FileStamp {
                    size: 3,
                    mtime_ns: 5,
                },
                mode: 0o644,
                digest: FileDigest::Blake3("00".into()),
                method: Method::Copy,
            }],
            links: vec![ManifestLink {
                dir: VolumeDir::Lib64,
                name: "libnvidia-ml.so.1".into(),
                target: "libnvidia-ml.so.550.54.14".into(),
            }],
        };
        manifest.write_new(dir.path()).expect("write");
        assert_eq!(Manifest::read(dir.path()).expect("read"), manifest);
        assert!(manifest.write_new(dir.path()).is_err(), "never overwrites");

        let other = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(
            dir.path().join(MANIFEST_NAME),
            other.path().join(MANIFEST_NAME),
        )
        .expect("ln");
        assert!(matches!(
            Manifest::read(other.path()),
            Err(ManifestError::Io(mesos_gpu_os::IoError { op: "open", .. }))
        ));

        std::fs::write(dir.path().join("x.json"), b"{").expect("write");
        std::fs::rename(dir.path().join("x.json"), dir.path().join(MANIFEST_NAME)).expect("mv");
        assert!(matches!(
            Manifest::read(dir.path()),
            Err(ManifestError::Parse { .. })
        ));
    }
}
