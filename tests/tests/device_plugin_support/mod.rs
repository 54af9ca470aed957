//! A simulated node for the device plugin tests: the real manager
//! (in-process, over a scripted driver) and a fake kubelet on real unix
//! sockets in a temp dir, and the real plugin (`run`) between them.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_device_plugin::passes::Pass;
use tessera_device_plugin::testing::{FakeKubelet, FakePods};
use tessera_device_plugin::{Options, run_with_pods};
use tessera_dra_plugin::testing::FakeApiServer;
use tessera_manager::arbiter::NoArbiter;
use tessera_manager::core::Core;
use tessera_manager::gpu::fake::FakeGpu;
use tessera_manager::gpu::{GpuInfo, GpuSample};
use tessera_manager::{Manager, ManagerError};
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::manager::v1 as mgr;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const GI: u64 = 1 << 30;
/// Generous: the CI box is small and shared.
pub const WAIT: Duration = Duration::from_secs(15);

/// The real manager, in-process, serving on the node's socket.
struct RunningManager {
    core: Arc<Core>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ManagerError>>,
}

pub struct Node {
    pub dir: tempfile::TempDir,
    /// The driver under the manager: GPUs, their utilization and health.
    pub gpu: Arc<FakeGpu>,
    manager: Option<RunningManager>,
    pub kubelet: FakeKubelet,
    pub opts: Options,
    /// Pods' annotations, injected in place of the Kubernetes API.
    pub pods: Option<FakePods>,
    stop: Option<oneshot::Sender<()>>,
    pub plugin: Option<JoinHandle<Result<(), tessera_device_plugin::Error>>>,
}

/// A driver with these GPUs: (uuid, memory, NUMA node, utilization %).
pub fn fake_gpus(gpus: &[(&str, u64, i32, u32)]) -> Arc<FakeGpu> {
    let driver = FakeGpu::with_devices(
        gpus.iter()
            .enumerate()
            .map(|(i, &(uuid, mem, numa, _))| GpuInfo {
                index: u32::try_from(i).expect("few GPUs"),
                uuid: uuid.to_owned(),
                vendor: tessera_contract::Vendor::Nvidia,
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory_total_bytes: mem,
                sm_count: 108,
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
                numa_node: numa,
                compute_capability: (8, 0),
            })
            .collect(),
    );
    for &(uuid, _, _, util) in gpus {
        driver.set_sample(
            uuid,
            GpuSample {
                utilization_percent: util,
                ..Default::default()
            },
        );
    }
    Arc::new(driver)
}

/// Where the fake API server keeps pod `name` (every pod of these tests is in
/// namespace team-a).
pub fn pod_path(name: &str) -> String {
    format!("/api/v1/namespaces/team-a/pods/{name}")
}

/// Pod `name` bound to node-1 as the API server holds it, with the parts a test
/// varies (`annotations`, the `resources` of its one container `main`, its
/// `status`) and the rest fixed: the tests that read pods through kube build
/// them here, so that what the plugin sees differs between them only where a
/// test means it to.
pub fn bound_pod(name: &str, annotations: Value, resources: Value, status: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"),
                     "resourceVersion": "7", "creationTimestamp": "2026-12-02T03:00:00Z",
                     "annotations": annotations},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "main", "image": "cuda:12", "resources": resources}]
        },
        "status": status
    })
}

impl Node {
    /// Starts the node with its plugin reading pods from `api` through kube;
    /// `api` is given node-1 first, which the plugin reads at its start.
    pub async fn start_on_api(api: &FakeApiServer, gpu: Arc<FakeGpu>, config: &str) -> Self {
        api.put(
            "/api/v1/nodes/node-1",
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": "node-1", "resourceVersion": "1", "labels": {}}}),
        );
        let url = format!("http://{}", api.addr);
        Self::start_with(gpu, config, |o| {
            o.use_kube = true;
            o.kube_url = Some(url);
        })
        .await
    }

    /// Starts manager, kubelet and plugin; `config` is the slice config text.
    pub async fn start(gpu: Arc<FakeGpu>, config: &str) -> Self {
        Self::start_with(gpu, config, |_| {}).await
    }

    pub async fn start_with(
        gpu: Arc<FakeGpu>,
        config: &str,
        tweak: impl FnOnce(&mut Options),
    ) -> Self {
        Self::start_with_pods(gpu, config, None, tweak).await
    }

