//! Arrays, sized from their descriptors (see sizes.rs).

use super::*;
use crate::ledger::ArrayRegion;

/// Sparse and deferred-mapping arrays have no memory of their own until
/// mapped onto `cuMemCreate` allocations, which are counted.
fn unbacked(flags: c_uint) -> bool {
    flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0
}

pub unsafe fn cuArrayCreate_v2(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let g = governed_or!(call_real!(cuArrayCreate_v2(handle, desc)));
    if desc.is_null() {
        return call_real!(cuArrayCreate_v2(handle, desc));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = sizes::array_bytes(d.Width as u64, d.Height as u64, d.Format, d.NumChannels);
    admit_current(
        g,
        bytes,
        || call_real!(cuArrayCreate_v2(handle, desc)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Array(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuArrayCreate(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR_v1,
) -> CUresult {
    let g = governed_or!(call_real!(cuArrayCreate(handle, desc)));
    if desc.is_null() {
        return call_real!(cuArrayCreate(handle, desc));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = sizes::array_bytes(d.Width.into(), d.Height.into(), d.Format, d.NumChannels);
    admit_current(
        g,
        bytes,
        || call_real!(cuArrayCreate(handle, desc)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Array(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuArray3DCreate_v2(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let g = governed_or!(call_real!(cuArray3DCreate_v2(handle, desc)));
    if desc.is_null() {
        return call_real!(cuArray3DCreate_v2(handle, desc));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = if unbacked(d.Flags) {
        0
    } else {
        sizes::array3d_bytes(
            d.Width as u64,
            d.Height as u64,
            d.Depth as u64,
            d.Format,
            d.NumChannels,
        )
    };
    admit_current(
        g,
        bytes,
        || call_real!(cuArray3DCreate_v2(handle, desc)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Array(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuArray3DCreate(
    handle: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1,
) -> CUresult {
    let g = governed_or!(call_real!(cuArray3DCreate(handle, desc)));
    if desc.is_null() {
        return call_real!(cuArray3DCreate(handle, desc));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = if unbacked(d.Flags) {
        0
    } else {
        sizes::array3d_bytes(
            d.Width.into(),
            d.Height.into(),
            d.Depth.into(),
            d.Format,
            d.NumChannels,
        )
    };
    admit_current(
        g,
        bytes,
        || call_real!(cuArray3DCreate(handle, desc)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Array(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuArrayDestroy(handle: CUarray) -> CUresult {
    let g = governed_or!(call_real!(cuArrayDestroy(handle)));
    let r = free(g, Key::Array(handle as usize), || {
        call_real!(cuArrayDestroy(handle))
    });
    if r == OK {
        array_gone(g, handle as usize);
    }
    r
}

/// A destroyed sparse or deferred-mapping array no longer maps the VMM
/// allocations that backed it: those the driver freed with it return.
fn array_gone(g: &Governed, array: usize) {
    let freed = g.vmm.lock().array_destroyed(array);
    for h in freed {
        vmm_freed(g, h);
    }
}

/// `cuMemMapArrayAsync`: a sparse or deferred-mapping array is backed by
/// physical allocations from `cuMemCreate`, which are what is charged; so
/// a map operation is one more mapping that keeps its allocation alive (a
/// handle released while it backs an array is not freed), and an unmap
/// may free one. Counted once the driver accepted the list.
fn map_array(g: &Governed, list: *const CUarrayMapInfo, count: c_uint, r: CUresult) -> CUresult {
    if r != OK || list.is_null() {
        return r;
    }
    let mut freed = Vec::new();
    let mut vmm = g.vmm.lock();
    for i in 0..count as usize {
        // SAFETY: the driver accepted `count` readable entries.
        let m = unsafe { &*list.add(i) };
        // SAFETY: both union members are one handle-sized word.
        let array = unsafe { m.resource.array } as usize;
        // SAFETY: the subresource union is 32 plain bytes, read as words.
        let words: [u64; 4] = unsafe { std::mem::transmute(m.subresource) };
        let region = ArrayRegion {
            array,
            sub: [
                u64::from(m.subresourceType.0),
                words[0],
                words[1],
                words[2],
                words[3],
                0,
                0,
                0,
            ],
        };
        if m.memOperationType == CUmemOperationType::CU_MEM_OPERATION_TYPE_MAP {
            // SAFETY: a generic handle is the union's only member.
            let handle = unsafe { m.memHandle.memHandle };
            freed.extend(vmm.array_mapped(region, handle));
        } else if m.memOperationType == CUmemOperationType::CU_MEM_OPERATION_TYPE_UNMAP {
            freed.extend(vmm.array_unmapped(region));
        }
    }
    drop(vmm);
    for h in freed {
        vmm_freed(g, h);
    }
    r
}

pub unsafe fn cuMemMapArrayAsync(
    list: *mut CUarrayMapInfo,
    count: c_uint,
    stream: CUstream,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemMapArrayAsync(list, count, stream)));
    map_array(
        g,
        list,
        count,
        call_real!(cuMemMapArrayAsync(list, count, stream)),
    )
}

pub unsafe fn cuMemMapArrayAsync_ptsz(
    list: *mut CUarrayMapInfo,
    count: c_uint,
    stream: CUstream,
) -> CUresult {
    let g = governed_or!(call_real!(cuMemMapArrayAsync_ptsz(list, count, stream)));
    map_array(
        g,
        list,
        count,
        call_real!(cuMemMapArrayAsync_ptsz(list, count, stream)),
    )
}

pub unsafe fn cuMipmappedArrayCreate(
    handle: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let g = governed_or!(call_real!(cuMipmappedArrayCreate(handle, desc, levels)));
    if desc.is_null() {
        return call_real!(cuMipmappedArrayCreate(handle, desc, levels));
    }
    // SAFETY: non-null; the caller passes a readable descriptor.
    let d = unsafe { *desc };
    let bytes = if unbacked(d.Flags) {
        0
    } else {
        sizes::mipmapped_bytes(
            d.Width as u64,
            d.Height as u64,
            d.Depth as u64,
            d.Format,
            d.NumChannels,
            d.Flags,
            levels,
        )
    };
    admit_current(
        g,
        bytes,
        || call_real!(cuMipmappedArrayCreate(handle, desc, levels)),
        // SAFETY: read only after the driver succeeded and wrote it.
        || Key::Mipmapped(unsafe { out(handle) } as usize),
    )
}

pub unsafe fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult {
    let g = governed_or!(call_real!(cuMipmappedArrayDestroy(handle)));
    let r = free(g, Key::Mipmapped(handle as usize), || {
        call_real!(cuMipmappedArrayDestroy(handle))
    });
    if r == OK {
        array_gone(g, handle as usize);
    }
    r
}
