//! `CLUSTER` (`1734dc26-800d-4745-8726-c0f1e7dd8bca`): the table cuDNN's logs call "the cuda
//! cluster export table" (thread-block clusters: how a GPU's SMs are grouped). cuBLASLt 13.4
//! asks for it when it ranks kernels for half-precision GEMMs and calls through it without
//! checking that the request succeeded, so a driver that refuses it crashes the process;
//! cuDNN 9 asks for it for its NVRTC kernel cache and does without it when the table is
//! smaller than it needs (more than 13 slots).
//!
//! Its size and most entries are unknown. Slot 4 is what cuBLASLt calls: two outputs, a
//! pointer to a byte array (which cuBLASLt reads one byte per pair of SMs of, counting the
//! distinct values: the SM groups) and one word; on failure, or a null array, it ranks
//! kernels without the layout. The simulated GPU has no such layout to give.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 40: slots up to 4 (cuDNN then turns its kernel cache off, as it says in its debug log) |
//! | 4 | `(const u8 **groups, u64 *word)` | `CUDA_ERROR_NOT_SUPPORTED`, outputs untouched, no log line |
//! | 1-3 | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |

use std::ffi::c_void;

use tessera_ffi::cuda::CUresult;

use super::{Slots, guid, sized_stubs};

pub const GUID: [u8; 16] = guid("1734dc26-800d-4745-8726-c0f1e7dd8bca");
pub(super) const T: usize = 8;
const N: usize = 5;

pub static TABLE: Slots<N> = Slots({
    let mut slots = sized_stubs::<T, N>();
    slots[4] = sm_groups as *const c_void;
    slots
});

/// Slot 4: `(const u8 **groups, u64 *word) -> CUresult`. No layout here: the caller's
/// documented fallback, without the stub's "not implemented" line (the simulator answers
/// on purpose).
extern "C" fn sm_groups(_groups: *mut *const u8, _word: *mut u64) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_refused_and_outputs_untouched() {
        let mut p: *const u8 = std::ptr::null();
        let mut w = 9u64;
        assert_eq!(
            sm_groups(&mut p, &mut w),
            CUresult::CUDA_ERROR_NOT_SUPPORTED
        );
        assert!(p.is_null());
        assert_eq!(w, 9);
    }
}