    /// [`Node::start_with`], the plugin reading pods' annotations from `pods`
    /// (in place of the Kubernetes API) when given.
    pub async fn start_with_pods(
        gpu: Arc<FakeGpu>,
        config: &str,
        pods: Option<FakePods>,
        tweak: impl FnOnce(&mut Options),
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let dp_dir = dir.path().join("dp");
        std::fs::create_dir_all(&dp_dir).expect("mkdir");
        let kubelet = FakeKubelet::start(&dp_dir).expect("kubelet");
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config).expect("config");
        let mut opts = Options::new("node-1");
        opts.device_plugin_dir = dp_dir;
        opts.manager_socket = dir.path().join("manager.sock");
        opts.pod_resources_socket = None;
        opts.config_path = Some(config_path);
        opts.config_poll = Duration::from_millis(50);
        opts.kubelet_poll = Duration::from_millis(50);
        opts.status_interval = Duration::from_millis(200);
        opts.host.hook_library = dir.path().join("lib/libtessera.so");
        opts.host.preload_file = dir.path().join("ld.so.preload");
        tweak(&mut opts);
        let mut node = Self {
            dir,
            gpu,
            manager: None,
            kubelet,
            opts,
            pods,
            stop: None,
            plugin: None,
        };
        node.start_manager().await;
        node.start_plugin();
        node
    }

    /// Starts the manager (again) on the node's socket and state directory.
    pub async fn start_manager(&mut self) {
        assert!(self.manager.is_none(), "a manager is running");
        let mut c = tessera_manager::Config::for_state_dir(&self.path("state"));
        c.socket = self.opts.manager_socket.clone();
        c.hook_library = self.opts.host.hook_library.clone();
        c.hostname = "node-1".into();
        c.sample_interval = Duration::from_millis(100);
        let m = Manager::start(c, self.gpu.clone(), Arc::new(NoArbiter))
            .await
            .expect("manager starts");
        let core = m.core().clone();
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(m.serve(async move {
            let _ = rx.await;
        }));
        self.manager = Some(RunningManager { core, stop, task });
    }

    /// Stops the manager: its socket goes, its status streams end, its
    /// allocations stay on disk for the next one.
    pub async fn stop_manager(&mut self) {
        let m = self.manager.take().expect("a manager is running");
        let _ = m.stop.send(());
        let res = tokio::time::timeout(WAIT, m.task)
            .await
            .expect("manager stops");
        res.expect("join").expect("manager ran cleanly");
    }

    /// The allocations the manager holds.
    pub fn allocations(&self) -> Vec<mgr::Allocation> {
        self.manager
            .as_ref()
            .expect("a manager is running")
            .core
            .list()
    }

    pub fn start_plugin(&mut self) {
        let (tx, rx) = oneshot::channel::<()>();
        self.stop = Some(tx);
        self.plugin = Some(tokio::spawn(run_with_pods(
            self.opts.clone(),
            self.pods.clone(),
            async {
                let _ = rx.await;
            },
        )));
    }

    /// Waits until a whole `pass` of the plugin that began after this call
    /// has completed: what it does to the world as it is now has been done.
    pub async fn pass(&self, pass: Pass) {
        if let Err(e) = self.opts.passes.next_complete(pass, WAIT).await {
            panic!("{e}");
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write_config(&self, text: &str) {
        let path = self.opts.config_path.clone().expect("config path");
        // Through a rename, as a ConfigMap update is: never a half-written file.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    }

    /// Waits until the kubelet holds a device list that satisfies `pred`.
    pub async fn wait_devices(
        &mut self,
        what: &str,
        pred: impl Fn(&[dp::Device]) -> bool,
    ) -> Vec<dp::Device> {
        match self.kubelet.wait_devices(WAIT, pred).await {
            Some(d) => d,
            None => panic!("{what}: device list is {:?}", ids(&self.kubelet.devices())),
        }
    }

    pub async fn client(
        &self,
    ) -> tessera_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient<
        tonic::transport::Channel,
    > {
        self.kubelet
            .plugin("tessera.sock")
            .await
            .expect("dial plugin")
    }

    /// Stops the plugin (its pod deleted, say) and waits until it has;
    /// the manager and the kubelet stay.
    pub async fn stop_plugin(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(p) = self.plugin.take() {
            let res = tokio::time::timeout(WAIT, p).await.expect("plugin stops");
            res.expect("join").expect("plugin ran cleanly");
        }
    }

    pub async fn stop(mut self) {
        self.stop_plugin().await;
        if self.manager.is_some() {
            self.stop_manager().await;
        }
    }
}

pub fn ids(devices: &[dp::Device]) -> Vec<String> {
    devices.iter().map(|d| d.id.clone()).collect()
}

pub fn healthy(devices: &[dp::Device]) -> usize {
    devices.iter().filter(|d| d.health == dp::HEALTHY).count()
}

pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

pub fn exists(p: &str) -> bool {
    Path::new(p).exists()
}
