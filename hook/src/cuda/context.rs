//! Contexts.

use super::*;

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
