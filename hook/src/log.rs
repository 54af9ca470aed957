//! The hook's own log: off unless `TESSERA_LOG` asks, written to a file of
//! its own (never the application's stdout or stderr), configured once.
//! Nothing on a hot path logs. `TESSERA_LOG_FILE` is the tenant's to set,
//! so the file is opened without blocking and without following a final
//! symlink, and used only when it is a regular file that is not one of the
//! allocation's own files: appending log lines to the state file would break
//! the allocation for every process in it.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;

/// Severity of a log line; `Off` only as a threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    /// Parses a `TESSERA_LOG` value. `None` for a value that is not a level.
    pub fn parse(s: &str) -> Option<Level> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "off" | "0" | "none" => Some(Level::Off),
            "error" => Some(Level::Error),
            "warn" | "warning" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" | "trace" => Some(Level::Debug),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Off as u8);
/// The log file, and the files it must never be (the allocation's own).
static PATH: OnceLock<(PathBuf, Vec<PathBuf>)> = OnceLock::new();
static FILE: Mutex<Target> = Mutex::new(Target::Unopened);

/// Where lines go: opened on the first line, and a refused file stays
/// refused (no retry on every line).
enum Target {
    Unopened,
    Open(File),
    Refused,
}

/// Switches logging on at `level` into `path`, which must not turn out to
/// be any of `protected` (the allocation's files: the caller knows them,
/// this module does not). Called once, when the configuration is read.
pub fn init(level: Level, path: &Path, protected: Vec<PathBuf>) {
    let _ = PATH.set((path.to_owned(), protected));
    LEVEL.store(level as u8, Ordering::Release);
}

/// Whether a line at `level` would be written.
#[inline(always)]
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed) && level != Level::Off
}

/// Writes one line. Failing to log never disturbs the application.
pub fn write(level: Level, args: fmt::Arguments<'_>) {
    let Some((path, protected)) = PATH.get() else {
        return;
    };
    let mut target = FILE.lock();
    if let Target::Unopened = *target {
        *target = match open_log(path, protected) {
            Ok(f) => Target::Open(f),
            Err(_) => Target::Refused,
        };
    }
    if let Target::Open(f) = &mut *target {
        let line = format!(
            "tessera[{}] {}: {}\n",
            std::process::id(),
            level.name(),
            args
        );
        let _ = f.write_all(line.as_bytes());
    }
}

/// Why a log file was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum LogRefused {
    /// It could not be opened (a FIFO without a reader answers `ENXIO`).
    Open(std::io::ErrorKind),
    /// Not a regular file: a FIFO, a device (`/dev/stdout` would reach the
    /// application's output), a socket.
    NotRegular,
    /// It is one of the allocation's files.
    AllocationFile(PathBuf),
}

/// Opens `path` for appending, refusing what must not be a log (see the
/// module comment). Never blocks.
pub fn open_log(path: &Path, protected: &[PathBuf]) -> Result<File, LogRefused> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| LogRefused::Open(e.kind()))?;
    let m = f.metadata().map_err(|e| LogRefused::Open(e.kind()))?;
    if !m.file_type().is_file() {
        return Err(LogRefused::NotRegular);
    }
    for p in protected {
        if let Ok(pm) = std::fs::metadata(p)
            && pm.dev() == m.dev()
            && pm.ino() == m.ino()
        {
            return Err(LogRefused::AllocationFile(p.clone()));
        }
    }
    Ok(f)
}

/// Logs a line if its level is on: `log!(Level::Info, "joined slot {}", s)`.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)*) => {
        if $crate::log::enabled($level) {
            $crate::log::write($level, format_args!($($arg)*));
        }
    };
}

/// Writes one line to stderr with a single `write(2)`, bypassing Rust's
/// stderr (which panics on failure). For the one fail-closed message.
pub fn stderr_line(line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    // SAFETY: writes an initialised buffer of its own length to fd 2.
    let _ = unsafe { libc::write(2, buf.as_ptr().cast(), buf.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_unknown_values_are_refused() {
        assert_eq!(Level::parse("off"), Some(Level::Off));
        assert_eq!(Level::parse(""), Some(Level::Off));
        assert_eq!(Level::parse("INFO"), Some(Level::Info));
        assert_eq!(Level::parse(" debug "), Some(Level::Debug));
        assert_eq!(Level::parse("warning"), Some(Level::Warn));
        assert_eq!(Level::parse("verbose"), None);
        assert!(Level::Error < Level::Debug);
    }

    #[test]
    fn allocation_files_and_special_files_are_refused_as_logs() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::write(&state, b"TSRSTATE").unwrap();
        let protected = vec![dir.path().join("control"), state.clone()];
        // The state file itself, and a hard link to it.
        assert_eq!(
            open_log(&state, &protected).unwrap_err(),
            LogRefused::AllocationFile(state.clone())
        );
        let link = dir.path().join("link");
        std::fs::hard_link(&state, &link).unwrap();
        assert_eq!(
            open_log(&link, &protected).unwrap_err(),
            LogRefused::AllocationFile(state.clone())
        );
        // A symlink is not followed.
        let sym = dir.path().join("sym");
        std::os::unix::fs::symlink(&state, &sym).unwrap();
        assert!(matches!(
            open_log(&sym, &protected),
            Err(LogRefused::Open(_))
        ));
        assert_eq!(std::fs::read(&state).unwrap(), b"TSRSTATE");
        // A FIFO with no reader: refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(open_log(&fifo, &protected).is_err());
        // A device (the application's own output must stay its own).
        assert_eq!(
            open_log(Path::new("/dev/null"), &protected).unwrap_err(),
            LogRefused::NotRegular
        );
        // An ordinary file is fine, created private.
        let log = dir.path().join("hook.log");
        open_log(&log, &protected).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&log).unwrap().permissions().mode() & 0o077,
            0
        );
    }
}
