//! Initialisation and cuGetProcAddress.

use super::*;

pub unsafe fn cuInit(flags: c_uint) -> CUresult {
    governor::cuda_init(flags, &CORE_HOOKS)
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
