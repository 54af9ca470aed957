//! Work submission: the gate first, then the driver. The hot path: one
//! atomic load (joined) or two (ungoverned), no lock, no system call.

use super::*;

/// `Ok(Some(dev))`: the launch is paced on `dev` (see `pace.rs`); its
/// marker is recorded by [`gate::after_submit`] once the driver took it.
#[inline(always)]
fn submit(stream: CUstream) -> Result<Option<usize>, CUresult> {
    match governor::for_launch() {
        Launch::Pass => Ok(None),
        Launch::Gate(g) => gate::before_submit(g, stream),
        Launch::Refuse => Err(CUDA_REFUSED),
    }
}

/// The driver's answer, after recording the pacer's marker when it took
/// the work.
#[inline(always)]
fn submitted(r: CUresult, paced: Option<usize>, stream: CUstream) -> CUresult {
    if r == CUresult::CUDA_SUCCESS {
        gate::after_submit(paced, stream);
    }
    r
}

/// Wrappers whose only step before the driver is the gate: each name listed
/// gets a body that submits on `stream` (an expression over its arguments),
/// then calls its own real entry point with the same arguments. A macro, not
/// a generic helper taking the real call as a closure, so each wrapper stays
/// what it was written as by hand: an inlined gate and one direct call, with
/// the default and `_ptsz` flavours sharing one parameter list.
macro_rules! gated {
    ($([$($name:ident),+] $params:tt on $stream:expr;)*) => {
        $($(gated!(@one $name $params $stream);)+)*
    };
    (@one $name:ident ($($arg:ident: $ty:ty),* $(,)?) $stream:expr) => {
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name($($arg: $ty),*) -> CUresult {
            let stream = $stream;
            let paced = match submit(stream) {
                Ok(p) => p,
                Err(e) => return e,
            };
            submitted(call_real!($name($($arg),*)), paced, stream)
        }
    };
}

gated! {
    [cuLaunchKernel, cuLaunchKernel_ptsz] (
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) on stream;
    [cuLaunchKernelEx, cuLaunchKernelEx_ptsz] (
        config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) on
        // SAFETY: the caller passes a readable configuration (or null).
        unsafe { config_stream(config) };
    [cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz] (
        f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: CUstream, params: *mut *mut c_void,
    ) on stream;
    [cuLaunch] (f: CUfunction) on std::ptr::null_mut();
    [cuLaunchGrid] (f: CUfunction, width: c_int, height: c_int) on std::ptr::null_mut();
    [cuLaunchGridAsync] (f: CUfunction, width: c_int, height: c_int, stream: CUstream) on stream;
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

pub unsafe fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
    flags: c_uint,
) -> CUresult {
    if !list.is_null() {
        for i in 0..num_devices as usize {
            // SAFETY: the caller passes `num_devices` readable entries.
            let stream = unsafe { (*list.add(i)).hStream };
            // Several devices: the gate for each, no pacing (the pacer's
            // markers are per launch on one stream).
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
            Ok(paced) => submitted(g.graph_launch(exec as usize, call), paced, stream),
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
