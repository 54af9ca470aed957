//! Device memory, every family: `hipMalloc` and `hipExtMallocWithFlags`, managed,
//! pitched and 3D allocations, arrays, stream-ordered allocations from pools, and the
//! virtual memory calls (`hipMemCreate`, `hipMemAddressReserve`, `hipMemMap`); host
//! memory; copies, sets, memory info and pointer attributes.
//!
//! Each family admits its bytes against the device's capacity in the node state file
//! (the ground truth every process shares) before it hands out memory, and gives them
//! back when freed. Device memory is this process's own address space, reserved with
//! `MAP_NORESERVE`, so device pointers are real addresses and copies and sets are plain
//! memory operations; pages cost host memory only once written.
//!
//! Page rounding (assumed, not measured on an AMD GPU): an allocation holds its size
//! rounded up to [`DEVICE_PAGE`], 4 KiB, the page the GPU's memory manager maps; the
//! virtual memory calls work in [`VMM_GRANULARITY`], 2 MiB, which is also what
//! `hipMemGetAllocationGranularity` reports, minimum and recommended alike.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use crate::registry::{DEVICE_PAGE, Kind, find, free, insert, lock, map, round_up};
use crate::stream::{self, Stream};

use crate::*;

/// The granularity of the virtual memory calls.
pub const VMM_GRANULARITY: u64 = 2 << 20;
/// The pitch alignment of pitched and 3D allocations (`textureAlignment`).
pub const PITCH_ALIGN: usize = 256;

/// Live `hipHostMalloc` blocks.
static HOST: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Allocates `size` bytes on ordinal `ordinal`: admitted against the device first, then
/// mapped; a failed mapping gives the admission back.
pub fn alloc_on(ordinal: usize, size: u64, kind: Kind) -> HipResult<*mut c_void> {
    let rt = rt()?;
    let physical = rt.touch(ordinal)?;
    let charged = round_up(size.max(1), DEVICE_PAGE).ok_or(hipErrorOutOfMemory)?;
    if !rt.node.reserve_memory(rt.slot, physical, charged) {
        return Err(hipErrorOutOfMemory);
    }
    let p = match map(charged) {
        Ok(p) => p,
        Err(e) => {
            rt.node.release_memory(rt.slot, physical, charged);
            return Err(e);
        }
    };
    insert(p, ordinal, physical, charged, size, kind, 0);
    Ok(p)
}

/// Allocates on the calling thread's current device.
pub fn alloc(size: u64, kind: Kind) -> HipResult<*mut c_void> {
    let (o, _) = rt()?.current()?;
    alloc_on(o, size, kind)
}

/// `hipMalloc`'s rule for zero bytes: success, a null pointer, nothing held.
fn alloc_or_null(size: u64, kind: Kind) -> HipResult<*mut c_void> {
    if size == 0 {
        rt()?.current()?;
        return Ok(std::ptr::null_mut());
    }
    alloc(size, kind)
}

/// What `hipMemGetInfo` reports for physical device `physical`: (free, total), the
/// whole device's view, as the real runtime gives it.
pub fn info(physical: usize) -> HipResult<(usize, usize)> {
    let rt = rt()?;
    let d = rt
        .node
        .device_info(physical as u32)
        .map_err(|_| hipErrorInvalidDevice)?;
    let used = rt.node.memory_used(physical);
    Ok((
        d.memory_total.saturating_sub(used) as usize,
        d.memory_total as usize,
    ))
}

/// A physical allocation of the virtual memory calls (`hipMemGenericAllocationHandle_t`).
#[derive(Debug)]
pub struct Physical {
    pub physical: usize,
    pub bytes: u64,
    /// Mappings of it that exist; its bytes go back once it is released and unmapped.
    pub maps: u32,
    pub released: bool,
}

/// Live physical handles, and which handle each mapped range shows.
static PHYSICAL: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static MAPPED: Mutex<BTreeMap<usize, (usize, u64)>> = Mutex::new(BTreeMap::new());

/// Runs `f` on a live physical handle.
fn with_physical<R>(h: *mut c_void, f: impl FnOnce(&mut Physical) -> R) -> HipResult<R> {
    let set = lock(&PHYSICAL);
    if !set.as_ref().is_some_and(|s| s.contains(&(h as usize))) {
        return Err(hipErrorInvalidValue);
    }
    // SAFETY: the address is a live `Physical` box of this module (checked above), and the
    // PHYSICAL lock, held for the call, serialises every access to it.
    Ok(f(unsafe { &mut *h.cast::<Physical>() }))
}

