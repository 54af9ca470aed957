//! Virtual memory management: physical allocations (`cuMemCreate`/`cuMemRelease`),
//! address reservations (`cuMemAddressReserve`/`Free`), mapping (`cuMemMap`/`Unmap`) and
//! access (`cuMemSetAccess`/`GetAccess`).
//!
//! A physical allocation is a memfd of its size, charged to the device at `cuMemCreate`;
//! mapping it maps the memfd into the reserved range, so two mappings of one handle really
//! share bytes. A mapping is inaccessible until `cuMemSetAccess` (copies into it fail,
//! and touching it faults, as on the device). Memory returns to the device once the
//! handle is released and its last mapping is gone.
//!
//! A handle created with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` among its requested
//! handle types can be exported as a file descriptor (a duplicate of its memfd) and
//! imported in another process (after passing the descriptor, e.g. over a Unix socket)
//! or this one: the import is a new handle to the same pages. The memory is counted once
//! on the device, whoever holds it: exporting makes it a shared object of the node
//! (`share`), which keeps the charge until its last holder lets go and moves it to a
//! remaining holder when the one charged goes first.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tessera_ffi::cuda::*;

use crate::memory::{Alloc, Kind, allocs, arena, decommit};
use crate::runtime::{Runtime, rt};
use crate::{CuResult, get, guard, put};

/// Allocation granularity (minimum and recommended), as on current GPUs.
pub const GRANULARITY: u64 = 2 << 20;

#[derive(Debug)]
struct Phys {
    device: usize,
    size: u64,
    fd: OwnedFd,
    prop: Prop,
    /// Handle references (`cuMemCreate`, `cuMemRetainAllocationHandle`) not yet released.
    handle_refs: u32,
    /// Live mappings of the handle (memory mappings and sparse array bindings).
    mappings: u32,
    /// The node's shared object carrying the charge, once exported or when imported.
    share: Option<u64>,
}

/// The properties a handle was created with, its Windows-only pointer cleared.
#[derive(Debug, Clone, Copy)]
struct Prop(CUmemAllocationProp);

// SAFETY: the only pointer in it (`win32HandleMetaData`) is set to null on creation and
// never dereferenced.
unsafe impl Send for Prop {}

static PHYS: Mutex<BTreeMap<u64, Phys>> = Mutex::new(BTreeMap::new());
static RESERVATIONS: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x5e55_0000_0001);

fn phys() -> MutexGuard<'static, BTreeMap<u64, Phys>> {
    PHYS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records a new physical allocation with its one handle reference, not yet mapped, and
/// returns its handle.
fn new_phys(
    device: usize,
    size: u64,
    fd: OwnedFd,
    prop: CUmemAllocationProp,
    share: Option<u64>,
) -> CUmemGenericAllocationHandle {
    let h = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    phys().insert(
        h,
        Phys {
            device,
            size,
            fd,
            prop: Prop(prop),
            handle_refs: 1,
            mappings: 0,
            share,
        },
    );
    h
}

fn reservations() -> MutexGuard<'static, BTreeMap<u64, u64>> {
    RESERVATIONS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops a physical allocation once nothing references it.
fn maybe_free(rt: &Runtime, table: &mut BTreeMap<u64, Phys>, handle: u64) {
    if let Some(p) = table.get(&handle)
        && p.handle_refs == 0
        && p.mappings == 0
        && let Some(p) = table.remove(&handle)
    {
        match p.share {
            Some(id) => crate::share::leave(rt, id),
            None => rt.uncharge(p.device, p.size),
        }
    }
}

/// A sparse or deferred-mapping array binds `handle`: it keeps the memory alive.
pub fn bind(handle: u64) -> CuResult<usize> {
    let mut t = phys();
    let p = t
        .get_mut(&handle)
        .filter(|p| p.handle_refs > 0)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    p.mappings += 1;
    Ok(p.device)
}

/// The size of a handle's memory.
pub fn handle_size(handle: u64) -> Option<u64> {
    phys().get(&handle).map(|p| p.size)
}

/// An array binding of `handle` is gone.
pub fn unbind(rt: &Runtime, handle: u64) {
    let mut t = phys();
    if let Some(p) = t.get_mut(&handle) {
        p.mappings = p.mappings.saturating_sub(1);
    }
    maybe_free(rt, &mut t, handle);
}

const POSIX_FD: u32 = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;

