//! Device memory: the address arena, the allocation table, and the linear allocation
//! families (`cuMemAlloc`, pitch, managed), host allocations, memory info and pointer
//! attributes. Pools, virtual memory management and arrays live in `pool`, `vmm`, `array`;
//! managed-memory hints (advise, prefetch) in `managed`.
//!
//! Device memory is host memory: each process reserves one range of address space (the
//! arena, `PROT_NONE`, no swap reserved) and every device allocation is a part of it mapped
//! read-write (`MAP_NORESERVE`), so device pointers are real addresses, copies and memsets
//! really move bytes, and a pointer into the arena that no live allocation covers (freed,
//! out of range) is refused with `CUDA_ERROR_INVALID_VALUE` instead of faulting. Every
//! allocation is charged to the simulated device (the node state) before it is mapped.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tessera_ffi::cuda::*;

use crate::context::Context;
pub use crate::pool::{POOLS, Pool, trim_pools_after_sync};
use crate::runtime::{Runtime, current, rt};
use crate::{CuResult, guard, put};

pub const PAGE: u64 = 4096;

/// The unit the driver holds device memory in: `cuMemAlloc` of n bytes holds n rounded up
/// to 2 MiB (measured on an H200, driver 580, CUDA 13.0: 40 random 1 B..64 MiB allocations
/// held by NVML per process exactly their sizes rounded up to 2 MiB; the same figure as
/// `cuMemGetAllocationGranularity`, see `vmm::GRANULARITY`). Every family here charges the
/// device in these units, so that NVML per process and `cuMemGetInfo` show what a real
/// device would, and a shim that charges the bytes asked for falls short of it.
pub const DEVICE_PAGE: u64 = 2 << 20;

pub fn round_up(v: u64, align: u64) -> Option<u64> {
    v.checked_add(align - 1).map(|x| x / align * align)
}

