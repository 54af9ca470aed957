//! What NVML does not say about a full (non-MIG) GPU but the CUDA driver
//! does: its SM count. Read once at start-up through `libcuda.so.1`
//! (`cuInit`, then `cuDeviceGetAttribute`; no context is created), keyed by
//! the GPU's UUID so it matches NVML's inventory whatever the device order.
//! Anything missing or failing leaves the count unknown (0).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::path::Path;
use tessera_contract::format_uuid;

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
const MULTIPROCESSOR_COUNT: c_int = 16;

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

/// SM count per GPU UUID, from the CUDA driver at `lib` (or `libcuda.so.1`
/// from the loader's path). Empty when the driver cannot be used.
pub fn sm_counts(lib: Option<&Path>) -> HashMap<String, u32> {
    let name = lib.map_or_else(|| "libcuda.so.1".into(), |p| p.as_os_str().to_owned());
    // SAFETY: loading the CUDA driver runs its initialisers, which are
    // written to be loaded into any process (every CUDA program does).
    let lib = match unsafe { libloading::Library::new(&name) } {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(lib = ?name, error = %e, "no CUDA driver; SM counts unknown");
            return HashMap::new();
        }
    };
    // SAFETY: each symbol is looked up with the C signature the CUDA driver
    // API documents for it (CUresult is an int, CUdevice an int, CUuuid 16
    // bytes).
    let syms = unsafe {
        (
            lib.get::<CuInit>(b"cuInit\0"),
            lib.get::<CuDeviceGetCount>(b"cuDeviceGetCount\0"),
            lib.get::<CuDeviceGet>(b"cuDeviceGet\0"),
            lib.get::<CuDeviceGetUuid>(b"cuDeviceGetUuid\0"),
            lib.get::<CuDeviceGetAttribute>(b"cuDeviceGetAttribute\0"),
        )
    };
    let (Ok(init), Ok(count), Ok(get), Ok(uuid), Ok(attr)) = syms else {
        tracing::debug!("CUDA driver lacks a device query; SM counts unknown");
        return HashMap::new();
    };
    let mut out = HashMap::new();
    // SAFETY: the calls follow the driver API's contract: cuInit(0) first,
    // then queries with valid out-pointers to locals of the right size.
    unsafe {
        if init(0) != 0 {
            return out;
        }
        let mut n: c_int = 0;
        if count(&mut n) != 0 {
            return out;
        }
        for ordinal in 0..n {
            let mut dev: c_int = 0;
            let mut id = [0u8; 16];
            let mut sms: c_int = 0;
            if get(&mut dev, ordinal) == 0
                && uuid(&mut id, dev) == 0
                && attr(&mut sms, MULTIPROCESSOR_COUNT, dev) == 0
                && let Ok(sms) = u32::try_from(sms)
            {
                out.insert(format_uuid(&id), sms);
            }
        }
    }
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
    }
}
