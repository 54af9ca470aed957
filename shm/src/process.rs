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
    parse_stat_fields(text).map(|s| (s.state, s.start_time))
}

/// `PF_EXITING` in a task's flags (field 9 of its `stat`): the task is in
/// the kernel's exit path and runs no more code of its own.
pub const PF_EXITING: u64 = 0x4;

/// What the node reads of a `/proc/<pid>/stat` (or `task/<tid>/stat`) text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Field 2, without its parentheses (what the process calls itself:
    /// the tenant's to choose, for logs only).
    pub comm: String,
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// Field 4: the parent's pid (in the reader's namespace).
    pub ppid: u32,
    /// Field 9: the kernel's `PF_*` flags of the task.
    pub flags: u64,
    /// Field 22: start time in clock ticks since boot.
    pub start_time: u64,
}

impl Stat {
    /// The task has begun to exit (or is a zombie): it runs no more code of
    /// its own and can map, open or allocate nothing more.
    pub fn exiting(&self) -> bool {
        matches!(self.state, 'Z' | 'X') || self.flags & PF_EXITING != 0
    }
}

/// The fields of a `/proc/<pid>/stat` text the node reads.
pub fn parse_stat_fields(text: &str) -> Option<Stat> {
    // The command name (field 2) may hold spaces and parentheses: fields are
    // counted from the last ')'.
    let close = text.rfind(')')?;
    let comm = text[..close].split_once('(')?.1.to_owned();
    let mut fields = text[close + 1..].split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state come fields 4..
    let ppid = fields.next()?.parse().ok()?;
    let flags = fields.nth(9 - 5)?.parse().ok()?;
    let start_time = fields.nth(22 - 10)?.parse().ok()?;
    Some(Stat {
        comm,
        state,
        ppid,
        flags,
        start_time,
    })
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
        let s = parse_stat_fields(line).expect("parsed");
        assert_eq!(
            (s.comm.as_str(), s.state, s.ppid, s.flags, s.start_time),
            ("my (odd) name", 'S', 1, 4194560, 98765)
        );
        assert!(!s.exiting());
        let exiting = line.replace(" 4194560 ", " 4194564 ");
        assert!(parse_stat_fields(&exiting).expect("parsed").exiting());
        let zombie = line.replace(") S ", ") Z ");
        assert!(parse_stat_fields(&zombie).expect("parsed").exiting());
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
