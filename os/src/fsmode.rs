//! The modes of what mesos-gpu creates, whatever the process's umask, and the check of a state
//! directory found in place.
//!
//! Facts relied on (mkdir(2), open(2), umask(2), chmod(2), inode(7)):
//! - a new directory or file gets the mode asked for *minus the umask*. The umask only clears
//!   bits, so asking for exactly the mode wanted and then setting it with `chmod`/`fchmod`
//!   gives that mode whatever the umask is, and never a wider one in between (`umask 000` with
//!   std's defaults, 0777 for directories and 0666 for files, would make state that any local
//!   user can replace or delete);
//! - whoever can write a directory can rename or remove every entry in it, unless the directory
//!   has the sticky bit (as `/tmp`), which keeps others' entries to their owners;
//! - the owner of a directory (and root) can always change its mode.
//!
//! So every directory holding state is created with [`create_dir_all`] and a named mode, and
//! every process that writes state under a directory first checks it with [`state_dir`]: the
//! state directory and the directories below it that the state lives in must be owned by root
//! or by this process's user and writable by nobody else; the directories above it must be
//! owned by root or this user and either writable by nobody else or sticky (`/tmp`). A directory
//! that fails is refused with its mode, owner and the mode expected, never repaired: others may
//! already have replaced what it holds, and a `chmod` would hide that.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write as _};
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};

use crate::io::IoError;

/// A directory holding node state (pool, checkpoints, health, CDI specs, driver volumes):
/// everyone may read and traverse it (`gpu list`, monitoring, containers reading a volume),
/// only its owner writes.
pub const STATE_DIR: u32 = 0o755;
/// A file of node state (`pool.json`, checkpoints, manifests, CDI specs): readable by
/// everyone, written only by its owner.
pub const STATE_FILE: u32 = 0o644;
/// A `flock(2)` lock file: readable by everyone, because readers take shared locks on a file
/// they open read-only; written only by its owner.
pub const LOCK_FILE: u32 = 0o644;
/// A directory only its owner may enter (scratch space of one process).
pub const PRIVATE_DIR: u32 = 0o700;
/// A file only its owner may read or write (scratch files, a private socket).
pub const PRIVATE_FILE: u32 = 0o600;

/// The mode bits that let the group or others write.
pub const GROUP_OTHER_WRITE: u32 = 0o022;
/// The sticky bit: entries of a writable directory stay their owners'.
const STICKY: u32 = 0o1000;

/// Why a directory or file could not be made with its mode, or a state directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum FsModeError {
    /// A file-system call failed (`create`, `resolve`, `stat`, …).
    #[error(transparent)]
    Io(#[from] IoError),
    /// A directory holding state, or one above it, could be changed by another user.
    #[error("{0}")]
    Unsafe(Box<UnsafeDir>),
    /// The path exists but is not a directory.
    #[error("{path} is not a directory; refusing to keep GPU state there")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
}

/// A directory refused as unsafe, and why: what [`FsModeError::Unsafe`] says.
#[derive(Debug)]
pub struct UnsafeDir {
    /// The directory.
    path: PathBuf,
    /// Which directory it is: "state directory" or "directory above state directory …,".
    place: String,
    /// Its mode bits (`0o7777`).
    mode: u32,
    /// Its owner.
    uid: u32,
    /// What is wrong, in words.
    problem: &'static str,
    /// What is accepted, in words.
    expected: String,
    /// A command that would make it acceptable.
    fix: String,
}

impl std::fmt::Display for UnsafeDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let UnsafeDir {
            path,
            place,
            mode,
            uid,
            problem,
            expected,
            fix,
        } = self;
        let path = path.display();
        write!(
            f,
            "{place} {path} has mode {mode:04o} and owner uid {uid}: {problem}; refusing to keep \
             GPU state there. Expected {expected}; check what it holds, then fix it (e.g. `{fix}`)"
        )
    }
}

