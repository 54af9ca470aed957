//! NodePrepareResources and NodeUnprepareResources: for each claim, read it
//! from the API server, plan it ([`crate::claim`]), make its manager
//! allocation (`dra-<uid>`; or one per request, `dra-<uid>-<k>`, for a pod's
//! extended-resource claim whose containers have exact limits of their own:
//! [`crate::split`]), write its CDI spec, record it in the checkpoint, and
//! answer its devices; undo all of it on unprepare.
//!
//! Every name is derived from the claim's uid, so a step repeated after a
//! crash finds what the first try made (the manager's CreateAllocation is
//! idempotent for the same id and request), and unprepare cleans up even a
//! claim the checkpoint never recorded (the allocations of one split per
//! request carry its uid in a label, and are found by it). A claim that fails leaves nothing
//! behind: what was made for it is removed before its error is answered.
//! Calls are serialised: the kubelet may call concurrently, and a claim's
//! steps must not interleave with its own unprepare.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodExtendedResourceClaimStatus};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_contract::Policy;
use tessera_contract::labels::{
    ANNOTATION_COMPUTE_POLICY, ANNOTATION_PRIORITY, SOURCE, parse_priority,
};
use tessera_node::cdi::{HostPaths, ensure_preload_file};
use tessera_node::config::{Config, ConfigError, NodeConfig};
use tessera_node::manager::ManagerApi;
use tessera_node::reload::ConfigReloader;
use tessera_proto::dra::v1 as dra;
use tessera_proto::manager::v1 as mgr;
use tokio::sync::Mutex;
use tonic::Code;

use crate::cdi;
use crate::checkpoint::{PreparedClaim, PreparedDevice, Store};
use crate::claim::{self, ClaimError, ClaimRef, NodeGpu};
use crate::split::{self, Layout};

/// Value of the `source` label on this plugin's allocations.
pub const SOURCE_DRA_PLUGIN: &str = "dra-plugin";
/// Label naming the claim (`namespace/name`) an allocation serves.
pub const CLAIM_LABEL: &str = "claim";
/// Label with the uid of the claim an allocation of one request serves (only
/// on those, [`part_allocation_id`]): how unprepare finds them when the
/// checkpoint never recorded the claim.
pub const CLAIM_UID_LABEL: &str = "claim-uid";
/// Label naming the request of the claim an allocation of one request serves.
pub const REQUEST_LABEL: &str = "request";
/// The manager's longest allocation id (a DNS label).
const MAX_ALLOCATION_ID: usize = 63;

/// The allocation id of claim `uid`.
pub fn allocation_id(uid: &str) -> String {
    format!("dra-{}", uid.to_ascii_lowercase())
}

/// The allocation id of request `k` (1-based, in [`claim::served_requests`]'
/// order) of claim `uid`, prepared as one allocation per request; an error for
/// a uid too long to leave room (Kubernetes uids, 36 characters, fit).
pub fn part_allocation_id(uid: &str, k: usize) -> Result<String, String> {
    let id = format!("{}-{k}", allocation_id(uid));
    if id.len() > MAX_ALLOCATION_ID {
        return Err(format!(
            "claim uid {uid:?} is too long for an allocation per request ({id:?} is over {MAX_ALLOCATION_ID} characters)"
        ));
    }
    Ok(id)
}

/// Where the claims come from: the API server, or a test's double.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim, None when the API server has no such claim.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl std::future::Future<Output = Result<Option<ResourceClaim>, String>> + Send;

    /// What the driver reads of pod `namespace/name` when it exists with
    /// `uid`, None otherwise. A source without pods answers None for every pod.
    fn consumer_pod(
        &self,
        _namespace: &str,
        _name: &str,
        _uid: &str,
    ) -> impl std::future::Future<Output = Result<Option<ConsumerPod>, String>> + Send {
        async { Ok(None) }
    }
}

/// What the driver reads of the pod a claim is reserved for: its words, never
/// who it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConsumerPod {
    pub annotations: BTreeMap<String, String>,
    /// `status.extendedResourceClaimStatus`: the claim kube-scheduler wrote for
    /// the pod's extended resources served by DRA, and each container's
    /// request in it ([`crate::split`]).
    pub extended: Option<PodExtendedResourceClaimStatus>,
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

    async fn consumer_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<ConsumerPod>, String> {
        let pod = kube::Api::<Pod>::namespaced(self.0.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("cannot read pod {namespace}/{name}: {e}"))?;
        // A pod of that name but another uid is a later pod, not the claim's.
        Ok(pod
            .filter(|p| p.metadata.uid.as_deref() == Some(uid))
            .map(|p| ConsumerPod {
                annotations: p.metadata.annotations.unwrap_or_default(),
                extended: p.status.and_then(|s| s.extended_resource_claim_status),
            }))
    }
}

/// What a claim's consumer pod asks for in its own words.
#[derive(Debug, Default, Clone, PartialEq)]
struct PodAsks {
    /// The pod, `namespace/name` (for messages); empty without one.
    pod: String,
    guaranteed: bool,
    priority: Option<i32>,
    /// A translated pod's exact limits (`tessera.dev/dropin-limits`,
    /// `tessera.dev/dropin-memory-percent`), by container: which of them apply
    /// to the claim, and how, is [`crate::split::layout`]'s.
    exact: BTreeMap<String, tessera_node::exact::ExactLimit>,
    /// Its `status.extendedResourceClaimStatus`.
    extended: Option<PodExtendedResourceClaimStatus>,
    /// Its vendor, model and UUID lists (`tessera_contract::gpu_filter`): the claim's
    /// GPUs must pass them. kube-scheduler writes the claim of a pod's
    /// `tessera.dev/vgpu` with no selector, so the prepare is where they hold.
    gpus: tessera_contract::gpu_filter::GpuFilter,
}

/// The pod a claim is reserved for, when it is reserved for exactly one
/// (a claim shared by several pods has no one pod whose words apply):
/// `(name, uid)`.
fn sole_consumer(claim: &ResourceClaim) -> Option<(String, String)> {
    let consumers = claim.status.as_ref()?.reserved_for.as_ref()?;
    let mut pods = consumers
        .iter()
        .filter(|c| c.resource == "pods" && c.api_group.as_deref().unwrap_or("").is_empty());
    let only = pods.next()?;
    if pods.next().is_some() || consumers.len() != 1 {
        return None;
    }
    Some((only.name.clone(), only.uid.clone()))
}

