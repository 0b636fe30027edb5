//! XID and ECC events: the events file, read as it grows, and the event sets waiting on it.
//!
//! The file holds one event per line (format in `nvml-sim/README.md`):
//! `xid <gpu index> <xid> [gi <gpu instance id> [ci <compute instance id>]]`,
//! `ecc-sbe <gpu index>`, `ecc-dbe <gpu index>`, `lost <gpu index>`; blank lines and `#`
//! comments are skipped. An XID attributed to a MIG instance carries its ids in
//! `nvmlEventData_t` (`gpuInstanceId`, `computeInstanceId`; `0xFFFFFFFF` when not attributable,
//! `nvml.h` 3243-3255) and is delivered for the parent GPU. Only complete (newline-terminated) lines are read,
//! so a writer appending a line never has half of it seen. A file that shrinks is taken as
//! replaced and read again from the start.
//!
//! NVML delivers an event to an event set only if the set registered that event type for that
//! device (`nvmlDeviceRegisterEvents`) before the event happened. A lost GPU reports XID 79
//! ("GPU has fallen off the bus", NVIDIA's XID catalogue) and answers `GPU_IS_LOST` afterwards.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;

use mesos_gpu_os::IoError;

use crate::abi::NvmlEventSet;

/// The XID the driver logs when a GPU falls off the bus.
pub(crate) const XID_FALLEN_OFF_BUS: u64 = 79;

/// What the events file says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Xid(u64),
    SingleBitEcc,
    DoubleBitEcc,
    Lost,
    /// The driver's recovery action changes (no NVML event; real drivers log XID 154).
    RecoveryAction(u32),
    /// A row remapping waits for the next reset.
    RemapPending,
    /// A row remapping failed (sticky).
    RemapFailure,
    /// Pages wait for retirement.
    RetirePending,
    /// The GPU is reset (`nvidia-smi -r`): back on the bus, no recovery action pending,
    /// pending remappings and retirements done, volatile ECC counters zero.
    Reset,
}

/// One parsed line: an event on GPU `gpu` (NVML index), attributed to a MIG GPU instance and
/// maybe one of its compute instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) gpu: usize,
    pub(crate) kind: EventKind,
    pub(crate) mig: Option<(u32, Option<u32>)>,
}

/// A problem with the events file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventsError {
    #[error(transparent)]
    Read(IoError),
    // The line itself is never shown: the file is named by the node description, and may be
    // any file (`/etc/shadow`) whose contents are not ours to print.
    #[error(
        "events file {path} line {line}: {problem}; expected `xid <gpu> <xid> [gi <id> [ci <id>]]`, `ecc-sbe <gpu>`, `ecc-dbe <gpu>`, `lost <gpu>`, `recovery-action <gpu> <action>`, `remap-pending <gpu>`, `remap-failure <gpu>`, `retire-pending <gpu>` or `reset <gpu>`"
    )]
    Line {
        path: PathBuf,
        line: u64,
        problem: String,
    },
}

/// Parses one line; `Ok(None)` for blank lines and comments.
pub(crate) fn parse_line(text: &str, gpu_count: usize) -> Result<Option<Event>, String> {
    let text = text.trim();
    if text.is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let gpu = |word: Option<&&str>| -> Result<usize, String> {
        let word = word.ok_or("missing GPU index")?;
        let gpu: usize = word
            .parse()
            .map_err(|_| "the GPU index is not a number".to_owned())?;
        if gpu >= gpu_count {
            return Err(format!(
                "GPU {gpu} does not exist (the node has {gpu_count} GPUs)"
            ));
        }
        Ok(gpu)
    };
    let (kind, arity) = match words[0] {
        "xid" => {
            let xid = words.get(2).ok_or("missing XID number")?;
            let xid: u64 = xid
                .parse()
                .map_err(|_| "the XID is not a number".to_owned())?;
            (EventKind::Xid(xid), 3)
        }
        "ecc-sbe" => (EventKind::SingleBitEcc, 2),
        "ecc-dbe" => (EventKind::DoubleBitEcc, 2),
        "lost" => (EventKind::Lost, 2),
        "recovery-action" => {
            let name = words.get(2).ok_or("missing recovery action")?;
            let value = crate::node::recovery_action(name)?;
            (EventKind::RecoveryAction(value), 3)
        }
        "remap-pending" => (EventKind::RemapPending, 2),
        "remap-failure" => (EventKind::RemapFailure, 2),
        "retire-pending" => (EventKind::RetirePending, 2),
        "reset" => (EventKind::Reset, 2),
        _ => return Err("unknown event".to_owned()),
    };
    let gpu = gpu(words.get(1))?;
    let id = |key: &str, at: usize| -> Result<Option<u32>, String> {
        match (words.get(at), words.get(at + 1)) {
            (Some(k), Some(v)) if *k == key => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{key} id is not a number")),
            (Some(k), None) if *k == key => Err(format!("missing {key} id")),
            _ => Ok(None),
        }
    };
    let mut used = arity;
    let mut mig = None;
    if matches!(kind, EventKind::Xid(_))
        && let Some(gi) = id("gi", used)?
    {
        used += 2;
        let ci = id("ci", used)?;
        if ci.is_some() {
            used += 2;
        }
        mig = Some((gi, ci));
    }
    if words.len() > used {
        return Err(format!(
            "{} unexpected words after the event",
            words.len() - used
        ));
    }
    Ok(Some(Event { gpu, kind, mig }))
}

