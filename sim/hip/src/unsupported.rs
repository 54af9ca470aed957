//! What the simulated runtime does not model but CuPy-ROCm links: graphs and stream
//! capture, surfaces. Each answers `hipErrorNotSupported` (the real
//! runtime's answer for a feature a device lacks), so a program that needs one fails
//! at that call with a clear error, and loading the library never fails for want of a
//! symbol.

use std::ffi::{c_char, c_int, c_void};

use crate::*;

hip_api! {
    /// `hipStreamBeginCapture`: not modelled.
    ///
    /// # Safety
    /// No pointers are read.
    "hip_4.3" fn hipStreamBeginCapture(_s: *mut c_void, _mode: c_int) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipStreamEndCapture`: not modelled.
    ///
    /// # Safety
    /// No pointers are read.
    "hip_4.3" fn hipStreamEndCapture(_s: *mut c_void, _graph: *mut *mut c_void) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipGraphDestroy`: no graph can exist.
    ///
    /// # Safety
    /// No pointers are read.
    "hip_4.3" fn hipGraphDestroy(_graph: *mut c_void) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipGraphInstantiate`.
    ///
    /// # Safety
    /// No pointers are read.
    "hip_4.3" fn hipGraphInstantiate(
        _exec: *mut *mut c_void,
        _graph: *mut c_void,
        _error_node: *mut *mut c_void,
        _log: *mut c_char,
        _log_size: usize,
    ) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipGraphLaunch`.
    ///
    /// # Safety
    /// No pointers are read.
    "hip_4.3" fn hipGraphLaunch(_exec: *mut c_void, _s: *mut c_void) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipGraphExecDestroy`.
    ///
    /// # Safety
    /// No pointers are read.
    "hip_4.3" fn hipGraphExecDestroy(_exec: *mut c_void) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipCreateSurfaceObject(hipSurfaceObject_t*, const hipResourceDesc*)`, which
    /// ROCm 5 exports under its C++ name.
    ///
    /// # Safety
    /// No pointers are read.
    "hip_4.2" fn _Z22hipCreateSurfaceObjectPyPK15hipResourceDesc(_out: *mut u64, _desc: *const c_void) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipDestroySurfaceObject(hipSurfaceObject_t)`, under its C++ name.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn _Z23hipDestroySurfaceObjecty(_surface: u64) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }
}
