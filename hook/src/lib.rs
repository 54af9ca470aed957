//! `libtessera.so`, the LD_PRELOAD shim: it governs the CUDA driver and NVML
//! calls of a process inside a Tessera allocation (memory admission, the
//! container's view of memory, the compute gate) and passes everything else
//! straight to the real libraries. See `docs/hook.md`.
//!
//! Layout:
//! - [`table`]: the one list of governed functions; it generates the
//!   exports, the real-entry-point table and the lookups of the routes;
//! - [`driver`]: finding the real `dlsym` and the real libraries;
//! - [`interpose`]: the `dlsym` route; [`procaddr`]: the `cuGetProcAddress`
//!   route;
//! - [`config`], [`governor`]: whether a process is governed, joining its
//!   allocation, failing closed, fork and exit;
//! - [`ledger`], [`sizes`], [`devices`]: pure admission bookkeeping;
//! - [`cuda`], [`nvml`], [`hip`]: the wrapper bodies; [`gate`]: the compute
//!   gate's call site; [`pace`], [`pacer`]: the queue bound (the decision,
//!   and its event plumbing for either vendor).

pub mod config;
pub mod cuda;
pub mod devices;
pub mod driver;
pub mod gate;
pub mod governor;
pub mod hip;
pub mod interpose;
pub mod ledger;
pub mod log;
pub mod nvml;
pub mod pace;
pub mod pacer;
pub mod procaddr;
pub mod sizes;
pub mod table;

use std::panic::{AssertUnwindSafe, catch_unwind};

use tessera_ffi::cuda::CUresult;
use tessera_ffi::nvml::nvmlReturn_t;

/// Return codes of exported functions: what to answer when the body
/// panicked, and when the real library lacks the function.
pub trait FfiResult: Copy {
    const PANICKED: Self;
    const MISSING: Self;
}

impl FfiResult for CUresult {
    const PANICKED: Self = CUresult::CUDA_ERROR_UNKNOWN;
    const MISSING: Self = CUresult::CUDA_ERROR_NOT_FOUND;
}

impl FfiResult for tessera_ffi::hip::hipError_t {
    const PANICKED: Self = tessera_ffi::hip::hipErrorUnknown;
    const MISSING: Self = tessera_ffi::hip::hipErrorNotFound;
}

impl FfiResult for tessera_ffi::rocm_smi::rsmi_status_t {
    const PANICKED: Self = tessera_ffi::rocm_smi::RSMI_STATUS_INTERNAL_EXCEPTION;
    const MISSING: Self = tessera_ffi::rocm_smi::RSMI_STATUS_NOT_SUPPORTED;
}

impl FfiResult for nvmlReturn_t {
    const PANICKED: Self = nvmlReturn_t::NVML_ERROR_UNKNOWN;
    const MISSING: Self = nvmlReturn_t::NVML_ERROR_FUNCTION_NOT_FOUND;
}

/// Runs an exported function's body; a panic becomes an error code, never
/// an unwind across the C boundary.
#[inline(always)]
pub(crate) fn guard<R: FfiResult>(body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(R::PANICKED)
}

/// The "missing function" code of `R`, for [`table::real!`].
pub(crate) fn missing<R: FfiResult>() -> R {
    R::MISSING
}
