//! Real CUDA frameworks on the simulated node: CuPy, cuda.core and NVIDIA's shared CUDA
//! runtime (`libcudart.so.12`), bare and under `tessera run --memory 1Gi`.
//!
//! The Python packages come from `tests/frameworks/requirements.txt`, installed by
//! `tests/frameworks/setup.sh` into `target/frameworks-venv` the first time (PyPI must be
//! reachable then; later runs reuse it). The check scripts next to them print `key value`
//! lines; the assertions are here. Kernels do not compute on the simulator, so only what
//! it guarantees is asserted: device queries, bytes moved by copies and memsets, launches
//! and synchronisation that succeed, and the memory limit as each framework's own error.

mod manager_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use manager_support::*;
use tessera_e2e::SimNode;

const GI: u64 = 1 << 30;
/// Every script runs under `timeout`: a hang is a failure with what it printed, not a
/// stuck test (SIGTERM, then SIGKILL 10 s later).
const LIMIT: [&str; 2] = ["-k10", "300"];
const MI: u64 = 1 << 20;

role_test!();

fn frameworks_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("frameworks")
}

/// The virtual environment's Python, after `setup.sh` made sure it is installed (once per
/// test process; the script itself serialises concurrent processes).
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("bash")
            .arg(frameworks_dir().join("setup.sh"))
            .output()
            .expect("run tests/frameworks/setup.sh");
        assert!(
            out.status.success(),
            "tests/frameworks/setup.sh failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let venv = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let python = Path::new(&venv).join("bin/python");
        assert!(
            python.is_file(),
            "setup.sh printed {venv:?}, no bin/python there"
        );
        python
    })
}

/// What a check script printed: its `key value...` lines.
#[derive(Debug)]
struct Facts {
    lines: Vec<Vec<String>>,
    stderr: String,
    text: String,
}

impl Facts {
    fn parse(stdout: &str, stderr: &str) -> Facts {
        Facts {
            lines: stdout
                .lines()
                .map(|l| l.split_whitespace().map(str::to_owned).collect())
                .filter(|l: &Vec<String>| !l.is_empty())
                .collect(),
            stderr: stderr.to_owned(),
            text: format!("stdout:\n{stdout}\nstderr:\n{stderr}"),
        }
    }

    /// The values of `key`'s line; panics (with everything the script said) without one.
    fn get(&self, key: &str) -> Vec<&str> {
        self.lines
            .iter()
            .find(|l| l[0] == key)
            .map(|l| l[1..].iter().map(String::as_str).collect())
            .unwrap_or_else(|| panic!("no {key:?} line\n{}", self.text))
    }

    /// The whole rest of `key`'s line (for values with spaces, like a device name).
    fn rest(&self, key: &str) -> String {
        self.get(key).join(" ")
    }

    fn one(&self, key: &str) -> &str {
        self.get(key).first().copied().unwrap_or_default()
    }

    fn num(&self, key: &str, i: usize) -> u64 {
        self.get(key)[i]
            .parse()
            .unwrap_or_else(|_| panic!("{key} value {i} is not a number\n{}", self.text))
    }

    /// Every step ran: no `error` line, and the script reached its end; and the runtime
    /// neither asked for an export table the driver does not know nor called an entry it
    /// does not implement (the driver logs both).
    fn assert_complete(&self, mode: &str) {
        let errors: Vec<_> = self.lines.iter().filter(|l| l[0] == "error").collect();
        assert!(errors.is_empty(), "errors: {errors:?}\n{}", self.text);
        assert_eq!(self.one("done"), mode, "{}", self.text);
        for bad in ["unknown table", "is not implemented"] {
            assert!(!self.stderr.contains(bad), "{bad}\n{}", self.text);
        }
    }
}

fn facts(out: &Output, stdout: &str) -> Facts {
    let f = Facts::parse(stdout, &String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "exit {}\n{}", out.status, f.text);
    f
}

/// `script args` on `node` without the shim, with `env` added.
fn bare(node: &SimNode, script: &str, args: &[&str], env: &[(&str, &str)]) -> Facts {
    let out = node
        .command("timeout")
        .args(LIMIT)
        .arg(python())
        .arg(frameworks_dir().join(script))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run python");
    facts(&out, &String::from_utf8_lossy(&out.stdout))
}

/// `tessera run --gpu 0 --memory <memory> -- python script args` through `manager`.
fn under_run(node: &SimNode, m: &ManagerProc, memory: &str, script: &str, args: &[&str]) -> Facts {
    under_run_env(node, m, memory, script, args, &[])
}

