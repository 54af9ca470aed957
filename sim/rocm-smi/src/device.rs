//! One device: identity (name, vendor, PCI ids, the unique id), memory, busy percent,
//! temperature and power.

use super::*;

/// AMD's PCI vendor id.
pub const AMD_PCI_VENDOR: u16 = 0x1002;

/// The PCI device id of a model, from the PCI ID database's entries for these parts;
/// 0 for a model it does not name (a custom `TESSERA_SIM_GPUS` entry).
fn pci_device_id(model: &str) -> u16 {
    match model {
        "AMD Instinct MI100" => 0x738c,
        "AMD Instinct MI210" => 0x740f,
        "AMD Instinct MI250X" => 0x740c,
        "AMD Instinct MI300X" => 0x74a1,
        _ => 0,
    }
}

/// Board power of a busy and an idle device in µW (ROCm SMI's unit): an MI210's
/// 300 W typical board power from AMD's product page; the idle figure is assumed.
const POWER_BUSY_UW: u64 = 300_000_000;
const POWER_IDLE_UW: u64 = 90_000_000;

/// The unique id ROCm SMI gives a device: the first eight bytes of the simulated
/// device's UUID, big-endian. Tessera names an AMD GPU by it
/// (`tessera_contract::format_amd_uuid`).
pub fn unique_id(uuid_bytes: &[u8; 16]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&uuid_bytes[..8]);
    u64::from_be_bytes(b)
}

/// `rsmi_dev_name_get`: the model name (`AMD Instinct MI210`).
///
/// # Safety
/// `name` must be null or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_name_get(
    dv_ind: u32,
    name: *mut c_char,
    len: usize,
) -> rsmi_status_t {
    guard(|| {
        let (node, i) = device(dv_ind)?;
        let info = node.device_info(i).map_err(|_| RSMI_STATUS_INVALID_ARGS)?;
        // SAFETY: the caller's buffer of `len` bytes, or null (rejected).
        unsafe { put_str(name, len, &info.name) }
    })
}

/// `rsmi_dev_vendor_name_get`: the vendor as the PCI ID database names it.
///
/// # Safety
/// `name` must be null or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_vendor_name_get(
    dv_ind: u32,
    name: *mut c_char,
    len: usize,
) -> rsmi_status_t {
    guard(|| {
        device(dv_ind)?;
        // SAFETY: the caller's buffer of `len` bytes, or null (rejected).
        unsafe { put_str(name, len, "Advanced Micro Devices, Inc. [AMD/ATI]") }
    })
}

/// `rsmi_dev_vendor_id_get`: 0x1002.
///
/// # Safety
/// `id` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_vendor_id_get(dv_ind: u32, id: *mut u16) -> rsmi_status_t {
    guard(|| {
        device(dv_ind)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(id, AMD_PCI_VENDOR) }
    })
}

/// `rsmi_dev_id_get`: the PCI device id of the model.
///
/// # Safety
/// `id` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_id_get(dv_ind: u32, id: *mut u16) -> rsmi_status_t {
    guard(|| {
        let (node, i) = device(dv_ind)?;
        let info = node.device_info(i).map_err(|_| RSMI_STATUS_INVALID_ARGS)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(id, pci_device_id(&info.name)) }
    })
}

/// `rsmi_dev_unique_id_get`: see [`unique_id`].
///
/// # Safety
/// `id` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_unique_id_get(dv_ind: u32, id: *mut u64) -> rsmi_status_t {
    guard(|| {
        let (node, i) = device(dv_ind)?;
        let info = node.device_info(i).map_err(|_| RSMI_STATUS_INVALID_ARGS)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(id, unique_id(&info.uuid_bytes)) }
    })
}

/// `rsmi_dev_pci_id_get`: the BDFID, `domain << 32 | bus << 8 | device << 3 | function`
/// as the header lays it out (function 0).
///
/// # Safety
/// `bdfid` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_pci_id_get(dv_ind: u32, bdfid: *mut u64) -> rsmi_status_t {
    guard(|| {
        let (node, i) = device(dv_ind)?;
        let d = node.device_info(i).map_err(|_| RSMI_STATUS_INVALID_ARGS)?;
        let id = (u64::from(d.pci_domain) << 32)
            | (u64::from(d.pci_bus & 0xff) << 8)
            | (u64::from(d.pci_device & 0x1f) << 3);
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(bdfid, id) }
    })
}

