//! The tools tables: `TOOLS_TLS` (`42d85a81-23f6-cb47-8298-f6e78a3aecdc`, 4 slots) and
//! `TOOLS_RUNTIME_CALLBACK_HOOKS` (`a094798c-2e74-2e74-93f2-0800200c0a66`, 7 slots),
//! through which the runtime cooperates with profilers and debuggers. No tool is attached
//! to the simulator, so the runtime only needs them to exist.
//!
//! | table | slot | entry | here |
//! |---|---|---|---|
//! | TOOLS_TLS | 0 | size in bytes | 32 |
//! | TOOLS_TLS | 2 | `(CUcontext *out)`: the calling thread's current context | `cuCtxGetCurrent` (cuBLASLt calls it before each heuristic query, to find its per-context state) |
//! | TOOLS_TLS | 1, 3 | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |
//! | HOOKS | 0 | size in bytes | 56 |
//! | HOOKS | 2 | `(void **buf, size_t *size)`: a buffer the runtime writes callback state to | a zeroed 4 KiB buffer of ours, size 1024 |
//! | HOOKS | 6 | the same, a second buffer | a zeroed 64-byte buffer, size 14 |
//! | HOOKS | others | unknown | stub |

use std::cell::UnsafeCell;
use std::ffi::c_void;

use tessera_ffi::cuda::{CUcontext, CUresult};

use super::{Slots, guid, size_slot, stub};

pub const TLS_GUID: [u8; 16] = guid("42d85a81-23f6-cb47-8298-f6e78a3aecdc");
pub const HOOKS_GUID: [u8; 16] = guid("a094798c-2e74-2e74-93f2-0800200c0a66");
const T_TLS: usize = 1;
const T_HOOKS: usize = 2;

pub static TLS: Slots<4> = Slots([
    size_slot(4),
    stub::<T_TLS, 1>(),
    current_context as *const c_void,
    stub::<T_TLS, 3>(),
]);

pub static HOOKS: Slots<7> = Slots([
    size_slot(7),
    stub::<T_HOOKS, 1>(),
    buffer1 as *const c_void,
    stub::<T_HOOKS, 3>(),
    stub::<T_HOOKS, 4>(),
    stub::<T_HOOKS, 5>(),
    buffer2 as *const c_void,
]);

/// TOOLS_TLS slot 2: `(CUcontext *out) -> CUresult`, the calling thread's current context
/// (NULL when none). Seen called by cuBLASLt 13.4 (`cublasLtMatmulAlgoGetHeuristic`), which
/// passes the result to `TOOLS_CONTEXT` slot 4 for the context's id and keys its
/// per-context state by that id.
///
/// # Safety
/// `out` must be null or writable.
unsafe extern "C" fn current_context(out: *mut CUcontext) -> CUresult {
    // SAFETY: the caller's out pointer, checked by cuCtxGetCurrent.
    unsafe { crate::context::cuCtxGetCurrent(out) }
}

/// Memory handed to the runtime to write into; Rust never reads or writes it.
#[repr(C, align(16))]
struct Buffer<const W: usize>(UnsafeCell<[u32; W]>);

// SAFETY: Rust code never touches the contents; only the runtime (C) writes them, with its
// own synchronisation.
unsafe impl<const W: usize> Sync for Buffer<W> {}

// The sizes reported are the ones a real driver reports (in words, not bytes); the buffers
// are at least that many bytes and words, whichever unit the runtime means.
static BUFFER1: Buffer<1024> = Buffer(UnsafeCell::new([0; 1024]));
static BUFFER2: Buffer<16> = Buffer(UnsafeCell::new([0; 16]));

/// # Safety
/// `buf` and `size` must be null or writable.
unsafe extern "C" fn buffer1(buf: *mut *mut c_void, size: *mut usize) {
    // SAFETY: the caller's out pointers, written only when non-null.
    unsafe { give(buf, size, BUFFER1.0.get().cast(), 1024) }
}

/// # Safety
/// `buf` and `size` must be null or writable.
unsafe extern "C" fn buffer2(buf: *mut *mut c_void, size: *mut usize) {
    // SAFETY: as above.
    unsafe { give(buf, size, BUFFER2.0.get().cast(), 14) }
}

/// # Safety
/// `buf` and `size` must be null or writable.
unsafe fn give(buf: *mut *mut c_void, size: *mut usize, p: *mut c_void, n: usize) {
    // SAFETY: each pointer is checked for null and otherwise writable by contract.
    unsafe {
        if !buf.is_null() {
            buf.write(p);
        }
        if !size.is_null() {
            size.write(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_registered_under_their_indices() {
        assert_eq!(super::super::TABLES[T_TLS].guid, TLS_GUID);
        assert_eq!(super::super::TABLES[T_HOOKS].guid, HOOKS_GUID);
    }

    #[test]
    fn buffers_are_handed_out() {
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut n = 0usize;
        // SAFETY: locals.
        unsafe { buffer1(&mut p, &mut n) };
        assert_eq!((p, n), (BUFFER1.0.get().cast(), 1024));
        // SAFETY: null out pointers are skipped.
        unsafe { buffer2(std::ptr::null_mut(), std::ptr::null_mut()) };
    }
}
