//! What the memory families share, below every one of them: the table of this
//! process's live allocations, the pools' accounting and the list of exported
//! allocations.
//!
//! Freeing an allocation settles its bytes by where they came from: a pool block's go
//! back to its pool, an exported allocation's to the node's shared object, the rest to
//! the device. So the three records a free consults live here, with the free itself,
//! and the families (`memory`, `pool`, `ipc`, and `stream`'s synchronisation points,
//! which trim the pools) import this module and never one another's state: imports run
//! one way, down to here.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

use crate::*;

/// What an ordinary allocation is rounded up to.
pub const DEVICE_PAGE: u64 = 4 << 10;

pub fn round_up(v: u64, align: u64) -> Option<u64> {
    v.checked_add(align - 1).map(|x| x / align * align)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another thread (caught at the FFI edge) must not wedge every later call.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---- the allocation table ----

/// The family an allocation came from, for pointer attributes and frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Device,
    Managed,
    Pool,
    Array,
}

/// One live allocation of this process.
#[derive(Debug, Clone, Copy)]
pub struct Alloc {
    pub ordinal: usize,
    pub physical: usize,
    /// Bytes charged to the device (the size rounded to the page).
    pub charged: u64,
    /// Bytes the caller asked for.
    pub size: u64,
    pub kind: Kind,
    /// The pool a stream-ordered block came from ([`Pool`] address), 0 for none: its
    /// bytes go back to that pool, not to the device, when it is freed.
    pub pool: usize,
}

/// Live allocations by start address.
static ALLOCS: Mutex<BTreeMap<usize, Alloc>> = Mutex::new(BTreeMap::new());

/// Reserves `len` bytes of address space, readable and writable, backed only when used:
/// device memory is this process's own address space, so device pointers are real
/// addresses.
pub(crate) fn map(len: u64) -> HipResult<*mut c_void> {
    let len = usize::try_from(len.max(1)).map_err(|_| hipErrorOutOfMemory)?;
    // SAFETY: an anonymous private mapping at an address the kernel chooses; no existing
    // memory is affected. The result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(hipErrorOutOfMemory);
    }
    Ok(p)
}

/// Gives back address space [`map`] made.
pub(crate) fn unmap(p: usize, len: u64) {
    // SAFETY: `p` is the start of a mapping of `len` bytes (at least 1) made by `map`,
    // no longer in any table of this library, so nothing of it uses the range again.
    unsafe { libc::munmap(p as *mut c_void, len.max(1) as usize) };
}

/// Records a live allocation whose bytes are already charged (to the device, or to
/// the pool `pool` when it is not 0).
pub(crate) fn insert(
    p: *mut c_void,
    ordinal: usize,
    physical: usize,
    charged: u64,
    size: u64,
    kind: Kind,
    pool: usize,
) {
    lock(&ALLOCS).insert(
        p as usize,
        Alloc {
            ordinal,
            physical,
            charged,
            size,
            kind,
            pool,
        },
    );
}

/// The allocation holding address `p`, if any (for pointer attributes).
pub fn find(p: usize) -> Option<(usize, Alloc)> {
    let table = lock(&ALLOCS);
    let (&start, a) = table.range(..=p).next_back()?;
    (p < start + a.charged as usize).then_some((start, *a))
}

/// Frees an allocation of one of `kinds` that starts at `p`; null is a no-op. Its bytes
/// go back to its pool, to the node's shared object when it was exported, or to the
/// device.
pub fn free(p: *mut c_void, kinds: &[Kind]) -> HipResult<()> {
    if p.is_null() {
        return Ok(());
    }
    let rt = rt()?;
    let a = {
        let mut table = lock(&ALLOCS);
        match table.get(&(p as usize)) {
            Some(a) if kinds.contains(&a.kind) => table.remove(&(p as usize)),
            _ => None,
        }
    }
    .ok_or(hipErrorInvalidDevicePointer)?;
    unmap(p as usize, a.charged);
    if a.pool != 0 {
        block_freed(rt, a.pool, a.charged);
    } else if export_freed(rt, p as usize) {
        // Exported: the node's shared object settled the bytes.
    } else {
        rt.node.release_memory(rt.slot, a.physical, a.charged);
    }
    Ok(())
}

// ---- the pools' accounting ----

/// A memory pool (`hipMemPool_t` is the address of one).
#[derive(Debug)]
pub struct Pool {
    pub ordinal: usize,
    pub physical: usize,
    state: Mutex<PoolState>,
}

/// A pool's bytes and settings, behind its lock.
#[derive(Debug, Default)]
pub(crate) struct PoolState {
    /// Bytes taken from the device.
    pub reserved: u64,
    /// Bytes in live blocks.
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    pub release_threshold: u64,
    /// `hipMemPoolDestroy` was called: live blocks stay until freed, and their bytes go
    /// straight back to the device.
    pub destroyed: bool,
}

