//! The HIP types the shim's wrappers take and read, written from HIP 5.2.3's
//! public headers (`hip/hip_runtime_api.h`, `hip/driver_types.h`, Debian's
//! `libamdhip64-dev`): only what a governed signature names, with the
//! layout of every struct the shim reads a field of. Handles the shim never
//! looks into are opaque pointers.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_void};

/// `hipError_t`: an `int`-sized enum in C, kept open here (a runtime may
/// answer codes newer than this list).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct hipError_t(pub c_int);

impl hipError_t {
    pub const SUCCESS: Self = Self(0);
    pub const INVALID_VALUE: Self = Self(1);
    pub const OUT_OF_MEMORY: Self = Self(2);
    pub const NOT_INITIALIZED: Self = Self(3);
    pub const INVALID_DEVICE: Self = Self(101);
    pub const NOT_READY: Self = Self(600);
    pub const NOT_FOUND: Self = Self(500);
    pub const UNKNOWN: Self = Self(999);
}

pub type hipDevice_t = c_int;
pub type hipStream_t = *mut c_void;
pub type hipEvent_t = *mut c_void;
pub type hipFunction_t = *mut c_void;
pub type hipGraphExec_t = *mut c_void;
pub type hipMemPool_t = *mut c_void;
pub type hipArray_t = *mut c_void;
pub type hipMipmappedArray_t = *mut c_void;
pub type hipMemGenericAllocationHandle_t = *mut c_void;
pub type hipDeviceptr_t = *mut c_void;

/// `dim3`, passed by value to the runtime-style launches.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

/// `hipExtent`: width in bytes for linear memory, in elements for arrays.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `hipPitchedPtr`, what `hipMalloc3D` writes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `hipChannelFormatDesc`: bits per channel in `x`..`w`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipChannelFormatDesc {
    pub x: c_int,
    pub y: c_int,
    pub z: c_int,
    pub w: c_int,
    pub f: c_int,
}

/// `HIP_ARRAY_DESCRIPTOR`.
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

/// `hipMemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipMemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `hipMemAllocationProp` as HIP 5.2 lays it out (ROCm 6 reordered it to
/// CUDA's order; see docs/hook.md).
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

/// `hipLaunchParams`, one entry of a multi-device cooperative launch.
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

/// `hipUUID`: 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipUUID {
    pub bytes: [u8; 16],
}

/// `hipMemAllocationGranularityMinimum`.
pub const GRANULARITY_MINIMUM: c_int = 0;

/// Where `totalGlobalMem` sits in `hipDeviceProp_t` (HIP 5: right after
/// `char name[256]`) and in `hipDeviceProp_tR0600` (ROCm 6: after the name,
/// a 16-byte UUID, an 8-byte LUID and a 4-byte mask, aligned to 8).
pub const TOTAL_GLOBAL_MEM_OFFSET: usize = 256;
pub const TOTAL_GLOBAL_MEM_OFFSET_R0600: usize = 288;

// The layouts the header gives, held at compile time.
const _: () = assert!(std::mem::size_of::<dim3>() == 12);
const _: () = assert!(std::mem::size_of::<HIP_ARRAY_DESCRIPTOR>() == 24);
const _: () = assert!(std::mem::size_of::<HIP_ARRAY3D_DESCRIPTOR>() == 40);
const _: () = assert!(std::mem::size_of::<hipMemAllocationProp>() == 32);
const _: () = assert!(std::mem::offset_of!(hipMemAllocationProp, location) == 4);
const _: () = assert!(std::mem::size_of::<hipLaunchParams>() == 56);
const _: () = assert!(std::mem::size_of::<hipPitchedPtr>() == 32);
