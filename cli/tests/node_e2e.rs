//! The whole node, end to end, with the real binaries: `tessera manager` over
//! the simulated GPU node, `tessera device-plugin` registered with a fake
//! kubelet that speaks the real gRPC protocol on real unix sockets, an
//! `Allocate` of two slices, and then a real process started with exactly
//! the environment and mounted files `Allocate` returned, under the shim:
//! it must see exactly two slices' worth of memory, on the GPU the device
//! IDs named, and be refused past it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tessera_device_plugin::allocate::host_env;
use tessera_device_plugin::testing::FakeKubelet;
use tessera_e2e::{Mode, ProbeChild, SimNode};
use tessera_proto::deviceplugin::v1beta1 as dp;

const GI: u64 = 1 << 30;
const WAIT: Duration = Duration::from_secs(30);

/// Kills the daemons when the test ends, however it ends.
struct Daemon(Child, &'static str, PathBuf);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Daemon {
    fn log(&self) -> String {
        format!(
            "--- {} log ---\n{}",
            self.1,
            std::fs::read_to_string(&self.2).unwrap_or_default()
        )
    }
}

fn hook() -> PathBuf {
    tessera_e2e::paths::hook_library().expect("libtessera.so is built with the workspace")
}

fn spawn(node: &SimNode, name: &'static str, args: &[&str], dir: &Path) -> Daemon {
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .envs(node.env())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("tessera starts");
    Daemon(child, name, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_then_a_process_with_its_env_and_mounts_sees_the_slices() {
    let node = SimNode::builder().devices(2).memory("16Gi").build();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let dp_dir = d.join("device-plugins");
    std::fs::create_dir_all(&dp_dir).expect("mkdir");
    let kubelet = FakeKubelet::start(&dp_dir).expect("fake kubelet");

    let socket = d.join("manager.sock");
    let hook = hook();
    let nvml = tessera_e2e::paths::sim_lib_dir()
        .dir
        .join("libnvidia-ml.so.1");
    let manager = spawn(
        &node,
        "manager",
        &[
            "manager",
            "--state-dir",
            &d.join("state").display().to_string(),
            "--socket",
            &socket.display().to_string(),
            "--nvml-library",
            &nvml.display().to_string(),
            "--hook-library",
            &hook.display().to_string(),
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        d,
    );
    // 16 GiB GPUs cut into 4 GiB slices: 4 per GPU, 25% of its time each. The
    // device list as env (no container runtime here to read mounts or CDI).
    let config = d.join("config.yaml");
    std::fs::write(
        &config,
        "default:\n  slice: {memory: 4Gi}\n  computePolicy: burst\n  deviceListStrategy: envvar\n",
    )
    .expect("config");
    let plugin = spawn(
        &node,
        "device-plugin",
        &[
            "device-plugin",
            "--node-name",
            "node-1",
            "--config",
            &config.display().to_string(),
            "--socket",
            &socket.display().to_string(),
            "--device-plugin-dir",
            &dp_dir.display().to_string(),
            "--no-pod-resources",
            "--kube",
            "off",
            "--hook-library",
            &hook.display().to_string(),
            "--preload-file",
            &d.join("ld.so.preload").display().to_string(),
        ],
        d,
    );
    let logs = || format!("{}\n{}", manager.log(), plugin.log());

    let regs = kubelet
        .wait_registrations(1, WAIT)
        .await
        .unwrap_or_else(|| panic!("the plugin never registered\n{}", logs()));
    assert_eq!(regs[0].resource_name, "tessera.dev/vgpu");
    let mut kubelet = kubelet;
    let devices = kubelet
        .wait_devices(WAIT, |d| {
            d.len() == 8 && d.iter().all(|d| d.health == "Healthy")
        })
        .await
        .unwrap_or_else(|| panic!("no 8 healthy slices: {:?}\n{}", kubelet.devices(), logs()));

    // Two slices of the second GPU, by their device IDs.
    let gpu1 = node.node().device_info(1).expect("device 1").uuid;
    let ids: Vec<String> = devices
        .iter()
        .map(|d| d.id.clone())
        .filter(|id| id.starts_with(&format!("{gpu1}::")))
        .take(2)
        .collect();
    assert_eq!(ids.len(), 2, "{devices:?}");
    let mut client = kubelet
        .plugin(&regs[0].endpoint)
        .await
        .expect("plugin socket");
    let resp = client
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: ids.clone(),
            }],
        })
        .await
        .unwrap_or_else(|e| panic!("Allocate: {e}\n{}", logs()))
        .into_inner();
    let r = &resp.container_responses[0];
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], gpu1);

    // The container's view on the host: mounted paths by their host paths,
    // the hook preloaded as the webhook would, and the one GPU the NVIDIA
    // runtime would expose.
    let env = host_env(r);
    let hook_mount = r
        .mounts
        .iter()
        .find(|m| m.container_path == "/usr/local/lib/tessera/libtessera.so")
        .expect("hook mounted");
    assert!(hook_mount.read_only);
    let mut cmd = node.probe(Mode::Dlopen, &[]);
    cmd.envs(&env)
        .env("LD_PRELOAD", &hook_mount.host_path)
        .env("CUDA_VISIBLE_DEVICES", &env["NVIDIA_VISIBLE_DEVICES"]);
    let mut probe = ProbeChild::start(cmd);
    let t = Duration::from_secs(20);
    assert!(probe.cmd("init", t).ok);
    assert_eq!(
        probe.cmd("count", t).u64("n"),
        1,
        "only the allocated GPU is visible"
    );
    assert_eq!(probe.cmd("uuid", t).str("uuid"), gpu1);
    assert!(probe.cmd("ctx", t).ok);
    let info = probe.cmd("meminfo", t);
    assert_eq!(info.u64("total"), 8 * GI, "two 4 GiB slices: {info:?}");
    for _ in 0..2 {
        let a = probe.cmd("alloc 4294967296", t);
        assert!(a.ok, "{a:?}");
    }
    let over = probe.cmd("alloc 1", t);
    assert!(!over.ok, "one byte past two slices is refused: {over:?}");
    assert_eq!(over.error.as_deref(), Some("CUDA_ERROR_OUT_OF_MEMORY"));

    // The ground truth: the bytes sit on the GPU the device IDs named.
    let mine = node
        .node()
        .process(probe.pid())
        .expect("the probe is on the simulated node");
    assert_eq!(mine.memory, vec![0, 8 * GI], "{mine:?}");
    probe.kill();
    drop(manager);
    drop(plugin);
}
