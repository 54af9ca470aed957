//! Keeps this node's ResourceSlices in the API server equal to what
//! [`crate::slices`] says they should be, for every node status the manager
//! streams (`WatchNodeStatus`): health, GPUs appearing or going, and node
//! config changes (the slice size, `dra.layout`, an override that starts or
//! stops matching the node's labels) all change them.
//!
//! The slices are found by the field selector `spec.nodeName=<node>,
//! spec.driver=<driver>`: every slice of this driver on this node is this
//! plugin's, so any not wanted (an older layout's, a restart's leftovers) is
//! deleted. A change writes every slice at a new pool generation first and
//! deletes the stale ones after: the scheduler only reads a pool's newest
//! generation, so it never sees half a change.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tessera_node::manager::ManagerApi;
use tokio_stream::StreamExt;

use crate::driver::ConfigFile;
use crate::slices;

/// How often the manager streams the node's status.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// How often the node's labels are read again (for label-selector
/// overrides); the status stream drives the rest.
pub const LABEL_REFRESH: Duration = Duration::from_secs(30);

/// Why a sync did not complete; the next status tries again.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot list the ResourceSlices of node {node}: {source}")]
    List {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot write ResourceSlice {name}: {source}")]
    Write {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot delete stale ResourceSlice {name}: {source}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// What one sync did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncReport {
    pub created: Vec<String>,
    pub replaced: Vec<String>,
    pub deleted: Vec<String>,
    /// The pool generation now published.
    pub generation: i64,
}

/// Publishes the slices of one driver on one node.
pub struct Publisher {
    api: Api<ResourceSlice>,
    driver: String,
    node: String,
    /// The devices last published, with the generation they went out at:
    /// an unchanged status costs no API call.
    applied: Option<(Vec<k8s_openapi::api::resource::v1::Device>, i64)>,
}

/// A slice's spec without the pool generation, to compare content.
fn content(s: &ResourceSlice) -> (Option<String>, ResourceSliceSpec) {
    let mut spec = s.spec.clone();
    spec.pool.generation = 0;
    (s.metadata.name.clone(), spec)
}

impl Publisher {
    pub fn new(client: kube::Client, driver: &str, node: &str) -> Self {
        Self {
            api: Api::all(client),
            driver: driver.to_owned(),
            node: node.to_owned(),
            applied: None,
        }
    }

    /// Forgets what was published: the next sync reads the API server again.
    pub fn invalidate(&mut self) {
        self.applied = None;
    }

    /// Makes the API server hold exactly the slices for `devices`. None when
    /// nothing changed since the last sync.
    pub async fn sync(
        &mut self,
        devices: Vec<k8s_openapi::api::resource::v1::Device>,
    ) -> Result<Option<SyncReport>, PublishError> {
        if self.applied.as_ref().is_some_and(|(d, _)| *d == devices) {
            return Ok(None);
        }
        let selector = format!("spec.nodeName={},spec.driver={}", self.node, self.driver);
        let existing = self
            .api
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|source| PublishError::List {
                node: self.node.clone(),
                source,
            })?
            .items;
        let newest = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let mut want = slices::slices(&self.driver, &self.node, devices.clone(), newest);
        let mut report = SyncReport {
            generation: newest,
            ..Default::default()
        };
        // A restart with nothing changed (all at one generation, same
        // content, nothing else) publishes nothing.
        let same = existing.len() == want.len()
            && existing.iter().all(|s| s.spec.pool.generation == newest)
            && want
                .iter()
                .all(|w| existing.iter().any(|e| content(e) == content(w)));
        if !same {
            report.generation = newest + 1;
            for w in &mut want {
                w.spec.pool.generation = report.generation;
            }
            for w in &want {
                let name = w.metadata.name.clone().unwrap_or_default();
                let write = |source| PublishError::Write {
                    name: name.clone(),
                    source,
                };
                match existing.iter().find(|e| e.metadata.name == w.metadata.name) {
                    Some(e) => {
                        let mut w = w.clone();
                        w.metadata.resource_version = e.metadata.resource_version.clone();
                        self.api
                            .replace(&name, &PostParams::default(), &w)
                            .await
                            .map_err(write)?;
                        report.replaced.push(name);
                    }
                    None => {
                        self.api
                            .create(&PostParams::default(), w)
                            .await
                            .map_err(write)?;
                        report.created.push(name);
                    }
                }
            }
            for e in &existing {
                if want.iter().any(|w| w.metadata.name == e.metadata.name) {
                    continue;
                }
                let name = e.metadata.name.clone().unwrap_or_default();
                match self.api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(source) => return Err(PublishError::Delete { name, source }),
                }
                report.deleted.push(name);
            }
        }
        self.applied = Some((devices, report.generation));
        Ok(Some(report))
    }
}

/// The node's labels, or None when they cannot be read (logged).
async fn node_labels(
    nodes: &Api<Node>,
    node: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    match nodes.get_opt(node).await {
        Ok(Some(n)) => Some(n.metadata.labels.unwrap_or_default()),
        Ok(None) => {
            tracing::warn!(%node, "node not found; label-selector overrides do not apply");
            Some(Default::default())
        }
        Err(e) => {
            tracing::warn!(%node, error = %e, "cannot read the node's labels; the ones known stay");
            None
        }
    }
}

