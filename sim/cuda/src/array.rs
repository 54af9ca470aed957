//! CUDA arrays and mipmapped arrays: charged to the device by their size (width × height ×
//! depth × element size, every level of a mipmap) in whole device pages
//! (`memory::DEVICE_PAGE`), with no backing bytes — copies to and from arrays are not
//! simulated.
//!
//! Sparse (`CUDA_ARRAY3D_SPARSE`) and deferred-mapping (`CUDA_ARRAY3D_DEFERRED_MAPPING`)
//! arrays cost nothing when created, as on a GPU: their memory is whatever physical
//! allocations (`cuMemCreate` handles, charged there) `cuMemMapArrayAsync` binds to them.
//! A binding keeps its handle's memory alive until it is unmapped or the array destroyed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tessera_ffi::cuda::*;

use crate::registry::Registry;
use crate::runtime::{Runtime, current, rt};
use crate::{CuResult, get, guard, put};

#[derive(Debug)]
pub struct Array {
    pub device: usize,
    pub ctx_id: u64,
    pub desc: CUDA_ARRAY3D_DESCRIPTOR,
    /// Bytes charged for it (0 for a level of a mipmapped array, charged with the mipmap,
    /// and for sparse and deferred-mapping arrays, backed by what is mapped into them).
    pub charged: u64,
    /// A level of a mipmapped array (destroyed with it, never alone).
    pub level: bool,
}

/// Sparse or deferred-mapping arrays are backed only by what is mapped into them.
pub const UNBACKED_FLAGS: u32 = CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING;

/// Where a `cuMemMapArrayAsync` binding sits: the array or mipmapped array handle and the
/// subresource (type, level or layer, offsets).
type BindingKey = (usize, u32, [u64; 5]);

/// Live bindings of memory handles to sparse or deferred-mapping arrays.
static BINDINGS: Mutex<BTreeMap<BindingKey, u64>> = Mutex::new(BTreeMap::new());

fn bindings() -> MutexGuard<'static, BTreeMap<BindingKey, u64>> {
    BINDINGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unbinds everything mapped into the array or mipmapped array `resource`.
