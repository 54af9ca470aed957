//! Which pod is which: the plugin reads the kubelet's PodResources `List`,
//! tells the manager which pod and container each of its allocations serves
//! (`SetAllocationOwner`), and deletes allocations whose pods are gone.
//!
//! The plugin does this on the manager's behalf: it already speaks to the
//! kubelet and knows the resource name and device IDs, and the manager stays
//! free of kubelet APIs (it also serves allocations made outside Kubernetes,
//! which this loop never touches: only allocations labelled
//! `source=device-plugin` are considered).
//!
//! With the Kubernetes API on, the owner pod's `tessera.dev/compute-policy`
//! annotation goes along as the allocation's policy; the manager takes it
//! only when it is stricter than the node's. Its `tessera.dev/priority`
//! annotation (burst-time priority, -1000..=1000) is applied with
//! `ResizeAllocation`, and applied again whenever it changes: the pods are
//! read every pass for that, and the call is made only when the value
//! differs from the one last applied. A pod's memory limit and compute share
//! come from its slice count, lowered to its exact limits
//! (`tessera.dev/dropin-limits`, a translated pod's ask below whole slices)
//! where Allocate did not already (only ever lowered: see
//! [`plan_exact`]); the priority is the one live change a pod asks for.
//!
//! Everything here goes through traits (`PodResourcesApi`, `PodApi`, the
//! manager's `ManagerApi`); their real adapters, tonic and kube, are in
//! `edge`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use tessera_proto::manager::v1 as mgr;
use tessera_proto::podresources::v1 as pr;
use tonic::Status;

use crate::allocate::{SOURCE_DEVICE_PLUGIN, SOURCE_LABEL};
use crate::node_labels::NodeApiError;
use tessera_contract::Policy;
use tessera_node::exact::ExactLimit;
use tessera_node::manager::ManagerApi;

/// The pod annotation asking for a compute policy (`guaranteed` | `burst`).
pub use tessera_contract::labels::ANNOTATION_COMPUTE_POLICY;
/// The pod annotation giving the allocation's burst-time priority.
pub use tessera_contract::labels::ANNOTATION_PRIORITY;

/// Pods through the Kubernetes API, as far as annotations go.
pub trait PodApi: Send + Sync + 'static {
    fn annotations(
        &self,
        namespace: &str,
        pod: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, NodeApiError>> + Send;
}

/// The policy a pod's annotations ask for; UNSPECIFIED (the node's) when
/// there is none or the value is unknown (the webhook refuses unknown values
/// at admission, so one here predates it: logged, not fatal).
pub fn policy_from_annotations(
    annotations: &BTreeMap<String, String>,
    namespace: &str,
    pod: &str,
) -> mgr::ComputePolicy {
    policy_of(annotations).unwrap_or_else(|e| {
        tracing::warn!(%namespace, %pod, "{e}");
        mgr::ComputePolicy::Unspecified
    })
}

/// The policy the annotations ask for, or the one-line reason it is not
/// taken.
fn policy_of(annotations: &BTreeMap<String, String>) -> Result<mgr::ComputePolicy, String> {
    match annotations
        .get(ANNOTATION_COMPUTE_POLICY)
        .map(String::as_str)
    {
        None => Ok(mgr::ComputePolicy::Unspecified),
        Some(v) if Policy::parse(v) == Some(Policy::Guaranteed) => {
            Ok(mgr::ComputePolicy::Guaranteed)
        }
        Some(v) if Policy::parse(v) == Some(Policy::Burst) => Ok(mgr::ComputePolicy::Burst),
        Some(other) => Err(format!(
            "annotation {ANNOTATION_COMPUTE_POLICY}={other:?} is not \"guaranteed\" or \"burst\"; the node's policy applies"
        )),
    }
}

/// The priority a pod's annotations ask for: None without the annotation;
/// an error (one line) for a value that is not a whole number in
/// -1000..=1000 (the webhook refuses those at admission, but an annotation
/// can be changed after it), which leaves the priority as it is.
pub fn priority_from_annotations(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<i32>, String> {
    annotations
        .get(ANNOTATION_PRIORITY)
        .map(|v| {
            tessera_contract::labels::parse_priority(v)
                .map_err(|e| format!("{e}; the priority is left as it is"))
        })
        .transpose()
}

/// The kubelet's PodResources API as the plugin uses it.
pub(crate) trait PodResourcesApi: Send + Sync + 'static {
    fn list(&self) -> impl Future<Output = Result<pr::ListPodResourcesResponse, Status>> + Send;
}

/// A container that holds some of the resource's devices.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owner {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// What one pass decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `policy`: what the owner pod asks for; None when that is not known
    /// (no Kubernetes API, or the lookup failed), which sends UNSPECIFIED.
    SetOwner {
        id: String,
        owner: Owner,
        policy: Option<mgr::ComputePolicy>,
    },
    Delete {
        id: String,
    },
}

