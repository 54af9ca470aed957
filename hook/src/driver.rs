//! Finding the real libraries without ever running into the shim itself:
//! the real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", ...)` (never our
//! own export), the real libraries from our own `dlopen`. It knows no
//! symbol list: `crate::table` resolves each entry point once through it
//! into the table the hot path reads with one atomic load.

use std::ffi::{CStr, c_char, c_void};
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

/// C signature of `dlsym`.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Stands in for a real `dlsym` that could not be found (no glibc
/// version we know): every lookup fails rather than recursing into ours.
unsafe extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    null_mut()
}

/// The real `dlsym`. The `dlsym` trampoline jumps through this word, so it
/// always holds a callable function: `no_dlsym` until resolved.
pub(crate) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(no_dlsym as *mut c_void);
static DLSYM_RESOLVED: OnceLock<()> = OnceLock::new();

/// Resolves the real `dlsym` once. glibc 2.34 moved `dlsym` into libc under
/// a new version; older ones have it in libdl as GLIBC_2.2.5.
pub fn resolve_real_dlsym() {
    DLSYM_RESOLVED.get_or_init(|| {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated strings;
            // RTLD_NEXT searches the objects after this one, so it can
            // never return our own `dlsym`.
            let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                REAL_DLSYM.store(p, Ordering::Release);
                break;
            }
        }
        clear_dlerror();
    });
}

/// Calls the real `dlsym`.
///
/// # Safety
///
/// `handle` is a handle the loader gave out, or a pseudo-handle.
pub unsafe fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    resolve_real_dlsym();
    let p = REAL_DLSYM.load(Ordering::Acquire);
    // SAFETY: REAL_DLSYM always holds a function with dlsym's signature
    // (the real one or `no_dlsym`).
    let f: DlsymFn = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) };
    // SAFETY: a NUL-terminated name and a handle the caller got from the
    // loader (or a pseudo-handle).
    unsafe { f(handle, name.as_ptr()) }
}

/// Forgets a pending `dlerror` message our own lookups left, so that an
/// application checking `dlerror()` after a successful `dlsym` of ours does
/// not see an error that was never its own.
pub fn clear_dlerror() {
    // SAFETY: dlerror only reads and clears thread-local loader state.
    unsafe { libc::dlerror() };
}

/// Opens a real library by its soname, or None (logged) when it is not
/// there.
pub fn open(soname: &CStr) -> Option<*mut c_void> {
    // RTLD_LOCAL: the real library's symbols must not join the global scope
    // ahead of anything; the application's own dlopen of it, if any, gets
    // the same object.
    // SAFETY: dlopen of a NUL-terminated soname.
    let h = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        clear_dlerror();
        crate::log!(
            crate::log::Level::Warn,
            "{} not found",
            soname.to_string_lossy()
        );
        return None;
    }
    Some(h)
}

/// Whether a library is already in the process, without loading it.
pub fn is_loaded(soname: &CStr) -> bool {
    // SAFETY: RTLD_NOLOAD only looks the name up among loaded objects.
    let h = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        clear_dlerror();
        return false;
    }
    // SAFETY: drops the reference the NOLOAD open just took.
    unsafe { libc::dlclose(h) };
    true
}
