//! KAI-Scheduler's GPU choice (docs/dropin.md, "Who picks the GPU"), served when the
//! plugin runs with `--kai-reservations`.
//!
//! KAI places a fraction on a *GPU group*: its binder runs a reservation pod for the
//! group on the node (namespace [`RESERVATION_NAMESPACE`], label [`LABEL_GPU_GROUP`]),
//! which asks for `nvidia.com/gpu: 1`, reads the UUID of the one GPU it sees from NVML
//! and writes it into its annotation [`ANNOTATION_RESERVED_GPU`]; then it labels the
//! fraction pod with the group and binds it. Two pieces serve that here:
//!
//! - `ReservationService`: `nvidia.com/gpu`, one device per GPU (its UUID), for the
//!   reservation pods only. They hold no memory and no time (an NVML query, then
//!   sleep), so no Tessera allocation is made; the answer only makes the one GPU
//!   visible. The kubelet does not say which pod an Allocate is for, so the plugin
//!   refuses while any pending pod of the node outside KAI's namespace asks for
//!   `nvidia.com/gpu`: a tenant's pod never gets a whole GPU past the manager.
//! - [`pending`] and [`for_request`]: a pending pod of the group becomes a [`Pending`]
//!   container whose GPU is the reserved one, so GetPreferredAllocation prefers its
//!   slices ([`assignment::prefer`]) and Allocate serves only slices of it
//!   ([`assignment::find`]), as for the scheduler extender's assignment. A mismatch, or
//!   a group whose reservation cannot be read, is refused with a message: never a
//!   silent other GPU.
//!
//! The pod's label is a hint, not identity: the GPU is read only from a pod in KAI's
//! namespace on this node. A tenant who relabels its pod can only choose another GPU
//! whose slices are free; its limits are its slices' wherever they are.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_node::scheduling::GpuTake;
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::deviceplugin::v1beta1::device_plugin_server::DevicePlugin;
use tonic::{Request, Response, Status};

use crate::assignment::{self, ANNOTATION_GPU_ASSIGNMENT, Match, Pending, PodInfo, PodsOnNode};
use crate::device_id::DeviceId;
use crate::refusal::KaiError;
use crate::state::{INVENTORY_WAIT, PluginState, Snapshot};
use crate::stream::{DeviceStream, device_stream};
use tessera_node::cdi::KIND_NVIDIA;
use tessera_node::edits::{VOLUME_MOUNTS_HOST, VOLUME_MOUNTS_ROOT};
use tessera_node::manager::ManagerApi;
use tessera_proto::manager::v1 as mgr;

/// The namespace KAI-Scheduler's binder runs its reservation pods in.
pub const RESERVATION_NAMESPACE: &str = "kai-resource-reservation";
/// The label naming a pod's GPU group (a fraction pod's, and its reservation pod's).
pub const LABEL_GPU_GROUP: &str = "runai-gpu-group";
/// A multi-GPU fraction's labels: one `runai-gpu-group/<group>` per GPU.
pub const LABEL_GPU_GROUP_PREFIX: &str = "runai-gpu-group/";
/// The reservation pod's annotation: the UUID of the GPU it holds.
pub const ANNOTATION_RESERVED_GPU: &str = "run.ai/reserve_for_gpu_index";
/// The resource the reservation pods ask for.
pub const RESOURCE: &str = "nvidia.com/gpu";
/// The socket the reservation resource is served on, in the kubelet's dir.
pub const SOCKET_NAME: &str = "tessera-kai.sock";

/// A KAI pod whose GPU cannot be told: a request of its size is refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Unresolved {
    pub pod: String,
    pub slices: u64,
    pub group: String,
    pub why: String,
}

/// Where a [`Pending`] KAI container's GPUs come from, for messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Reserved {
    pub pending: Pending,
    /// `group → reservation pod`, for messages.
    pub groups: Vec<(String, String)>,
}

fn is_pending(phase: &str) -> bool {
    phase.is_empty() || phase == "Pending"
}

