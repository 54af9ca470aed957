//! `DEVICE_EXTENDED_RT` (`b10541e1-f7c7-c74a-9f64-f223be99f1e2`), 26 slots: extra device
//! queries of the runtime.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 208 |
//! | 13 | `(unsigned char *out, CUdevice)`, a per-device flag (0 on NVIDIA's driver) | `*out = 0` for a valid device |
//! | others (5: an extended attribute query) | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |

use std::ffi::{c_int, c_uchar, c_void};

use tessera_ffi::cuda::{CUdevice, CUresult};

use super::{Slots, guid, sized_stubs};
use crate::guard;

pub const GUID: [u8; 16] = guid("b10541e1-f7c7-c74a-9f64-f223be99f1e2");
pub(super) const T: usize = 4;
const N: usize = 26;

pub static TABLE: Slots<N> = Slots({
    let mut slots = sized_stubs::<T, N>();
    slots[13] = device_flag as *const c_void;
    slots
});

unsafe extern "C" fn device_flag(out: *mut c_uchar, dev: CUdevice) -> CUresult {
    guard(|| {
        crate::runtime::rt()?.device(dev as c_int)?;
        // SAFETY: the caller's out pointer; null is rejected.
        unsafe { crate::put(out, 0) }
    })
}
