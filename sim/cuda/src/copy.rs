//! Copies and memsets. Bytes really move (device memory is host memory, see `memory`).
//! Every device-side range is checked against the allocation table first, so an invalid
//! or out-of-range device pointer is `CUDA_ERROR_INVALID_VALUE`, never a fault.
//!
//! Synchronous variants first wait for the work queued before them (the legacy default
//! stream's, or the calling thread's per-thread stream for `_ptds`), as the driver does.
//! Asynchronous variants move the bytes at once and queue nothing on the device engine
//! (copies use copy engines on a real GPU; no copy time is simulated).

use std::ffi::{c_uint, c_ushort, c_void};

use tessera_ffi::cuda::*;

use crate::memory::{check_any_range, check_device_range, check_host_range};
use crate::runtime::rt;
use crate::stream::{Target, resolve};
use crate::{CuResult, get, guard};

/// What kind of address one side of a copy must be.
#[derive(Debug, Clone, Copy)]
enum Side {
    Device,
    Host,
    /// A unified address: device or host.
    Any,
}

fn check(side: Side, ptr: u64, len: u64) -> CuResult<()> {
    match side {
        Side::Device if len == 0 => Ok(()),
        Side::Device => check_device_side(ptr, len),
        Side::Host => check_host_range(ptr, len),
        Side::Any => check_any_range(ptr, len),
    }
}

/// Checks the device side of a copy or memset: live device memory, or page-locked host
/// memory of ours (`cuMemHostAlloc`, `cuMemAllocHost`), which the device addresses too, so
/// the driver copies from and memsets it as device memory (XLA's autotuner clears and reads
/// back a small pinned result buffer that way). Any other host pointer is refused.
fn check_device_side(ptr: u64, len: u64) -> CuResult<()> {
    let pinned = crate::memory::find_host(ptr).is_some_and(|h| {
        !h.registered && ptr.checked_add(len).is_some_and(|e| e <= h.base + h.size)
    });
    if pinned {
        return Ok(());
    }
    check_device_range(ptr, len)
}

/// Waits for what a synchronous call must wait for: all of the context's earlier work
/// (legacy stream) or the calling thread's per-thread stream (`_ptds`).
fn wait_before_sync_call(per_thread: bool) -> CuResult<()> {
    let rt = rt()?;
    let t = resolve(std::ptr::null_mut(), per_thread)?;
    rt.check_device(t.ctx().device)?;
    let until = match &t {
        Target::Legacy(ctx) => ctx.last_end.load(std::sync::atomic::Ordering::Acquire),
        Target::Stream(_) => t.last_end(),
    };
    // A synchronous copy's completion is a round trip like a synchronisation's.
    rt.costs.wait_for(until);
    Ok(())
}

/// Checks a stream argument of an async call.
fn check_stream(stream: CUstream, per_thread: bool) -> CuResult<()> {
    let rt = rt()?;
    let t = resolve(stream, per_thread)?;
    rt.check_device(t.ctx().device)
}

fn copy(dst: u64, dside: Side, src: u64, sside: Side, n: usize) -> CuResult<()> {
    let len = n as u64;
    check(dside, dst, len)?;
    check(sside, src, len)?;
    if n > 0 {
        // SAFETY: both ranges were checked: device sides lie in live read-write mappings
        // of the arena, host sides are the caller's memory by the API's contract. `copy`
        // tolerates overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
    Ok(())
}

macro_rules! copy_fns {
    ($($(#[$doc:meta])* $sync:ident / $sync_ptds:ident, $async_:ident / $async_ptsz:ident :
        ($dst:ident : $dty:ty = $dside:ident, $src:ident : $sty:ty = $sside:ident);)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// Host pointers must be valid for `ByteCount` bytes; device pointers are checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sync($dst: $dty, $src: $sty, ByteCount: usize) -> CUresult {
            guard(|| {
                wait_before_sync_call(false)?;
                copy($dst as u64, Side::$dside, $src as u64, Side::$sside, ByteCount)
            })
        }

        /// The per-thread-default-stream variant.
        ///
        /// # Safety
        /// As the legacy-stream variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sync_ptds($dst: $dty, $src: $sty, ByteCount: usize) -> CUresult {
            guard(|| {
                wait_before_sync_call(true)?;
                copy($dst as u64, Side::$dside, $src as u64, Side::$sside, ByteCount)
            })
        }

        /// The asynchronous variant (bytes move at once).
        ///
        /// # Safety
        /// As the synchronous variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $async_($dst: $dty, $src: $sty, ByteCount: usize, hStream: CUstream) -> CUresult {
            guard(|| {
                check_stream(hStream, false)?;
                copy($dst as u64, Side::$dside, $src as u64, Side::$sside, ByteCount)
            })
        }

        /// The asynchronous per-thread-default-stream variant.
        ///
        /// # Safety
        /// As the synchronous variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $async_ptsz($dst: $dty, $src: $sty, ByteCount: usize, hStream: CUstream) -> CUresult {
            guard(|| {
                check_stream(hStream, true)?;
                copy($dst as u64, Side::$dside, $src as u64, Side::$sside, ByteCount)
            })
        }
    )*};
}

