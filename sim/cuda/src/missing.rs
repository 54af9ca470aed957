//! Driver functions NVIDIA's CUDA runtime resolves and the simulator lacked, added so that
//! the runtime's calls built on them work: `cuPointerGetAttributes` (behind
//! `cudaPointerGetAttributes`, which CuPy calls before every host-to-device copy), the
//! peer-access queries of a node whose devices cannot reach each other, stream callbacks,
//! the thread's stream-capture mode (which PyTorch's allocator switches around its
//! `cudaMalloc` calls), managed-memory hints, and the persisting-L2 reset.

use std::cell::Cell;
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

crate::ptsz_exports! {
    /// `cuStreamAddCallback`: runs `callback(stream, CUDA_SUCCESS, userData)` once the stream's
    /// earlier work has ended, on the calling thread (as `cuLaunchHostFunc` does here).
    /// `flags` must be 0.
    ///
    /// # Safety
    /// `callback` must be a valid stream callback for `userData`.
    fn cuStreamAddCallback / cuStreamAddCallback_ptsz [per_thread](
        hStream: CUstream,
        callback: CUstreamCallback,
        userData: *mut c_void,
        flags: c_uint,
    ) -> CUresult {
        guard(|| stream_callback(hStream, callback, userData, flags, per_thread))
    }
}

fn stream_callback(
    stream: CUstream,
    callback: CUstreamCallback,
    user: *mut c_void,
    flags: c_uint,
    per_thread: bool,
) -> CuResult<()> {
    let rt = rt()?;
    let f = callback.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let t = crate::stream::resolve(stream, per_thread)?;
    rt.check_device(t.ctx().device)?;
    tessera_sim::clock::sleep_until(t.last_end());
    // SAFETY: the program's callback with its own data and the stream it named, as the
    // driver calls it; its contract is the program's.
    unsafe { f(stream, CUresult::CUDA_SUCCESS, user) };
    Ok(())
}

thread_local! {
    /// This thread's stream-capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static CAPTURE_MODE: Cell<u32> = const { Cell::new(0) };
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's capture mode to `*mode` and
/// returns the previous one in `*mode`. The simulator records it; it does not restrict
/// what a thread may call during another thread's capture.
///
/// # Safety
/// `mode` must be null or valid for reading and writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(
    mode: *mut CUstreamCaptureMode,
) -> CUresult {
    guard(|| {
        if mode.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, readable by the caller's contract.
        let want = unsafe { mode.read() }.0;
        if want > CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED.0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let old = CAPTURE_MODE.with(|m| m.replace(want));
        // SAFETY: as above, writable.
        unsafe { mode.write(CUstreamCaptureMode(old)) };
        Ok(())
    })
}

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

/// `cuCtxResetPersistingL2Cache`: no persisting L2 lines exist here; success in a context.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    guard(|| {
        rt()?;
        crate::stream::resolve(std::ptr::null_mut(), false).map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_mode_is_exchanged_per_thread() {
        let mut m = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a local.
        let rc = unsafe { cuThreadExchangeStreamCaptureMode(&mut m) };
        assert_eq!(rc, CUresult::CUDA_SUCCESS);
        assert_eq!(m, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
        let mut back = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: a local.
        unsafe { cuThreadExchangeStreamCaptureMode(&mut back) };
        assert_eq!(back, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
        // Another thread has its own mode.
        std::thread::spawn(|| {
            let mut m = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
            // SAFETY: a local.
            unsafe { cuThreadExchangeStreamCaptureMode(&mut m) };
            assert_eq!(m, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
        })
        .join()
        .expect("thread");
        let mut bad = CUstreamCaptureMode(7);
        // SAFETY: a local.
        let rc = unsafe { cuThreadExchangeStreamCaptureMode(&mut bad) };
        assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
        // SAFETY: null is rejected.
        let rc = unsafe { cuThreadExchangeStreamCaptureMode(std::ptr::null_mut()) };
        assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
    }
}
