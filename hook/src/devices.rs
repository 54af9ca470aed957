//! The process's CUDA devices mapped onto its allocation's devices by UUID,
//! so limits and usage live in one index domain (the control file's order)
//! whatever `CUDA_VISIBLE_DEVICES` selects.

use tessera_ffi::cuda::CUdevice;

/// Formats a CUDA UUID as NVML and the control file write it (the contract's).
pub use tessera_contract::format_uuid;

/// The identity part of a UUID string: without its `GPU-` or `MIG-` prefix,
/// lower-cased. A MIG instance's UUID from `cuDeviceGetUuid_v2` has the
/// same bytes as the `MIG-...` string NVML and the manager use.
fn uuid_key(s: &str) -> String {
    let s = s.trim();
    let body = s
        .strip_prefix("GPU-")
        .or_else(|| s.strip_prefix("MIG-"))
        .unwrap_or(s);
    body.to_ascii_lowercase()
}

/// Whether two UUID strings name the same device.
pub fn same_uuid(a: &str, b: &str) -> bool {
    uuid_key(a) == uuid_key(b)
}

/// One visible CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visible {
    /// The `CUdevice` the driver gave for this ordinal.
    pub device: CUdevice,
    pub uuid: String,
    /// Index in the control file; `None` when the allocation does not
    /// include this GPU (its limit is 0: every allocation is refused).
    pub index: Option<usize>,
}

/// The visible devices of this process, in CUDA ordinal order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceMap {
    visible: Vec<Visible>,
}

impl DeviceMap {
    /// Maps each visible device's UUID with `find` (the control file's
    /// lookup by UUID).
    pub fn new(devices: Vec<(CUdevice, String)>, find: impl Fn(&str) -> Option<usize>) -> Self {
        let visible = devices
            .into_iter()
            .map(|(device, uuid)| Visible {
                index: find(&uuid),
                device,
                uuid,
            })
            .collect();
        DeviceMap { visible }
    }

    /// The control-file index of a `CUdevice`, if the allocation has it.
    pub fn index_of(&self, device: CUdevice) -> Option<usize> {
        self.visible
            .iter()
            .find(|v| v.device == device)
            .and_then(|v| v.index)
    }

    /// The allocation's index of the only visible device, when there is
    /// exactly one: then the current device needs no driver call.
    pub fn only(&self) -> Option<usize> {
        match self.visible.as_slice() {
            [v] => v.index,
            _ => None,
        }
    }

    /// Whether exactly one device is visible.
    pub fn single(&self) -> bool {
        self.visible.len() == 1
    }

    pub fn visible(&self) -> &[Visible] {
        &self.visible
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format_matches_nvml() {
        let b = [
            0x5f, 0x0e, 0x8d, 0x6c, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23,
            0x45, 0x67,
        ];
        assert_eq!(format_uuid(&b), "GPU-5f0e8d6c-1234-5678-9abc-def001234567");
    }

    #[test]
    fn uuids_compare_by_identity() {
        assert!(same_uuid(
            "GPU-5F0E8D6C-1234-5678-9abc-def001234567",
            "GPU-5f0e8d6c-1234-5678-9abc-def001234567"
        ));
        assert!(same_uuid(
            "MIG-5f0e8d6c-1234-5678-9abc-def001234567",
            "GPU-5f0e8d6c-1234-5678-9abc-def001234567"
        ));
        assert!(!same_uuid(
            "GPU-5f0e8d6c-1234-5678-9abc-def001234568",
            "GPU-5f0e8d6c-1234-5678-9abc-def001234567"
        ));
    }

    #[test]
    fn devices_map_by_uuid_whatever_their_ordinal() {
        // CUDA_VISIBLE_DEVICES=2,0 on a node whose allocation holds GPUs
        // "b" (index 0) and "c" (index 1): ordinal 0 is node GPU 2.
        let control = ["GPU-b", "GPU-c"];
        let find = |u: &str| control.iter().position(|c| same_uuid(c, u));
        let m = DeviceMap::new(vec![(0, "GPU-c".into()), (1, "GPU-a".into())], find);
        assert_eq!(m.index_of(0), Some(1));
        assert_eq!(m.index_of(1), None, "not in the allocation");
        assert_eq!(m.index_of(7), None, "not visible");
        assert_eq!(m.only(), None);
        assert!(!m.single());
        let one = DeviceMap::new(vec![(0, "GPU-b".into())], find);
        assert_eq!(one.only(), Some(0));
    }
}
