//! Device IDs: `<gpu-uuid>::<n>`, one per slice, n the 0-based slice index.

use std::fmt;

/// Why a string is not a device ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceIdError {
    #[error("device id {0:?} is not of the form <gpu-uuid>::<slice>")]
    Malformed(String),
    #[error("device id {0:?} has a slice index that is not a number")]
    BadIndex(String),
}

/// One slice of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub gpu_uuid: String,
    pub slice: u32,
}

/// The kubelet rejects device IDs longer than this.
pub const MAX_DEVICE_ID_LEN: usize = 63;

impl DeviceId {
    pub fn new(gpu_uuid: impl Into<String>, slice: u32) -> Self {
        Self {
            gpu_uuid: gpu_uuid.into(),
            slice,
        }
    }

    /// Parses `<gpu-uuid>::<n>`. The UUID is whatever precedes the last `::`.
    pub fn parse(s: &str) -> Result<Self, DeviceIdError> {
        let (uuid, index) = s
            .rsplit_once("::")
            .ok_or_else(|| DeviceIdError::Malformed(s.to_owned()))?;
        if uuid.is_empty() || index.is_empty() {
            return Err(DeviceIdError::Malformed(s.to_owned()));
        }
        if !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(DeviceIdError::BadIndex(s.to_owned()));
        }
        let slice = index
            .parse()
            .map_err(|_| DeviceIdError::BadIndex(s.to_owned()))?;
        Ok(Self::new(uuid, slice))
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}::{}", self.gpu_uuid, self.slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let id = DeviceId::new("GPU-0a1b2c3d-0000-1111-2222-333344445555", 7);
        let s = id.to_string();
        assert_eq!(s, "GPU-0a1b2c3d-0000-1111-2222-333344445555::7");
        assert!(s.len() <= MAX_DEVICE_ID_LEN);
        assert_eq!(DeviceId::parse(&s), Ok(id));
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(
            DeviceId::parse("GPU-abc"),
            Err(DeviceIdError::Malformed("GPU-abc".into()))
        );
        assert_eq!(
            DeviceId::parse("::3"),
            Err(DeviceIdError::Malformed("::3".into()))
        );
        assert_eq!(
            DeviceId::parse("GPU-abc::"),
            Err(DeviceIdError::Malformed("GPU-abc::".into()))
        );
        assert_eq!(
            DeviceId::parse("GPU-abc::x"),
            Err(DeviceIdError::BadIndex("GPU-abc::x".into()))
        );
        assert_eq!(
            DeviceId::parse("GPU-abc::-1"),
            Err(DeviceIdError::BadIndex("GPU-abc::-1".into()))
        );
        assert_eq!(
            DeviceId::parse("GPU-abc::99999999999"),
            Err(DeviceIdError::BadIndex("GPU-abc::99999999999".into()))
        );
    }
}
