//! Device memory: total, used and free, from the node's ground truth (dead processes reaped first).

use super::*;

/// Total and used memory of a device, dead processes reaped first (the device would
/// have freed their memory already).
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
