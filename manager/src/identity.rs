//! Which allocation a host process belongs to, proven from what the kernel says about
//! the process, never from what a tenant can write. The state file's pid words are the
//! tenant's to scribble on (it is mapped read-write into its container), so they are
//! hints for status only; the backstop acts on a process only with a proof from here.
//!
//! Three proofs, each about something a tenant cannot choose:
//!
//! - **Mapped**: `/proc/<pid>/maps` lists the allocation's control or state file (by
//!   device and inode). The shim maps both before it initialises the driver, so every
//!   governed process has them mapped before it has a context; mapping a file needs an
//!   open descriptor to it, and a tenant reaches only its own allocation's files
//!   (containers get theirs through the device plugin's mounts; host files are not
//!   writable by other users, docs/security.md). The maps are read through a thread that
//!   still runs when the main thread has exited (`pthread_exit`): the main thread's own
//!   maps are empty then, though the process lives on.
//! - **Mounted**: the process's root (`/proc/<pid>/root`) has the allocation's control
//!   file at the device plugin's fixed path `/run/tessera/alloc/control`. A container's
//!   processes see it whether or not they loaded the shim (a static binary, a child
//!   without `LD_PRELOAD`), so their memory counts against their own allocation; a tenant
//!   cannot put another allocation's file there (it is a bind mount it cannot replace and
//!   a file it cannot open).
//! - **Descends**: the process descends, parent by parent (`/proc/<pid>/stat`, each
//!   parent started no later than its child, so a reused pid breaks the chain), from the
//!   process a `tessera run` allocation is bound to (its pid and start time, which the
//!   manager took from the kernel when the run asked for it). The kernel keeps the chain;
//!   a process can neither choose its parent nor join another's descendants (an orphan
//!   goes to a reaper above it). This is a `tessera run`'s mount: its processes are placed
//!   whether or not they loaded the shim, and still while they exit.
//!
//! A process that has begun to exit has no address space any more (the kernel takes it
//! before it closes the process's files, and the driver frees the process's memory only
//! then), so it is proven by neither of the first two: [`ProcView::exiting`] tells such a
//! process from a live one. [`diagnose`] says why a process could not be placed.
//!
//! `/proc` is read through the small [`ProcView`] trait so the logic is tested with a
//! fake; `tests/tests/attack_*.rs` and `run_burst.rs` run it against real processes.

use std::path::{Path, PathBuf};

/// A file's identity on the host: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    /// The identity of `path` (following symlinks); `None` when it cannot be stat'ed.
    pub fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}/{}",
            libc::major(self.dev),
            libc::minor(self.dev),
            self.ino
        )
    }
}

/// One file a process has mapped: its identity, and the path `/proc` shows (for
/// diagnosis only: a path proves nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub id: FileId,
    pub path: String,
}

/// The process a `tessera run` allocation is bound to: its pid in the manager's
/// namespace and its start time, from the kernel when the run asked for the allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runner {
    pub pid: u32,
    pub start_time: u64,
}

/// An allocation's host files (and, for a `tessera run`, its runner), as the proofs
/// compare them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub alloc_id: String,
    pub control: FileId,
    pub state: FileId,
    pub runner: Option<Runner>,
}

/// How a process was proven to be in an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    Mapped,
    Mounted,
    Descends,
}

/// What `/proc/<pid>/stat` says (the shm crate's one parser of it).
pub use tessera_shm::process::Stat;

/// What the kernel says about a process; `None` when it cannot be read (the process is
/// gone, or is not visible from here).
pub trait ProcView: Send + Sync {
    /// Every file the process has mapped, read through a thread that still runs if its
    /// main thread has exited; empty when it has no address space (it is exiting, or a
    /// zombie).
    fn maps(&self, pid: u32) -> Option<Vec<Mapping>>;
    /// Device and inode of `path` as the process sees it (in its mount namespace and
    /// root).
    fn in_root(&self, pid: u32, path: &Path) -> Option<FileId>;
    /// Its `/proc/<pid>/stat`.
    fn stat(&self, pid: u32) -> Option<Stat>;
    /// Whether every thread of it has begun to exit (or is a zombie): it runs no code of
    /// its own any more, and what it held is the driver's to free.
    fn exiting(&self, pid: u32) -> Option<bool>;

