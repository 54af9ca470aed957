//! GPU UUIDs as NVML, nvidia-smi and the control file write them, and the
//! names a user may give a GPU instead (an index, a unique UUID prefix).

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower-case hex, from the 16
/// bytes `cuDeviceGetUuid` returns.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(40);
    s.push_str("GPU");
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 0 | 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

/// Why a user's name for a GPU names none or several.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuNameError {
    #[error("no GPU {want:?} on this node; GPUs here: {here}")]
    NotFound { want: String, here: String },
    #[error("{want:?} matches several GPUs; give more of the UUID ({here})")]
    Ambiguous { want: String, here: String },
}

/// Which of `gpus` (index, UUID) the name `want` means: an index, a UUID,
/// or a prefix of exactly one UUID. Shared by `tessera run`/`resize` and
/// the manager, which resolves a `tessera run` request's names itself so
/// that the run needs no status round trip first.
pub fn resolve_gpu_name(gpus: &[(u32, &str)], want: &str) -> Result<usize, GpuNameError> {
    let here = || {
        gpus.iter()
            .map(|(i, u)| format!("{i} ({u})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let found: Vec<usize> = if let Ok(i) = want.parse::<u32>() {
        gpus.iter()
            .enumerate()
            .filter(|(_, g)| g.0 == i)
            .map(|(k, _)| k)
            .collect()
    } else if let Some(k) = gpus.iter().position(|g| g.1 == want) {
        vec![k]
    } else {
        gpus.iter()
            .enumerate()
            .filter(|(_, g)| !want.is_empty() && g.1.starts_with(want))
            .map(|(k, _)| k)
            .collect()
    };
    match found.as_slice() {
        [k] => Ok(*k),
        [] => Err(GpuNameError::NotFound {
            want: want.to_owned(),
            here: here(),
        }),
        _ => Err(GpuNameError::Ambiguous {
            want: want.to_owned(),
            here: here(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_names_by_index_uuid_and_unique_prefix() {
        let gpus = [(0, "GPU-a1"), (1, "GPU-b2"), (2, "GPU-b3")];
        assert_eq!(resolve_gpu_name(&gpus, "1"), Ok(1));
        assert_eq!(resolve_gpu_name(&gpus, "GPU-b3"), Ok(2));
        assert_eq!(resolve_gpu_name(&gpus, "GPU-a"), Ok(0));
        let e = resolve_gpu_name(&gpus, "7").unwrap_err().to_string();
        assert_eq!(
            e,
            "no GPU \"7\" on this node; GPUs here: 0 (GPU-a1), 1 (GPU-b2), 2 (GPU-b3)"
        );
        let e = resolve_gpu_name(&gpus, "GPU-b").unwrap_err();
        assert!(matches!(e, GpuNameError::Ambiguous { .. }), "{e}");
        assert!(resolve_gpu_name(&gpus, "").is_err());
    }

    #[test]
    fn nvml_spelling() {
        let b: [u8; 16] = [
            0xdb, 0xdc, 0xaa, 0x22, 0xb2, 0xe6, 0x1b, 0x72, 0x7d, 0x58, 0x2f, 0x4c, 0xcf, 0x5e,
            0x5e, 0xb3,
        ];
        assert_eq!(format_uuid(&b), "GPU-dbdcaa22-b2e6-1b72-7d58-2f4ccf5e5eb3");
        assert_eq!(
            format_uuid(&[0; 16]),
            "GPU-00000000-0000-0000-0000-000000000000"
        );
    }
}
