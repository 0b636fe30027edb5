//! An error and its causes on one line, `a: b: c`. Errors here keep their cause out of their own
//! message (STYLE §3), so each cause prints exactly once.

use std::error::Error;
use std::fmt;

/// Displays an error followed by each of its sources, joined with `: `.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a dyn Error);

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `err` and its sources as one string, `a: b: c`.
pub fn error_chain(err: &dyn Error) -> String {
    ErrorChain(err).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot save {0}")]
    struct Outer(&'static str, #[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot write")]
    struct Middle(#[source] io::Error);

    #[test]
    fn joins_every_cause_once() {
        let err = Outer("pool.json", Middle(io::Error::other("disk full")));
        assert_eq!(
            error_chain(&err),
            "cannot save pool.json: cannot write: disk full"
        );
        assert_eq!(format!("{:?}", ErrorChain(&err)), error_chain(&err));
    }

    #[test]
    fn an_error_without_causes_is_its_message() {
        assert_eq!(error_chain(&io::Error::other("alone")), "alone");
    }
}
