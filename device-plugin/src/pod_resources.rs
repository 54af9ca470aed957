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
//! only when it is stricter than the node's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use tessera_proto::manager::v1 as mgr;
use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tonic::Status;
use tonic::transport::Channel;

use crate::allocate::{SOURCE_DEVICE_PLUGIN, SOURCE_LABEL};
use crate::manager::ManagerApi;
use crate::node_labels::NodeApiError;
use tessera_contract::Policy;

/// The pod annotation asking for a compute policy (`guaranteed` | `burst`).
pub use tessera_contract::labels::ANNOTATION_COMPUTE_POLICY;

/// Pods through the Kubernetes API, as far as annotations go.
pub trait PodApi: Send + Sync + 'static {
    fn annotations(
        &self,
        namespace: &str,
        pod: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, NodeApiError>> + Send;
}

/// Pods through the Kubernetes API (in-cluster config or kubeconfig).
pub(crate) struct KubePodApi {
    client: kube::Client,
}

impl KubePodApi {
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl PodApi for KubePodApi {
    async fn annotations(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<BTreeMap<String, String>, NodeApiError> {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.client.clone(), namespace);
        Ok(pods
            .get(pod)
            .await?
            .metadata
            .annotations
            .unwrap_or_default())
    }
}

/// The policy a pod's annotations ask for; UNSPECIFIED (the node's) when
/// there is none or the value is unknown (the webhook refuses unknown values
/// at admission, so one here predates it: logged, not fatal).
pub fn policy_from_annotations(
    annotations: &BTreeMap<String, String>,
    namespace: &str,
    pod: &str,
) -> mgr::ComputePolicy {
    match annotations
        .get(ANNOTATION_COMPUTE_POLICY)
        .map(String::as_str)
    {
        None => mgr::ComputePolicy::Unspecified,
        Some(v) if Policy::parse(v) == Some(Policy::Guaranteed) => mgr::ComputePolicy::Guaranteed,
        Some(v) if Policy::parse(v) == Some(Policy::Burst) => mgr::ComputePolicy::Burst,
        Some(other) => {
            tracing::warn!(%namespace, %pod, value = %other, "annotation {ANNOTATION_COMPUTE_POLICY} is not \"guaranteed\" or \"burst\"; the node's policy applies");
            mgr::ComputePolicy::Unspecified
        }
    }
}

/// The kubelet's PodResources API as the plugin uses it.
pub(crate) trait PodResourcesApi: Send + Sync + 'static {
    fn list(&self) -> impl Future<Output = Result<pr::ListPodResourcesResponse, Status>> + Send;
}

/// PodResources over gRPC on the kubelet's socket.
pub(crate) struct GrpcPodResources {
    client: PodResourcesListerClient<Channel>,
}

impl GrpcPodResources {
    pub(crate) fn new(socket: &Path) -> Result<Self, tonic::transport::Error> {
        Ok(Self {
            client: PodResourcesListerClient::new(crate::grpc::unix_channel_lazy(socket)?),
        })
    }
}

impl PodResourcesApi for GrpcPodResources {
    async fn list(&self) -> Result<pr::ListPodResourcesResponse, Status> {
        Ok(self
            .client
            .clone()
            .list(pr::ListPodResourcesRequest {})
            .await?
            .into_inner())
    }
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
/// and which allocations have their pod's policy settled (applied, not
/// asked for, or refused), so that each pod is looked up until that is done
/// and a refusal is logged once.
#[derive(Debug)]
pub struct OrphanTracker {
    grace: Duration,
    since: HashMap<String, Instant>,
    settled: HashSet<String>,
}

impl OrphanTracker {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            since: HashMap::new(),
            settled: HashSet::new(),
        }
    }

    /// Whether the allocation's pod policy needs no more work.
    pub fn is_settled(&self, id: &str) -> bool {
        self.settled.contains(id)
    }
}

/// (namespace, pod) → the policy its annotations ask for; pods missing
/// here were not looked up, or the lookup failed.
pub type PodPolicies = HashMap<(String, String), mgr::ComputePolicy>;

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

/// The pods whose policy a pass needs: owners of our allocations whose
/// policy is not settled yet.
pub fn pods_to_look_up(
    pods: &pr::ListPodResourcesResponse,
    allocations: &[mgr::Allocation],
    resource: &str,
    tracker: &OrphanTracker,
) -> Vec<(String, String)> {
    let owners = owners(pods, resource);
    let mut want: Vec<(String, String)> = allocations
        .iter()
        .filter(|a| is_ours(a) && !tracker.is_settled(&a.id))
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

/// Counts of what one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncReport {
    pub owners_set: usize,
    pub deleted: usize,
    pub failed: usize,
}

