//! HIP's C types and constants as this library needs them, written from AMD's
//! `hip/hip_runtime_api.h` and `hip/hiprtc.h` of ROCm 5.2.3 (Debian's `libamdhip64-dev`);
//! the sizes and offsets asserted below are the ones `g++` gives for those headers
//! (`sim/hip/symbols/regen.sh` prints them again).

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `hipError_t`.
pub type hipError_t = c_int;
pub const hipSuccess: hipError_t = 0;
pub const hipErrorInvalidValue: hipError_t = 1;
pub const hipErrorOutOfMemory: hipError_t = 2;
pub const hipErrorNotInitialized: hipError_t = 3;
pub const hipErrorInvalidDevicePointer: hipError_t = 17;
pub const hipErrorNoDevice: hipError_t = 100;
pub const hipErrorInvalidDevice: hipError_t = 101;
pub const hipErrorInvalidImage: hipError_t = 200;
pub const hipErrorInvalidHandle: hipError_t = 400;
pub const hipErrorNotFound: hipError_t = 500;
pub const hipErrorNotReady: hipError_t = 600;
pub const hipErrorNotSupported: hipError_t = 801;
pub const hipErrorUnknown: hipError_t = 999;

/// `HIP_VERSION` of the headers read (5.2.3): what the runtime and driver versions report.
pub const HIP_VERSION: c_int = 50_221_153;

/// `hipDeviceAttribute_t` values used here.
pub mod attr {
    pub const MaxThreadsPerBlock: i32 = 56;
    pub const MaxBlockDimX: i32 = 26;
    pub const MaxBlockDimY: i32 = 27;
    pub const MaxBlockDimZ: i32 = 28;
    pub const MaxGridDimX: i32 = 29;
    pub const MaxGridDimY: i32 = 30;
    pub const MaxGridDimZ: i32 = 31;
    pub const MaxSharedMemoryPerBlock: i32 = 74;
    pub const WarpSize: i32 = 87;
    pub const MultiprocessorCount: i32 = 63;
    pub const ComputeCapabilityMajor: i32 = 23;
    pub const ComputeCapabilityMinor: i32 = 61;
    pub const TotalConstantMemory: i32 = 83;
    pub const MaxRegistersPerBlock: i32 = 71;
    pub const ClockRate: i32 = 5;
    pub const MemoryClockRate: i32 = 60;
    pub const MemoryBusWidth: i32 = 59;
    pub const L2CacheSize: i32 = 19;
    pub const MaxThreadsPerMultiProcessor: i32 = 57;
    pub const PciBusId: i32 = 67;
    pub const PciDeviceId: i32 = 68;
    pub const PciDomainID: i32 = 69;
    pub const ConcurrentKernels: i32 = 8;
    pub const ManagedMemory: i32 = 24;
    pub const MemoryPoolsSupported: i32 = 88;
    pub const CooperativeLaunch: i32 = 10;
    pub const Integrated: i32 = 16;
    pub const CanMapHostMemory: i32 = 3;
    pub const UnifiedAddressing: i32 = 85;
}

/// `hipMemoryType` values.
pub const hipMemoryTypeHost: c_int = 0;
pub const hipMemoryTypeDevice: c_int = 1;
pub const hipMemoryTypeArray: c_int = 2;

/// `dim3`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl dim3 {
    pub fn count(&self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }
}

/// `hipDeviceProp_t` (the layout before ROCm 6's `R0600` change).
#[repr(C)]
pub struct hipDeviceProp_t {
    pub name: [c_char; 256],
    pub totalGlobalMem: usize,
    pub sharedMemPerBlock: usize,
    pub regsPerBlock: c_int,
    pub warpSize: c_int,
    pub maxThreadsPerBlock: c_int,
    pub maxThreadsDim: [c_int; 3],
    pub maxGridSize: [c_int; 3],
    pub clockRate: c_int,
    pub memoryClockRate: c_int,
    pub memoryBusWidth: c_int,
    pub totalConstMem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub multiProcessorCount: c_int,
    pub l2CacheSize: c_int,
    pub maxThreadsPerMultiProcessor: c_int,
    pub computeMode: c_int,
    pub clockInstructionRate: c_int,
    /// `hipDeviceArch_t`: a word of feature bits.
    pub arch: c_uint,
    pub concurrentKernels: c_int,
    pub pciDomainID: c_int,
    pub pciBusID: c_int,
    pub pciDeviceID: c_int,
    pub maxSharedMemoryPerMultiProcessor: usize,
    pub isMultiGpuBoard: c_int,
    pub canMapHostMemory: c_int,
    pub gcnArch: c_int,
    pub gcnArchName: [c_char; 256],
    pub integrated: c_int,
    pub cooperativeLaunch: c_int,
    pub cooperativeMultiDeviceLaunch: c_int,
    pub maxTexture1DLinear: c_int,
    pub maxTexture1D: c_int,
    pub maxTexture2D: [c_int; 2],
    pub maxTexture3D: [c_int; 3],
    pub hdpMemFlushCntl: *mut c_uint,
    pub hdpRegFlushCntl: *mut c_uint,
    pub memPitch: usize,
    pub textureAlignment: usize,
    pub texturePitchAlignment: usize,
    pub kernelExecTimeoutEnabled: c_int,
    pub ECCEnabled: c_int,
    pub tccDriver: c_int,
    pub cooperativeMultiDeviceUnmatchedFunc: c_int,
    pub cooperativeMultiDeviceUnmatchedGridDim: c_int,
    pub cooperativeMultiDeviceUnmatchedBlockDim: c_int,
    pub cooperativeMultiDeviceUnmatchedSharedMem: c_int,
    pub isLargeBar: c_int,
    pub asicRevision: c_int,
    pub managedMemory: c_int,
    pub directManagedMemAccessFromHost: c_int,
    pub concurrentManagedAccess: c_int,
    pub pageableMemoryAccess: c_int,
    pub pageableMemoryAccessUsesHostPageTables: c_int,
}

