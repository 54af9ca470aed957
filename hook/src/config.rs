//! What the environment says, read once: whether the process is governed
//! (and by which files), and how the hook logs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::log::Level;

/// Control file of a container's allocation, mounted read-only.
pub const DEFAULT_CONTROL: &str = "/run/tessera/alloc/control";
/// Env: path of the allocation's control file.
pub const ENV_CONTROL: &str = "TESSERA_CONTROL";
/// Env: path of the allocation's state file.
pub const ENV_STATE: &str = "TESSERA_STATE";
/// Env: log level.
pub const ENV_LOG: &str = "TESSERA_LOG";
/// Env: log file.
pub const ENV_LOG_FILE: &str = "TESSERA_LOG_FILE";

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
        let control = match nonempty(ENV_CONTROL) {
            Some(p) => Some(PathBuf::from(p)),
            None => {
                let d = Path::new(DEFAULT_CONTROL);
                exists(d).then(|| d.to_owned())
            }
        };
        let alloc = control.map(|control| {
            let state = nonempty(ENV_STATE)
                .map(PathBuf::from)
                .unwrap_or_else(|| control.parent().unwrap_or(Path::new(".")).join("state"));
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

    /// The process's own configuration.
    pub fn current() -> Config {
        Config::from_env(|k| std::env::var_os(k), Path::exists, std::process::id())
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
            |p| default_exists && p == Path::new(DEFAULT_CONTROL),
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
        // The variable wins over the default path.
        let c = cfg(&[(ENV_CONTROL, "/mine/control")], true);
        assert_eq!(c.alloc.unwrap().control, PathBuf::from("/mine/control"));
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
}
