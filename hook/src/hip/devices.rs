//! The GPUs HIP shows a governed process: the allocation's only. The
//! runtime is pointed at them before it starts (`pin_visible` in mod.rs),
//! and these device calls are governed so that the first of them, which is
//! how a program starts using HIP, joins the allocation and pins before the
//! runtime reads its environment. `hipSetDevice` refuses a GPU outside the
//! allocation (one a runtime started before the pin can still see), so no
//! work is submitted there.

use super::*;

pub unsafe fn hipGetDeviceCount(n: *mut c_int) -> hipError_t {
    let _g = governed_or!(call_real!(hipGetDeviceCount(n)));
    real!(hipGetDeviceCount(n))
}

pub unsafe fn hipSetDevice(dev: c_int) -> hipError_t {
    let g = governed_or!(call_real!(hipSetDevice(dev)));
    if g.index_of(dev).is_none() {
        crate::log!(
            Level::Warn,
            "hipSetDevice({dev}): refused: not a GPU of allocation {}",
            g.files.control.alloc_id()
        );
        return hipErrorInvalidDevice;
    }
    real!(hipSetDevice(dev))
}
