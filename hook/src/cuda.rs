//! The CUDA wrapper bodies, one per governed function of `table.rs`:
//! memory admission (reserve before the driver, record or roll back after),
//! the container's view of memory, context overhead, the
//! `cuGetProcAddress` route, and the gate before every submission.
//!
//! Every body of an ungoverned process calls the real function and nothing
//! else. A governed process whose files are bad gets
//! [`governor::CUDA_REFUSED`] from every one of them.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};

use tessera_ffi::cuda::*;

use crate::gate;
use crate::governor::{self, CUDA_REFUSED, Governed, Launch};
use crate::ledger::{Key, Rec};
use crate::log::Level;
use crate::procaddr;
use crate::sizes;
use crate::table::call_real;

const OK: CUresult = CUresult::CUDA_SUCCESS;

/// The governor of a governed process, or: the real call's result for an
/// ungoverned one (`$pass` is evaluated only then), or the refusal.
macro_rules! governed_or {
    ($pass:expr) => {
        match governor::cuda_entry() {
            Ok(Some(g)) => g,
            Ok(None) => return $pass,
            Err(e) => return e,
        }
    };
}

/// Records a live allocation. A key the ledger still held was freed by a
/// route the shim did not see; its quota is returned now.
fn record(g: &Governed, key: Key, rec: Rec) {
    if let Some(old) = g.ledger.insert(key, rec) {
        crate::log!(
            Level::Warn,
            "{key:?} handed out again while recorded live ({} bytes); returning its quota",
            old.bytes
        );
        g.release(Some(old.dev), old.bytes);
    }
}

/// Admission of one allocation on device `index`: reserve, let the driver
/// allocate, then record it under the key it got, or roll back.
fn admit(
    g: &Governed,
    index: Option<usize>,
    ctx: usize,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Key,
) -> CUresult {
    if let Err(e) = g.reserve(index, bytes) {
        return e;
    }
    let r = call();
    match (r, index) {
        (OK, Some(dev)) if bytes > 0 => record(g, key(), Rec { dev, bytes, ctx }),
        (OK, _) => {}
        _ => g.release(index, bytes),
    }
    r
}

/// Admission on the current context's device, owned by that context.
fn admit_current(
    g: &Governed,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Key,
) -> CUresult {
    match g.current() {
        Ok((index, ctx)) => admit(g, index, ctx as usize, bytes, call, key),
        Err(e) => e,
    }
}

/// A free: forget the allocation, let the driver free it, and return its
/// quota only once the driver did (the record is restored if it did not).
fn free(g: &Governed, key: Key, call: impl FnOnce() -> CUresult) -> CUresult {
    let rec = g.ledger.remove(key);
    let r = call();
    if let Some(rec) = rec {
        if r == OK {
            g.release(Some(rec.dev), rec.bytes);
        } else {
            g.ledger.insert(key, rec);
        }
    }
    r
}

/// Returns the quota of everything the driver freed with context `ctx`.
fn context_gone(g: &Governed, ctx: usize) {
    for rec in g.ledger.drain_context(ctx) {
        g.release(Some(rec.dev), rec.bytes);
    }
}

/// Reads `*p` when the driver succeeded and `p` is non-null.
///
/// # Safety
///
/// `p` is null or valid for reads.
unsafe fn out<T: Copy + Default>(p: *const T) -> T {
    if p.is_null() {
        T::default()
    } else {
        // SAFETY: non-null and valid per the contract.
        unsafe { *p }
    }
}

// ---------------------------------------------------------------------------
// Initialisation and cuGetProcAddress.

pub unsafe fn cuInit(flags: c_uint) -> CUresult {
    governor::cuda_init(flags)
}

pub unsafe fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    let r = call_real!(cuGetProcAddress(symbol, pfn, cuda_version, flags));
    if r == OK && !symbol.is_null() && !pfn.is_null() {
        // SAFETY: the driver succeeded: both point where the caller said.
        unsafe { *pfn = procaddr::substitute(CStr::from_ptr(symbol), *pfn, cuda_version, flags) };
    }
    r
}

