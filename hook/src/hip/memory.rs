//! Linear, managed, pitched and 3D memory, and `hipFree`.

use super::*;
use crate::sizes;

pub unsafe fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> hipError_t {
    let g = governed_or!(call_real!(hipMalloc(ptr, size)));
    admit_current(
        g,
        size as u64,
        || real!(hipMalloc(ptr, size)),
        // SAFETY: read only after the runtime succeeded and wrote it.
        || unsafe { out_ptr(ptr) },
    )
}

pub unsafe fn hipExtMallocWithFlags(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> hipError_t {
    let g = governed_or!(call_real!(hipExtMallocWithFlags(ptr, size, flags)));
    // Fine-grained or uncached device memory: device memory all the same.
    admit_current(
        g,
        size as u64,
        || real!(hipExtMallocWithFlags(ptr, size, flags)),
        // SAFETY: read only after the runtime succeeded and wrote it.
        || unsafe { out_ptr(ptr) },
    )
}

pub unsafe fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> hipError_t {
    let g = governed_or!(call_real!(hipMallocManaged(ptr, size, flags)));
    // Managed memory may migrate, but the limit must hold if it all lands
    // on the device that allocated it.
    admit_current(
        g,
        size as u64,
        || real!(hipMallocManaged(ptr, size, flags)),
        // SAFETY: read only after the runtime succeeded and wrote it.
        || unsafe { out_ptr(ptr) },
    )
}

/// A pitched allocation of `rows` rows of `width` bytes: reserved with rows
/// rounded up to [`sizes::PITCH_ALIGN`] (HIP pads to 256 bytes or less), settled to the real pitch after
/// the call; should the rest not fit, the allocation is freed again and the
/// caller gets out-of-memory.
fn alloc_pitch(
    g: &Governed,
    width: u64,
    rows: u64,
    call: impl FnOnce() -> hipError_t,
    result: impl FnOnce() -> (u64, u64),
) -> hipError_t {
    let index = match current(g) {
        Ok(i) => i,
        Err(e) => return e,
    };
    let estimate = hip_pages(sizes::pitch_estimate(width, rows));
    if let Err(e) = g.reserve(index, estimate) {
        return hip_err(e);
    }
    let r = call();
    if r != OK {
        g.release(index, estimate);
        return r;
    }
    let (ptr, pitch) = result();
    let bytes = hip_pages(pitch.saturating_mul(rows));
    if let Err(e) = g.settle(index, estimate, bytes) {
        let _ = real!(hipFree(ptr as *mut c_void));
        g.release(index, estimate);
        return hip_err(e);
    }
    if let (Some(dev), true) = (index, bytes > 0) {
        g.record(Key::Ptr(ptr), Rec { dev, bytes, ctx: 0 });
    }
    r
}

pub unsafe fn hipMallocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMallocPitch(ptr, pitch, width, height)));
    alloc_pitch(
        g,
        width as u64,
        height as u64,
        || real!(hipMallocPitch(ptr, pitch, width, height)),
        // SAFETY: read only after the runtime succeeded and wrote both.
        || unsafe { (out(ptr, std::ptr::null_mut()) as u64, out(pitch, 0) as u64) },
    )
}

pub unsafe fn hipMemAllocPitch(
    ptr: *mut hipDeviceptr_t,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMemAllocPitch(
        ptr, pitch, width, height, elem
    )));
    alloc_pitch(
        g,
        width as u64,
        height as u64,
        || real!(hipMemAllocPitch(ptr, pitch, width, height, elem)),
        // SAFETY: read only after the runtime succeeded and wrote both.
        || unsafe { (out(ptr, std::ptr::null_mut()) as u64, out(pitch, 0) as u64) },
    )
}

pub unsafe fn hipMalloc3D(pitched: *mut hipPitchedPtr, extent: hipExtent) -> hipError_t {
    let g = governed_or!(call_real!(hipMalloc3D(pitched, extent)));
    // Every slice is `height` pitched rows.
    let rows = (extent.height as u64).saturating_mul(extent.depth as u64);
    alloc_pitch(
        g,
        extent.width as u64,
        rows,
        || real!(hipMalloc3D(pitched, extent)),
        || {
            if pitched.is_null() {
                return (0, 0);
            }
            // SAFETY: non-null, and the runtime succeeded and wrote it.
            let p = unsafe { *pitched };
            (p.ptr as u64, p.pitch as u64)
        },
    )
}

pub unsafe fn hipFree(ptr: *mut c_void) -> hipError_t {
    let g = governed_or!(call_real!(hipFree(ptr)));
    free(g, Key::Ptr(ptr as u64), || real!(hipFree(ptr)))
}
