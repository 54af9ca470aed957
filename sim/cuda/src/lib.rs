//! The simulated `libcuda.so.1`: the CUDA driver API over the simulated node's shared
//! state (`tessera-sim`), with NVIDIA's symbol names and ABI.
//!
//! Every exported function is `unsafe extern "C"`, takes NVIDIA's argument types (checked
//! against the `PFN_cu*` typedefs in [`procaddr`]) and runs its body inside [`guard`], so a
//! panic becomes `CUDA_ERROR_UNKNOWN` instead of unwinding into C. Bodies return
//! `CuResult<()>` and use `?` on `CUresult` errors.
//!
//! What the simulation models and where it differs from a real GPU: `docs/simulator.md`.

#![allow(non_snake_case)]

pub mod array;
pub mod context;
pub mod copy;
pub mod device;
pub mod errors;
pub mod export;
pub mod graph;
pub mod green;
pub mod image;
pub mod ipc;
pub mod launch;
pub mod link;
pub mod managed;
pub mod memop;
pub mod memory;
pub mod module;
pub mod multicast;
pub mod occupancy;
pub mod peer;
pub mod pool;
pub mod procaddr;
pub mod registry;
pub mod runtime;
pub mod share;
pub mod stream;
pub mod tensor_map;
pub mod visible;
pub mod vmm;

use std::panic::{AssertUnwindSafe, catch_unwind};

pub use tessera_ffi::cuda::CUresult;

/// An entry point that takes a stream and its `_ptsz` twin (the same call on the
/// per-thread default stream) from one body, in which the bracketed name is `false` in
/// the first and `true` in the twin: the two differ in nothing else.
///
/// ```ignore
/// crate::ptsz_exports! {
///     /// `cuMemFreeAsync`.
///     ///
///     /// # Safety
///     /// Any pointer value is accepted; unknown ones are reported.
///     fn cuMemFreeAsync / cuMemFreeAsync_ptsz [per_thread](
///         dptr: CUdeviceptr,
///         hStream: CUstream,
///     ) -> CUresult {
///         guard(|| free_async(dptr, hStream, per_thread))
///     }
/// }
/// ```
macro_rules! ptsz_exports {
    ($($(#[$attr:meta])* fn $name:ident / $ptsz:ident [$pt:ident] $params:tt -> $ret:ty $body:block)*) => {$(
        $(#[$attr])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name $params -> $ret {
            let $pt = false;
            $body
        }

        #[doc = concat!(
            "`", stringify!($ptsz), "`: [`", stringify!($name), "`] on the per-thread default stream."
        )]
        ///
        /// # Safety
        #[doc = concat!("As [`", stringify!($name), "`].")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $ptsz $params -> $ret {
            let $pt = true;
            $body
        }
    )*};
}
pub(crate) use ptsz_exports;

/// A driver call's outcome: `Err` carries the `CUresult` to return.
pub type CuResult<T> = Result<T, CUresult>;

/// Runs an export's body: `Ok` is `CUDA_SUCCESS`, `Err(e)` is `e`, and a panic is
/// `CUDA_ERROR_UNKNOWN` (it never crosses into C). With [`errors::ENV_TRACE_ERRORS`] set,
/// every failure is logged with the place of the export that returned it.
#[inline]
#[track_caller]
pub fn guard(body: impl FnOnce() -> CuResult<()>) -> CUresult {
    let rc = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUresult::CUDA_ERROR_UNKNOWN,
    };
    errors::trace_failure(std::panic::Location::caller(), rc);
    rc
}

/// Writes `value` through an output pointer, or fails with `CUDA_ERROR_INVALID_VALUE`
/// when the pointer is null.
///
/// # Safety
/// A non-null `out` must be valid for writing one `T`.
#[inline]
pub unsafe fn put<T>(out: *mut T, value: T) -> CuResult<()> {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller promises it is valid for a write of T.
    unsafe { out.write(value) };
    Ok(())
}

/// Writes `value` through an optional output pointer: nothing when it is null.
///
/// # Safety
/// A non-null `out` must be valid for writing one `T`.
#[inline]
pub unsafe fn put_opt<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-null, and the caller promises it is valid for a write of T.
        unsafe { out.write(value) };
    }
}

/// Reads an input struct through a pointer, or fails with `CUDA_ERROR_INVALID_VALUE`
/// when it is null.
///
/// # Safety
/// A non-null `p` must point to a valid `T`.
#[inline]
pub unsafe fn get<'a, T>(p: *const T) -> CuResult<&'a T> {
    // SAFETY: the caller promises a non-null `p` points to a valid T for the call.
    unsafe { p.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}
