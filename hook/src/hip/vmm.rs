//! Virtual memory management: a physical allocation (`hipMemCreate`) is
//! charged when created, at its size rounded up to the granularity the
//! runtime reports for its properties (never less than asked), and its
//! quota returns once its handle is released and its last mapping unmapped
//! (the ledger's `Vmm`, shared with CUDA).

use super::*;

/// The bytes the runtime holds for `size` with `prop`: rounded up to its
/// minimum granularity, or to HIP pages when it will not say.
///
/// # Safety
///
/// `prop` is null or readable.
unsafe fn vmm_bytes(size: usize, prop: *const hipMemAllocationProp) -> u64 {
    let mut gran: usize = 0;
    let r = real!(hipMemGetAllocationGranularity(
        &mut gran,
        prop,
        hipMemAllocationGranularityMinimum
    ));
    if r != OK || gran == 0 {
        return hip_pages(size as u64);
    }
    (size as u64)
        .checked_next_multiple_of(gran as u64)
        .unwrap_or(crate::sizes::OVERFLOW)
}

pub unsafe fn hipMemCreate(
    handle: *mut hipMemGenericAllocationHandle_t,
    size: usize,
    prop: *const hipMemAllocationProp,
    flags: c_ulonglong,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMemCreate(handle, size, prop, flags)));
    // SAFETY: the caller's properties, or null (the runtime refuses it).
    let Some(p) = (unsafe { prop.as_ref() }) else {
        return real!(hipMemCreate(handle, size, prop, flags));
    };
    let index = g.index_of(p.location.id);
    if let Some(i) = index
        && let Err(e) = ensure_context(g, i)
    {
        return e;
    }
    // SAFETY: `prop` is readable (checked just above).
    let bytes = unsafe { vmm_bytes(size, prop) };
    if let Err(e) = g.reserve(index, bytes) {
        return hip_err(e);
    }
    let r = real!(hipMemCreate(handle, size, prop, flags));
    match (r, index) {
        (OK, Some(dev)) if !handle.is_null() => {
            // SAFETY: the runtime succeeded and wrote it.
            let h = unsafe { *handle } as u64;
            if let Some(old) = g.vmm.lock().created(h, dev, bytes) {
                g.release(Some(old.dev), old.bytes);
            }
        }
        (OK, _) => {}
        _ => g.release(index, bytes),
    }
    r
}

pub unsafe fn hipMemRelease(handle: hipMemGenericAllocationHandle_t) -> hipError_t {
    let g = governed_or!(call_real!(hipMemRelease(handle)));
    let r = real!(hipMemRelease(handle));
    if r == OK
        && let Some(h) = g.vmm.lock().released(handle as u64)
    {
        g.release(Some(h.dev), h.bytes);
    }
    r
}

pub unsafe fn hipMemMap(
    ptr: *mut c_void,
    size: usize,
    offset: usize,
    handle: hipMemGenericAllocationHandle_t,
    flags: c_ulonglong,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMemMap(ptr, size, offset, handle, flags)));
    let r = real!(hipMemMap(ptr, size, offset, handle, flags));
    if r == OK {
        g.vmm.lock().mapped(ptr as u64, size as u64, handle as u64);
    }
    r
}

pub unsafe fn hipMemUnmap(ptr: *mut c_void, size: usize) -> hipError_t {
    let g = governed_or!(call_real!(hipMemUnmap(ptr, size)));
    let r = real!(hipMemUnmap(ptr, size));
    if r == OK {
        let freed = g.vmm.lock().unmapped(ptr as u64, size as u64);
        for h in freed {
            g.release(Some(h.dev), h.bytes);
        }
    }
    r
}
