//! Interprocess memory handles: `hipIpcGetMemHandle`, `hipIpcOpenMemHandle`,
//! `hipIpcCloseMemHandle`.
//!
//! Accounting follows the runtime (HIP 5.2.3's `hip_runtime_api.h`: memory opened from a
//! handle "must be freed with hipIpcCloseMemHandle"; the exporter's allocation is the
//! memory, the importer only maps it): the memory is counted once on the device, at the
//! exporter; an opened mapping is never charged again. The node's shared-object table
//! (`tessera_sim::Node::share_*`, the one the simulated CUDA driver uses) moves the
//! charge to an importer when the exporter frees the allocation (or exits) while the
//! importer still has it open, since the pages stay reachable then, and off the device
//! when the last holder lets go.
//!
//! Not modelled: contents. An importer maps fresh pages of the handle's size, so bytes
//! written on one side are not seen on the other (the simulated CUDA driver shares them
//! through a memfd; nothing here needs it yet). The handle's 64 bytes carry a magic, the
//! node's shared-object id, its key and size; a made-up or stale handle is
//! `hipErrorInvalidValue`; a process opening its own handle gets
//! `hipErrorInvalidContext`, as CUDA's driver answers.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::registry::{Export, Kind, export, find, lock, map, unmap};
use crate::*;

const MAGIC: u64 = u64::from_le_bytes(*b"TSHIPIPC");

/// Lays an export out in a handle's 64 bytes.
fn encode(e: &Export) -> hipIpcMemHandle_t {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&e.pid.to_le_bytes());
    b[16..24].copy_from_slice(&e.id.to_le_bytes());
    b[24..32].copy_from_slice(&e.key.to_le_bytes());
    b[32..40].copy_from_slice(&e.size.to_le_bytes());
    hipIpcMemHandle_t {
        reserved: b.map(|x| x as c_char),
    }
}

/// What a handle says, if it is one of this library's.
fn decode(h: &hipIpcMemHandle_t) -> Option<Export> {
    let b = h.reserved.map(|x| x as u8);
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
    (u64_at(0) == MAGIC).then(|| Export {
        pid: u32_at(8),
        id: u64_at(16),
        key: u64_at(24),
        size: u64_at(32),
    })
}

/// Opened handles: base of the mapping -> (shared-object id, bytes mapped).
static OPENED: Mutex<BTreeMap<usize, (u64, u64)>> = Mutex::new(BTreeMap::new());
/// Makes keys unique within this process; the pid makes them unique on the node.
static SEQ: AtomicU64 = AtomicU64::new(1);

hip_api! {
    /// `hipIpcGetMemHandle`: a handle for the allocation holding `ptr`.
    ///
    /// # Safety
    /// `handle` must be null or writable.
    "hip_4.2" fn hipIpcGetMemHandle(handle: *mut hipIpcMemHandle_t, ptr: *mut c_void) -> hipError_t {
        guard(|| {
            if handle.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let rt = rt()?;
            let (base, a) = find(ptr as usize).ok_or(hipErrorInvalidDevicePointer)?;
            // Only what hipMalloc and hipExtMallocWithFlags hand out (device memory
            // of its own, not a pool's block or an array).
            if a.kind != Kind::Device {
                return Err(hipErrorInvalidValue);
            }
            let e = export(base, || {
                rt.node.reap_dead();
                let key = (u64::from(std::process::id()) << 32) | SEQ.fetch_add(1, Ordering::Relaxed);
                let id = rt
                    .node
                    .share_create(rt.slot, a.physical, a.charged, key)
                    .ok_or(hipErrorOutOfMemory)?;
                Ok(Export { pid: std::process::id(), id, key, size: a.charged })
            })?;
            // SAFETY: checked non-null; the caller passes a writable handle.
            unsafe { put(handle, encode(&e)) }
        })
    }

    /// `hipIpcOpenMemHandle`: maps another process's exported allocation; nothing is
    /// charged to the device again.
    ///
    /// # Safety
    /// `ptr` must be null or writable.
    "hip_4.2" fn hipIpcOpenMemHandle(ptr: *mut *mut c_void, handle: hipIpcMemHandle_t, _flags: c_uint) -> hipError_t {
        guard(|| {
            if ptr.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let rt = rt()?;
            let w = decode(&handle).ok_or(hipErrorInvalidValue)?;
            // The mapping is made in the current device's context, made now if this
            // process has not used the device yet.
            rt.current_touched()?;
            if w.pid == std::process::id() {
                return Err(hipErrorInvalidContext);
            }
            let info = rt.node.share_find(w.key).ok_or(hipErrorInvalidValue)?;
            if info.id != w.id {
                return Err(hipErrorInvalidValue);
            }
            let (_, bytes) = rt
                .node
                .share_join(rt.slot, info.id)
                .ok_or(hipErrorInvalidValue)?;
            let p = match map(bytes) {
                Ok(p) => p,
                Err(e) => {
                    rt.node.share_leave(rt.slot, info.id);
                    return Err(e);
                }
            };
            lock(&OPENED).insert(p as usize, (info.id, bytes));
            // SAFETY: checked non-null above.
            unsafe { put(ptr, p) }
        })
    }

    /// `hipIpcCloseMemHandle`: unmaps an opened handle; with the last holder gone the
    /// memory leaves the device.
    ///
    /// # Safety
    /// Any pointer value is accepted; unknown ones are reported.
    "hip_4.2" fn hipIpcCloseMemHandle(ptr: *mut c_void) -> hipError_t {
        guard(|| {
            let rt = rt()?;
            let (id, bytes) = lock(&OPENED)
                .remove(&(ptr as usize))
                .ok_or(hipErrorInvalidValue)?;
            unmap(ptr as usize, bytes);
            rt.node.share_leave(rt.slot, id);
            Ok(())
        })
    }
}
