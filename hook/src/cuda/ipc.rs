//! IPC and imported memory. Memory another process shares (a legacy IPC
//! handle, a VMM allocation exported as a file descriptor or fabric handle)
//! is counted once, by the process that allocated it: opening or importing
//! it charges nothing, and mapping an imported VMM handle charges nothing
//! (the VMM books count only handles this process created).
//!
//! An import is allowed only from a process of the same allocation: every
//! export by a governed process is registered in the allocation's exports
//! list, a file beside the state file (`<state>.exports`, private to the
//! container in a cluster, to the run's directory under `tessera run`), and
//! an import whose handle is not in that list is refused with
//! `CUDA_ERROR_NOT_PERMITTED`. A tenant can only add to its own list, and
//! only handles it holds; what this cannot see is in docs/hook.md.
//!
//! The driver keeps shared pages while any process has them open, so an
//! importer also writes `open <identity> <pid>` (and `close ...` when it
//! lets go) to the list; an exporter that frees memory a live importer
//! still has open keeps it charged until the importers close it (checked
//! again at synchronisations and before a refusal).
//!
//! The HIP shim's IPC (`hip/ipc.rs`) keeps the same list with these
//! functions.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;

use super::*;
use crate::ledger::SharedKey;

/// The allocation's exports list.
fn exports_path(g: &Governed) -> std::path::PathBuf {
    let mut p = g.files.state.path().as_os_str().to_owned();
    p.push(".exports");
    p.into()
}

/// Opens the exports list without following links or blocking, and only
/// if it is a regular file.
fn open_exports(g: &Governed, write: bool) -> Option<std::fs::File> {
    let path = exports_path(g);
    let f = std::fs::OpenOptions::new()
        .read(!write)
        .append(write)
        .create(write)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| {
            if write {
                crate::log!(Level::Warn, "{}: {e}", path.display());
            }
        })
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.file_type().is_file() || meta.len() > MAX_EXPORTS {
        crate::log!(
            Level::Warn,
            "{}: not a regular file, or over {MAX_EXPORTS} bytes",
            path.display()
        );
        return None;
    }
    Some(f)
}

const MAX_EXPORTS: u64 = 16 << 20;

/// Records an export (one line, appended in one write).
pub(crate) fn register(g: &Governed, key: &str) {
    if let Some(mut f) = open_exports(g, true) {
        let _ = f.write_all(format!("{key}\n").as_bytes());
    }
}

/// The exports list's lines.
fn read_exports(g: &Governed) -> String {
    let mut text = String::new();
    if let Some(mut f) = open_exports(g, false)
        && f.read_to_string(&mut text).is_err()
    {
        text.clear();
    }
    text
}

/// Whether a process of this allocation exported `key`.
pub(crate) fn exported_here(g: &Governed, key: &str) -> bool {
    read_exports(g).lines().any(|l| l == key)
}

