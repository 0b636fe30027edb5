//! One JSON document in one file, read whole and replaced crash-safely ([`crate::durable`]),
//! with a schema version that is checked on every read and written on every save.
//!
//! The version is the document's top-level `"version"` member, written first. A file with a
//! newer version than this code knows is refused, never guessed at; an older one is brought up
//! to date by the document's [`Document::migrate`] when it has one (a file written before
//! documents carried a version reads as version 0). Every durable record of mesos-gpu goes
//! through here: the isolator's checkpoint, the node's pool, the health checkpoint, nvml-sim's
//! runtime state; a foreign format without our version (a CDI spec) uses [`JsonFile::write`].

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::durable::{self, DurableError, Staged};
use crate::io::IoError;

/// A versioned document kept by a [`JsonFile`].
pub trait Document: Serialize + DeserializeOwned {
    /// The schema version this code reads and writes.
    const VERSION: u32;
    /// What the document is, for messages: `checkpoint`, `GPU pool file`.
    const WHAT: &'static str;

    /// The document `doc`, written with the older schema `version`, as this version would
    /// write it; `None` when that version cannot be read (the default: no migration).
    fn migrate(version: u32, doc: Value) -> Option<Value> {
        let _ = (version, doc);
        None
    }
}

/// Why a document could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading the file failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The file is not a document of this kind.
    #[error("{path} is not a valid {what}")]
    Parse {
        /// What the document is.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The JSON error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The file has a schema version this code cannot read.
    #[error("{path} has schema version {found}; this mesos-gpu reads version {supported}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u64,
        /// The version this code reads and writes.
        supported: u32,
    },
    /// The file could not be replaced.
    #[error(transparent)]
    Write(#[from] DurableError),
}

/// Whether [`JsonFile::write`] changed the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The file was missing or different, and now holds the document.
    Replaced,
    /// The file already held exactly these bytes; nothing was written.
    Unchanged,
}

/// A JSON file replaced crash-safely, created with permissions `mode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonFile {
    path: PathBuf,
    mode: u32,
}

#[derive(Serialize)]
struct Versioned<'a, T> {
    version: u32,
    #[serde(flatten)]
    doc: &'a T,
}

