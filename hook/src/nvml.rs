//! The NVML wrapper bodies: initialisation fails closed like `cuInit`, and
//! memory info reports the allocation's view (total = the limit capped by
//! the device, used = what the allocation has reserved). NVML needs no
//! membership: a monitoring process reads the files without joining.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_uint};

use tessera_ffi::nvml::{
    NVML_DEVICE_UUID_V2_BUFFER_SIZE, nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlReturn_t,
};

use crate::governor::{self, Files};
use crate::table::call_real;

const OK: nvmlReturn_t = nvmlReturn_t::NVML_SUCCESS;

/// What governed NVML entry points return when the process fails closed.
pub const NVML_REFUSED: nvmlReturn_t = nvmlReturn_t::NVML_ERROR_UNINITIALIZED;

fn init(call: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    match governor::files() {
        Some(Err(())) => NVML_REFUSED,
        None | Some(Ok(_)) => call(),
    }
}

pub unsafe fn nvmlInit() -> nvmlReturn_t {
    init(|| call_real!(nvmlInit()))
}

pub unsafe fn nvmlInit_v2() -> nvmlReturn_t {
    init(|| call_real!(nvmlInit_v2()))
}

pub unsafe fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    init(|| call_real!(nvmlInitWithFlags(flags)))
}

/// The allocation's index of an NVML device, by its UUID.
fn index_of(files: &Files, device: nvmlDevice_t) -> Option<usize> {
    let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
    let r = call_real!(nvmlDeviceGetUUID(
        device,
        buf.as_mut_ptr(),
        buf.len() as c_uint
    ));
    if r != OK {
        return None;
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated within the buffer (forced above).
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) };
    files.find_uuid(uuid.to_str().ok()?)
}

/// (total, free, used) from inside the allocation, given the device's total.
fn view(files: &Files, device: nvmlDevice_t, total: u64) -> (u64, u64, u64) {
    let (total, reserved) = files.view(index_of(files, device), total);
    let used = reserved.min(total);
    (total, total - used, used)
}

/// Governed memory-info call: `Ok(files)` to virtualise, or the result to
/// return as is.
fn files_or(call: impl FnOnce() -> nvmlReturn_t) -> Result<&'static Files, nvmlReturn_t> {
    match governor::files() {
        None => Err(call()),
        Some(Err(())) => Err(NVML_REFUSED),
        Some(Ok(f)) => Ok(f),
    }
}

pub unsafe fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let files = match files_or(|| call_real!(nvmlDeviceGetMemoryInfo(device, memory))) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let r = call_real!(nvmlDeviceGetMemoryInfo(device, memory));
    if r != OK || memory.is_null() {
        return r;
    }
    // SAFETY: the library succeeded and filled the caller's struct.
    let m = unsafe { &mut *memory };
    (m.total, m.free, m.used) = view(files, device, m.total);
    r
}

pub unsafe fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let files = match files_or(|| call_real!(nvmlDeviceGetMemoryInfo_v2(device, memory))) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let r = call_real!(nvmlDeviceGetMemoryInfo_v2(device, memory));
    if r != OK || memory.is_null() {
        return r;
    }
    // SAFETY: the library succeeded and filled the caller's struct.
    let m = unsafe { &mut *memory };
    (m.total, m.free, m.used) = view(files, device, m.total);
    // What the driver keeps for itself is outside the allocation's view.
    m.reserved = 0;
    r
}
