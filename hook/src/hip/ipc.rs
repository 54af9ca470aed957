//! HIP IPC: `hipIpcGetMemHandle`, `hipIpcOpenMemHandle`,
//! `hipIpcCloseMemHandle`, on the allocation's exports list as CUDA's
//! (`cuda/ipc.rs`, whose functions these call): an export is registered;
//! an import is allowed only from the allocation's own exports and charges
//! nothing (the memory is the exporter's, counted once); an exporter that
//! frees memory a live importer still has open keeps it charged until the
//! importers close it (settled at synchronisations and before a refusal).

use super::*;
use crate::cuda::ipc::{exported_here, hex, register};
use crate::ledger::SharedKey;

/// What an import outside the allocation's exports gets: the handle is not
/// one this allocation can use.
const NOT_EXPORTED_HERE: hipError_t = hipError_t(400); // hipErrorInvalidHandle

/// The handle's identity in the exports list (the same form as CUDA's).
fn ipc_key(h: &hipIpcMemHandle_t) -> String {
    let bytes: Vec<u8> = h.reserved.iter().map(|&b| b as u8).collect();
    format!("ipc:{}", hex(&bytes))
}

pub unsafe fn hipIpcGetMemHandle(handle: *mut hipIpcMemHandle_t, ptr: *mut c_void) -> hipError_t {
    let g = governed_or!(call_real!(hipIpcGetMemHandle(handle, ptr)));
    let r = real!(hipIpcGetMemHandle(handle, ptr));
    if r == OK && !handle.is_null() {
        // SAFETY: the runtime succeeded and wrote it.
        let key = ipc_key(unsafe { &*handle });
        register(g, &key);
        g.shared
            .lock()
            .exported
            .insert(SharedKey::Ptr(ptr as u64), key);
        g.sharing.store(true, Ordering::Release);
    }
    r
}

pub unsafe fn hipIpcOpenMemHandle(
    ptr: *mut *mut c_void,
    handle: hipIpcMemHandle_t,
    flags: c_uint,
) -> hipError_t {
    let g = governed_or!(call_real!(hipIpcOpenMemHandle(ptr, handle, flags)));
    let key = ipc_key(&handle);
    if !exported_here(g, &key) {
        crate::log!(
            Level::Warn,
            "hipIpcOpenMemHandle: refused: not exported by a process of allocation {}",
            g.files.control.alloc_id()
        );
        return NOT_EXPORTED_HERE;
    }
    // The runtime maps it in the current device's context: charged first
    // if this is the process's first use of the device.
    if let Err(e) = current(g) {
        return e;
    }
    let r = real!(hipIpcOpenMemHandle(ptr, handle, flags));
    if r == OK {
        register(g, &format!("open {key} {}", std::process::id()));
        // SAFETY: the runtime succeeded and wrote it.
        let Key::Ptr(p) = (unsafe { out_ptr(ptr) }) else {
            return r;
        };
        g.shared.lock().imported.insert(SharedKey::Ptr(p), key);
        g.sharing.store(true, Ordering::Release);
    }
    r
}

pub unsafe fn hipIpcCloseMemHandle(ptr: *mut c_void) -> hipError_t {
    // Nothing was charged for the mapping: nothing to return; the exporter
    // learns the memory is no longer open here.
    let g = governed_or!(call_real!(hipIpcCloseMemHandle(ptr)));
    let r = real!(hipIpcCloseMemHandle(ptr));
    if r == OK {
        let id = g.shared.lock().imported.remove(&SharedKey::Ptr(ptr as u64));
        if let Some(id) = id {
            register(g, &format!("close {id} {}", std::process::id()));
        }
    }
    r
}
