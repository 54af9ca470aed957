//! The HIP bodies in an ungoverned process, and the re-entry guard, against
//! a fake runtime installed in the table.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::table::{self, Sym, exports};

static MALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn fake_malloc(ptr: *mut *mut c_void, size: usize) -> hipError_t {
    MALLOCS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the test passes a valid pointer.
    unsafe { *ptr = (0xbeef_0000 + size) as *mut c_void };
    hipError_t(77)
}

#[test]
fn ungoverned_hip_calls_pass_straight_through() {
    table::set_entry(Sym::hipMalloc, fake_malloc as *mut c_void);
    let mut p = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let r = unsafe { exports::hipMalloc(&mut p, 16) };
    assert_eq!(r, hipError_t(77));
    assert_eq!(p as usize, 0xbeef_0010);
}

#[test]
fn calls_inside_the_runtime_are_marked_and_the_mark_is_undone() {
    assert!(!inside());
    let seen = nested(|| (inside(), nested(inside)));
    assert_eq!(seen, (true, true));
    assert!(!inside(), "the mark is per call, undone on return");
    // Another thread is never marked by this one.
    nested(|| {
        let other = std::thread::spawn(inside).join().unwrap();
        assert!(!other);
    });
}

#[test]
fn proc_address_hands_out_wrappers_for_governed_names_only() {
    let fake = 0x1234 as *mut c_void;
    assert_eq!(procaddr::substitute(c"hipMemcpy", fake), fake);
    assert_eq!(
        procaddr::substitute(c"hipMalloc", fake),
        Sym::hipMalloc.wrapper()
    );
    // The runtime's own entry point maps to the wrapper of that symbol.
    table::set_entry(Sym::hipFree, 0x5678 as *mut c_void);
    assert_eq!(
        procaddr::substitute(c"hipFree", 0x5678 as *mut c_void),
        Sym::hipFree.wrapper()
    );
    assert!(procaddr::substitute(c"hipMalloc", std::ptr::null_mut()).is_null());
    // CUDA names are not HIP's to hand out here.
    assert_eq!(procaddr::substitute(c"cuMemAlloc_v2", fake), fake);
}
