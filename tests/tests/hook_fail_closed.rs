//! A governed process whose allocation files are missing, truncated,
//! corrupt or of another ABI fails closed: CUDA and NVML initialisation
//! return an error, the driver is never initialised, and exactly one line on
//! stderr names the file and the reason. The process itself carries on.

mod hook_support;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use hook_support::*;

fn patch(path: &Path, at: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(bytes).unwrap();
}

fn truncate(path: &Path, len: usize) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..len]).unwrap();
}

/// Breaks the allocation with `spoil`, then checks every client style
/// fails closed with one line naming `file` and containing `reason`.
fn fails_closed(spoil: impl Fn(&Sim), file: impl Fn(&Sim) -> &Path, reason: &str) {
    let sim = Sim::new(1, 256 * MI);
    sim.allocate(64 * MI);
    spoil(&sim);
    assert_fails_closed(&sim, file(&sim), &[reason], reason);
}

fn control(s: &Sim) -> &Path {
    &s.control
}

fn state(s: &Sim) -> &Path {
    &s.state_path
}

#[test]
fn missing_control_file() {
    fails_closed(
        |s| std::fs::remove_file(&s.control).unwrap(),
        control,
        "No such file",
    );
}

#[test]
fn truncated_control_file() {
    fails_closed(|s| truncate(&s.control, 100), control, "truncated");
}

#[test]
fn control_file_of_another_abi_version() {
    fails_closed(
        |s| patch(&s.control, 8, &2u32.to_le_bytes()),
        control,
        "ABI version 2",
    );
}

#[test]
fn corrupt_control_file() {
    // A flipped byte in a GPU UUID breaks the identity checksum.
    fails_closed(|s| patch(&s.control, 192 + 10, b"X"), control, "checksum");
}

#[test]
fn not_a_control_file() {
    fails_closed(
        |s| patch(&s.control, 0, b"NOTOURS!"),
        control,
        "not a Tessera file",
    );
}

#[test]
fn missing_state_file() {
    fails_closed(
        |s| std::fs::remove_file(&s.state_path).unwrap(),
        state,
        "No such file",
    );
}

#[test]
fn truncated_state_file() {
    fails_closed(|s| truncate(&s.state_path, 4096), state, "truncated");
}

#[test]
fn state_file_of_another_allocation() {
    fails_closed(
        |s| {
            tessera_shm::create_state_file(&s.state_path, "someone-else").unwrap();
        },
        state,
        "another allocation",
    );
}
