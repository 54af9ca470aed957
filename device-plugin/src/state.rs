//! The plugin's view of its node: config in force, GPUs, slices and the
//! device list, published through a `tokio::sync::watch` channel so that
//! ListAndWatch, placement and labels all see one consistent snapshot.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::manager::v1::NodeStatus;
use tokio::sync::watch;

use crate::device_id::{DeviceId, MAX_DEVICE_ID_LEN};
use crate::inventory::{Gpu, UtilizationWindow, gpus_of};
use tessera_node::config::{Config, NodeConfig, SliceLayout};

/// How long Allocate and GetPreferredAllocation (of both resources) wait for
/// the manager's first inventory after the plugin starts
/// ([`PluginState::with_inventory`]): long enough for a manager that is up to
/// answer under load, short against the kubelet's patience with a pod's
/// admission.
pub(crate) const INVENTORY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One GPU and how it is sliced under the config in force.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSlices {
    pub gpu: Gpu,
    pub layout: SliceLayout,
    /// Healthy as reported by the manager, and the manager is reachable.
    pub healthy: bool,
    /// Mean utilization (0..=1) over the last minute; None before a sample.
    pub utilization: Option<f64>,
    /// The GPU class its product maps to, if any.
    pub class: Option<String>,
}

impl GpuSlices {
    /// Idle fraction over the last minute; unknown counts as idle.
    pub fn idle_fraction(&self) -> f64 {
        1.0 - self.utilization.unwrap_or(0.0)
    }
}

/// Everything derived from the inputs at one moment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    pub node: NodeConfig,
    pub gpus: Vec<GpuSlices>,
    /// The device list for ListAndWatch, in GPU then slice order.
    pub devices: Vec<dp::Device>,
    /// False until the manager first answered, and after it was lost for
    /// longer than the grace period.
    pub manager_up: bool,
    /// The manager has answered at least once since the plugin started:
    /// before that the plugin knows no GPU, which is not the same as a node
    /// without GPUs.
    pub inventory_read: bool,
}

impl Snapshot {
    /// The GPU with this UUID.
    pub fn gpu(&self, uuid: &str) -> Option<&GpuSlices> {
        self.gpus.iter().find(|g| g.gpu.uuid == uuid)
    }

    /// Each GPU's memory as a share of "the card" counts it
    /// (`tessera_node::exact::card_memory`): a pod's `gpumem-percentage` is laid over
    /// its slices as that share of the GPU they are on.
    pub fn cards(&self) -> tessera_node::exact::Cards {
        self.gpus
            .iter()
            .map(|g| {
                let card = tessera_node::exact::card_memory(&g.layout, g.gpu.memory_total_bytes);
                (g.gpu.uuid.clone(), card)
            })
            .collect()
    }
}

struct Inputs {
    node_name: String,
    config: Arc<Config>,
    labels: BTreeMap<String, String>,
    gpus: Vec<Gpu>,
    windows: HashMap<String, UtilizationWindow>,
    manager_up: bool,
    last_now: Option<Instant>,
}

/// Holds the inputs and publishes a fresh [`Snapshot`] whenever one changes.
pub struct PluginState {
    inputs: Mutex<Inputs>,
    tx: watch::Sender<Arc<Snapshot>>,
}

