//! The `cuGetProcAddress` route. The real driver answers first; the pointer
//! it handed out is then mapped back to the real symbol it is (comparing
//! with the entry points of every governed variant), and the caller gets
//! the wrapper of exactly that variant, so the ABI version and the
//! per-thread-stream flavour it asked for are kept. Ungoverned functions
//! keep the driver's own pointer.
//!
//! Should a driver hand out a pointer that is none of its exported symbols
//! for a name the shim governs, the variant is chosen the way the driver
//! chooses it (the newest ABI not newer than the caller's CUDA version, in
//! the flavour its flags ask for), so the function is still governed.

use std::ffi::{CStr, c_void};

use tessera_ffi::cuda::CUdriverProcAddress_flags_enum as Flags;

use crate::log::Level;
use crate::table::{self, Sym};

/// Whether `flags` ask for the per-thread-default-stream flavour.
pub fn wants_per_thread(flags: u64) -> bool {
    flags & u64::from(Flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.0) != 0
}

/// The governed variant of `base` a driver hands out for `cuda_version`
/// and the flavour asked for.
pub fn variant_for(base: &str, cuda_version: i32, per_thread: bool) -> Option<Sym> {
    let version = u32::try_from(cuda_version).unwrap_or(0);
    let fits = |s: &&Sym| s.governed() && s.base() == base && s.version() <= version;
    let newest = |pt: bool| {
        Sym::ALL
            .iter()
            .filter(fits)
            .filter(|s| s.per_thread() == pt)
            .max_by_key(|s| s.version())
            .copied()
    };
    if per_thread {
        newest(true).or_else(|| newest(false))
    } else {
        newest(false)
    }
}

/// Of the governed symbols sharing one real entry point, the one the caller
/// named in the flavour it asked for.
fn choose(at: &[Sym], base: &str, per_thread: bool) -> Option<Sym> {
    at.iter()
        .find(|s| s.base() == base && s.per_thread() == per_thread)
        .or_else(|| at.iter().find(|s| s.base() == base))
        .or_else(|| at.first())
        .copied()
}

/// What the caller of `cuGetProcAddress(symbol, ...)` gets instead of the
/// driver's pointer `p`.
pub fn substitute(symbol: &CStr, p: *mut c_void, cuda_version: i32, flags: u64) -> *mut c_void {
    if p.is_null() {
        return p;
    }
    let base = symbol.to_str().unwrap_or("");
    let per_thread = wants_per_thread(flags);
    // A driver that resolved through the global scope found our export.
    if Sym::ALL.iter().any(|s| s.governed() && s.wrapper() == p) {
        return p;
    }
    if let Some(s) = choose(&table::governed_at(p), base, per_thread) {
        return s.wrapper();
    }
    match variant_for(base, cuda_version, per_thread) {
        Some(s) if !table::entry(s).is_null() => {
            crate::log!(
                Level::Warn,
                "cuGetProcAddress({base}, {cuda_version}, {flags}) gave a pointer that is no exported symbol; governing it as {}",
                s.name()
            );
            s.wrapper()
        }
        _ => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_follow_version_and_flavour() {
        assert_eq!(
            variant_for("cuMemAlloc", 12080, false),
            Some(Sym::cuMemAlloc_v2)
        );
        assert_eq!(
            variant_for("cuMemAlloc", 3010, false),
            Some(Sym::cuMemAlloc)
        );
        assert_eq!(variant_for("cuMemAlloc", 1000, false), None);
        assert_eq!(
            variant_for("cuLaunchKernel", 12000, true),
            Some(Sym::cuLaunchKernel_ptsz)
        );
        assert_eq!(
            variant_for("cuLaunchKernel", 12000, false),
            Some(Sym::cuLaunchKernel)
        );
        // Before per-thread streams existed, the legacy one is all there is.
        assert_eq!(
            variant_for("cuLaunchKernel", 6050, true),
            Some(Sym::cuLaunchKernel)
        );
        // No per-thread flavour: the default one.
        assert_eq!(
            variant_for("cuMemAlloc", 12000, true),
            Some(Sym::cuMemAlloc_v2)
        );
        assert_eq!(
            variant_for("cuCtxCreate", 11040, false),
            Some(Sym::cuCtxCreate_v3)
        );
        assert_eq!(
            variant_for("cuCtxCreate", 12080, false),
            Some(Sym::cuCtxCreate_v4)
        );
        assert_eq!(
            variant_for("cuGetProcAddress", 12000, false),
            Some(Sym::cuGetProcAddress_v2)
        );
        assert_eq!(variant_for("cuMemcpy", 12000, false), None, "not governed");
        assert_eq!(
            variant_for("cuDeviceGetUuid", 12000, false),
            None,
            "only used"
        );
    }

    #[test]
    fn flags() {
        assert!(wants_per_thread(2));
        assert!(!wants_per_thread(1));
        assert!(!wants_per_thread(0));
    }

    #[test]
    fn a_shared_entry_point_goes_to_the_named_flavour() {
        let at = [Sym::cuLaunchKernel, Sym::cuLaunchKernel_ptsz];
        assert_eq!(
            choose(&at, "cuLaunchKernel", true),
            Some(Sym::cuLaunchKernel_ptsz)
        );
        assert_eq!(
            choose(&at, "cuLaunchKernel", false),
            Some(Sym::cuLaunchKernel)
        );
        assert_eq!(choose(&at, "other", false), Some(Sym::cuLaunchKernel));
        assert_eq!(choose(&[], "cuLaunchKernel", false), None);
    }

    #[test]
    fn null_and_unknown_pointers_pass_through() {
        let p = 0x1234 as *mut c_void;
        assert!(substitute(c"cuMemAlloc", std::ptr::null_mut(), 12000, 0).is_null());
        assert_eq!(substitute(c"cuMemcpy", p, 12000, 0), p);
        // Our own wrapper stays ours.
        let w = Sym::cuMemAlloc_v2.wrapper();
        assert_eq!(substitute(c"cuMemAlloc", w, 12000, 0), w);
    }
}
