//! `tessera install-hook`: puts the shim where the device plugin mounts it from,
//! without ever touching a file that running processes have mapped.
//!
//! A process under the shim maps `libtessera.so` page by page from the file it
//! opened. Writing into that file (`cp` over it, `install`, an editor) changes the
//! code under the running process, which then crashes at the next page fault
//! into a changed page, or reads a half-written ELF. So the only write here is
//! into a new file beside the destination, made durable (`fsync`), then renamed
//! over it: the rename swaps which inode the *name* points to; every process
//! that mapped the old inode keeps it until it exits, and whoever opens the path
//! afterwards (a new container, whose bind mount is made at its start) gets the
//! new one. A destination already holding the same bytes is left alone.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Flags of `tessera install-hook`.
#[derive(clap::Args, Debug, Clone)]
pub struct InstallHookArgs {
    /// The shim to install (in the image: the container path of the shim).
    #[arg(long, default_value = tessera_contract::paths::CONTAINER_HOOK_LIBRARY)]
    pub from: PathBuf,
    /// Where to install it: the node's hook library, which the device plugin mounts
    /// into containers (`TESSERA_HOOK_LIBRARY` of the manager and the plugin).
    #[arg(long, default_value = tessera_contract::paths::HOST_HOOK_LIBRARY)]
    pub to: PathBuf,
}

/// What an install did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The destination now names a new file with the source's bytes.
    Replaced,
    /// The destination already held exactly these bytes: untouched.
    Unchanged,
}

/// Why an install failed; the destination is then as it was.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("{0}: not a shared library (no ELF header); refusing to install it")]
    NotElf(PathBuf),
    #[error("{0}: is the source itself; nothing to install")]
    SameFile(PathBuf),
    #[error("{0}: has no file name")]
    NoFileName(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |error| InstallError::Io {
        path: path.to_owned(),
        error,
    }
}

/// `tessera install-hook`: installs, then says what it did on one line.
pub fn install_hook(args: &InstallHookArgs) -> Result<(), InstallError> {
    match install(&args.from, &args.to)? {
        Installed::Replaced => println!(
            "installed {} at {} (processes already running keep the copy they mapped)",
            args.from.display(),
            args.to.display()
        ),
        Installed::Unchanged => println!(
            "{} already holds {}: unchanged",
            args.to.display(),
            args.from.display()
        ),
    }
    Ok(())
}

/// Installs `from` at `to` by copy to a temporary file in `to`'s directory, fsync and
/// rename; never opens `to` for writing. Creates `to`'s directory if needed.
pub fn install(from: &Path, to: &Path) -> Result<Installed, InstallError> {
    let bytes = std::fs::read(from).map_err(io(from))?;
    if !bytes.starts_with(b"\x7fELF") {
        return Err(InstallError::NotElf(from.to_owned()));
    }
    // Checked here, so that a path naming no file gets its own error.
    to.file_name()
        .ok_or_else(|| InstallError::NoFileName(to.to_owned()))?;
    let dir = match to.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    if let Ok(existing) = std::fs::metadata(to) {
        let src = std::fs::metadata(from).map_err(io(from))?;
        if existing.dev() == src.dev() && existing.ino() == src.ino() {
            return Err(InstallError::SameFile(to.to_owned()));
        }
        if existing.is_file() && same_bytes(to, &bytes) && existing.mode() & 0o777 == 0o755 {
            return Ok(Installed::Unchanged);
        }
    }
    // The one durable replace: a new hidden file beside `to` (unique to this
    // process and call, so two installers at once never share one), fsynced,
    // renamed over, the directory fsynced. `to` itself is never opened.
    tessera_contract::file::replace_durably(to, 0o755, |f| {
        f.write_all(&bytes)?;
        // The umask may have narrowed the mode given at creation.
        f.set_permissions(std::fs::Permissions::from_mode(0o755))
    })
    .map_err(io(to))?;
    Ok(Installed::Replaced)
}

/// Whether the file at `path` holds exactly `bytes` (read, never opened for writing).
fn same_bytes(path: &Path, bytes: &[u8]) -> bool {
    let mut have = Vec::with_capacity(bytes.len());
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut have))
        .is_ok()
        && have == bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(marker: &[u8]) -> Vec<u8> {
        let mut b = b"\x7fELF\x02\x01\x01".to_vec();
        b.extend_from_slice(marker);
        b
    }

    #[test]
    fn replaces_by_rename_and_keeps_the_old_inode_for_its_holders() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, to) = (
            d.path().join("a.so"),
            d.path().join("b.so"),
            d.path().join("lib/x.so"),
        );
        std::fs::write(&a, elf(b"one")).unwrap();
        std::fs::write(&b, elf(b"two")).unwrap();
        assert_eq!(install(&a, &to).unwrap(), Installed::Replaced);
        // A holder of the installed file (as a process that mapped it).
        let mut held = File::open(&to).unwrap();
        let old_ino = held.metadata().unwrap().ino();
        assert_eq!(install(&b, &to).unwrap(), Installed::Replaced);
        let mut seen = Vec::new();
        held.read_to_end(&mut seen).unwrap();
        assert_eq!(seen, elf(b"one"), "the file a process holds was rewritten");
        assert_ne!(std::fs::metadata(&to).unwrap().ino(), old_ino);
        assert_eq!(std::fs::read(&to).unwrap(), elf(b"two"));
        assert_eq!(std::fs::metadata(&to).unwrap().mode() & 0o777, 0o755);
        // No temporary file left beside it.
        let names: Vec<_> = std::fs::read_dir(d.path().join("lib"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["x.so"]);
    }

    #[test]
    fn the_same_bytes_leave_the_installed_file_alone() {
        let d = tempfile::tempdir().unwrap();
        let (a, to) = (d.path().join("a.so"), d.path().join("x.so"));
        std::fs::write(&a, elf(b"one")).unwrap();
        install(&a, &to).unwrap();
        let ino = std::fs::metadata(&to).unwrap().ino();
        assert_eq!(install(&a, &to).unwrap(), Installed::Unchanged);
        assert_eq!(std::fs::metadata(&to).unwrap().ino(), ino);
    }

    #[test]
    fn bad_sources_are_refused_and_the_installed_file_stays() {
        let d = tempfile::tempdir().unwrap();
        let (a, junk, to) = (
            d.path().join("a.so"),
            d.path().join("junk"),
            d.path().join("x.so"),
        );
        std::fs::write(&a, elf(b"one")).unwrap();
        install(&a, &to).unwrap();
        std::fs::write(&junk, b"#!/bin/sh\n").unwrap();
        let e = install(&junk, &to).unwrap_err();
        assert!(e.to_string().contains("not a shared library"), "{e}");
        let e = install(&d.path().join("missing.so"), &to).unwrap_err();
        assert!(e.to_string().contains("missing.so"), "{e}");
        assert!(matches!(install(&to, &to), Err(InstallError::SameFile(_))));
        assert_eq!(std::fs::read(&to).unwrap(), elf(b"one"));
    }
}
