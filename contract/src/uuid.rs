//! GPU UUIDs as NVML, nvidia-smi and the control file write them.

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

#[cfg(test)]
mod tests {
    use super::*;

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