/// The GPU groups of a pod, from its labels: the one of a single-GPU fraction, or one
/// per GPU of a multi-GPU fraction; sorted, no duplicates.
fn groups(p: &PodInfo) -> Vec<String> {
    let mut out: Vec<String> = p
        .labels
        .iter()
        .filter_map(|(k, v)| {
            if k == LABEL_GPU_GROUP {
                Some(v.clone())
            } else {
                k.strip_prefix(LABEL_GPU_GROUP_PREFIX).map(str::to_owned)
            }
        })
        .filter(|g| !g.is_empty())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The GPU KAI reserved for `group` on `node`: the UUID its reservation pod (in KAI's
/// namespace, on this node, not finished) wrote; the reservation pod's name with it.
fn reserved_gpu(pods: &[PodInfo], node: &str, group: &str) -> Result<(String, String), String> {
    let holders: Vec<&PodInfo> = pods
        .iter()
        .filter(|r| {
            r.namespace == RESERVATION_NAMESPACE
                && r.node == node
                && r.phase != "Succeeded"
                && r.phase != "Failed"
                && r.labels.get(LABEL_GPU_GROUP).map(String::as_str) == Some(group)
        })
        .collect();
    let [r] = holders.as_slice() else {
        return Err(if holders.is_empty() {
            format!(
                "no reservation pod of the group runs on node {node} in namespace \
                 {RESERVATION_NAMESPACE} (label {LABEL_GPU_GROUP}={group})"
            )
        } else {
            format!(
                "{} reservation pods of the group run on node {node}",
                holders.len()
            )
        });
    };
    match r.annotations.get(ANNOTATION_RESERVED_GPU).map(|v| v.trim()) {
        Some(uuid) if !uuid.is_empty() => Ok((uuid.to_owned(), r.name.clone())),
        _ => Err(format!(
            "its reservation pod {}/{} has not written {ANNOTATION_RESERVED_GPU} yet",
            r.namespace, r.name
        )),
    }
}

/// The KAI pods of `node` waiting for slices: per pod in a GPU group (and without the
/// extender's assignment, which comes first), its next container with slices not yet
/// served, on the reserved GPUs (its slices split evenly over them); and those whose
/// GPUs cannot be told. The oldest pod first.
pub fn pending(pods: &[PodInfo], node: &str) -> (Vec<Reserved>, Vec<Unresolved>) {
    let mut sorted: Vec<&PodInfo> = pods.iter().collect();
    sorted.sort_by(|a, b| {
        let key = |p: &PodInfo| (p.bound_at_ms.or(p.created_at_ms), p.created_at_ms);
        key(a)
            .cmp(&key(b))
            .then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
    let mut found = Vec::new();
    let mut unresolved = Vec::new();
    for p in sorted {
        if p.node != node
            || !is_pending(&p.phase)
            || p.namespace == RESERVATION_NAMESPACE
            || p.annotations.contains_key(ANNOTATION_GPU_ASSIGNMENT)
        {
            continue;
        }
        let groups = groups(p);
        if groups.is_empty() {
            continue;
        }
        let served = p.served();
        let Some((container, slices)) = p
            .containers
            .iter()
            .find(|(n, s)| *s > 0 && !served.contains(n))
        else {
            continue;
        };
        let pod = format!("{}/{}", p.namespace, p.name);
        let unresolved_as = |group: &str, why: String| Unresolved {
            pod: pod.clone(),
            slices: *slices,
            group: group.to_owned(),
            why,
        };
        let per_gpu = *slices / groups.len() as u64;
        if per_gpu == 0 || per_gpu * groups.len() as u64 != *slices {
            unresolved.push(unresolved_as(
                &groups.join(","),
                format!(
                    "its {slices} slices do not split evenly over its {} GPUs",
                    groups.len()
                ),
            ));
            continue;
        }
        let mut gpus = Vec::new();
        let mut by = Vec::new();
        let mut failed = None;
        for g in &groups {
            match reserved_gpu(pods, node, g) {
                Ok((uuid, holder)) => {
                    gpus.push(GpuTake {
                        uuid,
                        slices: u32::try_from(per_gpu).unwrap_or(u32::MAX),
                    });
                    by.push((g.clone(), holder));
                }
                Err(why) => {
                    failed = Some(unresolved_as(g, why));
                    break;
                }
            }
        }
        if let Some(u) = failed {
            unresolved.push(u);
            continue;
        }
        found.push(Reserved {
            pending: Pending::new(&p.namespace, &p.name, container, gpus, served.clone()),
            groups: by,
        });
    }
    (found, unresolved)
}

/// The KAI container these (already checked) device IDs serve, among `pods`, if any:
/// an error when they are not on the GPUs KAI reserved for the oldest such container of
/// that size, or when a KAI container of that size has no readable reservation.
pub fn for_request(
    pods: &[PodInfo],
    node: &str,
    ids: &[DeviceId],
    snap: &Snapshot,
) -> Result<Option<Pending>, KaiError> {
    let (mut found, unresolved) = pending(pods, node);
    let list: Vec<Pending> = found.iter().map(|r| r.pending.clone()).collect();
    match assignment::find(&list, ids) {
        Match::Exact(i) => {
            let r = found.swap_remove(i);
            assignment::check(&r.pending, snap).map_err(KaiError::Gpu)?;
            Ok(Some(r.pending))
        }
        Match::Other(i) => {
            let r = &found[i];
            assignment::check(&r.pending, snap).map_err(KaiError::Gpu)?;
            Err(KaiError::Disagree {
                pod: r.pending.pod(),
                container: r.pending.container.clone(),
                reserved: r
                    .pending
                    .gpus
                    .iter()
                    .zip(&r.groups)
                    .map(|(g, (group, holder))| {
                        format!(
                            "{}×{} (GPU group {group}, reservation pod {holder})",
                            g.uuid, g.slices
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                got: ids
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                slices: r.pending.slices(),
            })
        }
        Match::None => match unresolved
            .into_iter()
            .find(|u| u.slices == ids.len() as u64)
        {
            Some(u) => Err(KaiError::Unresolved {
                pod: u.pod,
                group: u.group,
                why: u.why,
            }),
            None => Ok(None),
        },
    }
}

/// The pending pods of `node` that ask for `nvidia.com/gpu` outside KAI's namespace: the
/// kubelet does not say which pod a reservation Allocate is for, so while any is
/// pending none is served.
pub fn others_asking(pods: &[PodInfo], node: &str) -> Vec<String> {
    pods.iter()
        .filter(|p| {
            p.node == node
                && is_pending(&p.phase)
                && p.nvidia_gpus > 0
                && p.namespace != RESERVATION_NAMESPACE
        })
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect()
}

/// The reservation devices: one per GPU, its UUID, healthy as the GPU is.
pub fn devices(snap: &Snapshot) -> Vec<dp::Device> {
    snap.gpus
        .iter()
        .map(|g| dp::Device {
            id: g.gpu.uuid.clone(),
            health: if g.healthy {
                dp::HEALTHY
            } else {
                dp::UNHEALTHY
            }
            .to_owned(),
            topology: None,
        })
        .collect()
}

/// What a reservation pod's container gets: the GPUs named the node config's way
/// (`NVIDIA_VISIBLE_DEVICES`, the `volume-mounts` mounts, or the toolkit's CDI device)
/// and nothing of Tessera's: no allocation, no shim, so nothing refuses its NVML query,
/// and the toolkit shows it only these GPUs.
pub fn container_response(
    ids: &[String],
    snap: &Snapshot,
) -> Result<dp::ContainerAllocateResponse, Status> {
    if ids.is_empty() {
        return Err(Status::invalid_argument("no device ids in the request"));
    }
    for id in ids {
        match snap.gpu(id) {
            None => {
                return Err(Status::not_found(format!(
                    "{RESOURCE} device {id:?} is no GPU of this node"
                )));
            }
            Some(g) if !g.healthy => {
                return Err(Status::failed_precondition(format!(
                    "{RESOURCE} device {id:?} is unhealthy"
                )));
            }
            Some(_) => {}
        }
    }
    let strategy = snap.node.device_list_strategy;
    let mut resp = dp::ContainerAllocateResponse::default();
    let visible = tessera_contract::env::NVIDIA_VISIBLE_DEVICES.to_owned();
    if strategy.envvar {
        resp.envs.insert(visible, ids.join(","));
    } else if strategy.volume_mounts {
        resp.envs.insert(visible, VOLUME_MOUNTS_ROOT.to_owned());
    }
    if strategy.volume_mounts {
        for id in ids {
            resp.mounts.push(dp::Mount {
                container_path: format!("{VOLUME_MOUNTS_ROOT}/{id}"),
                host_path: VOLUME_MOUNTS_HOST.to_owned(),
                read_only: true,
            });
        }
    }
    if strategy.cdi {
        for id in ids {
            resp.cdi_devices.push(dp::CdiDevice {
                name: tessera_node::cdi::qualified_name(KIND_NVIDIA, id),
            });
        }
    }
    Ok(resp)
}

/// The GPUs to prefer for a reservation pod: the must-include ones, then those whose
/// slices Tessera's allocations hold fewest of (`used`), then by UUID. The GPU the
/// kubelet gives the reservation pod is the one KAI then places its fractions on, and
/// KAI does not see Tessera's other pods' slices: the emptiest GPU is where its
/// fractions most likely fit.
pub fn prefer_gpus(
    available: &[String],
    must_include: &[String],
    size: usize,
    used: &BTreeMap<String, u32>,
) -> Vec<String> {
    let mut ids: Vec<&String> = available.iter().collect();
    ids.sort_by_key(|id| {
        (
            !must_include.contains(id),
            used.get(*id).copied().unwrap_or(0),
            (*id).clone(),
        )
    });
    ids.into_iter().take(size).cloned().collect()
}

/// Slices held per GPU by the manager's allocations.
pub fn used_slices(allocations: &[mgr::Allocation]) -> BTreeMap<String, u32> {
    let mut used = BTreeMap::new();
    for a in allocations {
        for d in &a.devices {
            *used.entry(d.gpu_uuid.clone()).or_default() += d.slices;
        }
    }
    used
}

/// Serves `nvidia.com/gpu` to KAI's reservation pods ([`RESOURCE`]).
pub(crate) struct ReservationService<P, M> {
    pub(crate) state: Arc<PluginState>,
    /// The node's pods; None without the Kubernetes API (then nothing is served).
    pub(crate) pods: Option<P>,
    pub(crate) node: String,
    /// Read for the slices each GPU's allocations hold ([`prefer_gpus`]).
    pub(crate) manager: Arc<M>,
}

/// The options the reservation resource registers with.
pub fn plugin_options() -> dp::DevicePluginOptions {
    dp::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

#[tonic::async_trait]
impl<P: PodsOnNode, M: ManagerApi> DevicePlugin for ReservationService<P, M> {
    async fn get_device_plugin_options(
        &self,
        _req: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _req: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.state.subscribe();
        Ok(Response::new(device_stream(rx, |s| devices(s))))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        // Without the manager's list, no GPU is known to be fuller: by UUID.
        let used = match self.manager.list_allocations().await {
            Ok(all) => used_slices(&all),
            Err(e) => {
                tracing::warn!(error = %e.message(), "preferring reservation GPUs by UUID");
                BTreeMap::new()
            }
        };
        let container_responses = req
            .get_ref()
            .container_requests
            .iter()
            .map(|c| dp::ContainerPreferredAllocationResponse {
                device_i_ds: prefer_gpus(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                    &used,
                ),
            })
            .collect();
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let refused = |s: Status| {
            tracing::warn!(error = %s.message(), "{RESOURCE} allocate refused");
            s
        };
        let Some(api) = &self.pods else {
            return Err(refused(Status::failed_precondition(format!(
                "{RESOURCE} is served to KAI-Scheduler's reservation pods only, which needs the \
                 Kubernetes API to tell them"
            ))));
        };
        let pods = api.pods_on_node(&self.node).await.map_err(|e| {
            refused(Status::unavailable(format!(
                "cannot read the pods of node {}: {e}",
                self.node
            )))
        })?;
        let others = others_asking(&pods, &self.node);
        if !others.is_empty() {
            return Err(refused(Status::failed_precondition(format!(
                "{RESOURCE} is served to KAI-Scheduler's reservation pods (namespace \
                 {RESERVATION_NAMESPACE}) only, and pending pods of node {} outside it ask for \
                 it: {}",
                self.node,
                others.join(", ")
            ))));
        }
        let snap = self.state.with_inventory(INVENTORY_WAIT).await;
        let mut container_responses = Vec::new();
        for c in &req.get_ref().container_requests {
            let resp = container_response(&c.devices_ids, &snap).map_err(refused)?;
            tracing::info!(devices = ?c.devices_ids, "serving a KAI-Scheduler reservation pod");
            container_responses.push(resp);
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _req: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::ANNOTATION_GPU_ALLOCATED;
    use crate::refusal::AssignmentError;
    use std::collections::BTreeMap;

    fn labels(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn kai_pod(name: &str, slices: u64, group: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            namespace: "team-a".into(),
            name: name.into(),
            node: "n1".into(),
            phase: "Pending".into(),
            created_at_ms: Some(1),
            containers: vec![("main".into(), slices)],
            labels: labels(group),
            ..Default::default()
        }
    }

    fn reservation(ns: &str, group: &str, gpu: Option<&str>) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: format!("gpu-reservation-{group}"),
            node: "n1".into(),
            phase: "Running".into(),
            labels: labels(&[(LABEL_GPU_GROUP, group)]),
            annotations: gpu
                .map(|g| [(ANNOTATION_RESERVED_GPU.to_owned(), g.to_owned())].into())
                .unwrap_or_default(),
            nvidia_gpus: 1,
            ..Default::default()
        }
    }

    fn ids(v: &[&str]) -> Vec<DeviceId> {
        v.iter().map(|s| DeviceId::parse(s).expect("id")).collect()
    }

    #[test]
    fn a_kai_pod_is_served_only_on_the_gpu_its_group_reserved() {
        let snap = crate::allocate::tests::snapshot("default:\n  slice: {slicesPerGpu: 4}\n");
        let pods = [
            kai_pod("p", 2, &[(LABEL_GPU_GROUP, "g1")]),
            reservation(RESERVATION_NAMESPACE, "g1", Some("GPU-b")),
        ];
        let (found, unresolved) = pending(&pods, "n1");
        assert!(unresolved.is_empty());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].pending.gpus[0].uuid, "GPU-b");
        // Preferred: slices of GPU-b, though GPU-a's come first.
        let list = [found[0].pending.clone()];
        let avail: Vec<String> = ["GPU-a::0", "GPU-a::1", "GPU-b::2", "GPU-b::3"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(
            assignment::prefer(&list, &avail, &[], 2).map(|x| x.1),
            Some(vec!["GPU-b::2".to_owned(), "GPU-b::3".to_owned()])
        );
        let ok = for_request(&pods, "n1", &ids(&["GPU-b::0", "GPU-b::1"]), &snap).expect("ok");
        assert_eq!(ok.map(|p| p.allocated_value()), Some("main".to_owned()));
        // Another GPU: refused, naming the reservation.
        let e = for_request(&pods, "n1", &ids(&["GPU-a::0", "GPU-a::1"]), &snap)
            .expect_err("other GPU");
        let msg = e.to_string();
        assert!(
            msg.contains("GPU-b×2 (GPU group g1, reservation pod gpu-reservation-g1)")
                && msg.contains("GPU-a::0,GPU-a::1"),
            "{msg}"
        );
        // Another size: not this pod's request.
        assert_eq!(
            for_request(&pods, "n1", &ids(&["GPU-a::0"]), &snap),
            Ok(None)
        );
        // Served: the next request is not for it.
        let mut served = pods.clone();
        served[0]
            .annotations
            .insert(ANNOTATION_GPU_ALLOCATED.into(), "main".into());
        assert_eq!(
            for_request(&served, "n1", &ids(&["GPU-a::0", "GPU-a::1"]), &snap),
            Ok(None)
        );
        // A reserved GPU the node lacks or that is sick: refused as such.
        let pods = [
            kai_pod("p", 2, &[(LABEL_GPU_GROUP, "g1")]),
            reservation(RESERVATION_NAMESPACE, "g1", Some("GPU-sick")),
        ];
        assert!(matches!(
            for_request(&pods, "n1", &ids(&["GPU-sick::0", "GPU-sick::1"]), &snap),
            Err(KaiError::Gpu(AssignmentError::Unhealthy { .. }))
        ));
    }

    #[test]
    fn a_reservation_is_read_only_from_kais_namespace_on_this_node() {
        let snap = crate::allocate::tests::snapshot("default:\n  slice: {slicesPerGpu: 4}\n");
        let req = ids(&["GPU-a::0"]);
        let unresolved = |pods: &[PodInfo]| match for_request(pods, "n1", &req, &snap) {
            Err(KaiError::Unresolved { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        let p = || kai_pod("p", 1, &[(LABEL_GPU_GROUP, "g1")]);
        // None at all.
        assert!(unresolved(&[p()]).contains("no reservation pod"));
        // A tenant's look-alike in its own namespace is no reservation.
        let why = unresolved(&[p(), reservation("team-a", "g1", Some("GPU-a"))]);
        assert!(why.contains(RESERVATION_NAMESPACE), "{why}");
        // One on another node neither.
        let mut elsewhere = reservation(RESERVATION_NAMESPACE, "g1", Some("GPU-a"));
        elsewhere.node = "n2".into();
        assert!(unresolved(&[p(), elsewhere]).contains("no reservation pod"));
        // Not written yet.
        let why = unresolved(&[p(), reservation(RESERVATION_NAMESPACE, "g1", None)]);
        assert!(why.contains(ANNOTATION_RESERVED_GPU), "{why}");
        // The extender's assignment comes first: not KAI's to serve.
        let mut assigned = p();
        assigned
            .annotations
            .insert(ANNOTATION_GPU_ASSIGNMENT.into(), "{}".into());
        assert_eq!(for_request(&[assigned], "n1", &req, &snap), Ok(None));
        // A pod in no group is not KAI's.
        assert_eq!(
            for_request(&[kai_pod("plain", 1, &[])], "n1", &req, &snap),
            Ok(None)
        );
    }

    #[test]
    fn a_multi_gpu_fraction_takes_its_slices_evenly_on_each_reserved_gpu() {
        let pods = [
            kai_pod(
                "p",
                8,
                &[("runai-gpu-group/g1", "g1"), ("runai-gpu-group/g2", "g2")],
            ),
            reservation(RESERVATION_NAMESPACE, "g1", Some("GPU-a")),
            reservation(RESERVATION_NAMESPACE, "g2", Some("GPU-b")),
        ];
        let (found, _) = pending(&pods, "n1");
        let takes: Vec<(String, u32)> = found[0]
            .pending
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), g.slices))
            .collect();
        assert_eq!(takes, [("GPU-a".into(), 4), ("GPU-b".into(), 4)]);
        let mut odd = pods.clone();
        odd[0].containers[0].1 = 7;
        let (found, unresolved) = pending(&odd, "n1");
        assert!(found.is_empty());
        assert!(unresolved[0].why.contains("split evenly"));
    }

    #[test]
    fn reservations_prefer_the_gpu_with_the_fewest_slices_held() {
        let alloc = |gpu: &str, slices: u32| mgr::Allocation {
            devices: vec![mgr::DeviceRequest {
                gpu_uuid: gpu.into(),
                slices,
                ..Default::default()
            }],
            ..Default::default()
        };
        let used = used_slices(&[alloc("GPU-a", 3), alloc("GPU-c", 1), alloc("GPU-a", 2)]);
        assert_eq!(used.get("GPU-a"), Some(&5));
        let avail: Vec<String> = ["GPU-a", "GPU-b", "GPU-c"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(prefer_gpus(&avail, &[], 1, &used), ["GPU-b"]);
        assert_eq!(prefer_gpus(&avail, &[], 2, &used), ["GPU-b", "GPU-c"]);
        assert_eq!(
            prefer_gpus(&avail, &["GPU-a".to_owned()], 2, &used),
            ["GPU-a", "GPU-b"]
        );
    }

    #[test]
    fn reservation_pods_see_one_gpu_and_nothing_of_tesseras() {
        let snap = crate::allocate::tests::snapshot("default:\n  deviceListStrategy: envvar\n");
        let r = container_response(&["GPU-b".to_owned()], &snap).expect("served");
        assert_eq!(
            r.envs,
            [(
                tessera_contract::env::NVIDIA_VISIBLE_DEVICES.to_owned(),
                "GPU-b".to_owned()
            )]
            .into()
        );
        assert!(r.mounts.is_empty() && r.cdi_devices.is_empty() && r.annotations.is_empty());
        // The other ways of naming it: the toolkit's mounts, its CDI device (never
        // Tessera's own CDI device, which carries the shim).
        let snap = crate::allocate::tests::snapshot(
            "default:\n  deviceListStrategy: [volume-mounts, cdi]\n",
        );
        let r = container_response(&["GPU-b".to_owned()], &snap).expect("served");
        assert_eq!(
            r.envs,
            [(
                tessera_contract::env::NVIDIA_VISIBLE_DEVICES.to_owned(),
                VOLUME_MOUNTS_ROOT.to_owned()
            )]
            .into()
        );
        let mounts: Vec<&str> = r.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(mounts, [format!("{VOLUME_MOUNTS_ROOT}/GPU-b")]);
        let cdi: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(cdi, ["nvidia.com/gpu=GPU-b"]);
        assert!(container_response(&["GPU-zz".to_owned()], &snap).is_err());
        assert!(container_response(&["GPU-sick".to_owned()], &snap).is_err());
        assert!(container_response(&[], &snap).is_err());
        let ids: Vec<String> = devices(&snap).into_iter().map(|d| d.id).collect();
        assert_eq!(ids, ["GPU-a", "GPU-b", "GPU-sick"]);
        // Only KAI's namespace may be pending with nvidia.com/gpu.
        let mut tenant = reservation("team-a", "g1", None);
        tenant.phase = "Pending".into();
        let mut kais = reservation(RESERVATION_NAMESPACE, "g2", None);
        kais.phase = "Pending".into();
        assert_eq!(others_asking(&[kais.clone()], "n1"), Vec::<String>::new());
        assert_eq!(
            others_asking(&[kais, tenant], "n1"),
            ["team-a/gpu-reservation-g1"]
        );
    }
}