/// `bytes` in whole device pages (what the device holds for them).
pub fn device_pages(bytes: u64) -> CuResult<u64> {
    round_up(bytes, DEVICE_PAGE).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

// ---- the arena ----

/// This process's device address space.
#[derive(Debug)]
pub struct Arena {
    pub base: u64,
    pub size: u64,
    inner: Mutex<ArenaInner>,
}

#[derive(Debug, Default)]
struct ArenaInner {
    /// Offset of the first never-used byte.
    bump: u64,
    /// Released ranges: start -> length.
    free: BTreeMap<u64, u64>,
}

static ARENA: OnceLock<Option<Arena>> = OnceLock::new();

/// The arena, reserved on first use (1 TiB of address space, less if the system refuses).
pub fn arena() -> CuResult<&'static Arena> {
    ARENA
        .get_or_init(|| {
            let mut size: u64 = 1 << 40;
            while size >= 1 << 30 {
                // SAFETY: a fresh private anonymous PROT_NONE reservation at an address of
                // the kernel's choice; the result is checked against MAP_FAILED.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        size as usize,
                        libc::PROT_NONE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                if p != libc::MAP_FAILED {
                    return Some(Arena {
                        base: p as u64,
                        size,
                        inner: Mutex::new(ArenaInner::default()),
                    });
                }
                size /= 2;
            }
            None
        })
        .as_ref()
        .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

impl Arena {
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.size
    }

    fn lock(&self) -> MutexGuard<'_, ArenaInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `len` bytes (a multiple of PAGE) of address space aligned to `align` (a power
    /// of two, at least PAGE). The range stays PROT_NONE.
    pub fn reserve(&self, len: u64, align: u64) -> CuResult<u64> {
        let mut a = self.lock();
        let found = a.free.iter().find_map(|(&start, &flen)| {
            let aligned = round_up(start, align)?;
            (aligned.checked_add(len)? <= start + flen).then_some((start, flen, aligned))
        });
        if let Some((start, flen, aligned)) = found {
            a.free.remove(&start);
            if aligned > start {
                a.free.insert(start, aligned - start);
            }
            if aligned + len < start + flen {
                a.free.insert(aligned + len, start + flen - aligned - len);
            }
            return Ok(aligned);
        }
        let cur = self.base + a.bump;
        let aligned = round_up(cur, align).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let end = aligned
            .checked_add(len)
            .filter(|&e| e <= self.base + self.size)
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        if aligned > cur {
            a.free.insert(cur, aligned - cur);
        }
        a.bump = end - self.base;
        Ok(aligned)
    }

    /// Returns a range to the arena (it must already be PROT_NONE again).
    pub fn release(&self, start: u64, len: u64) {
        let mut a = self.lock();
        let (mut start, mut len) = (start, len);
        if let Some((&prev, &plen)) = a.free.range(..start).next_back()
            && prev + plen == start
        {
            a.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(&nlen) = a.free.get(&(start + len)) {
            a.free.remove(&(start + len));
            len += nlen;
        }
        a.free.insert(start, len);
    }
}

/// Maps `[start, start+len)` of the arena read-write, zero-filled.
pub fn commit(start: u64, len: u64) -> CuResult<()> {
    // SAFETY: the range lies in the arena this module reserved and owns; MAP_FIXED
    // replaces only our own PROT_NONE reservation there.
    let p = unsafe {
        libc::mmap(
            start as *mut c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    } else {
        Ok(())
    }
}

/// Turns `[start, start+len)` back into an inaccessible reservation, dropping its pages.
pub fn decommit(start: u64, len: u64) {
    // SAFETY: as in `commit`; the range belongs to the arena and nothing else maps it.
    unsafe {
        libc::mmap(
            start as *mut c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

// ---- the allocation table ----

/// How an allocation was made (and so how it is freed and accounted).
#[derive(Debug, Clone)]
pub enum Kind {
    Plain,
    Pitch,
    Managed,
    /// From a memory pool (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`); the pool holds
    /// the device charge.
    Pool(Arc<Pool>),
    /// A mapping of a `cuMemCreate` handle into a `cuMemAddressReserve` range.
    VmmMapping {
        handle: u64,
        offset: u64,
    },
    /// Another process's allocation opened with `cuIpcOpenMemHandle` (shared object `id`;
    /// charged to its exporter, never here).
    Ipc {
        id: u64,
    },
    /// An allocation of a graph memory node; the device's graph memory holds the charge.
    Graph(Arc<crate::graph::GraphAlloc>),
}

/// One live range of device memory.
#[derive(Debug, Clone)]
pub struct Alloc {
    pub base: u64,
    /// Bytes the program asked for (the bounds copies are checked against).
    pub size: u64,
    /// Address space taken (size rounded up to pages).
    pub va_len: u64,
    pub device: usize,
    /// The context it belongs to (0: none, VMM mappings).
    pub ctx_id: u64,
    pub kind: Kind,
    /// Bytes charged to the device for this allocation itself.
    pub charged: u64,
    pub accessible: bool,
    /// Non-zero once exported with an IPC handle: the node's shared object that now
    /// carries `charged` (see `share`).
    pub shared: u64,
}

static ALLOCS: Mutex<BTreeMap<u64, Alloc>> = Mutex::new(BTreeMap::new());

pub fn allocs() -> MutexGuard<'static, BTreeMap<u64, Alloc>> {
    ALLOCS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocates device memory for `ctx` on its device, charging `charge` bytes to the device
/// first.
pub fn alloc_device(
    rt: &Runtime,
    ctx: &Context,
    bytes: u64,
    kind: Kind,
    charge: u64,
) -> CuResult<u64> {
    alloc_device_on(rt, ctx, ctx.device, bytes, kind, charge)
}

/// Allocates device memory on physical `device` for `ctx` (a stream-ordered allocation's
/// device is its pool's, not necessarily the context's), charging `charge` bytes to the
/// device first.
pub fn alloc_device_on(
    rt: &Runtime,
    ctx: &Context,
    device: usize,
    bytes: u64,
    kind: Kind,
    charge: u64,
) -> CuResult<u64> {
    if bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    rt.check_device(device)?;
    let va_len = round_up(bytes, PAGE).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    if charge > 0 {
        rt.charge(device, charge)?;
    }
    let mapped = arena().and_then(|a| {
        let base = a.reserve(va_len, PAGE)?;
        commit(base, va_len).inspect_err(|_| a.release(base, va_len))?;
        Ok(base)
    });
    let base = match mapped {
        Ok(b) => b,
        Err(e) => {
            rt.uncharge(device, charge);
            return Err(e);
        }
    };
    allocs().insert(
        base,
        Alloc {
            base,
            size: bytes,
            va_len,
            device,
            ctx_id: ctx.id,
            kind,
            charged: charge,
            accessible: true,
            shared: 0,
        },
    );
    Ok(base)
}

/// Unmaps an allocation taken out of the table and returns its charge.
pub(crate) fn release(rt: &Runtime, a: &Alloc) {
    decommit(a.base, a.va_len);
    // A graph allocation's address belongs to its graph node for the graph's lifetime.
    if !matches!(a.kind, Kind::Graph(_))
        && let Ok(ar) = arena()
    {
        ar.release(a.base, a.va_len);
    }
    if a.shared != 0 {
        crate::ipc::forget_export(a.base);
        // The shared object carries the charge; it leaves the device with its last holder.
        crate::share::leave(rt, a.shared);
    } else {
        rt.uncharge(a.device, a.charged);
    }
    match &a.kind {
        Kind::Pool(p) => p.give_back(rt, a.size),
        Kind::Ipc { id } => {
            crate::ipc::forget_open(a.base);
            crate::share::leave(rt, *id);
        }
        Kind::Graph(g) => g.freed(rt),
        _ => {}
    }
}

/// Frees the allocation starting exactly at `base` (not a VMM mapping, not an IPC
/// mapping: those are unmapped with `cuMemUnmap` and `cuIpcCloseMemHandle`).
pub fn free_device(rt: &Runtime, base: u64) -> CuResult<Alloc> {
    let a = {
        let mut t = allocs();
        match t.get(&base) {
            Some(a) if !matches!(a.kind, Kind::VmmMapping { .. } | Kind::Ipc { .. }) => {}
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        t.remove(&base).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
    };
    release(rt, &a);
    Ok(a)
}

/// Frees everything a destroyed (or reset) context allocated.
pub fn free_context(rt: &Runtime, ctx_id: u64) {
    let doomed: Vec<Alloc> = {
        let mut t = allocs();
        let keys: Vec<u64> = t
            .values()
            .filter(|a| a.ctx_id == ctx_id && !matches!(a.kind, Kind::VmmMapping { .. }))
            .map(|a| a.base)
            .collect();
        keys.iter().filter_map(|k| t.remove(k)).collect()
    };
    for a in &doomed {
        release(rt, a);
    }
    crate::array::free_context(rt, ctx_id);
}

/// The allocation containing `ptr`, if any.
pub fn find(ptr: u64) -> Option<Alloc> {
    allocs()
        .range(..=ptr)
        .next_back()
        .filter(|(_, a)| ptr < a.base + a.size)
        .map(|(_, a)| a.clone())
}

/// Checks that `[ptr, ptr+len)` is accessible device memory: inside live allocations
/// (VMM mappings may be adjacent pieces of one range).
pub fn check_device_range(ptr: u64, len: u64) -> CuResult<()> {
    let end = ptr
        .checked_add(len)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let t = allocs();
    let mut at = ptr;
    loop {
        let (_, a) = t
            .range(..=at)
            .next_back()
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if at >= a.base + a.size || !a.accessible {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let a_end = a.base + a.size;
        if end <= a_end {
            return Ok(());
        }
        // Only VMM mappings continue into a neighbour.
        if !matches!(a.kind, Kind::VmmMapping { .. }) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        at = a_end;
    }
}

/// Checks one side of a copy given as a unified address: arena addresses must be live
/// device memory; host addresses of our own host allocations are bounds-checked; other
/// host addresses (pageable memory) are taken on trust, as the driver does.
pub fn check_any_range(ptr: u64, len: u64) -> CuResult<()> {
    if len == 0 {
        return Ok(());
    }
    if ptr == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if arena()?.contains(ptr) {
        return check_device_range(ptr, len);
    }
    if let Some(h) = find_host(ptr)
        && ptr + len > h.base + h.size
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Checks a host-side pointer of an explicit copy (`HtoD` source, `DtoH` destination):
/// not null, not device memory, and within bounds if it is one of our host allocations.
pub fn check_host_range(ptr: u64, len: u64) -> CuResult<()> {
    if len == 0 {
        return Ok(());
    }
    if ptr == 0 || arena()?.contains(ptr) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    check_any_range(ptr, len)
}

// ---- host allocations ----

#[derive(Debug, Clone)]
pub struct HostAlloc {
    pub base: u64,
    pub size: u64,
    pub flags: u32,
    /// Registered program memory (`cuMemHostRegister`) rather than ours.
    pub registered: bool,
}

static HOST: Mutex<BTreeMap<u64, HostAlloc>> = Mutex::new(BTreeMap::new());

fn host() -> MutexGuard<'static, BTreeMap<u64, HostAlloc>> {
    HOST.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn find_host(ptr: u64) -> Option<HostAlloc> {
    host()
        .range(..=ptr)
        .next_back()
        .filter(|(_, h)| ptr < h.base + h.size)
        .map(|(_, h)| h.clone())
}

fn host_alloc(pp: *mut *mut c_void, bytesize: usize, flags: u32) -> CuResult<()> {
    rt()?;
    current()?;
    if pp.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let len = round_up(bytesize.max(1) as u64, PAGE).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: a fresh private anonymous read-write mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    host().insert(
        p as u64,
        HostAlloc {
            base: p as u64,
            size: bytesize as u64,
            flags,
            registered: false,
        },
    );
    // SAFETY: checked non-null above.
    unsafe { pp.write(p) };
    Ok(())
}

/// `cuMemAllocHost_v2`: page-locked host memory (ordinary host memory here; it does not
/// count against the device).
///
/// # Safety
/// `pp` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    guard(|| host_alloc(pp, bytesize, 0))
}

/// `cuMemAllocHost` (the pre-3.2 ABI with a 32-bit size).
///
/// # Safety
/// `pp` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost(pp: *mut *mut c_void, bytesize: c_uint) -> CUresult {
    guard(|| host_alloc(pp, bytesize as usize, 0))
}

/// `cuMemHostAlloc`.
///
/// # Safety
/// `pp` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    Flags: c_uint,
) -> CUresult {
    guard(|| {
        if Flags
            & !(CU_MEMHOSTALLOC_PORTABLE
                | CU_MEMHOSTALLOC_DEVICEMAP
                | CU_MEMHOSTALLOC_WRITECOMBINED)
            != 0
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        host_alloc(pp, bytesize, Flags)
    })
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` must be a pointer from `cuMemAllocHost`/`cuMemHostAlloc` (others are reported).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| {
        rt()?;
        let h = {
            let mut t = host();
            match t.get(&(p as u64)) {
                Some(h) if !h.registered => {}
                _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            }
            t.remove(&(p as u64))
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
        };
        let len = round_up(h.size.max(1), PAGE).unwrap_or(h.size);
        // SAFETY: unmapping a mapping this module made for the allocation; it is no longer
        // in the table, so nothing else will hand it out.
        unsafe { libc::munmap(p, len as usize) };
        Ok(())
    })
}

fn host_get_device_pointer(pdptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) -> CuResult<()> {
    rt()?;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    find_host(p as u64).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // Unified addressing: the device sees host memory at the same address.
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(pdptr, p as CUdeviceptr) }
}

/// `cuMemHostGetDevicePointer_v2`.
///
/// # Safety
/// `pdptr` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    Flags: c_uint,
) -> CUresult {
    guard(|| host_get_device_pointer(pdptr, p, Flags))
}

/// `cuMemHostGetFlags`.
///
/// # Safety
/// `pFlags` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetFlags(pFlags: *mut c_uint, p: *mut c_void) -> CUresult {
    guard(|| {
        rt()?;
        let h = find_host(p as u64).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pFlags, h.flags) }
    })
}

fn host_register(p: *mut c_void, bytesize: usize, flags: c_uint) -> CuResult<()> {
    rt()?;
    current()?;
    if p.is_null() || bytesize == 0 || flags & !0xf != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (base, end) = (p as u64, p as u64 + bytesize as u64);
    if arena()?.contains(base) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut t = host();
    if t.range(..end)
        .next_back()
        .is_some_and(|(_, h)| h.base + h.size > base)
    {
        return Err(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    t.insert(
        base,
        HostAlloc {
            base,
            size: bytesize as u64,
            flags,
            registered: true,
        },
    );
    Ok(())
}

tessera_sim::exports! {
    /// `cuMemHostRegister_v2` and `cuMemHostRegister` (same ABI): records the range
    /// (nothing is pinned).
    ///
    /// # Safety
    /// `p` must point to `bytesize` bytes of the program's memory.
    fn [cuMemHostRegister_v2, cuMemHostRegister](
        p: *mut c_void,
        bytesize: usize,
        Flags: c_uint,
    ) -> CUresult {
        guard(|| host_register(p, bytesize, Flags))
    }
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// Any pointer value is accepted; unregistered ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard(|| {
        rt()?;
        let mut t = host();
        match t.get(&(p as u64)) {
            Some(h) if h.registered => {
                t.remove(&(p as u64));
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

// ---- linear device memory ----

fn mem_alloc(dptr: *mut CUdeviceptr, bytesize: usize, kind: Kind) -> CuResult<()> {
    let rt = rt()?;
    let ctx = current()?;
    if dptr.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = bytesize as u64;
    let base = alloc_device(rt, &ctx, bytes, kind, device_pages(bytes)?)?;
    // SAFETY: checked non-null above.
    unsafe { dptr.write(base) };
    Ok(())
}

/// `cuMemAlloc_v2`.
///
/// # Safety
/// `dptr` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(|| mem_alloc(dptr, bytesize, Kind::Plain))
}

/// `cuMemAlloc`, the pre-3.2 ABI with 32-bit device pointers: simulated device addresses
/// do not fit in 32 bits, so it reports `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(_dptr: *mut CUdeviceptr_v1, _bytesize: c_uint) -> CUresult {
    guard(|| {
        rt()?;
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    })
}

fn mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CuResult<()> {
    let rt = rt()?;
    let ctx = current()?;
    if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 || ![4, 8, 16].contains(&elem)
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // Rows are padded to the texture pitch alignment, as on the device.
    let p = round_up(width as u64, 512).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let bytes = p
        .checked_mul(height as u64)
        .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    let base = alloc_device(rt, &ctx, bytes, Kind::Pitch, device_pages(bytes)?)?;
    // SAFETY: both checked non-null above.
    unsafe {
        dptr.write(base);
        pitch.write(p as usize);
    }
    Ok(())
}

/// `cuMemAllocPitch_v2`: each row padded to 512 bytes, the whole held in device pages.
///
/// # Safety
/// `dptr` and `pPitch` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pPitch: *mut usize,
    WidthInBytes: usize,
    Height: usize,
    ElementSizeBytes: c_uint,
) -> CUresult {
    guard(|| mem_alloc_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes))
}

/// `cuMemAllocManaged`: charged to the device at allocation (no migration is simulated).
///
/// # Safety
/// `dptr` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let global = CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0;
        let host = CUmemAttach_flags::CU_MEM_ATTACH_HOST.0;
        if flags != global && flags != host {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        mem_alloc(dptr, bytesize, Kind::Managed)
    })
}

fn mem_free(dptr: CUdeviceptr) -> CuResult<()> {
    let rt = rt()?;
    if dptr == 0 {
        return Ok(());
    }
    if let Some(a) = find(dptr)
        && a.base == dptr
        && let Kind::Pool(_) = a.kind
    {
        // Freeing stream-ordered memory synchronously waits for the device first.
        if let Ok(ctx) = current() {
            ctx.synchronize(rt);
        }
    }
    free_device(rt, dptr).map(|_| ())
}

/// `cuMemFree_v2`: `dptr` must be the start of an allocation.
///
/// # Safety
/// Any pointer value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(|| mem_free(dptr))
}

/// `cuMemFree` (32-bit pointers, which never name simulated memory).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult {
    guard(|| {
        rt()?;
        if dptr == 0 {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        }
    })
}

