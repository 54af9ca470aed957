//! Whose GPU it is: the vendors a node's GPUs may come from, their spelling in
//! reports, labels and the node's GPU report, the PCI vendor ids that tell them
//! apart, and the spelling of an AMD GPU's UUID.

/// A GPU's vendor. Tessera's own resource (`tessera.dev/vgpu`) is the same for
/// all of them; what differs is the library the manager reads the GPU through
/// and the shim's interception (CUDA or HIP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Vendor {
    /// Read through NVML; the shim governs CUDA.
    #[default]
    Nvidia,
    /// Read through ROCm SMI; the shim governs HIP.
    Amd,
    /// Hygon's DCUs: ROCm SMI's Hygon build and HIP (`libgalaxyhip.so.5`).
    /// Recognised by PCI vendor id; not verified on Hygon hardware.
    Hygon,
}

/// NVIDIA's PCI vendor id.
pub const PCI_VENDOR_NVIDIA: u16 = 0x10de;
/// AMD's (ATI's) PCI vendor id, the one AMD GPUs carry.
pub const PCI_VENDOR_AMD: u16 = 0x1002;
/// Hygon's PCI vendor id.
pub const PCI_VENDOR_HYGON: u16 = 0x1d94;

impl Vendor {
    /// Every vendor, in report order.
    pub const ALL: [Vendor; 3] = [Vendor::Nvidia, Vendor::Amd, Vendor::Hygon];

    /// The spelling in reports, labels, metrics and node config: `nvidia`,
    /// `amd`, `hygon`.
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Hygon => "hygon",
        }
    }

    /// The node label the device plugin sets (`"true"`) on a node with at least
    /// one of this vendor's GPUs, and that the webhook requires of a pod asking
    /// for them: `tessera.dev/gpu-vendor-amd`.
    pub fn node_label(self) -> String {
        format!("tessera.dev/gpu-vendor-{}", self.as_str())
    }

    /// The vendor a PCI vendor id belongs to, if it is one of these.
    pub fn from_pci_vendor(id: u16) -> Option<Vendor> {
        match id {
            PCI_VENDOR_NVIDIA => Some(Vendor::Nvidia),
            PCI_VENDOR_AMD => Some(Vendor::Amd),
            PCI_VENDOR_HYGON => Some(Vendor::Hygon),
            _ => None,
        }
    }
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A vendor name that is none of Tessera's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU vendor {0:?} (nvidia, amd or hygon)")]
pub struct UnknownVendor(pub String);

impl std::str::FromStr for Vendor {
    type Err = UnknownVendor;
    fn from_str(s: &str) -> Result<Vendor, UnknownVendor> {
        Vendor::ALL
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownVendor(s.to_owned()))
    }
}

/// The UUID Tessera names an AMD (or Hygon) GPU by: `GPU-` and the 16 hex
/// digits of ROCm SMI's unique id, the form ROCm's runtime gives the agent's
/// UUID (HSA's `GPU-` string; HIP's `hipDeviceGetUuid` returns the 16 digits
/// as its bytes). Never the shape of an NVIDIA UUID (32 digits in five
/// groups), so the two vendors' GPUs cannot collide on one node.
pub fn format_amd_uuid(unique_id: u64) -> String {
    format!("GPU-{unique_id:016x}")
}

/// The unique id in an AMD UUID's bytes as `hipDeviceGetUuid` gives them
/// (16 ASCII hex digits), if they are that.
pub fn amd_unique_id_from_hip_uuid(bytes: &[u8; 16]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendors_round_trip_through_their_spelling() {
        for v in Vendor::ALL {
            assert_eq!(v.as_str().parse::<Vendor>(), Ok(v));
            assert_eq!(v.to_string().to_uppercase().parse::<Vendor>(), Ok(v));
        }
        assert_eq!(
            "intel".parse::<Vendor>(),
            Err(UnknownVendor("intel".into()))
        );
    }

    #[test]
    fn pci_ids_name_their_vendor() {
        assert_eq!(Vendor::from_pci_vendor(0x10de), Some(Vendor::Nvidia));
        assert_eq!(Vendor::from_pci_vendor(0x1002), Some(Vendor::Amd));
        assert_eq!(Vendor::from_pci_vendor(0x1d94), Some(Vendor::Hygon));
        assert_eq!(Vendor::from_pci_vendor(0x8086), None);
    }

    #[test]
    fn an_amd_uuid_is_the_unique_id_and_never_an_nvidia_shape() {
        let u = format_amd_uuid(0x0123_4567_89ab_cdef);
        assert_eq!(u, "GPU-0123456789abcdef");
        assert_ne!(u.len(), crate::format_uuid(&[0; 16]).len());
        assert_eq!(
            amd_unique_id_from_hip_uuid(b"0123456789abcdef"),
            Some(0x0123_4567_89ab_cdef)
        );
        assert_eq!(amd_unique_id_from_hip_uuid(&[0; 16]), None);
    }
}
