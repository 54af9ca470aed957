//! `CONTEXT_CHECKS` (`263e8860-7cd2-6143-92f6-bbd5006dfa7e`), 4 slots: flags the runtime
//! checks on a context before using it (on NVIDIA's driver they are observed to be 0).
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 32 |
//! | 1 | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |
//! | 2 | `(CUcontext, unsigned *flags, const void **extra)` | `*flags = 0`, success |
//! | 3 | `() -> unsigned` | 0 |

use std::ffi::{c_uint, c_void};

use tessera_ffi::cuda::{CUcontext, CUresult};

use super::{Slots, guid, size_slot, stub};

pub const GUID: [u8; 16] = guid("263e8860-7cd2-6143-92f6-bbd5006dfa7e");
const T: usize = 6;

pub static TABLE: Slots<4> = Slots([
    size_slot(4),
    stub::<T, 1>(),
    context_check as *const c_void,
    check3 as *const c_void,
]);

unsafe extern "C" fn context_check(
    _ctx: CUcontext,
    flags: *mut c_uint,
    _extra: *mut *const c_void,
) -> CUresult {
    if flags.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null, writable by the caller's contract.
    unsafe { flags.write(0) };
    CUresult::CUDA_SUCCESS
}

extern "C" fn check3() -> c_uint {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_registered_under_its_index() {
        assert_eq!(super::super::TABLES[T].guid, GUID);
        let mut f: c_uint = 7;
        // SAFETY: locals.
        let rc = unsafe { context_check(std::ptr::null_mut(), &mut f, std::ptr::null_mut()) };
        assert_eq!((rc, f), (CUresult::CUDA_SUCCESS, 0));
    }
}
