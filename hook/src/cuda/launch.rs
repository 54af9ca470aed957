//! Work submission: the gate first, then the driver. The hot path: one
//! atomic load (joined) or two (ungoverned), no lock, no system call.

use super::*;

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

/// A graph launch: the gate, then the memory its allocation nodes map
/// (one atomic load when the process never used graph memory).
fn graph_launch(exec: CUgraphExec, stream: CUstream, call: impl FnOnce() -> CUresult) -> CUresult {
    match governor::for_launch() {
        Launch::Pass => call(),
        Launch::Gate(g) => match gate::before_submit(g, stream) {
            Ok(()) => g.graph_launch(exec as usize, call),
            Err(e) => e,
        },
        Launch::Refuse => CUDA_REFUSED,
    }
}

pub unsafe fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    graph_launch(exec, stream, || call_real!(cuGraphLaunch(exec, stream)))
}

pub unsafe fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    graph_launch(exec, stream, || {
        call_real!(cuGraphLaunch_ptsz(exec, stream))
    })
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
