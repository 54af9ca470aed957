//! CI's soak: `tessera-bench soak` for two minutes (a seeded random mix of allocations
//! created and deleted, processes launched, allocating, freeing and SIGKILLed, the
//! manager restarted, a tenant's state file corrupted), which checks the node's
//! invariants after every step and exits 1 on any violation. Two minutes, not the issue's
//! three, to keep `.ci/run` within its budget on two cores; `TESSERA_SOAK_MINUTES` and
//! `TESSERA_SOAK_SEED` change it. The long run's figures are in the README.

use std::process::Command;

#[test]
fn a_short_soak_finds_no_violation() {
    let minutes = std::env::var("TESSERA_SOAK_MINUTES").unwrap_or_else(|_| "2".into());
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
    assert!(figure("steps") > 50, "{stdout}");
    assert!(figure("invariant checks") > figure("steps"), "{stdout}");
    for action in [
        "SIGKILL a process",
        "restart the manager",
        "corrupt a state file",
    ] {
        assert!(figure(action) > 0, "no {action:?} in {stdout}");
    }
}
