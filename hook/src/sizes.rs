//! How many bytes an allocation is charged when the driver does not say:
//! arrays and mipmapped arrays from their descriptors, pitched memory
//! before the driver has chosen its pitch, and the device pages every
//! allocation is held in.
//!
//! The driver holds device memory in whole pages: on an H200 (driver 580,
//! CUDA 13.0) NVML per process showed every `cuMemAlloc` of n bytes at n
//! rounded up to 2 MiB, the granularity `cuMemGetAllocationGranularity`
//! reports. So an allocation is charged its bytes rounded up to
//! [`DEVICE_PAGE`]: charging the bytes asked for would let a process hold
//! up to a page per allocation past its limit (a million 1-byte
//! allocations, 2 TiB). Where a family's real rounding is unknown (arrays,
//! pools) the page is still the least it can take, so it is charged up,
//! never down.
//!
//! An array is charged its payload: width × height × depth × bytes per
//! element, where a plain format's element is its channel size times the
//! channel count, and packed, planar (YUV) and block-compressed formats are
//! charged their bytes per pixel. The driver's own padding and alignment are
//! not known before the call and are not charged. A format the hook does
//! not know is charged 16 bytes per channel, the most any format needs.

use tessera_ffi::cuda::{CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_LAYERED, CUarray_format};

/// Bytes charged when a size overflows: more than any limit can hold, so
/// the reservation is refused rather than wrapped around.
pub const OVERFLOW: u64 = u64::MAX;

/// Bytes of one element as a fraction (numerator, denominator): per
/// channel for plain formats, per pixel (channels ignored) for packed ones.
enum Element {
    PerChannel(u64),
    PerPixel(u64, u64),
}

fn element(format: CUarray_format) -> Element {
    use Element::*;
    type F = CUarray_format;
    match format {
        F::CU_AD_FORMAT_UNSIGNED_INT8
        | F::CU_AD_FORMAT_SIGNED_INT8
        | F::CU_AD_FORMAT_UNORM_INT8X1
        | F::CU_AD_FORMAT_UNORM_INT8X2
        | F::CU_AD_FORMAT_UNORM_INT8X4
        | F::CU_AD_FORMAT_SNORM_INT8X1
        | F::CU_AD_FORMAT_SNORM_INT8X2
        | F::CU_AD_FORMAT_SNORM_INT8X4 => PerChannel(1),
        F::CU_AD_FORMAT_UNSIGNED_INT16
        | F::CU_AD_FORMAT_SIGNED_INT16
        | F::CU_AD_FORMAT_HALF
        | F::CU_AD_FORMAT_UNORM_INT16X1
        | F::CU_AD_FORMAT_UNORM_INT16X2
        | F::CU_AD_FORMAT_UNORM_INT16X4
        | F::CU_AD_FORMAT_SNORM_INT16X1
        | F::CU_AD_FORMAT_SNORM_INT16X2
        | F::CU_AD_FORMAT_SNORM_INT16X4 => PerChannel(2),
        F::CU_AD_FORMAT_UNSIGNED_INT32 | F::CU_AD_FORMAT_SIGNED_INT32 | F::CU_AD_FORMAT_FLOAT => {
            PerChannel(4)
        }
        // 4:2:0 planar: a full luma plane plus two quarter chroma planes.
        F::CU_AD_FORMAT_NV12 => PerPixel(3, 2),
        F::CU_AD_FORMAT_P010 | F::CU_AD_FORMAT_P016 => PerPixel(3, 1),
        // 4:2:2: luma plus two half chroma planes.
        F::CU_AD_FORMAT_NV16 | F::CU_AD_FORMAT_YUY2 => PerPixel(2, 1),
        F::CU_AD_FORMAT_P210
        | F::CU_AD_FORMAT_P216
        | F::CU_AD_FORMAT_Y210
        | F::CU_AD_FORMAT_Y216 => PerPixel(4, 1),
        // 4:4:4.
        F::CU_AD_FORMAT_AYUV | F::CU_AD_FORMAT_Y410 | F::CU_AD_FORMAT_UNORM_INT_101010_2 => {
            PerPixel(4, 1)
        }
        F::CU_AD_FORMAT_Y416 => PerPixel(8, 1),
        F::CU_AD_FORMAT_Y444_PLANAR8 | F::CU_AD_FORMAT_YUV444_8bit_SemiPlanar => PerPixel(3, 1),
        F::CU_AD_FORMAT_Y444_PLANAR10 | F::CU_AD_FORMAT_YUV444_16bit_SemiPlanar => PerPixel(6, 1),
        // Block compressed, 4×4 texels per block: 8 bytes a block for BC1
        // and BC4, 16 for the others.
        F::CU_AD_FORMAT_BC1_UNORM
        | F::CU_AD_FORMAT_BC1_UNORM_SRGB
        | F::CU_AD_FORMAT_BC4_UNORM
        | F::CU_AD_FORMAT_BC4_SNORM => PerPixel(1, 2),
        F::CU_AD_FORMAT_BC2_UNORM
        | F::CU_AD_FORMAT_BC2_UNORM_SRGB
        | F::CU_AD_FORMAT_BC3_UNORM
        | F::CU_AD_FORMAT_BC3_UNORM_SRGB
        | F::CU_AD_FORMAT_BC5_UNORM
        | F::CU_AD_FORMAT_BC5_SNORM
        | F::CU_AD_FORMAT_BC6H_UF16
        | F::CU_AD_FORMAT_BC6H_SF16
        | F::CU_AD_FORMAT_BC7_UNORM
        | F::CU_AD_FORMAT_BC7_UNORM_SRGB => PerPixel(1, 1),
        _ => PerChannel(16),
    }
}

