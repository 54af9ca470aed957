//! Which pod is which: the plugin reads the kubelet's PodResources `List`,
//! tells the manager which pod and container each of its allocations serves
//! (`SetAllocationOwner`), and deletes allocations whose pods are gone.
//!
//! The plugin does this on the manager's behalf: it already speaks to the
//! kubelet and knows the resource name and device IDs, and the manager stays
//! free of kubelet APIs (it also serves allocations made outside Kubernetes,
//! which this loop never touches: only allocations labelled
//! `source=device-plugin` are considered).

use std::collections::{BTreeMap, HashMap};
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
    SetOwner { id: String, owner: Owner },
    Delete { id: String },
}

/// Remembers since when each allocation has had no pod, so that one is
/// deleted only after it stayed orphaned for the whole grace period (the
/// kubelet lists a container's devices shortly after Allocate, not before).
#[derive(Debug)]
pub struct OrphanTracker {
    grace: Duration,
    since: HashMap<String, Instant>,
}

impl OrphanTracker {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            since: HashMap::new(),
        }
    }
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

/// Decides one pass: pure, given the time.
pub fn plan(
    pods: &pr::ListPodResourcesResponse,
    allocations: &[mgr::Allocation],
    resource: &str,
    tracker: &mut OrphanTracker,
    now: Instant,
) -> Vec<Action> {
    let owners = owners(pods, resource);
    let mut actions = Vec::new();
    let ours = allocations
        .iter()
        .filter(|a| a.labels.get(SOURCE_LABEL).map(String::as_str) == Some(SOURCE_DEVICE_PLUGIN));
    let mut live = Vec::new();
    for a in ours {
        live.push(a.id.clone());
        // The container holding most of the allocation's devices (normally
        // all of them; ties go to the first in name order).
        let mut votes: BTreeMap<&Owner, usize> = BTreeMap::new();
        for id in &a.device_ids {
            if let Some(o) = owners.get(id) {
                *votes.entry(o).or_default() += 1;
            }
        }
        let best = votes
            .iter()
            .max_by(|x, y| x.1.cmp(y.1).then_with(|| y.0.cmp(x.0)))
            .map(|(o, _)| (*o).clone());
        match best {
            Some(owner) => {
                tracker.since.remove(&a.id);
                let current = Owner {
                    namespace: a.namespace.clone(),
                    pod: a.pod.clone(),
                    container: a.container.clone(),
                };
                if current != owner {
                    actions.push(Action::SetOwner {
                        id: a.id.clone(),
                        owner,
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
    actions
}

/// Counts of what one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncReport {
    pub owners_set: usize,
    pub deleted: usize,
    pub failed: usize,
}

/// One pass: list, plan, apply. Nothing is deleted when either list fails.
pub(crate) async fn sync_once<M: ManagerApi, P: PodResourcesApi>(
    manager: &M,
    pods: &P,
    resource: &str,
    tracker: &mut OrphanTracker,
) -> Result<SyncReport, Status> {
    let listed = pods.list().await?;
    let allocations = manager.list_allocations().await?;
    let mut report = SyncReport::default();
    for action in plan(&listed, &allocations, resource, tracker, Instant::now()) {
        match action {
            Action::SetOwner { id, owner } => {
                let req = mgr::SetAllocationOwnerRequest {
                    id: id.clone(),
                    namespace: owner.namespace.clone(),
                    pod: owner.pod.clone(),
                    container: owner.container.clone(),
                    policy: mgr::ComputePolicy::Unspecified as i32,
                };
                match manager.set_allocation_owner(req).await {
                    Ok(_) => {
                        tracing::info!(%id, namespace = %owner.namespace, pod = %owner.pod, container = %owner.container, "allocation owner recorded");
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
        let acts = plan(&p, &allocs, RES, &mut t, now);
        assert_eq!(
            acts,
            vec![Action::SetOwner {
                id: "x".into(),
                owner: owner("ns", "a", "main")
            }],
            "y's device belongs to another resource: not an owner"
        );
        allocs[0].namespace = "ns".into();
        allocs[0].pod = "a".into();
        allocs[0].container = "main".into();
        assert!(
            plan(&p, &allocs, RES, &mut t, now).is_empty(),
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
        assert!(plan(&p, &allocs, RES, &mut t, t0).is_empty());
        assert!(plan(&p, &allocs, RES, &mut t, t0 + Duration::from_secs(59)).is_empty());
        assert_eq!(
            plan(&p, &allocs, RES, &mut t, t0 + Duration::from_secs(60)),
            vec![Action::Delete { id: "gone".into() }],
            "the CLI's allocation is never touched"
        );
    }

    #[test]
    fn an_orphan_that_finds_its_pod_is_kept() {
        let allocs = vec![alloc("x", &["G::0"], "device-plugin")];
        let mut t = OrphanTracker::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(plan(&pods(&[]), &allocs, RES, &mut t, t0).is_empty());
        let with_pod = pods(&[("ns", "a", "c", RES, &["G::0"])]);
        assert_eq!(
            plan(
                &with_pod,
                &allocs,
                RES,
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
                &mut t,
                t0 + Duration::from_secs(130)
            )
            .len(),
            1
        );
    }
}