/// Gives a physical handle's bytes back and frees it once nothing maps it.
fn drop_if_done(h: usize) {
    let rt = match rt() {
        Ok(rt) => rt,
        Err(_) => return,
    };
    let mut set = lock(&PHYSICAL);
    let Some(s) = set.as_mut() else { return };
    let done = s.contains(&h) && {
        // SAFETY: `h` is in the live set, so it is a `Physical` box of this module; the
        // lock serialises access.
        let p = unsafe { &*(h as *const Physical) };
        p.released && p.maps == 0
    };
    if done {
        s.remove(&h);
        // SAFETY: removed from the live set under the lock: this is the last use of the box
        // made by `Box::into_raw` in `hipMemCreate`.
        let p = unsafe { Box::from_raw(h as *mut Physical) };
        rt.node.release_memory(rt.slot, p.physical, p.bytes);
    }
}

fn element_bytes(desc: &hipChannelFormatDesc) -> u64 {
    let bits = [desc.x, desc.y, desc.z, desc.w]
        .iter()
        .map(|&b| b.max(0) as u64)
        .sum::<u64>();
    bits.div_ceil(8).max(1)
}

/// A HIP array: its bytes are an ordinary allocation of kind [`Kind::Array`].
#[derive(Debug)]
pub struct Array {
    pub data: usize,
}

static ARRAYS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Bytes of one element of a driver-style array: the format's channel size times the
/// channel count (1, 2 or 4).
fn channel_bytes(format: c_int, channels: c_uint) -> HipResult<u64> {
    let one = format_bytes(format).ok_or(hipErrorInvalidValue)?;
    if !matches!(channels, 1 | 2 | 4) {
        return Err(hipErrorInvalidValue);
    }
    Ok(one * u64::from(channels))
}

/// Makes an array of `width` x `height` x `depth` elements of `elt` bytes (a zero height
/// or depth counts as one) and writes its handle.
///
/// # Safety
/// `array` must be writable.
unsafe fn new_array(
    array: *mut *mut c_void,
    elt: u64,
    width: usize,
    height: usize,
    depth: usize,
) -> HipResult<()> {
    if width == 0 {
        return Err(hipErrorInvalidValue);
    }
    let bytes = elt
        .checked_mul(width as u64)
        .and_then(|b| b.checked_mul(height.max(1) as u64))
        .and_then(|b| b.checked_mul(depth.max(1) as u64))
        .ok_or(hipErrorOutOfMemory)?;
    let data = alloc(bytes, Kind::Array)?;
    let a = Box::into_raw(Box::new(Array {
        data: data as usize,
    }));
    lock(&ARRAYS)
        .get_or_insert_with(HashSet::new)
        .insert(a as usize);
    // SAFETY: the caller's contract.
    unsafe { put(array, a.cast()) }
}

/// Frees an array made by any of the array calls.
fn free_array(array: *mut c_void) -> HipResult<()> {
    let known = lock(&ARRAYS)
        .as_mut()
        .is_some_and(|s| s.remove(&(array as usize)));
    if !known {
        return Err(hipErrorInvalidValue);
    }
    // SAFETY: removed from the live set: the last use of the box made in `new_array`.
    let a = unsafe { Box::from_raw(array.cast::<Array>()) };
    free(a.data as *mut c_void, &[Kind::Array])
}

