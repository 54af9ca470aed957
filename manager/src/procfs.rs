//! Host pids of the allocations' processes, found from `/proc`: a slot
//! records its process's pid *inside* its pid namespace, the namespace's
//! inode and the start time; the manager finds the host process with the
//! same namespace inode (`/proc/<pid>/ns/pid`), the same innermost pid (the
//! last `NSpid:` entry of `/proc/<pid>/status`) and the same start time.
//! Never by diffing NVML's process lists.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use tessera_shm::ProcIdentity;

/// One process as `/proc` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcEntry {
    pub host_pid: u32,
    /// Inode of its pid namespace; 0 when unreadable.
    pub pidns: u64,
    /// Its pid in its own (innermost) namespace; 0 when unreadable.
    pub ns_pid: u32,
    pub start_time: u64,
    pub zombie: bool,
}

/// `/proc`, or a directory laid out like it (tests).
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

/// `pid:[4026531836]` → 4026531836.
pub fn parse_ns_link(link: &str) -> Option<u64> {
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// The innermost pid of a `/proc/<pid>/status` text (last `NSpid:` field).
pub fn parse_nspid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line["NSpid:".len()..]
        .split_ascii_whitespace()
        .last()?
        .parse()
        .ok()
}

/// State and start time (field 22) of a `/proc/<pid>/stat` text; the
/// parser slots' own liveness checks use too.
pub use tessera_shm::process::parse_stat;

impl ProcFs {
    /// The real `/proc`.
    pub fn host() -> Self {
        ProcFs::at(Path::new("/proc"))
    }

    pub fn at(root: &Path) -> Self {
        ProcFs {
            root: root.to_owned(),
        }
    }

    fn pidns(&self, who: &str) -> Option<u64> {
        let link = std::fs::read_link(self.root.join(who).join("ns/pid")).ok()?;
        parse_ns_link(link.to_str()?)
    }

    /// The pid namespace `/proc` itself belongs to (the manager's).
    pub fn own_pidns(&self) -> Option<u64> {
        self.pidns("self")
    }

    /// One process's entry; `None` when it does not exist.
    pub fn entry(&self, host_pid: u32) -> Option<ProcEntry> {
        let who = host_pid.to_string();
        let stat = std::fs::read_to_string(self.root.join(&who).join("stat")).ok()?;
        let (state, start_time) = parse_stat(&stat)?;
        let ns_pid = std::fs::read_to_string(self.root.join(&who).join("status"))
            .ok()
            .and_then(|s| parse_nspid(&s))
            .unwrap_or(0);
        Some(ProcEntry {
            host_pid,
            pidns: self.pidns(&who).unwrap_or(0),
            ns_pid,
            start_time,
            zombie: matches!(state, 'Z' | 'X'),
        })
    }

    /// Whether process `host_pid` still has a thread that is not a
    /// zombie. Its main thread shows as a zombie while the process lives on
    /// in another: after that thread called `pthread_exit`, and for a moment
    /// while another thread execs (the kernel waits for the old main thread
    /// to go before the exec'ing one takes its pid).
    pub fn has_live_thread(&self, host_pid: u32) -> bool {
        let Ok(tasks) = std::fs::read_dir(self.root.join(host_pid.to_string()).join("task")) else {
            return false;
        };
        tasks.flatten().any(|t| {
            std::fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
                .is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
        })
    }

    /// Every process's (namespace, innermost pid) → host pid.
    pub fn scan(&self) -> ProcScan {
        let mut scan = ProcScan::default();
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return scan;
        };
        for e in dir.flatten() {
            let Some(host_pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let who = host_pid.to_string();
            let Some(ns) = self.pidns(&who) else {
                continue;
            };
            scan.namespaces.insert(ns);
            let Some(ns_pid) = std::fs::read_to_string(self.root.join(&who).join("status"))
                .ok()
                .and_then(|s| parse_nspid(&s))
            else {
                continue;
            };
            scan.by_ns.insert((ns, ns_pid), host_pid);
        }
        scan
    }
}

/// A pass over `/proc`.
#[derive(Debug, Default)]
pub struct ProcScan {
    by_ns: HashMap<(u64, u32), u32>,
    /// Every pid namespace that has a process we can see.
    namespaces: HashSet<u64>,
}