/// [`under_run`] with `env` added to the command's environment.
fn under_run_env(
    node: &SimNode,
    m: &ManagerProc,
    memory: &str,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Facts {
    let script = frameworks_dir().join(script);
    let mut argv = vec![
        "run".to_owned(),
        "--socket".to_owned(),
        m.socket.display().to_string(),
        "--gpu".to_owned(),
        "0".to_owned(),
        "--memory".to_owned(),
        memory.to_owned(),
        "--".to_owned(),
        "timeout".to_owned(),
        LIMIT[0].to_owned(),
        LIMIT[1].to_owned(),
        python().display().to_string(),
        script.display().to_string(),
    ];
    argv.extend(owned(args));
    let out = role_command("cli", &argv)
        .envs(node.env())
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the client");
    facts(&out, &role_stdout(&out))
}

fn node() -> SimNode {
    SimNode::builder().devices(2).memory("16Gi").build()
}

/// What a framework reports about the node, bare or under the shim (`total`: the memory
/// it should see).
fn assert_cupy_basic(f: &Facts, node: &SimNode, total: u64) {
    f.assert_complete("basic");
    assert_eq!(f.one("runtime_version"), "12090");
    assert_eq!(f.one("driver_version"), "12090");
    assert_eq!(f.rest("device_name"), node.config.name);
    assert_eq!(f.one("compute_capability"), "9.0");
    assert_eq!(f.num("multiprocessors", 0), u64::from(node.config.sms));
    assert_eq!(f.num("mem_info", 1), total, "memGetInfo total");
    assert!(f.num("mem_info", 0) <= total);
    for key in [
        "roundtrip_equal",
        "d2d_equal",
        "zeros_are_zero",
        "stream_copy_equal",
        "async_pool_equal",
    ] {
        assert_eq!(f.one(key), "True", "{key}\n{}", f.text);
    }
}

#[test]
fn cupy_runs_on_the_bare_simulated_node() {
    let n = node();
    let f = bare(&n, "check_cupy.py", &["basic"], &[]);
    assert_cupy_basic(&f, &n, 16 * GI);
    assert_eq!(f.num("device_count", 0), 2);
    assert_eq!(f.num("total_global_mem", 0), 16 * GI);
    assert_eq!(f.get("two_devices_from_threads"), ["4", "True"]);
}

#[test]
fn cuda_core_runs_on_the_bare_simulated_node() {
    let n = node();
    let f = bare(&n, "check_core.py", &["basic"], &[]);
    f.assert_complete("basic");
    assert_eq!(f.num("device_count", 0), 2);
    assert_eq!(f.rest("device_name"), n.config.name);
    assert_eq!(f.one("compute_capability"), "9.0");
    assert_eq!(f.num("multiprocessors", 0), u64::from(n.config.sms));
    assert_eq!(f.num("mem_info", 1), 16 * GI);
    for key in ["roundtrip_equal", "fill_bytes", "synchronized"] {
        assert_eq!(f.one(key), "True", "{key}\n{}", f.text);
    }
}

#[test]
fn the_shared_cuda_runtime_runs_on_the_bare_simulated_node() {
    let n = node();
    let f = bare(&n, "check_cudart.py", &["basic"], &[]);
    f.assert_complete("basic");
    assert_eq!(f.get("get_device_count"), ["0", "2"]);
    assert_eq!(f.get("versions"), ["12090", "12090"]);
    assert_eq!(f.get("malloc"), ["0"]);
    assert_eq!(f.get("memcpy"), ["0", "0", "True"]);
    assert_eq!(f.get("memset"), ["0", "0", "True"]);
    assert_eq!(f.num("mem_info", 0), 0);
    assert_eq!(f.num("mem_info", 2), 16 * GI);
    assert_eq!(f.get("stream_ordered"), ["0", "0", "0", "0", "0"]);
    // The thread's capture mode is swapped (relaxed in, global out; then back).
    assert_eq!(f.get("capture_mode_exchange"), ["0", "0", "0", "2"]);
    // The callback ran once, with cudaSuccess.
    assert_eq!(f.get("stream_callback"), ["0", "0", "[0]"]);
    assert_eq!(f.get("managed"), ["0"; 6]);
    assert_eq!(f.get("free"), ["0", "0"]);
}

#[test]
fn the_driver_version_is_configurable_and_caps_get_proc_address() {
    let n = node();
    // CUDA 12.9 by default: a CUDA 13 request for cuCtxCreate gets the 12.x ABI.
    let f = bare(&n, "check_cudart.py", &["procaddr"], &[]);
    f.assert_complete("procaddr");
    assert_eq!(f.one("driver_version"), "12090");
    assert_eq!(f.get("cuCtxCreate_at_13000"), ["0", "cuCtxCreate_v3"]);
    // A 13.0 driver hands out CUDA 13's ABI, and the 12.9 runtime still runs on it.
    let v13 = [("TESSERA_SIM_DRIVER_VERSION", "13.0")];
    let f = bare(&n, "check_cudart.py", &["procaddr"], &v13);
    assert_eq!(f.one("driver_version"), "13000");
    assert_eq!(f.get("cuCtxCreate_at_13000"), ["0", "cuCtxCreate_v4"]);
    let f = bare(&n, "check_cudart.py", &["basic"], &v13);
    f.assert_complete("basic");
    assert_eq!(f.get("versions"), ["12090", "13000"]);
    assert_eq!(f.get("memcpy"), ["0", "0", "True"]);
    // A bad value is an error from the driver and one line naming the variable.
    let out = n
        .command("timeout")
        .args(LIMIT)
        .arg(python())
        .arg(frameworks_dir().join("check_cudart.py"))
        .arg("procaddr")
        .env("TESSERA_SIM_DRIVER_VERSION", "twelve")
        .output()
        .expect("run python");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TESSERA_SIM_DRIVER_VERSION=\"twelve\""),
        "{err}"
    );
}