const _: () = {
    assert!(size_of::<hipDeviceProp_t>() == 792);
    assert!(std::mem::offset_of!(hipDeviceProp_t, totalGlobalMem) == 256);
    assert!(std::mem::offset_of!(hipDeviceProp_t, major) == 328);
    assert!(std::mem::offset_of!(hipDeviceProp_t, multiProcessorCount) == 336);
    assert!(std::mem::offset_of!(hipDeviceProp_t, arch) == 356);
    assert!(std::mem::offset_of!(hipDeviceProp_t, gcnArchName) == 396);
    assert!(std::mem::offset_of!(hipDeviceProp_t, integrated) == 652);
    assert!(std::mem::offset_of!(hipDeviceProp_t, hdpMemFlushCntl) == 696);
    assert!(std::mem::offset_of!(hipDeviceProp_t, pageableMemoryAccessUsesHostPageTables) == 788);
};

/// `hipPitchedPtr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `hipExtent`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `hipChannelFormatDesc` (bits per channel, then the kind).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipChannelFormatDesc {
    pub x: c_int,
    pub y: c_int,
    pub z: c_int,
    pub w: c_int,
    pub f: c_int,
}

/// `HIP_ARRAY_DESCRIPTOR` (the driver-style 2D array description).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HIP_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: c_int,
    pub NumChannels: c_uint,
}

/// `HIP_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HIP_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: c_int,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// Bytes of one channel of a `hipArray_Format` (`HIP_AD_FORMAT_*`); `None` for a value
/// the header does not define.
pub fn format_bytes(format: c_int) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),
        0x02 | 0x09 | 0x10 => Some(2),
        0x03 | 0x0a | 0x20 => Some(4),
        _ => None,
    }
}

/// `hipLaunchParams`: one device's launch of `hipLaunchCooperativeKernelMultiDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipLaunchParams {
    pub func: *mut c_void,
    pub gridDim: dim3,
    pub blockDim: dim3,
    pub args: *mut *mut c_void,
    pub sharedMem: usize,
    pub stream: *mut c_void,
}

/// `hipPointerAttribute_t` (ROCm 5's layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipPointerAttribute_t {
    pub memoryType: c_int,
    pub device: c_int,
    pub devicePointer: *mut c_void,
    pub hostPointer: *mut c_void,
    pub isManaged: c_int,
    pub allocationFlags: c_uint,
}

/// `hipMemLocation`: `type` then `id` (the device ordinal for a device location).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipMemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `hipMemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipMemAllocationProp {
    pub compressionType: u8,
    pub location: hipMemLocation,
    pub requestedHandleType: c_int,
    pub kind: c_int,
    pub usage: u16,
    pub win32HandleMetaData: *mut c_void,
}

/// `hipMemPoolProps`: the fields read here, then the rest as bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipMemPoolProps {
    pub allocType: c_int,
    pub handleTypes: c_int,
    pub location: hipMemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub reserved: [u8; 64],
}

const _: () = {
    assert!(size_of::<hipPitchedPtr>() == 32);
    assert!(size_of::<hipExtent>() == 24);
    assert!(size_of::<hipChannelFormatDesc>() == 20);
    assert!(size_of::<hipPointerAttribute_t>() == 32);
    assert!(size_of::<hipMemLocation>() == 8);
    assert!(size_of::<hipMemAllocationProp>() == 32);
    assert!(size_of::<hipMemPoolProps>() == 88);
    assert!(size_of::<HIP_ARRAY_DESCRIPTOR>() == 24);
    assert!(size_of::<HIP_ARRAY3D_DESCRIPTOR>() == 40);
    assert!(size_of::<hipLaunchParams>() == 56);
};

/// `hiprtcResult`.
pub type hiprtcResult = c_int;
pub const HIPRTC_SUCCESS: hiprtcResult = 0;
pub const HIPRTC_ERROR_INVALID_INPUT: hiprtcResult = 3;
pub const HIPRTC_ERROR_INVALID_PROGRAM: hiprtcResult = 4;
pub const HIPRTC_ERROR_COMPILATION: hiprtcResult = 6;
pub const HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION: hiprtcResult = 9;
pub const HIPRTC_ERROR_INTERNAL_ERROR: hiprtcResult = 11;
