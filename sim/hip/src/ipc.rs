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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::memory::{Kind, find, map_block, unmap_block};
use crate::*;

const MAGIC: u64 = u64::from_le_bytes(*b"TSHIPIPC");

/// What a handle says, laid out in its 64 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wire {
    pid: u32,
    id: u64,
    key: u64,
    size: u64,
}

impl Wire {
    fn encode(&self) -> hipIpcMemHandle_t {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.key.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        hipIpcMemHandle_t {
            reserved: b.map(|x| x as c_char),
        }
    }

    fn decode(h: &hipIpcMemHandle_t) -> Option<Wire> {
        let b = h.reserved.map(|x| x as u8);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        (u64_at(0) == MAGIC).then(|| Wire {
            pid: u32_at(8),
            id: u64_at(16),
            key: u64_at(24),
            size: u64_at(32),
        })
    }
}

/// Allocations of this process that have a handle: base -> handle contents.
static EXPORTED: Mutex<BTreeMap<usize, Wire>> = Mutex::new(BTreeMap::new());
/// Opened handles: base of the mapping -> (shared-object id, bytes mapped).
static OPENED: Mutex<BTreeMap<usize, (u64, u64)>> = Mutex::new(BTreeMap::new());
/// Makes keys unique within this process; the pid makes them unique on the node.
static SEQ: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another thread (caught at the FFI edge) must not wedge every later call.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The allocation at `base` is being freed: if it was exported, the node's shared
/// object takes over its bytes (this process stops holding it; the charge moves to an
/// importer or leaves the device). Whether it was exported.
pub(crate) fn freed(rt: &Runtime, base: usize) -> bool {
    let Some(w) = lock(&EXPORTED).remove(&base) else {
        return false;
    };
    rt.node.share_leave(rt.slot, w.id);
    true
}

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
            let mut exported = lock(&EXPORTED);
            let w = match exported.get(&base) {
                Some(w) => *w,
                None => {
                    rt.node.reap_dead();
                    let key = (u64::from(std::process::id()) << 32)
                        | SEQ.fetch_add(1, Ordering::Relaxed);
                    let id = rt
                        .node
                        .share_create(rt.slot, a.physical, a.charged, key)
                        .ok_or(hipErrorOutOfMemory)?;
                    let w = Wire {
                        pid: std::process::id(),
                        id,
                        key,
                        size: a.charged,
                    };
                    exported.insert(base, w);
                    w
                }
            };
            // SAFETY: checked non-null; the caller passes a writable handle.
            unsafe { put(handle, w.encode()) }
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
            let w = Wire::decode(&handle).ok_or(hipErrorInvalidValue)?;
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
            let p = match map_block(bytes) {
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
            unmap_block(ptr as usize, bytes);
            rt.node.share_leave(rt.slot, id);
            Ok(())
        })
    }
}