/// Whether a live process other than this one has `key` open, by the
/// importers' `open`/`close` lines.
fn open_elsewhere(text: &str, key: &str) -> bool {
    let me = std::process::id();
    let mut holders: Vec<u32> = Vec::new();
    for l in text.lines() {
        let mut w = l.split(' ');
        let (Some(what), Some(k), Some(pid)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if k != key {
            continue;
        }
        match what {
            "open" => holders.push(pid),
            "close" => {
                if let Some(i) = holders.iter().position(|&p| p == pid) {
                    holders.swap_remove(i);
                }
            }
            _ => {}
        }
    }
    holders.into_iter().any(|pid| pid != me && alive(pid))
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Exported memory the driver freed for this process (`key`, `bytes` on
/// device index `dev`): its quota returns, unless an importer still has
/// it open (the driver keeps the pages for it): then it stays charged
/// until [`settle_shared`] finds the importers gone.
pub(crate) fn freed(g: &Governed, key: SharedKey, dev: usize, bytes: u64) {
    let mut shared = g.shared.lock();
    if let Some(id) = shared.imported.remove(&key) {
        drop(shared);
        register(g, &format!("close {id} {}", std::process::id()));
        g.release(Some(dev), bytes);
        return;
    }
    let Some(id) = shared.exported.remove(&key) else {
        drop(shared);
        g.release(Some(dev), bytes);
        return;
    };
    if open_elsewhere(&read_exports(g), &id) {
        crate::log!(
            Level::Info,
            "{bytes} bytes freed but still open in another process: kept charged"
        );
        shared.deferred.push((id, dev, bytes));
    } else {
        drop(shared);
        g.release(Some(dev), bytes);
    }
}

/// Returns the quota of exported memory kept for importers that have
/// closed it since. Whether any came back.
pub fn settle_shared(g: &Governed) -> bool {
    let mut shared = g.shared.lock();
    if shared.deferred.is_empty() {
        return false;
    }
    let text = read_exports(g);
    let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut shared.deferred)
        .into_iter()
        .partition(|(id, _, _)| !open_elsewhere(&text, id));
    shared.deferred = kept;
    drop(shared);
    for (_, dev, bytes) in &gone {
        g.release(Some(*dev), *bytes);
    }
    !gone.is_empty()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn ipc_key(h: &CUipcMemHandle) -> String {
    let bytes: Vec<u8> = h.reserved.iter().map(|&b| b as u8).collect();
    format!("ipc:{}", hex(&bytes))
}

/// The identity of an open file: what a descriptor passed between
/// processes keeps.
fn fd_key(fd: c_int) -> Option<String> {
    // SAFETY: fstat writes into a zeroed stat buffer we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the descriptor is only read.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then(|| format!("fd:{}:{}", st.st_dev, st.st_ino))
}

/// The key of a shareable handle as `cuMemExportToShareableHandle` writes
/// it / `cuMemImportFromShareableHandle` takes it (`os_handle` is the
/// descriptor itself for POSIX descriptors, a pointer to the 64 bytes for
/// fabric handles). `None`: a kind the shim cannot identify.
fn shareable_key(
    kind: CUmemAllocationHandleType,
    os_handle: *const c_void,
    exported: bool,
) -> Option<String> {
    use CUmemAllocationHandleType as T;
    if kind == T::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
        let fd = if exported {
            // SAFETY: the driver wrote an int there.
            unsafe { *(os_handle as *const c_int) }
        } else {
            os_handle as usize as c_int
        };
        fd_key(fd)
    } else if kind == T::CU_MEM_HANDLE_TYPE_FABRIC && !os_handle.is_null() {
        // SAFETY: a fabric handle is 64 bytes, written by the driver or
        // passed by the caller.
        let h = unsafe { &*(os_handle as *const CUmemFabricHandle) };
        Some(format!("fabric:{}", hex(&h.data)))
    } else {
        None
    }
}

pub unsafe fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult {
    let g = governed_or!(call_real!(cuIpcGetMemHandle(handle, dptr)));
    let r = call_real!(cuIpcGetMemHandle(handle, dptr));
    if r == OK && !handle.is_null() {
        // SAFETY: the driver succeeded and wrote it.
        let key = ipc_key(unsafe { &*handle });
        register(g, &key);
        g.shared.lock().exported.insert(SharedKey::Ptr(dptr), key);
        g.sharing.store(true, std::sync::atomic::Ordering::Release);
    }
    r
}

pub unsafe fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    kind: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemExportToShareableHandle(
        shareable, handle, kind, flags
    )));
    let r = call_real!(cuMemExportToShareableHandle(shareable, handle, kind, flags));
    if r == OK
        && !shareable.is_null()
        && let Some(key) = shareable_key(kind, shareable, true)
    {
        register(g, &key);
        g.shared.lock().exported.insert(SharedKey::Vmm(handle), key);
        g.sharing.store(true, std::sync::atomic::Ordering::Release);
    }
    r
}

/// An import is let through only if a process of this allocation exported
/// it; nothing is charged. A successful one is recorded as open by this
/// process (`opened` names what the driver handed out).
fn import(
    g: &Governed,
    key: Option<String>,
    what: &str,
    call: impl FnOnce() -> CUresult,
    opened: impl FnOnce() -> SharedKey,
) -> CUresult {
    match key {
        Some(k) if exported_here(g, &k) => {
            let r = call();
            if r == OK {
                register(g, &format!("open {k} {}", std::process::id()));
                g.shared.lock().imported.insert(opened(), k);
                g.sharing.store(true, std::sync::atomic::Ordering::Release);
            }
            r
        }
        _ => {
            crate::log!(
                Level::Warn,
                "{what}: refused: not exported by a process of allocation {}",
                g.files.control.alloc_id()
            );
            CUresult::CUDA_ERROR_NOT_PERMITTED
        }
    }
}

