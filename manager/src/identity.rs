//! Which allocation a host process belongs to, proven from what the kernel says about
//! the process, never from what a tenant can write. The state file's pid words are the
//! tenant's to scribble on (it is mapped read-write into its container), so they are
//! hints for status only; the backstop acts on a process only with a proof from here.
//!
//! Two proofs, both about the allocation's own host files (identified by device and
//! inode, which a tenant cannot choose):
//!
//! - **Mapped**: `/proc/<pid>/maps` lists the allocation's control or state file. The
//!   shim maps both before it initialises the driver, so every governed process has them
//!   mapped before it has a context; mapping a file needs an open descriptor to it, and a
//!   tenant reaches only its own allocation's files (containers get theirs through the
//!   device plugin's mounts; host files are not writable by other users, docs/security.md).
//! - **Mounted**: the process's root (`/proc/<pid>/root`) has the allocation's control
//!   file at the device plugin's fixed path `/run/tessera/alloc/control`. A container's
//!   processes see it whether or not they loaded the shim (a static binary, a child
//!   without `LD_PRELOAD`), so their memory counts against their own allocation; a tenant
//!   cannot put another allocation's file there (it is a bind mount it cannot replace and
//!   a file it cannot open).
//!
//! `/proc` is read through the small [`ProcView`] trait so the logic is tested with a
//! fake; `tests/tests/attack_*.rs` run it against real processes.

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

/// An allocation's host files, as the proofs compare them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub alloc_id: String,
    pub control: FileId,
    pub state: FileId,
}

/// How a process was proven to be in an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    Mapped,
    Mounted,
}

/// What the kernel says about a process; `None` when it cannot be read (the process is
/// gone, or is not visible from here).
pub trait ProcView: Send + Sync {
    /// Device and inode of every file the process has mapped.
    fn mapped(&self, pid: u32) -> Option<Vec<FileId>>;
    /// Device and inode of `path` as the process sees it (in its mount namespace and
    /// root).
    fn in_root(&self, pid: u32, path: &Path) -> Option<FileId>;
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

impl ProcView for HostProc {
    fn mapped(&self, pid: u32) -> Option<Vec<FileId>> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("maps")).ok()?;
        Some(parse_maps(&text))
    }
    fn in_root(&self, pid: u32, path: &Path) -> Option<FileId> {
        let root = self.root.join(pid.to_string()).join("root");
        walk_no_symlinks(&root, path)
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
    for line in text.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(dev), Some(ino)) = (f.nth(3), f.next()) else {
            continue;
        };
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
        if !out.contains(&id) {
            out.push(id);
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
/// that a pass reads each process's maps once.
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
    let mounted = view.in_root(pid, Path::new(CONTAINER_CONTROL))?;
    claims
        .iter()
        .position(|c| c.control == mounted)
        .map(|i| (i, Proof::Mounted))
}

/// Whether `pid` can be read at all (a process the backstop may judge).
pub fn visible(view: &dyn ProcView, pid: u32) -> bool {
    view.mapped(pid).is_some()
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
    }

    impl ProcView for FakeProc {
        fn mapped(&self, pid: u32) -> Option<Vec<FileId>> {
            self.maps.get(&pid).cloned()
        }
        fn in_root(&self, pid: u32, path: &Path) -> Option<FileId> {
            self.roots.get(&(pid, path.to_owned())).copied()
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
            },
            Claim {
                alloc_id: "b".into(),
                control: id(20),
                state: id(21),
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
