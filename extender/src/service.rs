//! The extender's three verbs over the watched view (`cache`): what they
//! read, the decisions of `view` (slice pods) and `dra` (pods with
//! ResourceClaims of the driver), and what bind writes (the assignment on
//! the pod, then the Binding).
//!
//! Filter and prioritize read the view as it is: they never wait on the API
//! server. Bind reads the pod afresh (one GET), then decides on the view once
//! it has caught up with everything the extender has seen (see `cache`), one
//! bind at a time, and answers once the view holds its own write: two pods
//! bound to one node back to back each see the other's slices taken.
//!
//! Pods with neither slices nor a claim of the driver are not the extender's:
//! every candidate passes filter, scores 0, and bind only binds (the chart
//! sends the extender every pod of its scheduler when DRA is on, since the
//! scheduler's `managedResources` cannot select pods by their claims).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tessera_contract::labels::ANNOTATION_GPU_ASSIGNMENT;
use tessera_placement::Policy;
use tokio::sync::Mutex;

use crate::cache::{Cache, Kind, ViewError};
use crate::dra::{self, DraError, DraNeed, DraNode};
use crate::view::{self, NodeFacts, NodeState, PodError, PodNeed};
use crate::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
    NodeList,
};

/// How the extender decides.
#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: Policy,
    /// A node whose GPU report is older than this is unknown.
    pub node_deadline: Duration,
    /// How long a bind waits for the view to catch up with what the
    /// extender has seen before it is refused.
    pub view_wait: Duration,
    /// The DRA driver whose claims the extender scores, and whose
    /// ResourceSlices and claims it watches (None: DRA off).
    pub dra_driver: Option<String>,
}

/// A verb that could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("malformed request body: {0}")]
    BadJson(String),
    #[error(transparent)]
    Pod(#[from] PodError),
    #[error(transparent)]
    Dra(#[from] DraError),
    #[error(transparent)]
    View(#[from] ViewError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("pod {0} not found")]
    PodGone(String),
    #[error("node {0} not found in the extender's view")]
    NodeUnknown(String),
    #[error("pod {pod} changed: its UID is {now:?}, the scheduler asked to bind {asked:?}")]
    PodChanged {
        pod: String,
        now: String,
        asked: String,
    },
    #[error("pod {pod} is already bound to {node}")]
    AlreadyBound { pod: String, node: String },
    #[error("node {node} cannot hold pod {pod}: {why}")]
    NoFit {
        node: String,
        pod: String,
        why: String,
    },
}

/// What a pod asks of the extender.
enum Need {
    /// Slices (`tessera.dev/vgpu`), and maybe claims of the driver too.
    Slices(PodNeed, Option<DraNeed>),
    /// Claims of the driver only.
    Dra(DraNeed),
    /// Nothing of Tessera's.
    Other,
}

/// Wall-clock seconds on tokio's clock: the wall clock when the extender
/// started plus tokio's time since (paused and advanced in tests). Node
/// reports carry wall-clock times.
struct Clock {
    epoch: Duration,
    start: tokio::time::Instant,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            epoch: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            start: tokio::time::Instant::now(),
        }
    }

    fn now_s(&self) -> u64 {
        (self.epoch + self.start.elapsed()).as_secs()
    }
}

/// The extender: a Kubernetes client, its settings and its watched view.
pub struct Extender {
    client: kube::Client,
    settings: Settings,
    cache: Cache,
    clock: Clock,
    binding: Mutex<()>,
}

fn parse<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ServiceError> {
    serde_json::from_slice(body).map_err(|e| ServiceError::BadJson(e.to_string()))
}

fn merge_failed(into: &mut BTreeMap<String, String>, more: BTreeMap<String, String>) {
    into.extend(more);
}

impl Extender {
    /// Starts the extender's watches on the current tokio runtime; its view
    /// fills as they list.
    pub fn start(client: kube::Client, settings: Settings) -> Extender {
        let cache = Cache::start(client.clone(), settings.dra_driver.clone());
        Extender {
            client,
            settings,
            cache,
            clock: Clock::new(),
            binding: Mutex::new(()),
        }
    }

