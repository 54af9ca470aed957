//! The `dlsym` route: programs that `dlopen("libcuda.so.1")` or
//! `libnvidia-ml.so.1` and look functions up on that handle (cudarc,
//! ctypes, NVIDIA's Python bindings, the CUDA runtime's own loader) get the
//! shim's wrapper for every governed function.
//!
//! `dlsym` answers relative to its caller (`RTLD_NEXT` means "after the
//! object that called"), which glibc finds from the return address. So the
//! exported `dlsym` is a small assembly trampoline: it asks `route`
//! whether the answer is a wrapper, and otherwise *jumps* (not calls) to
//! the real `dlsym` with the caller's own return address still in place, so
//! every lookup the shim does not govern, including `RTLD_NEXT` from
//! another interposer, is answered exactly as without the shim.

use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::null_mut;

use crate::driver;
use crate::table::{self, Sym};

/// What `dlsym(*handle, name)` should return: a wrapper, or null to let the
/// real `dlsym` answer, with `*handle` as this function leaves it.
///
/// # Safety
///
/// `handle` points to the caller's handle; `name` is null or a C string.
unsafe extern "C" fn route(handle: *mut *mut c_void, name: *const c_char) -> *mut c_void {
    driver::resolve_real_dlsym();
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: per this function's contract.
        unsafe { decide(handle, name) }
    }))
    .unwrap_or(null_mut())
}

/// # Safety
///
/// As for [`route`].
unsafe fn decide(handle: *mut *mut c_void, name: *const c_char) -> *mut c_void {
    if name.is_null() || handle.is_null() {
        return null_mut();
    }
    // SAFETY: a C string per the contract.
    let name = unsafe { CStr::from_ptr(name) };
    let bytes = name.to_bytes();
    // Most lookups in a process are not ours: decide those in two compares.
    if !(bytes.starts_with(b"cu")
        || bytes.starts_with(b"nvml")
        || bytes.starts_with(b"hip")
        || bytes.starts_with(b"_Z24hip"))
    {
        return null_mut();
    }
    let Some(sym) = Sym::governed_by_name(bytes) else {
        return null_mut();
    };
    // SAFETY: points to the caller's handle per the contract.
    let h = unsafe { *handle };
    if h == libc::RTLD_DEFAULT || h == libc::RTLD_NEXT {
        if table::entry(sym).is_null() {
            // The real library lacks it: answer as it would (not found),
            // not with our export, which the global scope would find.
            let lib = table::library(sym.lib());
            if !lib.is_null() {
                // SAFETY: as above.
                unsafe { *handle = lib };
            }
            return null_mut();
        }
        driver::clear_dlerror();
        return sym.wrapper();
    }
    // SAFETY: the caller's own handle, which it got from the loader.
    let p = unsafe { driver::real_dlsym(h, name) };
    if p.is_null() {
        // The real dlsym will fail the same way and say why.
        driver::clear_dlerror();
        return null_mut();
    }
    if p == sym.wrapper() || p == table::entry(sym) {
        driver::clear_dlerror();
        return sym.wrapper();
    }
    // Another library's function of the same name: not ours to govern.
    null_mut()
}

#[cfg(target_arch = "x86_64")]
mod trampoline {
    use super::*;

    /// `dlsym`, interposed. See the module docs.
    ///
    /// # Safety
    ///
    /// As for `dlsym(3)`.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
        // Entry: rsp = 8 mod 16. Save both arguments (the handle's slot is
        // what `route` may rewrite), keep the stack aligned for the call,
        // restore them and either return the wrapper or tail-jump.
        core::arch::naked_asm!(
            "push rsi",
            "push rdi",
            "sub rsp, 8",
            "lea rdi, [rsp + 8]",
            "call {route}",
            "add rsp, 8",
            "pop rdi",
            "pop rsi",
            "test rax, rax",
            "jnz 2f",
            "jmp qword ptr [rip + {real}]",
            "2:",
            "ret",
            route = sym route,
            real = sym driver::REAL_DLSYM,
        )
    }
}

#[cfg(target_arch = "aarch64")]
mod trampoline {
    use super::*;

    /// `dlsym`, interposed. See the module docs.
    ///
    /// # Safety
    ///
    /// As for `dlsym(3)`.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
        // Save the frame and both arguments, call `route` with the handle's
        // slot, restore x0, x1 and the caller's x30, then return or branch.
        core::arch::naked_asm!(
            "stp x29, x30, [sp, #-32]!",
            "mov x29, sp",
            "stp x0, x1, [sp, #16]",
            "add x0, sp, #16",
            "bl {route}",
            "mov x9, x0",
            "ldp x0, x1, [sp, #16]",
            "ldp x29, x30, [sp], #32",
            "cbnz x9, 2f",
            "adrp x16, {real}",
            "ldr x16, [x16, :lo12:{real}]",
            "br x16",
            "2:",
            "mov x0, x9",
            "ret",
            route = sym route,
            real = sym driver::REAL_DLSYM,
        )
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod trampoline {
    use super::*;

    /// `dlsym`, interposed. On this architecture there is no trampoline:
    /// `RTLD_NEXT` lookups the shim does not govern resolve relative to the
    /// shim rather than their caller.
    ///
    /// # Safety
    ///
    /// As for `dlsym(3)`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
        let mut h = handle;
        // SAFETY: a valid slot and the caller's name.
        let p = unsafe { route(&mut h, name) };
        if !p.is_null() {
            return p;
        }
        let f = driver::REAL_DLSYM.load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: REAL_DLSYM always holds a dlsym-shaped function.
        let f: driver::DlsymFn = unsafe { std::mem::transmute(f) };
        // SAFETY: the caller's arguments.
        unsafe { f(h, name) }
    }
}

pub use trampoline::dlsym;

#[cfg(test)]
mod tests {
    use super::*;

    // In this test binary the crate is linked statically, so every `dlsym`
    // call of the process's own code binds to the trampoline above.

    #[test]
    fn ungoverned_lookups_pass_through_unchanged() {
        // SAFETY: looks up libc symbols by NUL-terminated names.
        unsafe {
            let ours = dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr());
            let real = driver::real_dlsym(libc::RTLD_DEFAULT, c"getpid");
            assert!(!ours.is_null());
            assert_eq!(ours, real);
            assert_eq!(ours, libc::getpid as *mut c_void);
            // RTLD_NEXT from this executable finds libc's.
            let next = dlsym(libc::RTLD_NEXT, c"getpid".as_ptr());
            assert_eq!(next, libc::getpid as *mut c_void);
            assert!(dlsym(libc::RTLD_DEFAULT, c"no_such_symbol_anywhere".as_ptr()).is_null());
            // The failure is reported through dlerror as usual.
            let err = libc::dlerror();
            assert!(!err.is_null());
            assert!(
                CStr::from_ptr(err)
                    .to_string_lossy()
                    .contains("no_such_symbol_anywhere")
            );
        }
    }

    #[test]
    fn a_null_name_is_refused_not_dereferenced() {
        let mut h = libc::RTLD_DEFAULT;
        // SAFETY: a valid slot and a null name, which route must handle.
        assert!(unsafe { route(&mut h, std::ptr::null()) }.is_null());
        assert_eq!(h, libc::RTLD_DEFAULT);
    }
}