/// `rsmi_topo_numa_affinity_get`: the simulated node has one NUMA node, 0.
///
/// # Safety
/// `numa_node` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_topo_numa_affinity_get(
    dv_ind: u32,
    numa_node: *mut u32,
) -> rsmi_status_t {
    guard(|| {
        device(dv_ind)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(numa_node, 0) }
    })
}

/// Total and used VRAM of node device `i`, dead processes reaped first.
fn vram(node: &Node, i: u32) -> RsmiResult<(u64, u64)> {
    node.reap_dead();
    let u = node.device_usage(i).map_err(|_| RSMI_STATUS_INVALID_ARGS)?;
    Ok((u.memory_total, u.memory_used.min(u.memory_total)))
}

/// Which half of [`vram`] a memory query wants; GTT (host memory the device maps) is
/// not simulated.
fn mem_type(mem_type: u32) -> RsmiResult<()> {
    match mem_type {
        RSMI_MEM_TYPE_VRAM | RSMI_MEM_TYPE_VIS_VRAM => Ok(()),
        2 => Err(RSMI_STATUS_NOT_SUPPORTED),
        _ => Err(RSMI_STATUS_INVALID_ARGS),
    }
}

/// `rsmi_dev_memory_total_get`: VRAM (and visible VRAM: all of it, as on a large-BAR
/// board) in bytes.
///
/// # Safety
/// `total` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_memory_total_get(
    dv_ind: u32,
    memory_type: u32,
    total: *mut u64,
) -> rsmi_status_t {
    guard(|| {
        mem_type(memory_type)?;
        let (node, i) = live(dv_ind)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(total, vram(node, i)?.0) }
    })
}

/// `rsmi_dev_memory_usage_get`: bytes every process holds on the device.
///
/// # Safety
/// `used` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_memory_usage_get(
    dv_ind: u32,
    memory_type: u32,
    used: *mut u64,
) -> rsmi_status_t {
    guard(|| {
        mem_type(memory_type)?;
        let (node, i) = live(dv_ind)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(used, vram(node, i)?.1) }
    })
}

/// `rsmi_dev_busy_percent_get`: the engine's busy fraction over the last second.
///
/// # Safety
/// `busy_percent` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_busy_percent_get(
    dv_ind: u32,
    busy_percent: *mut u32,
) -> rsmi_status_t {
    guard(|| {
        let (node, i) = live(dv_ind)?;
        let pct = (busy(node, i, 1_000_000_000) * 100.0)
            .round()
            .clamp(0.0, 100.0) as u32;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(busy_percent, pct) }
    })
}

/// `rsmi_dev_temp_metric_get`: the current temperature of the edge or junction
/// sensor, in millidegrees: 34 °C idle to 78 °C fully busy over the last five
/// seconds, as the simulated NVML reports. Other sensors and metrics are not
/// simulated.
///
/// # Safety
/// `temperature` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_temp_metric_get(
    dv_ind: u32,
    sensor_type: u32,
    metric: u32,
    temperature: *mut i64,
) -> rsmi_status_t {
    guard(|| {
        let (node, i) = live(dv_ind)?;
        // RSMI_TEMP_TYPE_EDGE (0), _JUNCTION (1); RSMI_TEMP_CURRENT (0).
        if sensor_type > RSMI_TEMP_TYPE_JUNCTION || metric != RSMI_TEMP_CURRENT {
            return Err(RSMI_STATUS_NOT_SUPPORTED);
        }
        let c = 34.0 + 44.0 * busy(node, i, 5_000_000_000);
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(temperature, (c * 1000.0).round() as i64) }
    })
}

/// `rsmi_dev_power_ave_get`: average power in µW, idle draw plus the busy share of
/// the rest. One sensor (0).
///
/// # Safety
/// `power` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_power_ave_get(
    dv_ind: u32,
    sensor_ind: u32,
    power: *mut u64,
) -> rsmi_status_t {
    guard(|| {
        let (node, i) = live(dv_ind)?;
        if sensor_ind != 0 {
            return Err(RSMI_STATUS_INVALID_ARGS);
        }
        let uw = POWER_IDLE_UW
            + ((POWER_BUSY_UW - POWER_IDLE_UW) as f64 * busy(node, i, 1_000_000_000)).round()
                as u64;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(power, uw) }
    })
}
