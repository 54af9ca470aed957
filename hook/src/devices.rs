//! The process's CUDA devices mapped onto its allocation's devices by UUID,
//! so limits and usage live in one index domain (the control file's order)
//! whatever `CUDA_VISIBLE_DEVICES` selects; and what that variable must say
//! for the driver to see only the allocation's GPUs.

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

/// The driver's variable of which GPUs a process sees.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// What `CUDA_VISIBLE_DEVICES` must say for the driver to see only the
/// allocation's GPUs (`alloc`: the control file's UUIDs, in its order).
/// The variable is the tenant's: it may narrow the view within the
/// allocation, never widen it. Each entry of `spec` is read as the driver
/// would read it inside the allocation: an index is an index into the
/// allocation's GPUs (as they are numbered when the variable names exactly
/// them, which is what `tessera run` and the device plugin set), a UUID or
/// a prefix of one names the allocation GPU it matches; an entry that
/// names no GPU of the allocation is skipped. Unset, or nothing of the
/// allocation selected, is the whole allocation; empty (no GPU asked for)
/// stays empty.
pub fn pinned_visible(spec: Option<&str>, alloc: &[&str]) -> String {
    let Some(spec) = spec else {
        return alloc.join(",");
    };
    if spec.trim().is_empty() {
        return String::new();
    }
    let mut chosen: Vec<&str> = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            entry
                .parse::<usize>()
                .ok()
                .and_then(|i| alloc.get(i).copied())
        } else if let Some(head) = entry.get(..4)
            && (head.eq_ignore_ascii_case("GPU-") || head.eq_ignore_ascii_case("MIG-"))
            && entry.len() > 4
        {
            let key = entry[4..].to_ascii_lowercase();
            let mut hits = alloc.iter().filter(|u| uuid_key(u).starts_with(&key));
            match (hits.next(), hits.next()) {
                (Some(u), None) => Some(*u),
                _ => None,
            }
        } else {
            None
        };
        if let Some(u) = found
            && !chosen.contains(&u)
        {
            chosen.push(u);
        }
    }
    if chosen.is_empty() {
        alloc.join(",")
    } else {
        chosen.join(",")
    }
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

    #[test]
    fn the_visible_devices_are_the_allocations_whatever_the_tenant_writes() {
        let one = ["GPU-b"];
        // Unset, rewritten to every GPU, to the other GPU, to an index
        // past the allocation: the allocation's one GPU.
        for spec in [
            None,
            Some("0,1"),
            Some("1"),
            Some("GPU-a"),
            Some("GPU-a,GPU-b"),
        ] {
            assert_eq!(pinned_visible(spec, &one), "GPU-b", "{spec:?}");
        }
        assert_eq!(pinned_visible(Some(""), &one), "", "no GPU asked for");
        // Two GPUs: an index or a UUID (or a prefix) narrows within the
        // allocation, in the order given.
        let two = ["GPU-b1", "GPU-c2"];
        assert_eq!(pinned_visible(None, &two), "GPU-b1,GPU-c2");
        assert_eq!(pinned_visible(Some("1"), &two), "GPU-c2");
        assert_eq!(pinned_visible(Some("1,0"), &two), "GPU-c2,GPU-b1");
        assert_eq!(pinned_visible(Some("gpu-C"), &two), "GPU-c2");
        assert_eq!(
            pinned_visible(Some("c2"), &two),
            "GPU-b1,GPU-c2",
            "not a UUID"
        );
        assert_eq!(pinned_visible(Some("GPU-a9,GPU-c2"), &two), "GPU-c2");
        // A prefix of both is ambiguous: skipped, so the whole allocation.
        assert_eq!(pinned_visible(Some("GPU-"), &two), "GPU-b1,GPU-c2");
    }
}
