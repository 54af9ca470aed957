//! Tensor maps (the descriptors of TMA copies): encoded as an opaque descriptor holding
//! the address, which kernels here never read. PyTorch resolves these by name when it
//! initialises CUDA, so they exist, doing what the simulator can.

use std::ffi::{c_int, c_void};

use tessera_ffi::cuda::*;

use crate::{CuResult, guard, put};

/// Writes the opaque descriptor of a tensor map here: just the address, for a rank from
/// `min_rank` to 5.
///
/// # Safety
/// `tensorMap` must be null (rejected) or writable.
unsafe fn put_tensor_map(
    tensorMap: *mut CUtensorMap,
    rank: cuuint32_t,
    min_rank: cuuint32_t,
    globalAddress: *mut c_void,
) -> CuResult<()> {
    if !(min_rank..=5).contains(&rank) || globalAddress.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut map = CUtensorMap { opaque: [0; 16] };
    map.opaque[0] = globalAddress as u64;
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(tensorMap, map) }
}

/// The tensor-map encoders: the parameters they share (the descriptor, element type,
/// rank, address and global shape first; element strides and the layout enums last)
/// written once, each encoder's own box parameters between them. None but the rank and
/// the address is read: the descriptor is opaque and kernels never read it here.
macro_rules! tensor_map_encoders {
    ($($(#[$attr:meta])* fn $name:ident($($own:ident: $oty:ty),*) min_rank $min:literal;)*) => {$(
        $(#[$attr])*
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            tensorMap: *mut CUtensorMap,
            _tensorDataType: CUtensorMapDataType,
            tensorRank: cuuint32_t,
            globalAddress: *mut c_void,
            _globalDim: *const cuuint64_t,
            _globalStrides: *const cuuint64_t,
            $($own: $oty,)*
            _elementStrides: *const cuuint32_t,
            _interleave: CUtensorMapInterleave,
            _swizzle: CUtensorMapSwizzle,
            _l2Promotion: CUtensorMapL2promotion,
            _oobFill: CUtensorMapFloatOOBfill,
        ) -> CUresult {
            // SAFETY: the caller's contract.
            guard(|| unsafe { put_tensor_map(tensorMap, tensorRank, $min, globalAddress) })
        }
    )*};
}

tensor_map_encoders! {
    /// `cuTensorMapEncodeTiled`: checks the rank and writes an opaque descriptor (zeros
    /// with the address first); kernels never read it here.
    ///
    /// # Safety
    /// `tensorMap` must be null or writable; the array arguments are not read.
    fn cuTensorMapEncodeTiled(_boxDim: *const cuuint32_t) min_rank 1;

    /// `cuTensorMapEncodeIm2col`: as `cuTensorMapEncodeTiled`, an opaque descriptor
    /// holding the address (rank 3 to 5).
    ///
    /// # Safety
    /// `tensorMap` must be null or writable; the array arguments are not read.
    fn cuTensorMapEncodeIm2col(
        _pixelBoxLowerCorner: *const c_int,
        _pixelBoxUpperCorner: *const c_int,
        _channelsPerPixel: cuuint32_t,
        _pixelsPerColumn: cuuint32_t
    ) min_rank 3;
}

/// `cuTensorMapReplaceAddress`: rewrites the address in a descriptor made here.
///
/// # Safety
/// `tensorMap` must be null or a valid, writable descriptor.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTensorMapReplaceAddress(
    tensorMap: *mut CUtensorMap,
    globalAddress: *mut c_void,
) -> CUresult {
    guard(|| {
        if tensorMap.is_null() || globalAddress.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { (*tensorMap).opaque[0] = globalAddress as u64 };
        Ok(())
    })
}
