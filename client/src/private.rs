//! `tessera run` without a system manager: when no manager answers on the
//! socket, `tessera run` uses a private manager for the user's session,
//! started on demand as the user (`tessera manager` with its state under
//! `$XDG_RUNTIME_DIR/tessera`, metrics off, the backstop reporting only),
//! shared by every `tessera run` of that user. It outlives the last run by
//! a grace period (`--private-grace`, [`DEFAULT_GRACE`]) and then exits by
//! itself (the manager's `--idle-exit`), so a loop of short commands pays
//! for one start.
//!
//! Runs and the manager agree through `users.lock` (see the manager's
//! `idle` module): a run holds it shared from before it looks for the
//! manager until its command starts (the `exec` closes it); the manager
//! exits only while holding it exclusively with no allocation left, and
//! keeps it until it is gone, so a run never finds a manager about to go.
//! A second lock, `start.lock`, makes one run at a time start a manager.
//! The manager is a grandchild in a session of its own: not the command's
//! child (it execs in our place), and ^C at the terminal does not reach it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::CliError;

/// Names the program started as the private manager (run as `PROGRAM
/// manager --flags…`); by default this executable, `tessera` itself.
pub const MANAGER_PROGRAM_ENV: &str = "TESSERA_PRIVATE_MANAGER";

/// How long a run waits for a manager it started to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the private manager stays after its last run: long enough that
/// a loop of short commands, or an edit-and-rerun session, starts it once.
pub const DEFAULT_GRACE: &str = "5m";

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

/// This run's hold on the session's private manager: the shared lock on
/// `users.lock`, to keep until the command starts (exec closes it) or the
/// allocation exists.
#[derive(Debug)]
pub struct Private {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// Whether this run started the manager (else it found one running).
    pub started: bool,
    _users: Flock<File>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CliError {
    let what = what.into();
    move |error| CliError::Io { what, error }
}

fn lock(dir: &Path, name: &str, how: FlockArg) -> Result<Flock<File>, CliError> {
    let path = dir.join(name);
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(io(format!("cannot open {}", path.display())))?;
    Flock::lock(f, how).map_err(|(_, e)| CliError::Io {
        what: format!("cannot lock {}", path.display()),
        error: e.into(),
    })
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
    /// `hook`: the shim the manager hands out; `grace`: how long a manager
    /// started here stays after its last run (a duration, as `--idle-exit`
    /// takes it).
    pub fn join(dir: &Path, hook: &Path, grace: &str) -> Result<Private, CliError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(format!("cannot create {}", dir.display())))?;
        let socket = dir.join("manager.sock");
        // Waits while a manager that decided to exit lets go.
        let users = lock(dir, "users.lock", FlockArg::LockShared)?;
        let mut me = Private {
            dir: dir.to_owned(),
            socket: socket.clone(),
            started: false,
            _users: users,
        };
        if answers(&socket) {
            return Ok(me);
        }
        // One run at a time starts one; the others find it answering.
        let _start = lock(dir, "start.lock", FlockArg::LockExclusive)?;
        if answers(&socket) {
            return Ok(me);
        }
        start(dir, &socket, hook, grace)?;
        me.started = true;
        Ok(me)
    }
}

/// Starts the manager for `dir` and waits until it answers on `socket`.
fn start(dir: &Path, socket: &Path, hook: &Path, grace: &str) -> Result<(), CliError> {
    use std::os::fd::{AsRawFd, OwnedFd};
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
    // The manager keeps the write end for life: end of file on ours says
    // it has gone (it failed to start), without being its parent.
    let (alive, keep): (OwnedFd, OwnedFd) = nix::unistd::pipe2(
        nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK,
    )
    .map_err(|e| CliError::Io {
        what: "cannot make a pipe".into(),
        error: e.into(),
    })?;
    let keep_fd = keep.as_raw_fd();
    let mut cmd = Command::new(&program);
    cmd.arg("manager")
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--socket")
        .arg(socket)
        .arg("--hook-library")
        .arg(hook)
        .args(["--metrics-addr", "off", "--backstop-kill", "false"])
        .arg("--idle-exit")
        .arg(grace)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: between fork and exec only async-signal-safe calls (fcntl,
    // fork, setsid, _exit), no allocation and no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(keep_fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                // The grandchild: a session of its own, then exec.
                0 => {
                    libc::setsid();
                    Ok(())
                }
                // The child leaves at once; we reap it below.
                _ => libc::_exit(0),
            }
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(io(format!("cannot start {} manager", program.display())))?;
    drop(keep);
    let _ = child.wait();
    let t0 = Instant::now();
    let mut byte = [0u8; 1];
    while !answers(socket) {
        // Nothing to read but the end of the pipe: the manager has gone.
        if let Ok(0) = nix::unistd::read(&alive, &mut byte) {
            return Err(CliError::Usage(format!(
                "the private manager did not start; see {}",
                log_path.display()
            )));
        }
        if t0.elapsed() > START_TIMEOUT {
            return Err(CliError::Usage(format!(
                "the private manager did not answer on {} within {START_TIMEOUT:?}; see {}",
                socket.display(),
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
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
    fn a_shared_lock_keeps_the_exclusive_one_out() {
        let dir = tempfile::tempdir().unwrap();
        let a = lock(dir.path(), "users.lock", FlockArg::LockShared).unwrap();
        let b = lock(dir.path(), "users.lock", FlockArg::LockShared).unwrap();
        drop(a);
        assert!(
            lock(dir.path(), "users.lock", FlockArg::LockExclusiveNonblock).is_err(),
            "a run still holds it"
        );
        drop(b);
        assert!(
            lock(dir.path(), "users.lock", FlockArg::LockExclusiveNonblock).is_ok(),
            "the last run is alone"
        );
    }
}
