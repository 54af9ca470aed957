//! `CUDA_VISIBLE_DEVICES`: which of the node's devices this process sees, and in which
//! order, read once at `cuInit` as NVIDIA's driver reads it.
//!
//! The value is a comma-separated list; each entry is a device index (`1`), a full UUID
//! (`GPU-xxxxxxxx-...`) or a prefix of exactly one device's UUID (`GPU-8f3a`). The
//! process's ordinal *n* is the *n*-th listed device. Like the real driver, parsing stops
//! at the first entry that names no device (unknown index or UUID, ambiguous prefix, a
//! device listed already): what was listed before it stays visible, the rest is dropped.
//! Unset means every device; empty means none.

/// The variable the driver reads.
pub const VAR: &str = "CUDA_VISIBLE_DEVICES";

/// The physical device indices visible to the process, in ordinal order.
///
/// `spec` is the variable's value (`None`: unset); `uuids[i]` is device `i`'s UUID in the
/// `GPU-...` form.
pub fn visible_devices<S: AsRef<str>>(spec: Option<&str>, uuids: &[S]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..uuids.len()).collect();
    };
    let mut out = Vec::new();
    for entry in spec.split(',') {
        match resolve(entry.trim(), uuids) {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// The device one entry names, if exactly one.
fn resolve<S: AsRef<str>>(entry: &str, uuids: &[S]) -> Option<usize> {
    if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
        return entry.parse::<usize>().ok().filter(|i| *i < uuids.len());
    }
    // A UUID or a prefix of one; "GPU-" alone names nothing.
    let rest = strip_prefix_ignore_case(entry, "GPU-")?;
    if rest.is_empty() {
        return None;
    }
    let mut found = None;
    for (i, uuid) in uuids.iter().enumerate() {
        let uuid = uuid.as_ref().as_bytes();
        if uuid.len() >= entry.len() && uuid[..entry.len()].eq_ignore_ascii_case(entry.as_bytes()) {
            if found.is_some() {
                return None; // ambiguous
            }
            found = Some(i);
        }
    }
    found
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: [&str; 4] = [
        "GPU-8f3a0000-1111-2222-3333-444444444444",
        "GPU-8f3b0000-1111-2222-3333-555555555555",
        "GPU-12345678-aaaa-bbbb-cccc-dddddddddddd",
        "GPU-9abcdef0-aaaa-bbbb-cccc-eeeeeeeeeeee",
    ];

    fn v(spec: Option<&str>) -> Vec<usize> {
        visible_devices(spec, &U)
    }

    #[test]
    fn unset_is_every_device_and_empty_is_none() {
        assert_eq!(v(None), vec![0, 1, 2, 3]);
        assert_eq!(v(Some("")), Vec::<usize>::new());
        assert_eq!(v(Some(" ")), Vec::<usize>::new());
    }

    #[test]
    fn indices_in_list_order() {
        assert_eq!(v(Some("2")), vec![2]);
        assert_eq!(v(Some("3,0")), vec![3, 0]);
        assert_eq!(v(Some("1, 2")), vec![1, 2]);
    }

    #[test]
    fn full_uuids_and_unique_prefixes() {
        assert_eq!(v(Some(U[2])), vec![2]);
        assert_eq!(v(Some(&format!("{},{}", U[3], U[1]))), vec![3, 1]);
        assert_eq!(v(Some("GPU-1234")), vec![2]);
        assert_eq!(v(Some("GPU-8f3b")), vec![1]);
        assert_eq!(v(Some("gpu-9ABC")), vec![3], "case does not matter");
        assert_eq!(v(Some("GPU-8f3a,0")), vec![0], "one device listed twice");
    }

    #[test]
    fn parsing_stops_at_the_first_invalid_entry() {
        assert_eq!(v(Some("1,7,0")), vec![1], "index out of range");
        assert_eq!(v(Some("2,GPU-8f3,0")), vec![2], "ambiguous prefix");
        assert_eq!(v(Some("0,GPU-ffff,1")), vec![0], "unknown uuid");
        assert_eq!(v(Some("1,1,2")), vec![1], "duplicate");
        assert_eq!(v(Some("-1,0")), Vec::<usize>::new(), "negative index");
        assert_eq!(v(Some("0,,1")), vec![0], "empty entry");
        assert_eq!(v(Some("GPU-,1")), Vec::<usize>::new(), "bare GPU- prefix");
        assert_eq!(v(Some("8f3a")), Vec::<usize>::new(), "uuid without GPU-");
        assert_eq!(v(Some("MIG-1234,0")), Vec::<usize>::new(), "no MIG devices");
        assert_eq!(v(Some("0x1")), Vec::<usize>::new(), "not a decimal index");
        assert_eq!(
            v(Some("99999999999999999999999")),
            Vec::<usize>::new(),
            "overflowing index"
        );
        let long = format!("{}0", U[0]);
        assert_eq!(v(Some(&long)), Vec::<usize>::new(), "longer than a uuid");
    }
}