pub unsafe fn cuIpcOpenMemHandle(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    let g = governed_or!(call_real!(cuIpcOpenMemHandle(pdptr, handle, flags)));
    import(
        g,
        Some(ipc_key(&handle)),
        "cuIpcOpenMemHandle",
        || call_real!(cuIpcOpenMemHandle(pdptr, handle, flags)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || SharedKey::Ptr(unsafe { out(pdptr) }),
    )
}

pub unsafe fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    let g = governed_or!(call_real!(cuIpcOpenMemHandle_v2(pdptr, handle, flags)));
    import(
        g,
        Some(ipc_key(&handle)),
        "cuIpcOpenMemHandle",
        || call_real!(cuIpcOpenMemHandle_v2(pdptr, handle, flags)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || SharedKey::Ptr(unsafe { out(pdptr) }),
    )
}

pub unsafe fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    // Nothing was charged for the mapping: nothing to return; the
    // exporter learns the memory is no longer open here.
    let g = governed_or!(call_real!(cuIpcCloseMemHandle(dptr)));
    let r = call_real!(cuIpcCloseMemHandle(dptr));
    if r == OK {
        let id = g.shared.lock().imported.remove(&SharedKey::Ptr(dptr));
        if let Some(id) = id {
            register(g, &format!("close {id} {}", std::process::id()));
        }
    }
    r
}

pub unsafe fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    kind: CUmemAllocationHandleType,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemImportFromShareableHandle(
        handle, os_handle, kind
    )));
    let r = import(
        g,
        shareable_key(kind, os_handle, false),
        "cuMemImportFromShareableHandle",
        || call_real!(cuMemImportFromShareableHandle(handle, os_handle, kind)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || SharedKey::Vmm(unsafe { out(handle) }),
    );
    if r == OK {
        // Known to the VMM books with no charge of its own, so that its
        // last release and unmapping (the driver frees it then) tells the
        // exporter it is closed here.
        // SAFETY: the driver succeeded and wrote it.
        let h = unsafe { out(handle) };
        let _ = g.vmm.lock().created(h, 0, 0);
    }
    r
}

/// A pool exported to other processes (its allocations are then shared
/// with `cuMemPoolExportPointer`/`cuMemPoolImportPointer`): registered like
/// any export. The pool's memory stays charged to this process's pool.
pub unsafe fn cuMemPoolExportToShareableHandle(
    handle_out: *mut c_void,
    pool: CUmemoryPool,
    kind: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemPoolExportToShareableHandle(
        handle_out, pool, kind, flags
    )));
    let r = call_real!(cuMemPoolExportToShareableHandle(
        handle_out, pool, kind, flags
    ));
    if r == OK
        && !handle_out.is_null()
        && let Some(key) = shareable_key(kind, handle_out, true)
    {
        register(g, &key);
    }
    r
}

/// Importing another process's pool: allowed only from the allocation's
/// own exports (its memory is the exporter's, charged there).
pub unsafe fn cuMemPoolImportFromShareableHandle(
    pool_out: *mut CUmemoryPool,
    handle: *mut c_void,
    kind: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemPoolImportFromShareableHandle(
        pool_out, handle, kind, flags
    )));
    let key = shareable_key(kind, handle, false);
    match key {
        Some(k) if exported_here(g, &k) => {
            call_real!(cuMemPoolImportFromShareableHandle(
                pool_out, handle, kind, flags
            ))
        }
        _ => {
            crate::log!(
                Level::Warn,
                "cuMemPoolImportFromShareableHandle: refused: not exported by a process of allocation {}",
                g.files.control.alloc_id()
            );
            CUresult::CUDA_ERROR_NOT_PERMITTED
        }
    }
}
