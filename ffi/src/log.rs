//! Log forwarding: a tracing layer that hands every event (level, target, message and fields)
//! to the callback set with `mgpu_set_log_callback`, so the C++ shim can pass it to glog.
//!
//! The callback is process-wide (one agent, one log). The subscriber is installed once, with
//! `try_init`, the first time a callback is set or an isolator is created; if the process
//! already has a global subscriber (a Rust host), ours is not installed and events go there.
//! Events are formatted only when a callback is set and the level passes its threshold.

use std::ffi::{CString, c_char, c_void};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Once, PoisonError, RwLock};

use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Subscriber, span};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

use crate::status::FfiError;

/// Log levels as the callback receives them; the threshold given to `mgpu_set_log_callback`
/// uses the same numbers (events at most this verbose are forwarded).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MgpuLogLevel {
    /// An operator must act.
    MgpuLogError = 0,
    /// Degraded but working.
    MgpuLogWarn = 1,
    /// One line per lifecycle step.
    MgpuLogInfo = 2,
    /// Decisions.
    MgpuLogDebug = 3,
    /// System calls and wire bytes.
    MgpuLogTrace = 4,
}

impl MgpuLogLevel {
    /// The level a caller passed as a number (`mgpu_set_log_callback`'s `max_level`).
    pub(crate) fn from_raw(level: u32) -> Result<MgpuLogLevel, FfiError> {
        Ok(match level {
            0 => MgpuLogLevel::MgpuLogError,
            1 => MgpuLogLevel::MgpuLogWarn,
            2 => MgpuLogLevel::MgpuLogInfo,
            3 => MgpuLogLevel::MgpuLogDebug,
            4 => MgpuLogLevel::MgpuLogTrace,
            got => return Err(FfiError::UnknownLevel { got }),
        })
    }
}

impl From<&Level> for MgpuLogLevel {
    fn from(level: &Level) -> MgpuLogLevel {
        match *level {
            Level::ERROR => MgpuLogLevel::MgpuLogError,
            Level::WARN => MgpuLogLevel::MgpuLogWarn,
            Level::INFO => MgpuLogLevel::MgpuLogInfo,
            Level::DEBUG => MgpuLogLevel::MgpuLogDebug,
            Level::TRACE => MgpuLogLevel::MgpuLogTrace,
        }
    }
}

/// The log callback: level, target (the Rust module, NUL-terminated), message with its spans and
/// fields (`prepare{container=c1 requested=2}: prepared container gpus=0,1 …`, NUL-terminated) and the caller's `userdata`. The strings are valid only
/// during the call. It may be called from any thread, also concurrently.
pub type MgpuLogCallback = Option<
    unsafe extern "C" fn(
        level: MgpuLogLevel,
        target: *const c_char,
        message: *const c_char,
        userdata: *mut c_void,
    ),
>;

#[derive(Clone, Copy)]
struct Sink {
    callback: unsafe extern "C" fn(MgpuLogLevel, *const c_char, *const c_char, *mut c_void),
    userdata: *mut c_void,
}

// SAFETY: `userdata` is only handed back to the callback, never dereferenced here; the caller of
// `mgpu_set_log_callback` promises (its `# Safety`) that callback and userdata may be used from
// any thread.
unsafe impl Send for Sink {}
// SAFETY: as for `Send`: shared access only copies the pointer into a callback call.
unsafe impl Sync for Sink {}

static SINK: RwLock<Option<Sink>> = RwLock::new(None);
static THRESHOLD: AtomicU8 = AtomicU8::new(MgpuLogLevel::MgpuLogInfo as u8);
static INSTALL: Once = Once::new();

/// Sets (or with `None` clears) the process-wide callback and its threshold.
pub(crate) fn set_callback(
    callback: MgpuLogCallback,
    userdata: *mut c_void,
    max_level: MgpuLogLevel,
) {
    let sink = callback.map(|callback| Sink { callback, userdata });
    *SINK.write().unwrap_or_else(PoisonError::into_inner) = sink;
    THRESHOLD.store(max_level as u8, Ordering::Relaxed);
    install();
}

/// Installs the forwarding subscriber, once per process.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        if tracing_subscriber::registry()
            .with(CallbackLayer)
            .try_init()
            .is_err()
        {
            tracing::debug!("a global subscriber exists; events go to it");
        }
    });
}

struct CallbackLayer;

/// The fields of a span, formatted once when it is created.
struct SpanFields(String);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for CallbackLayer {
    fn register_callsite(&self, _: &'static tracing::Metadata<'static>) -> Interest {
        // The threshold can change at any time: decide per event, never cache.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
        (MgpuLogLevel::from(metadata.level()) as u8) <= THRESHOLD.load(Ordering::Relaxed)
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut fields = TextVisitor::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields.finish()));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(sink) = *SINK.read().unwrap_or_else(PoisonError::into_inner) else {
            return;
        };
        let mut text = TextVisitor::default();
        event.record(&mut text);
        let mut line = String::new();
        for span in ctx
            .event_scope(event)
            .into_iter()
            .flat_map(|scope| scope.from_root())
        {
            let fields = span
                .extensions()
                .get::<SpanFields>()
                .map(|f| f.0.clone())
                .unwrap_or_default();
            let _ = write!(line, "{}{{{}}}: ", span.name(), fields.trim_start());
        }
        line.push_str(&text.finish());
        let target = c_string(event.metadata().target());
        let message = c_string(&line);
        // SAFETY: the callback was given by the C caller for exactly this use; both strings are
        // NUL-terminated and live until after the call returns; `userdata` is passed back as
        // given.
        unsafe {
            (sink.callback)(
                MgpuLogLevel::from(event.metadata().level()),
                target.as_ptr(),
                message.as_ptr(),
                sink.userdata,
            )
        }
    }
}

fn c_string(text: &str) -> CString {
    // A NUL inside a field cannot cross as a C string; it is shown as `\0`.
    CString::new(text.replace('\0', "\\0")).unwrap_or_default()
}

#[derive(Default)]
struct TextVisitor {
    message: String,
    fields: String,
}

impl TextVisitor {
    fn finish(self) -> String {
        if self.fields.is_empty() {
            self.message
        } else {
            format!("{}{}", self.message, self.fields)
        }
    }
}

impl Visit for TextVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_from_c_are_checked() {
        assert_eq!(
            MgpuLogLevel::from_raw(4).ok(),
            Some(MgpuLogLevel::MgpuLogTrace)
        );
        let err = MgpuLogLevel::from_raw(5).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("log level 5: expected 0 (error) to 4 (trace)")
        );
    }

    #[test]
    fn nul_in_text_is_escaped() {
        assert_eq!(c_string("a\0b").as_bytes(), b"a\\0b");
    }
}