/// Bytes of `pixels` elements of `format` with `channels` channels.
fn bytes_of(pixels: u64, format: CUarray_format, channels: u32) -> u64 {
    let r = match element(format) {
        Element::PerChannel(b) => pixels
            .checked_mul(b)
            .and_then(|v| v.checked_mul(u64::from(channels.max(1)))),
        Element::PerPixel(num, den) => pixels.checked_mul(num).map(|v| v.div_ceil(den)),
    };
    r.unwrap_or(OVERFLOW)
}

/// Bytes of a 1D or 2D array (`cuArrayCreate`); a height of 0 is a 1D array.
pub fn array_bytes(width: u64, height: u64, format: CUarray_format, channels: u32) -> u64 {
    match width.checked_mul(height.max(1)) {
        Some(px) => bytes_of(px, format, channels),
        None => OVERFLOW,
    }
}

/// Bytes of a 3D, layered or cubemap array (`cuArray3DCreate`): depth 0
/// means 1D or 2D; for layered and cubemap arrays depth counts the layers.
pub fn array3d_bytes(
    width: u64,
    height: u64,
    depth: u64,
    format: CUarray_format,
    channels: u32,
) -> u64 {
    match width
        .checked_mul(height.max(1))
        .and_then(|v| v.checked_mul(depth.max(1)))
    {
        Some(px) => bytes_of(px, format, channels),
        None => OVERFLOW,
    }
}

/// Bytes of a mipmapped array: the sum over its levels, each half the
/// previous in every dimension (not below 1). Layers of a layered or
/// cubemap array do not shrink.
pub fn mipmapped_bytes(
    width: u64,
    height: u64,
    depth: u64,
    format: CUarray_format,
    channels: u32,
    flags: u32,
    levels: u32,
) -> u64 {
    let layered = flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let shrink = |d: u64, l: u32| {
        if d == 0 { 0 } else { (d >> l.min(63)).max(1) }
    };
    let mut total: u64 = 0;
    for l in 0..levels.max(1) {
        let w = shrink(width, l).max(1);
        let h = shrink(height, l);
        let d = if layered { depth } else { shrink(depth, l) };
        let b = array3d_bytes(w, h, d, format, channels);
        total = match total.checked_add(b) {
            Some(t) => t,
            None => return OVERFLOW,
        };
        if w == 1 && h <= 1 && (layered || d <= 1) && l > 0 {
            // Every further level would be the same single texel; the
            // driver refuses more levels than log2 of the largest side.
            break;
        }
    }
    total
}

/// The unit the device holds memory in (see the module's notes).
pub const DEVICE_PAGE: u64 = 2 << 20;

/// `bytes` rounded up to whole device pages: what the driver holds for an
/// allocation of `bytes`. Saturates at [`OVERFLOW`], which no limit admits.
pub fn pages(bytes: u64) -> u64 {
    bytes
        .checked_next_multiple_of(DEVICE_PAGE)
        .unwrap_or(OVERFLOW)
}

/// Pitch alignment assumed before the driver has chosen the pitch.
pub const PITCH_ALIGN: u64 = 512;

