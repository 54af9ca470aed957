//! Interprocess memory handles: `cuIpcGetMemHandle`, `cuIpcOpenMemHandle(_v2)`,
//! `cuIpcCloseMemHandle`.
//!
//! Device memory is private anonymous memory until it is exported: the first
//! `cuIpcGetMemHandle` of an allocation moves its bytes into a memfd and maps that in its
//! place (same address, same bytes), so another process that opens the handle maps the
//! very same pages and copies on either side see each other's bytes. The handle's 64
//! bytes carry the exporter's pid, the memfd's descriptor number there, the memfd's inode
//! and the node's shared-object id; the importer opens `/proc/<pid>/fd/<n>` and checks
//! the inode and the object (a made-up or stale handle is `CUDA_ERROR_INVALID_VALUE`).
//!
//! Accounting follows the driver: the memory is counted once, at the exporter; an
//! opened mapping is never charged. The node's shared-object table (see `share`) moves
//! the charge to an importer if the exporter frees the allocation (or exits) while the
//! importer still has it open, since the pages stay reachable then.
//!
//! Event handles (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`): an interprocess event
//! keeps its completion time in a one-page memfd; another process maps that page, so a
//! record in either process is seen by queries, synchronisations and stream waits in
//! both (times are CLOCK_MONOTONIC, one clock for the host).

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use tessera_ffi::cuda::*;

use crate::memory::{Alloc, Kind, PAGE, allocs, arena, decommit, round_up};
use crate::runtime::{current, rt};
use crate::{CuResult, guard};

const MAGIC: u64 = u64::from_le_bytes(*b"TSIPCMEM");
const EVENT_MAGIC: u64 = u64::from_le_bytes(*b"TSIPCEVT");

/// What a handle says, laid out in its 64 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wire {
    pid: u32,
    fd: u32,
    id: u64,
    key: u64,
    size: u64,
}

impl Wire {
    fn encode(&self) -> CUipcMemHandle {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.key.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        CUipcMemHandle {
            reserved: b.map(|x| x as std::ffi::c_char),
        }
    }

    fn decode(h: &CUipcMemHandle) -> Option<Wire> {
        let b = h.reserved.map(|x| x as u8);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        (u64_at(0) == MAGIC).then(|| Wire {
            pid: u32_at(8),
            fd: u32_at(12),
            id: u64_at(16),
            key: u64_at(24),
            size: u64_at(32),
        })
    }
}

/// Allocations of this process that have a handle: base -> (memfd, handle contents).
static EXPORTED: Mutex<BTreeMap<u64, (OwnedFd, Wire)>> = Mutex::new(BTreeMap::new());
/// Opened handles: base of the mapping -> opens not yet closed.
static OPENED: Mutex<BTreeMap<u64, u32>> = Mutex::new(BTreeMap::new());

fn exported() -> MutexGuard<'static, BTreeMap<u64, (OwnedFd, Wire)>> {
    EXPORTED.lock().unwrap_or_else(|e| e.into_inner())
}