pub unsafe fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    let r = call_real!(cuGetProcAddress_v2(
        symbol,
        pfn,
        cuda_version,
        flags,
        status
    ));
    if r == OK && !symbol.is_null() && !pfn.is_null() {
        // SAFETY: the driver succeeded: both point where the caller said.
        unsafe { *pfn = procaddr::substitute(CStr::from_ptr(symbol), *pfn, cuda_version, flags) };
    }
    r
}

// ---------------------------------------------------------------------------
// The container's view of memory.

/// The current device's (total, free) as the allocation sees it, from the
/// driver's own figures. `None` leaves the driver's figures as they are.
fn current_view(g: &Governed, free: u64, total: u64) -> Option<(u64, u64)> {
    let (index, _) = g.current().ok()?;
    let (total_v, used) = g.files.view(index, total);
    Some((total_v, total_v.saturating_sub(used).min(free)))
}

pub unsafe fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let g = governed_or!(call_real!(cuMemGetInfo_v2(free, total)));
    let r = call_real!(cuMemGetInfo_v2(free, total));
    if r != OK || free.is_null() || total.is_null() {
        return r;
    }
    // SAFETY: the driver succeeded and wrote both.
    let (f, t) = unsafe { (*free as u64, *total as u64) };
    if let Some((t, f)) = current_view(g, f, t) {
        // SAFETY: as above.
        unsafe {
            *total = t as usize;
            *free = f as usize;
        }
    }
    r
}

pub unsafe fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let g = governed_or!(call_real!(cuMemGetInfo(free, total)));
    let r = call_real!(cuMemGetInfo(free, total));
    if r != OK || free.is_null() || total.is_null() {
        return r;
    }
    // SAFETY: the driver succeeded and wrote both.
    let (f, t) = unsafe { (u64::from(*free), u64::from(*total)) };
    if let Some((t, f)) = current_view(g, f, t) {
        // SAFETY: as above; both are at most the driver's own values.
        unsafe {
            *total = t as c_uint;
            *free = f as c_uint;
        }
    }
    r
}

pub unsafe fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDeviceTotalMem_v2(bytes, dev)));
    let r = call_real!(cuDeviceTotalMem_v2(bytes, dev));
    if r == OK && !bytes.is_null() {
        // SAFETY: the driver succeeded and wrote it.
        unsafe { *bytes = g.files.view(g.index_of(dev), *bytes as u64).0 as usize };
    }
    r
}

pub unsafe fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDeviceTotalMem(bytes, dev)));
    let r = call_real!(cuDeviceTotalMem(bytes, dev));
    if r == OK && !bytes.is_null() {
        // SAFETY: the driver succeeded and wrote it; the view is at most it.
        unsafe { *bytes = g.files.view(g.index_of(dev), u64::from(*bytes)).0 as c_uint };
    }
    r
}

// ---------------------------------------------------------------------------
// Contexts.

fn ctx_create(
    g: &Governed,
    pctx: *mut CUcontext,
    dev: CUdevice,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let index = g.index_of(dev);
    let overhead = g.files.control.context_overhead();
    if let Err(e) = g.reserve(index, overhead) {
        return e;
    }
    let r = call();
    if r == OK {
        // SAFETY: the driver succeeded and wrote the new context.
        let ctx = unsafe { out(pctx) } as usize;
        g.contexts.lock().created.insert(ctx, (index, overhead));
    } else {
        g.release(index, overhead);
    }
    r
}

pub unsafe fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuCtxCreate(pctx, flags, dev)));
    ctx_create(g, pctx, dev, || call_real!(cuCtxCreate(pctx, flags, dev)))
}

pub unsafe fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuCtxCreate_v2(pctx, flags, dev)));
    ctx_create(g, pctx, dev, || {
        call_real!(cuCtxCreate_v2(pctx, flags, dev))
    })
}

pub unsafe fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut CUexecAffinityParam,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let g = governed_or!(call_real!(cuCtxCreate_v3(
        pctx, params, num_params, flags, dev
    )));
    ctx_create(g, pctx, dev, || {
        call_real!(cuCtxCreate_v3(pctx, params, num_params, flags, dev))
    })
}