/// Free and total memory of the current context's device, as the device sees it (all
/// processes).
fn mem_info() -> CuResult<(u64, u64)> {
    let rt = rt()?;
    let ctx = current()?;
    rt.check_device(ctx.device)?;
    let total = rt
        .node
        .device(ctx.device as u32)
        .map(|d| d.memory_total.load(std::sync::atomic::Ordering::Relaxed))
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    let used = rt.node.memory_used(ctx.device);
    Ok((total.saturating_sub(used), total))
}

/// `cuMemGetInfo_v2`.
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let (f, t) = mem_info()?;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

/// `cuMemGetInfo` (32-bit sizes, saturated).
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    guard(|| {
        let (f, t) = mem_info()?;
        let clamp = |v: u64| v.min(u64::from(u32::MAX)) as c_uint;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(free, clamp(f))?;
            put(total, clamp(t))
        }
    })
}

/// `cuMemGetAddressRange_v2`: base and size of the allocation containing `dptr`.
///
/// # Safety
/// Out pointers must be null (skipped) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        rt()?;
        let a = find(dptr).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: non-null out pointers from the caller.
        unsafe {
            if !pbase.is_null() {
                pbase.write(a.base);
            }
            if !psize.is_null() {
                psize.write(a.size as usize);
            }
        }
        Ok(())
    })
}

