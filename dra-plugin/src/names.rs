//! Device names in this driver's ResourceSlices, derived from the GPU's UUID
//! (stable across restarts, reboots and index changes, unlike an index):
//! `gpu-<uuid>` for a whole shared GPU, `gpu-<uuid>-s<n>` for its slice `n`.
//! Both are DNS labels (lower case, at most 63 characters), as the API
//! requires of a device name.

/// The key of a GPU in device names: its UUID in lower case without the
/// `GPU-` prefix, anything but `[a-z0-9]` turned into `-`.
pub fn gpu_key(uuid: &str) -> String {
    let u = uuid.strip_prefix("GPU-").unwrap_or(uuid);
    let k: String = u
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    k.trim_matches('-').to_owned()
}

/// The device of a whole GPU (the `shared` layout).
pub fn gpu_device(uuid: &str) -> String {
    format!("gpu-{}", gpu_key(uuid))
}

/// The device of slice `n` of a GPU (the `slices` layout).
pub fn slice_device(uuid: &str, n: u32) -> String {
    format!("gpu-{}-s{n}", gpu_key(uuid))
}

/// What a device name names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceName {
    /// A whole GPU, by key.
    Gpu(String),
    /// Slice `n` of a GPU, by key.
    Slice(String, u32),
}

impl DeviceName {
    /// The GPU's key.
    pub fn gpu_key(&self) -> &str {
        match self {
            Self::Gpu(k) | Self::Slice(k, _) => k,
        }
    }
}

/// Reads a device name back; None for a name this driver never publishes.
pub fn parse(name: &str) -> Option<DeviceName> {
    let rest = name.strip_prefix("gpu-")?;
    if rest.is_empty() || name.len() > 63 {
        return None;
    }
    let valid = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !k.starts_with('-')
            && !k.ends_with('-')
    };
    if let Some((key, n)) = rest.rsplit_once("-s")
        && !n.is_empty()
        && n.chars().all(|c| c.is_ascii_digit())
        && !(n.len() > 1 && n.starts_with('0'))
        && valid(key)
    {
        return n.parse().ok().map(|n| DeviceName::Slice(key.to_owned(), n));
    }
    valid(rest).then(|| DeviceName::Gpu(rest.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "GPU-8F3C2A10-1B2C-4D5E-8F90-0123456789AB";

    #[test]
    fn names_are_dns_labels_and_read_back() {
        let g = gpu_device(UUID);
        assert_eq!(g, "gpu-8f3c2a10-1b2c-4d5e-8f90-0123456789ab");
        let s = slice_device(UUID, 127);
        assert_eq!(s, "gpu-8f3c2a10-1b2c-4d5e-8f90-0123456789ab-s127");
        assert!(s.len() <= 63);
        assert_eq!(parse(&g), Some(DeviceName::Gpu(gpu_key(UUID))));
        assert_eq!(parse(&s), Some(DeviceName::Slice(gpu_key(UUID), 127)));
        // A UUID whose last group ends in "s<digits>" cannot exist: keys are hex.
        for bad in ["gpu-", "cpu-1", "gpu-A", "gpu--s1", "gpu-ab_c", "gpu-a-"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