/// `cuMemExportToShareableHandle`: a POSIX file descriptor (a new one each call, the
/// caller's to close) for a handle created with that handle type requested.
///
/// # Safety
/// `shareableHandle` must be null or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareableHandle: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handleType: CUmemAllocationHandleType,
    flags: u64,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        if shareableHandle.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if handleType.0 != POSIX_FD {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let mut t = phys();
        let p = t
            .get_mut(&handle)
            .filter(|p| p.handle_refs > 0)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if p.prop.0.requestedHandleTypes.0 & POSIX_FD == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if p.share.is_none() {
            let (key, _) = crate::share::inode(p.fd.as_raw_fd())?;
            p.share = Some(crate::share::create(rt, p.device, p.size, key)?);
        }
        // SAFETY: duplicating our own open memfd; the result is checked.
        let fd = unsafe { libc::fcntl(p.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(CUresult::CUDA_ERROR_OPERATING_SYSTEM);
        }
        // SAFETY: checked non-null; for this handle type the output is an int.
        unsafe { shareableHandle.cast::<i32>().write(fd) };
        Ok(())
    })
}

/// `cuMemImportFromShareableHandle`: a new handle to the memory behind an exported POSIX
/// file descriptor (passed as the pointer-sized value of the `int`, as the driver takes
/// it). The descriptor stays the caller's; an unknown one is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// No pointer is dereferenced except `handle` (null or writable).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    osHandle: *mut c_void,
    shHandleType: CUmemAllocationHandleType,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if shHandleType.0 != POSIX_FD {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let raw =
            i32::try_from(osHandle as usize).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if raw < 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (key, len) = crate::share::inode(raw)?;
        let (id, device, size) = crate::share::join_by_key(rt, key)?;
        let fail = |e| {
            crate::share::leave(rt, id);
            Err(e)
        };
        if len < size || rt.local(device).is_none() {
            return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: duplicating the caller's descriptor so the handle owns its own.
        let fd = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return fail(CUresult::CUDA_ERROR_OPERATING_SYSTEM);
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: all-zero is a valid CUmemAllocationProp (null pointer, zero fields).
        let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CUmemAllocationHandleType(POSIX_FD);
        prop.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = rt.ordinal(device);
        let h = new_phys(device, size, fd, prop, Some(id));
        // SAFETY: checked non-null above.
        unsafe { handle.write(h) };
        Ok(())
    })
}

fn check_prop(rt: &Runtime, prop: &CUmemAllocationProp) -> CuResult<usize> {
    if prop.type_ != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    rt.device(prop.location.id)
        .map(|d| d.index)
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// `cuMemGetAllocationGranularity`.
///
/// # Safety
/// `granularity` must be null or writable; `prop` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: CUmemAllocationGranularity_flags,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        // SAFETY: the caller passes null (rejected) or a valid prop.
        check_prop(rt, unsafe { get(prop) }?)?;
        if option.0 > 1 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(granularity, GRANULARITY as usize) }
    })
}

/// `cuMemCreate`: `size` must be a multiple of the granularity.
///
/// # Safety
/// `handle` must be null or writable; `prop` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        // SAFETY: the caller passes null (rejected) or a valid prop.
        let mut prop = *unsafe { get(prop) }?;
        let device = check_prop(rt, &prop)?;
        prop.win32HandleMetaData = std::ptr::null_mut();
        let size = size as u64;
        if handle.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        rt.charge(device, size)?;
        // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"tessera-sim-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            rt.uncharge(device, size);
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizing our own memfd; the file stays sparse until written.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            rt.uncharge(device, size);
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let h = new_phys(device, size, fd, prop, None);
        // SAFETY: checked non-null above.
        unsafe { handle.write(h) };
        Ok(())
    })
}

/// `cuMemRelease`: the memory returns once the handle's mappings are gone too.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let mut t = phys();
        let p = t
            .get_mut(&handle)
            .filter(|p| p.handle_refs > 0)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        p.handle_refs -= 1;
        maybe_free(rt, &mut t, handle);
        Ok(())
    })
}

/// `cuMemRetainAllocationHandle`: the handle of the mapping containing `addr`, with one
/// more reference to release.
///
/// # Safety
/// `handle` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    guard(|| {
        rt()?;
        let h = match crate::memory::find(addr as u64).map(|a| a.kind) {
            Some(Kind::VmmMapping { handle, .. }) => handle,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = phys();
        t.get_mut(&h)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
            .handle_refs += 1;
        // SAFETY: checked non-null above.
        unsafe { handle.write(h) };
        Ok(())
    })
}

/// `cuMemGetAllocationPropertiesFromHandle`.
///
/// # Safety
/// `prop` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    guard(|| {
        rt()?;
        let p = phys()
            .get(&handle)
            .map(|p| p.prop.0)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(prop, p) }
    })
}

/// `cuMemAddressReserve`: a granularity-aligned range of the device address space (the
/// address hint is ignored, as the driver may).
///
/// # Safety
/// `ptr` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    guard(|| {
        rt()?;
        let size = size as u64;
        let alignment = alignment as u64;
        if ptr.is_null()
            || flags != 0
            || size == 0
            || !size.is_multiple_of(GRANULARITY)
            || (alignment != 0 && !alignment.is_power_of_two())
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let base = arena()?.reserve(size, alignment.max(GRANULARITY))?;
        reservations().insert(base, size);
        // SAFETY: checked non-null above.
        unsafe { ptr.write(base) };
        Ok(())
    })
}

