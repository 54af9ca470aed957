//! `hipGetProcAddress` (ROCm 6's signature): a function of this library by name, the
//! same address the dynamic linker gives for it, so a caller that gets its entry points
//! this way reaches the same code (and a shim that wraps this call sees every lookup).

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::*;

/// `hipDriverProcAddressQueryResult` values.
const HIP_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
const HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;

/// This library's own handle, found from the address of one of its functions.
fn own_handle() -> HipResult<*mut c_void> {
    // SAFETY: dladdr only reads the address and fills `info`, a valid out struct.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let f = hipGetProcAddress as *const c_void;
    // SAFETY: as above.
    if unsafe { libc::dladdr(f, &mut info) } == 0 || info.dli_fname.is_null() {
        return Err(hipErrorNotFound);
    }
    // SAFETY: dli_fname is the loaded object's path, a C string; RTLD_NOLOAD only finds
    // the already loaded object (this one) and takes a reference to it, never loads code.
    let h = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return Err(hipErrorNotFound);
    }
    Ok(h)
}

hip_api! {
    /// `hipGetProcAddress(symbol, pfn, hipVersion, flags, symbolStatus)`.
    ///
    /// # Safety
    /// `symbol` must be null or a C string; `pfn` and `status` null or writable.
    "hip_4.2" fn hipGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        _hip_version: c_int,
        _flags: u64,
        status: *mut c_int,
    ) -> hipError_t {
        guard(|| {
            if symbol.is_null() || pfn.is_null() {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: non-null, and the caller passes a NUL-terminated name.
            let name = unsafe { CStr::from_ptr(symbol) };
            let found = if name.to_bytes().starts_with(b"hip") {
                let h = own_handle()?;
                // SAFETY: a handle from dlopen and a C string.
                let f = unsafe { libc::dlsym(h, name.as_ptr()) };
                // SAFETY: drops the reference own_handle took; the library stays loaded.
                unsafe { libc::dlclose(h) };
                f
            } else {
                std::ptr::null_mut()
            };
            if !status.is_null() {
                let s = if found.is_null() {
                    HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                } else {
                    HIP_GET_PROC_ADDRESS_SUCCESS
                };
                // SAFETY: non-null; the caller passes a writable pointer.
                unsafe { status.write(s) };
            }
            // SAFETY: checked non-null above.
            unsafe { pfn.write(found) };
            if found.is_null() { Err(hipErrorNotFound) } else { Ok(()) }
        })
    }
}
