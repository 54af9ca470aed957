//! HIP's C types and constants, as the shim (`hook/src/hip/`) and the simulated runtime
//! (`sim/hip/`) both need them: one declaration, so that the caller and the callee of an
//! export cannot disagree on a layout.
//!
//! Written by hand from AMD's `hip/hip_runtime_api.h`, `hip/driver_types.h` and
//! `hip/hiprtc.h` of ROCm 5.2.3 (Debian's `libamdhip64-dev`), not generated as `cuda` is:
//! only what a signature of either crate names, with the full layout of every struct one
//! of them reads or writes a field of. The sizes and offsets asserted at the end are the
//! ones `g++` gives for those headers (`sim/hip/symbols/regen.sh` prints them again), so a
//! slip in a field is a build error, not a corrupted struct.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `hipError_t`: an `int`-sized enum in C, kept open here (a runtime may answer codes
/// newer than this list), as bindgen keeps `CUresult`. The codes are free constants under
/// the header's own names (`hipSuccess`), which also match as patterns.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct hipError_t(pub c_int);

pub const hipSuccess: hipError_t = hipError_t(0);
pub const hipErrorInvalidValue: hipError_t = hipError_t(1);
pub const hipErrorOutOfMemory: hipError_t = hipError_t(2);
pub const hipErrorNotInitialized: hipError_t = hipError_t(3);
pub const hipErrorInvalidDevicePointer: hipError_t = hipError_t(17);
pub const hipErrorInvalidDeviceFunction: hipError_t = hipError_t(98);
pub const hipErrorNoDevice: hipError_t = hipError_t(100);
pub const hipErrorInvalidDevice: hipError_t = hipError_t(101);
pub const hipErrorInvalidImage: hipError_t = hipError_t(200);
pub const hipErrorInvalidContext: hipError_t = hipError_t(201);
pub const hipErrorInvalidHandle: hipError_t = hipError_t(400);
pub const hipErrorNotFound: hipError_t = hipError_t(500);
pub const hipErrorNotReady: hipError_t = hipError_t(600);
pub const hipErrorNotSupported: hipError_t = hipError_t(801);
pub const hipErrorUnknown: hipError_t = hipError_t(999);

/// `HIP_VERSION` of the headers read (5.2.3): what the runtime and driver versions report.
pub const HIP_VERSION: c_int = 50_221_153;

pub type hipDevice_t = c_int;

/// `hipIpcMemHandle_t`: 64 opaque bytes (`HIP_IPC_HANDLE_SIZE`), passed by
/// value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipIpcMemHandle_t {
    pub reserved: [std::ffi::c_char; 64],
}

const _: () = assert!(std::mem::size_of::<hipIpcMemHandle_t>() == 64);
pub type hipStream_t = *mut c_void;
pub type hipEvent_t = *mut c_void;
pub type hipFunction_t = *mut c_void;
pub type hipGraphExec_t = *mut c_void;
pub type hipMemPool_t = *mut c_void;
pub type hipArray_t = *mut c_void;
pub type hipMipmappedArray_t = *mut c_void;
pub type hipMemGenericAllocationHandle_t = *mut c_void;
pub type hipDeviceptr_t = *mut c_void;

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

/// `hipMemAllocationGranularityMinimum`.
pub const hipMemAllocationGranularityMinimum: c_int = 0;

/// `hipMemPoolAttr` values (the same numbers as CUDA's `CUmemPool_attribute`).
pub const hipMemPoolReuseFollowEventDependencies: c_int = 1;
pub const hipMemPoolReuseAllowOpportunistic: c_int = 2;
pub const hipMemPoolReuseAllowInternalDependencies: c_int = 3;
pub const hipMemPoolAttrReleaseThreshold: c_int = 4;
pub const hipMemPoolAttrReservedMemCurrent: c_int = 5;
pub const hipMemPoolAttrReservedMemHigh: c_int = 6;
pub const hipMemPoolAttrUsedMemCurrent: c_int = 7;
pub const hipMemPoolAttrUsedMemHigh: c_int = 8;

/// `dim3`, passed by value to the runtime-style launches.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl dim3 {
    /// Threads (or blocks) it names: the product of its three extents, which cannot
    /// overflow a `u64`.
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