/// An event waiting in a set, until `nvmlEventSetWait_v2` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) gpu: usize,
    pub(crate) event_type: u64,
    pub(crate) data: u64,
    /// MIG GPU instance id, `0xFFFFFFFF` when not attributable.
    pub(crate) gpu_instance: u32,
    /// MIG compute instance id, `0xFFFFFFFF` when not attributable.
    pub(crate) compute_instance: u32,
}

/// Not zero-sized: each boxed token has its own address, which is the set's handle.
#[derive(Debug)]
struct SetToken {
    _serial: u64,
}

/// One `nvmlEventSet_t`.
#[derive(Debug)]
struct EventSet {
    token: Box<SetToken>,
    /// Registered event types per GPU index.
    masks: HashMap<usize, u64>,
    queue: VecDeque<Pending>,
}

/// The events file as read so far, and the live event sets.
#[derive(Debug)]
pub(crate) struct EventLog {
    path: Option<PathBuf>,
    offset: u64,
    lines_read: u64,
    sets: Vec<EventSet>,
    next_serial: u64,
}

impl EventLog {
    /// A log over `path` (none: no events ever), read from its start.
    pub(crate) fn new(path: Option<PathBuf>) -> EventLog {
        EventLog {
            path,
            offset: 0,
            lines_read: 0,
            sets: Vec::new(),
            next_serial: 0,
        }
    }

    /// Complete lines appended since the last call, parsed and checked with `check` (which
    /// says what is wrong with an event the node cannot have). A missing file has no lines yet.
    pub(crate) fn read_new(
        &mut self,
        gpu_count: usize,
        check: impl Fn(&Event) -> Result<(), String>,
    ) -> Vec<Result<Event, EventsError>> {
        let Some(path) = self.path.clone() else {
            return Vec::new();
        };
        let bytes = match self.read_tail() {
            Ok(bytes) => bytes,
            Err(source) if source.kind() == io::ErrorKind::NotFound => return Vec::new(),
            Err(source) => {
                let error = IoError::new("read events file", path, source);
                return vec![Err(EventsError::Read(error))];
            }
        };
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        self.offset += end as u64 + 1;
        let mut out = Vec::new();
        for raw in bytes[..end].split(|&b| b == b'\n') {
            self.lines_read += 1;
            let text = String::from_utf8_lossy(raw);
            match parse_line(&text, gpu_count).and_then(|e| match e {
                Some(event) => check(&event).map(|()| Some(event)),
                None => Ok(None),
            }) {
                Ok(Some(event)) => out.push(Ok(event)),
                Ok(None) => {}
                Err(problem) => out.push(Err(EventsError::Line {
                    path: path.clone(),
                    line: self.lines_read,
                    problem,
                })),
            }
        }
        out
    }

