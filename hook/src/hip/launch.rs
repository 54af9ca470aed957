//! Work submission: the gate first, then the runtime. HIP's own launches
//! of its public entry points (a runtime launch going through the module
//! one) pass straight through, gated once.

use super::*;

/// Wrappers whose only step before the runtime is the gate: each gets a
/// body that waits at the gate, then calls its own real entry point.
macro_rules! gated {
    ($($name:ident ($($arg:ident: $ty:ty),* $(,)?);)*) => {
        $(
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $ty),*) -> hipError_t {
                if inside() {
                    return call_real!($name($($arg),*));
                }
                if let Err(e) = gate::before_submit() {
                    return e;
                }
                real!($name($($arg),*))
            }
        )*
    };
}

gated! {
    hipLaunchKernel(f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: usize, stream: hipStream_t);
    hipModuleLaunchKernel(
        f: hipFunction_t, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void,
    );
    hipExtLaunchKernel(
        f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: usize,
        stream: hipStream_t, start: hipEvent_t, stop: hipEvent_t, flags: c_int,
    );
    _Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j(
        f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize,
        stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t,
        stop: hipEvent_t, flags: u32,
    );
    _Z24hipHccModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_(
        f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize,
        stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t,
        stop: hipEvent_t,
    );
    hipExtModuleLaunchKernel(
        f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize,
        stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t,
        stop: hipEvent_t, flags: u32,
    );
    hipHccModuleLaunchKernel(
        f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize,
        stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t,
        stop: hipEvent_t,
    );
    hipLaunchCooperativeKernel(f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: c_uint, stream: hipStream_t);
    hipModuleLaunchCooperativeKernel(
        f: hipFunction_t, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: hipStream_t, params: *mut *mut c_void,
    );
    hipGraphLaunch(exec: hipGraphExec_t, stream: hipStream_t);
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
