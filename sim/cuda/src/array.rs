//! CUDA arrays and mipmapped arrays: charged to the device by their size (width × height ×
//! depth × element size, every level of a mipmap), with no backing bytes — copies to and
//! from arrays are not simulated.

use std::sync::Arc;

use tessera_ffi::cuda::*;

use crate::registry::Registry;
use crate::runtime::{Runtime, current, rt};
use crate::{CuResult, get, guard, put};

#[derive(Debug)]
pub struct Array {
    pub device: usize,
    pub ctx_id: u64,
    pub desc: CUDA_ARRAY3D_DESCRIPTOR,
    /// Bytes charged for it (0 for a level of a mipmapped array, charged with the mipmap).
    pub charged: u64,
}

#[derive(Debug)]
pub struct Mipmap {
    pub device: usize,
    pub ctx_id: u64,
    pub charged: u64,
    /// Handles of the level arrays in `ARRAYS`.
    pub levels: Vec<usize>,
}

pub static ARRAYS: Registry<Array> = Registry::new();
pub static MIPMAPS: Registry<Mipmap> = Registry::new();

/// Bytes per element of one channel; `None` for formats not simulated.
pub fn format_size(f: CUarray_format) -> Option<u64> {
    use CUarray_format as F;
    Some(match f {
        F::CU_AD_FORMAT_UNSIGNED_INT8 | F::CU_AD_FORMAT_SIGNED_INT8 => 1,
        F::CU_AD_FORMAT_UNSIGNED_INT16 | F::CU_AD_FORMAT_SIGNED_INT16 | F::CU_AD_FORMAT_HALF => 2,
        F::CU_AD_FORMAT_UNSIGNED_INT32 | F::CU_AD_FORMAT_SIGNED_INT32 | F::CU_AD_FORMAT_FLOAT => 4,
        _ => return None,
    })
}

/// Bytes of an array with this descriptor (height and depth 0 count as 1).
pub fn array_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR) -> CuResult<u64> {
    let elem = format_size(d.Format).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if d.Width == 0 || ![1, 2, 4].contains(&d.NumChannels) || (d.Height == 0 && d.Depth != 0) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    [
        d.Width as u64,
        (d.Height as u64).max(1),
        (d.Depth as u64).max(1),
        elem,
        u64::from(d.NumChannels),
    ]
    .into_iter()
    .try_fold(1u64, u64::checked_mul)
    .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

/// The descriptor of mip level `level` (each dimension halved, at least 1 where used).
fn level_desc(d: &CUDA_ARRAY3D_DESCRIPTOR, level: u32) -> CUDA_ARRAY3D_DESCRIPTOR {
    let shrink = |v: usize| if v == 0 { 0 } else { (v >> level).max(1) };
    CUDA_ARRAY3D_DESCRIPTOR {
        Width: shrink(d.Width),
        Height: shrink(d.Height),
        Depth: shrink(d.Depth),
        ..*d
    }
}

fn create(rt: &Runtime, desc: CUDA_ARRAY3D_DESCRIPTOR) -> CuResult<usize> {
    let ctx = current()?;
    let bytes = array_bytes(&desc)?;
    rt.charge(ctx.device, bytes)?;
    Ok(ARRAYS.insert(Arc::new(Array {
        device: ctx.device,
        ctx_id: ctx.id,
        desc,
        charged: bytes,
    })))
}

/// `cuArrayCreate_v2`.
///
/// # Safety
/// `pHandle` must be null or writable; `pAllocateArray` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    pHandle: *mut CUarray,
    pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        // SAFETY: the caller passes null (rejected) or a valid descriptor.
        let d = unsafe { get(pAllocateArray) }?;
        if pHandle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let h = create(
            rt,
            CUDA_ARRAY3D_DESCRIPTOR {
                Width: d.Width,
                Height: d.Height,
                Depth: 0,
                Format: d.Format,
                NumChannels: d.NumChannels,
                Flags: 0,
            },
        )?;
        // SAFETY: checked non-null above.
        unsafe { pHandle.write(h as CUarray) };
        Ok(())
    })
}

/// `cuArray3DCreate_v2`.
///
/// # Safety
/// `pHandle` must be null or writable; `pAllocateArray` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    pHandle: *mut CUarray,
    pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        // SAFETY: the caller passes null (rejected) or a valid descriptor.
        let d = *unsafe { get(pAllocateArray) }?;
        if pHandle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let h = create(rt, d)?;
        // SAFETY: checked non-null above.
        unsafe { pHandle.write(h as CUarray) };
        Ok(())
    })
}

/// `cuArrayDestroy`. Levels of a mipmapped array are destroyed with it, not alone.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(hArray: CUarray) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let a = ARRAYS
            .get(hArray as usize)
            .filter(|a| a.charged > 0)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        ARRAYS.remove(hArray as usize);
        rt.uncharge(a.device, a.charged);
        Ok(())
    })
}

