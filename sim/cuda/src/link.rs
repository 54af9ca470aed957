//! The JIT linker (`cuLink*`): not here, since nothing is compiled. PyTorch resolves these
//! by name when it initialises CUDA, so they exist and refuse.

use std::ffi::{c_char, c_uint, c_void};

use tessera_ffi::cuda::*;

/// `cuLinkCreate_v2`: no JIT linker here (nothing is compiled): `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkCreate_v2(
    _numOptions: c_uint,
    _options: *mut CUjit_option,
    _optionValues: *mut *mut c_void,
    _stateOut: *mut CUlinkState,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuLinkAddData_v2`: no JIT linker (`CUDA_ERROR_NOT_SUPPORTED`).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData_v2(
    _state: CUlinkState,
    _type_: CUjitInputType,
    _data: *mut c_void,
    _size: usize,
    _name: *const c_char,
    _numOptions: c_uint,
    _options: *mut CUjit_option,
    _optionValues: *mut *mut c_void,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuLinkComplete`: no JIT linker (`CUDA_ERROR_NOT_SUPPORTED`).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkComplete(
    _state: CUlinkState,
    _cubinOut: *mut *mut c_void,
    _sizeOut: *mut usize,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuLinkDestroy`: no link state can exist (`CUDA_ERROR_INVALID_HANDLE`).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkDestroy(_state: CUlinkState) -> CUresult {
    CUresult::CUDA_ERROR_INVALID_HANDLE
}