    /// Device and inode of every file the process has mapped, each once.
    fn mapped(&self, pid: u32) -> Option<Vec<FileId>> {
        let mut out: Vec<FileId> = Vec::new();
        for m in self.maps(pid)? {
            if !out.contains(&m.id) {
                out.push(m.id);
            }
        }
        Some(out)
    }
}

/// `/proc`, or a directory laid out like it.
#[derive(Debug, Clone)]
pub struct HostProc {
    root: PathBuf,
}

impl HostProc {
    pub fn host() -> HostProc {
        HostProc::at(Path::new("/proc"))
    }
    pub fn at(root: &Path) -> HostProc {
        HostProc {
            root: root.to_owned(),
        }
    }
}

impl HostProc {
    /// Each thread's `stat`, by thread id; `None` when the process is gone.
    fn tasks(&self, pid: u32) -> Option<Vec<(u32, Stat)>> {
        let dir = std::fs::read_dir(self.root.join(pid.to_string()).join("task")).ok()?;
        Some(
            dir.flatten()
                .filter_map(|t| {
                    let tid = t.file_name().to_str()?.parse().ok()?;
                    let text = std::fs::read_to_string(t.path().join("stat")).ok()?;
                    Some((tid, tessera_shm::process::parse_stat_fields(&text)?))
                })
                .collect(),
        )
    }
}

impl ProcView for HostProc {
    fn maps(&self, pid: u32) -> Option<Vec<Mapping>> {
        let dir = self.root.join(pid.to_string());
        let text = std::fs::read_to_string(dir.join("maps")).ok()?;
        let maps = parse_maps_paths(&text);
        if !text.is_empty() {
            return Some(maps);
        }
        // The main thread has no address space: it has exited. The process may live on
        // in another thread, whose maps are the process's.
        for (tid, st) in self.tasks(pid).unwrap_or_default() {
            if tid == pid || st.exiting() {
                continue;
            }
            if let Ok(text) =
                std::fs::read_to_string(dir.join("task").join(tid.to_string()).join("maps"))
                && !text.is_empty()
            {
                return Some(parse_maps_paths(&text));
            }
        }
        Some(maps)
    }
    fn in_root(&self, pid: u32, path: &Path) -> Option<FileId> {
        let root = self.root.join(pid.to_string()).join("root");
        walk_no_symlinks(&root, path)
    }
    fn stat(&self, pid: u32) -> Option<Stat> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok()?;
        tessera_shm::process::parse_stat_fields(&text)
    }
    fn exiting(&self, pid: u32) -> Option<bool> {
        match self.tasks(pid) {
            Some(tasks) if !tasks.is_empty() => Some(tasks.iter().all(|(_, st)| st.exiting())),
            // No thread to read (a zombie's task list is its main thread; a
            // process between its last thread's exit and its reaping may
            // show none): its own stat says.
            _ => self.stat(pid).map(|st| st.exiting()),
        }
    }
}

