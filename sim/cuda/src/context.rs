//! Contexts: primary contexts (retain/release/reset/flags/state), `cuCtxCreate`/`Destroy`,
//! the per-thread context stack, context synchronisation, limits and the persisting-L2
//! reset. Peer access between contexts is in `peer`.

use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tessera_ffi::cuda::*;

use crate::registry::{Registry, handle_of};
use crate::runtime::{self, Runtime, current, rt};
use crate::stream::StreamState;
use crate::{CuResult, guard, put};

/// Every live context of this process, by handle.
pub static CONTEXTS: Registry<Context> = Registry::new();
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A context: a device, its own legacy default stream, and the completion time of the
/// last work queued in it.
#[derive(Debug)]
pub struct Context {
    pub id: u64,
    pub device: usize,
    pub primary: bool,
    pub flags: AtomicU32,
    /// Completion time (CLOCK_MONOTONIC ns) of the last work queued in this context.
    pub last_end: AtomicU64,
    pub destroyed: AtomicBool,
    /// The context's legacy default stream (`NULL` / `CU_STREAM_LEGACY`).
    pub legacy: StreamState,
    pub limits: Mutex<BTreeMap<u32, usize>>,
    pub cache_config: AtomicU32,
    /// Device memory the context holds for itself (the node's context memory when it was
    /// created), charged to the device until the context is destroyed.
    pub overhead: u64,
}

impl Context {
    #[inline]
    pub fn check(&self) -> CuResult<()> {
        if self.destroyed.load(Ordering::Acquire) {
            Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED)
        } else {
            Ok(())
        }
    }

    /// Records work queued in this context that completes at `end`.
    #[inline]
    pub fn note_end(&self, end: u64) {
        self.last_end.fetch_max(end, Ordering::AcqRel);
    }

    /// Waits for everything queued in the context so far, then lets memory pools
    /// release what they keep beyond their threshold (a synchronisation point).
    pub fn synchronize(&self, rt: &Runtime) {
        rt.costs.wait_for(self.last_end.load(Ordering::Acquire));
        crate::memory::trim_pools_after_sync(rt, self.device);
    }
}

/// Creates and registers a context on `device`, charging the device the memory a
/// context holds for itself (`CUDA_ERROR_OUT_OF_MEMORY` when it does not fit, as on a
/// full GPU).
pub fn create(rt: &Runtime, device: usize, flags: u32, primary: bool) -> CuResult<Arc<Context>> {
    let overhead = rt.node.context_memory();
    rt.charge(device, overhead)?;
    let ctx = Arc::new(Context {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        device,
        primary,
        flags: AtomicU32::new(flags),
        last_end: AtomicU64::new(0),
        destroyed: AtomicBool::new(false),
        legacy: StreamState::default(),
        limits: Mutex::new(BTreeMap::new()),
        cache_config: AtomicU32::new(0),
        overhead,
    });
    CONTEXTS.insert(ctx.clone());
    rt.context_count(device, 1);
    Ok(ctx)
}

/// Frees everything that belongs to a context (memory, modules, streams, events).
fn release_resources(rt: &Runtime, ctx: &Arc<Context>) {
    crate::memory::free_context(rt, ctx.id);
    crate::module::unload_context(ctx.id);
    crate::stream::destroy_context_objects(ctx.id);
}

/// Destroys a context: its resources are freed and its handle becomes invalid.
pub fn destroy(rt: &Runtime, ctx: &Arc<Context>) {
    if ctx.destroyed.swap(true, Ordering::AcqRel) {
        return;
    }
    release_resources(rt, ctx);
    CONTEXTS.remove(handle_of(ctx));
    rt.uncharge(ctx.device, ctx.overhead);
    rt.context_count(ctx.device, -1);
    runtime::forget_current(ctx);
}

