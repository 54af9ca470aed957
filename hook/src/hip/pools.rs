//! Stream-ordered memory and pools, accounted as CUDA's are
//! (`governor::pools`, docs/hook.md): a pool is charged what it holds on the
//! device, its unused reserve included, until the runtime says it gave the
//! memory back. Admission charges what the pool must grow by; `hipFreeAsync`
//! leaves the charge where it is (HIP pools keep freed memory up to their
//! release threshold); synchronisations, `hipMemPoolTrimTo`, attribute
//! changes, the memory view and an admission over the limit bring it down
//! to what the runtime reports (`hipMemPoolAttrReservedMemCurrent`).

use super::*;
use crate::gate::Awaits;
use crate::governor::PoolDriver;

/// `hipMemLocationTypeDevice`.
const LOCATION_DEVICE: c_int = 1;

/// The runtime's own answers for the pool accounting.
#[derive(Debug)]
pub struct RealPools;

/// The one instance the HIP governor is handed.
pub static REAL_POOLS: RealPools = RealPools;

fn attr_u64(pool: usize, attr: c_int) -> Option<u64> {
    let mut v: u64 = 0;
    let r = real!(hipMemPoolGetAttribute(
        pool as hipMemPool_t,
        attr,
        &mut v as *mut u64 as *mut c_void
    ));
    (r == OK).then_some(v)
}

impl PoolDriver for RealPools {
    fn pool_usage(&self, pool: usize) -> Option<(u64, u64)> {
        Some((
            attr_u64(pool, hipMemPoolAttrReservedMemCurrent)?,
            attr_u64(pool, hipMemPoolAttrUsedMemCurrent)?,
        ))
    }

    fn pool_trim(&self, pool: usize) {
        let _ = real!(hipMemPoolTrimTo(pool as hipMemPool_t, 0));
    }

    // HIP 5.2 has no graph memory (no allocation nodes, no
    // `hipDeviceGetGraphMemAttribute`): nothing to ask, nothing to trim.
    fn graph_usage(&self, _device: c_int) -> Option<(u64, u64)> {
        None
    }

    fn graph_trim(&self, _device: c_int) {}

    fn page(&self) -> u64 {
        HIP_PAGE
    }
}

/// The governor's CUDA-typed result of a HIP call made inside it, with the
/// HIP code kept to be returned as it was.
fn as_cu(r: hipError_t, keep: &Cell<hipError_t>) -> CUresult {
    keep.set(r);
    if r == OK {
        CUresult::CUDA_SUCCESS
    } else {
        CUresult::CUDA_ERROR_UNKNOWN
    }
}

/// What a governor answer means for the caller: the runtime's own code when
/// the runtime was called, else the governor's refusal in HIP's words.
fn answer(r: CUresult, called: &Cell<Option<hipError_t>>) -> hipError_t {
    match (r, called.get()) {
        (CUresult::CUDA_SUCCESS, _) => OK,
        (CUresult::CUDA_ERROR_UNKNOWN, Some(h)) => h,
        (e, _) => hip_err(e),
    }
}

/// The HIP device the calling thread is on, its context charged.
fn current_device(g: &Governed) -> Result<c_int, hipError_t> {
    current(g)?;
    let mut dev: c_int = 0;
    check(real!(hipGetDevice(&mut dev)))?;
    Ok(dev)
}

/// Admission of a stream-ordered allocation of `size` bytes from `pool` on
/// HIP device `device`.
fn alloc_async(
    g: &Governed,
    ptr: *mut *mut c_void,
    size: usize,
    pool: hipMemPool_t,
    device: c_int,
    stream: hipStream_t,
    call: impl FnOnce() -> hipError_t,
) -> hipError_t {
    let Some(drv) = g.pool_driver() else {
        return call();
    };
    let called = Cell::new(None);
    let r = g.pool_alloc(
        drv,
        pool as usize,
        device,
        hip_pages(size as u64),
        || {
            let h = call();
            called.set(Some(h));
            if h == OK {
                CUresult::CUDA_SUCCESS
            } else {
                CUresult::CUDA_ERROR_UNKNOWN
            }
        },
        // SAFETY: read only after the runtime succeeded and wrote it.
        || unsafe { out(ptr, std::ptr::null_mut()) } as u64,
        |p| {
            let _ = real!(hipFreeAsync(p as *mut c_void, stream));
            let _ = real!(hipStreamSynchronize(stream));
        },
    );
    answer(r, &called)
}

pub unsafe fn hipMallocAsync(
    ptr: *mut *mut c_void,
    size: usize,
    stream: hipStream_t,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMallocAsync(ptr, size, stream)));
    // HIP 5 cannot say a stream's device; streams are made on the current
    // device, where the runtime allocates.
    let device = match current_device(g) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let mut pool: hipMemPool_t = std::ptr::null_mut();
    let r = real!(hipDeviceGetMemPool(&mut pool, device));
    if r != OK {
        return r;
    }
    alloc_async(g, ptr, size, pool, device, stream, || {
        real!(hipMallocAsync(ptr, size, stream))
    })
}

pub unsafe fn hipMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: hipMemPool_t,
    stream: hipStream_t,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMallocFromPoolAsync(ptr, size, pool, stream)));
    let known = g.pools.lock().get(&(pool as usize)).copied();
    let device = match known {
        Some(Some(d)) => {
            if let Some(i) = g.index_of(d)
                && let Err(e) = ensure_context(g, i)
            {
                return e;
            }
            d
        }
        // A pool the shim has not seen made: the runtime's own check of the
        // handle comes first; the current device is charged.
        _ => match current_device(g) {
            Ok(d) => d,
            Err(e) => return e,
        },
    };
    alloc_async(g, ptr, size, pool, device, stream, || {
        real!(hipMallocFromPoolAsync(ptr, size, pool, stream))
    })
}

