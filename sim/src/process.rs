//! Is a process still alive? A pid plus its start time names one process for good, even
//! after the pid is recycled.

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `Z` (zombie), ...
    pub state: u8,
    /// Field 22: start time in clock ticks since boot.
    pub start_time: u64,
}

/// Reads `/proc/<pid>/stat` with shm's parser (the one the shim and the
/// manager use); `None` when there is no such process.
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    let (state, start_time) = tessera_shm::process::stat_of(&pid.to_string())?;
    Some(ProcStat {
        // The state is one ASCII letter.
        state: u8::try_from(state).ok()?,
        start_time,
    })
}

/// The start time of the calling process.
pub fn own_start_time() -> u64 {
    proc_stat(std::process::id())
        .map(|s| s.start_time)
        .unwrap_or(0)
}

/// True while `pid` runs and, when `start_time` is non-zero, is the process that started
/// then. Zombies count as dead: their memory is gone on a real GPU too.
pub fn is_alive(pid: u32, start_time: u64) -> bool {
    if pid == 0 {
        return false;
    }
    match proc_stat(pid) {
        None => false,
        Some(s) if s.state == b'Z' || s.state == b'X' => false,
        Some(s) => start_time == 0 || s.start_time == start_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = std::process::id();
        let start = own_start_time();
        assert!(start > 0);
        assert!(is_alive(me, start));
        assert!(!is_alive(me, start + 1));
        assert!(!is_alive(0, 0));
    }

    #[test]
    fn an_exited_child_is_dead() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert!(!is_alive(pid, 0));
    }
}
