//! Stream-ordered memory. What a pool hands out is counted when it is handed
//! out and returned at `cuMemFreeAsync`; memory a pool keeps in reserve
//! after frees is not counted (see docs/hook.md).

use super::*;

/// Admission of a pool allocation on device `dev` (or the current one).
fn alloc_async(
    g: &Governed,
    dev: Option<CUdevice>,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Key,
) -> CUresult {
    let index = match dev {
        Some(d) => g.index_of(d),
        None => match g.current() {
            Ok((index, _)) => index,
            Err(e) => return e,
        },
    };
    // Pool memory is not freed with a context: recorded under none.
    admit(g, index, 0, bytes, call, key)
}

pub unsafe fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemAllocAsync(dptr, bytesize, stream)));
    alloc_async(
        g,
        None,
        bytesize as u64,
        || call_real!(cuMemAllocAsync(dptr, bytesize, stream)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Ptr(unsafe { out(dptr) }),
    )
}

pub unsafe fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemAllocAsync_ptsz(dptr, bytesize, stream)));
    alloc_async(
        g,
        None,
        bytesize as u64,
        || call_real!(cuMemAllocAsync_ptsz(dptr, bytesize, stream)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Ptr(unsafe { out(dptr) }),
    )
}

/// Where a pool allocates: `Ok(Some(dev))` a device, `Ok(None)` unknown
/// (the current device is assumed), `Err(())` host memory (not governed).
fn pool_device(g: &Governed, pool: CUmemoryPool) -> Result<Option<CUdevice>, ()> {
    match g.pools.lock().get(&(pool as usize)) {
        Some(Some(d)) => Ok(Some(*d)),
        Some(None) => Err(()),
        None => Ok(None),
    }
}

pub unsafe fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemAllocFromPoolAsync(
        dptr, bytesize, pool, stream
    )));
    let Ok(dev) = pool_device(g, pool) else {
        return call_real!(cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream));
    };
    alloc_async(
        g,
        dev,
        bytesize as u64,
        || call_real!(cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Ptr(unsafe { out(dptr) }),
    )
}

pub unsafe fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemAllocFromPoolAsync_ptsz(
        dptr, bytesize, pool, stream
    )));
    let Ok(dev) = pool_device(g, pool) else {
        return call_real!(cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream));
    };
    alloc_async(
        g,
        dev,
        bytesize as u64,
        || call_real!(cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Ptr(unsafe { out(dptr) }),
    )
}

pub unsafe fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let g = governed_or!(call_real!(cuMemFreeAsync(dptr, stream)));
    free(g, Key::Ptr(dptr), || {
        call_real!(cuMemFreeAsync(dptr, stream))
    })
}

pub unsafe fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let g = governed_or!(call_real!(cuMemFreeAsync_ptsz(dptr, stream)));
    free(g, Key::Ptr(dptr), || {
        call_real!(cuMemFreeAsync_ptsz(dptr, stream))
    })
}

pub unsafe fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult {
    let g = governed_or!(call_real!(cuMemPoolCreate(pool, props)));
    let r = call_real!(cuMemPoolCreate(pool, props));
    if r == OK && !props.is_null() {
        // SAFETY: the driver accepted both: props is readable, pool written.
        let (loc, p) = unsafe { ((*props).location, out(pool)) };
        let dev = (loc.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE).then_some(loc.id);
        g.pools.lock().insert(p as usize, dev);
    }
    r
}

pub unsafe fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    let g = governed_or!(call_real!(cuMemPoolDestroy(pool)));
    let r = call_real!(cuMemPoolDestroy(pool));
    if r == OK {
        g.pools.lock().remove(&(pool as usize));
    }
    r
}

pub unsafe fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDeviceGetDefaultMemPool(pool, dev)));
    let r = call_real!(cuDeviceGetDefaultMemPool(pool, dev));
    if r == OK {
        // SAFETY: the driver succeeded and wrote it.
        g.pools
            .lock()
            .insert(unsafe { out(pool) } as usize, Some(dev));
    }
    r
}

pub unsafe fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDeviceGetMemPool(pool, dev)));
    let r = call_real!(cuDeviceGetMemPool(pool, dev));
    if r == OK {
        // SAFETY: the driver succeeded and wrote it.
        g.pools
            .lock()
            .insert(unsafe { out(pool) } as usize, Some(dev));
    }
    r
}