/// Live pool handles. A destroyed pool's box is never freed: blocks still live refer to
/// it, and a simulator process makes few pools.
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

impl Pool {
    pub(crate) fn lock(&self) -> MutexGuard<'_, PoolState> {
        lock(&self.state)
    }

    /// Releases unused memory down to `keep` bytes reserved (never below what is used).
    pub(crate) fn trim(&self, rt: &Runtime, keep: u64) {
        let mut s = self.lock();
        let target = round_up(keep.max(s.used), DEVICE_PAGE).unwrap_or(u64::MAX);
        if s.reserved > target {
            rt.node
                .release_memory(rt.slot, self.physical, s.reserved - target);
            s.reserved = target;
        }
    }
}

/// A new, live pool on ordinal `ordinal`; its handle.
pub(crate) fn new_pool(rt: &Runtime, ordinal: usize) -> HipResult<usize> {
    let physical = rt.physical(ordinal as c_int)?;
    let h = Box::into_raw(Box::new(Pool {
        ordinal,
        physical,
        state: Mutex::new(PoolState::default()),
    })) as usize;
    lock(&LIVE).get_or_insert_with(HashSet::new).insert(h);
    Ok(h)
}

/// The live pool at handle `h`.
pub(crate) fn pool(h: *mut c_void) -> HipResult<&'static Pool> {
    if !lock(&LIVE)
        .as_ref()
        .is_some_and(|s| s.contains(&(h as usize)))
    {
        return Err(hipErrorInvalidValue);
    }
    // SAFETY: a live handle is the address of a `Pool` box `new_pool` leaked (never
    // freed, see LIVE), so the reference is valid for the process's life.
    Ok(unsafe { &*h.cast::<Pool>() })
}

/// Pool `h` is destroyed: no longer live (its box stays, for the blocks it still has).
pub(crate) fn forget_pool(h: usize) {
    lock(&LIVE).as_mut().map(|s| s.remove(&h));
}

/// A block of `bytes` of pool `h` was freed: the pool keeps the memory (a destroyed
/// pool gives it straight back).
pub(crate) fn block_freed(rt: &Runtime, h: usize, bytes: u64) {
    // SAFETY: `h` came from a live allocation's record, which only the pool's allocation
    // writes, with the address of a pool box that is never freed.
    let p = unsafe { &*(h as *const Pool) };
    let destroyed = {
        let mut s = p.lock();
        s.used = s.used.saturating_sub(bytes);
        s.destroyed
    };
    if destroyed {
        p.trim(rt, 0);
    }
}

/// At a synchronisation point, pools on `ordinal` (every ordinal when `None`) release
/// what exceeds their release threshold.
pub(crate) fn after_sync(ordinal: Option<usize>) {
    let Ok(rt) = rt() else { return };
    let handles: Vec<usize> = lock(&LIVE)
        .as_ref()
        .map(|s| s.iter().copied().collect())
        .unwrap_or_default();
    for h in handles {
        // SAFETY: a live handle is a never-freed pool box.
        let p = unsafe { &*(h as *const Pool) };
        if ordinal.is_none_or(|o| o == p.ordinal) {
            let keep = p.lock().release_threshold;
            p.trim(rt, keep);
        }
    }
}

// ---- the exported allocations ----

/// What an IPC handle of an allocation of this process says (`ipc` lays it out in the
/// handle's 64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Export {
    pub pid: u32,
    /// The node's shared-object id.
    pub id: u64,
    pub key: u64,
    pub size: u64,
}

/// Allocations of this process that have a handle: base -> what the handle says.
static EXPORTED: Mutex<BTreeMap<usize, Export>> = Mutex::new(BTreeMap::new());

/// The export of the allocation at `base`, made by `make` if it has none yet (under the
/// list's lock, so two threads exporting one allocation make one shared object).
pub(crate) fn export(base: usize, make: impl FnOnce() -> HipResult<Export>) -> HipResult<Export> {
    let mut exported = lock(&EXPORTED);
    if let Some(e) = exported.get(&base) {
        return Ok(*e);
    }
    let e = make()?;
    exported.insert(base, e);
    Ok(e)
}

/// The allocation at `base` is being freed: if it was exported, the node's shared
/// object takes over its bytes (this process stops holding it; the charge moves to an
/// importer or leaves the device). Whether it was exported.
fn export_freed(rt: &Runtime, base: usize) -> bool {
    let Some(e) = lock(&EXPORTED).remove(&base) else {
        return false;
    };
    rt.node.share_leave(rt.slot, e.id);
    true
}
