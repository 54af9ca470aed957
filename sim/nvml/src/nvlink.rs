//! NVLink and fabric queries PyTorch resolves by name when it sets up CUDA (its driver
//! API table requires the symbols): the simulated node has no NVLink and no fabric, so a
//! known device answers `NVML_ERROR_NOT_SUPPORTED`, as a PCIe GPU's NVML does.

use std::ffi::c_void;

use super::*;

/// `nvmlDeviceGetNvLinkRemoteDeviceType`: no NVLink links.
///
/// # Safety
/// The out pointer is not written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device_: nvmlDevice_t,
    _link: c_uint,
    _pNvLinkDeviceType: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)
    })
}

/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: no NVLink links.
///
/// # Safety
/// The out pointer is not written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device_: nvmlDevice_t,
    _link: c_uint,
    _pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)
    })
}

/// `nvmlDeviceGetGpuFabricInfoV`: not part of a fabric.
///
/// # Safety
/// The out pointer is not written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device_: nvmlDevice_t,
    _gpuFabricInfo: *mut c_void,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)
    })
}
