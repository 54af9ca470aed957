//! The hook's own log: off unless `TESSERA_LOG` asks, written to a file of
//! its own (never the application's stdout or stderr), configured once.
//! Nothing on a hot path logs.

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
static PATH: OnceLock<PathBuf> = OnceLock::new();
static FILE: Mutex<Option<File>> = Mutex::new(None);

/// Switches logging on at `level` into `path`. Called once, from config.
pub fn init(level: Level, path: &Path) {
    let _ = PATH.set(path.to_owned());
    LEVEL.store(level as u8, Ordering::Release);
}

/// Whether a line at `level` would be written.
#[inline(always)]
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed) && level != Level::Off
}

/// Writes one line. Failing to log never disturbs the application.
pub fn write(level: Level, args: fmt::Arguments<'_>) {
    let Some(path) = PATH.get() else { return };
    let mut file = FILE.lock();
    if file.is_none() {
        *file = OpenOptions::new().create(true).append(true).open(path).ok();
    }
    if let Some(f) = file.as_mut() {
        let line = format!(
            "tessera[{}] {}: {}\n",
            std::process::id(),
            level.name(),
            args
        );
        let _ = f.write_all(line.as_bytes());
    }
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
}
