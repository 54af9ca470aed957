//! The wrapper bodies of an ungoverned process: every call reaches the
//! driver untouched; the routes hand out the shim's wrappers.

use super::*;
use crate::table::{self, Sym, exports};
use std::sync::atomic::{AtomicUsize, Ordering};

// This test process has no Tessera allocation: every governed function
// must reach the (fake) driver with its arguments untouched and return
// the driver's result untouched.

unsafe extern "C" fn fake_alloc(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: the test passes a valid pointer.
    unsafe { *dptr = 0xdead_0000 + size as u64 };
    CUresult(77)
}

static LAUNCHES: AtomicUsize = AtomicUsize::new(0);

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn fake_launch(
    _f: CUfunction,
    gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    LAUNCHES.fetch_add(gx as usize + stream as usize, Ordering::SeqCst);
    OK
}

#[test]
fn ungoverned_calls_pass_straight_through() {
    table::set_entry(Sym::cuMemAlloc_v2, fake_alloc as *mut c_void);
    let mut p = 0;
    // SAFETY: a valid out-pointer.
    let r = unsafe { exports::cuMemAlloc_v2(&mut p, 16) };
    assert_eq!(r, CUresult(77));
    assert_eq!(p, 0xdead_0010);

    table::set_entry(Sym::cuLaunchKernel_ptsz, fake_launch as *mut c_void);
    use std::ptr::null_mut as null;
    // SAFETY: the fake reads nothing through its pointers.
    let r = unsafe {
        exports::cuLaunchKernel_ptsz(
            null(),
            5,
            1,
            1,
            1,
            1,
            1,
            0,
            0x100 as CUstream,
            null(),
            null(),
        )
    };
    assert_eq!(r, OK);
    assert_eq!(LAUNCHES.load(Ordering::SeqCst), 0x105);
}

#[test]
fn a_function_the_driver_lacks_is_not_found() {
    // SAFETY: the handle is never dereferenced.
    let r = unsafe { exports::cuMipmappedArrayDestroy(std::ptr::null_mut()) };
    assert_eq!(r, CUresult::CUDA_ERROR_NOT_FOUND);
}

#[test]
fn get_proc_address_hands_out_the_wrapper_of_the_variant_returned() {
    // A fake driver whose cuGetProcAddress hands out its own per-thread
    // launch for "cuLaunchKernel" with the per-thread flag.
    unsafe extern "C" fn fake_gpa(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        _v: c_int,
        flags: cuuint64_t,
    ) -> CUresult {
        // SAFETY: the test passes valid pointers.
        let name = unsafe { CStr::from_ptr(symbol) };
        let p = match (name.to_bytes(), flags) {
            (b"cuLaunchKernel", 2) => fake_launch as *mut c_void,
            (b"cuMemcpy", _) => 0x4242 as *mut c_void,
            _ => return CUresult::CUDA_ERROR_NOT_FOUND,
        };
        // SAFETY: as above.
        unsafe { *pfn = p };
        OK
    }
    table::set_entry(Sym::cuGetProcAddress, fake_gpa as *mut c_void);
    table::set_entry(Sym::cuLaunchKernel_ptsz, fake_launch as *mut c_void);
    let mut p = std::ptr::null_mut();
    // SAFETY: valid name and out-pointer.
    let r = unsafe { exports::cuGetProcAddress(c"cuLaunchKernel".as_ptr(), &mut p, 12000, 2) };
    assert_eq!(r, OK);
    assert_eq!(p, Sym::cuLaunchKernel_ptsz.wrapper());
    // Ungoverned: the driver's own pointer.
    // SAFETY: as above.
    let r = unsafe { exports::cuGetProcAddress(c"cuMemcpy".as_ptr(), &mut p, 12000, 0) };
    assert_eq!(r, OK);
    assert_eq!(p, 0x4242 as *mut c_void);
    // The driver's error, untouched.
    // SAFETY: as above.
    let r = unsafe { exports::cuGetProcAddress(c"cuNothing".as_ptr(), &mut p, 12000, 0) };
    assert_eq!(r, CUresult::CUDA_ERROR_NOT_FOUND);
}

#[test]
fn a_panicking_body_returns_an_error_instead_of_unwinding() {
    let r: CUresult = crate::guard(|| panic!("a bug in a wrapper"));
    assert_eq!(r, CUresult::CUDA_ERROR_UNKNOWN);
}
