//! `tessera run` without a system manager: when no manager answers on the
//! socket, `tessera run` uses a private manager for the user's session,
//! started on demand as the user (`tessera manager` with its state under
//! `$XDG_RUNTIME_DIR/tessera`, metrics off, the backstop reporting only),
//! shared by every `tessera run` of that user, and stopped by the last run
//! to end.
//!
//! Who is still running is a lock, not a count: every run holds a shared
//! `flock` on `users.lock` for its whole life; a run that ends takes the
//! lock exclusively without waiting, and only if that succeeds (no other
//! run holds it) stops the manager. A run starting meanwhile waits for the
//! shared lock, so it never finds a manager that is about to be stopped.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::CliError;

/// Names the program started as the private manager (run as `PROGRAM
/// manager --flags…`); by default this executable, `tessera` itself.
pub const MANAGER_PROGRAM_ENV: &str = "TESSERA_PRIVATE_MANAGER";

/// How long a run waits for a manager it started to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The session's private manager directory: `$XDG_RUNTIME_DIR/tessera`,
/// or `/tmp/tessera-<uid>` without a runtime directory.
pub fn session_dir() -> PathBuf {
    session_dir_of(
        std::env::var_os("XDG_RUNTIME_DIR").as_deref(),
        nix::unistd::getuid().as_raw(),
    )
}

fn session_dir_of(runtime_dir: Option<&std::ffi::OsStr>, uid: u32) -> PathBuf {
    match runtime_dir.filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("tessera"),
        None => PathBuf::from(format!("/tmp/tessera-{uid}")),
    }
}

/// Whether a manager answers on `socket` (a listener accepts).
pub fn answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// This run's hold on the session's private manager.
#[derive(Debug)]
pub struct Private {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// Whether this run started the manager (else it found one running).
    pub started: bool,
    /// Our shared lock on `users.lock`, held until [`Private::release`].
    users: Option<Flock<File>>,
    /// The manager, when this run started it (to reap it if we stop it).
    child: Option<Child>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CliError {
    let what = what.into();
    move |error| CliError::Io { what, error }
}

fn lock_file(dir: &Path) -> Result<File, CliError> {
    let path = dir.join("users.lock");
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(io(format!("cannot open {}", path.display())))
}

/// The hook library a private manager hands out when `tessera run` names
/// none: `libtessera.so` beside this executable (a cargo build puts both in
/// `target/<profile>/`), else the system locations.
pub fn default_hook() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("libtessera.so")));
    beside
        .into_iter()
        .chain([
            PathBuf::from(tessera_contract::paths::HOST_HOOK_LIBRARY),
            PathBuf::from(tessera_contract::paths::CONTAINER_HOOK_LIBRARY),
        ])
        .find(|p| p.exists())
}

