//! Layout and validation tests: the files are an ABI between separately
//! built binaries, so offsets are pinned and every bad file is refused.

use std::io::{Seek, SeekFrom, Write};
use std::mem::{offset_of, size_of};

use tessera_shm::layout::*;
use tessera_shm::{
    Control, ControlSpec, DeviceSpec, Policy, ShmError, State, create_allocation_files,
};

fn spec() -> ControlSpec {
    ControlSpec::new(
        "alloc-1",
        vec![
            DeviceSpec {
                uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
                memory_limit_bytes: 4 << 30,
                compute_share_ppm: 300_000,
                policy: Policy::Guaranteed,
            },
            DeviceSpec {
                uuid: "GPU-66666666-7777-8888-9999-000000000000".into(),
                memory_limit_bytes: 1 << 30,
                compute_share_ppm: 1_000_000,
                policy: Policy::Burst,
            },
        ],
    )
}

#[test]
fn offsets_are_pinned() {
    assert_eq!(offset_of!(ControlHeader, magic), 0);
    assert_eq!(offset_of!(ControlHeader, abi_version), 8);
    assert_eq!(offset_of!(ControlHeader, size), 12);
    assert_eq!(offset_of!(ControlHeader, identity_crc), 16);
    assert_eq!(offset_of!(ControlHeader, n_devices), 20);
    assert_eq!(offset_of!(ControlHeader, alloc_id), 24);
    assert_eq!(offset_of!(ControlHeader, context_overhead_bytes), 88);
    assert_eq!(offset_of!(ControlHeader, arbiter_heartbeat_ns), 96);
    assert_eq!(offset_of!(ControlHeader, gate_timeout_ns), 104);
    assert_eq!(offset_of!(ControlFile, devices), 192);
    assert_eq!(offset_of!(DeviceControl, memory_limit_bytes), 64);
    assert_eq!(offset_of!(DeviceControl, compute_share_ppm), 72);
    assert_eq!(offset_of!(DeviceControl, policy), 76);
    assert_eq!(offset_of!(DeviceControl, grant), 80);
    assert_eq!(offset_of!(DeviceControl, revocations), 84);
    // Taken from reserved space (zero in older files): size and ABI unchanged.
    assert_eq!(offset_of!(DeviceControl, context_bytes), 88);
    assert_eq!(offset_of!(StateHeader, gate_slots), 84);
    assert_eq!(offset_of!(StateFile, devices), 128);
    assert_eq!(offset_of!(StateFile, slots), 128 + 16 * 64);
    assert_eq!(offset_of!(Slot, devices), 64);
    assert_eq!(offset_of!(Slot, gate_waiting), 32);
    assert_eq!(offset_of!(Slot, syncing), 36);
    // Taken from reserved space (zero in older files): size and ABI unchanged.
    assert_eq!(offset_of!(Slot, yielding), 40);
    assert_eq!(offset_of!(Slot, first_launch), 48);
    assert_eq!(offset_of!(DeviceState, waiters), 16);
    assert_eq!(offset_of!(DeviceState, wait_ns), 24);
    assert_eq!(offset_of!(DeviceState, drain_signal), 32);
    assert_eq!(offset_of!(DeviceState, drained_at_ns), 40);
    assert_eq!(offset_of!(SlotDevice, launch_epoch), 16);
    assert_eq!(offset_of!(SlotDevice, drained_epoch), 20);
    assert_eq!(offset_of!(SlotDevice, launches), 24);
    assert_eq!(size_of::<ControlFile>(), 2240);
    assert_eq!(size_of::<StateFile>(), 590_976);
    // Hot words sit on their own cache lines so processes on different
    // devices do not contend.
    assert_eq!(size_of::<DeviceState>() % 64, 0);
    assert_eq!(size_of::<Slot>() % 64, 0);
}

