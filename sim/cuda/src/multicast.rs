//! Multicast objects: not supported, as multicast needs the NVLink switches the simulated
//! node lacks. PyTorch resolves these by name when it initialises CUDA (a failed lookup
//! would leave an error for its next check), so they exist and answer
//! `CUDA_ERROR_NOT_SUPPORTED`.

use tessera_ffi::cuda::*;

/// `cuMulticastCreate`: multicast objects need NVLink switches the simulated node lacks.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastCreate(
    _mcHandle: *mut CUmemGenericAllocationHandle,
    _prop: *const CUmulticastObjectProp,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMulticastAddDevice`: not supported (no multicast objects).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastAddDevice(
    _mcHandle: CUmemGenericAllocationHandle,
    _dev: CUdevice,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMulticastBindMem`: not supported (no multicast objects).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastBindMem(
    _mcHandle: CUmemGenericAllocationHandle,
    _mcOffset: usize,
    _memHandle: CUmemGenericAllocationHandle,
    _memOffset: usize,
    _size: usize,
    _flags: std::ffi::c_ulonglong,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMulticastUnbind`: not supported (no multicast objects).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastUnbind(
    _mcHandle: CUmemGenericAllocationHandle,
    _dev: CUdevice,
    _mcOffset: usize,
    _size: usize,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
