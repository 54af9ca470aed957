//! What NVML does not say about a GPU but the CUDA driver does, read once at
//! start-up through `libcuda.so.1` and keyed by the GPU's UUID so it matches
//! NVML's inventory whatever the device order:
//!
//! - the SM count of a full (non-MIG) GPU (`cuInit`, then
//!   `cuDeviceGetAttribute`; no context is created); anything missing or
//!   failing leaves it unknown (0);
//! - what a CUDA context holds on each GPU ([`measure_contexts`]): the
//!   manager makes one primary context per GPU, asks the driver what it holds
//!   for the manager's own process there, and lets the context go, so the
//!   shim can charge every context its real cost before the driver sees the
//!   call.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::path::Path;
use tessera_contract::format_uuid;

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
const MULTIPROCESSOR_COUNT: c_int = 16;

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type CuDevicePrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuDevicePrimaryCtxRelease = unsafe extern "C" fn(c_int) -> c_int;

/// Loads the CUDA driver at `lib` (or `libcuda.so.1` from the loader's path),
/// `None` when there is none.
fn load(lib: Option<&Path>) -> Option<libloading::Library> {
    let name = lib.map_or_else(|| "libcuda.so.1".into(), |p| p.as_os_str().to_owned());
    // SAFETY: loading the CUDA driver runs its initialisers, which are
    // written to be loaded into any process (every CUDA program does).
    match unsafe { libloading::Library::new(&name) } {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::debug!(lib = ?name, error = %e, "no CUDA driver");
            None
        }
    }
}

/// The calls every query here starts with: initialise the driver, count
/// its devices, and name each by its handle and UUID.
struct Devices {
    init: CuInit,
    count: CuDeviceGetCount,
    get: CuDeviceGet,
    uuid: CuDeviceGetUuid,
}

impl Devices {
    /// The four calls from the loaded driver, `None` when one is missing.
    fn of(lib: &libloading::Library) -> Option<Devices> {
        // SAFETY: each symbol is looked up with the C signature the CUDA
        // driver API documents for it (CUresult and CUdevice are ints,
        // CUuuid 16 bytes).
        unsafe {
            Some(Devices {
                init: *lib.get::<CuInit>(b"cuInit\0").ok()?,
                count: *lib.get::<CuDeviceGetCount>(b"cuDeviceGetCount\0").ok()?,
                get: *lib.get::<CuDeviceGet>(b"cuDeviceGet\0").ok()?,
                uuid: *lib.get::<CuDeviceGetUuid>(b"cuDeviceGetUuid\0").ok()?,
            })
        }
    }

    /// Calls `f` with each device the driver shows (its handle, and its
    /// UUID as NVML spells it); nothing when the driver will not initialise,
    /// and a device it cannot name is skipped.
    fn each(&self, mut f: impl FnMut(c_int, String)) {
        // SAFETY: the calls follow the driver API's contract: cuInit(0)
        // first, then queries with valid out-pointers to locals of the
        // right size.
        unsafe {
            if (self.init)(0) != 0 {
                return;
            }
            let mut n: c_int = 0;
            if (self.count)(&mut n) != 0 {
                return;
            }
            for ordinal in 0..n {
                let mut dev: c_int = 0;
                let mut id = [0u8; 16];
                if (self.get)(&mut dev, ordinal) == 0 && (self.uuid)(&mut id, dev) == 0 {
                    f(dev, format_uuid(&id));
                }
            }
        }
    }
}

/// What a CUDA context holds on each GPU, by UUID: for each GPU the
/// driver shows, one primary context is retained, `held` is asked what the
/// driver now holds for this process on that GPU (NVML's per-process figure:
/// what the shim settles every context to), and the context is released.
/// The GPUs are measured one after another, so the node never holds more
/// than one of these contexts at a time. A GPU whose context cannot be
/// made (full, exclusive to another process, lost) or whose figure the
/// driver does not give is left out: its allocations are charged the
/// configured estimate instead.
pub fn measure_contexts(
    lib: Option<&Path>,
    held: impl Fn(&str) -> Option<u64>,
) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    let Some(lib) = load(lib) else {
        return out;
    };
    // SAFETY: each symbol is looked up with the C signature the CUDA driver
    // API documents for it (CUresult and CUdevice are ints, CUcontext a
    // pointer).
    let syms = unsafe {
        (
            lib.get::<CuDevicePrimaryCtxRetain>(b"cuDevicePrimaryCtxRetain\0")
                .map(|f| *f),
            lib.get::<CuDevicePrimaryCtxRelease>(b"cuDevicePrimaryCtxRelease_v2\0")
                .or_else(|_| lib.get::<CuDevicePrimaryCtxRelease>(b"cuDevicePrimaryCtxRelease\0"))
                .map(|f| *f),
        )
    };
    let (Some(devices), Ok(retain), Ok(release)) = (Devices::of(&lib), syms.0, syms.1) else {
        tracing::debug!("CUDA driver lacks the context calls; context sizes unknown");
        return out;
    };
    devices.each(|dev, name| {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: a device handle the driver gave and a valid out-pointer;
        // the primary context retained is released once, after the figure
        // is read.
        let r = unsafe { retain(&mut ctx, dev) };
        if r != 0 {
            tracing::warn!(gpu = %name, error = r, "cannot make a context to measure its size");
            return;
        }
        let figure = held(&name);
        // SAFETY: releases the one retain above.
        unsafe { release(dev) };
        if let Some(bytes) = figure {
            out.insert(name, bytes);
        }
    });
    // As for the SM counts: the driver stays loaded.
    std::mem::forget(lib);
    out
}

/// SM count per GPU UUID, from the CUDA driver at `lib` (or `libcuda.so.1`
/// from the loader's path). Empty when the driver cannot be used.
pub fn sm_counts(lib: Option<&Path>) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    let Some(lib) = load(lib) else {
        return out;
    };
    // SAFETY: looked up with the C signature the CUDA driver API documents
    // (CUresult and CUdevice_attribute and CUdevice are ints).
    let attr = unsafe { lib.get::<CuDeviceGetAttribute>(b"cuDeviceGetAttribute\0") }.map(|f| *f);
    let (Some(devices), Ok(attr)) = (Devices::of(&lib), attr) else {
        tracing::debug!("CUDA driver lacks a device query; SM counts unknown");
        return out;
    };
    devices.each(|dev, name| {
        let mut sms: c_int = 0;
        // SAFETY: a device handle the driver gave, a valid out-pointer.
        if unsafe { attr(&mut sms, MULTIPROCESSOR_COUNT, dev) } == 0
            && let Ok(sms) = u32::try_from(sms)
        {
            out.insert(name, sms);
        }
    });
    // The library stays loaded: unloading a driver that was initialised is
    // not supported by it.
    std::mem::forget(lib);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_spelled_as_nvml_spells_them() {
        let b = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(format_uuid(&b), "GPU-12345678-9abc-def0-0123-456789abcdef");
    }

    #[test]
    fn a_missing_driver_means_unknown_not_an_error() {
        assert!(sm_counts(Some(Path::new("/nonexistent/libcuda.so.1"))).is_empty());
        let asked = std::cell::Cell::new(false);
        let measured = measure_contexts(Some(Path::new("/nonexistent/libcuda.so.1")), |_| {
            asked.set(true);
            Some(1)
        });
        assert!(measured.is_empty() && !asked.get());
    }
}
