//! The simulated NVML against a node in a temporary directory.

use super::*;

#[test]
fn error_strings_exist_for_all_codes() {
    assert_eq!(error_text(nvmlReturn_t::NVML_SUCCESS), c"Success");
    assert_eq!(
        error_text(nvmlReturn_t::NVML_ERROR_GPU_IS_LOST),
        c"GPU is lost"
    );
    assert_eq!(error_text(nvmlReturn_t(4242)), c"Unknown Error");
}

#[test]
fn calls_before_init_are_uninitialized() {
    let mut n = 0;
    // SAFETY: valid out pointer.
    let r = unsafe { nvmlDeviceGetCount_v2(&mut n) };
    assert_eq!(r, nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
    // SAFETY: no arguments.
    let r = unsafe { nvmlShutdown() };
    assert_eq!(r, nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
}

#[test]
fn bitmasks_cover_exactly_the_cpus() {
    let mut words = [0 as c_ulong; 2];
    fill_bitmask(2, words.as_mut_ptr(), 70).expect("fill");
    assert_eq!(words[0], c_ulong::MAX);
    assert_eq!(words[1], (1 << 6) - 1);
    assert!(fill_bitmask(0, words.as_mut_ptr(), 1).is_err());
}

#[test]
fn device_handles_are_validated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tessera_sim::NodeConfig {
        devices: 2,
        ..Default::default()
    };
    let node = Node::open(&dir.path().join("node"), &config).expect("node");
    assert_eq!(index_of(&node, handle(1)), Ok(1));
    assert!(
        index_of(&node, handle(2)).is_err(),
        "beyond the node's devices"
    );
    assert!(index_of(&node, std::ptr::null_mut()).is_err());
    let inside = (handle(0) as usize + 1) as nvmlDevice_t;
    assert!(index_of(&node, inside).is_err(), "not the start of a slot");
}
