//! Runs the real-GPU check script (`tests/gpu/run.sh`) against the simulated
//! GPU node, so the script is known to work before it meets a GPU: its
//! driver, NVML, burst, race (each also with processes exiting while others
//! allocate), accounting and start-up checks must pass, and its framework
//! checks must say plainly that they did not run (there is no CUDA PyTorch,
//! JAX or CuPy for the Python it is given here).
//!
//! Every check runs, at smaller counts and durations than the script's
//! defaults (12 processes in the bursts and 6 in the races, in a 4 GiB
//! allocation, which they still fill), so the test stays short on a loaded
//! box; the full counts on the simulated node are `tests/tests/run_burst.rs`,
//! `hook_race.rs` and `exit_window.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ is inside the repository")
        .to_owned()
}

#[test]
fn gpu_script_runs_against_the_simulated_node() {
    let tessera = PathBuf::from(env!("CARGO_BIN_EXE_tessera"));
    let bin_dir = tessera.parent().expect("binary in a directory");
    let out = Command::new("bash")
        .arg(repo_root().join("tests/gpu/run.sh"))
        .arg("--sim")
        .arg("--bin")
        .arg(bin_dir)
        // The script must not reach for PyTorch here, even if one exists.
        .env("PYTHONNOUSERSITE", "1")
        .env("CHECK_SECONDS", "2")
        .env("CHECK_HOLD", "1")
        .env("CHECK_PAIRS", "3")
        .env("CHECK_BURST", "12")
        .env("CHECK_RACE", "6")
        .env("CHECK_GROUP_GIB", "4")
        // The framework checks look for their framework in these Pythons only.
        .env_remove("TORCH_PYTHON")
        .env_remove("JAX_PYTHON")
        .env_remove("CUPY_PYTHON")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "script failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name:?} in:\n{stdout}"))
            .to_owned()
    };
    let driver = row("driver: cuMemGetInfo shows 4 GiB");
    assert!(driver.contains(" ok "), "{driver}");
    assert!(driver.contains("total=4.00GiB"), "{driver}");
    assert!(
        driver.contains("error=2"),
        "refused with CUDA_ERROR_OUT_OF_MEMORY: {driver}"
    );
    let nvml = row("nvml: memory info shows 4 GiB");
    assert!(nvml.contains(" ok "), "{nvml}");
    assert!(nvml.contains("total=4.00GiB"), "{nvml}");
    // The checks of processes together run on the simulated node as on a GPU.
    let burst = row("burst: 12 at once in 4 GiB, none stopped");
    assert!(burst.contains(" ok "), "{burst}");
    assert!(burst.contains("stopped=0 manager_stops=0"), "{burst}");
    let rolling = row("burst (rolling): 12 ");
    assert!(rolling.contains(" ok "), "{rolling}");
    assert!(rolling.contains("stopped=0 manager_stops=0"), "{rolling}");
    assert!(rolling.contains("over=0 bytes"), "{rolling}");
    let race = row("race: 6 racers in 4 GiB, 0 bytes over");
    assert!(race.contains(" ok "), "{race}");
    assert!(race.contains("racers_ok=6/6"), "{race}");
    assert!(race.contains("over=0 bytes"), "{race}");
    let leaving = row("race (rolling exits): 6 racers in 4 GiB");
    assert!(leaving.contains(" ok "), "{leaving}");
    assert!(leaving.contains("racers_ok=6/6"), "{leaving}");
    assert!(leaving.contains("over=0 bytes"), "{leaving}");
    let accounting = row("accounting: charged = NVML per process");
    assert!(accounting.contains(" ok "), "{accounting}");
    let startup = row("start-up: tessera run vs bare");
    assert!(startup.contains(" ok "), "{startup}");
    let has_torch = Command::new("python3")
        .args(["-c", "import torch; assert torch.cuda.is_available()"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_torch {
        for name in [
            "torch: OOM at 4 GiB",
            "torch: 30%/70% guaranteed split",
            "torch: launch-bound loop overhead",
            "torch: 30%/70% sync every step",
        ] {
            let r = row(name);
            assert!(r.contains("not run: no CUDA PyTorch"), "{r}");
        }
        for name in [
            "frameworks: torch_check",
            "frameworks: train_check",
            "frameworks: serve_check",
            "frameworks: mp_check",
        ] {
            let r = row(name);
            assert!(r.contains("not run: no CUDA framework"), "{r}");
        }
        // Without torch, 8 rows are missing; JAX and CuPy add theirs when absent too.
        assert!(stdout.contains("MISSING FIGURES: "), "{stdout}");
        assert!(
            stdout.contains("these results are incomplete, not passed"),
            "{stdout}"
        );
    }
}
