//! Linear and managed memory.

use super::*;

pub unsafe fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let g = governed_or!(call_real!(cuMemAlloc_v2(dptr, bytesize)));
    admit_current(
        g,
        bytesize as u64,
        || call_real!(cuMemAlloc_v2(dptr, bytesize)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Ptr(unsafe { out(dptr) }),
    )
}

pub unsafe fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult {
    let g = governed_or!(call_real!(cuMemAlloc(dptr, bytesize)));
    admit_current(
        g,
        u64::from(bytesize),
        || call_real!(cuMemAlloc(dptr, bytesize)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Ptr(u64::from(unsafe { out(dptr) })),
    )
}

pub unsafe fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemAllocManaged(dptr, bytesize, flags)));
    // Managed memory may migrate, but it counts against the device of the
    // context that allocated it: the limit must hold if it all lands there.
    admit_current(
        g,
        bytesize as u64,
        || call_real!(cuMemAllocManaged(dptr, bytesize, flags)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Ptr(unsafe { out(dptr) }),
    )
}

/// Pitched allocation: rows are reserved rounded up to
/// [`sizes::PITCH_ALIGN`] before the call, then settled to the real pitch
/// × height, each in whole device pages. Should the driver pad more than
/// that and the rest not fit, the allocation is undone and the caller gets
/// out-of-memory.
fn alloc_pitch(
    g: &Governed,
    width: u64,
    height: u64,
    call: impl FnOnce() -> CUresult,
    result: impl FnOnce() -> (u64, u64),
    undo: impl FnOnce(u64) -> CUresult,
) -> CUresult {
    let (index, ctx) = match g.current() {
        Ok(v) => v,
        Err(e) => return e,
    };
    let estimate = sizes::pages(sizes::pitch_estimate(width, height));
    if let Err(e) = g.reserve(index, estimate) {
        return e;
    }
    let r = call();
    if r != OK {
        g.release(index, estimate);
        return r;
    }
    let (ptr, pitch) = result();
    let bytes = sizes::pages(pitch.saturating_mul(height));
    if let Err(e) = g.settle(index, estimate, bytes) {
        let _ = undo(ptr);
        g.release(index, estimate);
        return e;
    }
    if let (Some(dev), true) = (index, bytes > 0) {
        g.record(
            Key::Ptr(ptr),
            Rec {
                dev,
                bytes,
                ctx: ctx as usize,
            },
        );
    }
    r
}

pub unsafe fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemAllocPitch_v2(
        dptr, pitch, width, height, elem
    )));
    alloc_pitch(
        g,
        width as u64,
        height as u64,
        || call_real!(cuMemAllocPitch_v2(dptr, pitch, width, height, elem)),
        // SAFETY: read only after the driver succeeded and wrote both.
        || unsafe { (out(dptr), out(pitch) as u64) },
        |p| call_real!(cuMemFree_v2(p)),
    )
}

pub unsafe fn cuMemAllocPitch(
    dptr: *mut CUdeviceptr_v1,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemAllocPitch(
        dptr, pitch, width, height, elem
    )));
    alloc_pitch(
        g,
        u64::from(width),
        u64::from(height),
        || call_real!(cuMemAllocPitch(dptr, pitch, width, height, elem)),
        // SAFETY: read only after the driver succeeded and wrote both.
        || unsafe { (u64::from(out(dptr)), u64::from(out(pitch))) },
        |p| call_real!(cuMemFree(p as CUdeviceptr_v1)),
    )
}

pub unsafe fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let g = governed_or!(call_real!(cuMemFree_v2(dptr)));
    free(g, Key::Ptr(dptr), || call_real!(cuMemFree_v2(dptr)))
}

pub unsafe fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult {
    let g = governed_or!(call_real!(cuMemFree(dptr)));
    free(g, Key::Ptr(u64::from(dptr)), || call_real!(cuMemFree(dptr)))
}
