//! Contexts. Each is charged what the driver holds for it: before the
//! driver sees the call, what the manager measured a context to hold on
//! that GPU (the control file's `context_bytes`, else its estimate
//! `context_overhead_bytes`), so that contexts created at once can never
//! take the device past the limit; then, where NVML can say what the
//! process holds on the device, settled to that less everything else the
//! shim charges this process there (a context that does not fit then is
//! destroyed again and refused).

use std::ffi::CString;

use tessera_ffi::nvml::{nvmlDevice_t, nvmlProcessInfo_t, nvmlReturn_t};

use super::*;

/// What the driver holds for this process on `dev` by NVML's per-process
/// accounting, or `None` when NVML cannot say (no NVML, or a process list
/// in another pid namespace with no host pid recorded for this slot).
fn driver_holds(g: &Governed, dev: CUdevice) -> Option<u64> {
    let uuid = g
        .devices
        .visible()
        .iter()
        .find(|v| v.device == dev)?
        .uuid
        .clone();
    let nv_ok = nvmlReturn_t::NVML_SUCCESS;
    if call_real!(nvmlInit_v2()) != nv_ok {
        return None;
    }
    let held = (|| {
        let c = CString::new(uuid).ok()?;
        let mut d: nvmlDevice_t = std::ptr::null_mut();
        if call_real!(nvmlDeviceGetHandleByUUID(c.as_ptr(), &mut d)) != nv_ok {
            return None;
        }
        let mut list = vec![nvmlProcessInfo_t::default(); 256];
        let mut n = list.len() as c_uint;
        let r = call_real!(nvmlDeviceGetComputeRunningProcesses_v3(
            d,
            &mut n,
            list.as_mut_ptr()
        ));
        if r != nv_ok {
            return None;
        }
        let me = std::process::id();
        let host = g
            .member()
            .map(|m| {
                g.files
                    .state
                    .slot(m.slot)
                    .host_pid
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .unwrap_or(0);
        list[..(n as usize).min(list.len())]
            .iter()
            .find(|p| p.pid == me || (host != 0 && p.pid == host))
            .map(|p| p.usedGpuMemory)
    })();
    let _ = call_real!(nvmlShutdown());
    held
}

/// After the driver made a context on `dev` charged `charged` so far:
/// settles the charge to what the driver really holds beyond everything
/// else this process is charged. `Err` when the rest does not fit (the
/// caller undoes the context).
fn settle_context(
    g: &Governed,
    dev: CUdevice,
    index: Option<usize>,
    charged: u64,
) -> Result<u64, CUresult> {
    let (Some(i), Some(m)) = (index, g.member()) else {
        return Ok(charged);
    };
    let Some(held) = driver_holds(g, dev) else {
        return Ok(charged);
    };
    let others = g.files.state.slot_usage(m.slot, i).saturating_sub(charged);
    let real = held.saturating_sub(others);
    if real != charged {
        crate::log!(
            Level::Info,
            "device {i}: a context holds {real} bytes (charged {charged} before the call)"
        );
    }
    g.settle(index, charged, real).map(|()| real)
}

/// What a new context on the allocation's device `index` is charged before
/// the driver sees the call: the manager's measurement for that GPU, else
/// the allocation's estimate.
fn context_charge(g: &Governed, index: Option<usize>) -> u64 {
    match index {
        Some(i) => g.files.control.context_charge(i),
        None => g.files.control.context_overhead(),
    }
}

/// The allocation's index of `dev`, or `CUDA_ERROR_INVALID_DEVICE` for a
/// GPU outside the allocation: no context, primary or created, is made
/// there (it would hold memory outside every limit). The driver sees only
/// the allocation's GPUs (`CUDA_VISIBLE_DEVICES` is pinned at `cuInit`), so
/// this refuses only what that did not stop.
fn inside(g: &Governed, dev: CUdevice) -> Result<Option<usize>, CUresult> {
    match g.index_of(dev) {
        Some(i) => Ok(Some(i)),
        None => Err(CUresult::CUDA_ERROR_INVALID_DEVICE),
    }
}

fn ctx_create(
    g: &Governed,
    pctx: *mut CUcontext,
    dev: CUdevice,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let index = match inside(g, dev) {
        Ok(i) => i,
        Err(e) => return e,
    };
    let overhead = context_charge(g, index);
    if let Err(e) = g.reserve(index, overhead) {
        return e;
    }
    let r = call();
    if r == OK {
        // SAFETY: the driver succeeded and wrote the new context.
        let ctx = unsafe { out(pctx) };
        let charged = match settle_context(g, dev, index, overhead) {
            Ok(c) => c,
            Err(e) => {
                let _ = call_real!(cuCtxDestroy_v2(ctx));
                g.release(index, overhead);
                return e;
            }
        };
        g.contexts
            .lock()
            .created
            .insert(ctx as usize, (index, charged));
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
    let index = match inside(g, dev) {
        Ok(i) => i,
        Err(e) => return e,
    };
    // Held across the driver call so the count here follows the driver's.
    let mut contexts = g.contexts.lock();
    let p = contexts.primary.entry(dev).or_default();
    let charge = if p.refs == 0 {
        context_charge(g, index)
    } else {
        0
    };
    if let Err(e) = g.reserve(index, charge) {
        return e;
    }
    let r = call_real!(cuDevicePrimaryCtxRetain(pctx, dev));
    if r == OK {
        if p.refs == 0 {
            p.charged = match settle_context(g, dev, index, charge) {
                Ok(c) => c,
                Err(e) => {
                    let _ = call_real!(cuDevicePrimaryCtxRelease_v2(dev));
                    g.release(index, charge);
                    return e;
                }
            };
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