/// `cuMemAddressFree`: the exact range reserved, with nothing mapped in it.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        rt()?;
        let mut r = reservations();
        if r.get(&ptr) != Some(&(size as u64)) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if allocs().range(ptr..ptr + size as u64).next().is_some() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        r.remove(&ptr);
        arena()?.release(ptr, size as u64);
        Ok(())
    })
}

fn in_reservation(ptr: u64, size: u64) -> bool {
    reservations()
        .range(..=ptr)
        .next_back()
        .is_some_and(|(&b, &s)| ptr + size <= b + s)
}

/// `cuMemMap`: maps `size` bytes of a handle, from `offset`, at `ptr` inside a reserved
/// range. The mapping is inaccessible until `cuMemSetAccess`.
///
/// # Safety
/// No pointer is dereferenced by the caller's contract; `ptr` must be reserved.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    guard(|| {
        rt()?;
        let (size, offset) = (size as u64, offset as u64);
        if flags != 0
            || size == 0
            || !ptr.is_multiple_of(GRANULARITY)
            || !size.is_multiple_of(GRANULARITY)
            || !offset.is_multiple_of(GRANULARITY)
            || !in_reservation(ptr, size)
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = phys();
        let p = t
            .get_mut(&handle)
            .filter(|p| p.handle_refs > 0)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if offset.checked_add(size).is_none_or(|e| e > p.size) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut table = allocs();
        let overlaps = table
            .range(..ptr + size)
            .next_back()
            .is_some_and(|(_, a)| a.base + a.va_len > ptr);
        if overlaps {
            return Err(CUresult::CUDA_ERROR_ALREADY_MAPPED);
        }
        // SAFETY: the range is inside a reservation of our arena with nothing mapped in
        // it; MAP_FIXED replaces only that PROT_NONE reservation. The memfd is ours.
        let m = unsafe {
            libc::mmap(
                ptr as *mut c_void,
                size as usize,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                p.fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        p.mappings += 1;
        table.insert(
            ptr,
            Alloc {
                base: ptr,
                size,
                va_len: size,
                device: p.device,
                ctx_id: 0,
                kind: Kind::VmmMapping { handle, offset },
                charged: 0,
                accessible: false,
                shared: 0,
            },
        );
        Ok(())
    })
}

/// The mappings exactly covering `[ptr, ptr+size)`, or an error.
fn covering(table: &BTreeMap<u64, Alloc>, ptr: u64, size: u64) -> CuResult<Vec<u64>> {
    let mut at = ptr;
    let mut bases = Vec::new();
    while at < ptr + size {
        match table.get(&at) {
            Some(a) if matches!(a.kind, Kind::VmmMapping { .. }) => {
                bases.push(at);
                at += a.size;
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    if at != ptr + size {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(bases)
}

/// `cuMemUnmap`: the range must consist of whole mappings.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let mut t = phys();
        let mut table = allocs();
        for base in covering(&table, ptr, size as u64)? {
            if let Some(a) = table.remove(&base) {
                decommit(a.base, a.va_len);
                if let Kind::VmmMapping { handle, .. } = a.kind {
                    if let Some(p) = t.get_mut(&handle) {
                        p.mappings -= 1;
                    }
                    maybe_free(rt, &mut t, handle);
                }
            }
        }
        Ok(())
    })
}

/// `cuMemSetAccess`: the strongest access among the descriptors applies to the range.
///
/// # Safety
/// `desc` must point to `count` descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        if desc.is_null() || count == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut access = 0u32;
        for i in 0..count {
            // SAFETY: the caller passes `count` descriptors.
            let d = unsafe { &*desc.add(i) };
            if d.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            rt.device(d.location.id)
                .map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
            if ![0, 1, 3].contains(&d.flags.0) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            access = access.max(d.flags.0);
        }
        let prot = match access {
            3 => libc::PROT_READ | libc::PROT_WRITE,
            1 => libc::PROT_READ,
            _ => libc::PROT_NONE,
        };
        let mut table = allocs();
        for base in covering(&table, ptr, size as u64)? {
            if let Some(a) = table.get_mut(&base) {
                // SAFETY: changing the protection of a mapping this module made.
                if unsafe { libc::mprotect(a.base as *mut c_void, a.size as usize, prot) } != 0 {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                // Copies need read-write: a read-only mapping is not a valid copy target.
                a.accessible = access == 3;
            }
        }
        Ok(())
    })
}

/// `cuMemGetAccess`.
///
/// # Safety
/// `flags` must be null or writable; `location` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut u64,
    location: *const CUmemLocation,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        rt()?;
        // SAFETY: the caller passes null (rejected) or a valid location.
        unsafe { get(location) }?;
        let a = crate::memory::find(ptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let f = if a.accessible { 3 } else { 0 };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(flags, f) }
    })
}