/// Bytes reserved for a pitched allocation before the call: each row
/// rounded up to [`PITCH_ALIGN`].
pub fn pitch_estimate(width: u64, height: u64) -> u64 {
    width
        .checked_next_multiple_of(PITCH_ALIGN)
        .and_then(|w| w.checked_mul(height))
        .unwrap_or(OVERFLOW)
}

#[cfg(test)]
mod tests {
    use super::*;
    type F = CUarray_format;

    #[test]
    fn pages_round_up_and_never_wrap() {
        assert_eq!(pages(0), 0);
        assert_eq!(pages(1), DEVICE_PAGE);
        assert_eq!(pages(DEVICE_PAGE), DEVICE_PAGE);
        assert_eq!(pages(DEVICE_PAGE + 1), 2 * DEVICE_PAGE);
        assert_eq!(pages(u64::MAX - 1), OVERFLOW);
        assert_eq!(pages(OVERFLOW), OVERFLOW);
    }

    #[test]
    fn plain_arrays_are_width_height_element_channels() {
        assert_eq!(
            array_bytes(1024, 768, F::CU_AD_FORMAT_FLOAT, 4),
            1024 * 768 * 16
        );
        assert_eq!(array_bytes(1000, 0, F::CU_AD_FORMAT_UNSIGNED_INT8, 1), 1000);
        assert_eq!(array_bytes(10, 10, F::CU_AD_FORMAT_HALF, 2), 400);
        assert_eq!(
            array3d_bytes(64, 64, 64, F::CU_AD_FORMAT_SIGNED_INT16, 1),
            64 * 64 * 64 * 2
        );
        assert_eq!(
            array3d_bytes(64, 64, 0, F::CU_AD_FORMAT_FLOAT, 1),
            64 * 64 * 4
        );
    }

    #[test]
    fn packed_formats_are_per_pixel() {
        assert_eq!(
            array_bytes(1920, 1080, F::CU_AD_FORMAT_NV12, 3),
            1920 * 1080 * 3 / 2
        );
        assert_eq!(array_bytes(16, 16, F::CU_AD_FORMAT_BC1_UNORM, 4), 128);
        assert_eq!(array_bytes(16, 16, F::CU_AD_FORMAT_BC7_UNORM, 4), 256);
    }

    #[test]
    fn unknown_formats_are_charged_the_most() {
        assert_eq!(array_bytes(10, 1, CUarray_format(12345), 2), 10 * 16 * 2);
    }

    #[test]
    fn overflow_is_refused_not_wrapped() {
        assert_eq!(
            array3d_bytes(u64::MAX, 2, 1, F::CU_AD_FORMAT_FLOAT, 1),
            OVERFLOW
        );
        assert_eq!(
            array_bytes(1 << 40, 1 << 30, F::CU_AD_FORMAT_FLOAT, 4),
            OVERFLOW
        );
        assert_eq!(pitch_estimate(u64::MAX, 1), OVERFLOW);
    }

    #[test]
    fn mipmaps_sum_their_levels() {
        // 8x8 float: 64 + 16 + 4 + 1 texels.
        assert_eq!(
            mipmapped_bytes(8, 8, 0, F::CU_AD_FORMAT_FLOAT, 1, 0, 4),
            (64 + 16 + 4 + 1) * 4
        );
        // A layered 2D array keeps its 6 layers at every level.
        assert_eq!(
            mipmapped_bytes(
                4,
                4,
                6,
                F::CU_AD_FORMAT_UNSIGNED_INT8,
                1,
                CUDA_ARRAY3D_LAYERED,
                3
            ),
            (16 + 4 + 1) * 6
        );
        // 3D shrinks depth too.
        assert_eq!(
            mipmapped_bytes(4, 4, 4, F::CU_AD_FORMAT_UNSIGNED_INT8, 1, 0, 3),
            64 + 8 + 1
        );
        // More levels than the size allows stop at one texel.
        assert_eq!(
            mipmapped_bytes(2, 0, 0, F::CU_AD_FORMAT_UNSIGNED_INT8, 1, 0, 40),
            2 + 1
        );
    }

    #[test]
    fn pitch_rows_round_up() {
        assert_eq!(pitch_estimate(1, 10), 5120);
        assert_eq!(pitch_estimate(512, 3), 1536);
        assert_eq!(pitch_estimate(513, 1), 1024);
    }
}