/// Remembers since when each allocation has had no pod, so that one is
/// deleted only after it stayed orphaned for the whole grace period (the
/// kubelet lists a container's devices shortly after Allocate, not before),
/// which allocations have their pod's policy settled (applied, not asked
/// for, or refused), so that a refusal is logged once, which priority was
/// last applied to each allocation, so that it is sent only when the pod's
/// annotation changes, and which bad annotation values were logged, so that
/// each is logged once.
#[derive(Debug)]
pub struct OrphanTracker {
    grace: Duration,
    since: HashMap<String, Instant>,
    settled: HashSet<String>,
    priority_applied: HashMap<String, i32>,
    warned: HashSet<(String, String, String)>,
}

impl OrphanTracker {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            since: HashMap::new(),
            settled: HashSet::new(),
            priority_applied: HashMap::new(),
            warned: HashSet::new(),
        }
    }

    /// The priority last applied (or found in force) for the allocation.
    pub fn priority_applied(&self, id: &str) -> Option<i32> {
        self.priority_applied.get(id).copied()
    }

    /// Whether the allocation's pod policy needs no more work.
    pub fn is_settled(&self, id: &str) -> bool {
        self.settled.contains(id)
    }
}

/// (namespace, pod) → the policy its annotations ask for; pods missing
/// here were not looked up, or the lookup failed.
pub type PodPolicies = HashMap<(String, String), mgr::ComputePolicy>;

/// (namespace, pod) → the priority its annotation asks for; pods missing
/// here ask for none, have a bad value, or were not read.
pub type PodPriorities = HashMap<(String, String), i32>;

fn is_ours(a: &mgr::Allocation) -> bool {
    a.labels.get(SOURCE_LABEL).map(String::as_str) == Some(SOURCE_DEVICE_PLUGIN)
}

/// The container holding most of the allocation's devices (normally all of
/// them; ties go to the first in name order).
fn owner_of(a: &mgr::Allocation, owners: &BTreeMap<String, Owner>) -> Option<Owner> {
    let mut votes: BTreeMap<&Owner, usize> = BTreeMap::new();
    for id in &a.device_ids {
        if let Some(o) = owners.get(id) {
            *votes.entry(o).or_default() += 1;
        }
    }
    votes
        .iter()
        .max_by(|x, y| x.1.cmp(y.1).then_with(|| y.0.cmp(x.0)))
        .map(|(o, _)| (*o).clone())
}

/// The pods whose annotations a pass reads: the owners of our
/// allocations, every pass, since a pod's priority annotation may change at
/// any time (one GET per pod with slices on the node per pass). A settled
/// policy is not sent again whatever is read.
pub fn pods_to_look_up(
    pods: &pr::ListPodResourcesResponse,
    allocations: &[mgr::Allocation],
    resource: &str,
) -> Vec<(String, String)> {
    let owners = owners(pods, resource);
    let mut want: Vec<(String, String)> = allocations
        .iter()
        .filter(|a| is_ours(a))
        .filter_map(|a| owner_of(a, &owners))
        .map(|o| (o.namespace, o.pod))
        .collect();
    want.sort();
    want.dedup();
    want
}

/// Device ID → the container holding it, for one resource.
pub fn owners(resp: &pr::ListPodResourcesResponse, resource: &str) -> BTreeMap<String, Owner> {
    let mut m = BTreeMap::new();
    for p in &resp.pod_resources {
        for c in &p.containers {
            for d in c.devices.iter().filter(|d| d.resource_name == resource) {
                for id in &d.device_ids {
                    m.insert(
                        id.clone(),
                        Owner {
                            namespace: p.namespace.clone(),
                            pod: p.name.clone(),
                            container: c.name.clone(),
                        },
                    );
                }
            }
        }
    }
    m
}

/// Decides one pass: pure, given the time and the pods' policies.
pub fn plan(
    pods: &pr::ListPodResourcesResponse,
    allocations: &[mgr::Allocation],
    resource: &str,
    policies: &PodPolicies,
    tracker: &mut OrphanTracker,
    now: Instant,
) -> Vec<Action> {
    let owners = owners(pods, resource);
    let mut actions = Vec::new();
    let mut live = Vec::new();
    for a in allocations.iter().filter(|a| is_ours(a)) {
        live.push(a.id.clone());
        match owner_of(a, &owners) {
            Some(owner) => {
                tracker.since.remove(&a.id);
                let current = Owner {
                    namespace: a.namespace.clone(),
                    pod: a.pod.clone(),
                    container: a.container.clone(),
                };
                let policy = if tracker.settled.contains(&a.id) {
                    None
                } else {
                    policies
                        .get(&(owner.namespace.clone(), owner.pod.clone()))
                        .copied()
                };
                // Nothing to ask of the manager for the policy: none asked
                // for, or already in force.
                let policy = match policy {
                    Some(p) if p == mgr::ComputePolicy::Unspecified || p as i32 == a.policy => {
                        tracker.settled.insert(a.id.clone());
                        None
                    }
                    p => p,
                };
                if current != owner || policy.is_some() {
                    actions.push(Action::SetOwner {
                        id: a.id.clone(),
                        owner,
                        policy,
                    });
                }
            }
            None => {
                let since = *tracker.since.entry(a.id.clone()).or_insert(now);
                if now.duration_since(since) >= tracker.grace {
                    actions.push(Action::Delete { id: a.id.clone() });
                }
            }
        }
    }
    tracker.since.retain(|id, _| live.contains(id));
    tracker.settled.retain(|id| live.contains(id));
    actions
}