/// The asks in a pod's annotations. A value that is not one is logged and
/// left out (the webhook refuses those at admission; one here was written
/// after it), as the device plugin does.
fn pod_asks(annotations: &BTreeMap<String, String>, pod: &str) -> Result<PodAsks, String> {
    let guaranteed = match annotations.get(ANNOTATION_COMPUTE_POLICY) {
        None => false,
        Some(v) => match Policy::parse(v) {
            Some(p) => p == Policy::Guaranteed,
            None => {
                tracing::warn!(%pod, "annotation {ANNOTATION_COMPUTE_POLICY}={v:?} is not \"guaranteed\" or \"burst\"; the node's policy applies");
                false
            }
        },
    };
    let priority = annotations
        .get(ANNOTATION_PRIORITY)
        .and_then(|v| match parse_priority(v) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(%pod, "{e}; no priority applied");
                None
            }
        });
    // Unlike a bad policy or priority (which leave the node's), an unreadable exact limit
    // fails the prepare: run on its slices, the pod would get more than its words.
    let exact = tessera_node::exact::from_annotations(annotations)
        .map_err(|e| format!("pod {pod}: {e}"))?;
    // As the device plugin reads them: a constraint that does not parse (the webhook
    // refuses those) loosens only the pod's own choice of GPU.
    let gpus = tessera_contract::gpu_filter::GpuFilter::from_annotations(annotations)
        .unwrap_or_else(|e| {
            tracing::warn!(%pod, error = %e, "GPU constraint ignored");
            Default::default()
        });
    Ok(PodAsks {
        pod: pod.to_owned(),
        guaranteed,
        priority,
        exact,
        extended: None,
        gpus,
    })
}

/// The node config in force, read again from its file when it changes
/// (each time the driver needs it: [`tessera_node::reload`], the device
/// plugin's rules); none given is the built-in defaults. Overrides are
/// resolved with the node's labels as last read ([`ConfigFile::set_labels`]),
/// as the device plugin resolves them.
#[derive(Debug)]
pub struct ConfigFile {
    node: String,
    file: std::sync::Mutex<(Option<ConfigReloader>, Config)>,
    labels: std::sync::Mutex<BTreeMap<String, String>>,
}

