//! Node labels (product, memory, slices per GPU, class) so pods can select a
//! GPU class, and the node's own labels for label-selector overrides; kept
//! behind a trait so the sync logic is tested without a cluster.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::state::{PluginState, Snapshot};
use tessera_node::config::is_label_value;

pub use tessera_contract::labels::{
    NODE_GPU_CLASS as LABEL_CLASS, NODE_GPU_MEMORY as LABEL_MEMORY,
    NODE_GPU_MODEL_MEMORY_PREFIX as MODEL_MEMORY_PREFIX, NODE_GPU_MODEL_PREFIX as MODEL_PREFIX,
    NODE_GPU_PRODUCT as LABEL_PRODUCT, NODE_SLICES_PER_GPU as LABEL_SLICES,
};

/// A Kubernetes API failure.
#[derive(Debug, thiserror::Error)]
pub enum NodeApiError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubernetes client config: {0}")]
    Config(String),
    #[error("{0} not found")]
    NotFound(String),
}

/// The node object, as far as labels go.
pub(crate) trait NodeApi: Send + Sync + 'static {
    fn labels(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, NodeApiError>> + Send;
    /// Sets (`Some`) or removes (`None`) labels, leaving others alone.
    fn patch_labels(
        &self,
        node: &str,
        labels: &BTreeMap<String, Option<String>>,
    ) -> impl Future<Output = Result<(), NodeApiError>> + Send;
}

/// Makes a label value of a product name (the contract's one rule, which the
/// webhook's node affinity for a model list uses too).
pub use tessera_contract::labels::model_label_value as label_value;

/// The labels this node should carry, given the labels it carries now
/// (`current`: per-model labels of a model no longer here are removed).
/// The single-valued ones (product, memory, slices, class) describe its
/// first GPU (index 0), as they always have; every GPU is described by one
/// pair of per-model labels (`gpu-product.tessera.dev/<model>`: how many,
/// `gpu-memory.tessera.dev/<model>`: MiB) and one label per vendor. `None`
/// removes a label (no GPUs, or no class matches).
pub fn desired_labels(
    snap: &Snapshot,
    current: &BTreeMap<String, String>,
) -> BTreeMap<String, Option<String>> {
    let first = snap.gpus.first();
    let product = first
        .map(|g| label_value(&g.gpu.name))
        .filter(|v| !v.is_empty());
    let memory = first.map(|g| (g.gpu.memory_total_bytes >> 20).to_string());
    let slices = first.map(|g| g.layout.slices.to_string());
    let class = first
        .and_then(|g| g.class.clone())
        .filter(|c| is_label_value(c));
    // Per model: how many GPUs, and the smallest memory among them.
    let mut models: BTreeMap<String, (u32, u64)> = BTreeMap::new();
    for g in &snap.gpus {
        let model = label_value(&g.gpu.name);
        if model.is_empty() {
            continue;
        }
        let mib = g.gpu.memory_total_bytes >> 20;
        let e = models.entry(model).or_insert((0, mib));
        e.0 += 1;
        e.1 = e.1.min(mib);
    }
    let per_model = models.iter().flat_map(|(m, (n, mib))| {
        [
            (format!("{MODEL_PREFIX}{m}"), Some(n.to_string())),
            (format!("{MODEL_MEMORY_PREFIX}{m}"), Some(mib.to_string())),
        ]
    });
    // A model's labels from before that is no longer here: removed.
    let gone = current
        .keys()
        .filter(|k| {
            [MODEL_PREFIX, MODEL_MEMORY_PREFIX]
                .iter()
                .any(|p| k.strip_prefix(p).is_some_and(|m| !models.contains_key(m)))
        })
        .map(|k| (k.clone(), None));
    BTreeMap::from([
        (LABEL_PRODUCT.to_owned(), product),
        (LABEL_MEMORY.to_owned(), memory),
        (LABEL_SLICES.to_owned(), slices),
        (LABEL_CLASS.to_owned(), class),
    ])
    .into_iter()
    // One label per vendor with GPUs here (a mixed node has several), so a pod
    // asking for one vendor's GPUs is scheduled only where there are some.
    .chain(tessera_contract::Vendor::ALL.into_iter().map(|v| {
        let here = snap.gpus.iter().any(|g| g.gpu.vendor == v.as_str());
        (v.node_label(), here.then(|| "true".to_owned()))
    }))
    .chain(per_model)
    .chain(gone)
    .collect()
}

