//! `TOOLS_CONTEXT` (`21318c60-9714-3248-8ca6-41ff7324c8f2`), 95 slots: a table CUDA 13.4 and
//! newer runtimes (and cuBLAS/cuFFT) require, of per-context queries for tools. Its size
//! (a size word and 94 entries, as driver 595 serves it) is a public fact; its entries'
//! meanings mostly are not.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 760 |
//! | 4 | `(CUcontext ctx, u64 *id)`: the context's unique id | `cuCtxGetId` (NULL: the current context); cuBLASLt 13.4 keys its per-context state by it |
//! | others | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |

use std::ffi::c_void;

use tessera_ffi::cuda::{CUcontext, CUresult};

use super::{Slots, guid, sized_stubs};

pub const GUID: [u8; 16] = guid("21318c60-9714-3248-8ca6-41ff7324c8f2");
pub(super) const T: usize = 7;
const N: usize = 95;

pub static TABLE: Slots<N> = Slots({
    let mut slots = sized_stubs::<T, N>();
    slots[4] = context_id as *const c_void;
    slots
});

/// Slot 4: `(CUcontext ctx, u64 *id) -> CUresult`.
///
/// # Safety
/// `id` must be null or writable.
unsafe extern "C" fn context_id(ctx: CUcontext, id: *mut u64) -> CUresult {
    // SAFETY: the caller's arguments, checked by cuCtxGetId.
    unsafe { crate::context::cuCtxGetId(ctx, id) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_id_needs_a_context() {
        let mut id = 7u64;
        // SAFETY: a local out pointer; no context is current in a unit test.
        let rc = unsafe { context_id(std::ptr::null_mut(), &mut id) };
        assert_ne!(rc, CUresult::CUDA_SUCCESS);
        assert_eq!(id, 7);
    }
}
