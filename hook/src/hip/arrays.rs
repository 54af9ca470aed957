//! Arrays, charged their payload (width × height × depth × element) in
//! HIP pages, as CUDA's are in its pages (docs/hook.md, "Array sizes").

use super::*;

/// Bytes of one element of a channel description (bits per channel).
fn element_bytes(desc: &hipChannelFormatDesc) -> u64 {
    let bits: i64 = [desc.x, desc.y, desc.z, desc.w]
        .iter()
        .map(|&b| i64::from(b.max(0)))
        .sum();
    // An empty description still takes a byte per element.
    (bits as u64).div_ceil(8).max(1)
}

/// Bytes of one channel of a driver-style array format (`HIP_AD_FORMAT_*`);
/// an unknown format is charged 16 bytes, the widest a channel can be, so
/// that a format newer than the header cannot be charged too little.
fn channel_bytes(format: c_int) -> u64 {
    format_bytes(format).unwrap_or(16)
}

/// Payload of a `w × h × d` array of `elem`-byte elements, in pages.
pub(super) fn array_bytes(w: u64, h: u64, d: u64, elem: u64) -> u64 {
    let bytes = w
        .checked_mul(h.max(1))
        .and_then(|b| b.checked_mul(d.max(1)))
        .and_then(|b| b.checked_mul(elem))
        .unwrap_or(u64::MAX);
    hip_pages(bytes)
}

fn admit_array(
    g: &Governed,
    bytes: u64,
    array: *mut hipArray_t,
    call: impl FnOnce() -> hipError_t,
) -> hipError_t {
    match current(g) {
        Ok(index) => admit(g, index, bytes, call, || {
            // SAFETY: read only after the runtime succeeded and wrote it.
            Key::Array(unsafe { out(array, std::ptr::null_mut()) } as usize)
        }),
        Err(e) => e,
    }
}

pub unsafe fn hipMallocArray(
    array: *mut hipArray_t,
    desc: *const hipChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMallocArray(
        array, desc, width, height, flags
    )));
    // SAFETY: the caller's description, or null (the runtime refuses it).
    let elem = unsafe { desc.as_ref() }.map_or(1, element_bytes);
    let bytes = array_bytes(width as u64, height as u64, 1, elem);
    admit_array(g, bytes, array, || {
        real!(hipMallocArray(array, desc, width, height, flags))
    })
}

pub unsafe fn hipMalloc3DArray(
    array: *mut hipArray_t,
    desc: *const hipChannelFormatDesc,
    extent: hipExtent,
    flags: c_uint,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMalloc3DArray(array, desc, extent, flags)));
    // SAFETY: as above.
    let elem = unsafe { desc.as_ref() }.map_or(1, element_bytes);
    let bytes = array_bytes(
        extent.width as u64,
        extent.height as u64,
        extent.depth as u64,
        elem,
    );
    admit_array(g, bytes, array, || {
        real!(hipMalloc3DArray(array, desc, extent, flags))
    })
}

pub unsafe fn hipArrayCreate(
    array: *mut hipArray_t,
    desc: *const HIP_ARRAY_DESCRIPTOR,
) -> hipError_t {
    let g = governed_or!(call_real!(hipArrayCreate(array, desc)));
    // SAFETY: the caller's descriptor, or null (the runtime refuses it).
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return real!(hipArrayCreate(array, desc));
    };
    let elem = channel_bytes(d.Format).saturating_mul(u64::from(d.NumChannels.max(1)));
    let bytes = array_bytes(d.Width as u64, d.Height as u64, 1, elem);
    admit_array(g, bytes, array, || real!(hipArrayCreate(array, desc)))
}

pub unsafe fn hipArray3DCreate(
    array: *mut hipArray_t,
    desc: *const HIP_ARRAY3D_DESCRIPTOR,
) -> hipError_t {
    let g = governed_or!(call_real!(hipArray3DCreate(array, desc)));
    // SAFETY: as above.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return real!(hipArray3DCreate(array, desc));
    };
    let elem = channel_bytes(d.Format).saturating_mul(u64::from(d.NumChannels.max(1)));
    let bytes = array_bytes(d.Width as u64, d.Height as u64, d.Depth as u64, elem);
    admit_array(g, bytes, array, || real!(hipArray3DCreate(array, desc)))
}

pub unsafe fn hipFreeArray(array: hipArray_t) -> hipError_t {
    let g = governed_or!(call_real!(hipFreeArray(array)));
    free(g, Key::Array(array as usize), || real!(hipFreeArray(array)))
}

pub unsafe fn hipArrayDestroy(array: hipArray_t) -> hipError_t {
    let g = governed_or!(call_real!(hipArrayDestroy(array)));
    free(g, Key::Array(array as usize), || {
        real!(hipArrayDestroy(array))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_are_charged_their_payload_in_pages() {
        let float4 = hipChannelFormatDesc {
            x: 32,
            y: 32,
            z: 32,
            w: 32,
            f: 2,
        };
        assert_eq!(element_bytes(&float4), 16);
        assert_eq!(element_bytes(&hipChannelFormatDesc::default()), 1);
        assert_eq!(channel_bytes(0x20), 4);
        assert_eq!(channel_bytes(0x77), 16);
        // 1024 × 1024 float4: 16 MiB exactly.
        assert_eq!(array_bytes(1024, 1024, 0, 16), 16 << 20);
        // One byte still holds a page.
        assert_eq!(array_bytes(1, 0, 0, 1), HIP_PAGE);
        // Overflow is never admitted.
        assert_eq!(array_bytes(u64::MAX, 2, 1, 1), crate::sizes::OVERFLOW);
    }
}