copy_fns! {
    /// `cuMemcpy`: unified addresses on both sides.
    cuMemcpy / cuMemcpy_ptds, cuMemcpyAsync / cuMemcpyAsync_ptsz:
        (dst: CUdeviceptr = Any, src: CUdeviceptr = Any);
    /// `cuMemcpyHtoD_v2`.
    cuMemcpyHtoD_v2 / cuMemcpyHtoD_v2_ptds, cuMemcpyHtoDAsync_v2 / cuMemcpyHtoDAsync_v2_ptsz:
        (dstDevice: CUdeviceptr = Device, srcHost: *const c_void = Host);
    /// `cuMemcpyDtoH_v2`.
    cuMemcpyDtoH_v2 / cuMemcpyDtoH_v2_ptds, cuMemcpyDtoHAsync_v2 / cuMemcpyDtoHAsync_v2_ptsz:
        (dstHost: *mut c_void = Host, srcDevice: CUdeviceptr = Device);
    /// `cuMemcpyDtoD_v2`.
    cuMemcpyDtoD_v2 / cuMemcpyDtoD_v2_ptds, cuMemcpyDtoDAsync_v2 / cuMemcpyDtoDAsync_v2_ptsz:
        (dstDevice: CUdeviceptr = Device, srcDevice: CUdeviceptr = Device);
}

fn peer(
    dst: CUdeviceptr,
    dctx: CUcontext,
    src: CUdeviceptr,
    sctx: CUcontext,
    n: usize,
) -> CuResult<()> {
    crate::context::lookup(dctx)?;
    crate::context::lookup(sctx)?;
    copy(dst, Side::Device, src, Side::Device, n)
}

/// `cuMemcpyPeer`.
///
/// # Safety
/// Device pointers are checked; handles are looked up.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeer(
    dstDevice: CUdeviceptr,
    dstContext: CUcontext,
    srcDevice: CUdeviceptr,
    srcContext: CUcontext,
    ByteCount: usize,
) -> CUresult {
    guard(|| {
        wait_before_sync_call(false)?;
        peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount)
    })
}

/// `cuMemcpyPeerAsync`.
///
/// # Safety
/// Device pointers are checked; handles are looked up.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dstDevice: CUdeviceptr,
    dstContext: CUcontext,
    srcDevice: CUdeviceptr,
    srcContext: CUcontext,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    guard(|| {
        check_stream(hStream, false)?;
        peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount)
    })
}

// ---- 2D copies ----