impl ConfigFile {
    /// Reads `path` at start: a file that cannot be read or is not valid
    /// is an error (see [`tessera_node::reload`]).
    pub fn open(path: Option<&Path>, node: &str) -> Result<Self, ConfigError> {
        let file = match path {
            Some(p) => {
                let (r, c) = ConfigReloader::open(p)?;
                (Some(r), c)
            }
            None => (None, Config::default()),
        };
        Ok(Self {
            node: node.to_owned(),
            file: std::sync::Mutex::new(file),
            labels: std::sync::Mutex::default(),
        })
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
        // A panic while holding the lock leaves a whole config either way.
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let (reloader, config) = &mut *file;
        if let Some(new) = reloader.as_mut().and_then(ConfigReloader::poll) {
            *config = new;
        }
        config.clone()
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
pub struct Driver<C, M> {
    opts: DriverOptions,
    manager: Arc<M>,
    claims: C,
    config: Arc<ConfigFile>,
    store: Mutex<Store>,
}

/// The node as one prepare call sees it: the config in force and the
/// manager's GPUs, read once per call (not once per claim), and only when a
/// claim of the call is not prepared already.
#[derive(Debug, Clone)]
struct NodeView {
    node: NodeConfig,
    gpus: Vec<NodeGpu>,
}

/// What one prepare made so far, each step's undo recorded when the step
/// is taken; [`Made::undo`] reverses them, newest first, [`Made::keep`]
/// drops them once the claim is prepared. A step that fails undoes nothing
/// of its own: it made nothing, or what it made is removed by an earlier
/// step's undo (a priority goes with its allocation).
struct Made<'a, M> {
    manager: &'a M,
    cdi_dir: &'a Path,
    uid: &'a str,
    undo: Vec<Undo>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Undo {
    /// Delete this allocation.
    Allocation(String),
    /// Remove the claim's CDI spec.
    Spec,
}

impl<'a, M: ManagerApi> Made<'a, M> {
    fn new(manager: &'a M, cdi_dir: &'a Path, uid: &'a str) -> Self {
        Self {
            manager,
            cdi_dir,
            uid,
            undo: Vec::new(),
        }
    }

    /// Step: the claim's allocation (idempotent for the same id and request:
    /// a retry after a crash finds the one it made).
    async fn allocation(
        &mut self,
        req: mgr::CreateAllocationRequest,
    ) -> Result<mgr::Allocation, String> {
        let id = req.id.clone();
        let alloc = self
            .manager
            .create_allocation(req)
            .await
            .map_err(|s| format!("the manager refused the allocation: {}", s.message()))?;
        self.undo.push(Undo::Allocation(id));
        Ok(alloc)
    }

    /// Step: the allocation's burst priority (goes with the allocation).
    async fn priority(&mut self, id: &str, priority: i32) -> Result<(), String> {
        self.manager
            .resize_allocation(mgr::ResizeAllocationRequest {
                id: id.to_owned(),
                devices: Vec::new(),
                priority: Some(priority),
            })
            .await
            .map(drop)
            .map_err(|s| format!("cannot set priority {priority}: {}", s.message()))
    }

    /// Step: the claim's CDI spec. Its undo is recorded before the write: a
    /// write that fails may have left the file in place.
    fn spec(&mut self, spec: &tessera_node::cdi::Spec) -> Result<(), String> {
        self.undo.push(Undo::Spec);
        cdi::write(self.cdi_dir, self.uid, spec)
            .map(drop)
            .map_err(|e| {
                format!(
                    "cannot write its CDI spec in {}: {e}",
                    self.cdi_dir.display()
                )
            })
    }

    /// Everything made is the prepared claim's now.
    fn keep(mut self) {
        self.undo.clear();
    }

    /// Reverses every step taken, newest first; what cannot be undone is
    /// logged (unprepare removes it later: every name derives from the uid).
    async fn undo(mut self) {
        while let Some(step) = self.undo.pop() {
            match step {
                Undo::Allocation(id) => match self.manager.delete_allocation(id).await {
                    Ok(()) => {}
                    Err(s) if s.code() == Code::NotFound => {}
                    Err(s) => {
                        tracing::error!(claim = %self.uid, error = %s.message(), "cannot delete the allocation of a failed prepare");
                    }
                },
                Undo::Spec => {
                    if let Err(e) = cdi::remove(self.cdi_dir, self.uid) {
                        tracing::error!(claim = %self.uid, error = %e, "cannot remove the CDI spec of a failed prepare");
                    }
                }
            }
        }
    }
}

impl<C: ClaimSource, M: ManagerApi> Driver<C, M> {
    pub fn new(
        opts: DriverOptions,
        manager: Arc<M>,
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
        let mut view = None;
        let mut out = HashMap::new();
        for c in claims {
            let uid = c.uid.clone();
            let entry = match self.prepare_one(&mut store, &mut view, c).await {
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

    /// The node's config and GPUs (see [`NodeView`]).
    async fn look_at_node(&self) -> Result<NodeView, String> {
        let node = self.config.current();
        let status = self
            .manager
            .node_status()
            .await
            .map_err(|s| format!("cannot reach the manager: {}", s.message()))?;
        let gpus = node_gpus(&status, &node);
        Ok(NodeView { node, gpus })
    }

    async fn prepare_one(
        &self,
        store: &mut Store,
        view: &mut Option<Result<NodeView, String>>,
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
        let view = match view {
            Some(v) => v,
            None => view.insert(self.look_at_node().await),
        }
        .clone()?;
        let asks = self.consumer_asks(&rc, &want.namespace).await?;
        // The pod's `guaranteed` is taken as the device plugin's manager
        // takes it: only ever stricter than the node's policy. The claim's
        // own config (class, then claim) still decides over both.
        let default_policy = match view.node.compute_policy {
            _ if asks.guaranteed => mgr::ComputePolicy::Guaranteed,
            tessera_node::config::ComputePolicy::Guaranteed => mgr::ComputePolicy::Guaranteed,
            tessera_node::config::ComputePolicy::Burst => mgr::ComputePolicy::Burst,
        };
        let mut plan = claim::plan(
            &rc,
            &want,
            &self.opts.driver_name,
            &self.opts.node_name,
            &view.gpus,
            default_policy,
            None,
        )
        .map_err(|e| e.to_string())?;
        if plan.priority.is_none() {
            plan.priority = asks.priority;
        }
        if let Some(why) = plan.devices.iter().find_map(|d| {
            let g = view.gpus.iter().find(|g| g.uuid == d.gpu_uuid)?;
            asks.gpus.refusal(&g.vendor, &g.name, &g.uuid)
        }) {
            return Err(format!(
                "resource claim {want}: its pod's GPU constraint: {why}"
            ));
        }
        // A share of the card (`gpumem-percentage`) is a share of the GPU the claim's
        // slices are on, as this node lays its slices out.
        let cards: tessera_node::exact::Cards = view
            .gpus
            .iter()
            .map(|g| {
                let card = tessera_node::exact::card_memory(&g.slices, g.memory_total_bytes);
                (g.uuid.clone(), card)
            })
            .collect();
        let cap = |limits: &mut Vec<mgr::DeviceRequest>, e: &tessera_node::exact::ExactLimit| {
            if !tessera_node::exact::cap(limits, e, &cards) {
                tracing::warn!(claim = %want, "the pod's exact limits are for {} slices on one GPU; they keep their slices' limits", e.slices);
            }
        };
        let served = claim::served_requests(&rc, &self.opts.driver_name, &self.opts.node_name);
        let layout = split::layout(
            &asks.pod,
            &want.name,
            &claim::spec_requests(&rc),
            &served,
            &asks.exact,
            asks.extended.as_ref(),
        )
        .map_err(|e| format!("resource claim {want}: {e}"))?;
        let planned = plan.devices.clone();
        let parts = match layout {
            Layout::Whole(exact) => {
                if let Some(e) = &exact {
                    cap(&mut plan.limits, e);
                }
                vec![Part {
                    id: allocation_id(&want.uid),
                    cdi: want.uid.clone(),
                    request: None,
                    plan,
                }]
            }
            Layout::PerRequest(split) => {
                let mut parts = Vec::with_capacity(split.len());
                for (i, p) in split.into_iter().enumerate() {
                    let mut rp = claim::plan(
                        &rc,
                        &want,
                        &self.opts.driver_name,
                        &self.opts.node_name,
                        &view.gpus,
                        default_policy,
                        Some(&p.request),
                    )
                    .map_err(|e| e.to_string())?;
                    if rp.priority.is_none() {
                        rp.priority = asks.priority;
                    }
                    if let Some(e) = &p.exact {
                        cap(&mut rp.limits, e);
                    }
                    parts.push(Part {
                        id: part_allocation_id(&want.uid, i + 1)
                            .map_err(|e| format!("resource claim {want}: {e}"))?,
                        cdi: cdi::part_name(&want.uid, i + 1),
                        request: Some(p.request),
                        plan: rp,
                    });
                }
                parts
            }
        };

        let mut made = Made::new(self.manager.as_ref(), &self.opts.cdi_dir, &want.uid);
        match self
            .make(&mut made, store, &want, &parts, &planned, &view.node)
            .await
        {
            Ok(devices) => {
                made.keep();
                tracing::info!(claim = %want, uid = %want.uid, devices = devices.len(), "claim prepared");
                Ok(answer(&devices))
            }
            Err(e) => {
                made.undo().await;
                Err(format!("resource claim {want}: {e}"))
            }
        }
    }

    /// What the claim's one consumer pod asks for with
    /// `tessera.dev/compute-policy` and `tessera.dev/priority`. A pod that
    /// asks for `tessera.dev/vgpu` on a DRA node (the DeviceClass's
    /// `extendedResourceName`, the route translated drop-in pods take) gets
    /// a claim kube-scheduler made, with no config of its own: the pod's
    /// annotations are the only place its policy and priority are written,
    /// as on the device plugin's route. The pod's words are its own asks,
    /// never who it is. A pod that cannot be read fails the prepare (the
    /// kubelet retries), so a capped pod is never run uncapped by accident.
    async fn consumer_asks(
        &self,
        claim: &ResourceClaim,
        namespace: &str,
    ) -> Result<PodAsks, String> {
        let Some((name, uid)) = sole_consumer(claim) else {
            return Ok(PodAsks::default());
        };
        let pod = format!("{namespace}/{name}");
        match self.claims.consumer_pod(namespace, &name, &uid).await? {
            Some(p) => Ok(PodAsks {
                extended: p.extended,
                ..pod_asks(&p.annotations, &pod)?
            }),
            None => Ok(PodAsks::default()),
        }
    }

    /// The steps of a prepare, in order: each part's allocation (and its
    /// priority), the spec with a device for each, the checkpoint last, so
    /// that a claim it records is whole. `planned`: the claim's devices, in
    /// the order of its results (every part's).
    async fn make(
        &self,
        made: &mut Made<'_, M>,
        store: &mut Store,
        want: &ClaimRef,
        parts: &[Part],
        planned: &[claim::PlannedDevice],
        node: &NodeConfig,
    ) -> Result<Vec<PreparedDevice>, String> {
        let mut allocs = Vec::with_capacity(parts.len());
        for part in parts {
            let req = allocation_request(&part.id, want, &part.plan, part.request.as_deref());
            allocs.push(made.allocation(req).await?);
            if let Some(p) = part.plan.priority {
                made.priority(&part.id, p).await?;
            }
        }
        if node.ld_so_preload {
            // A node-wide file every claim shares: kept whatever happens.
            ensure_preload_file(&self.opts.host.preload_file).map_err(|e| {
                format!(
                    "cannot write the preload file {}: {e}",
                    self.opts.host.preload_file.display()
                )
            })?;
        }
        let cdi_strategy = node.device_list_strategy.cdi;
        let spec_devices = parts
            .iter()
            .zip(&allocs)
            .map(|(part, alloc)| {
                cdi::device(
                    &part.cdi,
                    alloc,
                    &self.opts.host,
                    node.ld_so_preload,
                    !cdi_strategy,
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        made.spec(&cdi::spec_of(spec_devices))?;
        let devices = prepared_devices(parts, planned, cdi_strategy);
        let mut ids = parts.iter().map(|p| p.id.clone());
        let record = PreparedClaim {
            namespace: want.namespace.clone(),
            name: want.name.clone(),
            allocation: ids.next().unwrap_or_default(),
            more_allocations: ids.collect(),
            devices: devices.clone(),
        };
        store.insert(&want.uid, record).map_err(|e| e.to_string())?;
        Ok(devices)
    }

    async fn unprepare_one(&self, store: &mut Store, uid: &str) -> Result<(), String> {
        claim::check_uid(uid).map_err(|e| e.to_string())?;
        let ids = match store.data.claims.get(uid) {
            Some(c) => {
                let mut ids = c.allocations();
                // A claim recorded per request may have had its whole-claim
                // allocation made by an earlier try that died (the pod's words
                // changed before the retry): gone too, NotFound is fine.
                let one = allocation_id(uid);
                if !ids.contains(&one) {
                    ids.push(one);
                }
                ids
            }
            None => self.unrecorded_allocations(uid).await?,
        };
        for id in ids {
            match self.manager.delete_allocation(id.clone()).await {
                Ok(()) => {}
                Err(s) if s.code() == Code::NotFound => {}
                Err(s) => {
                    return Err(format!(
                        "claim {uid}: cannot delete its allocation {id}: {}",
                        s.message()
                    ));
                }
            }
        }
        cdi::remove(&self.opts.cdi_dir, uid)
            .map_err(|e| format!("claim {uid}: cannot remove its CDI spec: {e}"))?;
        store.remove(uid).map_err(|e| format!("claim {uid}: {e}"))?;
        tracing::info!(claim = %uid, "claim unprepared");
        Ok(())
    }

    /// The allocations a claim the checkpoint does not record may have (a
    /// plugin that died between its allocations and its checkpoint): its one
    /// allocation's id, and those of one per request, found by their label
    /// (and id: a label alone is any client's word).
    async fn unrecorded_allocations(&self, uid: &str) -> Result<Vec<String>, String> {
        let one = allocation_id(uid);
        let prefix = format!("{one}-");
        let listed = self.manager.list_allocations().await.map_err(|s| {
            format!(
                "claim {uid}: cannot list the manager's allocations: {}",
                s.message()
            )
        })?;
        let mut ids = vec![one];
        ids.extend(
            listed
                .into_iter()
                .filter(|a| {
                    a.id.starts_with(&prefix)
                        && a.labels.get(CLAIM_UID_LABEL).map(String::as_str) == Some(uid)
                        && a.labels.get(SOURCE).map(String::as_str) == Some(SOURCE_DRA_PLUGIN)
                })
                .map(|a| a.id),
        );
        Ok(ids)
    }
}

/// One allocation a claim is prepared as: the whole claim, or one request of it.
struct Part {
    id: String,
    /// Its device's name in the claim's CDI spec.
    cdi: String,
    /// The request it serves alone; None for the whole claim.
    request: Option<String>,
    plan: claim::ClaimPlan,
}

/// The manager request of a claim's plan: its limits, policy, labels, and
/// the manager's device ids (`<uuid>::<slice>`: slices only). `request`: the
/// one request of the claim it serves, labelled with it and the claim's uid
/// (an allocation of the whole claim has neither, as it always had: the
/// manager's CreateAllocation is idempotent only for the same request).
fn allocation_request(
    id: &str,
    want: &ClaimRef,
    plan: &claim::ClaimPlan,
    request: Option<&str>,
) -> mgr::CreateAllocationRequest {
    let mut labels: HashMap<String, String> = [
        (SOURCE.to_owned(), SOURCE_DRA_PLUGIN.to_owned()),
        (CLAIM_LABEL.to_owned(), want.to_string()),
    ]
    .into();
    if let Some(r) = request {
        labels.insert(CLAIM_UID_LABEL.to_owned(), want.uid.clone());
        labels.insert(REQUEST_LABEL.to_owned(), r.to_owned());
    }
    mgr::CreateAllocationRequest {
        id: id.to_owned(),
        devices: plan.limits.clone(),
        policy: plan.policy as i32,
        device_ids: plan
            .devices
            .iter()
            .filter_map(|d| match crate::names::parse(&d.device) {
                Some(crate::names::DeviceName::Slice(_, n)) => Some(format!("{}::{n}", d.gpu_uuid)),
                _ => None,
            })
            .collect(),
        labels,
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
            // An older manager's silence is NVIDIA's, as the device plugin reads it.
            vendor: if g.vendor.is_empty() {
                tessera_contract::Vendor::Nvidia.as_str().to_owned()
            } else {
                g.vendor.clone()
            },
            name: g.name.clone(),
        })
        .collect()
}

/// The devices answered for a claim: the CDI device of the allocation that
/// serves it (the claim's own, or its request's) on the first device of each
/// request (the kubelet gives a container the CDI devices of its own
/// requests), NVIDIA's device of each GPU on its first device under the `cdi`
/// strategy (a runtime injects each CDI device once).
fn prepared_devices(
    parts: &[Part],
    planned: &[claim::PlannedDevice],
    cdi_strategy: bool,
) -> Vec<PreparedDevice> {
    let mut seen_requests = std::collections::BTreeSet::new();
    let mut seen_gpus = std::collections::BTreeSet::new();
    planned
        .iter()
        .map(|d| {
            let mut ids = Vec::new();
            let part = parts.iter().find(|p| {
                p.request
                    .as_deref()
                    .is_none_or(|r| r == claim::main_request(&d.request))
            });
            if let Some(part) = part
                && seen_requests.insert(d.request.clone())
            {
                ids.push(cdi::device_id(&part.cdi));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::slice_device;
    use tessera_node::testing::{FakeManager, Method};
    use tonic::Status;

    const GI: u64 = 1 << 30;

    /// What `consumer_pod` answers for pod `name` with `uid`.
    type PodOf = dyn Fn(&str, &str) -> Result<Option<ConsumerPod>, String> + Send + Sync;

    /// The one test double of the API server: each claim, by namespace and
    /// name, as JSON, and each pod as the driver reads it.
    struct Api {
        claim: fn(&str, &str) -> serde_json::Value,
        pod: Box<PodOf>,
    }

    impl ClaimSource for Api {
        async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
            serde_json::from_value((self.claim)(namespace, name))
                .map(Some)
                .map_err(|e| e.to_string())
        }

        async fn consumer_pod(
            &self,
            _namespace: &str,
            name: &str,
            uid: &str,
        ) -> Result<Option<ConsumerPod>, String> {
            (self.pod)(name, uid)
        }
    }

    /// The API server's claims: any name, one allocated slice of GPU-a,
    /// with a priority (so that every step of a prepare is taken); no pods.
    fn claims() -> Api {
        Api {
            claim: |namespace, name| {
                serde_json::json!({
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.tessera.dev"}}]}},
                    "status": {"allocation": {"devices": {
                        "results": [{"request": "gpu", "driver": "vgpu.tessera.dev", "pool": "node-1",
                                     "device": slice_device("GPU-a", name.len() as u32 % 4)}],
                        "config": [{"source": "FromClaim", "opaque": {"driver": "vgpu.tessera.dev", "parameters": {
                            "apiVersion": crate::claim::CONFIG_API_VERSION, "kind": crate::claim::CONFIG_KIND,
                            "priority": 5}}}]
                    }}}
                })
            },
            pod: Box::new(|_, _| Ok(None)),
        }
    }

    struct Rig {
        dir: tempfile::TempDir,
        manager: Arc<FakeManager>,
        driver: Driver<Api, FakeManager>,
    }

    fn rig() -> Rig {
        let dir = tempfile::tempdir().expect("tempdir");
        let manager = Arc::new(FakeManager::default());
        manager.set_status(mgr::NodeStatus {
            gpus: vec![mgr::GpuStatus {
                uuid: "GPU-a".into(),
                memory_total_bytes: 16 * GI,
                healthy: true,
                ..Default::default()
            }],
            ..Default::default()
        });
        let opts = DriverOptions {
            driver_name: "vgpu.tessera.dev".into(),
            node_name: "node-1".into(),
            cdi_dir: dir.path().join("cdi"),
            host: HostPaths {
                hook_library: dir.path().join("libtessera.so"),
                preload_file: dir.path().join("ld.so.preload"),
            },
        };
        let config = Arc::new(ConfigFile::open(None, "node-1").expect("defaults"));
        std::fs::create_dir(dir.path().join("plugin")).expect("plugin dir");
        let store = Store::open(&dir.path().join("plugin")).expect("store");
        let driver = Driver::new(opts, manager.clone(), claims(), config, store);
        Rig {
            dir,
            manager,
            driver,
        }
    }

    fn claim(name: &str) -> dra::Claim {
        dra::Claim {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    impl Rig {
        async fn prepare(&self, names: &[&str]) -> dra::NodePrepareResourcesResponse {
            self.driver
                .prepare(names.iter().map(|n| claim(n)).collect())
                .await
        }

        /// A driver on this rig's manager, store and CDI dir, reading `source`.
        fn with(&self, source: Api) -> Driver<Api, FakeManager> {
            Driver::new(
                self.driver.opts.clone(),
                self.manager.clone(),
                source,
                Arc::new(ConfigFile::open(None, "node-1").expect("defaults")),
                Store::open(&self.dir.path().join("plugin")).expect("store"),
            )
        }

        fn spec_exists(&self, name: &str) -> bool {
            cdi::spec_path(&self.dir.path().join("cdi"), &format!("uid-{name}")).exists()
        }
    }

    /// A failure at step k of a prepare undoes steps 1..k-1 and nothing
    /// else: no allocation, no spec, no checkpoint entry is left, and the
    /// undo deletes only what was made.
    #[tokio::test(start_paused = true)]
    async fn a_failed_step_undoes_the_steps_before_it() {
        // Step 1, the allocation, refused: nothing was made, nothing deleted.
        let r = rig();
        r.manager
            .fail_next(Method::Create, Status::resource_exhausted("full"));
        let a = r.prepare(&["c1"]).await;
        let e = &a.claims["uid-c1"].error;
        assert!(e.contains("refused the allocation: full"), "{e}");
        assert_eq!(r.manager.count(Method::Delete), 0);
        assert!(r.manager.allocations().is_empty());
        assert!(!r.spec_exists("c1"));

        // Step 2, the priority, refused: the allocation goes.
        let r = rig();
        r.manager
            .fail_next(Method::Resize, Status::invalid_argument("no"));
        let a = r.prepare(&["c1"]).await;
        assert!(a.claims["uid-c1"].error.contains("cannot set priority 5"));
        assert_eq!(
            r.manager.calls().last(),
            Some(&(Method::Delete, "dra-uid-c1".to_owned()))
        );
        assert!(r.manager.allocations().is_empty());
        assert!(!r.spec_exists("c1"));

        // Step 3, the spec, cannot be written (its dir is a file): the
        // allocation goes.
        let r = rig();
        std::fs::write(r.dir.path().join("cdi"), "not a dir").expect("file");
        let a = r.prepare(&["c1"]).await;
        assert!(a.claims["uid-c1"].error.contains("CDI spec"), "{a:?}");
        assert_eq!(r.manager.count(Method::Delete), 1);
        assert!(r.manager.allocations().is_empty());

        // Step 4, the checkpoint, cannot be written: the spec and the
        // allocation go.
        let r = rig();
        std::fs::remove_dir(r.dir.path().join("plugin")).expect("rmdir");
        std::fs::write(r.dir.path().join("plugin"), "not a dir").expect("file");
        let a = r.prepare(&["c1"]).await;
        assert!(!a.claims["uid-c1"].error.is_empty());
        assert!(
            !r.spec_exists("c1"),
            "the spec written at step 3 is removed"
        );
        assert_eq!(r.manager.count(Method::Delete), 1);
        assert!(r.manager.allocations().is_empty());

        // No failure: everything stays.
        let r = rig();
        let a = r.prepare(&["c1"]).await;
        assert_eq!(a.claims["uid-c1"].error, "");
        assert!(r.spec_exists("c1"));
        assert_eq!(r.manager.allocations()[0].priority, 5);
        assert_eq!(r.manager.count(Method::Delete), 0);
    }

    /// Only a claim reserved for exactly one pod has a pod whose words
    /// apply; the words are read as the device plugin reads them.
    #[test]
    fn a_sole_consumer_pods_annotations_are_its_asks() {
        let with = |reserved: serde_json::Value| -> ResourceClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
                "spec": {"devices": {"requests": []}},
                "status": {"reservedFor": reserved},
            }))
            .expect("claim")
        };
        let pod =
            |n: &str| serde_json::json!({"resource": "pods", "name": n, "uid": format!("uid-{n}")});
        assert_eq!(
            sole_consumer(&with(serde_json::json!([pod("p")]))),
            Some(("p".into(), "uid-p".into()))
        );
        assert_eq!(
            sole_consumer(&with(serde_json::json!([pod("p"), pod("q")]))),
            None
        );
        assert_eq!(
            sole_consumer(&with(
                serde_json::json!([{"apiGroup": "batch", "resource": "pods", "name": "p", "uid": "u"}])
            )),
            None,
            "not core pods"
        );
        assert_eq!(sole_consumer(&with(serde_json::json!([]))), None);

        let a = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            pod_asks(
                &a(&[
                    (ANNOTATION_COMPUTE_POLICY, "guaranteed"),
                    (ANNOTATION_PRIORITY, "100")
                ]),
                "ns/p"
            ),
            Ok(PodAsks {
                pod: "ns/p".into(),
                guaranteed: true,
                priority: Some(100),
                ..PodAsks::default()
            })
        );
        assert_eq!(
            pod_asks(&a(&[(ANNOTATION_COMPUTE_POLICY, "burst")]), "ns/p"),
            Ok(PodAsks {
                pod: "ns/p".into(),
                ..PodAsks::default()
            })
        );
        let exact = tessera_node::exact::ANNOTATION_EXACT_LIMITS;
        assert_eq!(
            pod_asks(
                &a(&[(exact, r#"{"main":{"slices":1,"memoryMiB":3000}}"#)]),
                "ns/p"
            )
            .map(|p| p.exact.get("main").and_then(|e| e.memory_mib)),
            Ok(Some(3000)),
            "one container's exact limits"
        );
        assert_eq!(
            pod_asks(
                &a(&[(
                    exact,
                    r#"{"a":{"slices":1,"memoryMiB":3000},"b":{"slices":1}}"#
                )]),
                "ns/p"
            )
            .map(|p| p.exact.len()),
            Ok(2),
            "each container's, for crate::split to lay over the claim's requests"
        );
        let e = pod_asks(&a(&[(exact, "lots")]), "ns/p").expect_err("unreadable");
        assert!(e.contains("ns/p") && e.contains(exact), "{e}");
        let share = tessera_node::exact::ANNOTATION_EXACT_MEMORY_PERCENT;
        assert_eq!(
            pod_asks(
                &a(&[(share, r#"{"main":{"slices":3,"percent":30}}"#)]),
                "ns/p"
            )
            .map(|p| p.exact.get("main").and_then(|e| e.memory_ppm)),
            Ok(Some(300_000)),
            "one container's share of the card"
        );
        assert_eq!(
            pod_asks(
                &a(&[(
                    share,
                    r#"{"main":{"slices":3,"percent":33.3,"computePercent":33.3}}"#
                )]),
                "ns/p"
            )
            .map(|p| p.exact.get("main").and_then(|e| e.compute_ppm)),
            Ok(Some(333_000)),
            "a KAI fraction's share of the compute too"
        );
        for bad in [
            r#"{"main":{"slices":3,"percent":30,"computePercent":101}}"#,
            r#"{"main":{"slices":3,"percent":0}}"#,
            r#"{"main":{"slices":3,"percent":101}}"#,
            r#"{"main":{"slices":3,"percent":"thirty"}}"#,
        ] {
            let e = pod_asks(&a(&[(share, bad)]), "ns/p").expect_err(bad);
            assert!(e.contains("ns/p") && e.contains(share), "{e}");
        }
        assert_eq!(
            pod_asks(
                &a(&[
                    (ANNOTATION_COMPUTE_POLICY, "Guaranteed"),
                    (ANNOTATION_PRIORITY, "9999")
                ]),
                "ns/p"
            ),
            Ok(PodAsks {
                pod: "ns/p".into(),
                ..PodAsks::default()
            }),
            "values the webhook refuses are not asks"
        );
    }

    /// Claims as kube-scheduler writes them for a pod's `tessera.dev/vgpu`: no config,
    /// reserved for pod `pod-<claim>`, whose annotations depend on the claim's name.
    fn reserved() -> Api {
        Api {
            claim: |namespace, name| {
                serde_json::json!({
                    "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
                    "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "vgpu.tessera.dev"}}]}},
                    "status": {
                        "allocation": {"devices": {"results": [{"request": "r", "driver": "vgpu.tessera.dev",
                            "pool": "node-1", "device": slice_device("GPU-a", 0)}]}},
                        "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"), "uid": "pod-uid"}],
                    }
                })
            },
            pod: Box::new(reserved_pod),
        }
    }

    fn reserved_pod(name: &str, uid: &str) -> Result<Option<ConsumerPod>, String> {
        assert_eq!(uid, "pod-uid");
        let annotations = match name {
            "pod-capped" => Ok(Some(BTreeMap::from([
                (
                    ANNOTATION_COMPUTE_POLICY.to_owned(),
                    "guaranteed".to_owned(),
                ),
                (ANNOTATION_PRIORITY.to_owned(), "7".to_owned()),
            ]))),
            "pod-plain" => Ok(Some(BTreeMap::new())),
            "pod-not-a" => Ok(Some(BTreeMap::from([(
                tessera_contract::gpu_filter::ANNOTATION_GPU_UUIDS_EXCLUDE.to_owned(),
                "GPU-a".to_owned(),
            )]))),
            _ => Err(format!("cannot read pod ns/{name}: unreachable")),
        };
        Ok(annotations?.map(|annotations| ConsumerPod {
            annotations,
            extended: None,
        }))
    }

    /// A config-less claim takes its pod's policy and priority; a pod that cannot be
    /// read fails the prepare and leaves nothing.
    #[tokio::test(start_paused = true)]
    async fn a_config_less_claim_takes_its_pods_policy_and_priority() {
        let r = rig();
        let driver = r.with(reserved());
        let a = driver.prepare(vec![claim("capped")]).await;
        assert_eq!(a.claims["uid-capped"].error, "");
        let made = r.manager.allocations();
        assert_eq!(made.len(), 1);
        assert_eq!(made[0].policy(), mgr::ComputePolicy::Guaranteed);
        assert_eq!(made[0].priority, 7);

        let a = driver.prepare(vec![claim("plain")]).await;
        assert_eq!(a.claims["uid-plain"].error, "");
        let plain = r
            .manager
            .allocations()
            .into_iter()
            .find(|x| x.id == "dra-uid-plain")
            .expect("plain");
        assert_ne!(
            plain.policy(),
            mgr::ComputePolicy::Guaranteed,
            "the node's default"
        );
        assert_eq!(plain.priority, 0);

        let a = driver.prepare(vec![claim("hidden")]).await;
        assert!(
            a.claims["uid-hidden"]
                .error
                .contains("cannot read pod ns/pod-hidden"),
            "{a:?}"
        );
        assert_eq!(r.manager.allocations().len(), 2, "nothing made for it");

        // A slice of a GPU the pod excluded: refused, naming the annotation.
        let a = driver.prepare(vec![claim("not-a")]).await;
        let e = &a.claims["uid-not-a"].error;
        assert!(
            e.contains("tessera.dev/gpu-uuids-exclude") && e.contains("GPU-a"),
            "{a:?}"
        );
        assert_eq!(r.manager.allocations().len(), 2, "nothing made for it");
    }

    /// One failed claim does not undo another of the same call.
    #[tokio::test(start_paused = true)]
    async fn a_failed_claim_leaves_the_others_of_its_call() {
        let r = rig();
        r.manager
            .fail_next(Method::Resize, Status::invalid_argument("no"));
        let a = r.prepare(&["c1", "c22"]).await;
        assert!(!a.claims["uid-c1"].error.is_empty());
        assert_eq!(a.claims["uid-c22"].error, "");
        let ids: Vec<String> = r.manager.allocations().into_iter().map(|a| a.id).collect();
        assert_eq!(ids, ["dra-uid-c22"]);
        assert!(r.spec_exists("c22") && !r.spec_exists("c1"));
    }

    /// The node's status is read once per call, whatever the number of
    /// claims, and not at all when every claim is prepared already.
    #[tokio::test(start_paused = true)]
    async fn the_status_is_read_once_per_call() {
        let r = rig();
        let a = r.prepare(&["c1", "c22", "c333"]).await;
        assert!(a.claims.values().all(|c| c.error.is_empty()), "{a:?}");
        assert_eq!(r.manager.count(Method::Status), 1);
        let again = r.prepare(&["c1", "c22", "c333"]).await;
        assert_eq!(again, a, "the checkpoint answers");
        assert_eq!(r.manager.count(Method::Status), 1);
        assert_eq!(r.manager.count(Method::Create), 3);

        // An unreachable manager fails each claim that needs it, one read.
        let r = rig();
        r.manager
            .fail_next(Method::Status, Status::unavailable("down"));
        let a = r.prepare(&["c1", "c22"]).await;
        for c in a.claims.values() {
            assert!(c.error.contains("cannot reach the manager: down"), "{c:?}");
        }
        assert_eq!(r.manager.count(Method::Status), 1);
        assert_eq!(r.manager.count(Method::Create), 0);
    }

    /// kube-scheduler's claim for a pod of two containers that ask for
    /// `tessera.dev/vgpu` (DRAExtendedResource): a request per container (one
    /// slice for `a`, two for `b`), reserved for the pod, which maps each
    /// container to its request in its status and has exact limits for both.
    ///
    /// `mappings`: the (container, request) pairs of the pod's
    /// `requestMappings`; None: no `extendedResourceClaimStatus`.
    fn two_containers(mappings: Option<Vec<(&'static str, &'static str)>>) -> Api {
        Api {
            claim: two_containers_claim,
            pod: Box::new(move |name, uid| two_containers_pod(name, uid, mappings.as_deref())),
        }
    }

    const R0: &str = "container-0-request-0";
    const R1: &str = "container-1-request-0";

    fn two_containers_claim(namespace: &str, name: &str) -> serde_json::Value {
        let result = |request: &str, n: u32| {
            serde_json::json!({"request": request, "driver": "vgpu.tessera.dev",
                "pool": "node-1", "device": slice_device("GPU-a", n)})
        };
        serde_json::json!({
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
            "spec": {"devices": {"requests": [
                {"name": R0, "exactly": {"deviceClassName": "vgpu.tessera.dev", "count": 1}},
                {"name": R1, "exactly": {"deviceClassName": "vgpu.tessera.dev", "count": 2}}]}},
            "status": {
                "allocation": {"devices": {"results": [result(R0, 0), result(R1, 1), result(R1, 2)]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
            }
        })
    }

    fn two_containers_pod(
        name: &str,
        uid: &str,
        mappings: Option<&[(&'static str, &'static str)]>,
    ) -> Result<Option<ConsumerPod>, String> {
        assert_eq!((name, uid), ("p", "pod-uid"));
        let extended = mappings.map(|m| {
            serde_json::from_value(serde_json::json!({
                "resourceClaimName": "two",
                "requestMappings": m.iter().map(|(c, r)| serde_json::json!(
                    {"containerName": c, "resourceName": "tessera.dev/vgpu", "requestName": r}
                )).collect::<Vec<_>>(),
            }))
            .expect("status")
        });
        Ok(Some(ConsumerPod {
            annotations: BTreeMap::from([(
                tessera_node::exact::ANNOTATION_EXACT_LIMITS.to_owned(),
                r#"{"a":{"slices":1,"memoryMiB":3000},"b":{"slices":2,"memoryMiB":5000}}"#
                    .to_owned(),
            )]),
            extended,
        }))
    }

    impl Rig {
        fn alloc(&self, id: &str) -> Option<mgr::Allocation> {
            self.manager.allocations().into_iter().find(|a| a.id == id)
        }
    }

    fn mapped() -> Api {
        two_containers(Some(vec![("a", R0), ("b", R1)]))
    }

    /// Each container's request is an allocation of its own with that container's exact
    /// limits over its slices, and its own CDI device, answered on its request's devices
    /// only; prepared twice it is answered the same; unprepared, all of it goes.
    #[tokio::test(start_paused = true)]
    async fn a_pods_claim_is_an_allocation_per_container_with_its_own_limits() {
        let r = rig();
        let driver = r.with(mapped());
        let a = driver.prepare(vec![claim("two")]).await;
        let got = &a.claims["uid-two"];
        assert_eq!(got.error, "");
        let one = r.alloc("dra-uid-two-1").expect("a's allocation");
        let two = r.alloc("dra-uid-two-2").expect("b's allocation");
        assert_eq!(
            r.manager.allocations().len(),
            2,
            "no whole-claim allocation"
        );
        // 4 GiB slices, 4 to the 16 GiB GPU: a's one slice lowered to 3000 MiB, b's two
        // to 5000 MiB; compute stays the slices'.
        assert_eq!(one.devices[0].slices, 1);
        assert_eq!(one.devices[0].memory_limit_bytes, 3000 << 20);
        assert_eq!(one.devices[0].compute_share_ppm, 250_000);
        assert_eq!(two.devices[0].slices, 2);
        assert_eq!(two.devices[0].memory_limit_bytes, 5000 << 20);
        assert_eq!(two.devices[0].compute_share_ppm, 500_000);
        assert_eq!(one.device_ids, ["GPU-a::0"]);
        assert_eq!(two.device_ids, ["GPU-a::1", "GPU-a::2"]);
        assert_eq!(one.labels[CLAIM_UID_LABEL], "uid-two");
        assert_eq!(two.labels[REQUEST_LABEL], R1);

        // Each request's first device carries its own allocation's CDI device.
        let ids: Vec<(&str, &[String])> = got
            .devices
            .iter()
            .map(|d| (d.request_names[0].as_str(), d.cdi_device_ids.as_slice()))
            .collect();
        assert_eq!(
            ids,
            [
                (R0, &["vgpu.tessera.dev/claim=uid-two_1".to_owned()][..]),
                (R1, &["vgpu.tessera.dev/claim=uid-two_2".to_owned()][..]),
                (R1, &[][..]),
            ]
        );
        // One spec file, a device per allocation.
        let spec: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(cdi::spec_path(&r.dir.path().join("cdi"), "uid-two"))
                .expect("spec"),
        )
        .expect("JSON");
        for (device, alloc) in [
            ("uid-two_1", "dra-uid-two-1"),
            ("uid-two_2", "dra-uid-two-2"),
        ] {
            let env = cdi::host_env(&spec, device).expect(device);
            assert!(
                env.iter()
                    .any(|(k, v)| k == "TESSERA_ALLOCATION" && v == alloc),
                "{device}: {env:?}"
            );
        }
        assert!(
            cdi::host_env(&spec, "uid-two").is_none(),
            "no whole-claim device"
        );

        let store = Store::open(&r.dir.path().join("plugin")).expect("store");
        assert_eq!(
            store.data.claims["uid-two"].allocations(),
            ["dra-uid-two-1", "dra-uid-two-2"]
        );
        let again = driver.prepare(vec![claim("two")]).await;
        assert_eq!(again, a, "the checkpoint answers");
        assert_eq!(r.manager.count(Method::Create), 2);

        let gone = driver.unprepare(vec![claim("two")]).await;
        assert_eq!(gone.claims["uid-two"].error, "");
        assert!(r.manager.allocations().is_empty());
        assert!(!r.spec_exists("two"));
        assert_eq!(r.manager.count(Method::List), 0, "the record named them");
        let store = Store::open(&r.dir.path().join("plugin")).expect("store");
        assert!(store.data.claims.is_empty());

        // Swapped in the pod's status, the limits follow the mapping: each is for the
        // other's slice count, so neither applies and both keep their slices'.
        let r = rig();
        let driver = r.with(two_containers(Some(vec![("b", R0), ("a", R1)])));
        let a = driver.prepare(vec![claim("two")]).await;
        assert_eq!(a.claims["uid-two"].error, "");
        let one = r.alloc("dra-uid-two-1").expect("b's");
        let two = r.alloc("dra-uid-two-2").expect("a's");
        assert_eq!(one.devices[0].memory_limit_bytes, 4 * GI);
        assert_eq!(two.devices[0].memory_limit_bytes, 8 * GI);
    }

    /// A mapping that cannot be kube-scheduler's fails the prepare naming the pod and
    /// the field, and makes nothing; a pod without the status keeps one allocation on
    /// its slices.
    #[tokio::test(start_paused = true)]
    async fn a_bad_mapping_fails_and_no_status_keeps_one_allocation() {
        for mappings in [
            vec![("a", R0), ("b", "container-9-request-0")],
            vec![("a", R0), ("b", R0)],
        ] {
            let r = rig();
            let driver = r.with(two_containers(Some(mappings.clone())));
            let a = driver.prepare(vec![claim("two")]).await;
            let e = &a.claims["uid-two"].error;
            assert!(
                e.contains("pod ns/p") && e.contains(split::FIELD),
                "{mappings:?}: {e}"
            );
            assert!(r.manager.allocations().is_empty());
            assert!(!r.spec_exists("two"));
        }

        let r = rig();
        let driver = r.with(two_containers(None));
        let a = driver.prepare(vec![claim("two")]).await;
        assert_eq!(a.claims["uid-two"].error, "");
        let made = r.manager.allocations();
        assert_eq!(made.len(), 1);
        assert_eq!(made[0].id, "dra-uid-two");
        assert_eq!(made[0].devices[0].memory_limit_bytes, 12 * GI);
        assert!(!made[0].labels.contains_key(CLAIM_UID_LABEL));
        let ids: Vec<&[String]> = a.claims["uid-two"]
            .devices
            .iter()
            .map(|d| d.cdi_device_ids.as_slice())
            .collect();
        let own = ["vgpu.tessera.dev/claim=uid-two".to_owned()];
        assert_eq!(ids, [&own[..], &own[..], &[][..]]);
    }

    /// A later part's failure undoes the parts before it.
    #[tokio::test(start_paused = true)]
    async fn a_failed_part_undoes_the_parts_before_it() {
        let r = rig();
        // Another allocation holds the second part's id: its create is refused.
        r.manager.insert(mgr::Allocation {
            id: "dra-uid-two-2".into(),
            ..Default::default()
        });
        let driver = r.with(mapped());
        let a = driver.prepare(vec![claim("two")]).await;
        assert!(
            a.claims["uid-two"].error.contains("refused the allocation"),
            "{a:?}"
        );
        assert_eq!(
            r.manager.calls().last(),
            Some(&(Method::Delete, "dra-uid-two-1".to_owned()))
        );
        let left: Vec<String> = r.manager.allocations().into_iter().map(|a| a.id).collect();
        assert_eq!(left, ["dra-uid-two-2"], "only the one it did not make");
        assert!(!r.spec_exists("two"));
    }

    /// A claim the checkpoint never recorded (the plugin died after its allocations)
    /// is unprepared whole: its parts are found by their label and id, and nothing
    /// else is touched.
    #[tokio::test(start_paused = true)]
    async fn an_unrecorded_claims_parts_are_found_and_deleted() {
        let r = rig();
        let labelled = |id: &str, uid: &str| mgr::Allocation {
            id: id.into(),
            labels: [
                (SOURCE.to_owned(), SOURCE_DRA_PLUGIN.to_owned()),
                (CLAIM_UID_LABEL.to_owned(), uid.to_owned()),
            ]
            .into(),
            ..Default::default()
        };
        r.manager.insert(labelled("dra-uid-two-1", "uid-two"));
        r.manager.insert(labelled("dra-uid-two-2", "uid-two"));
        // Not its parts: another claim's label, no label, another id.
        r.manager.insert(labelled("dra-uid-two-3", "uid-other"));
        r.manager.insert(mgr::Allocation {
            id: "dra-uid-two-4".into(),
            ..Default::default()
        });
        r.manager.insert(labelled("run-7", "uid-two"));
        let gone = r.driver.unprepare(vec![claim("two")]).await;
        assert_eq!(gone.claims["uid-two"].error, "");
        let mut left: Vec<String> = r.manager.allocations().into_iter().map(|a| a.id).collect();
        left.sort();
        assert_eq!(left, ["dra-uid-two-3", "dra-uid-two-4", "run-7"]);
    }
}
