//! Device memory held by more than one process (IPC handles, VMM handles exported as file
//! descriptors): this process's references to the node's shared objects.
//!
//! The node state (`tessera_sim::Node::share_*`) records which process slots hold each
//! object and which one is charged for it, so the memory counts once on the device for as
//! long as any process can reach it. Within a process, several handles or mappings can
//! refer to one object; the node sees the process as one holder, joined on the first
//! reference and left on the last.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard};

use tessera_ffi::cuda::CUresult;

use crate::CuResult;
use crate::runtime::Runtime;

/// References of this process to shared objects, by id.
static LOCAL: Mutex<BTreeMap<u64, u32>> = Mutex::new(BTreeMap::new());

fn local() -> MutexGuard<'static, BTreeMap<u64, u32>> {
    LOCAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes memory of `bytes` on `device`, already charged to this process, a shared
/// object keyed by `key`; this process holds one reference.
pub fn create(rt: &Runtime, device: usize, bytes: u64, key: u64) -> CuResult<u64> {
    // A dead process's entry may still name an inode its closed memfd gave back (and the
    // kernel may now hand to ours): reaping first leaves only live objects to match keys.
    rt.node.reap_dead();
    let id = rt
        .node
        .share_create(rt.slot, device, bytes, key)
        .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    local().insert(id, 1);
    Ok(id)
}

/// Takes one more reference to the shared object `key` names (an import). Returns its
/// id, physical device and size; `CUDA_ERROR_INVALID_VALUE` when no such object lives.
pub fn join_by_key(rt: &Runtime, key: u64) -> CuResult<(u64, usize, u64)> {
    let info = rt
        .node
        .share_find(key)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let mut l = local();
    let (device, bytes) = rt
        .node
        .share_join(rt.slot, info.id)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    *l.entry(info.id).or_insert(0) += 1;
    Ok((info.id, device, bytes))
}

/// Drops one reference; with the last one the process stops holding the object (and
/// the node moves or returns its charge).
pub fn leave(rt: &Runtime, id: u64) {
    let mut l = local();
    let last = match l.get_mut(&id) {
        Some(n) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => {
            l.remove(&id);
            true
        }
        None => false,
    };
    if last {
        rt.node.share_leave(rt.slot, id);
    }
}

/// The inode of an open file: what identifies a memfd across processes.
pub fn inode(fd: RawFd) -> CuResult<(u64, u64)> {
    // SAFETY: fstat writes into a zeroed stat buffer we own; `fd` is only read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the result is checked.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok((st.st_ino, st.st_size as u64))
}