#[test]
fn packed_words_round_trip() {
    for r in [
        Reserved {
            bytes: 0,
            pending: None,
        },
        Reserved {
            bytes: MAX_BYTES,
            pending: Some((MAX_SLOTS - 1, 2047)),
        },
        Reserved {
            bytes: 12345,
            pending: Some((0, 0)),
        },
    ] {
        assert_eq!(Reserved::unpack(r.pack()), r);
    }
    for u in [
        Usage { bytes: 0, seq: 0 },
        Usage {
            bytes: MAX_BYTES,
            seq: (1 << SEQ_BITS) - 1,
        },
    ] {
        assert_eq!(Usage::unpack(u.pack()), u);
    }
    for i in [
        Intent { delta: 5, seq: 7 },
        Intent {
            delta: -(MAX_BYTES as i64),
            seq: (1 << SEQ_BITS) - 1,
        },
    ] {
        assert_eq!(Intent::unpack(i.pack()), i);
    }
    for o in [
        Owner::Free { generation: 0 },
        Owner::Free {
            generation: (1 << 30) - 1,
        },
        Owner::Alive {
            generation: 77,
            pid: u32::MAX,
        },
        Owner::Reclaiming {
            generation: 3,
            by: MANAGER_RECLAIMER,
            by_gen: 0x1f_ffff,
        },
    ] {
        assert_eq!(Owner::unpack(o.pack()), o);
    }
    assert_eq!(next_seq((1 << SEQ_BITS) - 1), 0);
    for f in [
        FirstLaunch { dev: 0, at_ns: 1 },
        FirstLaunch {
            dev: MAX_DEVICES - 1,
            at_ns: (1 << 60) - 1,
        },
        FirstLaunch {
            dev: 3,
            at_ns: 12_345_678_901_234,
        },
    ] {
        assert_eq!(FirstLaunch::unpack(f.pack()), Some(f));
    }
    // A slot that never recorded one (zero in older files).
    assert_eq!(FirstLaunch::unpack(0), None);
}

#[test]
fn control_round_trips_and_opens_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let (c, s) = create_allocation_files(dir.path(), &spec()).unwrap();
    let ctl = Control::open(&c).unwrap();
    assert_eq!(ctl.spec(), spec());
    assert_eq!(
        ctl.find_uuid("GPU-66666666-7777-8888-9999-000000000000"),
        Some(1)
    );
    assert_eq!(ctl.find_uuid("GPU-nope"), None);
    // A whole GPU needs no arbiter; a share waits for one.
    assert!(grant::may_submit(
        ctl.device(1)
            .grant
            .load(std::sync::atomic::Ordering::Relaxed)
    ));
    assert!(!grant::may_submit(
        ctl.device(0)
            .grant
            .load(std::sync::atomic::Ordering::Relaxed)
    ));
    // The hook's read-only view cannot change limits.
    assert!(matches!(
        ctl.set_memory_limit(0, 1),
        Err(ShmError::ReadOnly(_))
    ));
    let rw = Control::open_rw(&c).unwrap();
    rw.set_memory_limit(0, 8 << 30).unwrap();
    rw.set_policy(0, Policy::Burst).unwrap();
    assert_eq!(
        ctl.memory_limit(0),
        8 << 30,
        "changes show in other mappings"
    );
    assert_eq!(ctl.policy(0), Policy::Burst);
    assert!(rw.set_compute_share(0, 0).is_err());
    State::open(&s, "alloc-1").unwrap();
}

#[test]
fn bad_specs_are_refused() {
    let mut s = spec();
    s.alloc_id = String::new();
    assert!(matches!(s.validate(), Err(ShmError::BadSpec(_))));
    let mut s = spec();
    s.devices[1].uuid = s.devices[0].uuid.clone();
    assert!(s.validate().unwrap_err().to_string().contains("twice"));
    let mut s = spec();
    s.devices[0].compute_share_ppm = 1_000_001;
    assert!(s.validate().is_err());
    let mut s = spec();
    s.devices.clear();
    assert!(s.validate().is_err());
    let mut s = spec();
    s.devices[0].memory_limit_bytes = u64::MAX;
    assert!(s.validate().is_err());
}

