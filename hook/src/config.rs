//! What the environment says, read once: whether the process is governed
//! (and by which files), and how the hook logs. The device plugin's fixed
//! in-container paths win over the environment whenever they are mounted:
//! a tenant's `TESSERA_CONTROL` must not point the shim at a limits file of
//! its own making.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use tessera_shm::ShmError;

use crate::log::Level;

/// Env: paths of the allocation's control and state files; log level and file.
pub use tessera_contract::env::{
    CONTROL as ENV_CONTROL, LOG as ENV_LOG, LOG_FILE as ENV_LOG_FILE, STATE as ENV_STATE,
};
/// Control file (mounted read-only) and state file (read-write) of a
/// container's allocation, where the device plugin mounts them.
pub use tessera_contract::paths::{
    CONTAINER_CONTROL as DEFAULT_CONTROL, CONTAINER_STATE as DEFAULT_STATE,
};

/// The two files of the allocation a governed process belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocFiles {
    pub control: PathBuf,
    pub state: PathBuf,
}

/// Everything the hook takes from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `Some` when the process is governed.
    pub alloc: Option<AllocFiles>,
    pub log_level: Level,
    pub log_file: PathBuf,
    /// A `TESSERA_LOG` value that is not a level: logging goes on at `info`
    /// and the first line says so, rather than the setting being ignored.
    pub log_complaint: Option<String>,
}

impl Config {
    /// Reads the configuration through `var` (the environment), `exists`
    /// (whether a path exists) and the process id, so tests can fake all
    /// three.
    pub fn from_env(
        var: impl Fn(&str) -> Option<OsString>,
        exists: impl Fn(&Path) -> bool,
        pid: u32,
    ) -> Config {
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty());
        let fixed_control = Path::new(DEFAULT_CONTROL);
        let fixed_state = Path::new(DEFAULT_STATE);
        let mut overridden = Vec::new();
        // The mounted path wins: only the device plugin can put a file there.
        let control = if exists(fixed_control) {
            if let Some(v) = nonempty(ENV_CONTROL).filter(|v| Path::new(v) != fixed_control) {
                overridden.push(format!("{ENV_CONTROL}={v:?}"));
            }
            Some(fixed_control.to_owned())
        } else {
            nonempty(ENV_CONTROL).map(PathBuf::from)
        };
        let alloc = control.map(|control| {
            let state = if exists(fixed_state) {
                if let Some(v) = nonempty(ENV_STATE).filter(|v| Path::new(v) != fixed_state) {
                    overridden.push(format!("{ENV_STATE}={v:?}"));
                }
                fixed_state.to_owned()
            } else {
                nonempty(ENV_STATE)
                    .map(PathBuf::from)
                    .unwrap_or_else(|| control.parent().unwrap_or(Path::new(".")).join("state"))
            };
            AllocFiles { control, state }
        });
        let raw_level = var(ENV_LOG).map(|v| v.to_string_lossy().into_owned());
        let (log_level, log_complaint) = match raw_level.as_deref().map(Level::parse) {
            None => (Level::Off, None),
            Some(Some(l)) => (l, None),
            Some(None) => (
                Level::Info,
                Some(format!(
                    "{ENV_LOG}={:?} is not one of off, error, warn, info, debug; logging at info",
                    raw_level.unwrap_or_default()
                )),
            ),
        };
        let mut log_complaint = log_complaint;
        if !overridden.is_empty() {
            let line = format!(
                "{} ignored: the allocation's files are mounted at {}",
                overridden.join(", "),
                fixed_control.parent().unwrap_or(Path::new("/")).display()
            );
            log_complaint = Some(match log_complaint {
                Some(c) => format!("{c}; {line}"),
                None => line,
            });
        }
        let log_file = nonempty(ENV_LOG_FILE)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("/tmp/tessera-hook.{pid}.log")));
        Config {
            alloc,
            log_level,
            log_file,
            log_complaint,
        }
    }

    /// The files a log must never be: the allocation's, at the fixed
    /// mounts and wherever the environment names them (appending log lines
    /// to the state file would break the allocation for all its processes).
    pub fn allocation_paths(&self) -> Vec<PathBuf> {
        let mut v = vec![PathBuf::from(DEFAULT_CONTROL), PathBuf::from(DEFAULT_STATE)];
        if let Some(a) = &self.alloc {
            v.extend([a.control.clone(), a.state.clone()]);
        }
        v
    }

    /// The process's own configuration.
    pub fn current() -> Config {
        Config::from_env(|k| std::env::var_os(k), Path::exists, std::process::id())
    }
}

/// Checks, without blocking, that each of the allocation's files is a
/// regular file. Opening a FIFO for reading blocks until a writer comes (a
/// tenant could hang its own `cuInit`), and a device or socket is never an
/// allocation file; both are refused with the one fail-closed line. A file
/// that cannot be opened at all is left for the real open to report.
pub fn check_regular(a: &AllocFiles) -> Result<(), ShmError> {
    for path in [&a.control, &a.state] {
        if let Some(kind) = not_regular(path) {
            return Err(ShmError::Io {
                path: path.clone(),
                source: std::io::Error::other(format!("not a regular file ({kind})")),
            });
        }
    }
    Ok(())
}