/// Publishes the node's slices from the manager's status stream until
/// dropped; reconnects to the manager and retries the API server on
/// failure, logging each new failure once.
pub async fn run<M: ManagerApi>(
    client: kube::Client,
    manager: Arc<M>,
    config: Arc<ConfigFile>,
    driver: String,
    node: String,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut publisher = Publisher::new(client, &driver, &node);
    let mut last_error: Option<String> = None;
    let mut labels_read: Option<tokio::time::Instant> = None;
    loop {
        let stream = manager
            .watch_node_status(u32::try_from(STATUS_INTERVAL.as_millis()).unwrap_or(1000))
            .await;
        let mut stream = match stream {
            Ok(s) => s,
            Err(s) => {
                let e = format!("cannot watch the manager's node status: {}", s.message());
                if last_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "ResourceSlices not published");
                    last_error = Some(e);
                }
                tokio::time::sleep(STATUS_INTERVAL).await;
                continue;
            }
        };
        while let Some(item) = stream.next().await {
            let Ok(status) = item else { break };
            if labels_read.is_none_or(|t| t.elapsed() >= LABEL_REFRESH) {
                if let Some(l) = node_labels(&nodes, &node).await {
                    config.set_labels(l);
                }
                labels_read = Some(tokio::time::Instant::now());
            }
            let (cfg, resolved) = config.current_with_classes();
            let devices = slices::devices(&status, &cfg, &resolved);
            match publisher.sync(devices).await {
                Ok(Some(r)) => {
                    last_error = None;
                    tracing::info!(
                        layout = resolved.dra.layout.as_str(),
                        generation = r.generation,
                        created = r.created.len(),
                        replaced = r.replaced.len(),
                        deleted = r.deleted.len(),
                        "ResourceSlices published"
                    );
                }
                Ok(None) => {}
                Err(e) => {
                    publisher.invalidate();
                    let e = e.to_string();
                    if last_error.as_ref() != Some(&e) {
                        tracing::warn!(error = %e, "ResourceSlices not published; retrying");
                        last_error = Some(e);
                    }
                }
            }
        }
        tokio::time::sleep(STATUS_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeApiServer;
    use serde_json::json;
    use tessera_node::config::Config;
    use tessera_proto::manager::v1 as mgr;

    const DRIVER: &str = "vgpu.tessera.dev";
    const NODE: &str = "node-1";
    const COLLECTION: &str = "/apis/resource.k8s.io/v1/resourceslices";
    const GI: u64 = 1 << 30;

    fn slice_json(name: &str, node: &str, driver: &str, generation: i64) -> serde_json::Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "resourceVersion": "5"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": []},
        })
    }

    fn status(healthy: [bool; 2]) -> mgr::NodeStatus {
        mgr::NodeStatus {
            driver_version: "550.54.15".to_owned(),
            gpus: (0..2)
                .map(|i| mgr::GpuStatus {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "Sim GPU".to_owned(),
                    memory_total_bytes: 8 * GI,
                    healthy: healthy[i as usize],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn devices(
        status: &mgr::NodeStatus,
        config: &str,
    ) -> Vec<k8s_openapi::api::resource::v1::Device> {
        let c = Config::parse(config).expect("config");
        let n = c.resolve(NODE, &Default::default());
        slices::devices(status, &c, &n)
    }

    async fn client(api: &FakeApiServer, dir: &std::path::Path) -> kube::Client {
        let kc = dir.join("kubeconfig");
        api.write_kubeconfig(&kc).expect("kubeconfig");
        // The one construction (`tessera_node::kube`), not `plugin`'s wrapper:
        // publish sits below plugin, its tests too.
        tessera_node::kube::client(&tessera_node::kube::KubeSource::Kubeconfig(kc))
            .await
            .expect("client")
    }

    fn ours(api: &FakeApiServer) -> Vec<serde_json::Value> {
        api.list(COLLECTION)
            .into_iter()
            .filter(|s| s["spec"]["nodeName"] == NODE && s["spec"]["driver"] == DRIVER)
            .collect()
    }

    #[tokio::test]
    async fn publishes_replaces_and_deletes_only_its_own_stale_slices() {
        let dir = tempfile::tempdir().expect("tempdir");
        let api = FakeApiServer::start().await.expect("api server");
        // A leftover of this driver on this node under another name, and
        // slices that are not this plugin's: another node, another driver.
        api.put(
            &format!("{COLLECTION}/old-name"),
            slice_json("old-name", NODE, DRIVER, 3),
        );
        api.put(
            &format!("{COLLECTION}/other-node"),
            slice_json("other-node", "node-2", DRIVER, 9),
        );
        api.put(
            &format!("{COLLECTION}/other-driver"),
            slice_json("other-driver", NODE, "gpu.nvidia.com", 9),
        );
        let mut p = Publisher::new(client(&api, dir.path()).await, DRIVER, NODE);
        let cfg = "default:\n  slice: {slicesPerGpu: 4}\n";

        let r = p
            .sync(devices(&status([true, true]), cfg))
            .await
            .expect("sync")
            .expect("a change");
        assert_eq!(r.created, [slices::slice_name(NODE, DRIVER, 0)]);
        assert_eq!(r.deleted, ["old-name"]);
        // Above the stale slice's generation: the scheduler reads the newest.
        assert_eq!(r.generation, 4);
        let mine = ours(&api);
        assert_eq!(mine.len(), 1, "{mine:?}");
        let devs = mine[0]["spec"]["devices"].as_array().expect("devices");
        assert_eq!(devs.len(), 8);
        assert_eq!(devs[0]["name"], "gpu-0-s0");
        assert_eq!(devs[0]["capacity"]["memory"]["value"], "2Gi");
        assert_eq!(devs[0]["attributes"]["uuid"]["string"], "GPU-0");
        assert_eq!(mine[0]["spec"]["pool"]["generation"], 4);
        assert!(api.get(&format!("{COLLECTION}/other-node")).is_some());
        assert!(api.get(&format!("{COLLECTION}/other-driver")).is_some());
        // The list asked the API server for this node's and driver's slices.
        assert!(
            api.requests().iter().any(|r| r.starts_with("GET ")
                && r.contains(
                    "fieldSelector=spec.nodeName%3Dnode-1%2Cspec.driver%3Dvgpu.tessera.dev"
                )),
            "{:?}",
            api.requests()
        );

        // The same status again: no call at all.
        let before = api.requests().len();
        assert_eq!(
            p.sync(devices(&status([true, true]), cfg))
                .await
                .expect("sync"),
            None
        );
        assert_eq!(api.requests().len(), before);

        // GPU 1 goes unhealthy: its devices leave, at a new generation.
        let r = p
            .sync(devices(&status([true, false]), cfg))
            .await
            .expect("sync")
            .expect("a change");
        assert_eq!(r.replaced, [slices::slice_name(NODE, DRIVER, 0)]);
        assert_eq!(r.generation, 5);
        let mine = ours(&api);
        let names: Vec<_> = mine[0]["spec"]["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(names, ["gpu-0-s0", "gpu-0-s1", "gpu-0-s2", "gpu-0-s3"]);

        // The layout switches to shared: one device per healthy GPU.
        let r = p
            .sync(devices(
                &status([true, true]),
                "default:\n  dra: {layout: shared}\n",
            ))
            .await
            .expect("sync")
            .expect("a change");
        assert_eq!(r.generation, 6);
        let mine = ours(&api);
        let devs = mine[0]["spec"]["devices"].as_array().expect("devices");
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[1]["name"], "gpu-1");
        assert_eq!(devs[1]["allowMultipleAllocations"], true);
        assert_eq!(devs[1]["capacity"]["memory"]["value"], "8Gi");
        assert_eq!(
            devs[1]["capacity"]["memory"]["requestPolicy"]["validRange"]["min"],
            "256Mi"
        );
    }

    #[tokio::test]
    async fn a_restart_with_nothing_changed_writes_nothing_and_more_devices_add_slices() {
        let dir = tempfile::tempdir().expect("tempdir");
        let api = FakeApiServer::start().await.expect("api server");
        let c = client(&api, dir.path()).await;
        let cfg = "default:\n  slice: {slicesPerGpu: 100}\n";
        let mut first = Publisher::new(c.clone(), DRIVER, NODE);
        let r = first
            .sync(devices(&status([true, false]), cfg))
            .await
            .expect("sync")
            .expect("a change");
        assert_eq!((r.created.len(), r.generation), (1, 1));

        // A new plugin process (nothing remembered) finds the same content.
        let mut second = Publisher::new(c.clone(), DRIVER, NODE);
        let before: Vec<String> = api.requests();
        let r = second
            .sync(devices(&status([true, false]), cfg))
            .await
            .expect("sync")
            .expect("read the API server");
        assert_eq!(
            r,
            SyncReport {
                generation: 1,
                ..Default::default()
            }
        );
        let writes = api.requests()[before.len()..]
            .iter()
            .filter(|r| !r.starts_with("GET "))
            .count();
        assert_eq!(writes, 0, "{:?}", api.requests());

        // 200 devices: two slices, both at the new generation, counted.
        let r = second
            .sync(devices(&status([true, true]), cfg))
            .await
            .expect("sync")
            .expect("a change");
        assert_eq!(r.replaced.len() + r.created.len(), 2);
        let mine = ours(&api);
        assert_eq!(mine.len(), 2);
        for s in &mine {
            assert_eq!(s["spec"]["pool"]["generation"], 2);
            assert_eq!(s["spec"]["pool"]["resourceSliceCount"], 2);
        }
        // Back to 100: the second slice is stale and goes.
        let r = second
            .sync(devices(&status([false, true]), cfg))
            .await
            .expect("sync")
            .expect("a change");
        assert_eq!(r.deleted, [slices::slice_name(NODE, DRIVER, 1)]);
        assert_eq!(ours(&api).len(), 1);
    }
}