/// Looks up a context handle.
pub fn lookup(h: CUcontext) -> CuResult<Arc<Context>> {
    let ctx = CONTEXTS
        .get(h as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    ctx.check()?;
    Ok(ctx)
}

fn as_handle(ctx: &Arc<Context>) -> CUcontext {
    handle_of(ctx) as CUcontext
}

/// Flags a context accepts: scheduling (bits 0-2), map host, resize local memory,
/// coredump/sync-memops bits of newer drivers.
const CTX_FLAGS_MASK: u32 = 0x3f | 0x100 | 0x200;

fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CuResult<()> {
    let rt = rt()?;
    let d = rt.device(dev)?;
    if flags & !CTX_FLAGS_MASK != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if pctx.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    rt.check_device(d.index)?;
    let ctx = create(rt, d.index, flags, false)?;
    // SAFETY: checked non-null above; the caller passes a writable CUcontext.
    unsafe { pctx.write(as_handle(&ctx)) };
    runtime::push_current(ctx)
}

tessera_sim::exports! {
    /// `cuCtxCreate_v2` and `cuCtxCreate` (the pre-3.2 symbol; same arguments).
    ///
    /// # Safety
    /// `pctx` must be null or writable.
    fn [cuCtxCreate, cuCtxCreate_v2](
        pctx: *mut CUcontext,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult {
        guard(|| ctx_create(pctx, flags, dev))
    }
}

/// `cuCtxCreate_v3`: execution-affinity parameters are accepted only when empty (the
/// simulated device has no SM partitioning).
///
/// # Safety
/// `pctx` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    paramsArray: *mut CUexecAffinityParam,
    numParams: i32,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        if numParams < 0 || (numParams > 0 && paramsArray.is_null()) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if numParams > 0 {
            return Err(CUresult::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
        }
        ctx_create(pctx, flags, dev)
    })
}

/// `cuCtxCreate_v4`: `ctxCreateParams` may be null; affinity or CIG parameters are not
/// supported.
///
/// # Safety
/// `pctx` must be null or writable; `ctxCreateParams` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    ctxCreateParams: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller passes null or a valid CUctxCreateParams.
        if let Some(p) = unsafe { ctxCreateParams.as_ref() }
            && (p.numExecAffinityParams != 0 || !p.cigParams.is_null())
        {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        ctx_create(pctx, flags, dev)
    })
}

fn ctx_destroy(ctx: CUcontext) -> CuResult<()> {
    let rt = rt()?;
    let c = lookup(ctx)?;
    if c.primary {
        // Primary contexts are released, not destroyed.
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    destroy(rt, &c);
    Ok(())
}

tessera_sim::exports! {
    /// `cuCtxDestroy`, `cuCtxDestroy_v2`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    fn [cuCtxDestroy, cuCtxDestroy_v2](ctx: CUcontext) -> CUresult {
        guard(|| ctx_destroy(ctx))
    }
}

fn push(ctx: CUcontext) -> CuResult<()> {
    rt()?;
    runtime::push_current(lookup(ctx)?)
}

tessera_sim::exports! {
    /// `cuCtxPushCurrent`, `cuCtxPushCurrent_v2`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    fn [cuCtxPushCurrent, cuCtxPushCurrent_v2](ctx: CUcontext) -> CUresult {
        guard(|| push(ctx))
    }
}

fn pop(pctx: *mut CUcontext) -> CuResult<()> {
    rt()?;
    let c = runtime::pop_current()?;
    if !pctx.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { pctx.write(as_handle(&c)) };
    }
    Ok(())
}

tessera_sim::exports! {
    /// `cuCtxPopCurrent`, `cuCtxPopCurrent_v2`.
    ///
    /// # Safety
    /// `pctx` must be null or writable.
    fn [cuCtxPopCurrent, cuCtxPopCurrent_v2](pctx: *mut CUcontext) -> CUresult {
        guard(|| pop(pctx))
    }
}

/// `cuCtxSetCurrent`: NULL unbinds the current context.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| {
        rt()?;
        if ctx.is_null() {
            runtime::set_current(None)
        } else {
            runtime::set_current(Some(lookup(ctx)?))
        }
    })
}