/// `cuPointerGetAttribute` for the attributes programs commonly ask about.
///
/// # Safety
/// `data` must be valid for writing the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: CUpointer_attribute,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        if data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        use CUpointer_attribute as P;
        let dev = find(ptr);
        let hst = if dev.is_none() { find_host(ptr) } else { None };
        if dev.is_none() && hst.is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY (for the writes below): `data` is non-null and, by the caller's contract,
        // sized for the attribute's type.
        match attribute {
            P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                let t = if dev.is_some() {
                    CUmemorytype::CU_MEMORYTYPE_DEVICE
                } else {
                    CUmemorytype::CU_MEMORYTYPE_HOST
                };
                // SAFETY: see above.
                unsafe { data.cast::<c_uint>().write(t.0) };
            }
            P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER | P::CU_POINTER_ATTRIBUTE_HOST_POINTER => {
                // SAFETY: see above.
                unsafe { data.cast::<u64>().write(ptr) };
            }
            P::CU_POINTER_ATTRIBUTE_IS_MANAGED => {
                let m = dev
                    .as_ref()
                    .is_some_and(|a| matches!(a.kind, Kind::Managed));
                // SAFETY: see above.
                unsafe { data.cast::<c_uint>().write(u32::from(m)) };
            }
            P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => {
                let d = dev.as_ref().map_or(0, |a| rt.ordinal(a.device));
                // SAFETY: see above.
                unsafe { data.cast::<i32>().write(d) };
            }
            P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => {
                let b = dev
                    .as_ref()
                    .map(|a| a.base)
                    .or(hst.as_ref().map(|h| h.base));
                // SAFETY: see above.
                unsafe { data.cast::<u64>().write(b.unwrap_or(0)) };
            }
            P::CU_POINTER_ATTRIBUTE_RANGE_SIZE => {
                let s = dev
                    .as_ref()
                    .map(|a| a.size)
                    .or(hst.as_ref().map(|h| h.size));
                // SAFETY: see above.
                unsafe { data.cast::<usize>().write(s.unwrap_or(0) as usize) };
            }
            P::CU_POINTER_ATTRIBUTE_MAPPED => {
                // SAFETY: see above.
                unsafe { data.cast::<u32>().write(1) };
            }
            P::CU_POINTER_ATTRIBUTE_CONTEXT => {
                let h = dev
                    .as_ref()
                    .and_then(|a| {
                        crate::context::CONTEXTS
                            .all()
                            .into_iter()
                            .find(|c| c.id == a.ctx_id)
                    })
                    .map_or(std::ptr::null_mut(), |c| {
                        crate::registry::handle_of(&c) as CUcontext
                    });
                // SAFETY: see above.
                unsafe { data.cast::<CUcontext>().write(h) };
            }
            _ => return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        }
        Ok(())
    })
}

