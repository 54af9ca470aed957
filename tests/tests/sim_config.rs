//! Configuring the simulated node by environment: the first process creates the node
//! state from `TESSERA_SIM_*`; later processes join it whatever their own variables say;
//! bad values are a clear error.

use tessera_e2e::run_on_state;

#[test]
fn the_first_process_configures_the_node_and_later_ones_join_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("sub/node");
    let vars = [
        ("TESSERA_SIM_DEVICES", "3"),
        ("TESSERA_SIM_MEMORY", "2Gi"),
        ("TESSERA_SIM_SMS", "16"),
        ("TESSERA_SIM_NAME", "Env GPU"),
        ("TESSERA_SIM_CC", "8.6"),
    ];
    let out = run_on_state(
        &state,
        &vars,
        &["init", "count", "device 2", "totalmem", "name"],
    );
    out.expect_ok();
    assert_eq!(out.get("count").u64("n"), 3);
    assert_eq!(out.get("totalmem").u64("bytes"), 2 << 30);
    assert_eq!(out.get("name").str("name"), "Env GPU");

    let out = run_on_state(
        &state,
        &[("TESSERA_SIM_DEVICES", "1"), ("TESSERA_SIM_MEMORY", "1Gi")],
        &["init", "count", "totalmem"],
    );
    out.expect_ok();
    assert_eq!(
        out.get("count").u64("n"),
        3,
        "the existing node's configuration wins"
    );
    assert_eq!(out.get("totalmem").u64("bytes"), 2 << 30);

    // Bad variables do not stop a process from joining an existing node either.
    let out = run_on_state(
        &state,
        &[("TESSERA_SIM_DEVICES", "zero")],
        &["init", "count"],
    );
    out.expect_ok();
}

#[test]
fn a_bad_variable_for_a_new_node_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("node");
    let out = run_on_state(
        &state,
        &[("TESSERA_SIM_MEMORY", "lots")],
        &["init", "count"],
    );
    assert_eq!(
        out.get("init").error.as_deref(),
        Some("CUDA_ERROR_OPERATING_SYSTEM")
    );
    assert!(out.stderr.contains("TESSERA_SIM_MEMORY"), "{}", out.stderr);
    assert!(out.stderr.contains("lots"), "{}", out.stderr);
    assert_eq!(
        out.get("count").error.as_deref(),
        Some("CUDA_ERROR_NOT_INITIALIZED")
    );
}

#[test]
fn a_corrupt_state_file_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("node");
    std::fs::write(&state, b"something else").expect("write");
    let out = run_on_state(&state, &[], &["init", "nvml-init"]);
    assert_eq!(
        out.get("init").error.as_deref(),
        Some("CUDA_ERROR_OPERATING_SYSTEM")
    );
    assert_eq!(
        out.get("nvml-init").error.as_deref(),
        Some("NVML_ERROR_DRIVER_NOT_LOADED")
    );
    assert!(
        out.stderr.contains(&state.display().to_string()),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read(&state).expect("read"), b"something else");
}

#[test]
fn a_bad_driver_cost_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("node");
    let out = run_on_state(
        &state,
        &[("TESSERA_SIM_LAUNCH_COST", "fast")],
        &["init", "count"],
    );
    assert_eq!(
        out.get("init").error.as_deref(),
        Some("CUDA_ERROR_INVALID_VALUE")
    );
    assert!(
        out.stderr.contains("TESSERA_SIM_LAUNCH_COST"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("fast"), "{}", out.stderr);
    // A good value works (the costs are the process's, so any node takes it).
    let out = run_on_state(
        &state,
        &[
            ("TESSERA_SIM_SYNC_LATENCY", "2us"),
            ("TESSERA_SIM_KERNEL_GAP", "0"),
        ],
        &["init", "count"],
    );
    out.expect_ok();
}