/// The priorities to send, (allocation id, priority): for each of our
/// allocations whose owner pod asks for a priority that differs from the one
/// last applied to it and from the one the manager reports. A value equal to
/// the one last applied is not sent again even when the manager reports
/// another (set since with `tessera resize --priority`): the annotation is
/// applied when it changes, not held against an operator. A pod that drops
/// the annotation keeps the priority it has.
pub fn plan_priorities(
    pods: &pr::ListPodResourcesResponse,
    allocations: &[mgr::Allocation],
    resource: &str,
    priorities: &PodPriorities,
    tracker: &mut OrphanTracker,
) -> Vec<(String, i32)> {
    let owners = owners(pods, resource);
    let mut out = Vec::new();
    for a in allocations.iter().filter(|a| is_ours(a)) {
        let Some(o) = owner_of(a, &owners) else {
            continue;
        };
        let Some(&want) = priorities.get(&(o.namespace, o.pod)) else {
            continue;
        };
        if tracker.priority_applied(&a.id) == Some(want) {
            continue;
        }
        if a.priority == want {
            tracker.priority_applied.insert(a.id.clone(), want);
            continue;
        }
        out.push((a.id.clone(), want));
    }
    tracker
        .priority_applied
        .retain(|id, _| allocations.iter().any(|a| &a.id == id));
    out
}

/// (namespace, pod) → its containers' exact limits (`tessera.dev/dropin-limits`, a
/// translated pod's ask below its whole slices); pods missing here have none, an
/// unreadable value, or were not read.
pub type PodExact = HashMap<(String, String), BTreeMap<String, ExactLimit>>;

/// The limits to lower, (allocation id, its GPUs with the lowered values): for each of
/// our allocations whose owner container has exact limits below the allocation's. Only
/// ever lower: an allocation already at or below them is left, and a raise a tenant
/// writes into its pod after admission is no raise (`tessera_node::exact::cap`).
pub fn plan_exact(
    pods: &pr::ListPodResourcesResponse,
    allocations: &[mgr::Allocation],
    resource: &str,
    exact: &PodExact,
    cards: &tessera_node::exact::Cards,
) -> Vec<(String, Vec<mgr::DeviceRequest>)> {
    let owners = owners(pods, resource);
    let mut out = Vec::new();
    for a in allocations.iter().filter(|a| is_ours(a)) {
        let Some(o) = owner_of(a, &owners) else {
            continue;
        };
        let Some(e) = exact
            .get(&(o.namespace, o.pod))
            .and_then(|m| m.get(&o.container))
        else {
            continue;
        };
        let mut devices = a.devices.clone();
        if tessera_node::exact::cap(&mut devices, e, cards) && devices != a.devices {
            out.push((a.id.clone(), devices));
        }
    }
    out
}

/// Counts of what one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncReport {
    pub owners_set: usize,
    pub priorities_set: usize,
    /// Allocations lowered to their pod's exact limits.
    pub limits_lowered: usize,
    pub deleted: usize,
    pub failed: usize,
}

/// Logs a bad annotation value once per pod and value.
fn warn_once(tracker: &mut OrphanTracker, namespace: &str, pod: &str, message: String) {
    if tracker
        .warned
        .insert((namespace.to_owned(), pod.to_owned(), message.clone()))
    {
        tracing::warn!(%namespace, %pod, "{message}");
    }
}

/// Reads the annotations of `wanted` pods: the policy and the priority each
/// asks for. A failed lookup leaves the pod out (its owner is still
/// recorded, its annotations are read again next pass); a bad value is
/// logged once and ignored.
async fn look_up_annotations<A: PodApi>(
    api: &A,
    wanted: Vec<(String, String)>,
    tracker: &mut OrphanTracker,
) -> (PodPolicies, PodPriorities, PodExact) {
    let mut policies = PodPolicies::new();
    let mut priorities = PodPriorities::new();
    let mut exact = PodExact::new();
    tracker
        .warned
        .retain(|(ns, pod, _)| wanted.iter().any(|(n, p)| n == ns && p == pod));
    for (namespace, pod) in wanted {
        match api.annotations(&namespace, &pod).await {
            Ok(ann) => {
                let policy = policy_of(&ann).unwrap_or_else(|e| {
                    warn_once(tracker, &namespace, &pod, e);
                    mgr::ComputePolicy::Unspecified
                });
                match priority_from_annotations(&ann) {
                    Ok(Some(p)) => {
                        priorities.insert((namespace.clone(), pod.clone()), p);
                    }
                    Ok(None) => {}
                    Err(e) => warn_once(tracker, &namespace, &pod, e),
                }
                match tessera_node::exact::from_annotations(&ann) {
                    Ok(m) if m.is_empty() => {}
                    Ok(m) => {
                        exact.insert((namespace.clone(), pod.clone()), m);
                    }
                    Err(e) => warn_once(
                        tracker,
                        &namespace,
                        &pod,
                        format!("{e}; the pod keeps its slices' limits"),
                    ),
                }
                policies.insert((namespace, pod), policy);
            }
            Err(e) => {
                tracing::warn!(%namespace, %pod, error = %e, "cannot read the pod's annotations; its compute policy and priority are tried again next pass");
            }
        }
    }
    (policies, priorities, exact)
}