/// The identity of `path` under `root`, walked one component at a time with
/// `O_NOFOLLOW`: a symlink anywhere on the way is refused. Through
/// `/proc/<pid>/root` an absolute symlink would be resolved from *our* root,
/// so a tenant could otherwise plant `/run/tessera/alloc/control` as a link to
/// another allocation's host file and be judged in that allocation.
fn walk_no_symlinks(root: &Path, path: &Path) -> Option<FileId> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(root.as_os_str().as_bytes()).ok()?;
    let flags = libc::O_PATH | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_DIRECTORY) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor open just returned, owned here alone.
    let mut dir = unsafe { OwnedFd::from_raw_fd(fd) };
    let parts: Vec<_> = path
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let (last, dirs) = parts.split_last()?;
    for (i, part) in dirs.iter().chain(std::iter::once(last)).enumerate() {
        let name = CString::new(part.as_bytes()).ok()?;
        let extra = if i < dirs.len() { libc::O_DIRECTORY } else { 0 };
        // SAFETY: a directory descriptor we own and a NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_NOFOLLOW | extra,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: as above.
        dir = unsafe { OwnedFd::from_raw_fd(fd) };
    }
    // SAFETY: a plain C struct of integers, for which all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of a descriptor we own into a struct we own.
    if unsafe { libc::fstat(dir.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    // O_PATH | O_NOFOLLOW opens a final symlink itself: only a regular file counts.
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    Some(FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// The distinct files of a `/proc/<pid>/maps` text: `start-end perms offset MAJ:MIN
/// inode path`, device numbers in hex. Anonymous mappings (inode 0) are skipped.
pub fn parse_maps(text: &str) -> Vec<FileId> {
    let mut out: Vec<FileId> = Vec::new();
    for m in parse_maps_paths(text) {
        if !out.contains(&m.id) {
            out.push(m.id);
        }
    }
    out
}

/// The distinct files of a `/proc/<pid>/maps` text with the paths it shows.
pub fn parse_maps_paths(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(dev), Some(ino)) = (f.nth(3), f.next()) else {
            continue;
        };
        let path = f.collect::<Vec<_>>().join(" ");
        let Some((maj, min)) = dev.split_once(':') else {
            continue;
        };
        let (Ok(maj), Ok(min), Ok(ino)) = (
            u32::from_str_radix(maj, 16),
            u32::from_str_radix(min, 16),
            ino.parse::<u64>(),
        ) else {
            continue;
        };
        if ino == 0 {
            continue;
        }
        let id = FileId {
            dev: libc::makedev(maj, min),
            ino,
        };
        if !out.iter().any(|m| m.id == id) {
            out.push(Mapping { id, path });
        }
    }
    out
}

/// The fixed path of the control file inside a container.
pub use tessera_contract::paths::CONTAINER_CONTROL;

/// The allocation among `claims` that `pid` is proven to be in, and how; `None` when it
/// is in none of them, or cannot be read. A process that maps files of several (only a
/// host user who owns several `tessera run` allocations can) counts in the first.
pub fn prove(view: &dyn ProcView, pid: u32, claims: &[Claim]) -> Option<(usize, Proof)> {
    match view.mapped(pid) {
        Some(files) => prove_with(view, pid, &files, claims),
        None => prove_with(view, pid, &[], claims),
    }
}

/// [`prove`] with the process's mapped files already read (`view.mapped(pid)`), so
/// that a pass reads each process's maps once. The proofs in order: its files mapped,
/// its control file mounted, its descent from a run.
pub fn prove_with(
    view: &dyn ProcView,
    pid: u32,
    files: &[FileId],
    claims: &[Claim],
) -> Option<(usize, Proof)> {
    if let Some(i) = claims
        .iter()
        .position(|c| files.contains(&c.control) || files.contains(&c.state))
    {
        return Some((i, Proof::Mapped));
    }
    if let Some(mounted) = view.in_root(pid, Path::new(CONTAINER_CONTROL))
        && let Some(i) = claims.iter().position(|c| c.control == mounted)
    {
        return Some((i, Proof::Mounted));
    }
    descends(view, pid, claims).map(|i| (i, Proof::Descends))
}

/// How many parents [`descends`] follows before giving up (a chain deeper than this
/// proves nothing).
const MAX_DEPTH: usize = 64;

/// The first claim, nearest ancestor first, whose runner `pid` is or descends from.
pub fn descends(view: &dyn ProcView, pid: u32, claims: &[Claim]) -> Option<usize> {
    if claims.iter().all(|c| c.runner.is_none()) {
        return None;
    }
    let mut cur = pid;
    let mut st = view.stat(cur)?;
    for _ in 0..MAX_DEPTH {
        if let Some(i) = claims.iter().position(|c| {
            c.runner
                .is_some_and(|r| r.pid == cur && r.start_time == st.start_time)
        }) {
            return Some(i);
        }
        if cur <= 1 || st.ppid == 0 {
            return None;
        }
        let parent = view.stat(st.ppid)?;
        // A parent starts no later than its child: one that started later is
        // another process that reused the pid.
        if parent.start_time > st.start_time {
            return None;
        }
        cur = st.ppid;
        st = parent;
    }
    None
}

/// Whether `pid` can be read at all (a process the backstop may judge).
pub fn visible(view: &dyn ProcView, pid: u32) -> bool {
    view.mapped(pid).is_some()
}

/// Why `pid` is in none of `claims`, in one line for the log: the Tessera-looking files
/// it maps (by path, device and inode), what its root has at the fixed control path, its
/// ancestry, and the allocations it was compared with. Diagnosis only: nothing here is
/// a proof.
pub fn diagnose(view: &dyn ProcView, pid: u32, claims: &[Claim]) -> String {
    let mut parts = Vec::new();
    match view.maps(pid) {
        None => parts.push("maps unreadable".to_owned()),
        Some(maps) if maps.is_empty() => parts.push(format!(
            "no address space ({})",
            match view.exiting(pid) {
                Some(true) => "exiting",
                Some(false) => "yet not exiting",
                None => "gone",
            }
        )),
        Some(maps) => {
            let tessera: Vec<String> = maps
                .iter()
                .filter(|m| {
                    let p = m.path.to_ascii_lowercase();
                    p.contains("tessera") || p.ends_with("/control") || p.ends_with("/state")
                })
                .take(6)
                .map(|m| format!("{} ({})", m.path, m.id))
                .collect();
            parts.push(if tessera.is_empty() {
                format!("maps {} files, none Tessera's", maps.len())
            } else {
                format!(
                    "maps {} files, Tessera-looking: {}",
                    maps.len(),
                    tessera.join(", ")
                )
            });
        }
    }
    parts.push(match view.in_root(pid, Path::new(CONTAINER_CONTROL)) {
        Some(id) => format!("{CONTAINER_CONTROL} in its root is {id}"),
        None => format!("no {CONTAINER_CONTROL} in its root"),
    });
    let mut chain = Vec::new();
    let mut cur = pid;
    while let Some(st) = view.stat(cur) {
        chain.push(format!("{cur} ({}, start {})", st.comm, st.start_time));
        if cur <= 1 || st.ppid == 0 || chain.len() >= 8 {
            break;
        }
        cur = st.ppid;
    }
    parts.push(format!("ancestry {}", chain.join(" <- ")));
    let compared: Vec<String> = claims
        .iter()
        .take(8)
        .map(|c| {
            let run = c
                .runner
                .map(|r| format!(" run {} (start {})", r.pid, r.start_time))
                .unwrap_or_default();
            format!(
                "{} control {} state {}{run}",
                c.alloc_id, c.control, c.state
            )
        })
        .collect();
    parts.push(if claims.is_empty() {
        "no allocation to compare with".to_owned()
    } else {
        format!(
            "compared with {} allocation(s): {}{}",
            claims.len(),
            compared.join("; "),
            if claims.len() > compared.len() {
                "; ..."
            } else {
                ""
            }
        )
    });
    parts.join("; ")
}

#[cfg(test)]
pub mod fake {
    //! A `/proc` of the test's making.
    use super::*;
    use std::collections::HashMap;

    #[derive(Debug, Default, Clone)]
    pub struct FakeProc {
        pub maps: HashMap<u32, Vec<FileId>>,
        pub roots: HashMap<(u32, PathBuf), FileId>,
        /// Each process's stat (ppid, start time, state, flags); a process with maps
        /// and no stat here reads as a live child of 1 started at 0.
        pub stats: HashMap<u32, Stat>,
    }

    /// A stat for a fake process.
    pub fn stat(comm: &str, ppid: u32, start_time: u64, state: char) -> Stat {
        Stat {
            comm: comm.into(),
            state,
            ppid,
            flags: 0,
            start_time,
        }
    }

    impl ProcView for FakeProc {
        fn maps(&self, pid: u32) -> Option<Vec<Mapping>> {
            let files = self.maps.get(&pid)?;
            Some(
                files
                    .iter()
                    .map(|&id| Mapping {
                        id,
                        path: format!("/fake/{}", id.ino),
                    })
                    .collect(),
            )
        }
        fn in_root(&self, pid: u32, path: &Path) -> Option<FileId> {
            self.roots.get(&(pid, path.to_owned())).copied()
        }
        fn stat(&self, pid: u32) -> Option<Stat> {
            match self.stats.get(&pid) {
                Some(s) => Some(s.clone()),
                None => self
                    .maps
                    .contains_key(&pid)
                    .then(|| stat("fake", 1, 0, 'S')),
            }
        }
        fn exiting(&self, pid: u32) -> Option<bool> {
            self.stat(pid).map(|s| s.exiting())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeProc;
    use super::*;

    fn id(ino: u64) -> FileId {
        FileId { dev: 64769, ino }
    }

    fn claims() -> Vec<Claim> {
        vec![
            Claim {
                alloc_id: "a".into(),
                control: id(10),
                state: id(11),
                runner: None,
            },
            Claim {
                alloc_id: "b".into(),
                control: id(20),
                state: id(21),
                runner: Some(Runner {
                    pid: 100,
                    start_time: 50,
                }),
            },
        ]
    }

    #[test]
    fn maps_are_parsed_to_distinct_files() {
        let text = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1835101                    /usr/bin/cat
55d0c0a02000-55d0c0a06000 r-xp 00002000 fd:01 1835101                    /usr/bin/cat
7f1c2d000000-7f1c2d021000 rw-p 00000000 00:00 0 
7f1c2e000000-7f1c2e100000 rw-s 00000000 103:02 42  /var/lib/tessera/allocations/a/state (deleted)
7ffd1a1f0000-7ffd1a211000 rw-p 00000000 00:00 0                          [stack]
garbage line
";
        assert_eq!(
            parse_maps(text),
            vec![
                FileId {
                    dev: libc::makedev(0xfd, 1),
                    ino: 1835101
                },
                FileId {
                    dev: libc::makedev(0x103, 2),
                    ino: 42
                },
            ]
        );
    }

    #[test]
    fn a_process_mapping_an_allocations_files_is_in_it() {
        let mut v = FakeProc::default();
        v.maps.insert(1, vec![id(5), id(21)]);
        v.maps.insert(2, vec![id(10)]);
        assert_eq!(prove(&v, 1, &claims()), Some((1, Proof::Mapped)));
        assert_eq!(prove(&v, 2, &claims()), Some((0, Proof::Mapped)));
    }

    #[test]
    fn a_container_process_without_the_shim_is_in_its_mounted_allocation() {
        let mut v = FakeProc::default();
        v.maps.insert(3, vec![id(5)]);
        v.roots.insert((3, CONTAINER_CONTROL.into()), id(20));
        assert_eq!(prove(&v, 3, &claims()), Some((1, Proof::Mounted)));
    }

    #[test]
    fn nothing_a_tenant_writes_proves_membership() {
        let mut v = FakeProc::default();
        // Maps unrelated files; its root has a control file of no allocation.
        v.maps.insert(4, vec![id(5), id(6)]);
        v.roots.insert((4, CONTAINER_CONTROL.into()), id(99));
        assert_eq!(prove(&v, 4, &claims()), None);
        // Gone or invisible: nothing is proven.
        assert_eq!(prove(&v, 5, &claims()), None);
        assert!(!visible(&v, 5));
        assert!(visible(&v, 4));
    }

    #[test]
    fn a_runs_descendants_are_in_it_and_nothing_else_is() {
        use super::fake::stat;
        let mut v = FakeProc::default();
        // The runner of b (pid 100, started at 50), its shell's child 300, and 300's
        // child 301; 400 is someone else's.
        v.stats.insert(100, stat("sh", 1, 50, 'S'));
        v.stats.insert(300, stat("python3", 100, 60, 'S'));
        v.stats.insert(301, stat("worker", 300, 61, 'Z'));
        v.stats.insert(400, stat("other", 1, 70, 'S'));
        v.stats.insert(1, stat("init", 0, 1, 'S'));
        for pid in [100, 300, 301, 400] {
            v.maps.insert(pid, vec![id(5)]);
        }
        assert_eq!(prove(&v, 100, &claims()), Some((1, Proof::Descends)));
        assert_eq!(prove(&v, 300, &claims()), Some((1, Proof::Descends)));
        // A zombie still has its parent: placed while its memory is torn down.
        assert_eq!(prove(&v, 301, &claims()), Some((1, Proof::Descends)));
        assert_eq!(prove(&v, 400, &claims()), None);
        // Its files win over its ancestry: a run inside a run is the inner one's.
        v.maps.insert(300, vec![id(10)]);
        assert_eq!(prove(&v, 301, &claims()), Some((1, Proof::Descends)));
        assert_eq!(prove(&v, 300, &claims()), Some((0, Proof::Mapped)));
    }

    #[test]
    fn a_reused_pid_breaks_the_chain() {
        use super::fake::stat;
        let mut v = FakeProc::default();
        // 300's parent was a pid 100 that exited; the pid 100 there now started after
        // 300 did, so it is another process, not 300's parent.
        v.stats.insert(100, stat("sh", 1, 50, 'S'));
        v.stats.insert(300, stat("orphan", 100, 40, 'S'));
        v.maps.insert(300, vec![id(5)]);
        assert_eq!(prove(&v, 300, &claims()), None);
        // A runner with another start time is another process.
        v.stats.insert(300, stat("child", 100, 60, 'S'));
        let mut other = claims();
        other[1].runner = Some(Runner {
            pid: 100,
            start_time: 49,
        });
        assert_eq!(prove(&v, 300, &other), None);
        assert_eq!(prove(&v, 300, &claims()), Some((1, Proof::Descends)));
    }

    #[test]
    fn the_diagnosis_names_what_was_compared() {
        use super::fake::stat;
        let mut v = FakeProc::default();
        v.maps.insert(7, vec![id(5), id(12)]);
        v.stats.insert(7, stat("python3", 6, 90, 'S'));
        v.stats.insert(6, stat("sh", 1, 80, 'S'));
        v.stats.insert(1, stat("init", 0, 1, 'S'));
        v.roots.insert((7, CONTAINER_CONTROL.into()), id(99));
        let d = diagnose(&v, 7, &claims());
        for want in [
            "maps 2 files",
            "in its root is 253:1/99",
            "ancestry 7 (python3, start 90) <- 6 (sh, start 80) <- 1 (init, start 1)",
            "compared with 2 allocation(s): a control 253:1/10 state 253:1/11",
            "b control 253:1/20 state 253:1/21 run 100 (start 50)",
        ] {
            assert!(d.contains(want), "{want:?} not in {d}");
        }
        v.maps.insert(8, vec![]);
        v.stats.insert(8, stat("gone", 1, 95, 'Z'));
        assert!(diagnose(&v, 8, &[]).contains("no address space (exiting)"));
        assert!(diagnose(&v, 8, &[]).contains("no allocation to compare with"));
    }

    #[test]
    fn maps_are_read_through_a_thread_that_lives_on() {
        // A /proc of our own: process 40's main thread has exited (a zombie thread with
        // no address space); thread 41 runs on with the allocation's state mapped.
        let proc_dir = tempfile::tempdir().unwrap();
        let p = proc_dir.path().join("40");
        std::fs::create_dir_all(p.join("task/40")).unwrap();
        std::fs::create_dir_all(p.join("task/41")).unwrap();
        let st = |state: char, flags: u64| {
            format!("40 (app) {state} 1 40 40 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 2 0 777 0 0\n")
        };
        std::fs::write(p.join("maps"), "").unwrap();
        std::fs::write(p.join("stat"), st('Z', 0x4)).unwrap();
        std::fs::write(p.join("task/40/stat"), st('Z', 0x4)).unwrap();
        std::fs::write(p.join("task/41/stat"), st('S', 0)).unwrap();
        std::fs::write(
            p.join("task/41/maps"),
            "7f00-7f10 rw-s 00000000 fd:01 42 /var/lib/tessera/allocations/a/state\n",
        )
        .unwrap();
        let view = HostProc::at(proc_dir.path());
        let state = FileId {
            dev: libc::makedev(0xfd, 1),
            ino: 42,
        };
        assert_eq!(view.mapped(40), Some(vec![state]));
        assert_eq!(view.exiting(40), Some(false), "a thread lives");
        // Now that thread exits too: no address space anywhere, and exiting.
        std::fs::write(p.join("task/41/stat"), st('R', 0x4)).unwrap();
        assert_eq!(view.mapped(40), Some(vec![]));
        assert_eq!(view.exiting(40), Some(true));
        assert_eq!(view.stat(40).map(|s| s.start_time), Some(777));
    }

    #[test]
    fn a_real_zombie_has_no_address_space_and_is_exiting() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let view = HostProc::host();
        // Not reaped yet: a zombie once it has exited.
        let mut waited = 0;
        while view.stat(pid).map(|s| s.state) != Some('Z') {
            std::thread::sleep(std::time::Duration::from_millis(5));
            waited += 1;
            assert!(waited < 12_000, "the child never exited");
        }
        assert_eq!(view.mapped(pid), Some(vec![]));
        assert_eq!(view.exiting(pid), Some(true));
        assert_eq!(view.stat(pid).map(|s| s.ppid), Some(std::process::id()));
        child.wait().unwrap();
        assert_eq!(view.exiting(pid), None, "reaped: gone");
        // This process runs.
        assert_eq!(view.exiting(std::process::id()), Some(false));
    }

    #[test]
    fn a_planted_symlink_proves_nothing() {
        // A fake /proc: process 7's root holds run/tessera/alloc/control.
        let proc_dir = tempfile::tempdir().unwrap();
        let victim = proc_dir.path().join("victim-control");
        std::fs::write(&victim, b"x").unwrap();
        let alloc = proc_dir.path().join("7/root/run/tessera/alloc");
        std::fs::create_dir_all(&alloc).unwrap();
        let view = HostProc::at(proc_dir.path());
        let claim = Claim {
            alloc_id: "victim".into(),
            control: FileId::of(&victim).unwrap(),
            state: id(1),
            runner: None,
        };
        // A link to another allocation's host file, absolute or relative: refused.
        std::os::unix::fs::symlink(&victim, alloc.join("control")).unwrap();
        assert_eq!(view.in_root(7, Path::new(CONTAINER_CONTROL)), None);
        assert_eq!(prove(&view, 7, std::slice::from_ref(&claim)), None);
        // A link higher up the path: refused too.
        std::fs::remove_file(alloc.join("control")).unwrap();
        let real = proc_dir.path().join("elsewhere/alloc");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::hard_link(&victim, real.join("control")).unwrap();
        std::fs::remove_dir_all(proc_dir.path().join("7/root/run/tessera")).unwrap();
        std::os::unix::fs::symlink(
            proc_dir.path().join("elsewhere"),
            proc_dir.path().join("7/root/run/tessera"),
        )
        .unwrap();
        assert_eq!(view.in_root(7, Path::new(CONTAINER_CONTROL)), None);
        // The real thing (a file there, as a bind mount makes it): proven.
        std::fs::remove_file(proc_dir.path().join("7/root/run/tessera")).unwrap();
        std::fs::create_dir_all(&alloc).unwrap();
        std::fs::hard_link(&victim, alloc.join("control")).unwrap();
        assert_eq!(
            view.in_root(7, Path::new(CONTAINER_CONTROL)),
            Some(claim.control)
        );
    }

    #[test]
    fn the_real_proc_shows_our_own_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: maps a file we own, read-only and shared, and unmaps it below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let claim = Claim {
            alloc_id: "me".into(),
            control: id(1),
            state: FileId::of(&path).unwrap(),
            runner: None,
        };
        let me = std::process::id();
        let got = prove(&HostProc::host(), me, std::slice::from_ref(&claim));
        // SAFETY: the mapping made above, of that length.
        unsafe { libc::munmap(p, 4096) };
        assert_eq!(got, Some((0, Proof::Mapped)));
        // Unmapped: no longer proven.
        assert_eq!(prove(&HostProc::host(), me, &[claim]), None);
    }
}
