//! Version skew between the shim and the manager, both ways: the files of a manager one
//! layout older (ABI version 0) or newer (ABI version 2, also with a larger file) than
//! this shim make a governed process fail closed — every CUDA and NVML entry point
//! refuses, nothing reaches the device — with exactly one line on stderr naming the file
//! and the two versions. Never a crash, never a process running unlimited. The same
//! ABI version (every release so far) works: the other tests.

mod hook_support;

use std::path::Path;

use hook_support::*;

/// Sets the ABI version word (offset 8, after the magic) of `path`; `grow` bytes are
/// appended, as a newer release's larger layout would have.
fn another_release(path: &Path, abi: u32, grow: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[8..12].copy_from_slice(&abi.to_le_bytes());
    bytes.resize(bytes.len() + grow, 0);
    std::fs::write(path, bytes).unwrap();
}

fn fails_closed_on(which: fn(&Sim) -> &Path, abi: u32, grow: usize) {
    let sim = Sim::new(1, 256 * MI);
    sim.allocate(64 * MI);
    let file = which(&sim).to_owned();
    another_release(&file, abi, grow);
    assert_fails_closed(
        &sim,
        &file,
        &[
            &format!("ABI version {abi}, this build speaks 1"),
            "another release",
        ],
        &format!("ABI {abi}, +{grow} bytes"),
    );
}

fn control(s: &Sim) -> &Path {
    &s.control
}

fn state(s: &Sim) -> &Path {
    &s.state_path
}

#[test]
fn a_control_file_of_an_older_layout_fails_closed() {
    fails_closed_on(control, 0, 0);
}

#[test]
fn a_control_file_of_a_newer_layout_fails_closed() {
    fails_closed_on(control, 2, 0);
    fails_closed_on(control, 2, 4096);
}

#[test]
fn a_state_file_of_an_older_layout_fails_closed() {
    fails_closed_on(state, 0, 0);
}

#[test]
fn a_state_file_of_a_newer_layout_fails_closed() {
    fails_closed_on(state, 2, 0);
    fails_closed_on(state, 2, 4096);
}
