//! The processes using a device (a context on it or memory held on it), in every ABI flavour.

use super::*;

/// The processes using a device: a context on it or memory held on it.
fn processes(node: &Node, i: u32) -> Vec<(u32, u64)> {
    node.reap_dead();
    node.processes()
        .into_iter()
        .filter(|p| p.contexts & (1 << i) != 0 || p.memory[i as usize] > 0)
        .map(|p| (p.pid, p.memory[i as usize]))
        .collect()
}

/// Fills a process list the NVML way: with too small a buffer (or none), the count
/// needed and `NVML_ERROR_INSUFFICIENT_SIZE`.
fn fill_processes<T>(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> NvResult<()> {
    let (node, i) = live(d)?;
    if count.is_null() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    let list = processes(node, i);
    // SAFETY: `count` is non-null and the caller's to read and write.
    let room = unsafe { count.read() } as usize;
    // SAFETY: as above.
    unsafe { count.write(list.len() as c_uint) };
    if list.is_empty() {
        return Ok(());
    }
    if infos.is_null() || room < list.len() {
        return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, (pid, mem)) in list.into_iter().enumerate() {
        // SAFETY: k < list.len() <= room entries of the caller's array.
        unsafe { infos.add(k).write(make(pid, mem)) };
    }
    Ok(())
}

fn info_v2(pid: u32, mem: u64) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid,
        usedGpuMemory: mem,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    }
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
///
/// # Safety
/// `infoCount` must be valid; `infos` null or holding `*infoCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device_: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| fill_processes(device_, infoCount, infos, info_v2))
}

/// `nvmlDeviceGetComputeRunningProcesses_v2` (same record layout as `_v3`).
///
/// # Safety
/// `infoCount` must be valid; `infos` null or holding `*infoCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device_: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| fill_processes(device_, infoCount, infos, info_v2))
}

/// `nvmlDeviceGetComputeRunningProcesses` (the legacy 16-byte records).
///
/// # Safety
/// `infoCount` must be valid; `infos` null or holding `*infoCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device_: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    guard(|| {
        fill_processes(device_, infoCount, infos, |pid, mem| nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: mem,
        })
    })
}

fn no_processes(d: nvmlDevice_t, count: *mut c_uint) -> NvResult<()> {
    live(d)?;
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(count, 0) }
}

tessera_sim::exports! {
    /// `nvmlDeviceGetGraphicsRunningProcesses_v3` (no graphics work is simulated) and
    /// `nvmlDeviceGetMPSComputeRunningProcesses_v3` (there is no MPS here): no processes.
    ///
    /// # Safety
    /// `infoCount` must be null or writable.
    fn [nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v3](
        device_: nvmlDevice_t,
        infoCount: *mut c_uint,
        _infos: *mut nvmlProcessInfo_t,
    ) -> nvmlReturn_t {
        guard(|| no_processes(device_, infoCount))
    }
}

/// `nvmlDeviceGetRunningProcessDetailList` (NVML 12.x): compute processes as the `_v3`
/// list gives them (`mode` 0); graphics and MPS lists (modes 1 and 2) are empty here.
/// Too small an array (or none) gets the count needed and `NVML_ERROR_INSUFFICIENT_SIZE`.
///
/// # Safety
/// `plist` must be null or a valid, writable `nvmlProcessDetailList_t` whose `procArray`
/// is null or holds `numProcArrayEntries` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    device_: nvmlDevice_t,
    plist: *mut nvmlProcessDetailList_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        if plist.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller passes a valid, writable list header.
        let l = unsafe { &mut *plist };
        if l.version != tessera_ffi::nvml_extra::nvmlProcessDetailList_v1 {
            return Err(nvmlReturn_t::NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let list = match l.mode {
            0 => processes(node, i),
            1 | 2 => Vec::new(),
            _ => return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT),
        };
        let room = l.numProcArrayEntries as usize;
        l.numProcArrayEntries = list.len() as c_uint;
        if list.is_empty() {
            return Ok(());
        }
        if l.procArray.is_null() || room < list.len() {
            return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (k, (pid, mem)) in list.into_iter().enumerate() {
            // SAFETY: k < list.len() <= room entries of the caller's array.
            unsafe {
                l.procArray.add(k).write(nvmlProcessDetail_v1_t {
                    pid,
                    usedGpuMemory: mem,
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                    usedGpuCcProtectedMemory: 0,
                })
            };
        }
        Ok(())
    })
}
