//! Runs the real-GPU check script (`tests/gpu/run.sh`) against the simulated
//! GPU node, so the script is known to work before it meets a GPU: its
//! driver and NVML checks must pass, and its PyTorch checks must say plainly
//! that they did not run (there is no CUDA PyTorch here).

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
    let has_torch = Command::new("python3")
        .args(["-c", "import torch; assert torch.cuda.is_available()"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_torch {
        for name in [
            "torch: OOM at 4 GiB",
            "torch: 30%/70% guaranteed split",
            "torch: launch-bound loop overhead",
        ] {
            let r = row(name);
            assert!(r.contains("not run: no CUDA PyTorch"), "{r}");
        }
        assert!(
            stdout.contains("MISSING FIGURES: 3 check(s) did not run here"),
            "{stdout}"
        );
    }
}
