//! Who a process is (pid, pid namespace, start time) and whether it still
//! lives, as far as the caller's own pid namespace can tell.

use std::os::unix::fs::MetadataExt;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// What a slot records about its process. `pid` is in the process's own pid
/// namespace; `start_time` tells a live process from a later one that
/// reused its pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcIdentity {
    pub pid: u32,
    /// Inode of `/proc/<pid>/ns/pid`; 0 when unknown.
    pub pidns: u64,
    /// `starttime` (field 22 of `/proc/<pid>/stat`); 0 when unknown.
    pub start_time: u64,
}

impl ProcIdentity {
    /// The calling process. Reads `/proc`, so call it once, at join.
    pub fn current() -> Self {
        let pid = std::process::id();
        ProcIdentity {
            pid,
            pidns: pidns_of("self").unwrap_or(0),
            start_time: start_time_of("self").unwrap_or(0),
        }
    }
}

/// Inode of the pid namespace of `/proc/<who>`.
pub fn pidns_of(who: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{who}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// Parsed `/proc/<who>/stat`: (state char, starttime).
pub fn stat_of(who: &str) -> Option<(char, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{who}/stat")).ok()?)
}

/// State and start time (field 22) of a `/proc/<pid>/stat` text: the one
/// parser of it (the manager's `/proc` scan uses it too).
pub fn parse_stat(text: &str) -> Option<(char, u64)> {
    // The command name (field 2) may hold spaces and parentheses: fields are
    // counted from the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state come fields 4..; starttime is field 22.
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
}

fn start_time_of(who: &str) -> Option<u64> {
    stat_of(who).map(|(_, s)| s)
}

/// Tells whether a slot's process lives.
pub trait Liveness {
    /// `Some(true)` alive, `Some(false)` dead, `None` when this caller
    /// cannot tell (another pid namespace, identity not yet recorded).
    fn check(&self, id: &ProcIdentity) -> Option<bool>;
}

/// Liveness as seen from the caller's own pid namespace.
#[derive(Debug, Clone, Copy)]
pub struct LocalLiveness {
    pidns: u64,
    /// Also read `/proc/<pid>/stat` to catch zombies and reused pids. The
    /// quick form (one `kill(pid, 0)`) is what a joining process can afford
    /// for every slot; the thorough one is for reapers.
    thorough: bool,
}

impl LocalLiveness {
    /// One `kill(pid, 0)` per check.
    pub fn quick() -> Self {
        LocalLiveness {
            pidns: pidns_of("self").unwrap_or(0),
            thorough: false,
        }
    }
    /// Also reads `/proc/<pid>/stat`.
    pub fn thorough() -> Self {
        LocalLiveness {
            pidns: pidns_of("self").unwrap_or(0),
            thorough: true,
        }
    }
}

impl Liveness for LocalLiveness {
    fn check(&self, id: &ProcIdentity) -> Option<bool> {
        // Until the joiner has written its identity we cannot know whose pid
        // this is; it holds nothing yet, so leaving it alone costs nothing.
        if id.start_time == 0 || id.pidns != self.pidns || id.pid == 0 {
            return None;
        }
        let pid = i32::try_from(id.pid).ok()?;
        match kill(Pid::from_raw(pid), None) {
            Err(Errno::ESRCH) => return Some(false),
            Ok(()) | Err(Errno::EPERM) => {}
            Err(_) => return None,
        }
        if !self.thorough {
            return Some(true);
        }
        match stat_of(&pid.to_string()) {
            None => Some(false),
            Some(('Z' | 'X', _)) => Some(false),
            Some((_, start)) => Some(start == id.start_time),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_names_with_spaces_and_parens() {
        let line = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10 18446744073709551615";
        assert_eq!(parse_stat(line), Some(('S', 98765)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn this_process_is_read_and_no_process_is_none() {
        // The calling thread runs while it reads; `self` would be the main
        // thread, which the test harness keeps waiting.
        let (state, start) = stat_of("thread-self").expect("own thread's stat");
        assert_eq!(state, 'R', "reading its own stat, the thread runs");
        assert!(start > 0);
        let (_, process_start) = stat_of("self").expect("own stat");
        assert!(process_start > 0 && process_start <= start);
        assert_eq!(stat_of("4294967295"), None);
    }
}
