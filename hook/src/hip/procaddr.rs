//! `hipGetProcAddress` (ROCm 6.1 and later): the runtime answers first; a
//! pointer that is the real entry point of a governed HIP symbol (or any
//! pointer for a governed name) is replaced by the shim's wrapper.

use std::ffi::CStr;

use super::*;
use crate::table::{self, Lib, Sym};

/// What the caller of `hipGetProcAddress(symbol, ...)` gets instead of the
/// runtime's pointer `p`.
pub fn substitute(symbol: &CStr, p: *mut c_void) -> *mut c_void {
    if p.is_null() || Sym::ALL.iter().any(|s| s.governed() && s.wrapper() == p) {
        return p;
    }
    let at: Vec<Sym> = table::governed_at(p)
        .into_iter()
        .filter(|s| s.lib() == Lib::Hip)
        .collect();
    let by_name = Sym::governed_by_name(symbol.to_bytes()).filter(|s| s.lib() == Lib::Hip);
    match (at.first(), by_name) {
        // The runtime's own entry point: the wrapper of exactly that one
        // (a versioned answer such as `hipGetDevicePropertiesR0600` for
        // `hipGetDeviceProperties` keeps its layout).
        (Some(s), _) => s.wrapper(),
        // A pointer that is no exported symbol, for a governed name.
        (None, Some(s)) => s.wrapper(),
        (None, None) => p,
    }
}

pub unsafe fn hipGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> hipError_t {
    let r = real!(hipGetProcAddress(symbol, pfn, version, flags, status));
    if r != OK || symbol.is_null() || pfn.is_null() {
        return r;
    }
    // SAFETY: the runtime succeeded; the caller's name and slot.
    unsafe { *pfn = substitute(CStr::from_ptr(symbol), *pfn) };
    r
}