/// Bytes `cuPointerGetAttributes` writes for `attr` (`None`: an attribute it does not know).
fn attribute_size(attr: CUpointer_attribute) -> Option<usize> {
    use CUpointer_attribute as P;
    Some(match attr {
        P::CU_POINTER_ATTRIBUTE_CONTEXT
        | P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER
        | P::CU_POINTER_ATTRIBUTE_HOST_POINTER
        | P::CU_POINTER_ATTRIBUTE_BUFFER_ID
        | P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
        | P::CU_POINTER_ATTRIBUTE_RANGE_SIZE
        | P::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
        | P::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
        | P::CU_POINTER_ATTRIBUTE_MAPPING_SIZE
        | P::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
        | P::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => 8,
        P::CU_POINTER_ATTRIBUTE_P2P_TOKENS => 16,
        P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE
        | P::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS
        | P::CU_POINTER_ATTRIBUTE_IS_MANAGED
        | P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        | P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
        | P::CU_POINTER_ATTRIBUTE_MAPPED
        | P::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
        | P::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS
        | P::CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE => 4,
        _ => return None,
    })
}

/// `cuPointerGetAttributes`: each attribute as `cuPointerGetAttribute` answers it. Unlike
/// that call, a pointer CUDA does not know is not an error: its attributes read as zero
/// (memory type 0, "unregistered"), and its device ordinal as -2, as the driver documents.
///
/// # Safety
/// `attributes` and `data` must be null or hold `numAttributes` entries; each `data[i]`
/// must be valid for writing its attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    numAttributes: c_uint,
    attributes: *mut CUpointer_attribute,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        rt()?;
        if numAttributes == 0 || attributes.is_null() || data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let n = numAttributes as usize;
        // SAFETY: non-null, and the caller promises `numAttributes` entries in each.
        let (attrs, outs) = unsafe {
            (
                std::slice::from_raw_parts(attributes, n),
                std::slice::from_raw_parts(data, n),
            )
        };
        for (&attr, &out) in attrs.iter().zip(outs) {
            let size = attribute_size(attr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            if out.is_null() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `out` is non-null and sized for the attribute by the caller's contract.
            let rc = unsafe { cuPointerGetAttribute(out, attr, ptr) };
            match rc {
                CUresult::CUDA_SUCCESS => {}
                CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_NOT_SUPPORTED => {
                    // SAFETY: as above, `size` bytes are writable at `out`.
                    unsafe { std::ptr::write_bytes(out.cast::<u8>(), 0, size) };
                    if attr == CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
                        && rc == CUresult::CUDA_ERROR_INVALID_VALUE
                    {
                        // SAFETY: as above; the ordinal is an int.
                        unsafe { out.cast::<c_int>().write(-2) };
                    }
                }
                e => return Err(e),
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_reuses_and_coalesces_released_ranges() {
        // A private arena: the process-wide one is shared with the tests running
        // beside this one, whose reservations would land between ours. Reserving
        // is bookkeeping only (no mapping), so any aligned base will do.
        let a = &Arena {
            base: 1 << 40,
            size: 1 << 30,
            inner: Mutex::new(ArenaInner::default()),
        };
        let x = a.reserve(PAGE, PAGE).expect("x");
        let y = a.reserve(2 * PAGE, PAGE).expect("y");
        let z = a.reserve(PAGE, PAGE).expect("z");
        assert_eq!(y, x + PAGE);
        assert_eq!(z, y + 2 * PAGE);
        a.release(x, PAGE);
        a.release(y, 2 * PAGE);
        // The two released neighbours coalesced into one 3-page hole.
        assert_eq!(a.reserve(3 * PAGE, PAGE).expect("reuse"), x);
        let big = a.reserve(PAGE, 1 << 21).expect("aligned");
        assert_eq!(big % (1 << 21), 0);
        assert!(a.contains(big) && !a.contains(a.base + a.size));
    }

    #[test]
    fn commit_makes_memory_usable_and_decommit_drops_it() {
        let a = arena().expect("arena");
        let p = a.reserve(PAGE, PAGE).expect("reserve");
        commit(p, PAGE).expect("commit");
        // SAFETY: the page was just mapped read-write.
        unsafe {
            (p as *mut u8).write(7);
            assert_eq!((p as *const u8).read(), 7);
        }
        decommit(p, PAGE);
        commit(p, PAGE).expect("recommit");
        // SAFETY: mapped again, zero-filled.
        assert_eq!(unsafe { (p as *const u8).read() }, 0);
        decommit(p, PAGE);
        a.release(p, PAGE);
    }
}