fn opened() -> MutexGuard<'static, BTreeMap<u64, u32>> {
    OPENED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The exported allocation at `base` was freed: its memfd is closed here (importers'
/// mappings keep the pages).
pub fn forget_export(base: u64) {
    exported().remove(&base);
}

/// The opened mapping at `base` is gone (closed, or its context destroyed).
pub fn forget_open(base: u64) {
    opened().remove(&base);
}

/// Moves an allocation's bytes into a fresh memfd mapped at the same address.
fn make_shareable(a: &Alloc) -> CuResult<OwnedFd> {
    // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"tessera-sim-ipc".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizing our own memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), a.va_len as libc::off_t) } != 0 {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let mut done = 0u64;
    while done < a.va_len {
        // SAFETY: the allocation's whole range is mapped read-write in this process (the
        // caller holds the allocation table lock, so it cannot be freed meanwhile).
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                (a.base + done) as *const c_void,
                (a.va_len - done) as usize,
                done as libc::off_t,
            )
        };
        if n <= 0 {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        done += n as u64;
    }
    // SAFETY: replaces our own private mapping of the allocation (inside the arena) with
    // the memfd holding the same bytes; MAP_FIXED over a range we own.
    let p = unsafe {
        libc::mmap(
            a.base as *mut c_void,
            a.va_len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(fd)
}

fn get_mem_handle(out: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CuResult<()> {
    let rt = rt()?;
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut table = allocs();
    let a = table
        .range_mut(..=dptr)
        .next_back()
        .map(|(_, a)| a)
        .filter(|a| dptr < a.base + a.size)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // Only ordinary device allocations have IPC handles (pool memory is exported with
    // cuMemPoolExportPointer, VMM memory with cuMemExportToShareableHandle).
    if !matches!(a.kind, Kind::Plain | Kind::Pitch) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut ex = exported();
    if let Some((_, w)) = ex.get(&a.base) {
        // SAFETY: checked non-null above.
        unsafe { out.write(w.encode()) };
        return Ok(());
    }
    let fd = make_shareable(a)?;
    let (key, _) = crate::share::inode(fd.as_raw_fd())?;
    let id = crate::share::create(rt, a.device, a.charged, key)?;
    a.shared = id;
    let w = Wire {
        pid: std::process::id(),
        fd: fd.as_raw_fd() as u32,
        id,
        key,
        size: a.size,
    };
    ex.insert(a.base, (fd, w));
    // SAFETY: checked non-null above.
    unsafe { out.write(w.encode()) };
    Ok(())
}

/// `cuIpcGetMemHandle`: a handle to the whole allocation containing `dptr` (made with
/// `cuMemAlloc` or `cuMemAllocPitch`); the same handle every time.
///
/// # Safety
/// `pHandle` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    pHandle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| get_mem_handle(pHandle, dptr))
}

fn open_mem_handle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CuResult<()> {
    let rt = rt()?;
    let ctx = current()?;
    if pdptr.is_null() || flags & !1 != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let w = Wire::decode(&handle).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if w.pid == std::process::id() {
        // As the driver: a process cannot open its own handles.
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    // Opened already in this process: the same mapping, one more reference.
    {
        let t = allocs();
        let mut o = opened();
        if let Some(a) = t
            .values()
            .find(|a| matches!(a.kind, Kind::Ipc { id } if id == w.id))
            && let Some(n) = o.get_mut(&a.base)
        {
            *n += 1;
            // SAFETY: checked non-null above.
            unsafe { pdptr.write(a.base) };
            return Ok(());
        }
    }
    rt.node
        .share_find(w.key)
        .filter(|i| i.id == w.id && i.bytes > 0)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let path = format!("/proc/{}/fd/{}\0", w.pid, w.fd);
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let (ino, len) = crate::share::inode(fd.as_raw_fd())?;
    let va_len = round_up(w.size, PAGE).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if ino != w.key || len < va_len {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (id, device, _) = crate::share::join_by_key(rt, w.key)?;
    let ar = arena()?;
    let base = match ar.reserve(va_len, PAGE) {
        Ok(b) => b,
        Err(e) => {
            crate::share::leave(rt, id);
            return Err(e);
        }
    };
    // SAFETY: maps the exporter's memfd over a PROT_NONE range of our arena just reserved.
    let p = unsafe {
        libc::mmap(
            base as *mut c_void,
            va_len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        decommit(base, va_len);
        ar.release(base, va_len);
        crate::share::leave(rt, id);
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    allocs().insert(
        base,
        Alloc {
            base,
            size: w.size,
            va_len,
            device,
            ctx_id: ctx.id,
            kind: Kind::Ipc { id },
            charged: 0,
            accessible: true,
            shared: 0,
        },
    );
    opened().insert(base, 1);
    // SAFETY: checked non-null above.
    unsafe { pdptr.write(base) };
    Ok(())
}

tessera_sim::exports! {
    /// `cuIpcOpenMemHandle_v2` and `cuIpcOpenMemHandle` (the CUDA 4.1 symbol; same
    /// arguments): maps another process's allocation into this one (the whole allocation,
    /// at an address of this process). Opening one handle again returns the same address;
    /// each open needs a close.
    ///
    /// # Safety
    /// `pdptr` must be null or writable.
    fn [cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle](
        pdptr: *mut CUdeviceptr,
        handle: CUipcMemHandle,
        Flags: c_uint,
    ) -> CUresult {
        guard(|| open_mem_handle(pdptr, handle, Flags))
    }
}

/// `cuIpcCloseMemHandle`: the last close unmaps the memory (the exporter still has it).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let a = {
            let mut t = allocs();
            match t.get(&dptr) {
                Some(a) if matches!(a.kind, Kind::Ipc { .. }) => {}
                _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            }
            let mut o = opened();
            if let Some(n) = o.get_mut(&dptr)
                && *n > 1
            {
                *n -= 1;
                return Ok(());
            }
            drop(o);
            t.remove(&dptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
        };
        crate::memory::release(rt, &a);
        Ok(())
    })
}

/// The completion time of an interprocess event, in a shared page.
#[derive(Debug)]
pub struct SharedTime {
    fd: OwnedFd,
    /// Address of the mapped page.
    page: usize,
}

impl Drop for SharedTime {
    fn drop(&mut self) {
        // SAFETY: unmapping the page this value mapped and owns.
        unsafe { libc::munmap(self.page as *mut c_void, PAGE as usize) };
    }
}

impl SharedTime {
    fn map(fd: OwnedFd) -> CuResult<SharedTime> {
        // SAFETY: a fresh shared mapping of one page of a memfd at least that long; the
        // result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(SharedTime {
            fd,
            page: p as usize,
        })
    }

    /// A new zeroed page (never recorded).
    pub fn create() -> CuResult<SharedTime> {
        // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"tessera-sim-event".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizing our own memfd to one page.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE as libc::off_t) } != 0 {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        Self::map(fd)
    }

    /// The shared time word.
    pub fn word(&self) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: the page is mapped read-write for the life of `self`, page-aligned (so
        // aligned for a u64), and only ever accessed atomically, by every process.
        unsafe { &*(self.page as *const std::sync::atomic::AtomicU64) }
    }
}

fn event_wire(pid: u32, fd: u32, key: u64) -> CUipcEventHandle {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&EVENT_MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&pid.to_le_bytes());
    b[12..16].copy_from_slice(&fd.to_le_bytes());
    b[16..24].copy_from_slice(&key.to_le_bytes());
    CUipcEventHandle {
        reserved: b.map(|x| x as std::ffi::c_char),
    }
}