impl FsModeError {
    /// True when a directory was refused as unsafe (not an I/O failure).
    pub fn is_unsafe(&self) -> bool {
        matches!(self, FsModeError::Unsafe { .. })
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FsModeError {
    let path = path.to_owned();
    move |source| FsModeError::Io(IoError::new(op, path, source))
}

/// Creates `dir` and every missing directory above it, each with exactly `mode` whatever the
/// umask. Existing directories are left as they are (see [`check_state_dir`]).
pub fn create_dir_all(dir: &Path, mode: u32) -> io::Result<()> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => return Err(io::ErrorKind::NotADirectory.into()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all(parent, mode)?;
    }
    match mkdir(dir, mode) {
        // Made meanwhile by another process: taken as it is, as an existing one.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        made => made,
    }
}

/// `mkdir(2)` of `dir` (its parent must exist; fails with `AlreadyExists` when `dir` does),
/// then `chmod(2)` to exactly `mode`: the umask may have cleared bits of it, never added any.
pub fn mkdir(dir: &Path, mode: u32) -> io::Result<()> {
    DirBuilder::new().mode(mode).create(dir)?;
    fs::set_permissions(dir, Permissions::from_mode(mode))
}

/// Creates the state directory `dir` (at or below `root`, the directory the operator named)
/// with `mode` where missing, then checks it as [`check_state_dir`] does. Nothing is made under
/// a directory that fails the check: the deepest one that exists is checked first.
pub fn state_dir(root: &Path, dir: &Path, mode: u32) -> Result<(), FsModeError> {
    if !dir.is_dir()
        && let Some(existing) = dir.ancestors().skip(1).find(|p| p.is_dir())
    {
        check_chain(existing, strict_depth(root, existing), dir, mode)?;
    }
    create_dir_all(dir, mode).map_err(io_err("create", dir))?;
    check_state_dir(root, dir, mode)
}

/// Checks the existing state directory `dir` and those it hangs from. From `root` down to `dir`
/// (`dir` at or below `root`): a directory, owned by root or this process's user, writable by
/// nobody else; `mode` is what the message asks for. Above `root`, up to `/`: owned by root or
/// this user, and writable by nobody else unless sticky (as `/tmp`). Both the path as given and
/// its canonical form are walked, so a symlink on the way is judged where it points.
pub fn check_state_dir(root: &Path, dir: &Path, mode: u32) -> Result<(), FsModeError> {
    check_chain(dir, strict_depth(root, dir), dir, mode)
}

/// How many of `path` and the directories above it hold state (are at or below `root`).
fn strict_depth(root: &Path, path: &Path) -> usize {
    path.strip_prefix(root)
        .map_or(0, |rest| rest.components().count() + 1)
}

/// Checks `path` and every directory above it, the first `strict` of them as state
/// directories; `dir` is the state directory the message names.
fn check_chain(path: &Path, strict: usize, dir: &Path, mode: u32) -> Result<(), FsModeError> {
    let euid = crate::sys::geteuid();
    let given = std::path::absolute(path).map_err(io_err("resolve", path))?;
    let canonical = fs::canonicalize(path).map_err(io_err("resolve", path))?;
    for walk in [&given, &canonical] {
        for (depth, at) in walk.ancestors().enumerate() {
            check_one(at, depth < strict, dir, mode, euid)?;
        }
    }
    Ok(())
}

fn check_one(
    path: &Path,
    state: bool,
    dir: &Path,
    mode: u32,
    euid: u32,
) -> Result<(), FsModeError> {
    let meta = fs::metadata(path).map_err(io_err("stat", path))?;
    if !meta.is_dir() {
        return Err(FsModeError::NotADirectory {
            path: path.to_owned(),
        });
    }
    let bits = meta.mode() & 0o7777;
    let uid = meta.uid();
    let owners = if euid == 0 {
        "owned by root".to_owned()
    } else {
        format!("owned by root or uid {euid}")
    };
    let problem = if uid != 0 && uid != euid {
        Some("another user owns it and can change it")
    } else if bits & GROUP_OTHER_WRITE != 0 && (state || bits & STICKY == 0) {
        Some(if state {
            "writable by group or others, who could replace or remove the state in it"
        } else {
            "writable by group or others without the sticky bit, who could rename the state \
             directory away"
        })
    } else {
        None
    };
    let Some(problem) = problem else {
        return Ok(());
    };
    let (place, expected, fix) = if state {
        (
            "state directory".to_owned(),
            format!("mode {mode:04o} (no group or world write), {owners}"),
            format!("chmod {mode:04o} {}", path.display()),
        )
    } else {
        (
            format!("directory above state directory {},", dir.display()),
            format!("no group or world write (or the sticky bit, as /tmp), {owners}"),
            format!("chmod go-w {}", path.display()),
        )
    };
    Err(FsModeError::Unsafe(Box::new(UnsafeDir {
        path: path.to_owned(),
        place,
        mode: bits,
        uid,
        problem,
        expected,
        fix: if uid != 0 && uid != euid {
            format!("chown {euid} {}", path.display())
        } else {
            fix
        },
    })))
}

/// Writes `bytes` to `path`, created or truncated, with exactly `mode`; not crash-safe (for
/// scratch files; state goes through [`crate::durable::replace`]).
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    open(
        OpenOptions::new().write(true).create(true).truncate(true),
        path,
        mode,
    )?
    .write_all(bytes)
}