    fn read_tail(&mut self) -> io::Result<Vec<u8>> {
        let path = self.path.as_ref().ok_or(io::ErrorKind::NotFound)?;
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        if len < self.offset {
            self.offset = 0;
            self.lines_read = 0;
        }
        if len == self.offset {
            return Ok(Vec::new());
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// Creates an event set with nothing registered; returns its handle.
    pub(crate) fn create_set(&mut self) -> NvmlEventSet {
        self.next_serial += 1;
        let set = EventSet {
            token: Box::new(SetToken {
                _serial: self.next_serial,
            }),
            masks: HashMap::new(),
            queue: VecDeque::new(),
        };
        let handle = set_handle(&set);
        self.sets.push(set);
        handle
    }

    fn position(&self, handle: NvmlEventSet) -> Option<usize> {
        self.sets.iter().position(|s| set_handle(s) == handle)
    }

    /// Frees a set; false when the handle is not a live set of this instance.
    pub(crate) fn free_set(&mut self, handle: NvmlEventSet) -> bool {
        self.position(handle)
            .map(|i| self.sets.swap_remove(i))
            .is_some()
    }

    /// Adds `types` for GPU `gpu` to a set; false when the handle is not a live set.
    pub(crate) fn register(&mut self, handle: NvmlEventSet, gpu: usize, types: u64) -> bool {
        let Some(i) = self.position(handle) else {
            return false;
        };
        *self.sets[i].masks.entry(gpu).or_default() |= types;
        true
    }

    /// Takes the oldest pending event of a set: `None` when the handle is not a live set,
    /// `Some(None)` when the set has nothing pending.
    pub(crate) fn take(&mut self, handle: NvmlEventSet) -> Option<Option<Pending>> {
        let i = self.position(handle)?;
        Some(self.sets[i].queue.pop_front())
    }

    /// Queues an event in every set registered for it.
    pub(crate) fn deliver(&mut self, event: Pending) {
        for set in &mut self.sets {
            if set
                .masks
                .get(&event.gpu)
                .is_some_and(|m| m & event.event_type != 0)
            {
                set.queue.push_back(event);
            }
        }
    }
}

fn set_handle(set: &EventSet) -> NvmlEventSet {
    let token: *const SetToken = &*set.token;
    token.cast_mut().cast()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use std::io::Write as _;

    use super::*;
    use crate::abi::{EVENT_DOUBLE_BIT_ECC, EVENT_SINGLE_BIT_ECC, EVENT_XID, ID_NOT_AVAILABLE};

    #[test]
    fn parses_each_form() {
        assert_eq!(
            parse_line("xid 3 79", 8),
            Ok(Some(Event {
                gpu: 3,
                kind: EventKind::Xid(79),
                mig: None
            }))
        );
        assert_eq!(
            parse_line("  ecc-sbe 0 ", 8),
            Ok(Some(Event {
                gpu: 0,
                kind: EventKind::SingleBitEcc,
                mig: None
            }))
        );
        assert_eq!(
            parse_line("ecc-dbe 7", 8),
            Ok(Some(Event {
                gpu: 7,
                kind: EventKind::DoubleBitEcc,
                mig: None
            }))
        );
        assert_eq!(
            parse_line("lost 1", 8),
            Ok(Some(Event {
                gpu: 1,
                kind: EventKind::Lost,
                mig: None
            }))
        );
        assert_eq!(
            parse_line("xid 2 31 gi 7", 8),
            Ok(Some(Event {
                gpu: 2,
                kind: EventKind::Xid(31),
                mig: Some((7, None))
            }))
        );
        assert_eq!(
            parse_line("xid 2 43 gi 7 ci 0", 8).map(|e| e.and_then(|e| e.mig)),
            Ok(Some((7, Some(0))))
        );
        assert!(
            parse_line("xid 2 43 gi", 8)
                .unwrap_err()
                .contains("missing gi id")
        );
        assert!(
            parse_line("xid 2 43 gi x", 8)
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            parse_line("xid 2 43 ci 0", 8)
                .unwrap_err()
                .contains("unexpected")
        );
        assert!(
            parse_line("lost 2 gi 1", 8)
                .unwrap_err()
                .contains("unexpected")
        );
        assert_eq!(
            parse_line("recovery-action 1 gpu_reset", 8).map(|e| e.map(|e| e.kind)),
            Ok(Some(EventKind::RecoveryAction(1)))
        );
        assert!(
            parse_line("recovery-action 1 reboot", 8)
                .unwrap_err()
                .contains("node_reboot")
        );
        for (line, kind) in [
            ("remap-pending 2", EventKind::RemapPending),
            ("remap-failure 2", EventKind::RemapFailure),
            ("retire-pending 2", EventKind::RetirePending),
            ("reset 2", EventKind::Reset),
        ] {
            assert_eq!(
                parse_line(line, 8).map(|e| e.map(|e| e.kind)),
                Ok(Some(kind))
            );
        }
        assert!(
            parse_line("reset 2 gi 1", 8)
                .unwrap_err()
                .contains("unexpected")
        );
        assert_eq!(parse_line("# note", 8), Ok(None));
        assert_eq!(parse_line("", 8), Ok(None));
    }

    #[test]
    fn rejects_bad_lines_with_the_reason() {
        assert!(
            parse_line("xid 8 79", 8)
                .unwrap_err()
                .contains("GPU 8 does not exist")
        );
        assert!(parse_line("xid 1", 8).unwrap_err().contains("missing XID"));
        assert!(
            parse_line("xid one 79", 8)
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            parse_line("lost 1 now", 8)
                .unwrap_err()
                .contains("unexpected")
        );
        assert!(
            parse_line("fire 1", 8)
                .unwrap_err()
                .contains("unknown event")
        );
        assert!(parse_line("lost", 8).unwrap_err().contains("missing GPU"));
    }

    #[test]
    fn errors_never_echo_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shadow");
        let secret = "root:$6$s3cr3t$hash:20228:0:99999:7:::";
        std::fs::write(
            &path,
            format!("{secret}\nxid s3cr3t 79\nxid 1 s3cr3t\nlost 1 s3cr3t\nxid 1 79 gi s3cr3t\n"),
        )
        .unwrap();
        let mut log = EventLog::new(Some(path));
        let got = log.read_new(4, |_: &Event| Ok(()));
        assert_eq!(got.len(), 5);
        for (i, result) in got.iter().enumerate() {
            let err = result.as_ref().unwrap_err().to_string();
            assert!(!err.contains("s3cr3t") && !err.contains("root"), "{err}");
            assert!(err.contains(&format!("line {}: ", i + 1)), "{err}");
        }
    }

    #[test]
    fn reads_only_complete_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events");
        let mut log = EventLog::new(Some(path.clone()));
        let ok = |_: &Event| Ok(());
        assert!(
            log.read_new(4, ok).is_empty(),
            "a missing file has no events"
        );

        let mut f = File::create(&path).unwrap();
        f.write_all(b"xid 1 13\nlost 2\necc-s").unwrap();
        let got: Vec<_> = log
            .read_new(4, ok)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            got,
            [
                Event {
                    gpu: 1,
                    kind: EventKind::Xid(13),
                    mig: None
                },
                Event {
                    gpu: 2,
                    kind: EventKind::Lost,
                    mig: None
                }
            ]
        );
        assert!(log.read_new(4, ok).is_empty());

