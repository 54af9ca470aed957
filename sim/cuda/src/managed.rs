//! Managed-memory hints: `cuMemAdvise` and `cuMemPrefetchAsync` (both forms of each).
//! Managed memory lives on its device here, so a hint on a valid managed range is checked
//! and accepted, and there is nothing to migrate.

use std::ffi::c_uint;

use tessera_ffi::cuda::*;

use crate::memory::cuPointerGetAttribute;
use crate::runtime::rt;
use crate::{CuResult, guard};

/// Checks that `[ptr, ptr + count)` starts in managed memory, as the hints require.
fn managed(ptr: CUdeviceptr, count: usize) -> CuResult<()> {
    rt()?;
    if count == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut is_managed: c_uint = 0;
    // SAFETY: a local out value of the attribute's type.
    let rc = unsafe {
        cuPointerGetAttribute(
            (&raw mut is_managed).cast(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr,
        )
    };
    if rc != CUresult::CUDA_SUCCESS || is_managed == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// `cuMemAdvise` (CUDA 8 form): accepted for managed memory and ignored (managed memory
/// lives on its device here; there is no migration to advise).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAdvise(
    devPtr: CUdeviceptr,
    count: usize,
    _advice: CUmem_advise,
    device: CUdevice,
) -> CUresult {
    guard(|| {
        managed(devPtr, count)?;
        // CU_DEVICE_CPU (-1) is a valid target.
        if device != -1 {
            rt()?.device(device)?;
        }
        Ok(())
    })
}

/// `cuMemAdvise_v2` (CUDA 12.2 form, a location): as [`cuMemAdvise`].
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAdvise_v2(
    devPtr: CUdeviceptr,
    count: usize,
    _advice: CUmem_advise,
    location: CUmemLocation,
) -> CUresult {
    guard(|| {
        managed(devPtr, count)?;
        location_ok(&location)
    })
}

fn location_ok(location: &CUmemLocation) -> CuResult<()> {
    use CUmemLocationType as L;
    match location.type_ {
        L::CU_MEM_LOCATION_TYPE_DEVICE => rt()?.device(location.id).map(|_| ()),
        L::CU_MEM_LOCATION_TYPE_HOST
        | L::CU_MEM_LOCATION_TYPE_HOST_NUMA
        | L::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(()),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

fn prefetch(ptr: CUdeviceptr, count: usize, stream: CUstream, per_thread: bool) -> CuResult<()> {
    managed(ptr, count)?;
    crate::stream::resolve(stream, per_thread)?;
    Ok(())
}

/// A prefetch to device `dst`, or to the host (`CU_DEVICE_CPU`, -1).
fn prefetch_to(
    ptr: CUdeviceptr,
    count: usize,
    dst: CUdevice,
    stream: CUstream,
    pt: bool,
) -> CuResult<()> {
    if dst != -1 {
        rt()?.device(dst)?;
    }
    prefetch(ptr, count, stream, pt)
}

crate::ptsz_exports! {
    /// `cuMemPrefetchAsync` (CUDA 8 form): managed memory already lives on its device here,
    /// so a prefetch of a valid managed range to a valid device (or `CU_DEVICE_CPU`) is done
    /// at once.
    ///
    /// # Safety
    /// No pointer is dereferenced.
    fn cuMemPrefetchAsync / cuMemPrefetchAsync_ptsz [per_thread](
        devPtr: CUdeviceptr,
        count: usize,
        dstDevice: CUdevice,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| prefetch_to(devPtr, count, dstDevice, hStream, per_thread))
    }
}

crate::ptsz_exports! {
    /// `cuMemPrefetchAsync_v2` (CUDA 12.2 form, a location); `flags` must be 0.
    ///
    /// # Safety
    /// No pointer is dereferenced.
    fn cuMemPrefetchAsync_v2 / cuMemPrefetchAsync_v2_ptsz [per_thread](
        devPtr: CUdeviceptr,
        count: usize,
        location: CUmemLocation,
        flags: c_uint,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| {
            if flags != 0 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            location_ok(&location)?;
            prefetch(devPtr, count, hStream, per_thread)
        })
    }
}
