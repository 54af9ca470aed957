//! ROCm SMI's C types and constants, as the shim (`hook/src/hip/context.rs`, which asks
//! what the driver holds for its process), the manager and the simulated
//! `librocm_smi64.so.5` (`sim/rocm-smi/`) all need them: one declaration, so that the caller and the callee
//! of an export cannot disagree on a status code or a record's layout.
//!
//! The manager's ROCm SMI backend (`manager/src/rocm_smi.rs`) calls the same library
//! through `libloading` with these types too.
//!
//! Written by hand from AMD's `rocm_smi/rocm_smi.h` of ROCm 5.2, as [`crate::hip`] is
//! from the HIP headers: only what a signature of one of those crates names. The sizes asserted
//! at the end are the C layout of those records on a 64-bit target.

#![allow(non_camel_case_types)]

use std::ffi::c_char;

/// `rsmi_status_t`: a C enum, 32 bits wide (its largest value is `0xFFFFFFFF`), kept
/// open (a library may answer codes newer than this list), as [`crate::hip::hipError_t`]
/// is. The codes are free constants under the header's own names, which also match as
/// patterns.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct rsmi_status_t(pub u32);

pub const RSMI_STATUS_SUCCESS: rsmi_status_t = rsmi_status_t(0);
pub const RSMI_STATUS_INVALID_ARGS: rsmi_status_t = rsmi_status_t(1);
pub const RSMI_STATUS_NOT_SUPPORTED: rsmi_status_t = rsmi_status_t(2);
pub const RSMI_STATUS_FILE_ERROR: rsmi_status_t = rsmi_status_t(3);
pub const RSMI_STATUS_PERMISSION: rsmi_status_t = rsmi_status_t(4);
pub const RSMI_STATUS_OUT_OF_RESOURCES: rsmi_status_t = rsmi_status_t(5);
pub const RSMI_STATUS_INTERNAL_EXCEPTION: rsmi_status_t = rsmi_status_t(6);
pub const RSMI_STATUS_INPUT_OUT_OF_BOUNDS: rsmi_status_t = rsmi_status_t(7);
pub const RSMI_STATUS_INIT_ERROR: rsmi_status_t = rsmi_status_t(8);
pub const RSMI_STATUS_NOT_YET_IMPLEMENTED: rsmi_status_t = rsmi_status_t(9);
pub const RSMI_STATUS_NOT_FOUND: rsmi_status_t = rsmi_status_t(10);
pub const RSMI_STATUS_INSUFFICIENT_SIZE: rsmi_status_t = rsmi_status_t(11);
pub const RSMI_STATUS_UNKNOWN_ERROR: rsmi_status_t = rsmi_status_t(0xFFFF_FFFF);

/// `rsmi_memory_type_t` values.
pub const RSMI_MEM_TYPE_VRAM: u32 = 0;
pub const RSMI_MEM_TYPE_VIS_VRAM: u32 = 1;
pub const RSMI_MEM_TYPE_GTT: u32 = 2;

/// `rsmi_temperature_type_t` values (the sensors; the header has more than these).
pub const RSMI_TEMP_TYPE_EDGE: u32 = 0;
pub const RSMI_TEMP_TYPE_JUNCTION: u32 = 1;

/// `rsmi_temperature_metric_t`: the current reading (the header has more metrics).
pub const RSMI_TEMP_CURRENT: u32 = 0;

/// `rsmi_process_info_t`, field for field as `rocm_smi.h` declares it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rsmi_process_info_t {
    pub process_id: u32,
    pub pasid: u32,
    /// Bytes of VRAM the process holds (on every device, in the 5.2 calls; on one, in
    /// `rsmi_compute_process_info_by_device_get`).
    pub vram_usage: u64,
    /// SDMA engine time in microseconds.
    pub sdma_usage: u64,
    /// Compute-unit usage in percent.
    pub cu_occupancy: u32,
}

/// `rsmi_version_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rsmi_version_t {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    pub build: *const c_char,
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<rsmi_status_t>() == 4);
    assert!(size_of::<rsmi_process_info_t>() == 32);
    assert!(size_of::<rsmi_version_t>() == 24);
};