/// `cuIpcGetEventHandle`: for events created with `CU_EVENT_INTERPROCESS` (and timing
/// disabled, as the driver requires); others are `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `pHandle` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetEventHandle(
    pHandle: *mut CUipcEventHandle,
    event: CUevent,
) -> CUresult {
    guard(|| {
        rt()?;
        let e = crate::stream::EVENTS.lookup(event as usize)?;
        let s = e
            .shared
            .as_ref()
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if pHandle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (key, _) = crate::share::inode(s.fd.as_raw_fd())?;
        let h = event_wire(std::process::id(), s.fd.as_raw_fd() as u32, key);
        // SAFETY: checked non-null above.
        unsafe { pHandle.write(h) };
        Ok(())
    })
}

/// `cuIpcOpenEventHandle`: an event of this process sharing another process's
/// interprocess event (recorded in either, seen in both). Its own handle, or a stale or
/// forged one, is refused.
///
/// # Safety
/// `phEvent` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenEventHandle(
    phEvent: *mut CUevent,
    handle: CUipcEventHandle,
) -> CUresult {
    guard(|| {
        rt()?;
        let ctx = current()?;
        if phEvent.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let b = handle.reserved.map(|x| x as u8);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        if u64_at(0) != EVENT_MAGIC {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (pid, fd, key) = (u32_at(8), u32_at(12), u64_at(16));
        if pid == std::process::id() {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        let path = format!("/proc/{pid}/fd/{fd}\0");
        // SAFETY: a NUL-terminated path; the result is checked.
        let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let (ino, len) = crate::share::inode(fd.as_raw_fd())?;
        if ino != key || len < PAGE {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let shared = SharedTime::map(fd)?;
        let interprocess = CUevent_flags::CU_EVENT_INTERPROCESS.0;
        let disable_timing = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        let h = crate::stream::EVENTS.insert(std::sync::Arc::new(crate::stream::Event {
            ctx,
            flags: interprocess | disable_timing,
            time: std::sync::atomic::AtomicU64::new(0),
            shared: Some(shared),
        }));
        // SAFETY: checked non-null above.
        unsafe { phEvent.write(h as CUevent) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_foreign_bytes_are_refused() {
        let w = Wire {
            pid: 42,
            fd: 7,
            id: 9,
            key: 1234,
            size: 4096,
        };
        assert_eq!(Wire::decode(&w.encode()), Some(w));
        let junk = CUipcMemHandle { reserved: [1; 64] };
        assert_eq!(Wire::decode(&junk), None);
    }
}