/// Opens `path` with `options`; the file (created or not) then has exactly `mode`.
pub fn open(options: &mut OpenOptions, path: &Path, mode: u32) -> io::Result<File> {
    let file = options.mode(mode).open(path)?;
    set_mode(&file, mode)?;
    Ok(file)
}

/// Gives the open `file` exactly `mode` (`fchmod(2)`) unless it has it: the umask may have
/// cleared bits of the mode it was created with.
pub fn set_mode(file: &File, mode: u32) -> io::Result<()> {
    if file.metadata()?.mode() & 0o7777 == mode {
        return Ok(());
    }
    file.set_permissions(Permissions::from_mode(mode))
}

/// A new temporary directory `$TMPDIR/<prefix><random>` with exactly mode 0700 (tempfile makes
/// directories 0777 minus the umask, so `umask 000` would let anyone swap what is put in it),
/// removed when the value is dropped.
pub fn private_tempdir(prefix: &str) -> io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(Permissions::from_mode(PRIVATE_DIR))
        .tempdir()?;
    fs::set_permissions(dir.path(), Permissions::from_mode(PRIVATE_DIR))?;
    Ok(dir)
}

/// True when this process runs as root (effective user id 0): it may `mknod` and make cgroups.
pub fn is_root() -> bool {
    crate::sys::geteuid() == 0
}