/// Where `totalGlobalMem` sits in `hipDeviceProp_t` (HIP 5: right after `char name[256]`).
pub const TOTAL_GLOBAL_MEM_OFFSET: usize = std::mem::offset_of!(hipDeviceProp_t, totalGlobalMem);
/// Where it sits in ROCm 6's `hipDeviceProp_tR0600`: after the name, a 16-byte UUID, an
/// 8-byte LUID and a 4-byte mask, aligned to 8. That struct is not declared here: nothing
/// reads another field of it.
pub const TOTAL_GLOBAL_MEM_OFFSET_R0600: usize = 288;

/// `hipPitchedPtr`, what `hipMalloc3D` writes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `hipExtent`: width in bytes for linear memory, in elements for arrays.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `hipChannelFormatDesc`: bits per channel in `x`..`w`, then the kind in `f`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipChannelFormatDesc {
    pub x: c_int,
    pub y: c_int,
    pub z: c_int,
    pub w: c_int,
    pub f: c_int,
}

/// `HIP_ARRAY_DESCRIPTOR` (the driver-style 2D array description).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct HIP_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: c_int,
    pub NumChannels: c_uint,
}

/// `HIP_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct HIP_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: c_int,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// Bytes of one channel of a `hipArray_Format` (`HIP_AD_FORMAT_*`: unsigned and signed
/// 8, 16 and 32-bit integers, half and float); `None` for a value the header does not
/// define.
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
    pub stream: hipStream_t,
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

/// `hipMemLocation`: `type` (here `kind`) then `id`, the device ordinal for a device
/// location.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipMemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `hipMemAllocationProp` as HIP 5.2 lays it out (ROCm 6 reordered it to CUDA's order;
/// see docs/hook.md).
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

/// `hipMemPoolProps`: the fields either side reads, then the rest as bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipMemPoolProps {
    pub allocType: c_int,
    pub handleTypes: c_int,
    pub location: hipMemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub reserved: [u8; 64],
}

/// `hipUUID`: 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipUUID {
    pub bytes: [u8; 16],
}

/// `hiprtcResult`.
pub type hiprtcResult = c_int;
pub const HIPRTC_SUCCESS: hiprtcResult = 0;
pub const HIPRTC_ERROR_INVALID_INPUT: hiprtcResult = 3;
pub const HIPRTC_ERROR_INVALID_PROGRAM: hiprtcResult = 4;
pub const HIPRTC_ERROR_COMPILATION: hiprtcResult = 6;
pub const HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION: hiprtcResult = 9;
pub const HIPRTC_ERROR_INTERNAL_ERROR: hiprtcResult = 11;

// The layouts the headers give (g++ on x86_64), held at compile time.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<hipError_t>() == size_of::<c_int>());
    assert!(size_of::<dim3>() == 12);
    assert!(size_of::<hipDeviceProp_t>() == 792);
    assert!(offset_of!(hipDeviceProp_t, totalGlobalMem) == 256);
    assert!(offset_of!(hipDeviceProp_t, major) == 328);
    assert!(offset_of!(hipDeviceProp_t, multiProcessorCount) == 336);
    assert!(offset_of!(hipDeviceProp_t, arch) == 356);
    assert!(offset_of!(hipDeviceProp_t, gcnArchName) == 396);
    assert!(offset_of!(hipDeviceProp_t, integrated) == 652);
    assert!(offset_of!(hipDeviceProp_t, hdpMemFlushCntl) == 696);
    assert!(offset_of!(hipDeviceProp_t, pageableMemoryAccessUsesHostPageTables) == 788);
    assert!(size_of::<hipPitchedPtr>() == 32);
    assert!(size_of::<hipExtent>() == 24);
    assert!(size_of::<hipChannelFormatDesc>() == 20);
    assert!(size_of::<HIP_ARRAY_DESCRIPTOR>() == 24);
    assert!(size_of::<HIP_ARRAY3D_DESCRIPTOR>() == 40);
    assert!(size_of::<hipLaunchParams>() == 56);
    assert!(size_of::<hipPointerAttribute_t>() == 32);
    assert!(size_of::<hipMemLocation>() == 8);
    assert!(size_of::<hipMemAllocationProp>() == 32);
    assert!(offset_of!(hipMemAllocationProp, location) == 4);
    assert!(size_of::<hipMemPoolProps>() == 88);
    assert!(size_of::<hipUUID>() == 16);
};
