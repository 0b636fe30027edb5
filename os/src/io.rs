//! [`IoError`]: a file-system call that failed, with the step and the path it worked on.
//!
//! Every crate reports a failed `open`, `read`, `write`, `rename`, … the same way, "cannot
//! <step> <path>" with the `io::Error` as its source, so this is the one type for it; a crate's
//! own error enum wraps it (`#[error(transparent)] Io(#[from] IoError)`).

use std::io;
use std::path::{Path, PathBuf};

/// A file-system call failed; `op` names the step, `path` the file or directory it worked on.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {path}")]
pub struct IoError {
    /// The step: `create`, `read`, `write`, `fsync`, `rename`, …
    pub op: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: io::Error,
}

impl IoError {
    /// `source`, failing step `op` on `path`.
    pub fn new(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> IoError {
        IoError {
            op,
            path: path.into(),
            source,
        }
    }

    /// The kind of the underlying error.
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

/// Context for an `io::Result` in one call: `fs::read(&p).at("read", &p)?`.
pub trait IoContext<T> {
    /// The error as an [`IoError`] naming step `op` on `path`.
    fn at(self, op: &'static str, path: &Path) -> Result<T, IoError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, op: &'static str, path: &Path) -> Result<T, IoError> {
        self.map_err(|source| IoError::new(op, path, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_step_and_the_path_and_keeps_the_cause() {
        let err = std::fs::read("/nonexistent/mesos-gpu")
            .at("read", Path::new("/nonexistent/mesos-gpu"))
            .expect_err("no such file");
        assert_eq!(err.to_string(), "cannot read /nonexistent/mesos-gpu");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let source = std::error::Error::source(&err).expect("a source");
        assert!(source.to_string().contains("No such file"), "{source}");
    }
}
