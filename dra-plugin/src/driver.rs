//! NodePrepareResources and NodeUnprepareResources: for each claim, read it
//! from the API server, plan it ([`crate::claim`]), make its manager
//! allocation (`dra-<uid>`), write its CDI spec, record it in the
//! checkpoint, and answer its devices; undo all of it on unprepare.
//!
//! Every name is derived from the claim's uid, so a step repeated after a
//! crash finds what the first try made (the manager's CreateAllocation is
//! idempotent for the same id and request), and unprepare cleans up even a
//! claim the checkpoint never recorded. A claim that fails leaves nothing
//! behind: what was made for it is removed before its error is answered.
//! Calls are serialised: the kubelet may call concurrently, and a claim's
//! steps must not interleave with its own unprepare.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_contract::labels::SOURCE;
use tessera_node::cdi::{HostPaths, ensure_preload_file};
use tessera_node::config::{Config, NodeConfig};
use tessera_proto::dra::v1 as dra;
use tessera_proto::manager::v1 as mgr;
use tessera_proto::manager::v1::manager_client::ManagerClient;
use tokio::sync::Mutex;
use tonic::Code;
use tonic::transport::Channel;

use crate::cdi;
use crate::checkpoint::{PreparedClaim, PreparedDevice, Store};
use crate::claim::{self, ClaimError, ClaimRef, NodeGpu};

/// Value of the `source` label on this plugin's allocations.
pub const SOURCE_DRA_PLUGIN: &str = "dra-plugin";
/// Label naming the claim (`namespace/name`) an allocation serves.
pub const CLAIM_LABEL: &str = "claim";

/// The allocation id of claim `uid`.
pub fn allocation_id(uid: &str) -> String {
    format!("dra-{}", uid.to_ascii_lowercase())
}

/// Where the claims come from: the API server, or a test's double.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim, None when the API server has no such claim.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl std::future::Future<Output = Result<Option<ResourceClaim>, String>> + Send;
}

/// Claims read through kube-rs.
#[derive(Clone)]
pub struct KubeClaims(pub kube::Client);

impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        kube::Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("cannot read resource claim {namespace}/{name}: {e}"))
    }
}

/// The node config file, read again when it changes; a bad file keeps the
/// config in force (and is logged once). Overrides are resolved with the
/// node's labels as last read ([`ConfigFile::set_labels`]), as the device
/// plugin resolves them.
#[derive(Debug)]
pub struct ConfigFile {
    path: Option<PathBuf>,
    node: String,
    last: std::sync::Mutex<(Option<Vec<u8>>, Config)>,
    labels: std::sync::Mutex<BTreeMap<String, String>>,
}

impl ConfigFile {
    pub fn new(path: Option<PathBuf>, node: &str) -> Self {
        Self {
            path,
            node: node.to_owned(),
            last: std::sync::Mutex::new((None, Config::default())),
            labels: std::sync::Mutex::default(),
        }
    }

    /// The node's labels, for label-selector overrides.
    pub fn set_labels(&self, labels: BTreeMap<String, String>) {
        *self.labels.lock().unwrap_or_else(|e| e.into_inner()) = labels;
    }

    /// The settings in force on this node.
    pub fn current(&self) -> NodeConfig {
        self.current_with_classes().1
    }

    /// The whole config (its GPU classes) and the settings in force on
    /// this node.
    pub fn current_with_classes(&self) -> (Config, NodeConfig) {
        let config = self.load();
        let labels = self.labels.lock().unwrap_or_else(|e| e.into_inner());
        let node = config.resolve(&self.node, &labels);
        (config, node)
    }

    fn load(&self) -> Config {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(path) = &self.path {
            match std::fs::read(path) {
                Ok(bytes) if last.0.as_ref() != Some(&bytes) => {
                    match std::str::from_utf8(&bytes)
                        .map_err(|e| e.to_string())
                        .and_then(|t| Config::parse(t).map_err(|e| e.to_string()))
                    {
                        Ok(c) => {
                            last.1 = c;
                            tracing::info!(path = %path.display(), "node config loaded");
                        }
                        Err(e) => tracing::error!(
                            path = %path.display(), error = %e,
                            "node config is not valid; the config in force stays"
                        ),
                    }
                    last.0 = Some(bytes);
                }
                Ok(_) => {}
                Err(e) => {
                    if last.0.is_some() {
                        tracing::error!(path = %path.display(), error = %e, "cannot read the node config");
                    }
                    last.0 = None;
                }
            }
        }
        last.1.clone()
    }
}

/// What the driver is told at start.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    pub driver_name: String,
    pub node_name: String,
    pub cdi_dir: PathBuf,
    /// The hook library and the preload file on the host.
    pub host: HostPaths,
}