/// Keeps the node's labels in the state (for overrides) and the node's
/// GPU labels in step with the snapshot. Runs until the state is dropped.
pub(crate) async fn sync_loop<N: NodeApi>(
    api: Arc<N>,
    state: Arc<PluginState>,
    node: String,
    refresh: Duration,
) {
    let mut rx = state.subscribe();
    let mut applied: Option<BTreeMap<String, Option<String>>> = None;
    let mut current = BTreeMap::new();
    let mut tick = tokio::time::interval(refresh);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                match api.labels(&node).await {
                    Ok(l) => {
                        current = l.clone();
                        state.set_labels(l);
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read node labels"),
                }
            }
            changed = rx.changed() => if changed.is_err() { return },
        }
        let snap = rx.borrow_and_update().clone();
        if !snap.manager_up && snap.gpus.is_empty() {
            // Nothing known yet: do not wipe labels a previous run set.
            continue;
        }
        let want = desired_labels(&snap, &current);
        if applied.as_ref() != Some(&want) {
            match api.patch_labels(&node, &want).await {
                Ok(()) => {
                    tracing::info!(labels = ?want, "node labels updated");
                    applied = Some(want);
                }
                Err(e) => tracing::warn!(error = %e, "cannot label node"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tessera_node::config::Config;
    use tessera_proto::manager::v1::{GpuStatus, NodeStatus};
    use tokio::time::Instant;

    #[test]
    fn product_names_become_label_values() {
        assert_eq!(
            label_value("NVIDIA A100-SXM4-80GB"),
            "NVIDIA-A100-SXM4-80GB"
        );
        assert_eq!(label_value(" Tesla T4 (PCIe) "), "Tesla-T4--PCIe");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
        assert_eq!(label_value("***"), "");
    }

    struct FakeNode {
        labels: Mutex<BTreeMap<String, String>>,
        patches: Mutex<Vec<BTreeMap<String, Option<String>>>>,
    }

    impl NodeApi for FakeNode {
        async fn labels(&self, _node: &str) -> Result<BTreeMap<String, String>, NodeApiError> {
            Ok(self.labels.lock().expect("lock").clone())
        }
        async fn patch_labels(
            &self,
            _node: &str,
            labels: &BTreeMap<String, Option<String>>,
        ) -> Result<(), NodeApiError> {
            let mut l = self.labels.lock().expect("lock");
            for (k, v) in labels {
                match v {
                    Some(v) => l.insert(k.clone(), v.clone()),
                    None => l.remove(k),
                };
            }
            self.patches.lock().expect("lock").push(labels.clone());
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn labels_follow_gpus_config_and_overrides() {
        let cfg = Config::parse(
            r#"
default: {slice: {slicesPerGpu: 4}}
overrides:
  - nodeSelector: {matchLabels: {pool: big}}
    slice: {slicesPerGpu: 8}
gpuClasses:
  - {name: high-performance, products: ["*A100*"]}
"#,
        )
        .expect("cfg");
        let state = Arc::new(PluginState::new("n1", cfg, BTreeMap::new()));
        let api = Arc::new(FakeNode {
            labels: Mutex::new(BTreeMap::from([("pool".into(), "big".into())])),
            patches: Mutex::new(Vec::new()),
        });
        let task = tokio::spawn(sync_loop(
            api.clone(),
            state.clone(),
            "n1".into(),
            Duration::from_millis(20),
        ));
        state.update_status(
            &NodeStatus {
                gpus: vec![GpuStatus {
                    uuid: "GPU-a".into(),
                    name: "NVIDIA A100-SXM4-80GB".into(),
                    memory_total_bytes: 80 << 30,
                    healthy: true,
                    ..Default::default()
                }],
                ..Default::default()
            },
            Instant::now(),
        );
        let want = BTreeMap::from([
            (LABEL_CLASS.to_owned(), "high-performance".to_owned()),
            (LABEL_MEMORY.to_owned(), "81920".to_owned()),
            (LABEL_PRODUCT.to_owned(), "NVIDIA-A100-SXM4-80GB".to_owned()),
            (LABEL_SLICES.to_owned(), "8".to_owned()),
            (
                "gpu-product.tessera.dev/NVIDIA-A100-SXM4-80GB".to_owned(),
                "1".to_owned(),
            ),
            (
                "gpu-memory.tessera.dev/NVIDIA-A100-SXM4-80GB".to_owned(),
                "81920".to_owned(),
            ),
            // The one vendor present (an old manager's silence is NVIDIA).
            (
                "tessera.dev/gpu-vendor-nvidia".to_owned(),
                "true".to_owned(),
            ),
            ("pool".to_owned(), "big".to_owned()),
        ]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while *api.labels.lock().expect("lock") != want {
            assert!(
                Instant::now() < deadline,
                "labels never became {want:?}: {:?}",
                api.labels.lock().expect("lock")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A config without the class: the class label is removed.
        state.set_config(Config::parse("default: {slice: {slicesPerGpu: 2}}").expect("cfg"));
        while api
            .labels
            .lock()
            .expect("lock")
            .get(LABEL_SLICES)
            .map(String::as_str)
            != Some("2")
        {
            assert!(Instant::now() < deadline, "slices label not updated");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!api.labels.lock().expect("lock").contains_key(LABEL_CLASS));
        task.abort();
    }

    fn gpu(uuid: &str, vendor: &str, name: &str, gib: u64) -> GpuStatus {
        GpuStatus {
            uuid: uuid.into(),
            vendor: vendor.into(),
            name: name.into(),
            memory_total_bytes: gib << 30,
            healthy: true,
            ..Default::default()
        }
    }

    fn snapshot(gpus: Vec<GpuStatus>) -> Arc<Snapshot> {
        let cfg = Config::parse("default: {slice: {slicesPerGpu: 4}}").expect("cfg");
        let state = PluginState::new("n1", cfg, BTreeMap::new());
        state.update_status(
            &NodeStatus {
                gpus,
                ..Default::default()
            },
            Instant::now(),
        );
        state.snapshot()
    }

    #[tokio::test(start_paused = true)]
    async fn a_mixed_node_is_labelled_with_every_model_and_vendor() {
        let snap = snapshot(vec![
            gpu("GPU-n", "nvidia", "NVIDIA A100-SXM4-80GB", 80),
            gpu("GPU-a", "amd", "AMD Instinct MI210", 64),
            gpu("GPU-b", "amd", "AMD Instinct MI210", 64),
        ]);
        let l = desired_labels(&snap, &BTreeMap::new());
        let get = |k: &str| l.get(k).cloned().flatten();
        assert_eq!(
            get("gpu-product.tessera.dev/NVIDIA-A100-SXM4-80GB").as_deref(),
            Some("1")
        );
        assert_eq!(
            get("gpu-memory.tessera.dev/NVIDIA-A100-SXM4-80GB").as_deref(),
            Some("81920")
        );
        assert_eq!(
            get("gpu-product.tessera.dev/AMD-Instinct-MI210").as_deref(),
            Some("2")
        );
        assert_eq!(
            get("gpu-memory.tessera.dev/AMD-Instinct-MI210").as_deref(),
            Some("65536")
        );
        assert_eq!(
            get("tessera.dev/gpu-vendor-nvidia").as_deref(),
            Some("true")
        );
        assert_eq!(get("tessera.dev/gpu-vendor-amd").as_deref(), Some("true"));
        // GPU 0's single-valued labels, as before.
        assert_eq!(get(LABEL_PRODUCT).as_deref(), Some("NVIDIA-A100-SXM4-80GB"));

        // The AMD GPUs are gone: their model's labels are removed, the
        // others' kept, and labels the plugin does not own left alone.
        let applied: BTreeMap<String, String> = l
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .chain([("pool".to_owned(), "big".to_owned())])
            .collect();
        let snap = snapshot(vec![gpu("GPU-n", "nvidia", "NVIDIA A100-SXM4-80GB", 80)]);
        let l = desired_labels(&snap, &applied);
        assert_eq!(
            l.get("gpu-product.tessera.dev/AMD-Instinct-MI210"),
            Some(&None)
        );
        assert_eq!(
            l.get("gpu-memory.tessera.dev/AMD-Instinct-MI210"),
            Some(&None)
        );
        assert_eq!(l.get("tessera.dev/gpu-vendor-amd"), Some(&None));
        assert_eq!(
            l.get("gpu-product.tessera.dev/NVIDIA-A100-SXM4-80GB"),
            Some(&Some("1".to_owned()))
        );
        assert!(!l.contains_key("pool"));
    }
}
