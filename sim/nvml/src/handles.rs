//! Device handles: counting devices and looking them up by index, UUID, serial or bus ID.

use super::*;

/// What an `nvmlDevice_t` points to: one static slot per possible device.
#[repr(C)]
#[derive(Debug)]
pub struct DeviceSlot {
    index: u32,
}

static SLOTS: [DeviceSlot; MAX_DEVICES] = {
    let mut s = [const { DeviceSlot { index: 0 } }; MAX_DEVICES];
    let mut i = 0;
    while i < MAX_DEVICES {
        s[i].index = i as u32;
        i += 1;
    }
    s
};

pub(crate) fn handle(index: u32) -> nvmlDevice_t {
    (&SLOTS[index as usize] as *const DeviceSlot)
        .cast_mut()
        .cast()
}

/// The device index a handle names, if it is one of ours and the device exists.
pub(crate) fn index_of(node: &Node, d: nvmlDevice_t) -> NvResult<u32> {
    let base = SLOTS.as_ptr() as usize;
    let p = d as usize;
    let size = size_of::<DeviceSlot>();
    if p < base || p >= base + MAX_DEVICES * size || !(p - base).is_multiple_of(size) {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    let i = ((p - base) / size) as u32;
    // An AMD device of a mixed node is not NVIDIA's to show: no handle names it.
    if node.vendor(i as usize) != Some(Vendor::Nvidia) {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(i)
}

/// The node's NVIDIA devices (physical indices) in NVML's order: NVML numbers only its
/// vendor's GPUs, so on a mixed node its index `n` is the `n`-th NVIDIA device.
pub(crate) fn nvidia(node: &Node) -> Vec<u32> {
    node.devices_of(Vendor::Nvidia)
}

/// NVML's index of the NVIDIA device at physical index `i`.
pub(crate) fn nvml_index(node: &Node, i: u32) -> u32 {
    nvidia(node).iter().position(|&p| p == i).unwrap_or(0) as u32
}

/// A device query that works on a lost device too (identity).
pub(crate) fn device(d: nvmlDevice_t) -> NvResult<(&'static Node, u32)> {
    let node = node()?;
    Ok((node, index_of(node, d)?))
}

/// A device query that needs the device to be reachable.
pub(crate) fn live(d: nvmlDevice_t) -> NvResult<(&'static Node, u32)> {
    let (node, i) = device(d)?;
    if node.is_lost(i as usize) {
        return Err(nvmlReturn_t::NVML_ERROR_GPU_IS_LOST);
    }
    Ok((node, i))
}

pub(crate) fn info(node: &Node, i: u32) -> NvResult<DeviceInfo> {
    node.device_info(i)
        .map_err(|_| nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)
}

fn count(c: *mut c_uint) -> NvResult<()> {
    let node = node()?;
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(c, nvidia(node).len() as u32) }
}

tessera_sim::exports! {
    /// `nvmlDeviceGetCount_v2`, `nvmlDeviceGetCount`.
    ///
    /// # Safety
    /// `deviceCount` must be null or writable.
    fn [nvmlDeviceGetCount_v2, nvmlDeviceGetCount](deviceCount: *mut c_uint) -> nvmlReturn_t {
        guard(|| count(deviceCount))
    }
}

fn by_index(index: c_uint, out: *mut nvmlDevice_t) -> NvResult<()> {
    let node = node()?;
    let Some(&physical) = nvidia(node).get(index as usize) else {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    };
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(out, handle(physical)) }
}

tessera_sim::exports! {
    /// `nvmlDeviceGetHandleByIndex_v2`, `nvmlDeviceGetHandleByIndex`.
    ///
    /// # Safety
    /// `device` must be null or writable.
    fn [nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetHandleByIndex](
        index: c_uint,
        device: *mut nvmlDevice_t,
    ) -> nvmlReturn_t {
        guard(|| by_index(index, device))
    }
}

fn c_arg<'a>(s: *const c_char) -> NvResult<std::borrow::Cow<'a, str>> {
    if s.is_null() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated string.
    Ok(unsafe { CStr::from_ptr(s) }.to_string_lossy())
}

/// `nvmlDeviceGetHandleByUUID`.
///
/// # Safety
/// `uuid` must be null or a C string; `device` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let node = node()?;
        let want = c_arg(uuid)?;
        for i in nvidia(node) {
            if info(node, i)?.uuid.eq_ignore_ascii_case(want.trim()) {
                // SAFETY: the caller passes a writable pointer or null (rejected).
                return unsafe { put(device, handle(i)) };
            }
        }
        Err(nvmlReturn_t::NVML_ERROR_NOT_FOUND)
    })
}

fn by_bus_id(bus: *const c_char, out: *mut nvmlDevice_t) -> NvResult<()> {
    let node = node()?;
    let want = parse_bus_id(&c_arg(bus)?).ok_or(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)?;
    for i in nvidia(node) {
        let d = info(node, i)?;
        if (d.pci_domain, d.pci_bus, d.pci_device) == want {
            // SAFETY: the caller passes a writable pointer or null (rejected).
            return unsafe { put(out, handle(i)) };
        }
    }
    Err(nvmlReturn_t::NVML_ERROR_NOT_FOUND)
}

tessera_sim::exports! {
    /// `nvmlDeviceGetHandleByPciBusId_v2`, `nvmlDeviceGetHandleByPciBusId`.
    ///
    /// # Safety
    /// `pciBusId` must be null or a C string; `device` null or writable.
    fn [nvmlDeviceGetHandleByPciBusId_v2, nvmlDeviceGetHandleByPciBusId](
        pciBusId: *const c_char,
        device: *mut nvmlDevice_t,
    ) -> nvmlReturn_t {
        guard(|| by_bus_id(pciBusId, device))
    }
}
