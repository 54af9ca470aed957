//! Device identity: names, UUIDs, serials, PCI information, architecture, minor numbers.

use super::*;

/// `nvmlDeviceGetName`.
///
/// # Safety
/// `name` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device_: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(name, length, &info(node, i)?.name) }
    })
}

/// `nvmlDeviceGetUUID`.
///
/// # Safety
/// `uuid` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device_: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(uuid, length, &info(node, i)?.uuid) }
    })
}

/// `nvmlDeviceGetSerial`.
///
/// # Safety
/// `serial` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device_: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        let u = info(node, i)?.uuid_bytes;
        let s = format!(
            "165{:010}",
            u64::from_be_bytes(u[..8].try_into().unwrap_or_default()) % 10_000_000_000
        );
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(serial, length, &s) }
    })
}

/// `nvmlDeviceGetIndex`.
///
/// # Safety
/// `index` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device_: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(index, nvml_index(node, i)) }
    })
}

/// `nvmlDeviceGetMinorNumber`: the index (as `/dev/nvidia<N>` would be).
///
/// # Safety
/// `minorNumber` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device_: nvmlDevice_t,
    minorNumber: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (_, i) = device(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(minorNumber, i) }
    })
}

/// `nvmlDeviceGetBrand`.
///
/// # Safety
/// `type_` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device_: nvmlDevice_t,
    type_: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    guard(|| {
        device(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(type_, nvmlBrandType_t::NVML_BRAND_NVIDIA) }
    })
}

/// `nvmlDeviceGetArchitecture`: from the compute capability.
///
/// # Safety
/// `arch` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device_: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        let d = info(node, i)?;
        let a = match (d.cc_major, d.cc_minor) {
            (7, 0) | (7, 2) => NVML_DEVICE_ARCH_VOLTA,
            (7, _) => NVML_DEVICE_ARCH_TURING,
            (8, 9) => NVML_DEVICE_ARCH_ADA,
            (8, _) => NVML_DEVICE_ARCH_AMPERE,
            (9, _) => NVML_DEVICE_ARCH_HOPPER,
            (10, _) | (12, _) => NVML_DEVICE_ARCH_BLACKWELL,
            _ => NVML_DEVICE_ARCH_UNKNOWN,
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(arch, a) }
    })
}

fn pci_info(d: nvmlDevice_t, out: *mut nvmlPciInfo_t) -> NvResult<()> {
    let (node, i) = device(d)?;
    let di = info(node, i)?;
    let mut p = nvmlPciInfo_t {
        domain: di.pci_domain,
        bus: di.pci_bus,
        device: di.pci_device,
        pciDeviceId: 0x2330_10de,
        pciSubSystemId: 0x16c1_10de,
        ..Default::default()
    };
    let long = tessera_ffi::nvml_extra::pci_bus_id(di.pci_domain, di.pci_bus, di.pci_device);
    let short =
        tessera_ffi::nvml_extra::pci_bus_id_legacy(di.pci_domain, di.pci_bus, di.pci_device);
    for (dst, src) in p.busId.iter_mut().zip(long.bytes()) {
        *dst = src as c_char;
    }
    for (dst, src) in p.busIdLegacy.iter_mut().zip(short.bytes()) {
        *dst = src as c_char;
    }
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(out, p) }
}

tessera_sim::exports! {
    /// `nvmlDeviceGetPciInfo_v3`, `nvmlDeviceGetPciInfo_v2`.
    ///
    /// # Safety
    /// `pci` must be null or writable.
    fn [nvmlDeviceGetPciInfo_v3, nvmlDeviceGetPciInfo_v2](
        device_: nvmlDevice_t,
        pci: *mut nvmlPciInfo_t,
    ) -> nvmlReturn_t {
        guard(|| pci_info(device_, pci))
    }
}

/// `nvmlDeviceGetCudaComputeCapability`.
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device_: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        let d = info(node, i)?;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(major, d.cc_major as c_int)?;
            put(minor, d.cc_minor as c_int)
        }
    })
}
