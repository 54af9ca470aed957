//! `CUDART_INTERFACE` (`6bd5fb6c-5bf4-e74a-8987-d93912fd9df9`), 13 slots: how the runtime
//! registers the fat binaries compiled into a program and finds a device's primary
//! context.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 104 |
//! | 1 | load a module from a `__fatBinC_Wrapper_t` | `cuModuleLoadFatBinary` of the wrapper |
//! | 2 | the primary context of a device | retained once per device, for the life of the process |
//! | 6 | as 1, with three more arguments | as 1 when they are null/0, else `CUDA_ERROR_NOT_SUPPORTED` |
//! | 7 | takes a word, returns nothing | does nothing |
//! | 8 | as 6, given the fat binary itself | as 6 |
//! | 12 | load the JIT compilers | success (nothing to load) |
//! | others | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |

use std::ffi::{c_uint, c_void};

use tessera_ffi::cuda::{CUcontext, CUdevice, CUmodule, CUresult};

use super::{Slots, guid, say, size_slot, stub, tracing};
use crate::guard;

pub const GUID: [u8; 16] = guid("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9");
pub(super) const T: usize = 0;
const N: usize = 13;

pub static TABLE: Slots<N> = Slots([
    size_slot(N),
    load_wrapped as *const c_void,
    primary_context as *const c_void,
    stub::<T, 3>(),
    stub::<T, 4>(),
    stub::<T, 5>(),
    load_wrapped_ext as *const c_void,
    ignore_word as *const c_void,
    load_fatbin_ext as *const c_void,
    stub::<T, 9>(),
    stub::<T, 10>(),
    stub::<T, 11>(),
    load_compilers as *const c_void,
]);

/// Loads the fat binary (a `__fatBinC_Wrapper_t` or a bare container) at `image` as a
/// module of the current context; the module loader recognises both and validates them.
fn load_fatbin(module: *mut CUmodule, image: *const c_void) -> CUresult {
    if module.is_null() || image.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `module` is non-null and writable by the caller's contract; `image` is the
    // runtime's registered image, which the loader reads only to the extent its headers
    // claim, through process_vm_readv.
    unsafe { crate::module::cuModuleLoadFatBinary(module, image) }
}

/// Slot 1: `(CUmodule *out, const __fatBinC_Wrapper_t *wrapper) -> CUresult`.
unsafe extern "C" fn load_wrapped(module: *mut CUmodule, wrapper: *const c_void) -> CUresult {
    trace(1, wrapper, load_fatbin(module, wrapper))
}

/// With `TESSERA_SIM_TRACE_EXPORT`, logs which loading slot the runtime used and how it
/// went; returns `rc`.
fn trace(slot: usize, image: *const c_void, rc: CUresult) -> CUresult {
    if tracing() {
        // The log must not unwind into C (formatting cannot panic here, but be sure).
        let _ = std::panic::catch_unwind(|| {
            say(&format!(
                "CUDART_INTERFACE slot {slot}: image {image:p}: {rc:?}"
            ))
        });
    }
    rc
}

/// Slot 6: `(CUmodule *out, const __fatBinC_Wrapper_t *, void *, void *, unsigned)`.
unsafe extern "C" fn load_wrapped_ext(
    module: *mut CUmodule,
    wrapper: *const c_void,
    a: *mut c_void,
    b: *mut c_void,
    c: c_uint,
) -> CUresult {
    if !a.is_null() || !b.is_null() || c != 0 {
        return trace(6, wrapper, CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    trace(6, wrapper, load_fatbin(module, wrapper))
}

/// Slot 8: `(const fatBinaryHeader *, CUmodule *out, void *, void *, unsigned)`.
unsafe extern "C" fn load_fatbin_ext(
    fatbin: *const c_void,
    module: *mut CUmodule,
    a: *mut c_void,
    b: *mut c_void,
    c: c_uint,
) -> CUresult {
    if !a.is_null() || !b.is_null() || c != 0 {
        return trace(8, fatbin, CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    trace(8, fatbin, load_fatbin(module, fatbin))
}

/// Slot 2: `(CUcontext *out, CUdevice dev) -> CUresult`, the device's primary context.
///
/// The driver hands out the primary context without changing its retain count. Here a
/// primary context exists only while retained, so the first request retains it once for
/// the rest of the process (the runtime keeps using it until exit anyway).
unsafe extern "C" fn primary_context(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    use std::sync::Mutex;
    static HELD: Mutex<Vec<CUdevice>> = Mutex::new(Vec::new());
    guard(|| {
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a local out pointer.
        let rc = unsafe { crate::context::cuDevicePrimaryCtxRetain(&mut ctx, dev) };
        if rc != CUresult::CUDA_SUCCESS {
            return Err(rc);
        }
        if held.contains(&dev) {
            // Already holding one reference: give back the one just taken.
            // SAFETY: no pointer arguments.
            unsafe { crate::context::cuDevicePrimaryCtxRelease_v2(dev) };
        } else {
            held.push(dev);
        }
        // SAFETY: checked non-null above; writable by the caller's contract.
        unsafe { pctx.write(ctx) };
        Ok(())
    })
}

/// Slot 7: `(size_t) -> void`; nothing the simulator needs to record.
extern "C" fn ignore_word(_word: usize) {}

/// Slot 12: `() -> CUresult`; a real driver loads its PTX compiler here.
extern "C" fn load_compilers() -> CUresult {
    CUresult::CUDA_SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_images_are_errors() {
        let mut m: CUmodule = std::ptr::null_mut();
        let junk = [0u8; 32];
        // SAFETY: valid pointers to locals.
        unsafe {
            // Not initialised here, and not an image: an error either way.
            assert_ne!(
                load_wrapped(&mut m, junk.as_ptr().cast()),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                load_wrapped(&mut m, std::ptr::null()),
                CUresult::CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                load_fatbin_ext(
                    junk.as_ptr().cast(),
                    &mut m,
                    0x10 as *mut c_void,
                    std::ptr::null_mut(),
                    0
                ),
                CUresult::CUDA_ERROR_NOT_SUPPORTED
            );
        }
    }
}
