//! Idle exit, for the private manager `tessera run` starts when no node
//! manager runs (`--idle-exit`): the manager exits once it has served no
//! allocation for the grace period, so that a loop of short commands pays
//! one start, and an idle session leaves nothing running.
//!
//! Runs and the manager agree through `users.lock` beside the socket: a
//! run holds it shared from before it looks for the manager until its
//! command starts (its allocation exists by then, and the reaper deletes it
//! when the command's process is gone). The manager decides to exit only
//! while holding the lock exclusively and seeing no allocation, and keeps
//! holding it until it has let go of its socket and state directory: a run
//! that arrives meanwhile waits, then finds no manager and starts the next
//! one. No run can find a manager that is about to go.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::core::Core;

/// The lock file's name, beside the socket.
pub const USERS_LOCK: &str = "users.lock";

/// `users.lock` beside `socket`.
pub fn users_lock_path(socket: &Path) -> PathBuf {
    socket
        .parent()
        .map(|d| d.join(USERS_LOCK))
        .unwrap_or_else(|| PathBuf::from(USERS_LOCK))
}

/// Opens (creating, owner-only) the users lock file at `path`.
pub fn open_users_lock(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
}

/// How often idleness is looked at: an eighth of the grace period, within
/// 10 ms..500 ms (a short grace in tests is honoured closely, a long one
/// costs a wake-up twice a second).
fn tick(grace: Duration) -> Duration {
    (grace / 8).clamp(Duration::from_millis(10), Duration::from_millis(500))
}

/// Completes when the manager has had no allocation for `grace` and no run
/// holds the users lock, with that lock held exclusively: the caller keeps
/// it until the manager has stopped. While the lock file cannot be opened
/// the manager stays, as a node's manager would, unless its socket (inode
/// `socket_ino`) is gone too: then no run can ever reach it (its directory
/// was removed, as a logout removes `$XDG_RUNTIME_DIR`), and it completes
/// without the lock (`None`) rather than linger for good.
pub(crate) async fn idle_for(
    core: Arc<Core>,
    grace: Duration,
    socket_ino: u64,
) -> Option<Flock<File>> {
    let path = users_lock_path(&core.config.socket);
    // Since when the manager has been idle: the first look that found no
    // allocation, so the grace counts from after the last one went.
    let mut idle_since: Option<Instant> = None;
    let mut warned = false;
    loop {
        tokio::time::sleep(tick(grace)).await;
        if !core.live_list().is_empty() {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < grace {
            continue;
        }
        let file = match open_users_lock(&path) {
            Ok(f) => f,
            Err(e) => {
                if !crate::listeners::socket_is_ours(&core.config.socket, socket_ino) {
                    tracing::info!(
                        socket = %core.config.socket.display(),
                        "idle, and the socket and users lock are gone: nothing can reach this manager; exiting"
                    );
                    return None;
                }
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot open the users lock; not exiting while idle");
                }
                continue;
            }
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            // A run is joining: it will have an allocation next.
            Err(_) => idle_since = None,
            // Under the lock no run is between joining and its command
            // starting, so what we see now is final.
            Ok(held) if core.live_list().is_empty() => {
                tracing::info!(grace = ?grace, "no allocation for the grace period; exiting");
                return Some(held);
            }
            Ok(_) => idle_since = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_beside_the_socket() {
        assert_eq!(
            users_lock_path(Path::new("/run/user/1/tessera/manager.sock")),
            Path::new("/run/user/1/tessera/users.lock")
        );
    }

    #[test]
    fn ticks_follow_the_grace_within_bounds() {
        assert_eq!(tick(Duration::from_secs(300)), Duration::from_millis(500));
        assert_eq!(tick(Duration::from_millis(400)), Duration::from_millis(50));
        assert_eq!(tick(Duration::ZERO), Duration::from_millis(10));
    }
}