impl PluginState {
    pub fn new(
        node_name: impl Into<String>,
        config: Config,
        labels: BTreeMap<String, String>,
    ) -> Self {
        let inputs = Inputs {
            node_name: node_name.into(),
            config: Arc::new(config),
            labels,
            gpus: Vec::new(),
            windows: HashMap::new(),
            manager_up: false,
            last_now: None,
        };
        let snap = build(&inputs, Instant::now());
        let (tx, _) = watch::channel(Arc::new(snap));
        Self {
            inputs: Mutex::new(inputs),
            tx,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inputs> {
        // A panic while holding the lock cannot leave Inputs half-updated in
        // a way that matters (each field is replaced whole), so carry on.
        self.inputs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, inputs: &Inputs, now: Instant) {
        let snap = build(inputs, now);
        self.tx.send_if_modified(|cur| {
            if **cur == snap {
                false
            } else {
                *cur = Arc::new(snap);
                true
            }
        });
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// The snapshot once the manager's inventory has been read, or the
    /// current one when `timeout` passes first.
    ///
    /// A kubelet keeps the devices an earlier plugin advertised across a
    /// plugin restart, so it may call Allocate on a new plugin before that
    /// plugin has heard from the manager. Judging the request against an
    /// empty inventory would fail a pod that the next status admits; waiting
    /// for the first one (the manager answers within a status interval when
    /// it is up) does not.
    pub async fn with_inventory(&self, timeout: std::time::Duration) -> Arc<Snapshot> {
        let mut rx = self.tx.subscribe();
        let read = tokio::time::timeout(timeout, rx.wait_for(|s| s.inventory_read)).await;
        match read {
            Ok(Ok(snap)) => snap.clone(),
            _ => self.snapshot(),
        }
    }

    /// A receiver that wakes on every new snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// The config file in force.
    pub fn config(&self) -> Arc<Config> {
        self.lock().config.clone()
    }

    /// Puts a new (already validated) config in force.
    pub fn set_config(&self, config: Config) {
        let mut i = self.lock();
        i.config = Arc::new(config);
        let now = i.last_now.unwrap_or_else(Instant::now);
        self.publish(&i, now);
    }

    /// Replaces the node's labels (used by label-selector overrides).
    pub fn set_labels(&self, labels: BTreeMap<String, String>) {
        let mut i = self.lock();
        if i.labels == labels {
            return;
        }
        i.labels = labels;
        let now = i.last_now.unwrap_or_else(Instant::now);
        self.publish(&i, now);
    }

    /// Takes in a status from the manager, measured at `now`.
    pub fn update_status(&self, status: &NodeStatus, now: Instant) {
        let mut i = self.lock();
        let gpus = gpus_of(status);
        for g in &gpus {
            i.windows
                .entry(g.uuid.clone())
                .or_default()
                .record(now, g.utilization_percent);
        }
        i.windows
            .retain(|uuid, _| gpus.iter().any(|g| &g.uuid == uuid));
        i.gpus = gpus;
        i.manager_up = true;
        i.last_now = Some(now);
        self.publish(&i, now);
    }

    /// The manager has been unreachable past the grace period: every slice
    /// turns Unhealthy until it answers again.
    pub fn set_manager_lost(&self) {
        let mut i = self.lock();
        if !i.manager_up {
            return;
        }
        i.manager_up = false;
        let now = i.last_now.unwrap_or_else(Instant::now);
        self.publish(&i, now);
    }
}

fn build(i: &Inputs, now: Instant) -> Snapshot {
    let node = i.config.resolve(&i.node_name, &i.labels);
    let mut gpus = Vec::with_capacity(i.gpus.len());
    let mut devices = Vec::new();
    for g in &i.gpus {
        let layout = node.slice.layout(g.memory_total_bytes);
        let healthy = g.healthy && i.manager_up;
        let topology = g.numa_node.map(|n| dp::TopologyInfo {
            nodes: vec![dp::NumaNode { id: n }],
        });
        let health = if healthy { dp::HEALTHY } else { dp::UNHEALTHY };
        if DeviceId::new(g.uuid.clone(), layout.slices)
            .to_string()
            .len()
            > MAX_DEVICE_ID_LEN
        {
            tracing::error!(gpu = %g.uuid, "GPU UUID too long for a device ID; its slices are not advertised");
        } else {
            for n in 0..layout.slices {
                devices.push(dp::Device {
                    id: DeviceId::new(g.uuid.clone(), n).to_string(),
                    health: health.to_owned(),
                    topology: topology.clone(),
                });
            }
        }
        gpus.push(GpuSlices {
            gpu: g.clone(),
            layout,
            healthy,
            utilization: i.windows.get(&g.uuid).and_then(|w| w.mean_utilization(now)),
            class: i
                .config
                .classify_vendor(&g.vendor, &g.name)
                .map(str::to_owned),
        });
    }
    Snapshot {
        node,
        gpus,
        devices,
        manager_up: i.manager_up,
        inventory_read: i.last_now.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_proto::manager::v1::GpuStatus;

    const GI: u64 = 1 << 30;

    pub(crate) fn status(gpus: &[(&str, u64, bool, i32)]) -> NodeStatus {
        NodeStatus {
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, &(uuid, mem, healthy, numa))| GpuStatus {
                    index: u32::try_from(i).unwrap_or(0),
                    uuid: uuid.into(),
                    name: "NVIDIA A100-SXM4-80GB".into(),
                    memory_total_bytes: mem,
                    numa_node: numa,
                    healthy,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_before_the_first_inventory_waits_for_it() {
        let cfg = Config::parse("default:\n  slice: {slicesPerGpu: 2}\n").expect("cfg");
        let st = Arc::new(PluginState::new("n", cfg, BTreeMap::new()));
        assert!(!st.snapshot().inventory_read);
        let waiting = tokio::spawn({
            let st = st.clone();
            async move { st.with_inventory(std::time::Duration::from_secs(10)).await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "answered before any inventory");
        st.update_status(&status(&[("GPU-a", 80 * GI, true, 0)]), Instant::now());
        let snap = waiting.await.expect("join");
        assert!(snap.inventory_read);
        assert!(
            snap.gpu("GPU-a").is_some(),
            "the waiting request sees the GPU"
        );

        // Once read, a manager lost later does not make a request wait: the
        // plugin answers from what it knows (its slices marked unhealthy).
        st.set_manager_lost();
        let t0 = Instant::now();
        let snap = st.with_inventory(std::time::Duration::from_secs(10)).await;
        assert_eq!(t0.elapsed(), std::time::Duration::ZERO);
        assert!(snap.inventory_read && !snap.manager_up);

        // A manager that never answers: the request is judged after the wait.
        let cfg = Config::parse("default:\n  slice: {slicesPerGpu: 2}\n").expect("cfg");
        let never = PluginState::new("n", cfg, BTreeMap::new());
        let t0 = Instant::now();
        let snap = never
            .with_inventory(std::time::Duration::from_secs(10))
            .await;
        assert_eq!(t0.elapsed(), std::time::Duration::from_secs(10));
        assert!(!snap.inventory_read && snap.gpus.is_empty());
    }

    #[test]
    fn devices_follow_config_health_and_topology() {
        let cfg = Config::parse("default:\n  slice: {memory: 20Gi}\n").expect("cfg");
        let st = PluginState::new("n", cfg, BTreeMap::new());
        assert!(
            st.snapshot().devices.is_empty(),
            "nothing before the manager answers"
        );
        let mut rx = st.subscribe();
        st.update_status(
            &status(&[("GPU-a", 80 * GI, true, 0), ("GPU-b", 40 * GI, false, -1)]),
            Instant::now(),
        );
        assert!(rx.has_changed().expect("open"));
        let s = rx.borrow_and_update().clone();
        let ids: Vec<_> = s.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-b::0", "GPU-b::1"
            ]
        );
        assert!(s.devices[..4].iter().all(|d| d.health == dp::HEALTHY));
        assert!(s.devices[4..].iter().all(|d| d.health == dp::UNHEALTHY));
        assert_eq!(
            s.devices[0].topology,
            Some(dp::TopologyInfo {
                nodes: vec![dp::NumaNode { id: 0 }]
            })
        );
        assert_eq!(s.devices[4].topology, None);
        assert_eq!(s.gpus[0].class, None);

        st.set_config(Config::parse("default:\n  slice: {slicesPerGpu: 2}\n").expect("cfg"));
        assert_eq!(rx.borrow_and_update().devices.len(), 4);

        // The same status again changes nothing and wakes nobody.
        st.update_status(
            &status(&[("GPU-a", 80 * GI, true, 0), ("GPU-b", 40 * GI, false, -1)]),
            Instant::now(),
        );
        assert!(!rx.has_changed().expect("open"));

        st.set_manager_lost();
        let s = rx.borrow_and_update().clone();
        assert!(s.devices.iter().all(|d| d.health == dp::UNHEALTHY));
        assert!(!s.manager_up);
    }

    #[test]
    fn label_overrides_apply_when_labels_change() {
        let cfg = Config::parse(
            "overrides:\n  - nodeSelector: {matchLabels: {pool: big}}\n    slice: {slicesPerGpu: 8}\n",
        )
        .expect("cfg");
        let st = PluginState::new("n", cfg, BTreeMap::new());
        st.update_status(&status(&[("GPU-a", 80 * GI, true, 0)]), Instant::now());
        assert_eq!(st.snapshot().devices.len(), 4);
        st.set_labels(BTreeMap::from([("pool".to_owned(), "big".to_owned())]));
        assert_eq!(st.snapshot().devices.len(), 8);
    }
}