#[test]
fn an_unknown_export_table_is_an_error_and_one_log_line() {
    let n = node();
    let out = n
        .command("timeout")
        .args(LIMIT)
        .arg(python())
        .arg(frameworks_dir().join("check_cudart.py"))
        .arg("badtable")
        .output()
        .expect("run python");
    let f = facts(&out, &String::from_utf8_lossy(&out.stdout));
    assert_eq!(f.one("done"), "badtable", "{}", f.text);
    // CUDA_ERROR_INVALID_VALUE (1) every time; the table pointer is cleared.
    assert_eq!(f.get("unknown_table"), ["1", "1", "1", "True"]);
    assert_eq!(f.get("null_id"), ["1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let lines = err
        .lines()
        .filter(|l| l.contains("unknown table a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"))
        .count();
    assert_eq!(lines, 1, "{err}");
}

fn assert_kernels(cupy: &Facts, core: &Facts) {
    cupy.assert_complete("kernels");
    assert_eq!(cupy.get("elementwise"), ["launched", "4096", "float32"]);
    assert_eq!(cupy.get("rawkernel"), ["launched", "True"]);
    assert_eq!(cupy.one("kernel_input_bytes_unchanged"), "True");
    assert_eq!(cupy.get("runtime_registered_kernel"), ["launched", "4096"]);
    // A captured graph (kernel + device-to-device copy) launches, and its copy's bytes
    // are there afterwards. (Whether captured copies wait for the launch is the
    // simulator's capture semantics, reported by `graph_before_launch_zero`, not asserted
    // here.)
    assert_eq!(cupy.get("graph"), ["launched", "4096", "True"]);
    core.assert_complete("kernels");
    assert_eq!(core.get("kernel"), ["launched", "tessera_scale"]);
    assert_eq!(core.get("ptx_kernel"), ["launched", "tessera_scale"]);
}

/// Kernels compiled by NVRTC (cubin and PTX), CuPy's elementwise and raw kernels, and the
/// kernels CuPy's runtime registers from its own fat binaries load and launch, bare and
/// under the shim.
#[test]
fn kernels_load_and_launch_bare_and_under_tessera_run() {
    let n = node();
    assert_kernels(
        &bare(&n, "check_cupy.py", &["kernels"], &[]),
        &bare(&n, "check_core.py", &["kernels"], &[]),
    );
    let m = ManagerProc::on(&n);
    assert_kernels(
        &under_run(&n, &m, "1Gi", "check_cupy.py", &["kernels"]),
        &under_run(&n, &m, "1Gi", "check_core.py", &["kernels"]),
    );
    m.stop();
}

/// CUDA 13's runtime (PyTorch's CUDA 13 builds load it) refuses the default 12.9 driver, as
/// it refuses a real one, and runs on a driver that reports 13.x, bare and under the shim.
#[test]
fn the_cuda_13_runtime_needs_a_13_driver_and_runs_on_one() {
    let n = node();
    let r13 = ("TESSERA_CHECK_CUDART", "13");
    let f = bare(&n, "check_cudart.py", &["basic"], &[r13]);
    // cudaErrorInsufficientDriver, from every call.
    assert_eq!(f.get("get_device_count"), ["35", "0"]);
    assert_eq!(f.get("versions"), ["13050", "12090"]);
    assert_eq!(f.get("malloc"), ["35"]);

    let v13 = ("TESSERA_SIM_DRIVER_VERSION", "13.5");
    let f = bare(&n, "check_cudart.py", &["basic"], &[r13, v13]);
    f.assert_complete("basic");
    assert_eq!(f.get("get_device_count"), ["0", "2"]);
    assert_eq!(f.get("versions"), ["13050", "13050"]);
    assert_eq!(f.get("memcpy"), ["0", "0", "True"]);
    assert_eq!(f.get("memset"), ["0", "0", "True"]);
    assert_eq!(f.get("stream_ordered"), ["0", "0", "0", "0", "0"]);
    assert_eq!(f.get("managed"), ["0"; 6]);

    let m = ManagerProc::on(&n);
    let f = under_run_env(&n, &m, "1Gi", "check_cudart.py", &["limit"], &[r13, v13]);
    f.assert_complete("limit");
    assert_eq!(f.num("mem_info", 1), GI);
    assert_eq!(f.one("oom"), "2");
    assert!(f.num("oom", 1) <= GI);
    m.stop();
}

/// Under `tessera run --memory 1Gi` each framework sees 1 GiB and gets its own
/// out-of-memory error past it, through every allocator route it has.
#[test]
fn frameworks_see_and_hit_a_1gi_limit_under_tessera_run() {
    let n = node();
    let m = ManagerProc::on(&n);
    let chunk = 128 * MI;

    // Everything that works bare works under the shim, with 1 GiB of memory.
    let f = under_run(&n, &m, "1Gi", "check_cupy.py", &["basic"]);
    assert_cupy_basic(&f, &n, GI);
    assert_eq!(
        f.num("total_global_mem", 0),
        GI,
        "the shim shows the limit as the device's memory"
    );
    let f = under_run(&n, &m, "1Gi", "check_core.py", &["basic"]);
    f.assert_complete("basic");
    assert_eq!(f.num("mem_info", 1), GI);
    assert_eq!(f.one("roundtrip_equal"), "True");

    // CuPy's default pool and its stream-ordered pool: CuPy's own OutOfMemoryError, after
    // at most 1 GiB; the memory is usable again once freed.
    for pool in ["default", "async"] {
        let f = under_run(&n, &m, "1Gi", "check_cupy.py", &["limit", pool]);
        f.assert_complete("limit");
        assert_eq!(f.num("mem_info", 1), GI, "{pool}");
        let oom = f.get("oom");
        assert_eq!(
            oom[0], "cupy.cuda.memory.OutOfMemoryError",
            "{pool}\n{}",
            f.text
        );
        let got = f.num("oom", 1);
        assert!(
            got <= GI && got >= GI - 2 * chunk,
            "{pool}: {got} bytes before the error"
        );
        assert_eq!(f.one("realloc_after_free"), "ok", "{pool}\n{}", f.text);
    }

    // cuda.core's default memory resource (a pool with a maximal release threshold).
    let f = under_run(&n, &m, "1Gi", "check_core.py", &["limit"]);
    f.assert_complete("limit");
    assert_eq!(f.num("mem_info", 1), GI);
    let oom = f.get("oom");
    assert_eq!(
        oom[0], "cuda.core._utils.cuda_utils.CUDAError",
        "{}",
        f.text
    );
    assert_eq!(oom[2], "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(f.num("oom", 1) <= GI);

    // The shared runtime: cudaErrorMemoryAllocation (2).
    let f = under_run(&n, &m, "1Gi", "check_cudart.py", &["limit"]);
    f.assert_complete("limit");
    assert_eq!(f.num("mem_info", 1), GI);
    assert_eq!(f.one("oom"), "2");
    assert!(f.num("oom", 1) <= GI);

    // Bare, the same script runs into the device's own size instead (a 2 GiB node: the
    // simulated memory is host memory).
    let small = SimNode::builder().devices(1).memory("2Gi").build();
    let f = bare(&small, "check_cupy.py", &["limit", "default"], &[]);
    f.assert_complete("limit");
    assert_eq!(f.num("mem_info", 1), 2 * GI);
    assert_eq!(f.one("oom"), "cupy.cuda.memory.OutOfMemoryError");
    assert!(f.num("oom", 1) > GI && f.num("oom", 1) <= 2 * GI);
    m.stop();
}
