//! Device memory: total, used and free, from the node's ground truth (dead processes reaped first);
//! the BAR1 aperture; confidential-computing memory (not supported).

use super::*;

/// Total and used memory of a device, dead processes reaped first (those the driver has
/// torn down are free; those it is still tearing down still count, as on a GPU).
fn memory(node: &Node, i: u32) -> NvResult<(u64, u64)> {
    node.reap_dead();
    let u = node
        .device_usage(i)
        .map_err(|_| nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)?;
    Ok((u.memory_total, u.memory_used.min(u.memory_total)))
}

/// `nvmlDeviceGetMemoryInfo`.
///
/// # Safety
/// `memory_` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device_: nvmlDevice_t,
    memory_: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let (total, used) = memory(node, i)?;
        let m = nvmlMemory_t {
            total,
            free: total - used,
            used,
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(memory_, m) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: `version` must be `nvmlMemory_v2`. Nothing is reserved
/// by the simulated driver, so `reserved` is 0.
///
/// # Safety
/// `memory_` must be null or a valid, writable `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device_: nvmlDevice_t,
    memory_: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        if memory_.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller passes a valid struct whose version we check.
        if unsafe { (*memory_).version } != nvmlMemory_v2 {
            return Err(nvmlReturn_t::NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory(node, i)?;
        let m = nvmlMemory_v2_t {
            version: nvmlMemory_v2,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        // SAFETY: checked non-null above.
        unsafe { memory_.write(m) };
        Ok(())
    })
}

/// `nvmlDeviceGetBAR1MemoryInfo`: a BAR1 aperture the size of the device memory rounded up
/// to a power of two (an H100 80GB has 128 GiB), 1 MiB of it used, as an idle H100
/// reports (the driver's own mappings; the simulation maps nothing there).
///
/// # Safety
/// `bar1Memory` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    device_: nvmlDevice_t,
    bar1Memory: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let total = info(node, i)?
            .memory_total
            .max(256 << 20)
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX);
        let used = 1 << 20;
        let m = nvmlBAR1Memory_t {
            bar1Total: total,
            bar1Free: total - used,
            bar1Used: used,
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(bar1Memory, m) }
    })
}

/// `nvmlDeviceGetConfComputeMemSizeInfo`: confidential computing is off, so
/// `NVML_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetConfComputeMemSizeInfo(
    device_: nvmlDevice_t,
    _memInfo: *mut nvmlConfComputeMemSizeInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)
    })
}