/// `cuCtxGetCurrent`: NULL when no context is current.
///
/// # Safety
/// `pctx` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        rt()?;
        let h = runtime::current_raw().map_or(std::ptr::null_mut(), |c| as_handle(&c));
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pctx, h) }
    })
}

/// `cuCtxGetDevice`.
///
/// # Safety
/// `device` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let c = current()?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(device, rt.ordinal(c.device)) }
    })
}

/// `cuCtxGetFlags`.
///
/// # Safety
/// `flags` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    guard(|| {
        rt()?;
        let c = current()?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(flags, c.flags.load(Ordering::Relaxed)) }
    })
}

/// `cuCtxSetFlags`.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    guard(|| {
        rt()?;
        let c = current()?;
        if flags & !CTX_FLAGS_MASK != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        c.flags.store(flags, Ordering::Relaxed);
        Ok(())
    })
}

/// `cuCtxGetId`.
///
/// # Safety
/// `ctxId` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, ctxId: *mut u64) -> CUresult {
    guard(|| {
        rt()?;
        let c = if ctx.is_null() {
            current()?
        } else {
            lookup(ctx)?
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(ctxId, c.id) }
    })
}

/// `cuCtxSynchronize`: waits for all work queued in the current context.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        let rt = rt()?;
        let c = current()?;
        rt.check_device(c.device)?;
        c.synchronize(rt);
        Ok(())
    })
}

/// `cuCtxGetApiVersion`: 3020, as the real driver reports for contexts of the `_v2` API.
///
/// # Safety
/// `version` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    guard(|| {
        rt()?;
        if ctx.is_null() {
            current()?;
        } else {
            lookup(ctx)?;
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(version, 3020) }
    })
}

fn default_limit(limit: CUlimit) -> CuResult<usize> {
    Ok(match limit {
        CUlimit::CU_LIMIT_STACK_SIZE => 1024,
        CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE => 1 << 20,
        CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE => 8 << 20,
        CUlimit::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH => 2,
        CUlimit::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => 2048,
        CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY => 32,
        CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE => 0,
        // What a block may use at most (the device's opt-in maximum). The two CIG limits
        // (CUDA in graphics contexts) are 0: no context here is one. cuBLASLt 13 reads
        // CU_LIMIT_CIG_ENABLED when it initialises a handle, and leaves the handle's
        // architecture unset when the query fails.
        CUlimit::CU_LIMIT_SHMEM_SIZE => 227 << 10,
        CUlimit::CU_LIMIT_CIG_ENABLED => 0,
        CUlimit::CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED => 0,
        _ => return Err(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT),
    })
}

/// `cuCtxGetLimit`.
///
/// # Safety
/// `pvalue` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(pvalue: *mut usize, limit: CUlimit) -> CUresult {
    guard(|| {
        rt()?;
        let c = current()?;
        let v = match c
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&limit.0)
        {
            Some(v) => *v,
            None => default_limit(limit)?,
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pvalue, v) }
    })
}

/// `cuCtxSetLimit`.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult {
    guard(|| {
        rt()?;
        let c = current()?;
        default_limit(limit)?;
        c.limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(limit.0, value);
        Ok(())
    })
}

/// `cuCtxGetStreamPriorityRange`: least 0, greatest -5, as on recent GPUs.
///
/// # Safety
/// Both pointers must be null or writable (null ones are skipped).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    leastPriority: *mut i32,
    greatestPriority: *mut i32,
) -> CUresult {
    guard(|| {
        rt()?;
        current()?;
        if !leastPriority.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { leastPriority.write(0) };
        }
        if !greatestPriority.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { greatestPriority.write(-5) };
        }
        Ok(())
    })
}

