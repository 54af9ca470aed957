//! CI's soak: `tessera-bench soak` for the three minutes the soak is specified at (a seeded
//! random mix of allocations created and deleted, processes launched, allocating, freeing
//! and SIGKILLed, the manager restarted, a tenant's state file corrupted), which checks the
//! node's invariants after every step and exits 1 on any violation. Three minutes of wall
//! time is too long for every `cargo test`: the soak is ignored there and `.ci/contention`
//! runs it (`--ignored`), beside the busy processes, once per CI run. `TESSERA_SOAK_MINUTES`
//! and `TESSERA_SOAK_SEED` change it. The long run's figures are in the README.
//!
//! What the soak covers does not depend on the machine's speed: it runs its minutes and
//! then on until it has taken `MIN_STEPS` steps and every action of its mix (a loaded box
//! takes longer, never less), so the checks below hold whatever the load.

use std::process::Command;

#[test]
#[ignore = "a three-minute soak: .ci/contention runs it (cargo test --test soak_runs -- --ignored)"]
fn a_three_minute_soak_finds_no_violation() {
    let minutes = std::env::var("TESSERA_SOAK_MINUTES").unwrap_or_else(|_| "3".into());
    let seed = std::env::var("TESSERA_SOAK_SEED").unwrap_or_else(|_| "20261202".into());
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-bench"))
        .args(["soak", "--minutes", &minutes, "--seed", &seed])
        .output()
        .expect("run tessera-bench soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "soak failed: {stderr}\n{stdout}");
    let figure = |name: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name:?} in the report:\n{stdout}"))
    };
    assert_eq!(figure("violations"), 0, "{stdout}");
    // It did drive the node: every kind of fault happened, and checks ran after each step.
    assert!(
        figure("steps") >= tessera_e2e::bench::soak::MIN_STEPS,
        "{stdout}"
    );
    assert!(figure("invariant checks") > figure("steps"), "{stdout}");
    for action in [
        "SIGKILL a process",
        "restart the manager",
        "restart the device plugin",
        "corrupt a state file",
    ] {
        assert!(figure(action) > 0, "no {action:?} in {stdout}");
    }
}

#[test]
fn soak_help_prints_the_usage_and_exits_0() {
    for flag in ["--help", "-h"] {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera-bench"))
            .args(["soak", flag])
            .output()
            .expect("run tessera-bench soak --help");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "soak {flag}: {stderr}\n{stdout}");
        assert!(
            stdout.contains("tessera-bench soak [--minutes N] [--seed S]"),
            "soak {flag} printed no usage: {stdout}"
        );
        assert!(stderr.is_empty(), "soak {flag} wrote to stderr: {stderr}");
    }
    // An unknown option stays an error that names it.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-bench"))
        .args(["soak", "--minuets", "3"])
        .output()
        .expect("run tessera-bench soak --minuets");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown soak option --minuets"));
}
