//! Fault-injection points for the crash tests: each lifecycle step calls `point` with its name
//! at the moment a crash would leave the most interesting state behind.
//!
//! Built only with `cfg(test)` or the `fault-injection` feature (which only the isolator's own
//! tests enable); otherwise `point` is an empty inline function and production code carries no
//! hook. A test installs one process-wide hook with [`set_hook`] in a child process and
//! SIGKILLs that child when it reports the step.

#[cfg(any(test, feature = "fault-injection"))]
mod hook {
    use std::sync::OnceLock;

    type Hook = Box<dyn Fn(&'static str) + Send + Sync>;

    static HOOK: OnceLock<Hook> = OnceLock::new();

    /// Installs the process-wide hook called at every fault point; only the first call counts.
    pub fn set_hook(hook: impl Fn(&'static str) + Send + Sync + 'static) {
        if HOOK.set(Box::new(hook)).is_err() {
            tracing::warn!("fault hook already installed; keeping the first");
        }
    }

    /// Calls the hook, if one is installed, with `step`.
    pub(crate) fn point(step: &'static str) {
        if let Some(hook) = HOOK.get() {
            hook(step);
        }
    }
}

#[cfg(any(test, feature = "fault-injection"))]
pub(crate) use hook::point;
#[cfg(any(test, feature = "fault-injection"))]
pub use hook::set_hook;

/// No hook outside tests: the call compiles to nothing.
#[cfg(not(any(test, feature = "fault-injection")))]
#[inline(always)]
pub(crate) fn point(_step: &'static str) {}