        f.write_all(b"be 3\nbogus\n").unwrap();
        let got = log.read_new(4, ok);
        assert_eq!(got.len(), 2);
        assert_eq!(
            *got[0].as_ref().unwrap(),
            Event {
                gpu: 3,
                kind: EventKind::SingleBitEcc,
                mig: None
            }
        );
        let err = got[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("line 4: unknown event"), "{err}");

        std::fs::write(&path, b"xid 0 31\n").unwrap();
        let got: Vec<_> = log
            .read_new(4, ok)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            got,
            [Event {
                gpu: 0,
                kind: EventKind::Xid(31),
                mig: None
            }],
            "a replaced file is read from its start"
        );
    }

    #[test]
    fn sets_receive_only_registered_events() {
        let mut log = EventLog::new(None);
        let a = log.create_set();
        let b = log.create_set();
        assert_ne!(a, b);
        assert!(log.register(a, 3, EVENT_XID));
        assert!(log.register(b, 2, EVENT_XID | EVENT_DOUBLE_BIT_ECC));
        log.deliver(Pending {
            gpu: 3,
            event_type: EVENT_XID,
            data: 79,
            gpu_instance: ID_NOT_AVAILABLE,
            compute_instance: ID_NOT_AVAILABLE,
        });
        log.deliver(Pending {
            gpu: 2,
            event_type: EVENT_SINGLE_BIT_ECC,
            data: 0,
            gpu_instance: ID_NOT_AVAILABLE,
            compute_instance: ID_NOT_AVAILABLE,
        });
        log.deliver(Pending {
            gpu: 2,
            event_type: EVENT_DOUBLE_BIT_ECC,
            data: 0,
            gpu_instance: ID_NOT_AVAILABLE,
            compute_instance: ID_NOT_AVAILABLE,
        });
        assert_eq!(
            log.take(a),
            Some(Some(Pending {
                gpu: 3,
                event_type: EVENT_XID,
                data: 79,
                gpu_instance: ID_NOT_AVAILABLE,
                compute_instance: ID_NOT_AVAILABLE,
            }))
        );
        assert_eq!(log.take(a), Some(None));
        assert_eq!(
            log.take(b),
            Some(Some(Pending {
                gpu: 2,
                event_type: EVENT_DOUBLE_BIT_ECC,
                data: 0,
                gpu_instance: ID_NOT_AVAILABLE,
                compute_instance: ID_NOT_AVAILABLE,
            }))
        );
        assert!(log.free_set(a));
        assert!(!log.free_set(a));
        assert_eq!(log.take(a), None);
    }
}