fn patch(path: &std::path::Path, at: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn every_bad_control_file_is_refused_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _) = create_allocation_files(dir.path(), &spec()).unwrap();
    let pristine = std::fs::read(&c).unwrap();
    let reset = || std::fs::write(&c, &pristine).unwrap();

    std::fs::remove_file(&c).unwrap();
    assert!(matches!(Control::open(&c), Err(ShmError::Io { .. })));

    std::fs::write(&c, &pristine[..100]).unwrap();
    let e = Control::open(&c).unwrap_err();
    assert!(matches!(e, ShmError::Truncated { len: 100, .. }), "{e}");
    assert!(e.to_string().contains("truncated"));

    let mut long = pristine.clone();
    long.push(0);
    std::fs::write(&c, &long).unwrap();
    assert!(matches!(Control::open(&c), Err(ShmError::Corrupt { .. })));

    reset();
    patch(&c, 0, b"NOTOURS!");
    assert!(matches!(Control::open(&c), Err(ShmError::BadMagic { .. })));

    reset();
    patch(&c, 8, &2u32.to_le_bytes());
    let e = Control::open(&c).unwrap_err();
    assert!(
        matches!(
            e,
            ShmError::AbiMismatch {
                found: 2,
                expected: ABI_VERSION,
                ..
            }
        ),
        "{e}"
    );

    reset();
    // A flipped byte in a UUID breaks the identity checksum.
    patch(&c, 192 + 5, b"X");
    let e = Control::open(&c).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");

    reset();
    patch(&c, 20, &99u32.to_le_bytes());
    assert!(matches!(Control::open(&c), Err(ShmError::Corrupt { .. })));

    reset();
    patch(&c, 192 + 76, &7u32.to_le_bytes());
    assert!(
        Control::open(&c)
            .unwrap_err()
            .to_string()
            .contains("policy")
    );

    reset();
    Control::open(&c).unwrap();
}

#[test]
fn every_bad_state_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, s) = create_allocation_files(dir.path(), &spec()).unwrap();
    let pristine = std::fs::read(&s).unwrap();
    assert!(
        State::open(&s, "another")
            .unwrap_err()
            .to_string()
            .contains("another allocation")
    );
    std::fs::write(&s, &pristine[..4096]).unwrap();
    assert!(matches!(
        State::open(&s, "alloc-1"),
        Err(ShmError::Truncated { .. })
    ));
    std::fs::write(&s, &pristine).unwrap();
    patch(&s, 0, &[0; 8]);
    assert!(matches!(
        State::open(&s, "alloc-1"),
        Err(ShmError::BadMagic { .. })
    ));
    std::fs::write(&s, &pristine).unwrap();
    patch(&s, 8, &9u32.to_le_bytes());
    assert!(matches!(
        State::open(&s, "alloc-1"),
        Err(ShmError::AbiMismatch { .. })
    ));
    // The state file is writable by any uid in the container.
    use std::os::unix::fs::PermissionsExt;
    let (_, s2) = create_allocation_files(&dir.path().join("b"), &spec()).unwrap();
    assert_eq!(
        std::fs::metadata(&s2).unwrap().permissions().mode() & 0o777,
        0o666
    );
}

#[test]
fn a_measured_context_size_is_charged_and_an_unmeasured_one_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control");
    let mut s = spec();
    s.context_overhead_bytes = 300 << 20;
    // Device 0 measured at 523 MiB, device 1 not measured.
    s.context_bytes = vec![Some(523 << 20)];
    tessera_shm::create_control_file(&path, &s).unwrap();
    let c = Control::open_rw(&path).unwrap();
    assert_eq!(c.context_bytes(0), Some(523 << 20));
    assert_eq!(c.context_bytes(1), None);
    assert_eq!(c.context_charge(0), 523 << 20);
    assert_eq!(c.context_charge(1), 300 << 20, "the allocation's estimate");
    assert_eq!(c.spec().context_bytes, vec![Some(523 << 20)]);
    // A measured zero is a figure, not "unmeasured".
    c.set_context_bytes(1, Some(0)).unwrap();
    assert_eq!(c.context_charge(1), 0);
    c.set_context_bytes(1, None).unwrap();
    assert_eq!(c.context_charge(1), 300 << 20);
    assert!(c.set_context_bytes(0, Some(CONTEXT_MEASURED)).is_err());
    // A file of the previous layout (the word zero) reads as not measured.
    let ro = Control::open(&path).unwrap();
    assert!(ro.set_context_bytes(0, None).is_err(), "read-only mapping");
    let mut bad = spec();
    bad.context_bytes = vec![Some(u64::MAX)];
    assert!(bad.validate().is_err());
}