/// What `path` is when it is not a regular file; `None` for a regular file
/// or one that cannot be opened. Opens with `O_NONBLOCK` and asks the open
/// descriptor, so a FIFO neither blocks nor is swapped in between.
pub fn not_regular(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    let t = f.metadata().ok()?.file_type();
    if t.is_file() {
        None
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_dir() {
        Some("a directory")
    } else {
        Some("not a file")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)], default_exists: bool) -> Config {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Config::from_env(
            |k| m.get(k).cloned(),
            |p| {
                default_exists && (p == Path::new(DEFAULT_CONTROL) || p == Path::new(DEFAULT_STATE))
            },
            42,
        )
    }

    #[test]
    fn ungoverned_without_control_env_or_default_file() {
        let c = cfg(&[], false);
        assert_eq!(c.alloc, None);
        assert_eq!(c.log_level, Level::Off);
        assert_eq!(c.log_file, PathBuf::from("/tmp/tessera-hook.42.log"));
        // An empty variable is the same as none.
        assert_eq!(cfg(&[(ENV_CONTROL, "")], false).alloc, None);
    }

    #[test]
    fn env_control_governs_and_state_defaults_to_its_sibling() {
        let c = cfg(&[(ENV_CONTROL, "/a/b/control")], false);
        assert_eq!(
            c.alloc,
            Some(AllocFiles {
                control: "/a/b/control".into(),
                state: "/a/b/state".into()
            })
        );
        let c = cfg(
            &[(ENV_CONTROL, "/a/control"), (ENV_STATE, "/x/state")],
            false,
        );
        assert_eq!(c.alloc.unwrap().state, PathBuf::from("/x/state"));
    }

    #[test]
    fn default_control_file_governs_when_present() {
        let c = cfg(&[], true);
        assert_eq!(
            c.alloc,
            Some(AllocFiles {
                control: DEFAULT_CONTROL.into(),
                state: "/run/tessera/alloc/state".into()
            })
        );
        // No complaint when nothing was overridden.
        assert_eq!(c.log_complaint, None);
    }

    #[test]
    fn mounted_paths_win_over_the_environment() {
        let c = cfg(
            &[(ENV_CONTROL, "/mine/control"), (ENV_STATE, "/mine/state")],
            true,
        );
        assert_eq!(
            c.alloc,
            Some(AllocFiles {
                control: DEFAULT_CONTROL.into(),
                state: DEFAULT_STATE.into()
            })
        );
        let complaint = c.log_complaint.expect("says what it ignored");
        assert!(
            complaint.contains("TESSERA_CONTROL=\"/mine/control\""),
            "{complaint}"
        );
        assert!(
            complaint.contains("TESSERA_STATE=\"/mine/state\""),
            "{complaint}"
        );
        // The device plugin's own env (the same paths) is not a complaint.
        let c = cfg(
            &[(ENV_CONTROL, DEFAULT_CONTROL), (ENV_STATE, DEFAULT_STATE)],
            true,
        );
        assert_eq!(c.log_complaint, None);
        // Without the mount (`tessera run`), the environment names the files.
        let c = cfg(&[(ENV_CONTROL, "/mine/control")], false);
        assert_eq!(c.alloc.unwrap().control, PathBuf::from("/mine/control"));
    }

    #[test]
    fn fifos_devices_and_directories_are_not_allocation_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        // A FIFO with no writer: this would block forever without O_NONBLOCK.
        assert_eq!(not_regular(&fifo), Some("a FIFO"));
        assert_eq!(not_regular(Path::new("/dev/null")), Some("a device"));
        assert_eq!(not_regular(dir.path()), Some("a directory"));
        assert_eq!(not_regular(&file), None);
        assert_eq!(not_regular(&dir.path().join("missing")), None);
        let err = check_regular(&AllocFiles {
            control: file.clone(),
            state: fifo.clone(),
        })
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            format!("{}: not a regular file (a FIFO)", fifo.display())
        );
    }

    #[test]
    fn log_settings() {
        let c = cfg(&[(ENV_LOG, "debug"), (ENV_LOG_FILE, "/tmp/x.log")], false);
        assert_eq!(c.log_level, Level::Debug);
        assert_eq!(c.log_file, PathBuf::from("/tmp/x.log"));
        assert_eq!(c.log_complaint, None);
        let c = cfg(&[(ENV_LOG, "loud")], false);
        assert_eq!(c.log_level, Level::Info);
        assert!(c.log_complaint.unwrap().contains("\"loud\""));
    }

    #[test]
    fn the_log_is_kept_off_the_fixed_and_the_named_allocation_files() {
        let c = cfg(
            &[(ENV_CONTROL, "/a/control"), (ENV_STATE, "/a/state")],
            false,
        );
        let p = c.allocation_paths();
        for f in [DEFAULT_CONTROL, DEFAULT_STATE, "/a/control", "/a/state"] {
            assert!(p.contains(&PathBuf::from(f)), "{f} missing from {p:?}");
        }
        let ungoverned = cfg(&[], false).allocation_paths();
        assert_eq!(
            ungoverned.len(),
            2,
            "the fixed mounts, always: {ungoverned:?}"
        );
    }
}
