//! NVML macros of `nvml.h` that bindgen cannot translate (`NVML_STRUCT_VERSION` uses `sizeof`).

use crate::nvml::{nvmlMemory_v2_t, nvmlProcessDetailList_v1_t};

/// `NVML_STRUCT_VERSION(data, ver)`: the size of the struct in the low bits, the version
/// in bits 24 and up, as NVML checks in a struct's `version` field.
pub const fn nvml_struct_version(size: usize, version: u32) -> u32 {
    (size as u32) | (version << 24)
}

/// `nvmlMemory_v2`: the `version` value of an `nvmlMemory_v2_t`.
#[allow(non_upper_case_globals)]
pub const nvmlMemory_v2: u32 = nvml_struct_version(size_of::<nvmlMemory_v2_t>(), 2);

/// `nvmlProcessDetailList_v1`: the `version` value of an `nvmlProcessDetailList_v1_t`.
#[allow(non_upper_case_globals)]
pub const nvmlProcessDetailList_v1: u32 =
    nvml_struct_version(size_of::<nvmlProcessDetailList_v1_t>(), 1);

/// `NVML_DEVICE_PCI_BUS_ID_FMT`: the bus id format of `nvmlPciInfo_t::busId`,
/// `%08X:%02X:%02X.0` (domain, bus, device).
pub fn pci_bus_id(domain: u32, bus: u32, device: u32) -> String {
    format!("{domain:08X}:{bus:02X}:{device:02X}.0")
}

/// `NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT`: the shorter `%04X:%02X:%02X.0` form of
/// `nvmlPciInfo_t::busIdLegacy`.
pub fn pci_bus_id_legacy(domain: u32, bus: u32, device: u32) -> String {
    format!("{domain:04X}:{bus:02X}:{device:02X}.0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::{nvmlProcessInfo_t, nvmlProcessInfo_v1_t};

    #[test]
    fn struct_versions_match_nvml_h() {
        // nvmlMemory_v2_t: version (u32, padded to 8) + four u64 = 40 bytes.
        assert_eq!(nvmlMemory_v2, 40 | (2 << 24));
    }

    #[test]
    fn process_info_layouts_are_the_ones_nvml_abis_use() {
        // `_v3` of nvmlDeviceGetComputeRunningProcesses fills 24-byte records
        // (pid, usedGpuMemory, gpuInstanceId, computeInstanceId); the legacy call 16.
        assert_eq!(size_of::<nvmlProcessInfo_t>(), 24);
        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
    }

    #[test]
    fn bus_id_formats() {
        assert_eq!(pci_bus_id(0, 0x1a, 0), "00000000:1A:00.0");
        assert_eq!(pci_bus_id_legacy(0, 0x1a, 0), "0000:1A:00.0");
    }
}