impl Private {
    /// Joins the session's private manager, starting it if none answers.
    /// `hook`: the shim the manager hands out.
    pub fn join(dir: &Path, hook: &Path) -> Result<Private, CliError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(format!("cannot create {}", dir.display())))?;
        let socket = dir.join("manager.sock");
        let users =
            Flock::lock(lock_file(dir)?, FlockArg::LockShared).map_err(|(_, e)| CliError::Io {
                what: format!("cannot lock {}", dir.join("users.lock").display()),
                error: e.into(),
            })?;
        let mut me = Private {
            dir: dir.to_owned(),
            socket: socket.clone(),
            started: false,
            users: Some(users),
            child: None,
        };
        if answers(&socket) {
            return Ok(me);
        }
        // None answers: start one. Two runs may get here at once; the
        // manager's own lock on its state directory lets one of them serve,
        // and both wait for the socket to answer.
        let program = std::env::var_os(MANAGER_PROGRAM_ENV)
            .map(PathBuf::from)
            .map(Ok)
            .unwrap_or_else(std::env::current_exe)
            .map_err(io("cannot find the tessera executable"))?;
        let log_path = dir.join("manager.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&log_path)
            .map_err(io(format!("cannot open {}", log_path.display())))?;
        let mut cmd = Command::new(&program);
        cmd.arg("manager")
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--socket")
            .arg(&socket)
            .arg("--hook-library")
            .arg(hook)
            .args(["--metrics-addr", "off", "--backstop-kill", "false"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group: ^C at the terminal reaches the
            // command, not the manager other runs share.
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(io(format!("cannot start {} manager", program.display())))?;
        me.child = Some(child);
        me.started = true;
        let t0 = Instant::now();
        while !answers(&socket) {
            if let Some(c) = me.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                me.child = None;
                if answers(&socket) {
                    break; // another run's manager won the race
                }
                if !status.success() && t0.elapsed() > Duration::from_millis(200) {
                    return Err(CliError::Usage(format!(
                        "the private manager did not start ({status}); see {}",
                        log_path.display()
                    )));
                }
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err(CliError::Usage(format!(
                    "the private manager did not answer on {} within {START_TIMEOUT:?}; see {}",
                    socket.display(),
                    log_path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(me)
    }

    /// Ends this run's use of the manager; the last run stops it (SIGTERM,
    /// then waits up to 5 s for its socket to go). Errors are reported, not
    /// returned: the command's exit code matters more.
    pub fn release(mut self) {
        drop(self.users.take());
        let Ok(f) = lock_file(&self.dir) else { return };
        let Ok(last) = Flock::lock(f, FlockArg::LockExclusiveNonblock) else {
            return; // another run still uses it
        };
        if answers(&self.socket) {
            let pid = self
                .child
                .as_ref()
                .map(|c| c.id())
                .or_else(|| manager_pid(&self.dir.join("state")));
            match pid.and_then(|p| i32::try_from(p).ok()) {
                Some(pid) => {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                    let t0 = Instant::now();
                    while answers(&self.socket) && t0.elapsed() < Duration::from_secs(5) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                None => eprintln!(
                    "tessera run: could not tell which process is the private manager on {}",
                    self.socket.display()
                ),
            }
        }
        // Reap the manager if it is our child; one that does not stop in
        // 5 s is left to finish on its own (re-parented when we exit).
        if let Some(mut c) = self.child.take() {
            let t0 = Instant::now();
            while matches!(c.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        drop(last);
    }
}

/// The pid of the manager serving `state_dir`: the process that holds the
/// directory's `manager.lock` open, found in `/proc` among our own.
fn manager_pid(state_dir: &Path) -> Option<u32> {
    let lock = std::fs::canonicalize(state_dir.join("manager.lock")).ok()?;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == lock))
        {
            return Some(pid);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_directory_is_the_runtime_directory() {
        let d = session_dir_of(Some("/run/user/1000".as_ref()), 1000);
        assert_eq!(d, Path::new("/run/user/1000/tessera"));
        assert_eq!(session_dir_of(None, 1000), Path::new("/tmp/tessera-1000"));
        assert_eq!(
            session_dir_of(Some("".as_ref()), 7),
            Path::new("/tmp/tessera-7")
        );
    }

    #[test]
    fn the_lock_says_who_is_last() {
        let dir = tempfile::tempdir().unwrap();
        let a = Flock::lock(lock_file(dir.path()).unwrap(), FlockArg::LockShared).unwrap();
        let b = Flock::lock(lock_file(dir.path()).unwrap(), FlockArg::LockShared).unwrap();
        drop(a);
        assert!(
            Flock::lock(
                lock_file(dir.path()).unwrap(),
                FlockArg::LockExclusiveNonblock
            )
            .is_err(),
            "a run still holds it"
        );
        drop(b);
        assert!(
            Flock::lock(
                lock_file(dir.path()).unwrap(),
                FlockArg::LockExclusiveNonblock
            )
            .is_ok(),
            "the last run is alone"
        );
    }
}
