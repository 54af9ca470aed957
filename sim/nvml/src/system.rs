//! System queries: driver and NVML versions, process names.

use super::*;

/// `nvmlSystemGetDriverVersion`.
///
/// # Safety
/// `version` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        node()?;
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(version, length, DRIVER_VERSION) }
    })
}

/// `nvmlSystemGetNVMLVersion`.
///
/// # Safety
/// `version` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(version, length, &format!("12.{DRIVER_VERSION}")) }
    })
}

tessera_sim::exports! {
    /// `nvmlSystemGetCudaDriverVersion`, `nvmlSystemGetCudaDriverVersion_v2`.
    ///
    /// # Safety
    /// `v` must be null or writable.
    fn [nvmlSystemGetCudaDriverVersion, nvmlSystemGetCudaDriverVersion_v2](v: *mut c_int) -> nvmlReturn_t {
        // SAFETY: the caller passes a writable pointer or null (rejected).
        guard(|| unsafe { put(v, CUDA_DRIVER_VERSION) })
    }
}