fn unbind_all(rt: &Runtime, resource: usize) {
    let handles: Vec<u64> = {
        let mut b = bindings();
        let keys: Vec<BindingKey> = b.keys().filter(|k| k.0 == resource).copied().collect();
        keys.iter().filter_map(|k| b.remove(k)).collect()
    };
    for h in handles {
        crate::vmm::unbind(rt, h);
    }
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
    // Sparse and deferred-mapping arrays are backed when memory is mapped into them.
    let charge = if desc.Flags & UNBACKED_FLAGS != 0 {
        0
    } else {
        crate::memory::device_pages(bytes)?
    };
    rt.charge(ctx.device, charge)?;
    Ok(ARRAYS.insert(Arc::new(Array {
        device: ctx.device,
        ctx_id: ctx.id,
        desc,
        charged: charge,
        level: false,
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
            .filter(|a| !a.level)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        ARRAYS.remove(hArray as usize);
        unbind_all(rt, hArray as usize);
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
        total = if d.Flags & UNBACKED_FLAGS != 0 {
            0
        } else {
            crate::memory::device_pages(total)?
        };
        rt.charge(ctx.device, total)?;
        let levels = (0..numMipmapLevels)
            .map(|l| {
                ARRAYS.insert(Arc::new(Array {
                    device: ctx.device,
                    ctx_id: ctx.id,
                    desc: level_desc(&d, l),
                    charged: 0,
                    level: true,
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
        let m = MIPMAPS.lookup(hMipmappedArray as usize)?;
        let h = *m
            .levels
            .get(level as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pLevelArray, h as CUarray) }
    })
}

fn destroy_mipmap(rt: &Runtime, handle: usize, m: &Mipmap) {
    for l in &m.levels {
        ARRAYS.remove(*l);
    }
    unbind_all(rt, handle);
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
        let m = MIPMAPS.take(hMipmappedArray as usize)?;
        destroy_mipmap(rt, hMipmappedArray as usize, &m);
        Ok(())
    })
}

/// Frees the arrays of a destroyed context.
pub fn free_context(rt: &Runtime, ctx_id: u64) {
    for m in MIPMAPS.remove_where(|m| m.ctx_id == ctx_id) {
        destroy_mipmap(rt, crate::registry::handle_of(&m), &m);
    }
    for a in ARRAYS.remove_where(|a| a.ctx_id == ctx_id) {
        unbind_all(rt, crate::registry::handle_of(&a));
        rt.uncharge(a.device, a.charged);
    }
}

/// The device and flags of a sparse/deferred array or mipmapped array handle.
fn unbacked_resource(info: &CUarrayMapInfo) -> CuResult<(usize, usize)> {
    // SAFETY: reading the union member the resource type names; handles are checked
    // against the registries before use.
    let (handle, array) = unsafe {
        match info.resourceType {
            CUresourcetype::CU_RESOURCE_TYPE_ARRAY => (info.resource.array as usize, true),
            CUresourcetype::CU_RESOURCE_TYPE_MIPMAPPED_ARRAY => {
                (info.resource.mipmap as usize, false)
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    };
    let (device, flags) = if array {
        let a = ARRAYS.lookup(handle)?;
        (a.device, a.desc.Flags)
    } else {
        let m = MIPMAPS.lookup(handle)?;
        let first = ARRAYS.lookup(
            *m.levels
                .first()
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?,
        )?;
        (m.device, first.desc.Flags)
    };
    if flags & UNBACKED_FLAGS == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok((handle, device))
}

fn binding_key(handle: usize, info: &CUarrayMapInfo) -> BindingKey {
    // SAFETY: both subresource forms are plain integers; reading the one the type names.
    let sub = unsafe {
        if info.subresourceType
            == CUarraySparseSubresourceType::CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL
        {
            let m = info.subresource.miptail;
            [u64::from(m.layer), m.offset, 0, 0, 0]
        } else {
            let l = info.subresource.sparseLevel;
            [
                u64::from(l.level),
                u64::from(l.layer),
                u64::from(l.offsetX),
                u64::from(l.offsetY),
                u64::from(l.offsetZ),
            ]
        }
    };
    (handle, info.subresourceType.0, sub)
}

fn map_array(infos: *mut CUarrayMapInfo, count: std::ffi::c_uint) -> CuResult<()> {
    let rt = rt()?;
    if count > 0 && infos.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..count as usize {
        // SAFETY: the caller passes `count` entries.
        let info = unsafe { &*infos.add(i) };
        let (handle, device) = unbacked_resource(info)?;
        let key = binding_key(handle, info);
        match info.memOperationType {
            CUmemOperationType::CU_MEM_OPERATION_TYPE_MAP => {
                if info.memHandleType != CUmemHandleType::CU_MEM_HANDLE_TYPE_GENERIC {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                // SAFETY: the generic handle is the union's only member.
                let mem = unsafe { info.memHandle.memHandle };
                if crate::vmm::handle_size(mem).is_none_or(|s| info.offset >= s) {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                if crate::vmm::bind(mem)? != device {
                    crate::vmm::unbind(rt, mem);
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                if let Some(old) = bindings().insert(key, mem) {
                    crate::vmm::unbind(rt, old);
                }
            }
            CUmemOperationType::CU_MEM_OPERATION_TYPE_UNMAP => {
                if let Some(old) = bindings().remove(&key) {
                    crate::vmm::unbind(rt, old);
                }
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(())
}

crate::ptsz_exports! {
    /// `cuMemMapArrayAsync`: binds (or unbinds) `cuMemCreate` memory to tiles or mip tails
    /// of sparse arrays and to deferred-mapping arrays. The memory is the handle's, charged
    /// at `cuMemCreate`; the array itself never is. Done at once (stream order is kept
    /// trivially: nothing reads arrays).
    ///
    /// # Safety
    /// `mapInfoList` must point to `count` entries.
    fn cuMemMapArrayAsync / cuMemMapArrayAsync_ptsz [per_thread](
        mapInfoList: *mut CUarrayMapInfo,
        count: std::ffi::c_uint,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| {
            crate::stream::resolve(hStream, per_thread)?;
            map_array(mapInfoList, count)
        })
    }
}

/// `cuArrayGetMemoryRequirements`: what a deferred-mapping array needs mapped (its size
/// rounded to the VMM granularity, aligned to it).
///
/// # Safety
/// `memoryRequirements` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetMemoryRequirements(
    memoryRequirements: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    array: CUarray,
    device: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        rt.device(device)?;
        let a = ARRAYS.lookup(array as usize)?;
        let g = crate::vmm::GRANULARITY;
        let size = crate::memory::round_up(array_bytes(&a.desc)?, g)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: all-zero is a valid requirements struct.
        let mut r: CUDA_ARRAY_MEMORY_REQUIREMENTS = unsafe { std::mem::zeroed() };
        r.size = size as usize;
        r.alignment = g as usize;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(memoryRequirements, r) }
    })
}

/// The 64 KiB tile of a sparse array with this descriptor (the standard sparse block
/// shapes: 2D 256×256 texels of 1 byte down to 64×64 of 16; 3D 64×32×32 down to
/// 16×16×16).
pub fn sparse_tile(d: &CUDA_ARRAY3D_DESCRIPTOR) -> CuResult<(u32, u32, u32)> {
    let texel =
        format_size(d.Format).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)? * u64::from(d.NumChannels);
    let t = if d.Depth == 0 {
        match texel {
            1 => (256, 256, 1),
            2 => (256, 128, 1),
            4 => (128, 128, 1),
            8 => (128, 64, 1),
            _ => (64, 64, 1),
        }
    } else {
        match texel {
            1 => (64, 32, 32),
            2 => (32, 32, 32),
            4 => (32, 32, 16),
            8 => (32, 16, 16),
            _ => (16, 16, 16),
        }
    };
    Ok(t)
}

/// Sparse properties of an array whose levels are `levels`: its tile, and its mip tail
/// (the levels smaller than a tile in width or height, and their bytes).
fn sparse_properties(
    base: &CUDA_ARRAY3D_DESCRIPTOR,
    levels: u32,
) -> CuResult<CUDA_ARRAY_SPARSE_PROPERTIES> {
    if base.Flags & CUDA_ARRAY3D_SPARSE == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (w, h, dd) = sparse_tile(base)?;
    let first_small = (0..levels)
        .find(|&l| {
            let d = level_desc(base, l);
            (d.Width as u64) < u64::from(w) || (d.Height.max(1) as u64) < u64::from(h)
        })
        .unwrap_or(levels);
    let mut tail = 0u64;
    for l in first_small..levels {
        tail += array_bytes(&level_desc(base, l))?;
    }
    // SAFETY: all-zero is a valid properties struct.
    let mut p: CUDA_ARRAY_SPARSE_PROPERTIES = unsafe { std::mem::zeroed() };
    p.tileExtent.width = w;
    p.tileExtent.height = h;
    p.tileExtent.depth = dd;
    p.miptailFirstLevel = first_small;
    // The tail is mapped in whole tiles.
    p.miptailSize = crate::memory::round_up(tail, 64 << 10).unwrap_or(tail);
    Ok(p)
}

/// `cuArrayGetSparseProperties`: for arrays created with `CUDA_ARRAY3D_SPARSE`.
///
/// # Safety
/// `sparseProperties` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetSparseProperties(
    sparseProperties: *mut CUDA_ARRAY_SPARSE_PROPERTIES,
    array: CUarray,
) -> CUresult {
    guard(|| {
        rt()?;
        let a = ARRAYS.lookup(array as usize)?;
        let p = sparse_properties(&a.desc, 1)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(sparseProperties, p) }
    })
}

/// `cuMipmappedArrayGetSparseProperties`.
///
/// # Safety
/// `sparseProperties` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetSparseProperties(
    sparseProperties: *mut CUDA_ARRAY_SPARSE_PROPERTIES,
    mipmap: CUmipmappedArray,
) -> CUresult {
    guard(|| {
        rt()?;
        let m = MIPMAPS.lookup(mipmap as usize)?;
        let first = ARRAYS.lookup(
            *m.levels
                .first()
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?,
        )?;
        let p = sparse_properties(&first.desc, m.levels.len() as u32)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(sparseProperties, p) }
    })
}

/// `cuMipmappedArrayGetMemoryRequirements`: every level's bytes, rounded to the VMM
/// granularity.
///
/// # Safety
/// `memoryRequirements` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetMemoryRequirements(
    memoryRequirements: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    mipmap: CUmipmappedArray,
    device: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        rt.device(device)?;
        let m = MIPMAPS.lookup(mipmap as usize)?;
        let mut total = 0u64;
        for l in &m.levels {
            let a = ARRAYS.lookup(*l)?;
            total += array_bytes(&a.desc)?;
        }
        let g = crate::vmm::GRANULARITY;
        // SAFETY: all-zero is a valid requirements struct.
        let mut r: CUDA_ARRAY_MEMORY_REQUIREMENTS = unsafe { std::mem::zeroed() };
        r.size =
            crate::memory::round_up(total, g).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)? as usize;
        r.alignment = g as usize;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(memoryRequirements, r) }
    })
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
    fn sparse_tiles_are_64_kib_and_the_mip_tail_holds_the_small_levels() {
        let mut d = desc(4096, 4096, 0);
        d.Flags = CUDA_ARRAY3D_SPARSE;
        // FLOAT × 2 channels = 8-byte texels: 128 × 64 tiles.
        assert_eq!(sparse_tile(&d), Ok((128, 64, 1)));
        let (w, h, z) = sparse_tile(&d).expect("tile");
        assert_eq!(u64::from(w * h * z) * 8, 64 << 10);
        // 13 levels: 4096 .. 1; levels below 128 wide (level 6: 64×64) are the tail.
        let p = sparse_properties(&d, 13).expect("props");
        assert_eq!(p.miptailFirstLevel, 6);
        assert!(p.miptailSize > 0 && p.miptailSize.is_multiple_of(64 << 10));
        let mut d3 = desc(64, 64, 64);
        d3.Flags = CUDA_ARRAY3D_SPARSE;
        assert_eq!(sparse_tile(&d3), Ok((32, 16, 16)));
        assert!(
            sparse_properties(&desc(64, 64, 0), 1).is_err(),
            "not sparse"
        );
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
