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

use super::{Slots, guid, size_slot, stub};
use crate::guard;

pub const GUID: [u8; 16] = guid("b10541e1-f7c7-c74a-9f64-f223be99f1e2");
const T: usize = 4;
const N: usize = 26;

pub static TABLE: Slots<N> = Slots([
    size_slot(N),
    stub::<T, 1>(),
    stub::<T, 2>(),
    stub::<T, 3>(),
    stub::<T, 4>(),
    stub::<T, 5>(),
    stub::<T, 6>(),
    stub::<T, 7>(),
    stub::<T, 8>(),
    stub::<T, 9>(),
    stub::<T, 10>(),
    stub::<T, 11>(),
    stub::<T, 12>(),
    device_flag as *const c_void,
    stub::<T, 14>(),
    stub::<T, 15>(),
    stub::<T, 16>(),
    stub::<T, 17>(),
    stub::<T, 18>(),
    stub::<T, 19>(),
    stub::<T, 20>(),
    stub::<T, 21>(),
    stub::<T, 22>(),
    stub::<T, 23>(),
    stub::<T, 24>(),
    stub::<T, 25>(),
]);

unsafe extern "C" fn device_flag(out: *mut c_uchar, dev: CUdevice) -> CUresult {
    guard(|| {
        crate::runtime::rt()?.device(dev as c_int)?;
        // SAFETY: the caller's out pointer; null is rejected.
        unsafe { crate::put(out, 0) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_registered_under_its_index() {
        super::super::assert_sized_table(T, GUID, &TABLE);
    }
}