/// What the manager knows about a slot's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Alive {
        host_pid: u32,
    },
    Dead,
    /// Its namespace is invisible from here, or the slot is half-written.
    Unknown,
}

/// Judges slots' processes against `/proc`.
#[derive(Debug, Clone)]
pub struct Resolver {
    fs: ProcFs,
    own_ns: u64,
}

fn matches(e: &ProcEntry, id: &ProcIdentity) -> bool {
    !e.zombie
        && e.start_time == id.start_time
        && (e.pidns == 0 || e.pidns == id.pidns)
        && (e.ns_pid == 0 || e.ns_pid == id.pid)
}

impl Resolver {
    pub fn new(fs: ProcFs) -> Self {
        let own_ns = fs.own_pidns().unwrap_or(0);
        Resolver { fs, own_ns }
    }

    pub fn host() -> Self {
        Resolver::new(ProcFs::host())
    }

    /// The manager's own pid namespace inode; 0 when unknown.
    pub fn own_pidns(&self) -> u64 {
        self.own_ns
    }

    /// Judges one slot: `recorded` is the host pid the manager stored in it
    /// earlier (0: none); `scan` is taken on first need and must be newer
    /// than `id` was read, so a process that just started is in it.
    pub fn judge(&self, id: &ProcIdentity, recorded: u32, scan: &mut Option<ProcScan>) -> Verdict {
        if id.start_time == 0 || id.pid == 0 || id.pidns == 0 {
            return Verdict::Unknown;
        }
        if recorded != 0
            && let Some(e) = self.fs.entry(recorded)
            && matches(&e, id)
        {
            return Verdict::Alive { host_pid: recorded };
        }
        if self.own_ns != 0 && id.pidns == self.own_ns {
            // Our own namespace: its pids are host pids.
            return match self.fs.entry(id.pid) {
                Some(e) if matches(&e, id) => Verdict::Alive { host_pid: id.pid },
                _ => Verdict::Dead,
            };
        }
        let scan = scan.get_or_insert_with(|| self.fs.scan());
        if let Some(&host_pid) = scan.by_ns.get(&(id.pidns, id.pid))
            && let Some(e) = self.fs.entry(host_pid)
            && matches(&e, id)
        {
            return Verdict::Alive { host_pid };
        }
        // Dead only where we could have seen it: a namespace with visible
        // processes, or one where we found this process before.
        if recorded != 0 || scan.namespaces.contains(&id.pidns) {
            Verdict::Dead
        } else {
            Verdict::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const STATUS: &str = "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
                          NSpid:\t4242\t17\nPPid:\t1\n";

    fn stat(state: char, start: u64) -> String {
        // pid (comm) state, then fields 4..=22 with starttime last.
        let mut s = format!("4242 (a (weird) name) {state}");
        for f in 4..22 {
            s.push_str(&format!(" {f}"));
        }
        s.push_str(&format!(" {start} 0 0\n"));
        s
    }

    #[test]
    fn parsers() {
        assert_eq!(parse_ns_link("pid:[4026531836]"), Some(4026531836));
        assert_eq!(parse_ns_link("net:[1]"), None);
        assert_eq!(parse_nspid(STATUS), Some(17));
        assert_eq!(parse_nspid("NSpid:\t99\n"), Some(99));
        assert_eq!(parse_nspid("Name: x\n"), None);
        assert_eq!(parse_stat(&stat('S', 123456)), Some(('S', 123456)));
        assert_eq!(parse_stat("garbage"), None);
    }

    /// A fake /proc: `self` in namespace 1, processes as given.
    struct FakeProc {
        dir: tempfile::TempDir,
    }

    impl FakeProc {
        fn new() -> Self {
            let f = FakeProc {
                dir: tempfile::tempdir().unwrap(),
            };
            f.add_raw("self", 1, 1, 'S', 1);
            f
        }
        fn add_raw(&self, name: &str, ns: u64, ns_pid: u32, state: char, start: u64) {
            let d = self.dir.path().join(name);
            std::fs::create_dir_all(d.join("ns")).unwrap();
            symlink(format!("pid:[{ns}]"), d.join("ns/pid")).unwrap();
            std::fs::write(d.join("stat"), stat(state, start)).unwrap();
            std::fs::write(
                d.join("status"),
                format!("Name:\tx\nNSpid:\t{name}\t{ns_pid}\n"),
            )
            .unwrap();
        }
        fn add(&self, host_pid: u32, ns: u64, ns_pid: u32, state: char, start: u64) {
            self.add_raw(&host_pid.to_string(), ns, ns_pid, state, start);
        }
        fn remove(&self, host_pid: u32) {
            std::fs::remove_dir_all(self.dir.path().join(host_pid.to_string())).unwrap();
        }
        fn resolver(&self) -> Resolver {
            Resolver::new(ProcFs::at(self.dir.path()))
        }
    }

    fn id(pid: u32, pidns: u64, start_time: u64) -> ProcIdentity {
        ProcIdentity {
            pid,
            pidns,
            start_time,
        }
    }

    #[test]
    fn a_container_process_is_found_by_namespace_and_nspid() {
        let p = FakeProc::new();
        p.add(500, 7, 1, 'S', 1000);
        p.add(501, 7, 2, 'S', 1001);
        p.add(502, 8, 1, 'S', 1002);
        let r = p.resolver();
        let mut scan = None;
        assert_eq!(
            r.judge(&id(2, 7, 1001), 0, &mut scan),
            Verdict::Alive { host_pid: 501 }
        );
        assert_eq!(
            r.judge(&id(1, 8, 1002), 0, &mut scan),
            Verdict::Alive { host_pid: 502 }
        );
    }

    #[test]
    fn a_reused_pid_or_a_zombie_is_dead() {
        let p = FakeProc::new();
        p.add(500, 7, 1, 'S', 1000);
        p.add(501, 7, 2, 'Z', 1001);
        let r = p.resolver();
        let mut scan = None;
        // Same namespace and pid, other start time: pid reused.
        assert_eq!(r.judge(&id(1, 7, 999), 0, &mut scan), Verdict::Dead);
        assert_eq!(r.judge(&id(2, 7, 1001), 0, &mut scan), Verdict::Dead);
        // The recorded host pid now belongs to someone else.
        assert_eq!(r.judge(&id(1, 7, 999), 500, &mut None), Verdict::Dead);
    }

    #[test]
    fn a_recorded_process_that_exits_is_dead_even_if_its_namespace_is_gone() {
        let p = FakeProc::new();
        p.add(500, 7, 1, 'S', 1000);
        let r = p.resolver();
        assert_eq!(
            r.judge(&id(1, 7, 1000), 500, &mut None),
            Verdict::Alive { host_pid: 500 }
        );
        p.remove(500);
        assert_eq!(r.judge(&id(1, 7, 1000), 500, &mut None), Verdict::Dead);
    }

    #[test]
    fn an_invisible_namespace_is_unknown_not_dead() {
        let p = FakeProc::new();
        p.add(500, 7, 1, 'S', 1000);
        let r = p.resolver();
        assert_eq!(r.judge(&id(1, 99, 1000), 0, &mut None), Verdict::Unknown);
        // A half-written slot is left alone.
        assert_eq!(r.judge(&id(1, 7, 0), 0, &mut None), Verdict::Unknown);
    }

    #[test]
    fn our_own_namespace_needs_no_scan() {
        let p = FakeProc::new();
        p.add(600, 1, 600, 'R', 5);
        let r = p.resolver();
        let mut scan = None;
        assert_eq!(
            r.judge(&id(600, 1, 5), 0, &mut scan),
            Verdict::Alive { host_pid: 600 }
        );
        assert_eq!(r.judge(&id(601, 1, 5), 0, &mut scan), Verdict::Dead);
        assert!(scan.is_none());
    }

    #[test]
    fn the_real_proc_knows_this_process_and_a_dead_child() {
        let me = ProcIdentity::current();
        let r = Resolver::host();
        assert_eq!(
            r.judge(&me, 0, &mut None),
            Verdict::Alive {
                host_pid: std::process::id()
            }
        );
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let entry = ProcFs::host()
            .entry(pid)
            .expect("a running child is in /proc");
        let child_id = id(pid, me.pidns, entry.start_time);
        assert_eq!(
            r.judge(&child_id, 0, &mut None),
            Verdict::Alive { host_pid: pid }
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(r.judge(&child_id, 0, &mut None), Verdict::Dead);
    }
}