pub unsafe fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let g = governed_or!(call_real!(cuCtxCreate_v4(pctx, params, flags, dev)));
    ctx_create(g, pctx, dev, || {
        call_real!(cuCtxCreate_v4(pctx, params, flags, dev))
    })
}

fn ctx_destroy(g: &Governed, ctx: CUcontext, call: impl FnOnce() -> CUresult) -> CUresult {
    let r = call();
    if r == OK {
        let charged = g.contexts.lock().created.remove(&(ctx as usize));
        if let Some((index, bytes)) = charged {
            g.release(index, bytes);
        }
        context_gone(g, ctx as usize);
    }
    r
}

pub unsafe fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    let g = governed_or!(call_real!(cuCtxDestroy(ctx)));
    ctx_destroy(g, ctx, || call_real!(cuCtxDestroy(ctx)))
}

pub unsafe fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let g = governed_or!(call_real!(cuCtxDestroy_v2(ctx)));
    ctx_destroy(g, ctx, || call_real!(cuCtxDestroy_v2(ctx)))
}

pub unsafe fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDevicePrimaryCtxRetain(pctx, dev)));
    let index = g.index_of(dev);
    // Held across the driver call so the count here follows the driver's.
    let mut contexts = g.contexts.lock();
    let p = contexts.primary.entry(dev).or_default();
    let charge = if p.refs == 0 {
        g.files.control.context_overhead()
    } else {
        0
    };
    if let Err(e) = g.reserve(index, charge) {
        return e;
    }
    let r = call_real!(cuDevicePrimaryCtxRetain(pctx, dev));
    if r == OK {
        if p.refs == 0 {
            p.charged = charge;
            p.index = index;
        }
        p.refs += 1;
        // SAFETY: the driver succeeded and wrote the context.
        p.ctx = unsafe { out(pctx) } as usize;
    } else {
        g.release(index, charge);
    }
    r
}

fn primary_release(g: &Governed, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let mut contexts = g.contexts.lock();
    let r = call();
    if r != OK {
        return r;
    }
    let Some(p) = contexts.primary.get_mut(&dev) else {
        return r;
    };
    p.refs = p.refs.saturating_sub(1);
    if p.refs == 0 {
        // The driver destroyed the context and everything in it.
        let p = *p;
        contexts.primary.remove(&dev);
        g.release(p.index, p.charged);
        context_gone(g, p.ctx);
    }
    r
}

pub unsafe fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDevicePrimaryCtxRelease(dev)));
    primary_release(g, dev, || call_real!(cuDevicePrimaryCtxRelease(dev)))
}

pub unsafe fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDevicePrimaryCtxRelease_v2(dev)));
    primary_release(g, dev, || call_real!(cuDevicePrimaryCtxRelease_v2(dev)))
}

fn primary_reset(g: &Governed, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let contexts = g.contexts.lock();
    let r = call();
    if r == OK
        && let Some(p) = contexts.primary.get(&dev)
    {
        // Every allocation of the primary context is gone; the context
        // itself (and its charge) stays while it is retained.
        context_gone(g, p.ctx);
    }
    r
}

pub unsafe fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDevicePrimaryCtxReset(dev)));
    primary_reset(g, dev, || call_real!(cuDevicePrimaryCtxReset(dev)))
}

pub unsafe fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDevicePrimaryCtxReset_v2(dev)));
    primary_reset(g, dev, || call_real!(cuDevicePrimaryCtxReset_v2(dev)))
}

