//! Driver functions NVIDIA's CUDA runtime resolves and the simulator lacked, added so that
//! the runtime's calls built on them work: `cuPointerGetAttributes` (behind
//! `cudaPointerGetAttributes`, which CuPy calls before every host-to-device copy), and the
//! peer-access queries of a node whose devices cannot reach each other.

use std::ffi::{c_int, c_uint, c_void};

use tessera_ffi::cuda::*;

use crate::memory::cuPointerGetAttribute;
use crate::runtime::rt;
use crate::{CuResult, guard, put};

/// Bytes `cuPointerGetAttributes` writes for `attr` (`None`: an attribute it does not know).
fn attribute_size(attr: CUpointer_attribute) -> Option<usize> {
    use CUpointer_attribute as P;
    Some(match attr {
        P::CU_POINTER_ATTRIBUTE_CONTEXT
        | P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER
        | P::CU_POINTER_ATTRIBUTE_HOST_POINTER
        | P::CU_POINTER_ATTRIBUTE_BUFFER_ID
        | P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
        | P::CU_POINTER_ATTRIBUTE_RANGE_SIZE
        | P::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
        | P::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
        | P::CU_POINTER_ATTRIBUTE_MAPPING_SIZE
        | P::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
        | P::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => 8,
        P::CU_POINTER_ATTRIBUTE_P2P_TOKENS => 16,
        P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE
        | P::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS
        | P::CU_POINTER_ATTRIBUTE_IS_MANAGED
        | P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        | P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
        | P::CU_POINTER_ATTRIBUTE_MAPPED
        | P::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
        | P::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS
        | P::CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE => 4,
        _ => return None,
    })
}

/// `cuPointerGetAttributes`: each attribute as `cuPointerGetAttribute` answers it. Unlike
/// that call, a pointer CUDA does not know is not an error: its attributes read as zero
/// (memory type 0, "unregistered"), and its device ordinal as -2, as the driver documents.
///
/// # Safety
/// `attributes` and `data` must be null or hold `numAttributes` entries; each `data[i]`
/// must be valid for writing its attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    numAttributes: c_uint,
    attributes: *mut CUpointer_attribute,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        rt()?;
        if numAttributes == 0 || attributes.is_null() || data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let n = numAttributes as usize;
        // SAFETY: non-null, and the caller promises `numAttributes` entries in each.
        let (attrs, outs) = unsafe {
            (
                std::slice::from_raw_parts(attributes, n),
                std::slice::from_raw_parts(data, n),
            )
        };
        for (&attr, &out) in attrs.iter().zip(outs) {
            let size = attribute_size(attr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            if out.is_null() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `out` is non-null and sized for the attribute by the caller's contract.
            let rc = unsafe { cuPointerGetAttribute(out, attr, ptr) };
            match rc {
                CUresult::CUDA_SUCCESS => {}
                CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_NOT_SUPPORTED => {
                    // SAFETY: as above, `size` bytes are writable at `out`.
                    unsafe { std::ptr::write_bytes(out.cast::<u8>(), 0, size) };
                    if attr == CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
                        && rc == CUresult::CUDA_ERROR_INVALID_VALUE
                    {
                        // SAFETY: as above; the ordinal is an int.
                        unsafe { out.cast::<c_int>().write(-2) };
                    }
                }
                e => return Err(e),
            }
        }
        Ok(())
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