/// Binds a unix socket at `path` with exactly `mode`, never reachable with a wider one. `bind(2)`
/// makes a socket with mode 0777 minus the umask, so `bind` is called on a path inside a new
/// private (0700) directory beside `path` (`.<pid>-<n>.b/s`), the socket gets `mode`, and
/// only then is renamed to `path` (replacing whatever is there: the caller checks first). The
/// private directory is removed. Its path is at most a few characters longer than `path`
/// (`unix(7)`: a socket's path holds at most 107 bytes), so that `bind` takes any path that
/// a direct bind would take but for those few.
pub fn bind_socket<T>(
    path: &Path,
    mode: u32,
    bind: impl FnOnce(PathBuf) -> io::Result<T>,
) -> io::Result<T> {
    /// Tells apart the binds of one process in one directory.
    static BINDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    if path.file_name().is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no socket file name",
        ));
    }
    let private = path.with_file_name(format!(
        ".{}-{}.b",
        std::process::id(),
        BINDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let at = private.join("s");
    // A leftover of a crashed bind by an earlier process with this pid.
    let _ = fs::remove_file(&at);
    let _ = fs::remove_dir(&private);
    mkdir(&private, PRIVATE_DIR)?;
    let bound = (|| {
        let listener = bind(at.clone())?;
        fs::set_permissions(&at, Permissions::from_mode(mode))?;
        fs::rename(&at, path)?;
        Ok(listener)
    })();
    let _ = fs::remove_file(&at);
    let _ = fs::remove_dir(&private);
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).expect("stat").mode() & 0o7777
    }

    #[test]
    fn creates_every_missing_directory_with_the_mode_and_leaves_existing_ones() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let existing = tmp.path().join("existing");
        fs::create_dir(&existing).expect("mkdir");
        fs::set_permissions(&existing, Permissions::from_mode(0o750)).expect("chmod");
        let dir = existing.join("a/b/gpu");
        create_dir_all(&dir, STATE_DIR).expect("create");
        for p in [existing.join("a"), existing.join("a/b"), dir.clone()] {
            assert_eq!(mode_of(&p), STATE_DIR, "{}", p.display());
        }
        assert_eq!(
            mode_of(&existing),
            0o750,
            "an existing directory is not changed"
        );
        create_dir_all(&dir, STATE_DIR).expect("again");
        fs::write(tmp.path().join("file"), "x").expect("write");
        let err = create_dir_all(&tmp.path().join("file/gpu"), STATE_DIR).expect_err("a file");
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory, "{err}");
    }

    #[test]
    fn files_get_exactly_their_mode() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("state.json");
        let file = File::create(&path).expect("create");
        file.set_permissions(Permissions::from_mode(0o666))
            .expect("chmod");
        set_mode(&file, STATE_FILE).expect("set");
        assert_eq!(mode_of(&path), STATE_FILE);
        let scratch = tmp.path().join("scratch");
        write_file(&scratch, b"x", 0o666).expect("write");
        write_file(&scratch, b"y", PRIVATE_FILE).expect("rewrite");
        assert_eq!(mode_of(&scratch), PRIVATE_FILE);
        assert_eq!(fs::read(&scratch).expect("read"), b"y");
    }

    #[test]
    fn a_socket_is_bound_with_exactly_its_mode_and_nothing_is_left_beside_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("plugin.sock");
        let listener =
            bind_socket(&path, 0o660, std::os::unix::net::UnixListener::bind).expect("bind");
        assert_eq!(mode_of(&path), 0o660);
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        drop(listener);
        let names: Vec<_> = fs::read_dir(tmp.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("plugin.sock")]);
    }

    /// Issue 37: a socket whose path a direct bind takes with a few bytes to spare is bound
    /// (the private directory's name held the socket's name and `.bind` twice over, so an MPS
    /// daemon's `control` in a simulated node's scratch state was refused as too long).
    #[test]
    fn a_socket_path_near_the_limit_is_bound() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // 107 bytes is the most a socket's path holds; leave 8 for the private directory.
        let name = "control";
        let budget = 107 - 8 - name.len() - 1;
        let mut dir = tmp.path().to_path_buf();
        while dir.as_os_str().len() < budget {
            let room = budget - dir.as_os_str().len() - 1;
            dir.push("d".repeat(room.clamp(1, 40)));
        }
        fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join(name);
        assert_eq!(path.as_os_str().len(), 107 - 8);
        let listener =
            bind_socket(&path, 0o600, std::os::unix::net::UnixListener::bind).expect("bind");
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        drop(listener);
    }

    #[test]
    fn a_group_or_world_writable_state_directory_is_refused_with_its_mode_and_owner() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("pool");
        let dir = root.join("gpu");
        state_dir(&root, &dir, STATE_DIR).expect("fresh");
        for (path, bits) in [(&root, 0o777), (&dir, 0o775), (&dir, 0o1777)] {
            fs::set_permissions(path, Permissions::from_mode(bits)).expect("chmod");
            let err = state_dir(&root, &dir, STATE_DIR).expect_err("writable by others");
            assert!(err.is_unsafe(), "{err}");
            let text = err.to_string();
            let uid = fs::metadata(path).expect("stat").uid();
            assert!(
                text.starts_with(&format!(
                    "state directory {} has mode {bits:04o} and owner uid {uid}: writable by group or others",
                    path.display()
                )),
                "{text}"
            );
            assert!(
                text.contains("Expected mode 0755 (no group or world write)"),
                "{text}"
            );
            assert!(
                text.contains(&format!("chmod 0755 {}", path.display())),
                "{text}"
            );
            assert_eq!(mode_of(path), bits, "refused, not repaired");
            fs::set_permissions(path, Permissions::from_mode(STATE_DIR)).expect("chmod");
        }
        state_dir(&root, &dir, STATE_DIR).expect("fixed");
        fs::remove_dir(&dir).expect("rmdir");
        fs::set_permissions(&root, Permissions::from_mode(0o777)).expect("chmod");
        assert!(state_dir(&root, &dir, STATE_DIR).is_err());
        assert!(!dir.exists(), "made under a refused directory");
    }

    #[test]
    fn a_sticky_parent_is_fine_and_a_writable_one_is_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let above = tmp.path().join("shared");
        let root = above.join("pool");
        state_dir(&root, &root, STATE_DIR).expect("fresh");
        fs::set_permissions(&above, Permissions::from_mode(0o1777)).expect("chmod");
        state_dir(&root, &root.join("gpu"), STATE_DIR).expect("sticky, as /tmp");
        fs::set_permissions(&above, Permissions::from_mode(0o777)).expect("chmod");
        let err = state_dir(&root, &root.join("gpu"), STATE_DIR).expect_err("not sticky");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "directory above state directory {}, {} has mode 0777",
                root.join("gpu").display(),
                above.display()
            )),
            "{text}"
        );
        assert!(text.contains("without the sticky bit"), "{text}");
    }

    #[test]
    fn a_symlinked_state_directory_is_judged_where_it_points() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let open = tmp.path().join("open");
        fs::create_dir(&open).expect("mkdir");
        fs::set_permissions(&open, Permissions::from_mode(0o777)).expect("chmod");
        let target = open.join("pool");
        fs::create_dir(&target).expect("mkdir");
        let link = tmp.path().join("pool");
        std::os::unix::fs::symlink(&target, &link).expect("ln");
        let err = state_dir(&link, &link.join("gpu"), STATE_DIR).expect_err("under 0777");
        assert!(
            err.to_string().contains(&open.display().to_string()),
            "{err}"
        );
    }
}