// ---------------------------------------------------------------------------
// Linear and managed memory.

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
/// × height. Should the driver pad more than that and the rest not fit,
/// the allocation is undone and the caller gets out-of-memory.
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
    let estimate = sizes::pitch_estimate(width, height);
    if let Err(e) = g.reserve(index, estimate) {
        return e;
    }
    let r = call();
    if r != OK {
        g.release(index, estimate);
        return r;
    }
    let (ptr, pitch) = result();
    let bytes = pitch.saturating_mul(height);
    if let Err(e) = g.settle(index, estimate, bytes) {
        let _ = undo(ptr);
        g.release(index, estimate);
        return e;
    }
    if let (Some(dev), true) = (index, bytes > 0) {
        record(
            g,
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

// ---------------------------------------------------------------------------
// Stream-ordered memory. What a pool hands out is counted when it is handed
// out and returned at `cuMemFreeAsync`; memory a pool keeps in reserve
// after frees is not counted (see docs/hook.md).

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

// ---------------------------------------------------------------------------
// Virtual memory management: physical allocations are what is counted
// (address reservations use none). The driver frees one when its handle is
// released and its last mapping unmapped, in either order; so does the
// quota (see ledger::Vmm).

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
    let bytes = size as u64;
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
            g.release(Some(h.dev), h.bytes);
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
            g.release(Some(h.dev), h.bytes);
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

// ---------------------------------------------------------------------------
// Arrays, sized from their descriptors (see sizes.rs).

/// Sparse and deferred-mapping arrays have no memory of their own until
/// mapped onto `cuMemCreate` allocations, which are counted.
fn unbacked(flags: c_uint) -> bool {
    flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0
}

pub unsafe fn cuArrayCreate_v2(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let g = governed_or!(call_real!(cuArrayCreate_v2(handle, desc)));
    if desc.is_null() {
        return call_real!(cuArrayCreate_v2(handle, desc));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = sizes::array_bytes(d.Width as u64, d.Height as u64, d.Format, d.NumChannels);
    admit_current(
        g,
        bytes,
        || call_real!(cuArrayCreate_v2(handle, desc)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Array(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuArrayCreate(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR_v1,
) -> CUresult {
    let g = governed_or!(call_real!(cuArrayCreate(handle, desc)));
    if desc.is_null() {
        return call_real!(cuArrayCreate(handle, desc));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = sizes::array_bytes(d.Width.into(), d.Height.into(), d.Format, d.NumChannels);
    admit_current(
        g,
        bytes,
        || call_real!(cuArrayCreate(handle, desc)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Array(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuArray3DCreate_v2(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let g = governed_or!(call_real!(cuArray3DCreate_v2(handle, desc)));
    if desc.is_null() {
        return call_real!(cuArray3DCreate_v2(handle, desc));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = if unbacked(d.Flags) {
        0
    } else {
        sizes::array3d_bytes(
            d.Width as u64,
            d.Height as u64,
            d.Depth as u64,
            d.Format,
            d.NumChannels,
        )
    };
    admit_current(
        g,
        bytes,
        || call_real!(cuArray3DCreate_v2(handle, desc)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Array(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuArray3DCreate(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1,
) -> CUresult {
    let g = governed_or!(call_real!(cuArray3DCreate(handle, desc)));
    if desc.is_null() {
        return call_real!(cuArray3DCreate(handle, desc));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = if unbacked(d.Flags) {
        0
    } else {
        sizes::array3d_bytes(
            d.Width.into(),
            d.Height.into(),
            d.Depth.into(),
            d.Format,
            d.NumChannels,
        )
    };
    admit_current(
        g,
        bytes,
        || call_real!(cuArray3DCreate(handle, desc)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Array(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuArrayDestroy(handle: CUarray) -> CUresult {
    let g = governed_or!(call_real!(cuArrayDestroy(handle)));
    free(g, Key::Array(handle as usize), || {
        call_real!(cuArrayDestroy(handle))
    })
}

pub unsafe fn cuMipmappedArrayCreate(
    handle: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let g = governed_or!(call_real!(cuMipmappedArrayCreate(handle, desc, levels)));
    if desc.is_null() {
        return call_real!(cuMipmappedArrayCreate(handle, desc, levels));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = if unbacked(d.Flags) {
        0
    } else {
        sizes::mipmapped_bytes(
            d.Width as u64,
            d.Height as u64,
            d.Depth as u64,
            d.Format,
            d.NumChannels,
            d.Flags,
            levels,
        )
    };
    admit_current(
        g,
        bytes,
        || call_real!(cuMipmappedArrayCreate(handle, desc, levels)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Mipmapped(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult {
    let g = governed_or!(call_real!(cuMipmappedArrayDestroy(handle)));
    free(g, Key::Mipmapped(handle as usize), || {
        call_real!(cuMipmappedArrayDestroy(handle))
    })
}

// ---------------------------------------------------------------------------
// Work submission: the gate first, then the driver. The hot path: one
// atomic load (joined) or two (ungoverned), no lock, no system call.

#[inline(always)]
fn submit(stream: CUstream) -> Result<(), CUresult> {
    match governor::for_launch() {
        Launch::Pass => Ok(()),
        Launch::Gate(g) => gate::before_submit(g, stream),
        Launch::Refuse => Err(CUDA_REFUSED),
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if let Err(e) = submit(stream) {
        return e;
    }
    call_real!(cuLaunchKernel(
        f, gx, gy, gz, bx, by, bz, shared, stream, params, extra
    ))
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if let Err(e) = submit(stream) {
        return e;
    }
    call_real!(cuLaunchKernel_ptsz(
        f, gx, gy, gz, bx, by, bz, shared, stream, params, extra
    ))
}

/// The stream of a `cuLaunchKernelEx` configuration.
///
/// # Safety
///
/// `config` is null or readable.
unsafe fn config_stream(config: *const CUlaunchConfig) -> CUstream {
    if config.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: non-null and readable per the contract.
        unsafe { (*config).hStream }
    }
}

pub unsafe fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller passes a readable configuration (or null).
    if let Err(e) = submit(unsafe { config_stream(config) }) {
        return e;
    }
    call_real!(cuLaunchKernelEx(config, f, params, extra))
}

pub unsafe fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller passes a readable configuration (or null).
    if let Err(e) = submit(unsafe { config_stream(config) }) {
        return e;
    }
    call_real!(cuLaunchKernelEx_ptsz(config, f, params, extra))
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    if let Err(e) = submit(stream) {
        return e;
    }
    call_real!(cuLaunchCooperativeKernel(
        f, gx, gy, gz, bx, by, bz, shared, stream, params
    ))
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    if let Err(e) = submit(stream) {
        return e;
    }
    call_real!(cuLaunchCooperativeKernel_ptsz(
        f, gx, gy, gz, bx, by, bz, shared, stream, params
    ))
}

pub unsafe fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
    flags: c_uint,
) -> CUresult {
    if !list.is_null() {
        for i in 0..num_devices as usize {
            // SAFETY: the caller passes `num_devices` readable entries.
            let stream = unsafe { (*list.add(i)).hStream };
            if let Err(e) = submit(stream) {
                return e;
            }
        }
    } else if let Err(e) = submit(std::ptr::null_mut()) {
        return e;
    }
    call_real!(cuLaunchCooperativeKernelMultiDevice(
        list,
        num_devices,
        flags
    ))
}

pub unsafe fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    if let Err(e) = submit(stream) {
        return e;
    }
    call_real!(cuGraphLaunch(exec, stream))
}

pub unsafe fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    if let Err(e) = submit(stream) {
        return e;
    }
    call_real!(cuGraphLaunch_ptsz(exec, stream))
}

pub unsafe fn cuLaunch(f: CUfunction) -> CUresult {
    if let Err(e) = submit(std::ptr::null_mut()) {
        return e;
    }
    call_real!(cuLaunch(f))
}

pub unsafe fn cuLaunchGrid(f: CUfunction, width: c_int, height: c_int) -> CUresult {
    if let Err(e) = submit(std::ptr::null_mut()) {
        return e;
    }
    call_real!(cuLaunchGrid(f, width, height))
}

pub unsafe fn cuLaunchGridAsync(
    f: CUfunction,
    width: c_int,
    height: c_int,
    stream: CUstream,
) -> CUresult {
    if let Err(e) = submit(stream) {
        return e;
    }
    call_real!(cuLaunchGridAsync(f, width, height, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver;
    use crate::table::{Sym, exports};
    use std::sync::atomic::{AtomicUsize, Ordering};

    // This test process has no Tessera allocation: every governed function
    // must reach the (fake) driver with its arguments untouched and return
    // the driver's result untouched.

    unsafe extern "C" fn fake_alloc(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
        // SAFETY: the test passes a valid pointer.
        unsafe { *dptr = 0xdead_0000 + size as u64 };
        CUresult(77)
    }

    static LAUNCHES: AtomicUsize = AtomicUsize::new(0);

    #[allow(clippy::too_many_arguments)]
    unsafe extern "C" fn fake_launch(
        _f: CUfunction,
        gx: c_uint,
        _gy: c_uint,
        _gz: c_uint,
        _bx: c_uint,
        _by: c_uint,
        _bz: c_uint,
        _shared: c_uint,
        stream: CUstream,
        _params: *mut *mut c_void,
        _extra: *mut *mut c_void,
    ) -> CUresult {
        LAUNCHES.fetch_add(gx as usize + stream as usize, Ordering::SeqCst);
        OK
    }

    #[test]
    fn ungoverned_calls_pass_straight_through() {
        driver::set_entry(Sym::cuMemAlloc_v2, fake_alloc as *mut c_void);
        let mut p = 0;
        // SAFETY: a valid out-pointer.
        let r = unsafe { exports::cuMemAlloc_v2(&mut p, 16) };
        assert_eq!(r, CUresult(77));
        assert_eq!(p, 0xdead_0010);

        driver::set_entry(Sym::cuLaunchKernel_ptsz, fake_launch as *mut c_void);
        use std::ptr::null_mut as null;
        // SAFETY: the fake reads nothing through its pointers.
        let r = unsafe {
            exports::cuLaunchKernel_ptsz(
                null(),
                5,
                1,
                1,
                1,
                1,
                1,
                0,
                0x100 as CUstream,
                null(),
                null(),
            )
        };
        assert_eq!(r, OK);
        assert_eq!(LAUNCHES.load(Ordering::SeqCst), 0x105);
    }

    #[test]
    fn a_function_the_driver_lacks_is_not_found() {
        // SAFETY: the handle is never dereferenced.
        let r = unsafe { exports::cuMipmappedArrayDestroy(std::ptr::null_mut()) };
        assert_eq!(r, CUresult::CUDA_ERROR_NOT_FOUND);
    }

    #[test]
    fn get_proc_address_hands_out_the_wrapper_of_the_variant_returned() {
        // A fake driver whose cuGetProcAddress hands out its own per-thread
        // launch for "cuLaunchKernel" with the per-thread flag.
        unsafe extern "C" fn fake_gpa(
            symbol: *const c_char,
            pfn: *mut *mut c_void,
            _v: c_int,
            flags: cuuint64_t,
        ) -> CUresult {
            // SAFETY: the test passes valid pointers.
            let name = unsafe { CStr::from_ptr(symbol) };
            let p = match (name.to_bytes(), flags) {
                (b"cuLaunchKernel", 2) => fake_launch as *mut c_void,
                (b"cuMemcpy", _) => 0x4242 as *mut c_void,
                _ => return CUresult::CUDA_ERROR_NOT_FOUND,
            };
            // SAFETY: as above.
            unsafe { *pfn = p };
            OK
        }
        driver::set_entry(Sym::cuGetProcAddress, fake_gpa as *mut c_void);
        driver::set_entry(Sym::cuLaunchKernel_ptsz, fake_launch as *mut c_void);
        let mut p = std::ptr::null_mut();
        // SAFETY: valid name and out-pointer.
        let r = unsafe { exports::cuGetProcAddress(c"cuLaunchKernel".as_ptr(), &mut p, 12000, 2) };
        assert_eq!(r, OK);
        assert_eq!(p, Sym::cuLaunchKernel_ptsz.wrapper());
        // Ungoverned: the driver's own pointer.
        // SAFETY: as above.
        let r = unsafe { exports::cuGetProcAddress(c"cuMemcpy".as_ptr(), &mut p, 12000, 0) };
        assert_eq!(r, OK);
        assert_eq!(p, 0x4242 as *mut c_void);
        // The driver's error, untouched.
        // SAFETY: as above.
        let r = unsafe { exports::cuGetProcAddress(c"cuNothing".as_ptr(), &mut p, 12000, 0) };
        assert_eq!(r, CUresult::CUDA_ERROR_NOT_FOUND);
    }

    #[test]
    fn a_panicking_body_returns_an_error_instead_of_unwinding() {
        let r: CUresult = crate::guard(|| panic!("a bug in a wrapper"));
        assert_eq!(r, CUresult::CUDA_ERROR_UNKNOWN);
    }
}
