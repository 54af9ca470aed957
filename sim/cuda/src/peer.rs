//! Peer access between devices: the queries and the context-level enable/disable.
//! Simulated devices have no peer links, so every query answers "no" and enabling access
//! is refused.

use std::ffi::{c_int, c_uint};

use tessera_ffi::cuda::*;

use crate::runtime::rt;
use crate::{CuResult, guard, put};

/// `cuDeviceCanAccessPeer`: peer access is not simulated, so never.
///
/// # Safety
/// `canAccessPeer` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    canAccessPeer: *mut c_int,
    dev: CUdevice,
    peerDev: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        rt.device(dev)?;
        rt.device(peerDev)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(canAccessPeer, 0) }
    })
}

fn peer_devices(dev: CUdevice, peer: CUdevice) -> CuResult<()> {
    let rt = rt()?;
    rt.device(dev)?;
    rt.device(peer)?;
    Ok(())
}

/// `cuDeviceGetP2PAttribute`: simulated devices have no peer links, so every attribute
/// reads 0 (the same device is not a valid pair, as with the driver).
///
/// # Safety
/// `value` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    _attrib: CUdevice_P2PAttribute,
    srcDevice: CUdevice,
    dstDevice: CUdevice,
) -> CUresult {
    guard(|| {
        peer_devices(srcDevice, dstDevice)?;
        if srcDevice == dstDevice {
            return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        // SAFETY: the caller's out pointer; null is rejected.
        unsafe { put(value, 0) }
    })
}

/// `cuCtxEnablePeerAccess`: no peer access between simulated devices.
///
/// # Safety
/// Any handle value is accepted; it is looked up, never dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peerContext: CUcontext, _Flags: c_uint) -> CUresult {
    guard(|| {
        crate::context::lookup(peerContext)?;
        Err(CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
    })
}

/// `cuCtxDisablePeerAccess`: access was never enabled.
///
/// # Safety
/// Any handle value is accepted; it is looked up, never dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peerContext: CUcontext) -> CUresult {
    guard(|| {
        crate::context::lookup(peerContext)?;
        Err(CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    })
}