fn descriptor(h: CUarray) -> CuResult<CUDA_ARRAY3D_DESCRIPTOR> {
    rt()?;
    ARRAYS
        .get(h as usize)
        .map(|a| a.desc)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// `cuArrayGetDescriptor_v2`.
///
/// # Safety
/// `pArrayDescriptor` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(
    pArrayDescriptor: *mut CUDA_ARRAY_DESCRIPTOR,
    hArray: CUarray,
) -> CUresult {
    guard(|| {
        let d = descriptor(hArray)?;
        let out = CUDA_ARRAY_DESCRIPTOR {
            Width: d.Width,
            Height: d.Height,
            Format: d.Format,
            NumChannels: d.NumChannels,
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pArrayDescriptor, out) }
    })
}

/// `cuArray3DGetDescriptor_v2`.
///
/// # Safety
/// `pArrayDescriptor` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(
    pArrayDescriptor: *mut CUDA_ARRAY3D_DESCRIPTOR,
    hArray: CUarray,
) -> CUresult {
    guard(|| {
        let d = descriptor(hArray)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pArrayDescriptor, d) }
    })
}

/// `cuMipmappedArrayCreate`: charged for every level.
///
/// # Safety
/// `pHandle` must be null or writable; `pMipmappedArrayDesc` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    pHandle: *mut CUmipmappedArray,
    pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR,
    numMipmapLevels: std::ffi::c_uint,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let ctx = current()?;
        // SAFETY: the caller passes null (rejected) or a valid descriptor.
        let d = *unsafe { get(pMipmappedArrayDesc) }?;
        let largest = d.Width.max(d.Height).max(d.Depth).max(1);
        let max_levels = usize::BITS - largest.leading_zeros();
        if pHandle.is_null() || numMipmapLevels == 0 || numMipmapLevels > max_levels {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut total = 0u64;
        for l in 0..numMipmapLevels {
            total = total
                .checked_add(array_bytes(&level_desc(&d, l))?)
                .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        }
        rt.charge(ctx.device, total)?;
        let levels = (0..numMipmapLevels)
            .map(|l| {
                ARRAYS.insert(Arc::new(Array {
                    device: ctx.device,
                    ctx_id: ctx.id,
                    desc: level_desc(&d, l),
                    charged: 0,
                }))
            })
            .collect();
        let h = MIPMAPS.insert(Arc::new(Mipmap {
            device: ctx.device,
            ctx_id: ctx.id,
            charged: total,
            levels,
        }));
        // SAFETY: checked non-null above.
        unsafe { pHandle.write(h as CUmipmappedArray) };
        Ok(())
    })
}

/// `cuMipmappedArrayGetLevel`.
///
/// # Safety
/// `pLevelArray` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetLevel(
    pLevelArray: *mut CUarray,
    hMipmappedArray: CUmipmappedArray,
    level: std::ffi::c_uint,
) -> CUresult {
    guard(|| {
        rt()?;
        let m = MIPMAPS
            .get(hMipmappedArray as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let h = *m
            .levels
            .get(level as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pLevelArray, h as CUarray) }
    })
}

fn destroy_mipmap(rt: &Runtime, m: &Mipmap) {
    for l in &m.levels {
        ARRAYS.remove(*l);
    }
    rt.uncharge(m.device, m.charged);
}

/// `cuMipmappedArrayDestroy`.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let m = MIPMAPS
            .remove(hMipmappedArray as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        destroy_mipmap(rt, &m);
        Ok(())
    })
}

/// Frees the arrays of a destroyed context.
pub fn free_context(rt: &Runtime, ctx_id: u64) {
    for m in MIPMAPS.remove_where(|m| m.ctx_id == ctx_id) {
        destroy_mipmap(rt, &m);
    }
    for a in ARRAYS.remove_where(|a| a.ctx_id == ctx_id) {
        rt.uncharge(a.device, a.charged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(w: usize, h: usize, d: usize) -> CUDA_ARRAY3D_DESCRIPTOR {
        CUDA_ARRAY3D_DESCRIPTOR {
            Width: w,
            Height: h,
            Depth: d,
            Format: CUarray_format::CU_AD_FORMAT_FLOAT,
            NumChannels: 2,
            Flags: 0,
        }
    }

    #[test]
    fn sizes_of_arrays_and_levels() {
        assert_eq!(array_bytes(&desc(100, 0, 0)), Ok(800));
        assert_eq!(array_bytes(&desc(100, 10, 0)), Ok(8000));
        assert_eq!(array_bytes(&desc(100, 10, 3)), Ok(24000));
        assert!(array_bytes(&desc(0, 1, 1)).is_err());
        assert!(array_bytes(&desc(4, 0, 2)).is_err(), "depth without height");
        let mut bad = desc(4, 4, 0);
        bad.NumChannels = 3;
        assert!(array_bytes(&bad).is_err());
        let l2 = level_desc(&desc(16, 3, 0), 2);
        assert_eq!((l2.Width, l2.Height, l2.Depth), (4, 1, 0));
    }
}
