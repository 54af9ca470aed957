//! Stream-ordered memory and pools. A pool is charged what it holds on the
//! device, its unused reserve included, until the driver says it gave the
//! memory back (see `Governed::pool_alloc` and docs/hook.md): admission
//! charges what the pool must grow by; frees leave the charge where it is;
//! synchronisations, trims and the memory view bring it down to what the
//! driver reports. A stream-ordered allocation inside stream capture is a
//! graph allocation node, charged when the graph is launched (graphs.rs).

use super::*;
use crate::gate::Awaits;
use crate::governor::PoolDriver;

/// The driver's own answers for the pool accounting.
#[derive(Debug)]
pub struct RealPools;

/// The one instance the governor is given.
pub static REAL_POOLS: RealPools = RealPools;

fn attr_u64(f: impl FnOnce(*mut c_void) -> CUresult) -> Option<u64> {
    let mut v: u64 = 0;
    (f(&mut v as *mut u64 as *mut c_void) == OK).then_some(v)
}

impl PoolDriver for RealPools {
    fn pool_usage(&self, pool: usize) -> Option<(u64, u64)> {
        let p = pool as CUmemoryPool;
        let reserved = attr_u64(|v| {
            call_real!(cuMemPoolGetAttribute(
                p,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                v
            ))
        })?;
        let used = attr_u64(|v| {
            call_real!(cuMemPoolGetAttribute(
                p,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                v
            ))
        })?;
        Some((reserved, used))
    }

    fn pool_trim(&self, pool: usize) {
        let _ = call_real!(cuMemPoolTrimTo(pool as CUmemoryPool, 0));
    }

    fn graph_usage(&self, device: CUdevice) -> Option<(u64, u64)> {
        let reserved = attr_u64(|v| {
            call_real!(cuDeviceGetGraphMemAttribute(
                device,
                CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                v
            ))
        })?;
        let used = attr_u64(|v| {
            call_real!(cuDeviceGetGraphMemAttribute(
                device,
                CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
                v
            ))
        })?;
        Some((reserved, used))
    }

    fn graph_trim(&self, device: CUdevice) {
        let _ = call_real!(cuDeviceGraphMemTrim(device));
    }
}

/// The stream a call means: a `_ptsz` call's null stream is the
/// per-thread default stream.
fn stream_of(stream: CUstream, ptsz: bool) -> CUstream {
    if ptsz && stream.is_null() {
        tessera_ffi::cuda_extra::CU_STREAM_PER_THREAD
    } else {
        stream
    }
}

/// The graph being captured on `stream`, if capture is active there.
pub(super) fn capturing(stream: CUstream) -> Option<CUgraph> {
    crate::gate::capture_status(stream)
        .filter(|(s, _)| *s == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
        .map(|(_, graph)| graph)
}

/// Admission of a stream-ordered allocation from `pool` (the device's
/// current pool when `None`) on `stream`.
fn alloc_async(
    g: &Governed,
    dptr: *mut CUdeviceptr,
    bytes: u64,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
    call: impl FnOnce() -> CUresult,
    free_async: impl FnOnce(CUdeviceptr) -> CUresult,
) -> CUresult {
    // Inside capture nothing is allocated: the graph gets an allocation
    // node, whose memory is charged when the graph is launched.
    if let Some(graph) = capturing(stream) {
        let device = g.stream_device(stream).unwrap_or(0);
        let r = call();
        if r == OK {
            g.graph_alloc_node(graph as usize, device, bytes);
        }
        return r;
    }
    let device = match pool.and_then(|p| pool_device(g, p)) {
        Some(Ok(d)) => d,
        // A host pool's memory is not device memory.
        Some(Err(())) => return call(),
        None => match g.stream_device(stream) {
            Ok(d) => d,
            Err(e) => return e,
        },
    };
    let pool = match pool {
        Some(p) => p,
        None => {
            let mut p: CUmemoryPool = std::ptr::null_mut();
            let r = call_real!(cuDeviceGetMemPool(&mut p, device));
            if r != OK {
                return r;
            }
            p
        }
    };
    let Some(drv) = g.pool_driver() else {
        return call();
    };
    g.pool_alloc(
        drv,
        pool as usize,
        device,
        bytes,
        call,
        // SAFETY: read only after the driver succeeded and wrote it.
        || unsafe { out(dptr) },
        |p| {
            let _ = free_async(p);
            let _ = call_real!(cuStreamSynchronize(stream));
        },
    )
}

pub unsafe fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemAllocAsync(dptr, bytesize, stream)));
    alloc_async(
        g,
        dptr,
        bytesize as u64,
        None,
        stream,
        || call_real!(cuMemAllocAsync(dptr, bytesize, stream)),
        |p| call_real!(cuMemFreeAsync(p, stream)),
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
        dptr,
        bytesize as u64,
        None,
        stream_of(stream, true),
        || call_real!(cuMemAllocAsync_ptsz(dptr, bytesize, stream)),
        |p| call_real!(cuMemFreeAsync_ptsz(p, stream)),
    )
}

