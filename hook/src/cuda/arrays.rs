//! Arrays, sized from their descriptors (see sizes.rs).

use super::*;

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
    free(g, Key::Array(handle as usize), || {
        call_real!(cuArrayDestroy(handle))
    })
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
    free(g, Key::Mipmapped(handle as usize), || {
        call_real!(cuMipmappedArrayDestroy(handle))
    })
}