/// `cuCtxGetCacheConfig`.
///
/// # Safety
/// `pconfig` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCacheConfig(pconfig: *mut CUfunc_cache) -> CUresult {
    guard(|| {
        rt()?;
        let c = current()?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe {
            put(
                pconfig,
                CUfunc_cache(c.cache_config.load(Ordering::Relaxed)),
            )
        }
    })
}

/// `cuCtxSetCacheConfig`.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCacheConfig(config: CUfunc_cache) -> CUresult {
    guard(|| {
        rt()?;
        let c = current()?;
        if config.0 > 3 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        c.cache_config.store(config.0, Ordering::Relaxed);
        Ok(())
    })
}

// ---- primary contexts ----

/// `cuDevicePrimaryCtxRetain`: creates the device's primary context on first use.
///
/// # Safety
/// `pctx` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let d = rt.device(dev)?;
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        rt.check_device(d.index)?;
        let mut p = d.primary.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = match &p.ctx {
            Some(c) => c.clone(),
            None => {
                let c = create(rt, d.index, p.flags, true)?;
                p.ctx = Some(c.clone());
                c
            }
        };
        p.refs += 1;
        // SAFETY: checked non-null above.
        unsafe { pctx.write(as_handle(&ctx)) };
        Ok(())
    })
}

fn primary_release(dev: CUdevice) -> CuResult<()> {
    let rt = rt()?;
    let d = rt.device(dev)?;
    let mut p = d.primary.lock().unwrap_or_else(|e| e.into_inner());
    if p.refs == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refs -= 1;
    if p.refs == 0
        && let Some(c) = p.ctx.take()
    {
        destroy(rt, &c);
    }
    Ok(())
}

tessera_sim::exports! {
    /// `cuDevicePrimaryCtxRelease`, `cuDevicePrimaryCtxRelease_v2`.
    ///
    /// # Safety
    /// No pointer arguments.
    fn [cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2](dev: CUdevice) -> CUresult {
        guard(|| primary_release(dev))
    }
}

fn primary_reset(dev: CUdevice) -> CuResult<()> {
    let rt = rt()?;
    let d = rt.device(dev)?;
    let p = d.primary.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = &p.ctx {
        c.synchronize(rt);
        release_resources(rt, c);
    }
    Ok(())
}

tessera_sim::exports! {
    /// `cuDevicePrimaryCtxReset`, `cuDevicePrimaryCtxReset_v2`: frees everything allocated
    /// in the primary context; the retained handle stays usable.
    ///
    /// # Safety
    /// No pointer arguments.
    fn [cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2](dev: CUdevice) -> CUresult {
        guard(|| primary_reset(dev))
    }
}

fn primary_set_flags(dev: CUdevice, flags: c_uint) -> CuResult<()> {
    let rt = rt()?;
    let d = rt.device(dev)?;
    if flags & !CTX_FLAGS_MASK != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut p = d.primary.lock().unwrap_or_else(|e| e.into_inner());
    p.flags = flags;
    if let Some(c) = &p.ctx {
        c.flags.store(flags, Ordering::Relaxed);
    }
    Ok(())
}

tessera_sim::exports! {
    /// `cuDevicePrimaryCtxSetFlags`, `cuDevicePrimaryCtxSetFlags_v2`.
    ///
    /// # Safety
    /// No pointer arguments.
    fn [cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags_v2](dev: CUdevice, flags: c_uint) -> CUresult {
        guard(|| primary_set_flags(dev, flags))
    }
}

/// `cuDevicePrimaryCtxGetState`.
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut i32,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let d = rt.device(dev)?;
        if flags.is_null() || active.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let p = d.primary.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: both checked non-null above.
        unsafe {
            flags.write(p.flags);
            active.write(i32::from(p.ctx.is_some()));
        }
        Ok(())
    })
}

/// `cuCtxResetPersistingL2Cache`: no persisting L2 lines exist here; success in a context.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    guard(|| {
        rt()?;
        crate::stream::resolve(std::ptr::null_mut(), false).map(|_| ())
    })
}