pub unsafe fn hipFreeAsync(ptr: *mut c_void, stream: hipStream_t) -> hipError_t {
    let g = governed_or!(call_real!(hipFreeAsync(ptr, stream)));
    free(g, Key::Ptr(ptr as u64), || real!(hipFreeAsync(ptr, stream)))
}

pub unsafe fn hipMemPoolCreate(pool: *mut hipMemPool_t, props: *const c_void) -> hipError_t {
    let g = governed_or!(call_real!(hipMemPoolCreate(pool, props)));
    let r = real!(hipMemPoolCreate(pool, props));
    if r == OK && !props.is_null() && !pool.is_null() {
        // SAFETY: the runtime accepted both: `props` is a readable
        // `hipMemPoolProps` (allocType, handleTypes, then a hipMemLocation
        // of two ints), and it wrote `pool`.
        let (kind, id, p) = unsafe {
            let loc = props.cast::<c_int>().add(2);
            (loc.read(), loc.add(1).read(), *pool)
        };
        let dev = (kind == LOCATION_DEVICE).then_some(id);
        g.pools.lock().insert(p as usize, dev);
    }
    r
}

pub unsafe fn hipMemPoolDestroy(pool: hipMemPool_t) -> hipError_t {
    let g = governed_or!(call_real!(hipMemPoolDestroy(pool)));
    let keep = Cell::new(OK);
    let r = g.pool_destroy(pool as usize, || {
        as_cu(real!(hipMemPoolDestroy(pool)), &keep)
    });
    if r == CUresult::CUDA_SUCCESS {
        g.pools.lock().remove(&(pool as usize));
    }
    keep.get()
}

pub unsafe fn hipMemPoolTrimTo(pool: hipMemPool_t, keep_bytes: usize) -> hipError_t {
    let g = governed_or!(call_real!(hipMemPoolTrimTo(pool, keep_bytes)));
    let keep = Cell::new(OK);
    g.pool_changed(pool as usize, || {
        as_cu(real!(hipMemPoolTrimTo(pool, keep_bytes)), &keep)
    });
    keep.get()
}

/// Any attribute: a raised release threshold keeps more (already charged,
/// nothing to admit), a lowered one gives back at the next
/// synchronisation; the charge follows the runtime after.
pub unsafe fn hipMemPoolSetAttribute(
    pool: hipMemPool_t,
    attr: c_int,
    value: *mut c_void,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMemPoolSetAttribute(pool, attr, value)));
    let keep = Cell::new(OK);
    g.pool_changed(pool as usize, || {
        as_cu(real!(hipMemPoolSetAttribute(pool, attr, value)), &keep)
    });
    keep.get()
}

pub unsafe fn hipDeviceGetDefaultMemPool(pool: *mut hipMemPool_t, dev: c_int) -> hipError_t {
    let g = governed_or!(call_real!(hipDeviceGetDefaultMemPool(pool, dev)));
    let r = real!(hipDeviceGetDefaultMemPool(pool, dev));
    if r == OK && !pool.is_null() {
        // SAFETY: the runtime succeeded and wrote it.
        let p = unsafe { *pool } as usize;
        g.pools.lock().insert(p, Some(dev));
    }
    r
}

pub unsafe fn hipDeviceGetMemPool(pool: *mut hipMemPool_t, dev: c_int) -> hipError_t {
    let g = governed_or!(call_real!(hipDeviceGetMemPool(pool, dev)));
    let r = real!(hipDeviceGetMemPool(pool, dev));
    if r == OK && !pool.is_null() {
        // SAFETY: the runtime succeeded and wrote it.
        let p = unsafe { *pool } as usize;
        // A pool the program created keeps the location it was made with.
        g.pools.lock().entry(p).or_insert(Some(dev));
    }
    r
}

// Synchronisation: each wait is marked for the compute arbiter
// (`gate::while_syncing`: a holder waiting on its own work keeps its grant,
// as CUDA's do); pools give back what exceeds their release threshold,
// so a pool freed from since the last look is reconciled, and exported
// memory importers have closed since is settled (one atomic load each
// otherwise).

fn synced(g: &Governed, r: hipError_t) -> hipError_t {
    if r == OK && g.pool_slack.load(Ordering::Acquire) {
        g.reconcile_pools();
    }
    if r == OK && g.sharing.load(Ordering::Acquire) {
        crate::cuda::ipc::settle_shared(g);
    }
    r
}

pub unsafe fn hipStreamSynchronize(stream: hipStream_t) -> hipError_t {
    let g = governed_or!(call_real!(hipStreamSynchronize(stream)));
    synced(
        g,
        gate::while_syncing(g, Awaits::Work, || real!(hipStreamSynchronize(stream))),
    )
}

pub unsafe fn hipDeviceSynchronize() -> hipError_t {
    let g = governed_or!(call_real!(hipDeviceSynchronize()));
    synced(
        g,
        gate::while_syncing(g, Awaits::Work, || real!(hipDeviceSynchronize())),
    )
}

pub unsafe fn hipEventSynchronize(event: hipEvent_t) -> hipError_t {
    let g = governed_or!(call_real!(hipEventSynchronize(event)));
    synced(
        g,
        gate::while_syncing(g, Awaits::Event, || real!(hipEventSynchronize(event))),
    )
}