fn side_of(t: CUmemorytype) -> CuResult<Side> {
    match t {
        CUmemorytype::CU_MEMORYTYPE_DEVICE => Ok(Side::Device),
        CUmemorytype::CU_MEMORYTYPE_HOST => Ok(Side::Host),
        CUmemorytype::CU_MEMORYTYPE_UNIFIED => Ok(Side::Any),
        CUmemorytype::CU_MEMORYTYPE_ARRAY => Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

fn copy_2d(p: &CUDA_MEMCPY2D) -> CuResult<()> {
    let (w, h) = (p.WidthInBytes as u64, p.Height as u64);
    if w == 0 || h == 0 {
        return Ok(());
    }
    let sside = side_of(p.srcMemoryType)?;
    let dside = side_of(p.dstMemoryType)?;
    if (h > 1 && (p.srcPitch < p.WidthInBytes || p.dstPitch < p.WidthInBytes))
        || p.srcPitch > (1 << 40)
        || p.dstPitch > (1 << 40)
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let sbase = match sside {
        Side::Host => p.srcHost as u64,
        _ => p.srcDevice,
    };
    let dbase = match dside {
        Side::Host => p.dstHost as u64,
        _ => p.dstDevice,
    };
    let first = |base: u64, x: usize, y: usize, pitch: usize| {
        (y as u64)
            .checked_mul(pitch as u64)
            .and_then(|o| o.checked_add(x as u64))
            .and_then(|o| base.checked_add(o))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    };
    let s0 = first(sbase, p.srcXInBytes, p.srcY, p.srcPitch)?;
    let d0 = first(dbase, p.dstXInBytes, p.dstY, p.dstPitch)?;
    // The whole span from the first row's start to the last row's end must be valid.
    let span = |pitch: usize| (h - 1) * pitch as u64 + w;
    check(sside, s0, span(p.srcPitch))?;
    check(dside, d0, span(p.dstPitch))?;
    for row in 0..h {
        let s = s0 + row * p.srcPitch as u64;
        let d = d0 + row * p.dstPitch as u64;
        // SAFETY: every row lies inside the spans checked above.
        unsafe { std::ptr::copy(s as *const u8, d as *mut u8, w as usize) };
    }
    Ok(())
}

macro_rules! copy2d_sync {
    ($($(#[$doc:meta])* $name:ident, $ptds:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// `pCopy` must be null or valid; its host pointers valid for the rows described.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(pCopy: *const CUDA_MEMCPY2D) -> CUresult {
            guard(|| {
                wait_before_sync_call($ptds)?;
                // SAFETY: the caller passes null (rejected) or a valid descriptor.
                copy_2d(unsafe { get(pCopy) }?)
            })
        }
    )*};
}

copy2d_sync! {
    /// `cuMemcpy2D_v2`.
    cuMemcpy2D_v2, false;
    /// `cuMemcpy2D_v2_ptds`.
    cuMemcpy2D_v2_ptds, true;
    /// `cuMemcpy2DUnaligned_v2`.
    cuMemcpy2DUnaligned_v2, false;
    /// `cuMemcpy2DUnaligned_v2_ptds`.
    cuMemcpy2DUnaligned_v2_ptds, true;
}

crate::ptsz_exports! {
    /// `cuMemcpy2DAsync_v2`.
    ///
    /// # Safety
    /// `pCopy` must be null or valid; its host pointers valid for the rows described.
    fn cuMemcpy2DAsync_v2 / cuMemcpy2DAsync_v2_ptsz [per_thread](
        pCopy: *const CUDA_MEMCPY2D,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| {
            check_stream(hStream, per_thread)?;
            // SAFETY: the caller passes null (rejected) or a valid descriptor.
            copy_2d(unsafe { get(pCopy) }?)
        })
    }
}

// ---- memsets ----

/// Fills `height` rows of `width` elements of `elem` bytes, `pitch` bytes apart.
fn fill(dst: u64, pitch: u64, value: u32, elem: u64, width: u64, height: u64) -> CuResult<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    if !dst.is_multiple_of(elem)
        || (height > 1 && (!pitch.is_multiple_of(elem) || pitch < width * elem))
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let row = width
        .checked_mul(elem)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let span = (height - 1)
        .checked_mul(pitch)
        .and_then(|s| s.checked_add(row))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    check_device_side(dst, span)?;
    for r in 0..height {
        let start = dst + r * pitch;
        // SAFETY: each row lies inside the checked span of live device memory or of one of
        // our own pinned host allocations, and `start` is aligned to `elem` (checked above)
        // so the typed slices are aligned.
        unsafe {
            match elem {
                1 => std::slice::from_raw_parts_mut(start as *mut u8, width as usize)
                    .fill(value as u8),
                2 => std::slice::from_raw_parts_mut(start as *mut u16, width as usize)
                    .fill(value as u16),
                _ => std::slice::from_raw_parts_mut(start as *mut u32, width as usize).fill(value),
            }
        }
    }
    Ok(())
}