    /// The watched view.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Waits, up to `within`, until every kind watched has been listed.
    pub async fn synced(&self, within: Duration) -> Result<(), ViewError> {
        let deadline = tokio::time::Instant::now() + within;
        for k in Kind::ALL {
            if matches!(k, Kind::ResourceSlices | Kind::ResourceClaims)
                && self.cache.driver().is_none()
            {
                continue;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            self.cache.reach(k, 0, left).await?;
        }
        Ok(())
    }

    /// What `pod` asks: slices, claims of the driver (read from the view),
    /// or nothing of Tessera's.
    fn need(&self, pod: &Pod) -> Result<Need, ServiceError> {
        let slices = match PodNeed::of(pod) {
            Ok(n) => Some(n),
            Err(PodError::NoRequest(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let has_claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty());
        let dra = match self.cache.driver() {
            Some(driver) if has_claims => {
                self.cache.ready(&[Kind::ResourceClaims])?;
                dra::need_of(pod, driver, |ns, name| self.cache.claim(ns, name))?
            }
            _ => None,
        };
        Ok(match (slices, dra) {
            (Some(s), d) => Need::Slices(s, d),
            (None, Some(d)) => Need::Dra(d),
            (None, None) => Need::Other,
        })
    }

    /// Records the versions of the objects the scheduler sent.
    fn saw_args(&self, args: &ExtenderArgs) {
        self.cache
            .saw(Kind::Pods, args.pod.metadata.resource_version.as_deref());
        for n in args.nodes.iter().flat_map(|l| l.items.iter()) {
            self.cache
                .saw(Kind::Nodes, n.metadata.resource_version.as_deref());
        }
    }

    /// Every candidate's slice state: annotations from the nodes the
    /// scheduler sent when it sent them (its cache is as fresh as ours),
    /// else from the view; the assignments held there but `pod`'s own.
    fn slice_states(
        &self,
        args: &ExtenderArgs,
        pod: &str,
    ) -> BTreeMap<String, Result<NodeState, String>> {
        let now = self.clock.now_s();
        let deadline = self.settings.node_deadline.as_secs();
        let sent: BTreeMap<&str, &Node> = args
            .nodes
            .iter()
            .flat_map(|l| l.items.iter())
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
            .collect();
        let mut out = BTreeMap::new();
        for name in args.names() {
            let cached = self.cache.node(&name);
            let annotations = match sent.get(name.as_str()) {
                Some(n) => n.metadata.annotations.as_ref(),
                None => cached
                    .as_ref()
                    .and_then(|n| n.metadata.annotations.as_ref()),
            };
            if annotations.is_none() && cached.is_none() {
                out.insert(
                    name.clone(),
                    Err("the extender has not seen this node".into()),
                );
                continue;
            }
            let held = self.cache.assigned_on(&name, pod);
            let facts = NodeFacts {
                annotations,
                assigned: held.iter().map(|(k, a)| (k.as_str(), a)).collect(),
            };
            out.insert(name.clone(), view::node_state(&name, &facts, now, deadline));
        }
        out
    }

    /// The candidates only DRA serves (no device plugin's report, the
    /// driver's ResourceSlices), with their GPUs: where a pod's
    /// `tessera.dev/vgpu` is DRA's to allocate (`DRAExtendedResource`).
    fn served_by_dra(&self, names: &[String]) -> BTreeMap<String, Result<DraNode, String>> {
        if self.cache.driver().is_none()
            || self
                .cache
                .ready(&[Kind::ResourceSlices, Kind::ResourceClaims])
                .is_err()
        {
            return BTreeMap::new();
        }
        names
            .iter()
            .filter(|n| {
                self.cache.node(n).is_some_and(|node| {
                    node.metadata
                        .annotations
                        .as_ref()
                        .is_none_or(|a| !a.contains_key(tessera_contract::labels::NODE_GPU_REPORT))
                })
            })
            .filter_map(|n| Some((n.clone(), Ok(self.cache.dra_node(n).ok()?))))
            .collect()
    }

    /// Every candidate's GPUs as its ResourceSlices publish them.
    fn dra_states(&self, names: &[String]) -> BTreeMap<String, Result<DraNode, String>> {
        names
            .iter()
            .map(|n| (n.clone(), self.cache.dra_node(n)))
            .collect()
    }

    /// The filter verb.
    pub async fn filter(&self, body: &[u8]) -> Result<ExtenderFilterResult, ServiceError> {
        let args: ExtenderArgs = parse(body)?;
        self.saw_args(&args);
        let names = args.names();
        let pod = view::pod_key(&args.pod);
        let (pass, failed) = match self.need(&args.pod)? {
            Need::Other => (names.clone(), BTreeMap::new()),
            Need::Slices(need, dra) => {
                self.cache.ready(&Kind::SLICE_PODS)?;
                let states = self.slice_states(&args, &pod);
                let (mut pass, mut failed) = view::filter(&names, &states, &need);
                let by_dra = self.served_by_dra(&names);
                if !by_dra.is_empty() {
                    let as_dra = dra::from_slices(&need);
                    let only: Vec<String> = by_dra.keys().cloned().collect();
                    let (more, why) = dra::filter(&only, &by_dra, &as_dra);
                    for name in more.iter().chain(why.keys()) {
                        failed.remove(name);
                    }
                    failed.extend(why);
                    pass = names
                        .iter()
                        .filter(|n| pass.contains(n) || more.contains(n))
                        .cloned()
                        .collect();
                }
                match dra {
                    None => (pass, failed),
                    Some(d) => {
                        self.cache.ready(&[Kind::ResourceSlices])?;
                        let (pass, more) = dra::filter(&pass, &self.dra_states(&pass), &d);
                        merge_failed(&mut failed, more);
                        (pass, failed)
                    }
                }
            }
            Need::Dra(d) => {
                self.cache
                    .ready(&[Kind::ResourceSlices, Kind::ResourceClaims])?;
                dra::filter(&names, &self.dra_states(&names), &d)
            }
        };
        tracing::debug!(%pod, pass = pass.len(), failed = failed.len(), "filter");
        let mut result = ExtenderFilterResult {
            failed_nodes: failed,
            ..Default::default()
        };
        if args.nodenames.is_some() {
            result.nodenames = Some(pass);
        } else {
            let items = args
                .nodes
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .filter(|n| n.metadata.name.as_ref().is_some_and(|m| pass.contains(m)))
                .collect();
            result.nodes = Some(NodeList { items });
        }
        Ok(result)
    }

    /// The prioritize verb.
    pub async fn prioritize(&self, body: &[u8]) -> Result<Vec<HostPriority>, ServiceError> {
        let args: ExtenderArgs = parse(body)?;
        self.saw_args(&args);
        let names = args.names();
        let pod = view::pod_key(&args.pod);
        Ok(match self.need(&args.pod)? {
            Need::Other => names
                .into_iter()
                .map(|host| HostPriority { host, score: 0 })
                .collect(),
            Need::Slices(need, _) => {
                self.cache.ready(&Kind::SLICE_PODS)?;
                let states = self.slice_states(&args, &pod);
                let mut scores = view::prioritize(
                    &names,
                    &states,
                    &need,
                    self.settings.policy,
                    &self.cache.live_slices(),
                );
                let by_dra = self.served_by_dra(&names);
                if !by_dra.is_empty() {
                    // Each family ranked on its own scale (10 for its best).
                    let as_dra = dra::from_slices(&need);
                    let dra_scores =
                        dra::prioritize(&names, &by_dra, &as_dra, self.settings.policy);
                    for (s, d) in scores.iter_mut().zip(dra_scores) {
                        s.score = s.score.max(d.score);
                    }
                }
                scores
            }
            Need::Dra(d) => {
                self.cache
                    .ready(&[Kind::ResourceSlices, Kind::ResourceClaims])?;
                dra::prioritize(&names, &self.dra_states(&names), &d, self.settings.policy)
            }
        })
    }

    /// The bind verb: the pod must be the one the scheduler placed (same
    /// UID, not bound yet, as read now) and, for a slice pod, still fit the
    /// node in the view once it has caught up with what the extender has
    /// seen; then its assignment is written (guarded by the pod's
    /// resourceVersion) and the Binding created. A pod with claims of the
    /// driver must bind where they are allocated (the scheduler's DRA
    /// allocator chose its devices). Nothing is written when a check fails.
    pub async fn bind(&self, body: &[u8]) -> Result<ExtenderBindingResult, ServiceError> {
        let args: ExtenderBindingArgs = parse(body)?;
        let id = format!("{}/{}", args.pod_namespace, args.pod_name);
        let _one_at_a_time = self.binding.lock().await;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &args.pod_namespace);
        let pod = pods
            .get_opt(&args.pod_name)
            .await?
            .ok_or_else(|| ServiceError::PodGone(id.clone()))?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if uid != args.pod_uid {
            return Err(ServiceError::PodChanged {
                pod: id,
                now: uid,
                asked: args.pod_uid,
            });
        }
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            return Err(ServiceError::AlreadyBound { pod: id, node });
        }
        self.cache
            .saw(Kind::Pods, pod.metadata.resource_version.as_deref());
        let no_fit = |why: String| ServiceError::NoFit {
            node: args.node.clone(),
            pod: id.clone(),
            why,
        };
        let wait = self.settings.view_wait;
        let mut wrote = None;
        match self.need(&pod)? {
            Need::Other => {}
            Need::Dra(d) => {
                self.cache.caught_up(&[Kind::ResourceClaims], wait).await?;
                // Read again on the view caught up.
                let d = match self.need(&pod)? {
                    Need::Dra(now) => now,
                    _ => d,
                };
                if let Some(p) = &d.pinned
                    && !p.contains(&args.node)
                {
                    let on: Vec<&str> = p.iter().map(String::as_str).collect();
                    return Err(no_fit(format!(
                        "its claims are allocated on {}",
                        on.join(", ")
                    )));
                }
            }
            // Served by DRA (the scheduler's allocator chose its devices
            // for the extended resource): nothing to assign.
            Need::Slices(..)
                if !self
                    .served_by_dra(std::slice::from_ref(&args.node))
                    .is_empty() => {}
            Need::Slices(need, _) => {
                self.cache.caught_up(&Kind::SLICE_PODS, wait).await?;
                let node = self
                    .cache
                    .node(&args.node)
                    .ok_or_else(|| ServiceError::NodeUnknown(args.node.clone()))?;
                let held = self.cache.assigned_on(&args.node, &id);
                let facts = NodeFacts {
                    annotations: node.metadata.annotations.as_ref(),
                    assigned: held.iter().map(|(k, a)| (k.as_str(), a)).collect(),
                };
                let state = view::node_state(
                    &args.node,
                    &facts,
                    self.clock.now_s(),
                    self.settings.node_deadline.as_secs(),
                )
                .map_err(no_fit)?;
                let chosen = view::choose(&state, &need, self.settings.policy).map_err(no_fit)?;
                let assignment = view::assignment(&args.node, chosen);
                let patch = serde_json::json!({
                    "metadata": {
                        "resourceVersion": pod.metadata.resource_version,
                        "annotations": { ANNOTATION_GPU_ASSIGNMENT: assignment.to_json() },
                    }
                });
                let patched = pods
                    .patch(
                        &args.pod_name,
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
                let rv = patched.metadata.resource_version;
                self.cache.saw(Kind::Pods, rv.as_deref());
                wrote = Some((assignment.to_json(), rv));
            }
        }
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(args.pod_name.clone()),
                namespace: Some(args.pod_namespace.clone()),
                uid: Some(uid),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(args.node.clone()),
                ..Default::default()
            },
        };
        let _: serde_json::Value = pods
            .create_subresource("binding", &args.pod_name, &PostParams::default(), &binding)
            .await?;
        match wrote {
            Some((assignment, rv)) => {
                // Answer once the view holds the assignment, so the
                // scheduler's next filter sees its slices taken. The bind is
                // done either way; the next bind waits for it regardless.
                let target = crate::cache::version(rv.as_deref()).unwrap_or(0);
                if let Err(e) = self.cache.reach(Kind::Pods, target, wait).await {
                    tracing::warn!(pod = %id, error = %e, "bound; the view does not show it yet");
                }
                tracing::info!(pod = %id, node = %args.node, %assignment, "bound");
            }
            None => tracing::info!(pod = %id, node = %args.node, "bound"),
        }
        Ok(ExtenderBindingResult::default())
    }
}