/// Looks up the policies of `wanted` pods; a failed lookup leaves the pod
/// out (its owner is still recorded, the policy is tried next pass).
async fn look_up_policies<A: PodApi>(api: &A, wanted: Vec<(String, String)>) -> PodPolicies {
    let mut policies = PodPolicies::new();
    for (namespace, pod) in wanted {
        match api.annotations(&namespace, &pod).await {
            Ok(ann) => {
                let p = policy_from_annotations(&ann, &namespace, &pod);
                policies.insert((namespace, pod), p);
            }
            Err(e) => {
                tracing::warn!(%namespace, %pod, error = %e, "cannot read the pod's annotations; its compute policy is tried again next pass");
            }
        }
    }
    policies
}

/// One pass: list, plan, apply. Nothing is deleted when either list fails.
/// `pod_api` is None without the Kubernetes API: every policy stays the
/// node's.
pub(crate) async fn sync_once<M: ManagerApi, P: PodResourcesApi, A: PodApi>(
    manager: &M,
    pods: &P,
    pod_api: Option<&A>,
    resource: &str,
    tracker: &mut OrphanTracker,
) -> Result<SyncReport, Status> {
    let listed = pods.list().await?;
    let allocations = manager.list_allocations().await?;
    let policies = match pod_api {
        Some(api) => {
            look_up_policies(
                api,
                pods_to_look_up(&listed, &allocations, resource, tracker),
            )
            .await
        }
        None => PodPolicies::new(),
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
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RES: &str = "tessera.dev/vgpu";

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

    fn owner(ns: &str, pod: &str, ctr: &str) -> Owner {
        Owner {
            namespace: ns.into(),
            pod: pod.into(),
            container: ctr.into(),
        }
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
        let acts = plan(&p, &allocs, RES, &PodPolicies::new(), &mut t, now);
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
            plan(&p, &allocs, RES, &PodPolicies::new(), &mut t, now).is_empty(),
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
        assert!(plan(&p, &allocs, RES, &PodPolicies::new(), &mut t, t0).is_empty());
        assert!(
            plan(
                &p,
                &allocs,
                RES,
                &PodPolicies::new(),
                &mut t,
                t0 + Duration::from_secs(59)
            )
            .is_empty()
        );
        assert_eq!(
            plan(
                &p,
                &allocs,
                RES,
                &PodPolicies::new(),
                &mut t,
                t0 + Duration::from_secs(60)
            ),
            vec![Action::Delete { id: "gone".into() }],
            "the CLI's allocation is never touched"
        );
    }

    #[test]
    fn an_orphan_that_finds_its_pod_is_kept() {
        let allocs = vec![alloc("x", &["G::0"], "device-plugin")];
        let mut t = OrphanTracker::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(plan(&pods(&[]), &allocs, RES, &PodPolicies::new(), &mut t, t0).is_empty());
        let with_pod = pods(&[("ns", "a", "c", RES, &["G::0"])]);
        assert_eq!(
            plan(
                &with_pod,
                &allocs,
                RES,
                &PodPolicies::new(),
                &mut t,
                t0 + Duration::from_secs(30)
            )
            .len(),
            1
        );
        // Gone again: the clock restarts.
        assert!(
            plan(
                &pods(&[]),
                &allocs,
                RES,
                &PodPolicies::new(),
                &mut t,
                t0 + Duration::from_secs(70)
            )
            .is_empty()
        );
        assert!(
            plan(
                &pods(&[]),
                &allocs,
                RES,
                &PodPolicies::new(),
                &mut t,
                t0 + Duration::from_secs(129)
            )
            .is_empty()
        );
        assert_eq!(
            plan(
                &pods(&[]),
                &allocs,
                RES,
                &PodPolicies::new(),
                &mut t,
                t0 + Duration::from_secs(130)
            )
            .len(),
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
            pods_to_look_up(&p, std::slice::from_ref(&x), RES, &t),
            vec![("ns".to_owned(), "a".to_owned())]
        );
        // The lookup failed: the owner is recorded all the same.
        assert_eq!(
            plan(
                &p,
                std::slice::from_ref(&x),
                RES,
                &PodPolicies::new(),
                &mut t,
                now
            ),
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
        assert!(pods_to_look_up(&p, std::slice::from_ref(&x), RES, &t).is_empty());
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
        assert!(
            t.is_settled("x"),
            "no policy asked for: not looked up again"
        );
    }
}
