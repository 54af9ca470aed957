//! The one way any part of Tessera replaces a file that something else reads:
//! [`replace`] (and its shorthands [`replace_durably`], [`write_durably`]).
//! What it promises, for every caller:
//!
//! - a reader sees the old file or the whole new one, never part of either
//!   (the new content goes to a temporary file in the same directory, which
//!   is renamed over the old name; a rename within one file system is atomic);
//! - once it returns `Ok`, the new file survives a crash of the writer, and,
//!   at [`Durability::PowerLoss`] (the shorthands' and every caller's unless
//!   it says why not: see below), a power loss too: the temporary file is
//!   fsynced before the rename (so the name never points at data still in
//!   the page cache) and the directory after it (so the rename itself is on
//!   disk);
//! - a process that already has the old file open or mapped keeps the old
//!   inode: the old file is never opened for writing.
//!
//! # Why two durabilities, not one
//!
//! The promise is one: **a file survives whatever its contents must
//! survive.** What differs is what that is, and there are exactly two cases,
//! which is why [`Durability`] has two values and no third:
//!
//! - [`Durability::PowerLoss`], the default (the shorthands, every pod's
//!   allocation record, the DRA checkpoint, CDI specs, the slice file, the
//!   installed shim): the file is the only copy of something the node needs
//!   after a reboot.
//! - [`Durability::ProcessCrash`] skips the two fsyncs, and only for a file
//!   nothing can need after a power loss, the caller saying why where it
//!   passes it: an allocation's control and state files, which the manager
//!   rebuilds from the durable record at start-up (`shm::control`), and
//!   every file of a `tessera run`'s allocation, which is bound to one live
//!   process that no power loss leaves alive to use it (`manager::store`;
//!   should one come back torn, start-up moves it aside).
//!
//! One value for all would be `PowerLoss`, and it would make the
//! `ProcessCrash` writers pay for a guarantee nobody can use: a run's
//! create would make nine fsyncs (four files, each with its directory, and
//! the allocation directory's rename) where it makes none, and a pod's four
//! more than its record's five, the state file (590 KB, sparse) the
//! dearest. Measured on the 2-core development box
//! (release build, the store's sequence for one `tessera run`'s allocation:
//! state and control files, the record and its sealed copy, the
//! directory's rename; 40 and 60 paired rounds, load average 7.6 to 8.8),
//! `ProcessCrash` took 0.11 to 0.15 ms (median) and `PowerLoss` 23.8 to
//! 43.9 ms, p90 up to 60 ms: two orders of magnitude on a path whose target
//! is 10 ms for the whole run start-up (README, "`tessera run` start-up";
//! before the fsyncs were first skipped they were more than half of its
//! 11.7 ms on the quiet box, issue 26). So two values, each with its reason,
//! in this one helper.
//!
//! It lives in the contract crate because that is the lowest crate every
//! writer (shm, manager, node, the plugins, the client) already depends on.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Replaces `path` with `bytes`, atomically and durably (see the module).
/// `mode` is the new file's mode as `open(2)` takes it (the umask applies).
pub fn write_durably(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    replace_durably(path, mode, |f| f.write_all(bytes))
}

/// How long a replaced file must last (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Through a power loss: the file and its directory are fsynced.
    PowerLoss,
    /// Through a crash of the writer only (the page cache keeps it): for
    /// files nothing can need after a power loss.
    ProcessCrash,
}

/// Replaces `path` with what `fill` writes into a new file, atomically and
/// durably (see the module). `mode` is the new file's mode as `open(2)` takes
/// it (the umask applies; `fill` may set it exactly). The directory must
/// exist. On an error nothing is left behind but the old file, except when
/// the directory's fsync fails: then the new file is in place, its
/// durability unknown, and the error says so.
pub fn replace_durably(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    replace(path, mode, Durability::PowerLoss, fill)
}

/// [`replace_durably`] at the durability given: at
/// [`Durability::ProcessCrash`] nothing is fsynced.
pub fn replace(
    path: &Path,
    mode: u32,
    durability: Durability,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = temp_path(dir, path)?;
    // A leftover of a killed writer that had this pid and counter: never
    // write into a file someone else may hold, make a new one.
    let _ = std::fs::remove_file(&tmp);
    let published = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        fill(&mut f)?;
        if durability == Durability::PowerLoss {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = published {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if durability == Durability::ProcessCrash {
        return Ok(());
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "{} replaced, but its directory not synced: {e}",
                path.display()
            ),
        )
    })
}

/// A name beside `path`, hidden (readers that list `*.json` or `*.yaml`, as
/// container runtimes do for CDI specs, never see it) and unique to this
/// process and call: two threads, or two processes, replacing the same file
/// never write the same temporary one.
fn temp_path(dir: &Path, path: &Path) -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!(
        ".{}.{}.{n}.tmp",
        name.to_string_lossy(),
        std::process::id()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn scratch() -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "tessera-contract-file-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_one() {
        let d = scratch();
        let p = d.join("a.json");
        write_durably(&p, b"one", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        let first = std::fs::metadata(&p).unwrap().ino();
        write_durably(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        // A new inode: whoever holds the old file keeps the old content.
        assert_ne!(std::fs::metadata(&p).unwrap().ino(), first);
        assert_eq!(names(&d), ["a.json"]);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o600, 0, "mode {mode:o} wider than asked");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Without the fsyncs the replace is still whole and atomic: a new
    /// inode with the new content, and no temporary file left.
    #[test]
    fn a_process_crash_replace_is_still_atomic() {
        let d = scratch();
        let p = d.join("control");
        write_durably(&p, b"old", 0o644).unwrap();
        let first = std::fs::metadata(&p).unwrap().ino();
        replace(&p, 0o644, Durability::ProcessCrash, |f| f.write_all(b"new")).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_ne!(std::fs::metadata(&p).unwrap().ino(), first);
        assert_eq!(names(&d), ["control"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_fill_keeps_the_old_file_and_cleans_up() {
        let d = scratch();
        let p = d.join("state");
        write_durably(&p, b"old", 0o644).unwrap();
        let e = replace_durably(&p, 0o644, |f| {
            f.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(names(&d), ["state"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_missing_directory_or_a_path_without_a_name_is_an_error() {
        let d = scratch();
        let e = write_durably(&d.join("no/such/dir/f"), b"x", 0o644).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        let e = write_durably(Path::new("/"), b"x", 0o644).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn writers_racing_on_one_file_leave_one_whole_version() {
        let d = scratch();
        let p = d.join("race");
        let bodies: Vec<Vec<u8>> = (0..4u8).map(|i| vec![b'a' + i; 64 * 1024]).collect();
        std::thread::scope(|s| {
            for b in &bodies {
                let p = &p;
                s.spawn(move || {
                    for _ in 0..5 {
                        write_durably(p, b, 0o644).unwrap();
                    }
                });
            }
        });
        let got = std::fs::read(&p).unwrap();
        assert!(bodies.contains(&got), "a torn or mixed file");
        assert_eq!(names(&d), ["race"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
