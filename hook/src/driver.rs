//! Finding the real libraries without ever running into the shim itself:
//! the real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", ...)` (never our
//! own export), the real libraries from our own `dlopen`, and each entry
//! point is resolved once into a table the hot path reads with one atomic
//! load.

use std::ffi::{CStr, c_char, c_void};
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::table::{COUNT, Lib, Sym};

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

/// Real entry points, indexed by [`Sym::index`]; null until resolved or
/// when the real library lacks the symbol.
static TABLE: [AtomicPtr<c_void>; COUNT] = [const { AtomicPtr::new(null_mut()) }; COUNT];

#[derive(Debug, Clone, Copy)]
struct Handle(*mut c_void);
// SAFETY: a dlopen handle is an opaque token the loader lets any thread use.
unsafe impl Send for Handle {}
// SAFETY: as for Send.
unsafe impl Sync for Handle {}

static CUDA: OnceLock<Option<Handle>> = OnceLock::new();
static NVML: OnceLock<Option<Handle>> = OnceLock::new();

/// The real entry point of `sym`, or null. The hot path: one atomic load
/// once the library is loaded.
#[inline(always)]
pub fn entry(sym: Sym) -> *mut c_void {
    let p = TABLE[sym.index()].load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    entry_slow(sym)
}

#[cold]
fn entry_slow(sym: Sym) -> *mut c_void {
    if library(sym.lib()).is_null() {
        return null_mut();
    }
    TABLE[sym.index()].load(Ordering::Acquire)
}

/// The handle of a real library, loading it and resolving all its symbols
/// on first use; null when it cannot be loaded.
pub fn library(lib: Lib) -> *mut c_void {
    let cell = match lib {
        Lib::Cuda => &CUDA,
        Lib::Nvml => &NVML,
    };
    cell.get_or_init(|| load(lib)).map_or(null_mut(), |h| h.0)
}

/// Whether a real library is already in the process, without loading it.
pub fn is_loaded(lib: Lib) -> bool {
    // SAFETY: RTLD_NOLOAD only looks the name up among loaded objects.
    let h = unsafe { libc::dlopen(lib.soname().as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        clear_dlerror();
        return false;
    }
    // SAFETY: drops the reference the NOLOAD open just took.
    unsafe { libc::dlclose(h) };
    true
}

fn load(lib: Lib) -> Option<Handle> {
    // RTLD_LOCAL: the real library's symbols must not join the global scope
    // ahead of anything; the application's own dlopen of it, if any, gets
    // the same object.
    // SAFETY: dlopen of a NUL-terminated soname.
    let h = unsafe { libc::dlopen(lib.soname().as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        clear_dlerror();
        crate::log!(
            crate::log::Level::Warn,
            "{} not found",
            lib.soname().to_string_lossy()
        );
        return None;
    }
    for &sym in Sym::ALL.iter().filter(|s| s.lib() == lib) {
        // SAFETY: a handle dlopen just gave.
        let p = unsafe { real_dlsym(h, sym.c_name()) };
        if !p.is_null() {
            TABLE[sym.index()].store(p, Ordering::Release);
        }
    }
    clear_dlerror();
    Some(Handle(h))
}

/// The governed symbols whose real entry point is exactly `p` (a pointer
/// the real `cuGetProcAddress` handed out). Usually one; a driver may share
/// one function between variants.
pub fn governed_at(p: *mut c_void) -> Vec<Sym> {
    Sym::ALL
        .iter()
        .copied()
        .filter(|s| s.governed() && TABLE[s.index()].load(Ordering::Acquire) == p)
        .collect()
}

/// Installs a fake entry point, for tests of wrapper bodies against a fake
/// driver.
#[cfg(test)]
pub(crate) fn set_entry(sym: Sym, p: *mut c_void) {
    TABLE[sym.index()].store(p, Ordering::Release);
}