hip_api! {
    /// `hipMalloc`.
    ///
    /// # Safety
    /// `ptr` must be null or writable.
    "hip_4.2" fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> hipError_t {
        guard(|| {
            if ptr.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let p = alloc_or_null(size as u64, Kind::Device)?;
            // SAFETY: checked non-null; the caller passes a writable pointer.
            unsafe { put(ptr, p) }
        })
    }

    /// `hipExtMallocWithFlags`: the flags choose fine- or coarse-grained memory, which the
    /// simulator does not tell apart.
    ///
    /// # Safety
    /// `ptr` must be null or writable.
    "hip_4.2" fn hipExtMallocWithFlags(ptr: *mut *mut c_void, size: usize, _flags: c_uint) -> hipError_t {
        guard(|| {
            if ptr.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let p = alloc_or_null(size as u64, Kind::Device)?;
            // SAFETY: as above.
            unsafe { put(ptr, p) }
        })
    }

    /// `hipMallocManaged`: charged to the current device like device memory (the
    /// simulator does not migrate pages).
    ///
    /// # Safety
    /// `ptr` must be null or writable.
    "hip_4.2" fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, _flags: c_uint) -> hipError_t {
        guard(|| {
            if ptr.is_null() || size == 0 {
                return Err(hipErrorInvalidValue);
            }
            let p = alloc(size as u64, Kind::Managed)?;
            // SAFETY: as above.
            unsafe { put(ptr, p) }
        })
    }

    /// `hipMallocPitch`: rows padded to [`PITCH_ALIGN`].
    ///
    /// # Safety
    /// `ptr` and `pitch` must be null or writable.
    "hip_4.2" fn hipMallocPitch(ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) -> hipError_t {
        guard(|| {
            if ptr.is_null() || pitch.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let row = width.checked_next_multiple_of(PITCH_ALIGN).ok_or(hipErrorOutOfMemory)?;
            let bytes = (row as u64).checked_mul(height as u64).ok_or(hipErrorOutOfMemory)?;
            let p = alloc(bytes, Kind::Device)?;
            // SAFETY: both checked non-null; the caller passes writable pointers.
            unsafe {
                put(ptr, p)?;
                put(pitch, row)
            }
        })
    }

    /// `hipMalloc3D`: `depth` slices of pitched rows.
    ///
    /// # Safety
    /// `out` must be null or writable.
    "hip_4.2" fn hipMalloc3D(out: *mut hipPitchedPtr, extent: hipExtent) -> hipError_t {
        guard(|| {
            if out.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let row = extent.width.checked_next_multiple_of(PITCH_ALIGN).ok_or(hipErrorOutOfMemory)?;
            let bytes = (row as u64)
                .checked_mul(extent.height as u64)
                .and_then(|b| b.checked_mul(extent.depth as u64))
                .ok_or(hipErrorOutOfMemory)?;
            let p = alloc(bytes, Kind::Device)?;
            // SAFETY: as above.
            unsafe {
                put(out, hipPitchedPtr { ptr: p, pitch: row, xsize: extent.width, ysize: extent.height })
            }
        })
    }

    /// `hipFree`.
    ///
    /// # Safety
    /// Any pointer value is accepted; unknown ones are reported.
    "hip_4.2" fn hipFree(ptr: *mut c_void) -> hipError_t {
        guard(|| free(ptr, &[Kind::Device, Kind::Managed, Kind::Pool]))
    }

    /// `hipMallocArray`: width x height elements of the channel format's size.
    ///
    /// # Safety
    /// `array` must be null or writable; `desc` null or readable.
    "hip_4.2" fn hipMallocArray(array: *mut *mut c_void, desc: *const hipChannelFormatDesc, width: usize, height: usize, _flags: c_uint) -> hipError_t {
        guard(|| {
            if array.is_null() || desc.is_null() || width == 0 {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: checked non-null; the caller passes a readable descriptor.
            let elt = element_bytes(unsafe { &*desc });
            // SAFETY: checked non-null; the caller passes a writable pointer.
            unsafe { new_array(array, elt, width, height, 0) }
        })
    }

    /// `hipMalloc3DArray`: width x height x depth elements of the channel format's size.
    ///
    /// # Safety
    /// `array` must be null or writable; `desc` null or readable.
    "hip_4.2" fn hipMalloc3DArray(array: *mut *mut c_void, desc: *const hipChannelFormatDesc, extent: hipExtent, _flags: c_uint) -> hipError_t {
        guard(|| {
            if array.is_null() || desc.is_null() || extent.width == 0 {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: checked non-null; the caller passes a readable descriptor.
            let elt = element_bytes(unsafe { &*desc });
            // SAFETY: as above.
            unsafe { new_array(array, elt, extent.width, extent.height, extent.depth) }
        })
    }

    /// `hipArrayCreate`: the driver-style description (format and channel count).
    ///
    /// # Safety
    /// `array` must be null or writable; `desc` null or readable.
    "hip_4.2" fn hipArrayCreate(array: *mut *mut c_void, desc: *const HIP_ARRAY_DESCRIPTOR) -> hipError_t {
        guard(|| {
            if array.is_null() || desc.is_null() {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: checked non-null; the caller passes a readable descriptor.
            let d = unsafe { *desc };
            let elt = channel_bytes(d.Format, d.NumChannels)?;
            // SAFETY: as above.
            unsafe { new_array(array, elt, d.Width, d.Height, 0) }
        })
    }

    /// `hipArray3DCreate`.
    ///
    /// # Safety
    /// `array` must be null or writable; `desc` null or readable.
    "hip_4.2" fn hipArray3DCreate(array: *mut *mut c_void, desc: *const HIP_ARRAY3D_DESCRIPTOR) -> hipError_t {
        guard(|| {
            if array.is_null() || desc.is_null() {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: checked non-null; the caller passes a readable descriptor.
            let d = unsafe { *desc };
            let elt = channel_bytes(d.Format, d.NumChannels)?;
            // SAFETY: as above.
            unsafe { new_array(array, elt, d.Width, d.Height, d.Depth) }
        })
    }

    /// `hipArrayDestroy`: as `hipFreeArray`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.3" fn hipArrayDestroy(array: *mut c_void) -> hipError_t {
        guard(|| free_array(array))
    }

    /// `hipMemAllocPitch`: the driver-style pitched allocation (rows padded to
    /// [`PITCH_ALIGN`], whatever the element size).
    ///
    /// # Safety
    /// `ptr` and `pitch` must be null or writable.
    "hip_4.2" fn hipMemAllocPitch(ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize, element: c_uint) -> hipError_t {
        guard(|| {
            if !matches!(element, 4 | 8 | 16) {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: the caller's contract, passed on.
            match unsafe { hipMallocPitch(ptr, pitch, width, height) } {
                hipSuccess => Ok(()),
                e => Err(e),
            }
        })
    }

    /// `hipFreeArray`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.2" fn hipFreeArray(array: *mut c_void) -> hipError_t {
        guard(|| free_array(array))
    }

    /// `hipHostMalloc`: page-locked host memory is ordinary host memory here.
    ///
    /// # Safety
    /// `ptr` must be null or writable.
    "hip_4.2" fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, _flags: c_uint) -> hipError_t {
        guard(|| {
            if ptr.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let mut p = std::ptr::null_mut();
            // SAFETY: `p` is a valid out pointer; alignment is a power of two >= pointer size.
            if unsafe { libc::posix_memalign(&mut p, 4096, size.max(1)) } != 0 {
                return Err(hipErrorOutOfMemory);
            }
            lock(&HOST).get_or_insert_with(HashSet::new).insert(p as usize);
            // SAFETY: as above.
            unsafe { put(ptr, p) }
        })
    }

    /// `hipHostFree`.
    ///
    /// # Safety
    /// Any pointer value is accepted; unknown ones are reported.
    "hip_4.2" fn hipHostFree(ptr: *mut c_void) -> hipError_t {
        guard(|| {
            if ptr.is_null() {
                return Ok(());
            }
            if !lock(&HOST).as_mut().is_some_and(|s| s.remove(&(ptr as usize))) {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: a block from posix_memalign above, removed from the live set.
            unsafe { libc::free(ptr) };
            Ok(())
        })
    }

    /// `hipMemGetInfo`: the current device's free and total memory.
    ///
    /// # Safety
    /// `free` and `total` must be null or writable.
    "hip_4.2" fn hipMemGetInfo(free_: *mut usize, total: *mut usize) -> hipError_t {
        guard(|| {
            let (_, physical) = rt()?.current_touched()?;
            let (f, t) = info(physical)?;
            // SAFETY: the caller passes writable pointers or null (rejected).
            unsafe {
                put(free_, f)?;
                put(total, t)
            }
        })
    }

    /// `hipMemcpy`: every pointer is an address of this process, so a copy is a memmove
    /// whichever way it goes.
    ///
    /// # Safety
    /// `dst` and `src` must be valid for `size` bytes.
    "hip_4.2" fn hipMemcpy(dst: *mut c_void, src: *const c_void, size: usize, _kind: c_int) -> hipError_t {
        // SAFETY: the caller's contract.
        guard(|| unsafe { copy(dst, src, size, true) })
    }

    /// `hipMemcpyAsync`: done at once, after the stream's queued work in time.
    ///
    /// # Safety
    /// `dst` and `src` must be valid for `size` bytes.
    "hip_4.2" fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, size: usize, _kind: c_int, s: *mut c_void) -> hipError_t {
        guard(|| {
            stream::resolve(s)?;
            // SAFETY: the caller's contract.
            unsafe { copy(dst, src, size, false) }
        })
    }

    /// `hipMemcpyPeer`.
    ///
    /// # Safety
    /// `dst` and `src` must be valid for `size` bytes.
    "hip_4.2" fn hipMemcpyPeer(dst: *mut c_void, _dst_device: c_int, src: *const c_void, _src_device: c_int, size: usize) -> hipError_t {
        // SAFETY: the caller's contract.
        guard(|| unsafe { copy(dst, src, size, true) })
    }

    /// `hipMemcpyPeerAsync`.
    ///
    /// # Safety
    /// `dst` and `src` must be valid for `size` bytes.
    "hip_4.2" fn hipMemcpyPeerAsync(dst: *mut c_void, _dst_device: c_int, src: *const c_void, _src_device: c_int, size: usize, s: *mut c_void) -> hipError_t {
        guard(|| {
            stream::resolve(s)?;
            // SAFETY: the caller's contract.
            unsafe { copy(dst, src, size, false) }
        })
    }

    /// `hipMemset`.
    ///
    /// # Safety
    /// `dst` must be valid for `size` bytes.
    "hip_4.2" fn hipMemset(dst: *mut c_void, value: c_int, size: usize) -> hipError_t {
        // SAFETY: the caller's contract.
        guard(|| unsafe { set(dst, value, size, true) })
    }

    /// `hipMemsetAsync`.
    ///
    /// # Safety
    /// `dst` must be valid for `size` bytes.
    "hip_4.2" fn hipMemsetAsync(dst: *mut c_void, value: c_int, size: usize, s: *mut c_void) -> hipError_t {
        guard(|| {
            stream::resolve(s)?;
            // SAFETY: the caller's contract.
            unsafe { set(dst, value, size, false) }
        })
    }

    /// `hipMemAdvise`: advice changes nothing the simulator models.
    ///
    /// # Safety
    /// Any pointer value is accepted.
    "hip_4.2" fn hipMemAdvise(ptr: *const c_void, _count: usize, _advice: c_int, _device: c_int) -> hipError_t {
        guard(|| find(ptr as usize).map(|_| ()).ok_or(hipErrorInvalidValue))
    }

    /// `hipMemPrefetchAsync`: nothing to migrate.
    ///
    /// # Safety
    /// Any pointer value is accepted.
    "hip_4.2" fn hipMemPrefetchAsync(ptr: *const c_void, _count: usize, _device: c_int, _s: *mut c_void) -> hipError_t {
        guard(|| find(ptr as usize).map(|_| ()).ok_or(hipErrorInvalidValue))
    }

    /// `hipPointerGetAttributes`: device memory of this process's allocations, host
    /// memory of `hipHostMalloc`; anything else is `hipErrorInvalidValue`, as HIP answers.
    ///
    /// # Safety
    /// `attributes` must be null or writable.
    "hip_4.2" fn hipPointerGetAttributes(attributes: *mut hipPointerAttribute_t, ptr: *const c_void) -> hipError_t {
        guard(|| {
            if attributes.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let a = if let Some((_, a)) = find(ptr as usize) {
                hipPointerAttribute_t {
                    memoryType: if a.kind == Kind::Array { hipMemoryTypeArray } else { hipMemoryTypeDevice },
                    device: a.ordinal as c_int,
                    devicePointer: ptr.cast_mut(),
                    hostPointer: if a.kind == Kind::Managed { ptr.cast_mut() } else { std::ptr::null_mut() },
                    isManaged: c_int::from(a.kind == Kind::Managed),
                    allocationFlags: 0,
                }
            } else if lock(&HOST).as_ref().is_some_and(|s| s.contains(&(ptr as usize))) {
                let (o, _) = rt()?.current()?;
                hipPointerAttribute_t {
                    memoryType: hipMemoryTypeHost,
                    device: o as c_int,
                    devicePointer: ptr.cast_mut(),
                    hostPointer: ptr.cast_mut(),
                    isManaged: 0,
                    allocationFlags: 0,
                }
            } else {
                return Err(hipErrorInvalidValue);
            };
            // SAFETY: checked non-null; the caller passes a writable struct.
            unsafe { put(attributes, a) }
        })
    }

    /// `hipMemGetAllocationGranularity`: [`VMM_GRANULARITY`] for both options.
    ///
    /// # Safety
    /// `granularity` must be null or writable; `prop` null or readable.
    "hip_5.1" fn hipMemGetAllocationGranularity(granularity: *mut usize, prop: *const hipMemAllocationProp, _option: c_int) -> hipError_t {
        guard(|| {
            if prop.is_null() {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: checked non-null; the caller passes readable properties.
            rt()?.physical(unsafe { prop_device(prop.cast()) })?;
            // SAFETY: as above.
            unsafe { put(granularity, VMM_GRANULARITY as usize) }
        })
    }

    /// `hipMemCreate`: physical memory on the device the properties name, a multiple of
    /// the granularity, admitted against the device now.
    ///
    /// # Safety
    /// `handle` must be null or writable; `prop` null or readable.
    "hip_5.1" fn hipMemCreate(handle: *mut *mut c_void, size: usize, prop: *const hipMemAllocationProp, _flags: u64) -> hipError_t {
        guard(|| {
            if handle.is_null() || prop.is_null() || size == 0 || !(size as u64).is_multiple_of(VMM_GRANULARITY) {
                return Err(hipErrorInvalidValue);
            }
            let rt = rt()?;
            // SAFETY: checked non-null; the caller passes readable properties.
            let ordinal = unsafe { prop_device(prop.cast()) };
            rt.physical(ordinal)?;
            let physical = rt.touch(ordinal as usize)?;
            if !rt.node.reserve_memory(rt.slot, physical, size as u64) {
                return Err(hipErrorOutOfMemory);
            }
            let h = Box::into_raw(Box::new(Physical { physical, bytes: size as u64, maps: 0, released: false }));
            lock(&PHYSICAL).get_or_insert_with(HashSet::new).insert(h as usize);
            // SAFETY: as above.
            unsafe { put(handle, h.cast()) }
        })
    }

    /// `hipMemRelease`: the bytes go back once no mapping shows them.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_5.1" fn hipMemRelease(handle: *mut c_void) -> hipError_t {
        guard(|| {
            with_physical(handle, |p| {
                if p.released {
                    Err(hipErrorInvalidValue)
                } else {
                    p.released = true;
                    Ok(())
                }
            })??;
            drop_if_done(handle as usize);
            Ok(())
        })
    }

    /// `hipMemAddressReserve`: address space only, inaccessible until mapped.
    ///
    /// # Safety
    /// `ptr` must be null or writable.
    "hip_5.1" fn hipMemAddressReserve(ptr: *mut *mut c_void, size: usize, _alignment: usize, _addr: *mut c_void, _flags: u64) -> hipError_t {
        guard(|| {
            if ptr.is_null() || size == 0 || !(size as u64).is_multiple_of(VMM_GRANULARITY) {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: an anonymous inaccessible mapping where the kernel chooses; checked
            // against MAP_FAILED.
            let p = unsafe {
                libc::mmap(std::ptr::null_mut(), size, libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
            };
            if p == libc::MAP_FAILED {
                return Err(hipErrorOutOfMemory);
            }
            // SAFETY: as above.
            unsafe { put(ptr, p) }
        })
    }

    /// `hipMemAddressFree`.
    ///
    /// # Safety
    /// `ptr` must be a range from `hipMemAddressReserve` with nothing mapped in it.
    "hip_5.1" fn hipMemAddressFree(ptr: *mut c_void, size: usize) -> hipError_t {
        guard(|| {
            if ptr.is_null() || size == 0 {
                return Err(hipErrorInvalidValue);
            }
            let mapped = lock(&MAPPED).range(ptr as usize..ptr as usize + size).next().is_some();
            if mapped {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: by the caller's contract a reserved range of this library.
            unsafe { libc::munmap(ptr, size) };
            Ok(())
        })
    }

    /// `hipMemMap`: makes `[ptr, ptr+size)` of a reserved range show a physical
    /// allocation. Each mapping is memory of its own (two mappings of one handle do not
    /// share contents in the simulator).
    ///
    /// # Safety
    /// `ptr` must lie in a range from `hipMemAddressReserve`.
    "hip_5.1" fn hipMemMap(ptr: *mut c_void, size: usize, offset: usize, handle: *mut c_void, _flags: u64) -> hipError_t {
        guard(|| {
            if ptr.is_null() || size == 0 {
                return Err(hipErrorInvalidValue);
            }
            let bytes = with_physical(handle, |p| p.bytes)?;
            if offset as u64 + size as u64 > bytes {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: the range is the caller's reservation (its contract); MAP_FIXED over
            // it replaces only that reservation.
            let p = unsafe {
                libc::mmap(ptr, size, libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED, -1, 0)
            };
            if p == libc::MAP_FAILED {
                return Err(hipErrorOutOfMemory);
            }
            with_physical(handle, |p| p.maps += 1)?;
            lock(&MAPPED).insert(ptr as usize, (handle as usize, size as u64));
            Ok(())
        })
    }

    /// `hipMemUnmap`.
    ///
    /// # Safety
    /// `ptr` must be the start of a mapping made by `hipMemMap`.
    "hip_5.1" fn hipMemUnmap(ptr: *mut c_void, size: usize) -> hipError_t {
        guard(|| {
            let (h, len) = lock(&MAPPED).remove(&(ptr as usize)).ok_or(hipErrorInvalidValue)?;
            if len != size as u64 {
                lock(&MAPPED).insert(ptr as usize, (h, len));
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: the range was mapped by hipMemMap; it goes back to an inaccessible
            // reservation, as the real call leaves it.
            unsafe {
                libc::mmap(ptr, size, libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED, -1, 0)
            };
            with_physical(h as *mut c_void, |p| p.maps = p.maps.saturating_sub(1))?;
            drop_if_done(h);
            Ok(())
        })
    }

    /// `hipMemSetAccess`: every mapping is already readable and writable.
    ///
    /// # Safety
    /// No pointer is read.
    "hip_5.1" fn hipMemSetAccess(ptr: *mut c_void, _size: usize, _desc: *const c_void, _count: usize) -> hipError_t {
        guard(|| {
            if lock(&MAPPED).range(..=ptr as usize).next_back().is_none() {
                return Err(hipErrorInvalidValue);
            }
            Ok(())
        })
    }
}

/// A copy of `size` bytes; a blocking one first waits for this process's queued work.
///
/// # Safety
/// `dst` and `src` must be valid for `size` bytes.
unsafe fn copy(dst: *mut c_void, src: *const c_void, size: usize, blocking: bool) -> HipResult<()> {
    if size == 0 {
        return Ok(());
    }
    if dst.is_null() || src.is_null() {
        return Err(hipErrorInvalidValue);
    }
    Stream::before_host_access(blocking)?;
    // SAFETY: the caller's contract; the ranges may overlap, which `copy` allows.
    unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), size) };
    Ok(())
}

/// A memset of `size` bytes; a blocking one first waits for this process's queued work.
///
/// # Safety
/// `dst` must be valid for `size` bytes.
unsafe fn set(dst: *mut c_void, value: c_int, size: usize, blocking: bool) -> HipResult<()> {
    if size == 0 {
        return Ok(());
    }
    if dst.is_null() {
        return Err(hipErrorInvalidValue);
    }
    Stream::before_host_access(blocking)?;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_bytes(dst.cast::<u8>(), value as u8, size) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_element_sizes() {
        assert_eq!(round_up(1, DEVICE_PAGE), Some(4096));
        assert_eq!(round_up(4096, DEVICE_PAGE), Some(4096));
        assert_eq!(round_up(u64::MAX, DEVICE_PAGE), None);
        let desc = |x, y, z, w| hipChannelFormatDesc { x, y, z, w, f: 2 };
        assert_eq!(element_bytes(&desc(32, 0, 0, 0)), 4);
        assert_eq!(element_bytes(&desc(8, 8, 8, 8)), 4);
        assert_eq!(element_bytes(&desc(32, 32, 32, 32)), 16);
    }
}
