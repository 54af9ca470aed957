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

/// Makes a label value of a product name: `NVIDIA A100-SXM4-80GB` →
/// `NVIDIA-A100-SXM4-80GB`.
pub fn label_value(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let cut: String = trimmed.chars().take(63).collect();
    cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// The labels this node should carry. They describe its first GPU (index
/// 0); nodes mix GPU models rarely, and a node label can hold one value.
/// `None` removes a label (no GPUs, or no class matches).
pub fn desired_labels(snap: &Snapshot) -> BTreeMap<String, Option<String>> {
    let first = snap.gpus.first();
    let product = first
        .map(|g| label_value(&g.gpu.name))
        .filter(|v| !v.is_empty());
    let memory = first.map(|g| (g.gpu.memory_total_bytes >> 20).to_string());
    let slices = first.map(|g| g.layout.slices.to_string());
    let class = first
        .and_then(|g| g.class.clone())
        .filter(|c| is_label_value(c));
    if snap
        .gpus
        .iter()
        .any(|g| g.gpu.name != snap.gpus[0].gpu.name)
    {
        tracing::warn!("node has more than one GPU model; labels describe GPU 0");
    }
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
    let mut tick = tokio::time::interval(refresh);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                match api.labels(&node).await {
                    Ok(l) => state.set_labels(l),
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
        let want = desired_labels(&snap);
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
}
