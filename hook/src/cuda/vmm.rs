//! Virtual memory management: physical allocations are what is counted
//! (address reservations use none). The driver frees one when its handle is
//! released and its last mapping unmapped, in either order; so does the
//! quota (see ledger::Vmm).

use super::*;

pub unsafe fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemCreate(handle, size, prop, flags)));
    if prop.is_null() {
        return call_real!(cuMemCreate(handle, size, prop, flags));
    }
    // SAFETY: non-null; the caller passes a readable property struct.
    let loc = unsafe { (*prop).location };
    if loc.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
        return call_real!(cuMemCreate(handle, size, prop, flags));
    }
    let index = g.index_of(loc.id);
    // The driver refuses a size that is not a multiple of the granularity;
    // should one ever take it, it holds whole pages.
    let bytes = sizes::pages(size as u64);
    if let Err(e) = g.reserve(index, bytes) {
        return e;
    }
    let r = call_real!(cuMemCreate(handle, size, prop, flags));
    match (r, index) {
        (OK, Some(dev)) if bytes > 0 => {
            // SAFETY: the driver succeeded and wrote it.
            let h = unsafe { out(handle) };
            let old = g.vmm.lock().created(h, dev, bytes);
            if let Some(old) = old {
                g.release(Some(old.dev), old.bytes);
            }
        }
        (OK, _) => {}
        _ => g.release(index, bytes),
    }
    r
}

pub unsafe fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    let g = governed_or!(call_real!(cuMemRelease(handle)));
    let r = call_real!(cuMemRelease(handle));
    if r == OK {
        let freed = g.vmm.lock().released(handle);
        if let Some(h) = freed {
            vmm_freed(g, h);
        }
    }
    r
}

pub unsafe fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemMap(ptr, size, offset, handle, flags)));
    let r = call_real!(cuMemMap(ptr, size, offset, handle, flags));
    if r == OK {
        g.vmm.lock().mapped(ptr, size as u64, handle);
    }
    r
}

pub unsafe fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let g = governed_or!(call_real!(cuMemUnmap(ptr, size)));
    let r = call_real!(cuMemUnmap(ptr, size));
    if r == OK {
        let freed = g.vmm.lock().unmapped(ptr, size as u64);
        for h in freed {
            vmm_freed(g, h);
        }
    }
    r
}

pub unsafe fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemRetainAllocationHandle(handle, addr)));
    let r = call_real!(cuMemRetainAllocationHandle(handle, addr));
    if r == OK {
        // SAFETY: the driver succeeded and wrote it.
        g.vmm.lock().retained(unsafe { out(handle) });
    }
    r
}
