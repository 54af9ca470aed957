//! Work submission: the gate first, then the runtime. HIP's own launches
//! of its public entry points (a runtime launch going through the module
//! one) pass straight through, gated once.

use super::*;

/// Wrappers whose only steps around the runtime are the gate and the
/// queue bound: each gets a body that is paced and waits at the gate for
/// work on `stream` (an expression over its arguments), calls its own real
/// entry point, and records the pacer's marker when the runtime took it.
macro_rules! gated {
    ($($name:ident ($($arg:ident: $ty:ty),* $(,)?) on $stream:expr;)*) => {
        $(
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $ty),*) -> hipError_t {
                if inside() {
                    return call_real!($name($($arg),*));
                }
                let stream: Option<hipStream_t> = $stream;
                let paced = match gate::before_submit(stream) {
                    Ok(p) => p,
                    Err(e) => return e,
                };
                let r = real!($name($($arg),*));
                if r == OK {
                    gate::after_submit(paced, stream);
                }
                r
            }
        )*
    };
}

gated! {
    hipLaunchKernel(f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: usize, stream: hipStream_t) on Some(stream);
    hipModuleLaunchKernel(
        f: hipFunction_t, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) on Some(stream);
    hipExtLaunchKernel(
        f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: usize,
        stream: hipStream_t, start: hipEvent_t, stop: hipEvent_t, flags: c_int,
    ) on Some(stream);
    _Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j(
        f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize,
        stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t,
        stop: hipEvent_t, flags: u32,
    ) on Some(stream);
    _Z24hipHccModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_(
        f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize,
        stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t,
        stop: hipEvent_t,
    ) on Some(stream);
    hipExtModuleLaunchKernel(
        f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize,
        stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t,
        stop: hipEvent_t, flags: u32,
    ) on Some(stream);
    hipHccModuleLaunchKernel(
        f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize,
        stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t,
        stop: hipEvent_t,
    ) on Some(stream);
    hipLaunchCooperativeKernel(f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: c_uint, stream: hipStream_t) on Some(stream);
    hipModuleLaunchCooperativeKernel(
        f: hipFunction_t, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: hipStream_t, params: *mut *mut c_void,
    ) on Some(stream);
    hipGraphLaunch(exec: hipGraphExec_t, stream: hipStream_t) on Some(stream);
}

pub unsafe fn hipLaunchCooperativeKernelMultiDevice(
    list: *mut hipLaunchParams,
    n: c_int,
    flags: c_uint,
) -> hipError_t {
    if inside() {
        return call_real!(hipLaunchCooperativeKernelMultiDevice(list, n, flags));
    }
    if let Err(e) = gate::before_submit_all() {
        return e;
    }
    real!(hipLaunchCooperativeKernelMultiDevice(list, n, flags))
}
