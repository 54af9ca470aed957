//! The extender's three verbs over the API server: what they read (nodes'
//! GPU reports, the assignments of bound pods), the decisions of `view`,
//! and what bind writes (the assignment on the pod, then the Binding).
//!
//! Filter and prioritize read a view at most `refresh` old (the scheduler
//! calls them for every pod; bind checks again). Bind reads the pod and the
//! node afresh, one bind at a time, so two pods bound to one node back to
//! back each see the other's slices taken.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use tessera_contract::labels::ANNOTATION_GPU_ASSIGNMENT;
use tessera_node::scheduling::Assignment;
use tessera_placement::Policy;
use tokio::sync::Mutex;

use crate::view::{self, NodeFacts, NodeState, PodNeed};
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
    /// How stale filter's and prioritize's view may be.
    pub refresh: Duration,
}

/// A verb that could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("malformed request body: {0}")]
    BadJson(String),
    #[error(transparent)]
    Pod(#[from] view::PodError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("pod {0} not found")]
    PodGone(String),
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

/// What the cluster looked like at one moment.
#[derive(Debug, Default)]
struct Snapshot {
    node_annotations: BTreeMap<String, BTreeMap<String, String>>,
    /// Node → (pod `namespace/name`, its assignment).
    assigned: BTreeMap<String, Vec<(String, Assignment)>>,
    /// Slice counts of the containers of live assigned pods: the task mix.
    live_slices: Vec<u32>,
}

/// The extender: a Kubernetes client, its settings and its cached view.
pub struct Extender {
    client: kube::Client,
    settings: Settings,
    cache: Mutex<Option<(Instant, Arc<Snapshot>)>>,
    binding: Mutex<()>,
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

type Assigned = BTreeMap<String, Vec<(String, Assignment)>>;

fn pod_assignments(pods: &[Pod]) -> (Assigned, Vec<u32>) {
    let mut assigned = Assigned::new();
    let mut slices = Vec::new();
    for p in pods {
        if let Some((node, a)) = view::live_assignment(p) {
            slices.extend(a.containers.iter().map(|c| c.slices()));
            assigned
                .entry(node)
                .or_default()
                .push((view::pod_key(p), a));
        }
    }
    (assigned, slices)
}

fn pairs(v: Option<&Vec<(String, Assignment)>>) -> Vec<(&str, &Assignment)> {
    v.map(|v| v.iter().map(|(k, a)| (k.as_str(), a)).collect())
        .unwrap_or_default()
}

impl Extender {
    pub fn new(client: kube::Client, settings: Settings) -> Extender {
        Extender {
            client,
            settings,
            cache: Mutex::new(None),
            binding: Mutex::new(()),
        }
    }

    async fn snapshot(&self) -> Result<Arc<Snapshot>, ServiceError> {
        let mut cache = self.cache.lock().await;
        if let Some((at, snap)) = cache.as_ref()
            && at.elapsed() < self.settings.refresh
        {
            return Ok(snap.clone());
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::all(self.client.clone());
        let node_list = nodes.list(&ListParams::default()).await?;
        let pod_list = pods
            .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
            .await?;
        let (assigned, live_slices) = pod_assignments(&pod_list.items);
        let snap = Arc::new(Snapshot {
            node_annotations: node_list
                .items
                .into_iter()
                .filter_map(|n| {
                    Some((n.metadata.name?, n.metadata.annotations.unwrap_or_default()))
                })
                .collect(),
            assigned,
            live_slices,
        });
        *cache = Some((Instant::now(), snap.clone()));
        Ok(snap)
    }

    /// Every candidate's state: from the nodes the scheduler sent when it
    /// sent them (its cache is as fresh as ours), else from our view.
    fn states(
        &self,
        args: &ExtenderArgs,
        snap: &Snapshot,
    ) -> BTreeMap<String, Result<NodeState, String>> {
        let now = now_s();
        let deadline = self.settings.node_deadline.as_secs();
        let sent: BTreeMap<&str, &Node> = args
            .nodes
            .iter()
            .flat_map(|l| l.items.iter())
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
            .collect();
        let mut out = BTreeMap::new();
        for name in args.names() {
            let annotations = match sent.get(name.as_str()) {
                Some(n) => n.metadata.annotations.as_ref(),
                None => snap.node_annotations.get(&name),
            };
            if annotations.is_none() && !snap.node_annotations.contains_key(&name) {
                out.insert(
                    name.clone(),
                    Err("the extender has not seen this node".into()),
                );
                continue;
            }
            let facts = NodeFacts {
                annotations,
                assigned: pairs(snap.assigned.get(&name)),
            };
            out.insert(name.clone(), view::node_state(&name, &facts, now, deadline));
        }
        out
    }

    /// The filter verb.
    pub async fn filter(&self, body: &[u8]) -> Result<ExtenderFilterResult, ServiceError> {
        let args: ExtenderArgs =
            serde_json::from_slice(body).map_err(|e| ServiceError::BadJson(e.to_string()))?;
        let need = PodNeed::of(&args.pod)?;
        let snap = self.snapshot().await?;
        let states = self.states(&args, &snap);
        let (pass, failed) = view::filter(&args.names(), &states, &need);
        tracing::debug!(pod = %need.pod, pass = pass.len(), failed = failed.len(), "filter");
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
        let args: ExtenderArgs =
            serde_json::from_slice(body).map_err(|e| ServiceError::BadJson(e.to_string()))?;
        let need = PodNeed::of(&args.pod)?;
        let snap = self.snapshot().await?;
        let states = self.states(&args, &snap);
        Ok(view::prioritize(
            &args.names(),
            &states,
            &need,
            self.settings.policy,
            &snap.live_slices,
        ))
    }

    /// The bind verb: the pod must be the one the scheduler placed (same
    /// UID, not bound yet) and still fit the node as read now; then its
    /// assignment is written (guarded by the pod's resourceVersion) and the
    /// Binding created. Nothing is written when a check fails.
    pub async fn bind(&self, body: &[u8]) -> Result<ExtenderBindingResult, ServiceError> {
        let args: ExtenderBindingArgs =
            serde_json::from_slice(body).map_err(|e| ServiceError::BadJson(e.to_string()))?;
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
        let need = PodNeed::of(&pod)?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes.get(&args.node).await?;
        let all_pods: Api<Pod> = Api::all(self.client.clone());
        let on_node = all_pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", args.node)))
            .await?;
        let (assigned, _) = pod_assignments(&on_node.items);
        let facts = NodeFacts {
            annotations: node.metadata.annotations.as_ref(),
            assigned: pairs(assigned.get(&args.node)),
        };
        let no_fit = |why: String| ServiceError::NoFit {
            node: args.node.clone(),
            pod: id.clone(),
            why,
        };
        let state = view::node_state(
            &args.node,
            &facts,
            now_s(),
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
        pods.patch(
            &args.pod_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
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
        // The next filter sees this pod's slices taken.
        *self.cache.lock().await = None;
        tracing::info!(pod = %id, node = %args.node, assignment = %assignment.to_json(), "bound");
        Ok(ExtenderBindingResult::default())
    }
}