/// One pass: list, plan, apply. Nothing is deleted when either list fails.
/// `pod_api` is None without the Kubernetes API: every policy stays the
/// node's. `cards`: each GPU's memory as a pod's share of the card counts it
/// (`Snapshot::cards`).
pub(crate) async fn sync_once<M: ManagerApi, P: PodResourcesApi, A: PodApi>(
    manager: &M,
    pods: &P,
    pod_api: Option<&A>,
    resource: &str,
    tracker: &mut OrphanTracker,
    cards: &tessera_node::exact::Cards,
) -> Result<SyncReport, Status> {
    // The allocations first: each is then judged against a kubelet listing
    // taken after it existed. Listed the other way round, an Allocate that
    // landed between the two reads was an orphan of that pass, and with no
    // grace it was deleted (the drop-in test, once under load).
    let allocations = manager.list_allocations().await?;
    let listed = pods.list().await?;
    let (policies, priorities, exact) = match pod_api {
        Some(api) => {
            let wanted = pods_to_look_up(&listed, &allocations, resource);
            look_up_annotations(api, wanted, tracker).await
        }
        None => (PodPolicies::new(), PodPriorities::new(), PodExact::new()),
    };
    let mut report = SyncReport::default();
    for action in plan(
        &listed,
        &allocations,
        resource,
        &policies,
        tracker,
        Instant::now(),
    ) {
        match action {
            Action::SetOwner { id, owner, policy } => {
                let mut req = mgr::SetAllocationOwnerRequest {
                    id: id.clone(),
                    namespace: owner.namespace.clone(),
                    pod: owner.pod.clone(),
                    container: owner.container.clone(),
                    policy: policy.unwrap_or(mgr::ComputePolicy::Unspecified) as i32,
                };
                let mut res = manager.set_allocation_owner(req.clone()).await;
                if let Err(e) = &res
                    && e.code() == tonic::Code::FailedPrecondition
                    && policy.is_some()
                {
                    // Looser than the node's: the pod's ask is refused (once,
                    // the allocation is settled below) but its owner is
                    // still recorded.
                    tracing::warn!(%id, namespace = %owner.namespace, pod = %owner.pod, error = %e.message(), "the pod's compute policy is not applied");
                    tracker.settled.insert(id.clone());
                    req.policy = mgr::ComputePolicy::Unspecified as i32;
                    res = manager.set_allocation_owner(req).await;
                }
                match res {
                    Ok(_) => {
                        if policy.is_some() {
                            tracker.settled.insert(id.clone());
                        }
                        tracing::info!(%id, namespace = %owner.namespace, pod = %owner.pod, container = %owner.container, policy = ?policy, "allocation owner recorded");
                        report.owners_set += 1;
                    }
                    Err(e) => {
                        tracing::warn!(%id, error = %e.message(), "cannot record allocation owner");
                        report.failed += 1;
                    }
                }
            }
            Action::Delete { id } => match manager.delete_allocation(id.clone()).await {
                Ok(()) => {
                    tracing::info!(%id, "deleted allocation of a pod that is gone");
                    tracker.since.remove(&id);
                    report.deleted += 1;
                }
                Err(e) if e.code() == tonic::Code::NotFound => {
                    tracker.since.remove(&id);
                }
                Err(e) => {
                    tracing::warn!(%id, error = %e.message(), "cannot delete orphaned allocation");
                    report.failed += 1;
                }
            },
        }
    }
    // A translated pod's exact limits, where Allocate could not tell its pod (the kubelet
    // names devices, not pods): lowered once the kubelet names the owner. The manager
    // refuses a limit below what the allocation already holds; that is logged and tried
    // again each pass.
    for (id, devices) in plan_exact(&listed, &allocations, resource, &exact, cards) {
        let req = mgr::ResizeAllocationRequest {
            id: id.clone(),
            devices: devices.clone(),
            priority: None,
        };
        match manager.resize_allocation(req).await {
            Ok(_) => {
                tracing::info!(%id, limits = ?devices, "allocation lowered to its pod's exact limits");
                report.limits_lowered += 1;
            }
            Err(e) => {
                let pod = allocations
                    .iter()
                    .find(|a| a.id == id)
                    .map(|a| (a.namespace.clone(), a.pod.clone()))
                    .unwrap_or_default();
                warn_once(
                    tracker,
                    &pod.0,
                    &pod.1,
                    format!(
                        "cannot lower allocation {id} to the pod's exact limits: {}",
                        e.message()
                    ),
                );
                report.failed += 1;
            }
        }
    }
    for (id, priority) in plan_priorities(&listed, &allocations, resource, &priorities, tracker) {
        let req = mgr::ResizeAllocationRequest {
            id: id.clone(),
            devices: Vec::new(),
            priority: Some(priority),
        };
        match manager.resize_allocation(req).await {
            Ok(_) => {
                tracing::info!(%id, priority, "allocation priority set from the pod's annotation");
                tracker.priority_applied.insert(id, priority);
                report.priorities_set += 1;
            }
            Err(e) => {
                // A refusal (a manager without the call, a range it does
                // not take) is logged once, until the annotation changes;
                // anything else is tried again next pass.
                let refused = matches!(
                    e.code(),
                    tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                        | tonic::Code::Unimplemented
                        | tonic::Code::NotFound
                );
                tracing::warn!(%id, priority, error = %e.message(), retried = !refused, "cannot set the allocation's priority");
                if refused {
                    tracker.priority_applied.insert(id, priority);
                }
                report.failed += 1;
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_node::testing::{FakeManager, Method};

    const RES: &str = tessera_contract::labels::RESOURCE;

    fn pods(entries: &[(&str, &str, &str, &str, &[&str])]) -> pr::ListPodResourcesResponse {
        pr::ListPodResourcesResponse {
            pod_resources: entries
                .iter()
                .map(|(ns, pod, ctr, res, ids)| pr::PodResources {
                    name: (*pod).into(),
                    namespace: (*ns).into(),
                    containers: vec![pr::ContainerResources {
                        name: (*ctr).into(),
                        devices: vec![pr::ContainerDevices {
                            resource_name: (*res).into(),
                            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                            topology: None,
                        }],
                        ..Default::default()
                    }],
                })
                .collect(),
        }
    }

    fn alloc(id: &str, ids: &[&str], source: &str) -> mgr::Allocation {
        mgr::Allocation {
            id: id.into(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            labels: [(SOURCE_LABEL.to_owned(), source.to_owned())].into(),
            ..Default::default()
        }
    }

    /// A pod's exact limits lower its allocation, once its owner is known, and only its
    /// own container's, only ever down, only for its slice count.
    #[test]
    fn exact_limits_lower_the_owners_allocation_and_never_raise_it() {
        const GI: u64 = 1 << 30;
        let one_slice = |id: &str, dev: &str| {
            let mut a = alloc(id, &[dev], "device-plugin");
            a.devices = vec![mgr::DeviceRequest {
                gpu_uuid: "GPU-a".into(),
                memory_limit_bytes: 4 * GI,
                compute_share_ppm: 125_000,
                slices: 1,
            }];
            a
        };
        let allocations = vec![
            one_slice("a", "GPU-a::0"),
            one_slice("b", "GPU-a::1"),
            one_slice("c", "GPU-a::2"),
            one_slice("orphan", "GPU-a::3"),
            one_slice("d", "GPU-a::4"),
        ];
        let listed = pods(&[
            ("ns", "a", "cuda", RES, &["GPU-a::0"]),
            ("ns", "b", "cuda", RES, &["GPU-a::1"]),
            ("ns", "c", "cuda", RES, &["GPU-a::2"]),
            ("ns", "d", "cuda", RES, &["GPU-a::4"]),
        ]);
        // Eight 4 GiB slices: a share of the card is a share of 32 GiB.
        let cards = tessera_node::exact::Cards::from([("GPU-a".to_owned(), 32 * GI)]);
        let limits = |v: &str| {
            let ann = BTreeMap::from([(
                tessera_node::exact::ANNOTATION_EXACT_LIMITS.to_owned(),
                v.to_owned(),
            )]);
            tessera_node::exact::from_annotations(&ann).expect("parses")
        };
        let exact: PodExact = [
            // Its own container: lowered.
            (
                ("ns".to_owned(), "a".to_owned()),
                limits(r#"{"cuda":{"slices":1,"memoryMiB":3000,"computePercent":10}}"#),
            ),
            // A tenant's raise: nothing to do.
            (
                ("ns".to_owned(), "b".to_owned()),
                limits(r#"{"cuda":{"slices":1,"memoryMiB":65536,"computePercent":100}}"#),
            ),
            // Another container's words: not this allocation's.
            (
                ("ns".to_owned(), "c".to_owned()),
                limits(r#"{"other":{"slices":1,"memoryMiB":1000}}"#),
            ),
            // A share of the card: 10% of 32 GiB, 3276.8 MiB, in whole 2 MiB pages.
            (
                ("ns".to_owned(), "d".to_owned()),
                tessera_node::exact::from_annotations(&BTreeMap::from([(
                    tessera_node::exact::ANNOTATION_EXACT_MEMORY_PERCENT.to_owned(),
                    r#"{"cuda":{"slices":1,"percent":10}}"#.to_owned(),
                )]))
                .expect("parses"),
            ),
        ]
        .into();
        let plan = plan_exact(&listed, &allocations, RES, &exact, &cards);
        assert_eq!(plan.len(), 2, "{plan:?}");
        assert_eq!(plan[0].0, "a");
        assert_eq!(plan[0].1[0].memory_limit_bytes, 3000 << 20);
        assert_eq!(plan[0].1[0].compute_share_ppm, 100_000);
        assert_eq!(plan[1].0, "d");
        assert_eq!(plan[1].1[0].memory_limit_bytes, 3276 << 20);
        assert_eq!(plan[1].1[0].compute_share_ppm, 125_000);
        // Once lowered, the next pass has nothing to do.
        let mut lowered = allocations.clone();
        lowered[0].devices = plan[0].1.clone();
        lowered[4].devices = plan[1].1.clone();
        assert!(plan_exact(&listed, &lowered, RES, &exact, &cards).is_empty());
    }

    fn owner(ns: &str, pod: &str, ctr: &str) -> Owner {
        Owner {
            namespace: ns.into(),
            pod: pod.into(),
            container: ctr.into(),
        }
    }

    /// `plan` for our resource, no pod naming a compute policy.
    fn plan_at(
        p: &pr::ListPodResourcesResponse,
        allocs: &[mgr::Allocation],
        t: &mut OrphanTracker,
        now: Instant,
    ) -> Vec<Action> {
        plan(p, allocs, RES, &PodPolicies::new(), t, now)
    }

    #[test]
    fn owners_are_set_once_and_only_for_our_resource() {
        let p = pods(&[
            ("ns", "a", "main", RES, &["G::0", "G::1"]),
            ("ns", "b", "main", "nvidia.com/gpu", &["G::2"]),
        ]);
        let mut allocs = vec![
            alloc("x", &["G::0", "G::1"], "device-plugin"),
            alloc("y", &["G::2"], "device-plugin"),
        ];
        let mut t = OrphanTracker::new(Duration::from_secs(60));
        let now = Instant::now();
        let acts = plan_at(&p, &allocs, &mut t, now);
        assert_eq!(
            acts,
            vec![Action::SetOwner {
                id: "x".into(),
                owner: owner("ns", "a", "main"),
                policy: None,
            }],
            "y's device belongs to another resource: not an owner"
        );
        allocs[0].namespace = "ns".into();
        allocs[0].pod = "a".into();
        allocs[0].container = "main".into();
        assert!(
            plan_at(&p, &allocs, &mut t, now).is_empty(),
            "owner already recorded"
        );
    }

    #[test]
    fn orphans_are_deleted_after_the_grace_period_only() {
        let p = pods(&[]);
        let allocs = vec![
            alloc("gone", &["G::0"], "device-plugin"),
            alloc("cli", &["G::1"], "cli"),
        ];
        let mut t = OrphanTracker::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(plan_at(&p, &allocs, &mut t, t0).is_empty());
        assert!(plan_at(&p, &allocs, &mut t, t0 + Duration::from_secs(59)).is_empty());
        assert_eq!(
            plan_at(&p, &allocs, &mut t, t0 + Duration::from_secs(60)),
            vec![Action::Delete { id: "gone".into() }],
            "the CLI's allocation is never touched"
        );
    }

    #[test]
    fn an_orphan_that_finds_its_pod_is_kept() {
        let allocs = vec![alloc("x", &["G::0"], "device-plugin")];
        let mut t = OrphanTracker::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(plan_at(&pods(&[]), &allocs, &mut t, t0).is_empty());
        let with_pod = pods(&[("ns", "a", "c", RES, &["G::0"])]);
        assert_eq!(
            plan_at(&with_pod, &allocs, &mut t, t0 + Duration::from_secs(30)).len(),
            1
        );
        // Gone again: the clock restarts.
        assert!(plan_at(&pods(&[]), &allocs, &mut t, t0 + Duration::from_secs(70)).is_empty());
        assert!(plan_at(&pods(&[]), &allocs, &mut t, t0 + Duration::from_secs(129)).is_empty());
        assert_eq!(
            plan_at(&pods(&[]), &allocs, &mut t, t0 + Duration::from_secs(130)).len(),
            1
        );
    }

    fn annotated(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(ANNOTATION_COMPUTE_POLICY.to_owned(), value.to_owned())])
    }

    #[test]
    fn annotations_name_the_policy() {
        assert_eq!(
            policy_from_annotations(&annotated("guaranteed"), "ns", "p"),
            mgr::ComputePolicy::Guaranteed
        );
        assert_eq!(
            policy_from_annotations(&annotated("burst"), "ns", "p"),
            mgr::ComputePolicy::Burst
        );
        assert_eq!(
            policy_from_annotations(&BTreeMap::new(), "ns", "p"),
            mgr::ComputePolicy::Unspecified,
            "no annotation: the node's policy"
        );
        for bad in ["fair", "Guaranteed", ""] {
            assert_eq!(
                policy_from_annotations(&annotated(bad), "ns", "p"),
                mgr::ComputePolicy::Unspecified,
                "unknown value {bad:?}: the node's policy"
            );
        }
    }

    fn policies(entries: &[(&str, &str, mgr::ComputePolicy)]) -> PodPolicies {
        entries
            .iter()
            .map(|(ns, pod, p)| (((*ns).to_owned(), (*pod).to_owned()), *p))
            .collect()
    }

    #[test]
    fn a_pod_policy_goes_with_its_owner_until_settled() {
        let p = pods(&[("ns", "a", "main", RES, &["G::0"])]);
        let mut x = alloc("x", &["G::0"], "device-plugin");
        x.policy = mgr::ComputePolicy::Burst as i32;
        let mut t = OrphanTracker::new(Duration::from_secs(60));
        let now = Instant::now();
        assert_eq!(
            pods_to_look_up(&p, std::slice::from_ref(&x), RES),
            vec![("ns".to_owned(), "a".to_owned())]
        );
        // The lookup failed: the owner is recorded all the same.
        assert_eq!(
            plan_at(&p, std::slice::from_ref(&x), &mut t, now),
            vec![Action::SetOwner {
                id: "x".into(),
                owner: owner("ns", "a", "main"),
                policy: None,
            }]
        );
        x.namespace = "ns".into();
        x.pod = "a".into();
        x.container = "main".into();
        // Next pass the lookup works: the policy alone is sent.
        let g = policies(&[("ns", "a", mgr::ComputePolicy::Guaranteed)]);
        assert_eq!(
            plan(&p, std::slice::from_ref(&x), RES, &g, &mut t, now),
            vec![Action::SetOwner {
                id: "x".into(),
                owner: owner("ns", "a", "main"),
                policy: Some(mgr::ComputePolicy::Guaranteed),
            }]
        );
        // Once in force there is nothing left to do or look up.
        x.policy = mgr::ComputePolicy::Guaranteed as i32;
        assert!(plan(&p, std::slice::from_ref(&x), RES, &g, &mut t, now).is_empty());
        assert!(t.is_settled("x"));
        assert_eq!(
            pods_to_look_up(&p, std::slice::from_ref(&x), RES),
            vec![("ns".to_owned(), "a".to_owned())],
            "still read every pass: its priority may change"
        );
    }

    #[test]
    fn an_unannotated_pod_settles_without_a_call() {
        let p = pods(&[("ns", "a", "main", RES, &["G::0"])]);
        let mut x = alloc("x", &["G::0"], "device-plugin");
        x.namespace = "ns".into();
        x.pod = "a".into();
        x.container = "main".into();
        let mut t = OrphanTracker::new(Duration::from_secs(60));
        let none = policies(&[("ns", "a", mgr::ComputePolicy::Unspecified)]);
        assert!(
            plan(
                &p,
                std::slice::from_ref(&x),
                RES,
                &none,
                &mut t,
                Instant::now()
            )
            .is_empty()
        );
        assert!(t.is_settled("x"), "no policy asked for: none is sent");
    }

    /// The ids the plugin sent ResizeAllocation for, in order.
    fn resized(m: &FakeManager) -> Vec<String> {
        m.calls()
            .into_iter()
            .filter(|(method, _)| *method == Method::Resize)
            .map(|(_, id)| id)
            .collect()
    }

    /// The priority allocation `id` has now.
    fn priority(m: &FakeManager, id: &str) -> i32 {
        m.allocations()
            .into_iter()
            .find(|a| a.id == id)
            .expect("allocation")
            .priority
    }

    struct StaticPods(pr::ListPodResourcesResponse);

    /// A kubelet whose listing is taken just before an Allocate lands: the
    /// allocation is made, and its pod registered, right after the list.
    struct AllocatedAfterListing(
        std::sync::Arc<FakeManager>,
        std::sync::Mutex<pr::ListPodResourcesResponse>,
    );

    impl PodResourcesApi for AllocatedAfterListing {
        async fn list(&self) -> Result<pr::ListPodResourcesResponse, Status> {
            let mut next = self.1.lock().expect("listing");
            let now = next.clone();
            if self.0.allocations().is_empty() {
                self.0.insert(alloc("new", &["G::0"], "device-plugin"));
                *next = pods(&[("ns", "a", "main", RES, &["G::0"])]);
            }
            Ok(now)
        }
    }

    /// With no grace, an allocation made between a pass's two reads is no
    /// orphan of that pass: the allocations are listed before the pods.
    #[tokio::test(start_paused = true)]
    async fn an_allocation_made_during_a_pass_is_not_its_orphan() {
        let m = std::sync::Arc::new(FakeManager::default());
        let kubelet = AllocatedAfterListing(m.clone(), std::sync::Mutex::new(pods(&[])));
        let mut t = OrphanTracker::new(Duration::ZERO);
        let api = Annotations::default();
        for _ in 0..3 {
            sync_once(&*m, &kubelet, Some(&api), RES, &mut t, &Default::default())
                .await
                .expect("pass");
        }
        let all = m.allocations();
        assert_eq!(all.len(), 1, "the allocation is kept: {all:?}");
        assert_eq!(all[0].pod, "a", "and its owner recorded");
        assert_eq!(m.count(Method::Delete), 0);
    }

    impl PodResourcesApi for StaticPods {
        async fn list(&self) -> Result<pr::ListPodResourcesResponse, Status> {
            Ok(self.0.clone())
        }
    }

    /// Pods' annotations as the Kubernetes API would give them. Kept here,
    /// not `crate::testing::FakePods`: that double implements this module's
    /// trait, so using it from this module's tests would tie the two both
    /// ways (issue 35: no import circle).
    #[derive(Default)]
    struct Annotations(std::sync::Mutex<BTreeMap<(String, String), BTreeMap<String, String>>>);

    impl Annotations {
        fn set(&self, namespace: &str, pod: &str, annotations: &[(&str, &str)]) {
            let a = annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            self.0
                .lock()
                .expect("annotations")
                .insert((namespace.to_owned(), pod.to_owned()), a);
        }
    }

    impl PodApi for Annotations {
        async fn annotations(
            &self,
            namespace: &str,
            pod: &str,
        ) -> Result<BTreeMap<String, String>, crate::node_labels::NodeApiError> {
            let pods = self.0.lock().expect("annotations");
            pods.get(&(namespace.to_owned(), pod.to_owned()))
                .cloned()
                .ok_or_else(|| {
                    crate::node_labels::NodeApiError::NotFound(format!("pod {namespace}/{pod}"))
                })
        }
    }

    async fn pass(
        m: &FakeManager,
        kubelet: &StaticPods,
        api: &Annotations,
        t: &mut OrphanTracker,
    ) -> SyncReport {
        sync_once(m, kubelet, Some(api), RES, t, &Default::default())
            .await
            .expect("pass")
    }

    #[tokio::test(start_paused = true)]
    async fn a_priority_annotation_is_applied_once_and_again_when_it_changes() {
        let m = FakeManager::default();
        m.insert(alloc("x", &["G::0"], "device-plugin"));
        m.insert(alloc("cli", &["G::1"], "cli"));
        let kubelet = StaticPods(pods(&[
            ("ns", "a", "main", RES, &["G::0"]),
            ("ns", "b", "main", RES, &["G::1"]),
        ]));
        let api = Annotations::default();
        api.set("ns", "a", &[(ANNOTATION_PRIORITY, "10")]);
        api.set("ns", "b", &[(ANNOTATION_PRIORITY, "20")]);
        let mut t = OrphanTracker::new(Duration::from_secs(60));

        let r = pass(&m, &kubelet, &api, &mut t).await;
        assert_eq!(r.priorities_set, 1);
        assert_eq!(resized(&m), ["x"], "the CLI's allocation is never touched");
        assert_eq!(priority(&m, "x"), 10);
        for _ in 0..3 {
            pass(&m, &kubelet, &api, &mut t).await;
        }
        assert_eq!(resized(&m).len(), 1, "unchanged: not sent again");

        // The annotation changes: the next pass applies it, once.
        api.set("ns", "a", &[(ANNOTATION_PRIORITY, "-5")]);
        pass(&m, &kubelet, &api, &mut t).await;
        pass(&m, &kubelet, &api, &mut t).await;
        assert_eq!(resized(&m), ["x", "x"]);
        assert_eq!(priority(&m, "x"), -5);

        // An operator's tessera resize --priority stands until the
        // annotation changes again.
        let mut x = m
            .allocations()
            .into_iter()
            .find(|a| a.id == "x")
            .expect("x");
        x.priority = 7;
        m.insert(x);
        pass(&m, &kubelet, &api, &mut t).await;
        assert_eq!(resized(&m).len(), 2);
        assert_eq!(priority(&m, "x"), 7);
        api.set("ns", "a", &[(ANNOTATION_PRIORITY, "0")]);
        pass(&m, &kubelet, &api, &mut t).await;
        assert_eq!(priority(&m, "x"), 0);
        assert_eq!(resized(&m).len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bad_or_already_applied_priority_makes_no_call() {
        let m = FakeManager::default();
        m.insert(alloc("x", &["G::0"], "device-plugin"));
        m.insert(alloc("y", &["G::1"], "device-plugin"));
        let kubelet = StaticPods(pods(&[
            ("ns", "bad", "main", RES, &["G::0"]),
            ("ns", "zero", "main", RES, &["G::1"]),
        ]));
        let api = Annotations::default();
        api.set(
            "ns",
            "bad",
            &[
                (ANNOTATION_PRIORITY, "1001"),
                (ANNOTATION_COMPUTE_POLICY, "guaranteed"),
            ],
        );
        api.set("ns", "zero", &[(ANNOTATION_PRIORITY, "0")]);
        let mut t = OrphanTracker::new(Duration::from_secs(60));
        for _ in 0..3 {
            let r = pass(&m, &kubelet, &api, &mut t).await;
            assert_eq!(r.failed, 0);
        }
        assert!(resized(&m).is_empty(), "out of range, or already in force");
        assert_eq!(priority(&m, "x"), 0);
        assert_eq!(t.priority_applied("y"), Some(0), "found in force");
        assert_eq!(t.priority_applied("x"), None);
        // The bad value is logged once, not every pass.
        assert_eq!(t.warned.len(), 1);
        // Fixed: applied.
        api.set("ns", "bad", &[(ANNOTATION_PRIORITY, "1000")]);
        pass(&m, &kubelet, &api, &mut t).await;
        assert_eq!(resized(&m), ["x"]);
        assert_eq!(priority(&m, "x"), 1000);
    }

    #[test]
    fn priority_annotations_parse_or_say_why_not() {
        let ann = |v: &str| BTreeMap::from([(ANNOTATION_PRIORITY.to_owned(), v.to_owned())]);
        assert_eq!(priority_from_annotations(&ann("-3")), Ok(Some(-3)));
        assert_eq!(priority_from_annotations(&BTreeMap::new()), Ok(None));
        for bad in ["high", "1e3", "-1001", ""] {
            let e = priority_from_annotations(&ann(bad)).expect_err(bad);
            assert!(
                e.contains(ANNOTATION_PRIORITY) && e.contains("left as it is"),
                "{e}"
            );
        }
    }
}