impl JsonFile {
    /// The file at `path`, written with permissions `mode`.
    pub fn at(path: impl Into<PathBuf>, mode: u32) -> JsonFile {
        JsonFile {
            path: path.into(),
            mode,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The document, brought to [`Document::VERSION`]; `None` when there is no file.
    pub fn load<T: Document>(&self) -> Result<Option<T>, StoreError> {
        let Some(bytes) = self.bytes()? else {
            return Ok(None);
        };
        self.parse(&bytes).map(Some)
    }

    /// `bytes`, a document of this file, brought to [`Document::VERSION`].
    pub fn parse<T: Document>(&self, bytes: &[u8]) -> Result<T, StoreError> {
        let mut doc: Value = serde_json::from_slice(bytes).map_err(|e| self.bad::<T>(e))?;
        let found = match &mut doc {
            Value::Object(map) => match map.remove("version") {
                None => 0,
                Some(v) => v.as_u64().ok_or_else(|| StoreError::Version {
                    path: self.path.clone(),
                    found: u64::MAX,
                    supported: T::VERSION,
                })?,
            },
            _ => {
                let e = <serde_json::Error as serde::de::Error>::custom("expected a JSON object");
                return Err(self.bad::<T>(e));
            }
        };
        let doc = if found == u64::from(T::VERSION) {
            doc
        } else {
            let old = u32::try_from(found)
                .ok()
                .filter(|&v| v < T::VERSION)
                .and_then(|v| T::migrate(v, doc));
            match old {
                Some(doc) => doc,
                None => {
                    return Err(StoreError::Version {
                        path: self.path.clone(),
                        found,
                        supported: T::VERSION,
                    });
                }
            }
        };
        serde_json::from_value(doc).map_err(|e| self.bad::<T>(e))
    }

    /// Replaces the file with `doc` at [`Document::VERSION`].
    pub fn save<T: Document>(&self, doc: &T) -> Result<(), StoreError> {
        self.stage(doc)?.commit()?;
        Ok(())
    }

    /// Writes `doc` durably beside the file; [`Staged::commit`] puts it in place.
    pub fn stage<T: Document>(&self, doc: &T) -> Result<Staged, StoreError> {
        let bytes = self.encode(&Versioned {
            version: T::VERSION,
            doc,
        })?;
        Ok(durable::stage(&self.path, &bytes, self.mode)?)
    }

    /// Replaces the file with `value`, a document of a format that is not ours (no version is
    /// added), unless it already holds exactly those bytes.
    pub fn write<T: Serialize>(&self, value: &T) -> Result<Written, StoreError> {
        let bytes = self.encode(value)?;
        if self.bytes()?.as_deref() == Some(bytes.as_slice()) {
            return Ok(Written::Unchanged);
        }
        durable::replace(&self.path, &bytes, self.mode)?;
        Ok(Written::Replaced)
    }

    /// The file's bytes; `None` when there is no file.
    pub fn bytes(&self) -> Result<Option<Vec<u8>>, StoreError> {
        match fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(IoError::new("read", &self.path, e).into()),
        }
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, StoreError> {
        let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| StoreError::Parse {
            what: "JSON document",
            path: self.path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    fn bad<T: Document>(&self, source: serde_json::Error) -> StoreError {
        StoreError::Parse {
            what: T::WHAT,
            path: self.path.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        name: String,
    }

    impl Document for Doc {
        const VERSION: u32 = 2;
        const WHAT: &'static str = "test document";

        fn migrate(version: u32, doc: Value) -> Option<Value> {
            // Version 1 called it `label`; version 0 had no version member.
            match (version, doc) {
                (0 | 1, Value::Object(mut map)) => {
                    let label = map.remove("label")?;
                    map.insert("name".into(), label);
                    Some(Value::Object(map))
                }
                _ => None,
            }
        }
    }

    fn file(dir: &tempfile::TempDir) -> JsonFile {
        JsonFile::at(dir.path().join("doc.json"), 0o644)
    }

    #[test]
    fn saves_the_version_first_and_loads_it_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = file(&dir);
        assert!(f.load::<Doc>().expect("load").is_none());
        let doc = Doc { name: "a".into() };
        f.save(&doc).expect("save");
        let text = fs::read_to_string(f.path()).expect("read");
        assert!(
            text.starts_with("{\n  \"version\": 2,\n  \"name\": \"a\""),
            "{text}"
        );
        assert_eq!(f.load::<Doc>().expect("load"), Some(doc));
    }

    #[test]
    fn older_versions_are_migrated_and_newer_ones_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = file(&dir);
        fs::write(f.path(), r#"{"version": 1, "label": "b"}"#).expect("write");
        assert_eq!(f.load::<Doc>().expect("load").expect("doc").name, "b");
        fs::write(f.path(), r#"{"label": "c"}"#).expect("write");
        assert_eq!(f.load::<Doc>().expect("load").expect("doc").name, "c");
        fs::write(f.path(), r#"{"version": 3, "name": "d"}"#).expect("write");
        let err = f.load::<Doc>().expect_err("newer");
        assert!(
            err.to_string()
                .ends_with("has schema version 3; this mesos-gpu reads version 2"),
            "{err}"
        );
        fs::write(f.path(), "[1]").expect("write");
        let err = f.load::<Doc>().expect_err("not an object");
        assert!(
            err.to_string().ends_with("is not a valid test document"),
            "{err}"
        );
    }

    #[test]
    fn writes_a_foreign_format_only_when_it_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = file(&dir);
        let doc = Doc { name: "x".into() };
        assert_eq!(f.write(&doc).expect("write"), Written::Replaced);
        assert_eq!(f.write(&doc).expect("write"), Written::Unchanged);
        let text = fs::read_to_string(f.path()).expect("read");
        assert!(!text.contains("version"), "{text}");
    }
}