macro_rules! memset_fns {
    ($($(#[$doc:meta])* $sync:ident / $sync_ptds:ident, $async_:ident / $async_ptsz:ident : $vty:ty, $elem:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The device range is checked; no host memory is touched.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sync(dstDevice: CUdeviceptr, value: $vty, N: usize) -> CUresult {
            guard(|| {
                wait_before_sync_call(false)?;
                fill(dstDevice, 0, value as u32, $elem, N as u64, 1)
            })
        }

        /// The per-thread-default-stream variant.
        ///
        /// # Safety
        /// As the legacy-stream variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sync_ptds(dstDevice: CUdeviceptr, value: $vty, N: usize) -> CUresult {
            guard(|| {
                wait_before_sync_call(true)?;
                fill(dstDevice, 0, value as u32, $elem, N as u64, 1)
            })
        }

        /// The asynchronous variant.
        ///
        /// # Safety
        /// As the synchronous variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $async_(dstDevice: CUdeviceptr, value: $vty, N: usize, hStream: CUstream) -> CUresult {
            guard(|| {
                check_stream(hStream, false)?;
                fill(dstDevice, 0, value as u32, $elem, N as u64, 1)
            })
        }

        /// The asynchronous per-thread-default-stream variant.
        ///
        /// # Safety
        /// As the synchronous variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $async_ptsz(dstDevice: CUdeviceptr, value: $vty, N: usize, hStream: CUstream) -> CUresult {
            guard(|| {
                check_stream(hStream, true)?;
                fill(dstDevice, 0, value as u32, $elem, N as u64, 1)
            })
        }
    )*};
}

memset_fns! {
    /// `cuMemsetD8_v2`.
    cuMemsetD8_v2 / cuMemsetD8_v2_ptds, cuMemsetD8Async / cuMemsetD8Async_ptsz: u8, 1;
    /// `cuMemsetD16_v2` (the pointer must be 2-byte aligned).
    cuMemsetD16_v2 / cuMemsetD16_v2_ptds, cuMemsetD16Async / cuMemsetD16Async_ptsz: c_ushort, 2;
    /// `cuMemsetD32_v2` (the pointer must be 4-byte aligned).
    cuMemsetD32_v2 / cuMemsetD32_v2_ptds, cuMemsetD32Async / cuMemsetD32Async_ptsz: c_uint, 4;
}

macro_rules! memset2d_fns {
    ($($(#[$doc:meta])* $sync:ident / $sync_ptds:ident, $async_:ident / $async_ptsz:ident : $vty:ty, $elem:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The device range is checked; no host memory is touched.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sync(dstDevice: CUdeviceptr, dstPitch: usize, value: $vty, Width: usize, Height: usize) -> CUresult {
            guard(|| {
                wait_before_sync_call(false)?;
                fill(dstDevice, dstPitch as u64, value as u32, $elem, Width as u64, Height as u64)
            })
        }

        /// The per-thread-default-stream variant.
        ///
        /// # Safety
        /// As the legacy-stream variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sync_ptds(dstDevice: CUdeviceptr, dstPitch: usize, value: $vty, Width: usize, Height: usize) -> CUresult {
            guard(|| {
                wait_before_sync_call(true)?;
                fill(dstDevice, dstPitch as u64, value as u32, $elem, Width as u64, Height as u64)
            })
        }

        /// The asynchronous variant.
        ///
        /// # Safety
        /// As the synchronous variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $async_(dstDevice: CUdeviceptr, dstPitch: usize, value: $vty, Width: usize, Height: usize, hStream: CUstream) -> CUresult {
            guard(|| {
                check_stream(hStream, false)?;
                fill(dstDevice, dstPitch as u64, value as u32, $elem, Width as u64, Height as u64)
            })
        }

        /// The asynchronous per-thread-default-stream variant.
        ///
        /// # Safety
        /// As the synchronous variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $async_ptsz(dstDevice: CUdeviceptr, dstPitch: usize, value: $vty, Width: usize, Height: usize, hStream: CUstream) -> CUresult {
            guard(|| {
                check_stream(hStream, true)?;
                fill(dstDevice, dstPitch as u64, value as u32, $elem, Width as u64, Height as u64)
            })
        }
    )*};
}

memset2d_fns! {
    /// `cuMemsetD2D8_v2`.
    cuMemsetD2D8_v2 / cuMemsetD2D8_v2_ptds, cuMemsetD2D8Async / cuMemsetD2D8Async_ptsz: u8, 1;
    /// `cuMemsetD2D16_v2`.
    cuMemsetD2D16_v2 / cuMemsetD2D16_v2_ptds, cuMemsetD2D16Async / cuMemsetD2D16Async_ptsz: c_ushort, 2;
    /// `cuMemsetD2D32_v2`.
    cuMemsetD2D32_v2 / cuMemsetD2D32_v2_ptds, cuMemsetD2D32Async / cuMemsetD2D32Async_ptsz: c_uint, 4;
}