/// The prepare/unprepare logic, behind the gRPC services.
pub struct Driver<C> {
    opts: DriverOptions,
    manager: ManagerClient<Channel>,
    claims: C,
    config: Arc<ConfigFile>,
    store: Mutex<Store>,
}

impl<C: ClaimSource> Driver<C> {
    pub fn new(
        opts: DriverOptions,
        manager: ManagerClient<Channel>,
        claims: C,
        config: Arc<ConfigFile>,
        store: Store,
    ) -> Self {
        Self {
            opts,
            manager,
            claims,
            config,
            store: Mutex::new(store),
        }
    }

    /// NodePrepareResources: one entry per claim, its devices or its error.
    pub async fn prepare(&self, claims: Vec<dra::Claim>) -> dra::NodePrepareResourcesResponse {
        let mut store = self.store.lock().await;
        let mut out = HashMap::new();
        for c in claims {
            let uid = c.uid.clone();
            let entry = match self.prepare_one(&mut store, c).await {
                Ok(devices) => dra::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => {
                    tracing::warn!(claim = %uid, %error, "claim not prepared");
                    dra::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            out.insert(uid, entry);
        }
        dra::NodePrepareResourcesResponse { claims: out }
    }

    /// NodeUnprepareResources: one entry per claim, empty or its error.
    pub async fn unprepare(&self, claims: Vec<dra::Claim>) -> dra::NodeUnprepareResourcesResponse {
        let mut store = self.store.lock().await;
        let mut out = HashMap::new();
        for c in claims {
            let error = match self.unprepare_one(&mut store, &c.uid).await {
                Ok(()) => String::new(),
                Err(e) => {
                    tracing::warn!(claim = %c.uid, error = %e, "claim not unprepared");
                    e
                }
            };
            out.insert(c.uid, dra::NodeUnprepareResourceResponse { error });
        }
        dra::NodeUnprepareResourcesResponse { claims: out }
    }

    async fn prepare_one(
        &self,
        store: &mut Store,
        c: dra::Claim,
    ) -> Result<Vec<dra::Device>, String> {
        claim::check_uid(&c.uid).map_err(|e| e.to_string())?;
        if let Some(done) = store.data.claims.get(&c.uid) {
            return Ok(answer(&done.devices));
        }
        let want = ClaimRef {
            namespace: c.namespace,
            name: c.name,
            uid: c.uid,
        };
        let rc = self
            .claims
            .get(&want.namespace, &want.name)
            .await?
            .ok_or_else(|| ClaimError::NotFound(want.to_string()).to_string())?;
        let node = self.config.current();
        let status = self
            .manager
            .clone()
            .get_node_status(mgr::NodeStatusRequest {})
            .await
            .map_err(|s| format!("cannot reach the manager: {}", s.message()))?
            .into_inner();
        let gpus = node_gpus(&status, &node);
        let default_policy = match node.compute_policy {
            tessera_node::config::ComputePolicy::Guaranteed => mgr::ComputePolicy::Guaranteed,
            tessera_node::config::ComputePolicy::Burst => mgr::ComputePolicy::Burst,
        };
        let plan = claim::plan(
            &rc,
            &want,
            &self.opts.driver_name,
            &self.opts.node_name,
            &gpus,
            default_policy,
        )
        .map_err(|e| e.to_string())?;

        let id = allocation_id(&want.uid);
        let req = mgr::CreateAllocationRequest {
            id: id.clone(),
            devices: plan.limits.clone(),
            policy: plan.policy as i32,
            // The manager's device ids are `<uuid>::<slice>`: slices only.
            device_ids: plan
                .devices
                .iter()
                .filter_map(|d| match crate::names::parse(&d.device) {
                    Some(crate::names::DeviceName::Slice(_, n)) => {
                        Some(format!("{}::{n}", d.gpu_uuid))
                    }
                    _ => None,
                })
                .collect(),
            labels: [
                (SOURCE.to_owned(), SOURCE_DRA_PLUGIN.to_owned()),
                (CLAIM_LABEL.to_owned(), want.to_string()),
            ]
            .into(),
        };
        let mut manager = self.manager.clone();
        let alloc = manager
            .create_allocation(req)
            .await
            .map_err(|s| {
                format!(
                    "resource claim {want}: the manager refused the allocation: {}",
                    s.message()
                )
            })?
            .into_inner();
        // From here on, a failure removes what was made.
        let made_uid = want.uid.clone();
        let undo = |e: String| {
            let uid = made_uid.clone();
            async move {
                self.remove_made(&uid).await;
                e
            }
        };
        if let Some(p) = plan.priority {
            let r = manager
                .resize_allocation(mgr::ResizeAllocationRequest {
                    id: id.clone(),
                    devices: Vec::new(),
                    priority: Some(p),
                })
                .await;
            if let Err(s) = r {
                return Err(undo(format!(
                    "resource claim {want}: cannot set priority {p}: {}",
                    s.message()
                ))
                .await);
            }
        }
        let cdi_strategy = node.device_list_strategy.cdi;
        if node.ld_so_preload
            && let Err(e) = ensure_preload_file(&self.opts.host.preload_file)
        {
            return Err(undo(format!(
                "resource claim {want}: cannot write the preload file {}: {e}",
                self.opts.host.preload_file.display()
            ))
            .await);
        }
        let spec = cdi::spec(
            &want.uid,
            &alloc,
            &self.opts.host,
            node.ld_so_preload,
            !cdi_strategy,
        );
        if let Err(e) = cdi::write(&self.opts.cdi_dir, &want.uid, &spec) {
            return Err(undo(format!(
                "resource claim {want}: cannot write its CDI spec in {}: {e}",
                self.opts.cdi_dir.display()
            ))
            .await);
        }
        let devices = prepared_devices(&want.uid, &plan.devices, cdi_strategy);
        let record = PreparedClaim {
            namespace: want.namespace.clone(),
            name: want.name.clone(),
            allocation: id,
            devices: devices.clone(),
        };
        if let Err(e) = store.insert(&want.uid, record) {
            return Err(undo(format!("resource claim {want}: {e}")).await);
        }
        tracing::info!(claim = %want, uid = %want.uid, devices = devices.len(), "claim prepared");
        Ok(answer(&devices))
    }

    /// Removes the allocation and the spec of claim `uid`, whatever is there.
    async fn remove_made(&self, uid: &str) {
        if let Err(s) = self
            .manager
            .clone()
            .delete_allocation(mgr::DeleteAllocationRequest {
                id: allocation_id(uid),
            })
            .await
            && s.code() != Code::NotFound
        {
            tracing::error!(claim = %uid, error = %s.message(), "cannot delete the allocation of a failed prepare");
        }
        if let Err(e) = cdi::remove(&self.opts.cdi_dir, uid) {
            tracing::error!(claim = %uid, error = %e, "cannot remove the CDI spec of a failed prepare");
        }
    }

    async fn unprepare_one(&self, store: &mut Store, uid: &str) -> Result<(), String> {
        claim::check_uid(uid).map_err(|e| e.to_string())?;
        match self
            .manager
            .clone()
            .delete_allocation(mgr::DeleteAllocationRequest {
                id: allocation_id(uid),
            })
            .await
        {
            Ok(_) => {}
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => {
                return Err(format!(
                    "claim {uid}: cannot delete its allocation: {}",
                    s.message()
                ));
            }
        }
        cdi::remove(&self.opts.cdi_dir, uid)
            .map_err(|e| format!("claim {uid}: cannot remove its CDI spec: {e}"))?;
        store.remove(uid).map_err(|e| format!("claim {uid}: {e}"))?;
        tracing::info!(claim = %uid, "claim unprepared");
        Ok(())
    }
}

/// The node's GPUs from the manager's status, with their slices under `node`.
pub fn node_gpus(status: &mgr::NodeStatus, node: &NodeConfig) -> Vec<NodeGpu> {
    status
        .gpus
        .iter()
        .map(|g| NodeGpu {
            uuid: g.uuid.clone(),
            index: g.index,
            memory_total_bytes: g.memory_total_bytes,
            healthy: g.healthy,
            unhealthy_reason: g.unhealthy_reason.clone(),
            slices: node.slice.layout(g.memory_total_bytes),
        })
        .collect()
}

/// The devices answered for a claim: the claim's own CDI device on the first
/// device of each request, NVIDIA's device of each GPU on its first device
/// under the `cdi` strategy (a runtime injects each CDI device once).
fn prepared_devices(
    uid: &str,
    planned: &[claim::PlannedDevice],
    cdi_strategy: bool,
) -> Vec<PreparedDevice> {
    let mut seen_requests = std::collections::BTreeSet::new();
    let mut seen_gpus = std::collections::BTreeSet::new();
    planned
        .iter()
        .map(|d| {
            let mut ids = Vec::new();
            if seen_requests.insert(d.request.clone()) {
                ids.push(cdi::device_id(uid));
            }
            if cdi_strategy && seen_gpus.insert((d.request.clone(), d.gpu_uuid.clone())) {
                ids.push(cdi::nvidia_device_id(&d.gpu_uuid));
            }
            PreparedDevice {
                requests: vec![d.request.clone()],
                pool: d.pool.clone(),
                device: d.device.clone(),
                cdi_device_ids: ids,
                share_id: d.share_id.clone(),
            }
        })
        .collect()
}

fn answer(devices: &[PreparedDevice]) -> Vec<dra::Device> {
    devices
        .iter()
        .map(|d| dra::Device {
            request_names: d.requests.clone(),
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
            share_id: d.share_id.clone(),
        })
        .collect()
}