/// Where a pool allocates: `Some(Ok(dev))` a device, `Some(Err(()))` host
/// memory (not governed), `None` unknown (the stream's device is used).
fn pool_device(g: &Governed, pool: CUmemoryPool) -> Option<Result<CUdevice, ()>> {
    match g.pools.lock().get(&(pool as usize)) {
        Some(Some(d)) => Some(Ok(*d)),
        Some(None) => Some(Err(())),
        None => None,
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
    alloc_async(
        g,
        dptr,
        bytesize as u64,
        Some(pool),
        stream,
        || call_real!(cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream)),
        |p| call_real!(cuMemFreeAsync(p, stream)),
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
    alloc_async(
        g,
        dptr,
        bytesize as u64,
        Some(pool),
        stream_of(stream, true),
        || call_real!(cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream)),
        |p| call_real!(cuMemFreeAsync_ptsz(p, stream)),
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
    let r = g.pool_destroy(pool as usize, || call_real!(cuMemPoolDestroy(pool)));
    if r == OK {
        g.pools.lock().remove(&(pool as usize));
    }
    r
}

pub unsafe fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    let g = governed_or!(call_real!(cuMemPoolTrimTo(pool, keep)));
    g.pool_changed(pool as usize, || call_real!(cuMemPoolTrimTo(pool, keep)))
}

/// Any attribute: a release threshold may be raised (the pool keeps more,
/// and stays charged for it: nothing to admit) or lowered (it gives back
/// at the next synchronisation); the charge follows the driver after.
pub unsafe fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemPoolSetAttribute(pool, attr, value)));
    g.pool_changed(pool as usize, || {
        call_real!(cuMemPoolSetAttribute(pool, attr, value))
    })
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
        let p = unsafe { out(pool) } as usize;
        // A pool the program created keeps the location it was made with.
        g.pools.lock().entry(p).or_insert(Some(dev));
    }
    r
}

// ---------------------------------------------------------------------------
// Synchronisation: pools give back what exceeds their release threshold,
// so a pool freed from since the last look is reconciled (one atomic load
// otherwise).

fn synced(g: &Governed, r: CUresult) -> CUresult {
    use std::sync::atomic::Ordering::Acquire;
    if r == OK && g.pool_slack.load(Acquire) {
        g.reconcile_pools();
    }
    if r == OK && g.sharing.load(Acquire) {
        super::settle_shared(g);
    }
    r
}

// Each wait is marked for the compute arbiter (`gate::while_syncing`): a
// holder waiting on its own work is busy, not idle. An event's device is
// taken to be the current context's (where events are recorded).

fn current_dev(g: &Governed) -> Option<usize> {
    g.current().ok().and_then(|(dev, _)| dev)
}

pub unsafe fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    let g = governed_or!(call_real!(cuStreamSynchronize(stream)));
    let dev = g.device_of_stream(stream);
    let r = crate::gate::while_syncing(g, dev, Awaits::Work, || {
        call_real!(cuStreamSynchronize(stream))
    });
    synced(g, r)
}

pub unsafe fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    let g = governed_or!(call_real!(cuStreamSynchronize_ptsz(stream)));
    let dev = g.device_of_stream(stream);
    let r = crate::gate::while_syncing(g, dev, Awaits::Work, || {
        call_real!(cuStreamSynchronize_ptsz(stream))
    });
    synced(g, r)
}

pub unsafe fn cuCtxSynchronize() -> CUresult {
    let g = governed_or!(call_real!(cuCtxSynchronize()));
    let r = crate::gate::while_syncing(g, current_dev(g), Awaits::Work, || {
        call_real!(cuCtxSynchronize())
    });
    synced(g, r)
}

pub unsafe fn cuEventSynchronize(event: CUevent) -> CUresult {
    let g = governed_or!(call_real!(cuEventSynchronize(event)));
    let r = crate::gate::while_syncing(g, current_dev(g), Awaits::Event, || {
        call_real!(cuEventSynchronize(event))
    });
    synced(g, r)
}
